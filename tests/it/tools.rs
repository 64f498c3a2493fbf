//! Tool calling end to end: `tests/http/tools_check.py` drives a live
//! server with the openai SDK: calls under a grammar validated against
//! their schemas, streamed calls, a round trip whose prompt matches
//! transformers' rendering token for token, `auto` parsing of the model's
//! own syntax, and 400s for bad tool requests.

use it::{hermes_folder, model, python, run_ok, Server};

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
