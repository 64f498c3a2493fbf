//! Anthropic's Messages API end to end: `tests/http/anthropic_check.py`
//! drives a live server with the anthropic SDK (plain, streamed, stop
//! sequences, forced tool use validated against `input_schema`, a
//! tool_result round trip, count_tokens against transformers); here, a
//! corpus of bad requests answered in Anthropic's error shape, the named
//! event stream, a vanished client, the queue's 529, and `x-api-key`.

use it::{hermes_folder, model, python, run_ok, Server};
use serde_json::{json, Value};

const MESSAGES: &str = "/v1/messages";
const COUNT: &str = "/v1/messages/count_tokens";

fn message(content: Value, extra: Value) -> Value {
    let mut v = json!({ "model": "m", "max_tokens": 8, "temperature": 0, "messages": [{ "role": "user", "content": content }] });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn assert_good(s: &Server) {
    let r = s.post(MESSAGES, &message(json!("Hello"), json!({})));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["type"], "message");
}

/// The events of an SSE body: (event name, data).
fn events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name = e.lines().find_map(|l| l.strip_prefix("event: ")).expect("an event name").to_owned();
            let data = e.lines().find_map(|l| l.strip_prefix("data: ")).expect("event data");
            (name, serde_json::from_str(data).expect("JSON data"))
        })
        .collect()
}

#[test]
fn the_anthropic_sdk_works_against_a_model_that_speaks_tools() {
    let dir = hermes_folder("anthropic-it");
    let s = Server::start(&dir, &[]);
    let script = it::repo_root().join("tests/http/anthropic_check.py");
    let out = run_ok(python().arg(script).arg(format!("http://127.0.0.1:{}", s.port)).arg(&dir));
    assert!(out.contains("ALL OK"), "{out}");
}

