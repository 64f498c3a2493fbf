//! A bad-request corpus per endpoint that had no corpus of its own:
//! `/v1/completions`, `/v1/messages/count_tokens`, `/v1/responses/{id}`
//! (GET and DELETE) and `/v1/embeddings` (chat, Messages and Responses
//! creation have theirs in http.rs, anthropic.rs and responses.rs). Each
//! case is a 4xx in that API's error shape, and a good request right after
//! it succeeds with the same answer as before.

use it::{model, python, run_ok, Scratch, Server};
use serde_json::{json, Value};

/// (what, method, path, body, status, the parameter named or "", a phrase the message must hold)
type Case = (&'static str, &'static str, String, Vec<u8>, u16, &'static str, &'static str);

fn j(v: Value) -> Vec<u8> {
    v.to_string().into_bytes()
}

/// Sends every case; checks each is OpenAI's error shape with the status,
/// parameter and phrase given, then that `good` still holds.
fn run_openai_corpus(s: &Server, cases: &[Case], good: impl Fn()) {
    assert!(cases.len() >= 15, "the corpus has {} cases", cases.len());
    for (name, method, path, body, status, param, needle) in cases {
        let r = s.request(method, path, &[("Content-Type", "application/json")], body);
        assert_eq!(r.status, *status, "{name}: {}", r.text());
        let v = r.json();
        let e = v["error"].as_object().unwrap_or_else(|| panic!("{name}: not an OpenAI error body: {v}"));
        assert!(e["message"].is_string() && e["type"].is_string(), "{name}: {v}");
        assert!(e.contains_key("param") && e.contains_key("code"), "{name}: {v}");
        if !param.is_empty() {
            assert_eq!(e["param"], *param, "{name}: {v}");
        }
        let msg = e["message"].as_str().unwrap();
        assert!(msg.to_lowercase().contains(&needle.to_lowercase()), "{name}: message {msg:?} lacks {needle:?}");
        good();
    }
}

