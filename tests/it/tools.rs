//! Tool calling end to end: `tests/http/tools_check.py` drives a live
//! server with the openai SDK: calls under a grammar validated against
//! their schemas, streamed calls, a round trip whose prompt matches
//! transformers' rendering token for token, `auto` parsing of the model's
//! own syntax, and 400s for bad tool requests.

use it::{hermes_folder, model, python, run_ok, Server};
use serde_json::Value;

fn tools_check(dir: &std::path::Path, syntax: &str, serve: &[&str]) {
    let s = Server::start(dir, serve);
    let script = it::repo_root().join("tests/http/tools_check.py");
    let out = run_ok(python().arg(script).arg(s.base_url()).arg(dir).arg(syntax));
    assert!(out.contains("ALL OK"), "{out}");
}

#[test]
fn tool_calls_with_a_hermes_template() {
    tools_check(&hermes_folder("tools-it"), "hermes", &[]);
}

#[test]
fn tool_calls_with_a_template_without_tool_syntax() {
    tools_check(&model("tiny/tiny-llama-f32"), "none", &[]);
}

/// The default model's template has no tool syntax and fails on an
/// assistant turn without text: a tool round trip (an assistant turn of
/// calls only, then the result; `tool_choice` none, as `auto` cannot be
/// parsed for such a model) is answered, in chat and in Messages, and its
/// prompt is the same conversation with the call as the turn's text.
#[test]
fn a_tool_round_trip_works_on_a_template_without_tool_syntax() {
    use serde_json::json;
    let s = Server::start(&model("smollm2-135m-instruct"), &[]);
    let tools = json!([{ "type": "function", "function": { "name": "get_weather",
        "parameters": { "type": "object", "properties": { "city": { "type": "string" } } } } }]);
    let user = json!({ "role": "user", "content": "Weather in Paris?" });
    let chat = |messages: Value| {
        let r = s.post(
            "/v1/chat/completions",
            &json!({ "messages": messages, "tools": tools, "tool_choice": "none", "max_tokens": 2, "temperature": 0 }),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let calls =
        chat(json!([user, { "role": "assistant", "content": null, "tool_calls": [{ "id": "c1", "type": "function",
        "function": { "name": "get_weather", "arguments": "{\"city\": \"Paris\"}" } }] },
        { "role": "tool", "tool_call_id": "c1", "content": "sunny" }]));
    // A tool result must answer a call, so the text-only turn is followed by
    // the result as a user turn: `tool` and `user` are one token each in
    // this vocabulary, so the counts match only if the call is the text.
    let as_text = chat(
        json!([user, { "role": "assistant", "content": "{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Paris\"}}" },
        { "role": "user", "content": "sunny" }]),
    );
    assert_eq!(calls, as_text, "the past call is not the assistant's text");
    let r = s.post(
        "/v1/messages",
        &json!({ "model": "m", "max_tokens": 2, "tool_choice": { "type": "none" },
                 "tools": [{ "name": "get_weather", "input_schema": { "type": "object" } }],
                 "messages": [{ "role": "user", "content": "Weather in Paris?" },
                              { "role": "assistant", "content": [{ "type": "tool_use", "id": "t1", "name": "get_weather", "input": { "city": "Paris" } }] },
                              { "role": "user", "content": [{ "type": "tool_result", "tool_use_id": "t1", "content": "sunny" }] }] }),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}