#[test]
fn bad_anthropic_requests_get_anthropic_errors_and_the_server_keeps_serving() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--body-limit", "65536"]);
    let j = |v: Value| v.to_string().into_bytes();
    let text = |s: &str| json!([{ "type": "text", "text": s }]);
    let weather = json!({ "name": "get_weather", "input_schema": { "type": "object", "properties": { "city": { "type": "string" } } } });
    let long = "word ".repeat(5000);
    let big = format!(
        "{{\"model\": \"m\", \"max_tokens\": 4, \"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}",
        "x".repeat(70_000)
    );
    // (what, method, path, body, status, Anthropic's error type, a phrase the message must hold)
    type Case<'a> = (&'a str, &'a str, &'a str, Vec<u8>, u16, &'a str, &'a str);
    let bad = "invalid_request_error";
    let cases: Vec<Case> = vec![
        ("malformed json", "POST", MESSAGES, b"{\"messages\": [".to_vec(), 400, bad, "malformed JSON"),
        ("empty body", "POST", MESSAGES, Vec::new(), 400, bad, "empty"),
        ("array body", "POST", MESSAGES, b"[1]".to_vec(), 400, bad, "JSON object"),
        ("invalid utf-8", "POST", MESSAGES, b"{\"model\": \"\xff\"}".to_vec(), 400, bad, "UTF-8"),
        (
            "missing max_tokens",
            "POST",
            MESSAGES,
            j(json!({"model": "m", "messages": [{"role": "user", "content": "x"}]})),
            400,
            bad,
            "`max_tokens` is required",
        ),
        (
            "max_tokens string",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"max_tokens": "ten"}))),
            400,
            bad,
            "integer",
        ),
        ("max_tokens zero", "POST", MESSAGES, j(message(json!("x"), json!({"max_tokens": 0}))), 400, bad, "max_tokens"),
        (
            "max_tokens past the context",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"max_tokens": 100_000_000}))),
            400,
            bad,
            "context length",
        ),
        (
            "missing model",
            "POST",
            MESSAGES,
            j(json!({"max_tokens": 4, "messages": [{"role": "user", "content": "x"}]})),
            400,
            bad,
            "`model` is required",
        ),
        ("model not a string", "POST", MESSAGES, j(message(json!("x"), json!({"model": 3}))), 400, bad, "model"),
        (
            "missing messages",
            "POST",
            MESSAGES,
            j(json!({"model": "m", "max_tokens": 4})),
            400,
            bad,
            "`messages` is required",
        ),
        (
            "messages not an array",
            "POST",
            MESSAGES,
            j(json!({"model": "m", "max_tokens": 4, "messages": "hi"})),
            400,
            bad,
            "array",
        ),
        (
            "no messages",
            "POST",
            MESSAGES,
            j(json!({"model": "m", "max_tokens": 4, "messages": []})),
            400,
            bad,
            "at least one",
        ),
        (
            "a system role in messages",
            "POST",
            MESSAGES,
            j(json!({"model": "m", "max_tokens": 4, "messages": [{"role": "system", "content": "x"}]})),
            400,
            bad,
            "unknown role",
        ),
        (
            "a message without content",
            "POST",
            MESSAGES,
            j(json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user"}]})),
            400,
            bad,
            "content",
        ),
        ("content a number", "POST", MESSAGES, j(message(json!(5), json!({}))), 400, bad, "content"),
        ("a block without type", "POST", MESSAGES, j(message(json!([{"text": "x"}]), json!({}))), 400, bad, "type"),
        (
            "an unknown block type",
            "POST",
            MESSAGES,
            j(message(json!([{"type": "hologram"}]), json!({}))),
            400,
            bad,
            "unknown content block type",
        ),
        (
            "an image block",
            "POST",
            MESSAGES,
            j(message(json!([{"type": "image", "source": {}}]), json!({}))),
            400,
            bad,
            "not supported",
        ),
        (
            "a text block without text",
            "POST",
            MESSAGES,
            j(message(json!([{"type": "text"}]), json!({}))),
            400,
            bad,
            "text",
        ),
        (
            "tool_use in a user message",
            "POST",
            MESSAGES,
            j(message(json!([{"type": "tool_use", "id": "t", "name": "f", "input": {}}]), json!({}))),
            400,
            bad,
            "cannot appear",
        ),
        (
            "tool_result without its id",
            "POST",
            MESSAGES,
            j(message(json!([{"type": "tool_result", "content": "x"}]), json!({}))),
            400,
            bad,
            "tool_use_id",
        ),
        (
            "tool_result answering no tool_use",
            "POST",
            MESSAGES,
            j(json!({"model": "m", "max_tokens": 4, "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "x"}]}]})),
            400,
            bad,
            "unexpected `tool_use_id` found in `tool_result` blocks: t9",
        ),
        (
            "tool_use without its tool_result",
            "POST",
            MESSAGES,
            j(json!({"model": "m", "max_tokens": 4, "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {"role": "user", "content": "y"}]})),
            400,
            bad,
            "without `tool_result` blocks immediately after: t1",
        ),
        (
            "two tool_use blocks of one message with one id",
            "POST",
            MESSAGES,
            j(json!({"model": "m", "max_tokens": 4, "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
                    {"type": "tool_use", "id": "t1", "name": "g", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "x"},
                    {"type": "tool_result", "tool_use_id": "t1", "content": "y"}]}]})),
            400,
            bad,
            "`tool_use` ids must be unique: t1",
        ),
        (
            "tool_use input not an object",
            "POST",
            MESSAGES,
            j(json!({"model": "m", "max_tokens": 4, "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "{}"}]},
                {"role": "user", "content": "y"}]})),
            400,
            bad,
            "input",
        ),
        (
            "a final assistant message",
            "POST",
            MESSAGES,
            j(
                json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}]}),
            ),
            400,
            bad,
            "prefill",
        ),
        (
            "temperature above one",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"temperature": 1.5}))),
            400,
            bad,
            "between 0 and 1",
        ),
        ("top_p a string", "POST", MESSAGES, j(message(json!("x"), json!({"top_p": "high"}))), 400, bad, "top_p"),
        ("top_k negative", "POST", MESSAGES, j(message(json!("x"), json!({"top_k": -1}))), 400, bad, "top_k"),
        (
            "stop_sequences a string",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"stop_sequences": "END"}))),
            400,
            bad,
            "stop_sequences",
        ),
        (
            "a whitespace stop sequence",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"stop_sequences": [" \n"]}))),
            400,
            bad,
            "non-whitespace",
        ),
        ("stream not a bool", "POST", MESSAGES, j(message(json!("x"), json!({"stream": "yes"}))), 400, bad, "stream"),
        ("system a number", "POST", MESSAGES, j(message(json!("x"), json!({"system": 7}))), 400, bad, "system"),
        (
            "an image in system",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"system": [{"type": "image"}]}))),
            400,
            bad,
            "not supported",
        ),
        (
            "a tool without input_schema",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"tools": [{"name": "f"}]}))),
            400,
            bad,
            "input_schema",
        ),
        (
            "a tool with a bad name",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"tools": [{"name": "no spaces", "input_schema": {"type": "object"}}]}))),
            400,
            bad,
            "name",
        ),
        (
            "a server tool",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}))),
            400,
            bad,
            "not supported",
        ),
        (
            "tool_choice any without tools",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"tool_choice": {"type": "any"}}))),
            400,
            bad,
            "at least one tool",
        ),
        (
            "tool_choice a string",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"tools": [weather], "tool_choice": "auto"}))),
            400,
            bad,
            "tool_choice",
        ),
        (
            "tool_choice of an unknown type",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"tools": [weather], "tool_choice": {"type": "all"}}))),
            400,
            bad,
            "tool_choice.type",
        ),
        (
            "tool_choice naming no tool",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"tools": [weather], "tool_choice": {"type": "tool", "name": "nope"}}))),
            400,
            bad,
            "not in tools",
        ),
        (
            "output_config of another type",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"output_config": {"format": {"type": "regex"}}}))),
            400,
            bad,
            "json_schema",
        ),
        (
            "thinking budget under 1024",
            "POST",
            MESSAGES,
            j(message(json!("x"), json!({"thinking": {"type": "enabled", "budget_tokens": 100}}))),
            400,
            bad,
            "budget_tokens",
        ),
        ("metadata a string", "POST", MESSAGES, j(message(json!("x"), json!({"metadata": "m"}))), 400, bad, "metadata"),
        (
            "a prompt past the context",
            "POST",
            MESSAGES,
            j(message(text(&long), json!({}))),
            400,
            bad,
            "maximum context length",
        ),
        ("count_tokens without messages", "POST", COUNT, j(json!({"model": "m"})), 400, bad, "`messages` is required"),
        (
            "count_tokens with a bad block",
            "POST",
            COUNT,
            j(json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "video"}]}]})),
            400,
            bad,
            "unknown content block type",
        ),
        ("a body over the limit", "POST", MESSAGES, big.into_bytes(), 413, "request_too_large", "limit"),
        ("an unknown path", "POST", "/v1/messages/batches", j(json!({})), 404, "not_found_error", "no such endpoint"),
        ("a wrong method", "GET", MESSAGES, Vec::new(), 405, bad, "method not allowed"),
    ];
    assert!(cases.len() >= 15, "the corpus has {} cases", cases.len());
    for (name, method, path, body, status, kind, needle) in &cases {
        let r = s.request(method, path, &[("Content-Type", "application/json")], body);
        assert_eq!(r.status, *status, "{name}: {}", r.text());
        let v = r.json();
        assert_eq!(v["type"], "error", "{name}: not Anthropic's error shape: {v}");
        assert_eq!(v["error"]["type"], *kind, "{name}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_else(|| panic!("{name}: no message: {v}"));
        assert!(msg.to_lowercase().contains(&needle.to_lowercase()), "{name}: message {msg:?} lacks {needle:?}");
        assert_good(&s);
    }
    // Unknown fields are ignored; count_tokens needs no max_tokens.
    let r = s.post(MESSAGES, &message(json!("Hi"), json!({"frobnicate": true, "metadata": {"user_id": "u1"}})));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.post(COUNT, &json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}]}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["input_tokens"].as_u64().unwrap() > 0);
}