#[test]
fn bad_completions_requests_get_openai_errors_and_the_server_keeps_serving() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--body-limit", "65536"]);
    let good = json!({"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0});
    let expected = s.post("/v1/completions", &good).json()["choices"][0]["text"].clone();
    assert!(expected.as_str().is_some_and(|t| !t.is_empty()), "{expected}");
    let p = || "/v1/completions".to_owned();
    let with = |extra: Value| {
        let mut v = json!({"prompt": "a", "max_tokens": 4});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        j(v)
    };
    let too_long: Vec<u32> = (0..4096).map(|i| 100 + i % 1000).collect();
    let cases: Vec<Case> = vec![
        ("malformed json", "POST", p(), b"{\"prompt\": ".to_vec(), 400, "", "malformed JSON"),
        ("empty body", "POST", p(), Vec::new(), 400, "", "empty"),
        ("a number for a body", "POST", p(), b"42".to_vec(), 400, "", "JSON object"),
        ("invalid utf-8", "POST", p(), b"{\"prompt\": \"\xc3\x28\"}".to_vec(), 400, "", "UTF-8"),
        ("a lone surrogate", "POST", p(), b"{\"prompt\": \"\\ud800\"}".to_vec(), 400, "", "malformed JSON"),
        ("nesting past the parser's limit", "POST", p(), deep("prompt"), 400, "", "malformed JSON"),
        ("prompt null", "POST", p(), j(json!({"prompt": null})), 400, "prompt", "`prompt` is required"),
        ("model a number", "POST", p(), with(json!({"model": 5})), 400, "model", "`model` must be a string"),
        ("prompt a boolean", "POST", p(), j(json!({"prompt": true})), 400, "prompt", "must be a string"),
        ("prompt a list of booleans", "POST", p(), j(json!({"prompt": [true]})), 400, "prompt", "must be a string"),
        ("token ids as floats", "POST", p(), j(json!({"prompt": [1.5, 2]})), 400, "prompt", "integers from 0"),
        ("token ids with a string", "POST", p(), j(json!({"prompt": [[1, "a"]]})), 400, "prompt", "integers from 0"),
        ("ids and text mixed", "POST", p(), j(json!({"prompt": [1, "a"]})), 400, "prompt", "mixes kinds"),
        ("an empty list of ids", "POST", p(), j(json!({"prompt": [[]]})), 400, "prompt", "empty"),
        ("a token id past u32", "POST", p(), j(json!({"prompt": [4294967296u64]})), 400, "prompt", "integers from 0"),
        ("a prompt at the context", "POST", p(), j(json!({"prompt": too_long})), 400, "prompt", "maximum context"),
        (
            "max_tokens past the context",
            "POST",
            p(),
            with(json!({"max_tokens": 100_000_000})),
            400,
            "prompt",
            "maximum context length",
        ),
        ("max_tokens a float", "POST", p(), with(json!({"max_tokens": 1.5})), 400, "max_tokens", "integer"),
        ("max_tokens huge", "POST", p(), with(json!({"max_tokens": 1e30})), 400, "max_tokens", "integer"),
        ("temperature a string", "POST", p(), with(json!({"temperature": "hot"})), 400, "temperature", "number"),
        ("top_p negative", "POST", p(), with(json!({"top_p": -1})), 400, "top_p", "between 0 and 1"),
        ("top_k a float", "POST", p(), with(json!({"top_k": 1.5})), 400, "top_k", "integer"),
        ("min_p above one", "POST", p(), with(json!({"min_p": 2})), 400, "min_p", "between 0 and 1"),
        ("seed past i64", "POST", p(), with(json!({"seed": 18446744073709551615u64})), 400, "seed", "integer"),
        ("n too many", "POST", p(), with(json!({"n": 1000})), 400, "n", "between 1 and 128"),
        ("best_of other than n", "POST", p(), with(json!({"best_of": 3})), 400, "best_of", "not supported"),
        ("stop a list of numbers", "POST", p(), with(json!({"stop": [5]})), 400, "stop", "array of strings"),
        ("echo a string", "POST", p(), with(json!({"echo": "yes"})), 400, "echo", "true or false"),
        ("logprobs a boolean", "POST", p(), with(json!({"logprobs": true})), 400, "logprobs", "between 0 and 5"),
        ("logit_bias a list", "POST", p(), with(json!({"logit_bias": [1]})), 400, "logit_bias", "object"),
        (
            "logit_bias outside the vocabulary",
            "POST",
            p(),
            with(json!({"logit_bias": {"999999999": 5}})),
            400,
            "logit_bias",
            "vocabulary",
        ),
        ("suffix a number", "POST", p(), with(json!({"suffix": 5})), 400, "suffix", "string"),
        (
            "response_format of an unknown type",
            "POST",
            p(),
            with(json!({"response_format": {"type": "xml"}})),
            400,
            "response_format.type",
            "unknown",
        ),
        ("guided_choice empty", "POST", p(), with(json!({"guided_choice": []})), 400, "guided_choice", "non-empty"),
        (
            "two structured outputs",
            "POST",
            p(),
            with(json!({"guided_json": {"type": "object"}, "guided_regex": "a"})),
            400,
            "",
            "only one",
        ),
        ("stream_options a string", "POST", p(), with(json!({"stream_options": "x"})), 400, "stream_options", "object"),
        ("a body over the limit", "POST", p(), oversized("prompt"), 413, "", "limit"),
        ("GET", "GET", p(), Vec::new(), 405, "", "method not allowed"),
        ("a trailing slash", "POST", "/v1/completions/".to_owned(), with(json!({})), 404, "", "no such endpoint"),
    ];
    run_openai_corpus(&s, &cases, || {
        let r = s.post("/v1/completions", &good);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["choices"][0]["text"], expected, "the same greedy answer as before");
    });
}

