//! OpenAI's Responses API end to end: `tests/http/responses_check.py`
//! drives a live server with the openai SDK (plain, streamed in the
//! documented event order, text.format, function calls and their outputs,
//! previous_response_id served by the prefix cache, GET, DELETE,
//! store:false); here, a corpus of bad requests and ids answered in
//! OpenAI's error shape, the response store's byte cap, and a vanished
//! stream client.

use it::{hermes_folder, model, python, run_ok, Server};
use serde_json::{json, Value};

const RESPONSES: &str = "/v1/responses";

fn create(input: Value, extra: Value) -> Value {
    let mut v = json!({ "model": "m", "input": input, "max_output_tokens": 8, "temperature": 0 });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn assert_good(s: &Server) -> Value {
    let r = s.post(RESPONSES, &create(json!("Hello"), json!({})));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "response");
    v
}

#[test]
fn the_openai_sdk_responses_work_against_a_model_that_speaks_tools() {
    let dir = hermes_folder("responses-it");
    let s = Server::start(&dir, &[]);
    let script = it::repo_root().join("tests/http/responses_check.py");
    let out = run_ok(python().arg(script).arg(s.base_url()).arg(&dir));
    assert!(out.contains("ALL OK"), "{out}");
}

#[test]
fn bad_responses_requests_get_openai_errors_and_the_server_keeps_serving() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--body-limit", "65536"]);
    let stored = assert_good(&s)["id"].as_str().unwrap().to_owned();
    let j = |v: Value| v.to_string().into_bytes();
    let weather = json!({ "type": "function", "name": "get_weather", "parameters": { "type": "object" } });
    let long = "word ".repeat(5000);
    let big = format!("{{\"input\": \"{}\"}}", "x".repeat(70_000));
    let r = RESPONSES;
    let unknown = "/v1/responses/resp_doesnotexist";
    // (what, method, path, body, status, parameter named or "", a phrase the message must hold)
    type Case<'a> = (&'a str, &'a str, &'a str, Vec<u8>, u16, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        ("malformed json", "POST", r, b"{\"input\": ".to_vec(), 400, "", "malformed JSON"),
        ("empty body", "POST", r, Vec::new(), 400, "", "empty"),
        ("array body", "POST", r, b"[]".to_vec(), 400, "", "JSON object"),
        ("missing input", "POST", r, j(json!({"model": "m"})), 400, "input", "`input` is required"),
        ("input a number", "POST", r, j(create(json!(3), json!({}))), 400, "input", "string or an array"),
        ("an empty input list", "POST", r, j(create(json!([]), json!({}))), 400, "input", "at least one"),
        ("an item not an object", "POST", r, j(create(json!(["hi"]), json!({}))), 400, "input[0]", "object"),
        (
            "an unknown item type",
            "POST",
            r,
            j(create(json!([{"type": "telepathy"}]), json!({}))),
            400,
            "input[0].type",
            "unknown input item type",
        ),
        (
            "an item_reference",
            "POST",
            r,
            j(create(json!([{"type": "item_reference", "id": "x"}]), json!({}))),
            400,
            "input[0].type",
            "not supported",
        ),
        (
            "a message without role",
            "POST",
            r,
            j(create(json!([{"content": "x"}]), json!({}))),
            400,
            "input[0].role",
            "role",
        ),
        (
            "a message of an unknown role",
            "POST",
            r,
            j(create(json!([{"role": "oracle", "content": "x"}]), json!({}))),
            400,
            "input[0].role",
            "unknown role",
        ),
        (
            "an image part",
            "POST",
            r,
            j(create(json!([{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]), json!({}))),
            400,
            "input[0].content[0].type",
            "not supported",
        ),
        (
            "an unknown part",
            "POST",
            r,
            j(create(json!([{"role": "user", "content": [{"type": "smell"}]}]), json!({}))),
            400,
            "input[0].content[0].type",
            "unknown content part type",
        ),
        (
            "a function_call without call_id",
            "POST",
            r,
            j(create(json!([{"type": "function_call", "name": "f", "arguments": "{}"}]), json!({}))),
            400,
            "input[0].call_id",
            "call_id",
        ),
        (
            "function_call arguments not JSON",
            "POST",
            r,
            j(create(json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{oops"}]), json!({}))),
            400,
            "input[0].arguments",
            "JSON object",
        ),
        (
            "a function_call_output answering no call",
            "POST",
            r,
            j(create(json!([{"type": "function_call_output", "call_id": "c9", "output": "x"}]), json!({}))),
            400,
            "input",
            "no tool call found for function call output with call_id 'c9'",
        ),
        (
            "a function_call without its output",
            "POST",
            r,
            j(create(
                json!([{"type": "message", "role": "user", "content": "x"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]),
                json!({}),
            )),
            400,
            "input",
            "no tool output found for function call c1",
        ),
        (
            "two function_calls of one turn with one call_id",
            "POST",
            r,
            j(create(
                json!([{"type": "message", "role": "user", "content": "x"},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                {"type": "function_call", "call_id": "c1", "name": "g", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "x"},
                {"type": "function_call_output", "call_id": "c1", "output": "y"}]),
                json!({}),
            )),
            400,
            "input",
            "Duplicate 'call_id': c1",
        ),
        (
            "a function_call_output without output",
            "POST",
            r,
            j(create(json!([{"type": "function_call_output", "call_id": "c"}]), json!({}))),
            400,
            "input[0].output",
            "output",
        ),
        (
            "instructions a number",
            "POST",
            r,
            j(create(json!("x"), json!({"instructions": 5}))),
            400,
            "instructions",
            "string",
        ),
        (
            "max_output_tokens zero",
            "POST",
            r,
            j(create(json!("x"), json!({"max_output_tokens": 0}))),
            400,
            "max_output_tokens",
            "max_output_tokens",
        ),
        (
            "max_output_tokens a string",
            "POST",
            r,
            j(create(json!("x"), json!({"max_output_tokens": "many"}))),
            400,
            "max_output_tokens",
            "integer",
        ),
        (
            "max_output_tokens past the context",
            "POST",
            r,
            j(create(json!("x"), json!({"max_output_tokens": 100_000_000}))),
            400,
            "input",
            "context length",
        ),
        (
            "temperature negative",
            "POST",
            r,
            j(create(json!("x"), json!({"temperature": -1}))),
            400,
            "temperature",
            "temperature",
        ),
        ("top_p above one", "POST", r, j(create(json!("x"), json!({"top_p": 2}))), 400, "top_p", "top_p"),
        ("stream not a bool", "POST", r, j(create(json!("x"), json!({"stream": 1}))), 400, "stream", "stream"),
        ("store not a bool", "POST", r, j(create(json!("x"), json!({"store": "no"}))), 400, "store", "store"),
        (
            "metadata with a number",
            "POST",
            r,
            j(create(json!("x"), json!({"metadata": {"k": 1}}))),
            400,
            "metadata",
            "strings",
        ),
        (
            "a chat-shaped tool",
            "POST",
            r,
            j(create(json!("x"), json!({"tools": [{"type": "function", "function": {"name": "f"}}]}))),
            400,
            "tools[0].name",
            "name",
        ),
        (
            "a web_search tool",
            "POST",
            r,
            j(create(json!("x"), json!({"tools": [{"type": "web_search"}]}))),
            400,
            "tools[0].type",
            "not supported",
        ),
        (
            "parameters not an object schema",
            "POST",
            r,
            j(create(
                json!("x"),
                json!({"tools": [{"type": "function", "name": "f", "parameters": {"type": "array"}}]}),
            )),
            400,
            "tools[0].parameters",
            "object",
        ),
        (
            "tool_choice naming no tool",
            "POST",
            r,
            j(create(json!("x"), json!({"tools": [weather], "tool_choice": {"type": "function", "name": "nope"}}))),
            400,
            "tool_choice",
            "not in tools",
        ),
        (
            "tool_choice of another type",
            "POST",
            r,
            j(create(json!("x"), json!({"tools": [weather], "tool_choice": {"type": "file_search"}}))),
            400,
            "tool_choice.type",
            "not supported",
        ),
        (
            "parallel_tool_calls a string",
            "POST",
            r,
            j(create(json!("x"), json!({"tools": [weather], "parallel_tool_calls": "yes"}))),
            400,
            "parallel_tool_calls",
            "boolean",
        ),
        (
            "text.format of an unknown type",
            "POST",
            r,
            j(create(json!("x"), json!({"text": {"format": {"type": "xml"}}}))),
            400,
            "text.format.type",
            "unknown",
        ),
        (
            "a json_schema format without a name",
            "POST",
            r,
            j(create(json!("x"), json!({"text": {"format": {"type": "json_schema", "schema": {}}}}))),
            400,
            "text.format.name",
            "name",
        ),
        (
            "a format with required tool calls",
            "POST",
            r,
            j(create(
                json!("x"),
                json!({"tools": [weather], "tool_choice": "required", "text": {"format": {"type": "json_object"}}}),
            )),
            400,
            "text.format",
            "cannot be combined",
        ),
        (
            "background",
            "POST",
            r,
            j(create(json!("x"), json!({"background": true}))),
            400,
            "background",
            "not supported",
        ),
        (
            "previous_response_id a number",
            "POST",
            r,
            j(create(json!("x"), json!({"previous_response_id": 7}))),
            400,
            "previous_response_id",
            "string",
        ),
        (
            "an unknown previous_response_id",
            "POST",
            r,
            j(create(json!("x"), json!({"previous_response_id": "resp_nope"}))),
            400,
            "previous_response_id",
            "not found",
        ),
        (
            "a prompt past the context",
            "POST",
            r,
            j(create(json!(long), json!({}))),
            400,
            "input",
            "maximum context length",
        ),
        ("a body over the limit", "POST", r, big.into_bytes(), 413, "", "limit"),
        ("GET an unknown id", "GET", unknown, Vec::new(), 404, "", "no response found"),
        ("DELETE an unknown id", "DELETE", unknown, Vec::new(), 404, "", "no response found"),
        ("GET an id of garbage", "GET", "/v1/responses/%00%ff..", Vec::new(), 404, "", "no response found"),
        ("a wrong method", "PUT", unknown, Vec::new(), 405, "", "method not allowed"),
    ];
    assert!(cases.len() >= 15, "the corpus has {} cases", cases.len());
    for (name, method, path, body, status, param, needle) in &cases {
        let resp = s.request(method, path, &[("Content-Type", "application/json")], body);
        assert_eq!(resp.status, *status, "{name}: {}", resp.text());
        let v = resp.json();
        let e = &v["error"];
        assert!(e["message"].is_string() && e["type"].is_string(), "{name}: not an OpenAI error body: {v}");
        if !param.is_empty() {
            assert_eq!(e["param"], *param, "{name}: {v}");
        }
        let msg = e["message"].as_str().unwrap();
        assert!(msg.to_lowercase().contains(&needle.to_lowercase()), "{name}: message {msg:?} lacks {needle:?}");
        assert_good(&s);
    }
    let r = s.post(RESPONSES, &create(json!("x"), json!({"previous_response_id": "resp_nope"})));
    assert_eq!(r.json()["error"]["code"], "previous_response_not_found");
    // The stored response outlived all of that, and unknown fields are ignored.
    assert_eq!(s.request("GET", &format!("{RESPONSES}/{stored}"), &[], b"").status, 200);
    let r = s.post(RESPONSES, &create(json!("Hi"), json!({"frobnicate": true, "previous_response_id": stored})));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn the_response_store_keeps_what_fits_its_cap_and_forgets_the_oldest() {
    // 8 KiB hold a few short responses (each keeps its body and its conversation).
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--responses-store", "0.0078125"]);
    let ids: Vec<String> = (0..12)
        .map(|i| {
            s.post(RESPONSES, &create(json!(format!("Question {i}")), json!({}))).json()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let found: Vec<bool> =
        ids.iter().map(|id| s.request("GET", &format!("{RESPONSES}/{id}"), &[], b"").status == 200).collect();
    assert!(!found[0], "the oldest response was evicted: {found:?}");
    assert!(found[11], "the newest response is kept: {found:?}");
    let kept = found.iter().filter(|f| **f).count();
    assert!((2..12).contains(&kept), "some fit and some did not: {found:?}");
    let first_kept = found.iter().position(|f| *f).unwrap();
    assert!(found[first_kept..].iter().all(|f| *f), "eviction is oldest first: {found:?}");
    // A response larger than the whole store is answered but not kept.
    let huge = create(json!("yesterday ".repeat(1000)), json!({}));
    let v = s.post(RESPONSES, &huge).json();
    assert_eq!(v["status"], "incomplete");
    let r = s.request("GET", &format!("{RESPONSES}/{}", v["id"].as_str().unwrap()), &[], b"");
    assert_eq!(r.status, 404);
}

#[test]
fn a_client_that_leaves_a_response_stream_stops_its_generation() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &[]);
    let body = create(json!("Tell me everything"), json!({"max_output_tokens": 3000, "stream": true}));
    let made = s.abandon_stream(RESPONSES, &body, 6);
    assert!(made < 3000, "generation ran to the end ({made} tokens)");
    assert_good(&s);
}
