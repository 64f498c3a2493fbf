//! Reasoning output end to end: `tests/http/reasoning_check.py` drives a
//! live server with the openai and anthropic SDKs and checks chat's
//! `reasoning_content`, Anthropic's thinking blocks and Responses'
//! reasoning items against transformers' rendering and the raw completion
//! of the same prompt; here, the server's defaults (`--thinking`,
//! `--preserve-thinking`), bad reasoning fields answered in each API's
//! shape, and a model whose template has no reasoning block.

use it::{model, python, run_ok, thinking_folder, Server, END_THINK_ID};
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

fn chat(messages: Value, extra: Value) -> Value {
    let mut v = json!({ "messages": messages, "max_tokens": 2, "temperature": 0 });
    for (k, x) in extra.as_object().unwrap() {
        v[k] = x.clone();
    }
    v
}

fn question() -> Value {
    json!([{ "role": "user", "content": "What is 2 + 2?" }])
}

fn history() -> Value {
    json!([
        { "role": "user", "content": "What is 2 + 2?" },
        { "role": "assistant", "content": "Four.", "reasoning_content": "Two and two." },
        { "role": "user", "content": "And 3 + 3?" }
    ])
}

/// (prompt tokens, the message) of a chat answer.
fn ask(s: &Server, body: &Value) -> (u64, Value) {
    let r = s.post(CHAT, body);
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    (v["usage"]["prompt_tokens"].as_u64().unwrap(), v["choices"][0]["message"].clone())
}

#[test]
fn the_sdks_get_reasoning_apart_from_answers() {
    let dir = thinking_folder("reasoning-sdk");
    let s = Server::start(&dir, &[]);
    let script = it::repo_root().join("tests/http/reasoning_check.py");
    let out = run_ok(
        python().arg(script).arg(format!("http://127.0.0.1:{}", s.port)).arg(&dir).arg(END_THINK_ID.to_string()),
    );
    assert!(out.contains("ALL OK"), "{out}");
}

#[test]
fn the_server_flags_set_what_requests_leave_unset() {
    let dir = thinking_folder("reasoning-flags");
    let plain = Server::start(&dir, &[]);
    let on = ask(&plain, &chat(question(), json!({})));
    let off = ask(&plain, &chat(question(), json!({ "chat_template_kwargs": { "enable_thinking": false } })));
    assert!(off.0 > on.0, "the template closes an empty block when thinking is off: {off:?} {on:?}");
    assert!(on.1.get("reasoning_content").is_some() && off.1.get("reasoning_content").is_none());
    // (With thinking off, as the server below renders by default.)
    let kwargs =
        |preserve: bool| json!({ "chat_template_kwargs": { "enable_thinking": false, "preserve_thinking": preserve } });
    let kept = ask(&plain, &chat(history(), kwargs(true))).0;
    let dropped = ask(&plain, &chat(history(), kwargs(false))).0;
    assert!(kept > dropped, "preserve_thinking keeps the past reasoning");
    drop(plain);

    let s = Server::start(&dir, &["--thinking", "off", "--preserve-thinking"]);
    assert_eq!(ask(&s, &chat(question(), json!({}))), off, "--thinking off: the request is rendered with thinking off");
    assert_eq!(
        ask(&s, &chat(question(), json!({ "reasoning_effort": "low" }))).0,
        on.0,
        "a request's reasoning_effort wins over the server's default"
    );
    assert_eq!(
        ask(&s, &chat(question(), json!({ "chat_template_kwargs": { "enable_thinking": true } }))).0,
        on.0,
        "and its chat_template_kwargs too"
    );
    assert_eq!(ask(&s, &chat(history(), json!({}))).0, kept, "--preserve-thinking keeps past reasoning");
    let explicit = json!({ "chat_template_kwargs": { "preserve_thinking": false } });
    assert_eq!(ask(&s, &chat(history(), explicit)).0, dropped, "unless the request says otherwise");
    let m = s.post("/v1/messages", &json!({ "model": "m", "max_tokens": 2, "messages": question() })).json();
    assert_eq!(m["content"][0]["type"], "text", "Anthropic requests follow the default too: {m}");
    let r = s.post("/v1/responses", &json!({ "input": "What is 2 + 2?", "max_output_tokens": 2 })).json();
    assert_eq!(r["output"][0]["type"], "message", "and Responses requests: {r}");
}

#[test]
fn a_template_without_a_reasoning_block_ignores_the_switches() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--thinking", "on"]);
    let (base, m) = ask(&s, &chat(question(), json!({})));
    for extra in [
        json!({ "reasoning_effort": "none" }),
        json!({ "reasoning_effort": "high" }),
        json!({ "chat_template_kwargs": { "enable_thinking": false } }),
    ] {
        let (n, m2) = ask(&s, &chat(question(), extra.clone()));
        assert_eq!((n, &m2), (base, &m), "{extra}: the same prompt and answer");
    }
    assert!(m.get("reasoning_content").is_none(), "nothing is taken for reasoning: {m}");
    let body = json!({ "model": "m", "max_tokens": 1100, "messages": question(),
        "thinking": { "type": "enabled", "budget_tokens": 1024 }, "temperature": 0 });
    let r = s.post("/v1/messages", &body).json();
    assert!(r["content"].as_array().unwrap().iter().all(|b| b["type"] != "thinking"), "no thinking block: {r}");
}