#[test]
fn a_top_k_past_u32_keeps_every_token() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &[]);
    let text = |top_k: Value| {
        let body = json!({"prompt": "Once", "max_tokens": 24, "temperature": 1, "seed": 7, "top_k": top_k});
        let r = s.post("/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["choices"][0]["text"].as_str().unwrap().to_owned()
    };
    let off = text(json!(0));
    assert_ne!(off, text(json!(1)), "sampling at temperature 1 differs from greedy here");
    // 2^32 + 1 is 1 once wrapped into 32 bits: greedy, the opposite of what was asked.
    assert_eq!(text(json!(4294967297u64)), off);
}

#[test]
fn bad_count_tokens_requests_get_anthropic_errors_and_the_server_keeps_serving() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--body-limit", "65536"]);
    let path = "/v1/messages/count_tokens";
    let user = json!([{"role": "user", "content": "Hello"}]);
    let good = json!({"model": "m", "messages": user});
    let counted = s.post(path, &good).json()["input_tokens"].as_u64().expect("a count");
    let with = |extra: Value| {
        let mut v = json!({"model": "m", "messages": user});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        j(v)
    };
    let msgs = |m: Value| with(json!({"messages": m}));
    let weather = json!({"name": "get_weather", "input_schema": {"type": "object"}});
    type AnthropicCase = (&'static str, &'static str, Vec<u8>, u16, &'static str, &'static str);
    let bad = "invalid_request_error";
    let cases: Vec<AnthropicCase> = vec![
        ("malformed json", "POST", b"{\"model\":".to_vec(), 400, bad, "malformed JSON"),
        ("a list for a body", "POST", b"[1]".to_vec(), 400, bad, "JSON object"),
        ("invalid utf-8", "POST", b"{\"model\": \"\xff\"}".to_vec(), 400, bad, "UTF-8"),
        ("nesting past the parser's limit", "POST", deep("messages"), 400, bad, "malformed JSON"),
        ("missing model", "POST", j(json!({"messages": user})), 400, bad, "`model` is required"),
        ("model a number", "POST", with(json!({"model": 5})), 400, bad, "`model` must be a string"),
        ("messages a string", "POST", msgs(json!("hi")), 400, bad, "array"),
        ("no messages", "POST", msgs(json!([])), 400, bad, "at least one"),
        ("a message not an object", "POST", msgs(json!([5])), 400, bad, "must be an object"),
        ("a message without role", "POST", msgs(json!([{"content": "x"}])), 400, bad, "role"),
        ("an unknown role", "POST", msgs(json!([{"role": "robot", "content": "x"}])), 400, bad, "unknown role"),
        ("content a number", "POST", msgs(json!([{"role": "user", "content": 5}])), 400, bad, "content"),
        (
            "an unknown block type",
            "POST",
            msgs(json!([{"role": "user", "content": [{"type": "hologram"}]}])),
            400,
            bad,
            "unknown content block type",
        ),
        (
            "a document block",
            "POST",
            msgs(json!([{"role": "user", "content": [{"type": "document", "source": {}}]}])),
            400,
            bad,
            "not supported",
        ),
        (
            "a text block without text",
            "POST",
            msgs(json!([{"role": "user", "content": [{"type": "text"}]}])),
            400,
            bad,
            "text",
        ),
        (
            "tool_use from the user",
            "POST",
            msgs(json!([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}])),
            400,
            bad,
            "cannot appear",
        ),
        (
            "a final assistant message",
            "POST",
            msgs(json!([{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])),
            400,
            bad,
            "prefill",
        ),
        ("system a number", "POST", with(json!({"system": 5})), 400, bad, "system"),
        ("tools a string", "POST", with(json!({"tools": "x"})), 400, bad, "`tools` must be an array"),
        ("a tool without input_schema", "POST", with(json!({"tools": [{"name": "f"}]})), 400, bad, "input_schema"),
        (
            "a server tool",
            "POST",
            with(json!({"tools": [{"type": "bash_20250124", "name": "bash"}]})),
            400,
            bad,
            "not supported",
        ),
        (
            "tool_choice naming no tool",
            "POST",
            with(json!({"tools": [weather], "tool_choice": {"type": "tool", "name": "g"}})),
            400,
            bad,
            "not in tools",
        ),
        ("an unknown thinking type", "POST", with(json!({"thinking": {"type": "sometimes"}})), 400, bad, "thinking"),
        ("a body over the limit", "POST", oversized("messages"), 413, "request_too_large", "limit"),
        ("GET", "GET", Vec::new(), 405, bad, "method not allowed"),
    ];
    assert!(cases.len() >= 15, "the corpus has {} cases", cases.len());
    for (name, method, body, status, kind, needle) in &cases {
        let r = s.request(method, path, &[("Content-Type", "application/json")], body);
        assert_eq!(r.status, *status, "{name}: {}", r.text());
        let v = r.json();
        assert_eq!(v["type"], "error", "{name}: not Anthropic's error shape: {v}");
        assert_eq!(v["error"]["type"], *kind, "{name}: {v}");
        let msg = v["error"]["message"].as_str().unwrap_or_else(|| panic!("{name}: no message: {v}"));
        assert!(msg.to_lowercase().contains(&needle.to_lowercase()), "{name}: message {msg:?} lacks {needle:?}");
        let r = s.post(path, &good);
        assert_eq!((r.status, r.json()["input_tokens"].as_u64()), (200, Some(counted)), "after {name}");
    }
}

