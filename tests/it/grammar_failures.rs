//! Grammars that cannot work: one that no text matches is refused when the
//! request arrives (400 naming its parameter, in each API's error shape,
//! streamed or not); one that fails part-way (a parser limit it runs into)
//! ends its own row with a 400, serial or batched, while the rows beside
//! it answer what they answer alone.

use it::{model, Server};
use serde_json::{json, Value};

fn chat(extra: Value) -> Value {
    let mut b = json!({ "messages": [{ "role": "user", "content": "Hi" }], "max_tokens": 8 });
    b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    b
}

/// A schema whose only definition is itself.
fn self_loop() -> Value {
    json!({ "$ref": "#/$defs/a", "$defs": { "a": { "$ref": "#/$defs/a" } } })
}

/// A regex the lexer gives up on after its first mask (too many expressions).
const TOO_COMPLEX: &str = "a{1000}{1000}";

fn assert_clean(message: &str) {
    assert!(!message.contains("<state>"), "llguidance's parser state reached the client: {message}");
}

#[test]
fn grammars_that_match_nothing_are_refused_when_the_request_arrives() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &[]);
    let schema = json!({ "type": "json_schema", "json_schema": { "name": "x", "schema": self_loop() } });
    let cases = [
        ("response_format", chat(json!({ "response_format": schema }))),
        ("guided_regex", chat(json!({ "guided_regex": "[^\\s\\S]" }))),
        ("guided_grammar", chat(json!({ "guided_grammar": "start: x\nx: x \"a\"" }))),
        ("response_format", chat(json!({ "response_format": schema, "stream": true }))),
    ];
    for (param, body) in &cases {
        let r = s.post("/v1/chat/completions", body);
        assert_eq!(r.status, 400, "{param}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["param"], *param, "{e}");
        let message = e["message"].as_str().unwrap();
        assert!(message.contains("the grammar is refused"), "{message}");
        assert_clean(message);
    }
    let r = s.post(
        "/v1/messages",
        &json!({ "model": "m", "max_tokens": 8, "messages": [{ "role": "user", "content": "Hi" }],
                 "output_config": { "format": { "type": "json_schema", "schema": self_loop() } } }),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (v["type"].as_str(), v["error"]["type"].as_str()),
        (Some("error"), Some("invalid_request_error")),
        "{v}"
    );
    assert_clean(v["error"]["message"].as_str().unwrap());
    assert_eq!(s.stats()["failed"], 0, "a refused request reached the engine");
}

/// A completion under the grammar that fails part-way.
fn failing(stream: bool) -> Value {
    json!({ "prompt": "Hi", "max_tokens": 8, "guided_regex": TOO_COMPLEX, "stream": stream })
}

fn assert_grammar_error(v: &Value) {
    let message = v["error"]["message"].as_str().unwrap_or_else(|| panic!("not an error: {v}"));
    assert!(message.contains("grammar failed during generation"), "{message}");
    assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    assert_clean(message);
}

#[test]
fn a_grammar_that_fails_part_way_fails_its_own_row_only() {
    let m = model("tiny/tiny-llama-f32");
    let good = json!({ "prompt": [5, 6, 7], "max_tokens": 16, "temperature": 0 });
    let alone = {
        let s = Server::start(&m, &["--batch", "1"]);
        let r = s.post("/v1/completions", &failing(false));
        assert_eq!(r.status, 400, "serial: {}", r.text());
        assert_grammar_error(&r.json());
        s.post("/v1/completions", &good).json()
    };
    let s = Server::start(&m, &["--batch", "8", "--debug-endpoints"]);
    let got = s.post_burst("/v1/completions", &[good.clone(), failing(false), good.clone()]);
    let st = s.stats();
    assert!(st["max_batch_rows"].as_u64().unwrap() >= 3, "the rows never shared a step: {st}");
    assert_grammar_error(&got[1]);
    for g in [&got[0], &got[2]] {
        assert_eq!(g["choices"][0]["text"], alone["choices"][0]["text"], "a neighbour's grammar changed this row");
    }
    assert_eq!((st["failed"].as_u64(), st["completed"].as_u64()), (Some(1), Some(2)), "{st}");
    // Streamed, together: each starts 200; the failing row's stream ends
    // with the error event (no `stop`), the other's with its text.
    let mut good_stream = good.clone();
    good_stream["stream"] = json!(true);
    let [bad, ok] = s.burst("/v1/completions", &[failing(true), good_stream]).try_into().unwrap();
    assert_eq!((bad.status, ok.status), (200, 200));
    let bad = events(&bad.text());
    assert_grammar_error(bad.last().expect("an event"));
    assert!(bad.iter().all(|e| e["choices"][0]["finish_reason"] != "stop"), "{bad:?}");
    let ok = events(&ok.text());
    let text: String = ok.iter().filter_map(|e| e["choices"][0]["text"].as_str()).collect();
    assert_eq!(text, alone["choices"][0]["text"].as_str().unwrap(), "{ok:?}");
    assert_eq!(s.post("/v1/completions", &good).json()["choices"][0]["text"], alone["choices"][0]["text"]);
}

/// A stream's `data:` events, `[DONE]` left out.
fn events(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}