#[test]
fn a_message_streams_as_named_events_with_a_ping() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &[]);
    let r = s.post(MESSAGES, &message(json!("Hello"), json!({"stream": true, "max_tokens": 6})));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    let evs = events(&r.text());
    for (name, data) in &evs {
        assert_eq!(data["type"], name.as_str(), "each event's name is its data's type");
    }
    let names: Vec<&str> = evs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names[..2], ["message_start", "ping"], "{names:?}");
    assert_eq!(names[names.len() - 2..], ["message_delta", "message_stop"], "{names:?}");
    let (_, delta) = &evs[evs.len() - 2];
    assert_eq!(delta["delta"]["stop_reason"], "max_tokens");
    assert_eq!(delta["usage"]["output_tokens"], 6);
    let whole = s.post(MESSAGES, &message(json!("Hello"), json!({"max_tokens": 6}))).json();
    let streamed: String = evs
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, whole["content"][0]["text"].as_str().unwrap());
}

#[test]
fn a_client_that_leaves_a_message_stream_stops_its_generation() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &[]);
    let body = message(json!("Tell me everything"), json!({"max_tokens": 3000, "stream": true}));
    let made = s.abandon_stream(MESSAGES, &body, 5);
    assert!(made < 3000, "generation ran to the end ({made} tokens)");
    assert_good(&s);
}