#[test]
fn bad_response_ids_get_openai_errors_and_the_store_keeps_serving() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &[]);
    let create = |extra: Value| {
        let mut v = json!({"model": "m", "input": "Hello", "max_output_tokens": 4, "temperature": 0});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        let r = s.post("/v1/responses", &v);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let kept = create(json!({}));
    let kept_id = kept["id"].as_str().unwrap().to_owned();
    let unstored = create(json!({"store": false}))["id"].as_str().unwrap().to_owned();
    let deleted = create(json!({}))["id"].as_str().unwrap().to_owned();
    let r = s.request("DELETE", &format!("/v1/responses/{deleted}"), &[], b"");
    assert_eq!(r.status, 200, "{}", r.text());
    let chat_id = s
        .post("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}))
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let at = |id: &str| format!("/v1/responses/{id}");
    let long = format!("resp_{}", "a".repeat(8000));
    let missing = "no response found";
    let cases: Vec<Case> = vec![
        ("GET an unknown id", "GET", at("resp_0123456789abcdef"), Vec::new(), 404, "", missing),
        ("DELETE an unknown id", "DELETE", at("resp_0123456789abcdef"), Vec::new(), 404, "", missing),
        ("GET a deleted id", "GET", at(&deleted), Vec::new(), 404, "", missing),
        ("DELETE a deleted id again", "DELETE", at(&deleted), Vec::new(), 404, "", missing),
        ("GET a store:false id", "GET", at(&unstored), Vec::new(), 404, "", missing),
        ("DELETE a store:false id", "DELETE", at(&unstored), Vec::new(), 404, "", missing),
        ("GET a chat completion's id", "GET", at(&chat_id), Vec::new(), 404, "", missing),
        ("GET an id without its prefix", "GET", at(kept_id.trim_start_matches("resp_")), Vec::new(), 404, "", missing),
        ("GET the id in upper case", "GET", at(&kept_id.to_uppercase()), Vec::new(), 404, "", missing),
        ("GET an 8000-character id", "GET", at(&long), Vec::new(), 404, "", missing),
        ("GET an id with a space", "GET", at("resp_%20x"), Vec::new(), 404, "", missing),
        ("GET an id of bytes that are not UTF-8", "GET", at("%ff%fe"), Vec::new(), 404, "", missing),
        ("GET a path climbing out", "GET", at("..%2F..%2Fetc%2Fpasswd"), Vec::new(), 404, "", missing),
        ("GET an id with unicode", "GET", at("resp_%E2%9C%93"), Vec::new(), 404, "", missing),
        (
            "GET the input items (not built)",
            "GET",
            at(&format!("{kept_id}/input_items")),
            Vec::new(),
            404,
            "",
            "no such",
        ),
        ("GET with nothing after the slash", "GET", "/v1/responses/".to_owned(), Vec::new(), 404, "", "no such"),
        ("POST to an id", "POST", at(&kept_id), j(json!({})), 405, "", "method not allowed"),
        ("PUT to an id", "PUT", at(&kept_id), j(json!({})), 405, "", "method not allowed"),
        ("PATCH to an id", "PATCH", at(&kept_id), j(json!({})), 405, "", "method not allowed"),
        ("GET the collection (no listing)", "GET", "/v1/responses".to_owned(), Vec::new(), 405, "", "not allowed"),
    ];
    run_openai_corpus(&s, &cases, || {
        let r = s.request("GET", &at(&kept_id), &[], b"");
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json(), kept, "the stored response is unchanged");
    });
    let r = s.request("GET", &at("resp_0123456789abcdef"), &[], b"");
    assert_eq!(r.json()["error"]["code"], "response_not_found");
    let r = s.request("DELETE", &at(&kept_id), &[], b"");
    assert_eq!((r.status, r.json()["deleted"].as_bool()), (200, Some(true)), "{}", r.text());
}

