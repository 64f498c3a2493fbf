//! Structured output end to end: `tests/http/structured_check.py` drives a
//! live server with the openai SDK and validates every constrained answer
//! with independent validators (jsonschema, re; llguidance's Python
//! matcher for answers cut by `length`), in each way a row can run:
//! batched and serial, greedy and sampled, with and without an n-gram
//! drafter, on a random-weight model and (its corpus greedy) on the
//! default model.

use it::{model, python, run_ok, Server};

fn structured_check(model_rel: &str, serve: &[&str], label: &str, concurrency: usize) {
    structured_check_with(model_rel, serve, label, concurrency, &[]);
}

fn structured_check_with(model_rel: &str, serve: &[&str], label: &str, concurrency: usize, extra: &[&str]) {
    let drafts = serve.contains(&"--speculate-always");
    let dir = model(model_rel);
    let s = Server::start(&dir, serve);
    let script = it::repo_root().join("tests/http/structured_check.py");
    let out = run_ok(
        python()
            .arg(script)
            .arg(s.base_url())
            .arg(&dir)
            .arg(label)
            .args(["--concurrency", &concurrency.to_string()])
            .args(drafts.then_some("--expect-drafts"))
            .args(extra),
    );
    assert!(out.contains("ALL OK"), "{out}");
}

#[test]
fn constrained_rows_validate_batched() {
    structured_check("tiny/tiny-llama-f32", &["--batch", "8"], "batched", 8);
}

#[test]
fn constrained_rows_validate_serial() {
    structured_check("tiny/tiny-llama-f32", &["--batch", "1"], "serial", 1);
}

#[test]
fn constrained_rows_validate_under_ngram_speculation_batched() {
    structured_check(
        "tiny/tiny-llama-f32",
        &["--batch", "8", "--draft-kind", "ngram", "--speculate-always"],
        "ngram",
        8,
    );
}

#[test]
fn constrained_rows_validate_under_ngram_speculation_serial() {
    structured_check(
        "tiny/tiny-llama-f32",
        &["--batch", "1", "--draft-kind", "ngram", "--speculate-always"],
        "ngram serial",
        1,
    );
}

#[test]
fn constrained_rows_validate_on_the_default_model() {
    // Greedy only: the sampled corpus takes the tiny models' paths.
    structured_check_with("smollm2-135m-instruct", &["--batch", "8"], "default model", 8, &["--greedy-corpus"]);
}
