//! Tool calling end to end: `tests/http/tools_check.py` drives a live
//! server with the openai SDK: calls under a grammar validated against
//! their schemas, streamed calls, a round trip whose prompt matches
//! transformers' rendering token for token, `auto` parsing of the model's
//! own syntax, and 400s for bad tool requests.

use it::{model, python, run_ok, Server};
use std::path::PathBuf;

/// tiny-llama-f32 with a chat template that speaks the Hermes
/// `<tool_call>` syntax (as Qwen 2.5 and Qwen 3 templates do).
fn hermes_folder() -> PathBuf {
    let src = model("tiny/tiny-llama-f32");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tools-it/tiny-llama-hermes");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::os::unix::fs::symlink(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    // chat_template.jinja wins over tokenizer_config.json's template, here
    // and in transformers.
    std::fs::copy(it::repo_root().join("tests/http/templates/hermes_tools.jinja"), dir.join("chat_template.jinja"))
        .unwrap();
    dir
}

fn tools_check(dir: &std::path::Path, syntax: &str, serve: &[&str]) {
    let s = Server::start(dir, serve);
    let script = it::repo_root().join("tests/http/tools_check.py");
    let out = run_ok(python().arg(script).arg(s.base_url()).arg(dir).arg(syntax));
    assert!(out.contains("ALL OK"), "{out}");
}

#[test]
fn tool_calls_with_a_hermes_template() {
    tools_check(&hermes_folder(), "hermes", &[]);
}

#[test]
fn tool_calls_with_a_template_without_tool_syntax() {
    tools_check(&model("tiny/tiny-llama-f32"), "none", &[]);
}