#[test]
fn bad_embeddings_requests_get_openai_errors_and_the_server_keeps_serving() {
    let scratch = Scratch::new("bad-embeddings");
    let folder = scratch.0.join("embed");
    run_ok(
        python()
            .arg(it::repo_root().join("models/scripts/make_embedding.py"))
            .arg(model("tiny/tiny-qwen3-f32"))
            .arg(&folder)
            .args(["--pooling", "mean"]),
    );
    let s = Server::start(&folder, &["--body-limit", "65536"]);
    let good = json!({"input": ["a cat", "a dog"]});
    let expected = s.post("/v1/embeddings", &good).json()["data"].clone();
    assert_eq!(expected.as_array().map(Vec::len), Some(2), "{expected}");
    let e = || "/v1/embeddings".to_owned();
    let strings: Vec<&str> = vec!["a"; 2049];
    let arrays: Vec<[u32; 1]> = vec![[1]; 2049];
    let cases: Vec<Case> = vec![
        ("malformed json", "POST", e(), b"{\"input\":".to_vec(), 400, "", "malformed JSON"),
        ("empty body", "POST", e(), Vec::new(), 400, "", "empty"),
        ("a list for a body", "POST", e(), b"[\"a\"]".to_vec(), 400, "", "JSON object"),
        ("invalid utf-8", "POST", e(), b"{\"input\": \"\xff\"}".to_vec(), 400, "", "UTF-8"),
        ("nesting past the parser's limit", "POST", e(), deep("input"), 400, "", "malformed JSON"),
        ("input misspelt", "POST", e(), j(json!({"inputs": "a"})), 400, "input", "`input` is required"),
        ("input null", "POST", e(), j(json!({"input": null})), 400, "input", "`input` is required"),
        ("input a boolean", "POST", e(), j(json!({"input": true})), 400, "input", "must be a string"),
        ("a list of booleans", "POST", e(), j(json!({"input": [true]})), 400, "input", "must be a string"),
        ("ids and text mixed", "POST", e(), j(json!({"input": [[1, 2], "a"]})), 400, "input", "must be a string"),
        ("a negative id", "POST", e(), j(json!({"input": [[1, 2], [3, -1]]})), 400, "input", "non-negative"),
        ("an id past u32", "POST", e(), j(json!({"input": [4294967296u64]})), 400, "input", "non-negative"),
        ("an id outside the vocabulary", "POST", e(), j(json!({"input": [[99999999]]})), 400, "input", "vocabulary"),
        ("an empty string", "POST", e(), j(json!({"input": ""})), 400, "input", "empty"),
        ("2049 strings", "POST", e(), j(json!({"input": strings})), 400, "input", "at most 2048"),
        ("2049 id lists", "POST", e(), j(json!({"input": arrays})), 400, "input", "at most 2048"),
        (
            "a text past the context",
            "POST",
            e(),
            j(json!({"input": "word ".repeat(5000)})),
            400,
            "input",
            "maximum context length",
        ),
        ("dimensions a float", "POST", e(), j(json!({"input": "a", "dimensions": 1.5})), 400, "dimensions", "integer"),
        (
            "dimensions past the hidden size",
            "POST",
            e(),
            j(json!({"input": "a", "dimensions": 100_000_000_000u64})),
            400,
            "dimensions",
            "at most",
        ),
        (
            "encoding_format in capitals",
            "POST",
            e(),
            j(json!({"input": "a", "encoding_format": "BASE64"})),
            400,
            "encoding_format",
            "base64",
        ),
        ("a body over the limit", "POST", e(), oversized("input"), 413, "", "limit"),
        ("GET", "GET", e(), Vec::new(), 405, "", "method not allowed"),
    ];
    run_openai_corpus(&s, &cases, || {
        let r = s.post("/v1/embeddings", &good);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["data"], expected, "the same vectors as before");
    });
}

