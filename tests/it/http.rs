//! The HTTP server as clients meet it: a corpus of bad requests (each a
//! 4xx OpenAI-shaped JSON error, and the server keeps serving), a client
//! that vanishes mid-stream, the queue's 503 (a request's choices queued
//! together), several prompts and `echo` in one completion request, API
//! keys, the config file, and the official `openai` Python SDK against a
//! live server.

use it::{model, python, run_ok, Scratch, Server};
use serde_json::{json, Value};
use std::io::{Read, Write};

fn chat(content: &str, extra: Value) -> Value {
    let mut v = json!({ "model": "m", "messages": [{ "role": "user", "content": content }], "temperature": 0, "max_tokens": 8 });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn assert_good(s: &Server) {
    let r = s.post("/v1/chat/completions", &chat("Hello", json!({})));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["choices"][0]["message"]["content"].is_string());
}

#[test]
fn forty_bad_requests_get_openai_errors_and_the_server_keeps_serving() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--body-limit", "65536"]);
    let ctx = 4096; // max_position_embeddings of the tiny models
    let long_prompt: Vec<u32> = (0..ctx as u32).map(|i| 100 + i % 1000).collect();
    let big = format!("{{\"prompt\": \"{}\"}}", "x".repeat(70_000));
    let j = |v: Value| v.to_string().into_bytes();
    let c = "/v1/chat/completions";
    let p = "/v1/completions";
    // (what, method, path, body, status, a phrase the message must hold)
    type Case<'a> = (&'a str, &'a str, &'a str, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        ("malformed json", "POST", c, b"{\"messages\": [".to_vec(), 400, "malformed JSON"),
        ("not json", "POST", c, b"hello".to_vec(), 400, "malformed JSON"),
        ("empty body", "POST", c, Vec::new(), 400, "empty"),
        ("array body", "POST", c, b"[1,2]".to_vec(), 400, "JSON object"),
        ("string body", "POST", c, b"\"hi\"".to_vec(), 400, "JSON object"),
        ("invalid utf-8", "POST", c, b"{\"messages\": \"\xff\xfe\"}".to_vec(), 400, "UTF-8"),
        ("missing messages", "POST", c, j(json!({"model": "m"})), 400, "`messages` is required"),
        ("messages not array", "POST", c, j(json!({"messages": "hi"})), 400, "must be an array"),
        ("empty messages", "POST", c, j(json!({"messages": []})), 400, "must not be empty"),
        ("message without role", "POST", c, j(json!({"messages": [{"content": "x"}]})), 400, "role"),
        ("unknown role", "POST", c, j(json!({"messages": [{"role": "wizard", "content": "x"}]})), 400, "unknown role"),
        (
            "tool message without its call id",
            "POST",
            c,
            j(json!({"messages": [{"role": "tool", "content": "x"}]})),
            400,
            "tool_call_id",
        ),
        (
            "tool result answering no call",
            "POST",
            c,
            j(
                json!({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "call_9", "content": "x"}]}),
            ),
            400,
            "'call_9' answers no tool call",
        ),
        (
            "tool call left unanswered",
            "POST",
            c,
            j(json!({"messages": [{"role": "user", "content": "x"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
                {"role": "user", "content": "y"}]})),
            400,
            "has none for: c2",
        ),
        (
            "two tool calls of one message with one id",
            "POST",
            c,
            j(json!({"messages": [{"role": "user", "content": "x"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "c1", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
                {"role": "tool", "tool_call_id": "c1", "content": "y"}]})),
            400,
            "Duplicate value for 'id' of 'c1'",
        ),
        ("user message without content", "POST", c, j(json!({"messages": [{"role": "user"}]})), 400, "content"),
        ("content wrong type", "POST", c, j(json!({"messages": [{"role": "user", "content": 5}]})), 400, "content"),
        (
            "image part",
            "POST",
            c,
            j(json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})),
            400,
            "not supported",
        ),
        (
            "part without type",
            "POST",
            c,
            j(json!({"messages": [{"role": "user", "content": [{"text": "x"}]}]})),
            400,
            "type",
        ),
        ("max_tokens zero", "POST", c, j(chat("x", json!({"max_tokens": 0}))), 400, "max_tokens"),
        ("max_tokens negative", "POST", c, j(chat("x", json!({"max_tokens": -5}))), 400, "max_tokens"),
        ("max_tokens absurd", "POST", c, j(chat("x", json!({"max_tokens": 100000000}))), 400, "context length"),
        ("max_tokens string", "POST", c, j(chat("x", json!({"max_tokens": "ten"}))), 400, "integer"),
        ("max_completion_tokens zero", "POST", c, j(chat("x", json!({"max_completion_tokens": 0}))), 400, "max_tokens"),
        ("temperature string", "POST", c, j(chat("x", json!({"temperature": "hot"}))), 400, "temperature"),
        ("temperature negative", "POST", c, j(chat("x", json!({"temperature": -1}))), 400, "temperature"),
        ("top_p above one", "POST", c, j(chat("x", json!({"top_p": 1.5}))), 400, "top_p"),
        ("min_p negative", "POST", c, j(chat("x", json!({"min_p": -0.1}))), 400, "min_p"),
        ("top_k negative", "POST", c, j(chat("x", json!({"top_k": -2}))), 400, "top_k"),
        (
            "repetition_penalty zero",
            "POST",
            c,
            j(chat("x", json!({"repetition_penalty": 0}))),
            400,
            "repetition_penalty",
        ),
        (
            "presence_penalty out of range",
            "POST",
            c,
            j(chat("x", json!({"presence_penalty": 5}))),
            400,
            "presence_penalty",
        ),
        (
            "frequency_penalty out of range",
            "POST",
            c,
            j(chat("x", json!({"frequency_penalty": -3}))),
            400,
            "frequency_penalty",
        ),
        ("seed negative", "POST", c, j(chat("x", json!({"seed": -1}))), 400, "seed"),
        ("stop wrong type", "POST", c, j(chat("x", json!({"stop": 7}))), 400, "stop"),
        ("too many stops", "POST", c, j(chat("x", json!({"stop": ["a", "b", "c", "d", "e"]}))), 400, "at most 4"),
        ("empty stop", "POST", c, j(chat("x", json!({"stop": [""]}))), 400, "empty"),
        ("n zero", "POST", c, j(chat("x", json!({"n": 0}))), 400, "between 1"),
        ("stream not bool", "POST", c, j(chat("x", json!({"stream": "yes"}))), 400, "stream"),
        (
            "stream_options wrong",
            "POST",
            c,
            j(chat("x", json!({"stream": true, "stream_options": 3}))),
            400,
            "stream_options",
        ),
        ("top_logprobs without logprobs", "POST", c, j(chat("x", json!({"top_logprobs": 3}))), 400, "requires"),
        (
            "top_logprobs too many",
            "POST",
            c,
            j(chat("x", json!({"logprobs": true, "top_logprobs": 50}))),
            400,
            "top_logprobs",
        ),
        (
            "response_format json_schema",
            "POST",
            c,
            j(chat("x", json!({"response_format": {"type": "json_schema"}}))),
            400,
            "json_schema",
        ),
        (
            "tools",
            "POST",
            c,
            j(chat("x", json!({"tools": [{"type": "function", "function": {"description": "f"}}]}))),
            400,
            "name",
        ),
        ("logit_bias key", "POST", c, j(chat("x", json!({"logit_bias": {"five": 10}}))), 400, "token id"),
        ("logit_bias range", "POST", c, j(chat("x", json!({"logit_bias": {"5": 101}}))), 400, "-100 to 100"),
        ("bad regex", "POST", c, j(chat("x", json!({"guided_regex": "(x"}))), 400, "grammar"),
        (
            "chat_template_kwargs wrong",
            "POST",
            c,
            j(chat("x", json!({"chat_template_kwargs": [1]}))),
            400,
            "chat_template_kwargs",
        ),
        ("completion missing prompt", "POST", p, j(json!({"max_tokens": 4})), 400, "`prompt` is required"),
        ("completion empty prompt", "POST", p, j(json!({"prompt": ""})), 400, "empty"),
        ("completion prompt wrong type", "POST", p, j(json!({"prompt": {"a": 1}})), 400, "prompt"),
        (
            "completion prompts x n past the group",
            "POST",
            p,
            j(json!({"prompt": ["a", "b"], "n": 65})),
            400,
            "at most 128",
        ),
        ("completion bad token id", "POST", p, j(json!({"prompt": [1, -4]})), 400, "token ids"),
        ("completion token outside vocab", "POST", p, j(json!({"prompt": [1, 99999999]})), 400, "vocabulary"),
        ("completion prompt too long", "POST", p, j(json!({"prompt": long_prompt})), 400, "maximum context length"),
        (
            "completion max_tokens 0 without echo",
            "POST",
            p,
            j(json!({"prompt": "a", "max_tokens": 0})),
            400,
            "max_tokens",
        ),
        (
            "completion echo with suffix",
            "POST",
            p,
            j(json!({"prompt": "a", "echo": true, "suffix": "b"})),
            400,
            "suffix",
        ),
        ("completion logprobs too many", "POST", p, j(json!({"prompt": "a", "logprobs": 9})), 400, "logprobs"),
        ("body over the limit", "POST", p, big.into_bytes(), 413, "limit"),
        ("unknown endpoint", "POST", "/v1/nothing", j(json!({})), 404, "no such endpoint"),
        ("wrong method", "GET", c, Vec::new(), 405, "method not allowed"),
    ];
    assert!(cases.len() >= 40, "the corpus has {} cases", cases.len());
    for (name, method, path, body, status, needle) in &cases {
        let r = s.request(method, path, &[("Content-Type", "application/json")], body);
        assert_eq!(r.status, *status, "{name}: {}", r.text());
        let v = r.json();
        let e = &v["error"];
        assert!(e["message"].is_string() && e["type"].is_string(), "{name}: not an OpenAI error body: {v}");
        assert!(
            e.as_object().unwrap().contains_key("param") && e.as_object().unwrap().contains_key("code"),
            "{name}: {v}"
        );
        let msg = e["message"].as_str().unwrap();
        assert!(msg.to_lowercase().contains(&needle.to_lowercase()), "{name}: message {msg:?} lacks {needle:?}");
        assert_good(&s);
    }
    // Unknown fields are ignored, not refused.
    let r = s.post("/v1/chat/completions", &chat("Hi", json!({"frobnicate": true, "user": "u1"})));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_client_that_disconnects_mid_stream_stops_its_generation() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &[]);
    let body = chat("Tell me everything", json!({"max_tokens": 3000, "stream": true})).to_string();
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    write!(sock, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    let mut buf = [0u8; 4096];
    let mut seen = 0;
    while seen < 3 {
        let n = sock.read(&mut buf).unwrap();
        assert!(n > 0);
        seen += String::from_utf8_lossy(&buf[..n]).matches("data: ").count();
    }
    drop(sock);
    let t = std::time::Instant::now();
    loop {
        let st = s.stats();
        if st["cancelled"] == 1 {
            let produced = st["last_cancelled_tokens"].as_u64().unwrap();
            assert!(produced < 3000, "generation ran to the end ({produced} tokens)");
            assert_eq!(st["client_disconnects"], 1);
            assert_eq!(st["active"], 0);
            break;
        }
        assert!(t.elapsed().as_secs() < 20, "generation was not cancelled: {st}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let t = std::time::Instant::now();
    assert_good(&s);
    assert!(t.elapsed().as_secs_f64() < 10.0);
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--queue", "1", "--batch", "1", "--debug-endpoints"]);
    // Held once the engine waits on its queue (as the Messages twin in
    // anthropic.rs): A is taken by the held engine, B waits in the queue of
    // one, C finds it full.
    s.wait_for("the engine to wait for work", |st| st["engine_idle"] == true);
    s.hold();
    std::thread::scope(|sc| {
        let a = sc.spawn(|| s.post("/v1/chat/completions", &chat("A", json!({}))));
        s.wait_for("A to be taken", |st| st["queued"] == 1 && st["hold"]["parked"] == true);
        let b = sc.spawn(|| s.post("/v1/chat/completions", &chat("B", json!({}))));
        s.wait_for("B to be queued", |st| st["queued"] == 2);
        let r = s.post("/v1/chat/completions", &chat("C", json!({})));
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.json()["error"]["type"], "server_error");
        s.release();
        assert_eq!((a.join().unwrap().status, b.join().unwrap().status), (200, 200));
    });
    assert_good(&s);
}

/// Found by tests/it/fuzz.rs: a lone request with more choices (`n`) than
/// `--queue` got a 503 or not depending on how fast the engine drained its
/// first choices, as each choice took its own place in the queue.
#[test]
fn a_request_with_more_choices_than_the_queue_goes_in_whole() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--queue", "2", "--debug-endpoints"]);
    s.hold();
    std::thread::scope(|sc| {
        let a = sc.spawn(|| s.post("/v1/chat/completions", &chat("A", json!({"n": 5, "max_tokens": 3}))));
        s.wait_for("all five choices to be queued", |st| st["queued"] == 5);
        // The queue holds more than its limit now: a request finds it full
        // and queues none of its choices.
        let r = s.post("/v1/completions", &json!({"prompt": "B", "max_tokens": 3, "n": 2}));
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(s.stats()["queued"], 5);
        s.release();
        let r = a.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let choices = r.json()["choices"].as_array().unwrap().clone();
        assert_eq!(choices.len(), 5);
        assert!(choices.iter().all(|c| c["finish_reason"].is_string()), "{choices:?}");
    });
    assert_good(&s);
}