#[test]
fn bad_reasoning_fields_are_refused_in_each_apis_shape() {
    let s = Server::start(&thinking_folder("reasoning-bad"), &[]);
    let msg = |extra: Value| {
        let mut v = json!({ "model": "m", "max_tokens": 2000, "messages": question() });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let resp = |extra: Value| {
        let mut v = json!({ "input": "hi", "max_output_tokens": 2 });
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let thought = |thinking: Value| {
        json!([
            { "role": "user", "content": "hi" },
            { "role": "assistant", "content": [{ "type": "thinking", "thinking": thinking, "signature": "s" }] },
            { "role": "user", "content": "again" }
        ])
    };
    // (what, path, body, the parameter the error names; for Anthropic's
    // shape, which names none, a phrase its message holds)
    let cases: Vec<(&str, &str, Value, &str)> = vec![
        ("an unknown effort", CHAT, chat(question(), json!({ "reasoning_effort": "extreme" })), "reasoning_effort"),
        ("an effort not a string", CHAT, chat(question(), json!({ "reasoning_effort": 3 })), "reasoning_effort"),
        (
            "reasoning_content not a string",
            CHAT,
            chat(
                json!([{ "role": "user", "content": "a" }, { "role": "assistant", "content": "b", "reasoning_content": 7 }, { "role": "user", "content": "c" }]),
                json!({}),
            ),
            "messages[1].reasoning_content",
        ),
        ("thinking not an object", "/v1/messages", msg(json!({ "thinking": "on" })), "thinking"),
        ("an unknown thinking type", "/v1/messages", msg(json!({ "thinking": { "type": "maybe" } })), "thinking.type"),
        (
            "enabled without a budget",
            "/v1/messages",
            msg(json!({ "thinking": { "type": "enabled" } })),
            "thinking.budget_tokens",
        ),
        (
            "a budget not under max_tokens",
            "/v1/messages",
            msg(json!({ "thinking": { "type": "enabled", "budget_tokens": 2000 } })),
            "thinking.budget_tokens",
        ),
        (
            "a thinking block's text not a string",
            "/v1/messages",
            msg(json!({ "messages": thought(json!(5)) })),
            "`thinking` must be a string",
        ),
        (
            "a thinking block in a user turn",
            "/v1/messages",
            msg(json!({ "messages": [{ "role": "user", "content": [{ "type": "thinking", "thinking": "x" }] }] })),
            "cannot appear in a user message",
        ),
        ("reasoning not an object", "/v1/responses", resp(json!({ "reasoning": "high" })), "reasoning"),
        (
            "an unknown reasoning.effort",
            "/v1/responses",
            resp(json!({ "reasoning": { "effort": "max" } })),
            "reasoning.effort",
        ),
        (
            "a reasoning item whose content is not a list",
            "/v1/responses",
            resp(json!({ "input": [{ "type": "reasoning", "id": "rs_1", "summary": [], "content": "x" }] })),
            "input[0].content",
        ),
        (
            "a reasoning item with a part of another type",
            "/v1/responses",
            resp(
                json!({ "input": [{ "type": "reasoning", "id": "rs_1", "summary": [], "content": [{ "type": "output_text", "text": "x" }] }] }),
            ),
            "input[0].content[0].type",
        ),
        (
            "a reasoning_text part without text",
            "/v1/responses",
            resp(
                json!({ "input": [{ "type": "reasoning", "id": "rs_1", "summary": [], "content": [{ "type": "reasoning_text" }] }] }),
            ),
            "input[0].content[0].text",
        ),
        ("include not a list", "/v1/responses", resp(json!({ "include": "reasoning.encrypted_content" })), "include"),
        (
            "encrypted_content not a string",
            "/v1/responses",
            resp(json!({ "input": [{ "type": "reasoning", "summary": [], "encrypted_content": 7 }] })),
            "input[0].encrypted_content",
        ),
        (
            "a reasoning item whose summary is not a list",
            "/v1/responses",
            resp(json!({ "input": [{ "type": "reasoning", "id": "rs_1", "summary": "x" }] })),
            "input[0].summary",
        ),
    ];
    for (what, path, body, param) in cases {
        let r = s.post(path, &body);
        assert_eq!(r.status, 400, "{what}: {}", r.text());
        let v = r.json();
        if path == "/v1/messages" {
            assert_eq!(v["type"], "error", "{what}: {v}");
            assert_eq!(v["error"]["type"], "invalid_request_error", "{what}: {v}");
            assert!(v["error"]["message"].as_str().unwrap().contains(param), "{what}: {v}");
        } else {
            assert_eq!(v["error"]["param"], param, "{what}: {v}");
        }
    }
    // The server keeps serving; a good request of each kind works.
    let r = s.post(CHAT, &chat(question(), json!({ "reasoning_effort": "medium" })));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.post("/v1/messages", &msg(json!({ "thinking": { "type": "enabled", "budget_tokens": 1024 }, "max_tokens": 1100, "messages": thought(json!("fine")) })));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.post("/v1/responses", &resp(json!({ "reasoning": { "effort": "low" } })));
    assert_eq!(r.status, 200, "{}", r.text());
}