/// A body whose `field` nests arrays deeper than the JSON parser allows.
fn deep(field: &str) -> Vec<u8> {
    format!("{{\"{field}\": {}{}}}", "[".repeat(5000), "]".repeat(5000)).into_bytes()
}

/// A body over the 64 KiB limit these servers run with.
fn oversized(field: &str) -> Vec<u8> {
    format!("{{\"model\": \"m\", \"{field}\": \"{}\"}}", "x".repeat(70_000)).into_bytes()
}

/// A body that ends before its `Content-Length`, or whose chunks are
/// malformed: a 400 in the path's API's error shape (the body extractor's
/// own rejection is plain text), and the server keeps serving.
#[test]
fn a_body_cut_short_or_badly_chunked_gets_an_error_in_the_apis_shape() {
    use std::io::{Read, Write};
    let s = Server::start(&model("tiny/tiny-llama-f32"), &[]);
    let send = |path: &str, head: &str, body: &[u8]| -> String {
        let mut sock = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        write!(
            sock,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n{head}\r\n"
        )
        .unwrap();
        sock.write_all(body).unwrap();
        sock.shutdown(std::net::Shutdown::Write).unwrap();
        let mut raw = Vec::new();
        sock.read_to_end(&mut raw).unwrap();
        String::from_utf8_lossy(&raw).into_owned()
    };
    let cut = br#"{"messages": [{"role": "user", "#;
    for path in ["/v1/chat/completions", "/v1/responses", "/v1/messages"] {
        for (what, head, body) in [
            ("cut short", "Content-Length: 200\r\n".to_owned(), &cut[..]),
            ("bad chunk size", "Transfer-Encoding: chunked\r\n".to_owned(), &b"ZZ\r\nabc\r\n"[..]),
        ] {
            let raw = send(path, &head, body);
            let (head, body) = raw.split_once("\r\n\r\n").unwrap_or_else(|| panic!("{path} {what}: {raw}"));
            assert!(head.starts_with("HTTP/1.1 400"), "{path} {what}: {raw}");
            assert!(head.to_lowercase().contains("content-type: application/json"), "{path} {what}: {raw}");
            let v: Value = serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{path} {what}: {e}: {raw}"));
            if path == "/v1/messages" {
                assert_eq!(
                    (v["type"].as_str(), v["error"]["type"].as_str()),
                    (Some("error"), Some("invalid_request_error")),
                    "{v}"
                );
            } else {
                assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
                assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
            }
        }
    }
    let r = s.post("/v1/completions", &json!({ "prompt": [1, 2, 3], "max_tokens": 2 }));
    assert_eq!(r.status, 200, "{}", r.text());
}