#[test]
fn several_prompts_in_one_completion_answer_as_separate_requests_and_echo_leads_each_text() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &[]);
    let greedy = |prompt: Value, extra: Value| {
        let mut b = json!({"prompt": prompt, "max_tokens": 5, "temperature": 0});
        for (k, x) in extra.as_object().unwrap() {
            b[k] = x.clone();
        }
        s.post_ok("/v1/completions", &b)
    };
    let texts = ["Once upon a time", "The cat sat"];
    let alone: Vec<Value> = texts.iter().map(|t| greedy(json!(t), json!({}))).collect();
    let text = |v: &Value, i: usize| v["choices"][i]["text"].as_str().unwrap().to_owned();
    // Each prompt's `n` choices follow one another, in the prompts' order;
    // usage counts each prompt once and every choice's tokens.
    let both = greedy(json!(texts), json!({"n": 2}));
    let choices = both["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4, "{both}");
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i, "{both}");
        assert_eq!(c["text"].as_str().unwrap(), text(&alone[i / 2], 0), "choice {i}: {both}");
    }
    let sum = |k: &str| alone.iter().map(|v| v["usage"][k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(both["usage"]["prompt_tokens"], sum("prompt_tokens"), "{both}");
    assert_eq!(both["usage"]["completion_tokens"], 2 * sum("completion_tokens"), "{both}");
    // Token-id prompts, several of them.
    let ids = [json!([1, 2, 3, 4]), json!([9, 8, 7])];
    let ids_alone: Vec<String> = ids.iter().map(|p| text(&greedy(p.clone(), json!({})), 0)).collect();
    let ids_both = greedy(json!(ids), json!({}));
    assert_eq!([text(&ids_both, 0), text(&ids_both, 1)], [ids_alone[0].clone(), ids_alone[1].clone()], "{ids_both}");
    // `echo`: the prompt as sent, then the same completion, whole or streamed.
    let echoed = greedy(json!(texts), json!({"echo": true}));
    for (i, t) in texts.iter().enumerate() {
        assert_eq!(text(&echoed, i), format!("{t}{}", text(&alone[i], 0)), "{echoed}");
    }
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": texts[0], "max_tokens": 5, "temperature": 0, "echo": true, "stream": true}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let streamed: String = r
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok()?["choices"][0]["text"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(streamed, format!("{}{}", texts[0], text(&alone[0], 0)));
    // Echoed ids come back as their text, ahead of the completion.
    let echoed_ids = text(&greedy(ids[0].clone(), json!({"echo": true})), 0);
    assert!(echoed_ids.len() > ids_alone[0].len() && echoed_ids.ends_with(&ids_alone[0]), "{echoed_ids:?}");
}

#[test]
fn api_key_is_required_when_set_and_flags_override_the_config_file() {
    let dir = Scratch::new("cfg");
    let cfg = dir.0.join("host.toml");
    std::fs::write(&cfg, "api_key = \"from-file\"\nmodel_id = \"file-id\"\nmax_tokens = 3\n").unwrap();
    let cfg_s = cfg.to_str().unwrap();
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--config", cfg_s, "--api-key", "sekrit"]);
    let body = chat("Hi", json!({})).to_string();
    let r = s.request("POST", "/v1/chat/completions", &[("Content-Type", "application/json")], body.as_bytes());
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = s.request("POST", "/v1/chat/completions", &[("Authorization", "Bearer from-file")], body.as_bytes());
    assert_eq!(r.status, 401, "the flag must override the file's key");
    let r = s.request("GET", "/v1/models", &[("Authorization", "Bearer sekrit")], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["data"][0]["id"], "file-id");
    // The file's max_tokens is the default for requests that give none.
    let mut v = chat("Hi", json!({}));
    v.as_object_mut().unwrap().remove("max_tokens");
    let r = s.request("POST", "/v1/chat/completions", &[("Authorization", "Bearer sekrit")], v.to_string().as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["usage"]["completion_tokens"].as_u64().unwrap() <= 3);
    assert_eq!(s.request("GET", "/health", &[], b"").status, 200, "health needs no key");
}

fn sdk_check(model_rel: &str, expect_paris: bool) {
    let s = Server::start(&model(model_rel), &[]);
    let script = it::repo_root().join("tests/http/openai_sdk_check.py");
    let out = run_ok(python().arg(script).arg(s.base_url()).arg(if expect_paris { "paris" } else { "any" }));
    assert!(out.contains("ALL OK"), "{out}");
}

#[test]
fn the_openai_python_sdk_works_against_the_tiny_model() {
    sdk_check("tiny/tiny-llama-f32", false);
}

#[test]
fn the_openai_python_sdk_works_against_the_default_model() {
    sdk_check("smollm2-135m-instruct", true);
}

#[test]
fn sigterm_cancels_in_flight_generation_and_exits_cleanly() {
    let mut s = Server::start(&model("tiny/tiny-llama-f32"), &[]);
    let body = chat("Keep going", json!({"max_tokens": 3000, "stream": true})).to_string();
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    write!(sock, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len()).unwrap();
    // Read until generation is under way (a content delta came).
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"content\":\"") || count_deltas(&seen) < 2 {
        let n = sock.read(&mut buf).unwrap();
        assert!(n > 0, "the stream ended before generating: {}", String::from_utf8_lossy(&seen));
        seen.extend_from_slice(&buf[..n]);
    }
    let pid = s.child.id() as i32;
    extern "C" {
        fn kill(pid: i32, sig: i32) -> i32;
    }
    assert_eq!(unsafe { kill(pid, 15) }, 0);
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed().as_secs() < 20, "the server did not exit after SIGTERM");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "exit status {status}");
    // The in-flight stream was ended properly (a last chunk with its
    // finish_reason, then [DONE]) well before its 3000 tokens.
    let _ = sock.read_to_end(&mut seen);
    let text = String::from_utf8_lossy(&seen);
    assert!(text.contains("\"finish_reason\":\"stop\""), "no finishing chunk: {text}");
    let last = text.rfind("data: ").map(|i| &text[i..]).unwrap_or("");
    assert!(last.starts_with("data: [DONE]"), "the stream did not end with [DONE]: {text}");
    assert!(count_deltas(&seen) < 3000, "the generation was not cancelled");
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(log.contains("shutting down"), "{log}");
}

/// Content deltas in a chat SSE stream read so far.
fn count_deltas(stream: &[u8]) -> usize {
    String::from_utf8_lossy(stream).matches("\"delta\":{\"content\":").count()
}