#[test]
fn a_full_queue_answers_529_overloaded_on_messages() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--queue", "1", "--batch", "1", "--debug-endpoints"]);
    // Held once the engine waits on its queue: a hold in force before its
    // loop first gets there parks it short of the queue, A is never taken
    // and fills the queue of one itself (B is then refused, not queued).
    s.wait_for("the engine to wait for work", |st| st["engine_idle"] == true);
    s.hold();
    std::thread::scope(|sc| {
        // A is taken by the held engine, B waits in the queue of one, C finds it full.
        let a = sc.spawn(|| s.post(MESSAGES, &message(json!("A"), json!({}))));
        // Parked, the engine has taken A out of the queue (it waited on the
        // queue: only A can wake it), so the queue has room for B.
        s.wait_for("A to be taken", |st| st["queued"] == 1 && st["hold"]["parked"] == true);
        let b = sc.spawn(|| s.post(MESSAGES, &message(json!("B"), json!({}))));
        // Counted only once in the queue: C, sent after, finds it full.
        s.wait_for("B to be queued", |st| st["queued"] == 2);
        let r = s.post(MESSAGES, &message(json!("C"), json!({})));
        assert_eq!(r.status, 529, "{}", r.text());
        assert_eq!(r.header("retry-after"), Some("1"));
        assert_eq!(r.json()["error"]["type"], "overloaded_error");
        s.release();
        assert_eq!((a.join().unwrap().status, b.join().unwrap().status), (200, 200));
    });
    assert_good(&s);
}

#[test]
fn x_api_key_or_bearer_authenticates_and_messages_fail_in_anthropic_shape() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--api-key", "sekrit"]);
    let body = message(json!("Hi"), json!({})).to_string();
    let post = |path: &str, headers: &[(&str, &str)]| {
        let mut h = vec![("Content-Type", "application/json")];
        h.extend_from_slice(headers);
        s.request("POST", path, &h, body.as_bytes())
    };
    for headers in [&[][..], &[("x-api-key", "wrong")][..], &[("Authorization", "Bearer wrong")][..]] {
        let r = post(MESSAGES, headers);
        assert_eq!(r.status, 401, "{headers:?}: {}", r.text());
        assert_eq!(r.json()["type"], "error");
        assert_eq!(r.json()["error"]["type"], "authentication_error");
    }
    assert_eq!(post(MESSAGES, &[("x-api-key", "sekrit")]).status, 200);
    assert_eq!(post(MESSAGES, &[("Authorization", "Bearer sekrit")]).status, 200);
    // The OpenAI routes take either header too, and fail in OpenAI's shape.
    let chat = json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}).to_string();
    let r = s.request("POST", "/v1/chat/completions", &[("x-api-key", "sekrit")], chat.as_bytes());
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.request("POST", "/v1/chat/completions", &[], chat.as_bytes());
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (401, Some("invalid_api_key")));
}
