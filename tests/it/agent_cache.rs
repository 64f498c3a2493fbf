//! Prefix-cache hits in agent loops: four recorded coding-agent sessions
//! (tests/fixtures/agent-traces: Claude Code, Codex, OpenCode and Cline
//! shapes over Messages, Responses and chat; long system prompts, tool
//! calls, reasoning in every turn) replayed through the server by
//! tests/bench/agent_replay.py, which reads each request's cached tokens
//! from the usage fields. With each trace's `--system-prompt-rule`s and
//! `--preserve-thinking`, at least 90% of the warm turns' prompt tokens
//! come from the cache; without them, per-request noise at the top of the
//! system prompt leaves the cache nothing to serve, and the template's
//! dropping of past reasoning costs the turn after a new user message.
//! What the cache served is checked against a server that computed every
//! prompt afresh (`--prompt-cache 0`): each request's greedy answer is the
//! same, so the reported reuse was state that belonged to the prompt.

use it::{python, repo_root, run_ok, thinking_folder, with_context, Server};
use serde_json::Value;
use std::path::PathBuf;

const TRACES: [&str; 4] = ["claude-code", "codex", "opencode", "cline"];

fn trace(name: &str) -> PathBuf {
    repo_root().join("tests/fixtures/agent-traces").join(format!("{name}.json"))
}

/// Greedy tokens of each replayed request: enough for a wrong reused state
/// to show in the answer.
const ANSWER_TOKENS: &str = "4";

/// Requests (0-based) also computed afresh: the first warm one, the one
/// after the second user message, and the last (each afresh costs a whole
/// prefill).
const CHECKED: [usize; 3] = [1, 9, 12];

/// Replays the traces (at most `turns` requests each, or only the requests
/// `only` names); the RESULT line.
fn replay(s: &Server, names: &[&str], turns: Option<usize>, only: Option<&[usize]>) -> Value {
    let mut cmd = python();
    cmd.arg(repo_root().join("tests/bench/agent_replay.py")).arg(format!("http://127.0.0.1:{}", s.port));
    for n in names {
        cmd.arg(trace(n));
    }
    if let Some(t) = turns {
        cmd.args(["--turns", &t.to_string()]);
    }
    cmd.args(["--max-tokens", ANSWER_TOKENS]);
    if let Some(ks) = only {
        cmd.arg("--only").arg(ks.iter().map(usize::to_string).collect::<Vec<_>>().join(","));
    }
    let out = run_ok(&mut cmd);
    let line = out.lines().find_map(|l| l.strip_prefix("RESULT ")).unwrap_or_else(|| panic!("no RESULT: {out}"));
    serde_json::from_str(line).unwrap()
}

/// The reasoning model with room for the traces' prompts.
fn model(tag: &str) -> PathBuf {
    let dir = thinking_folder(tag);
    with_context(&dir, 32768);
    dir
}

/// Request `k`'s (0-based) share of its prompt served from the cache.
fn hit(result: &Value, k: usize) -> f64 {
    let r = &result["requests"][k];
    r[1].as_f64().unwrap() / r[0].as_f64().unwrap()
}

#[test]
fn agent_sessions_are_served_from_the_prefix_cache_with_the_rules() {
    let mut args: Vec<String> = vec!["--preserve-thinking".into()];
    for name in TRACES {
        let t: Value = serde_json::from_str(&std::fs::read_to_string(trace(name)).unwrap()).unwrap();
        for rule in t["rules"].as_array().unwrap() {
            args.extend(["--system-prompt-rule".into(), rule.as_str().unwrap().into()]);
        }
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let s = Server::start(&model("agent-cache-rules"), &args);
    let result = replay(&s, &TRACES, None, None);
    drop(s);
    let cold = Server::start(&model("agent-cache-cold"), &[args.as_slice(), &["--prompt-cache", "0"]].concat());
    let fresh = replay(&cold, &TRACES, None, Some(&CHECKED));
    for name in TRACES {
        let r = &result[name];
        assert!(r["requests"].as_array().unwrap().len() >= 10, "{name}: at least 10 requests");
        let rate = r["warm_hit_rate"].as_f64().unwrap();
        assert!(rate >= 0.90, "{name}: {rate:.3} of the warm turns' prompt tokens from the cache: {r}");
        // The request after the second user message keeps its past reasoning.
        let after_user = 9;
        assert!(hit(r, after_user) >= 0.9, "{name}: request {} reused its prefix: {r}", after_user + 1);
        let f = &fresh[name];
        let (answers, fresh_answers) = (r["answers"].as_array().unwrap(), f["answers"].as_array().unwrap());
        for (j, &k) in CHECKED.iter().enumerate() {
            assert_eq!(
                f["requests"][j],
                serde_json::json!([r["requests"][k][0], 0]),
                "{name}: request {} afresh",
                k + 1
            );
            assert_eq!(answers[k], fresh_answers[j], "{name}: request {} answered otherwise from the cache", k + 1);
        }
    }
}

#[test]
fn without_the_rules_noise_and_dropped_reasoning_cost_the_cache() {
    let s = Server::start(&model("agent-cache-plain"), &[]);
    // Noise at the top of the system prompt: nothing past its first tokens is reused.
    let noisy = replay(&s, &["claude-code", "cline"], Some(3), None);
    for name in ["claude-code", "cline"] {
        let rate = noisy[name]["warm_hit_rate"].as_f64().unwrap();
        assert!(rate < 0.05, "{name}: {rate:.3} served from the cache despite per-request noise: {}", noisy[name]);
    }
    // A new user message: the template drops the reasoning of every turn
    // before it, so the prompt parts from the cached one after the first
    // user message.
    let plain = replay(&s, &["opencode"], None, None);
    assert!(hit(&plain["opencode"], 9) < 0.7, "request 10 of opencode: {}", plain["opencode"]);
}
