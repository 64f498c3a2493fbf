//! `host serve --isolate`: the engine runs in a child process. Killing that
//! process in the middle of several requests ends each stream with a clear
//! error event and a non-streaming request with a 5xx JSON error; the API
//! stays up, /health and /metrics report the restart, and the next engine
//! process answers the same greedy request with the same text as before.

use it::{model, signal, Server};
use serde_json::{json, Value};

const SIGKILL: i32 = 9;

fn body(stream: bool) -> Value {
    json!({
        "prompt": "The numbers from one to fifty, in words: one, two, three,",
        "max_tokens": 40,
        "temperature": 0,
        "stream": stream,
    })
}

/// The text of an SSE completion stream, and its error event's message.
fn read_stream(raw: &str) -> (String, Option<String>) {
    let (mut text, mut error) = (String::new(), None);
    for data in raw.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
        if let Some(m) = v["error"]["message"].as_str() {
            error = Some(m.to_owned());
        } else {
            text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
        }
    }
    (text, error)
}

fn engine_pid(s: &Server) -> u32 {
    let h = s.request("GET", "/health", &[], b"").json();
    h["engine"]["pid"].as_u64().unwrap_or_else(|| panic!("/health names no engine process: {h}")) as u32
}

/// Polls /health until an engine process other than `gone` serves (fails after 120 s).
fn wait_until_serving(s: &Server, gone: u32) -> Value {
    let t = std::time::Instant::now();
    loop {
        let r = s.request("GET", "/health", &[], b"");
        if r.status == 200 && r.json()["engine"]["pid"].as_u64().is_some_and(|p| p != gone as u64) {
            return r.json();
        }
        if r.status == 200 {
            std::thread::sleep(std::time::Duration::from_millis(20));
            continue;
        }
        assert_eq!(r.status, 503, "/health while restarting: {}", r.text());
        assert_eq!(r.json()["status"], "restarting");
        assert!(t.elapsed().as_secs() < 120, "the engine did not come back: {}", r.text());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_killed_engine_process_fails_its_requests_clearly_and_a_new_one_serves_the_next() {
    let s = Server::start(&model("smollm2-135m-instruct"), &["--isolate", "--debug-endpoints", "--batch", "4"]);
    let first_pid = engine_pid(&s);
    let before = s.post("/v1/completions", &body(false)).json();
    let expected = before["choices"][0]["text"].as_str().unwrap().to_owned();
    assert!(!expected.is_empty(), "{before}");

    s.hold();
    let (streams, plain) = std::thread::scope(|sc| {
        let streams: Vec<_> = (0..2).map(|_| sc.spawn(|| s.post("/v1/completions", &body(true)))).collect::<Vec<_>>();
        let plain = sc.spawn(|| s.post("/v1/completions", &body(false)));
        s.wait_for("three requests queued", |st| st["queued"] == 3);
        let r = s.request("POST", "/debug/release?steps=4", &[], b"");
        assert_eq!(r.status, 200, "{}", r.text());
        s.wait_for("three rows mid-generation, held", |st| {
            st["active"] == 3 && st["queued"] == 0 && st["hold"]["parked"] == true
        });
        assert!(signal(first_pid, SIGKILL), "kill {first_pid}");
        let streams: Vec<_> = streams.into_iter().map(|h| h.join().unwrap()).collect();
        (streams, plain.join().unwrap())
    });
    for r in &streams {
        assert_eq!(r.status, 200);
        let raw = r.text();
        let (text, error) = read_stream(&raw);
        assert!(!text.is_empty(), "tokens came before the engine died: {raw}");
        assert!(expected.starts_with(&text), "what came before the death is the greedy text: {text:?} vs {expected:?}");
        let error = error.unwrap_or_else(|| panic!("the stream ends with an error event: {raw}"));
        assert!(error.contains("killed by signal 9"), "{error}");
        assert!(raw.trim_end().ends_with("data: [DONE]"), "{raw}");
    }
    assert_eq!(plain.status, 500, "{}", plain.text());
    let e = plain.json();
    assert_eq!(e["error"]["type"], "server_error", "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("killed by signal 9"), "{e}");

    let h = wait_until_serving(&s, first_pid);
    assert_eq!(h["engine"]["restarts"], 1, "{h}");
    assert_eq!(h["engine"]["last_exit"], "was killed by signal 9", "{h}");
    let metrics = s.request("GET", "/metrics", &[], b"").text();
    assert!(metrics.contains("mlx_engine_engine_restarts_total 1"), "{metrics}");
    assert!(metrics.contains("mlx_engine_engine_up 1"), "{metrics}");

    let after = s.post("/v1/completions", &body(false)).json();
    assert_eq!(after["choices"][0]["text"], expected.as_str(), "{after}");
    let st = s.wait_for("the new engine idle", |st| st["engine_idle"] == true);
    assert_eq!(st["active"], 0, "{st}");
}

#[test]
fn engine_processes_that_keep_dying_are_restarted_with_a_growing_back_off() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--isolate"]);
    for (round, backoff) in [(1u64, 0.0), (2, 0.25), (3, 0.5)] {
        let pid = engine_pid(&s);
        assert!(signal(pid, SIGKILL));
        // Each child lived well under a minute: the failures count up.
        let h = wait_until_serving(&s, pid);
        assert_eq!(h["engine"]["restarts"], round, "{h}");
        assert_eq!(h["engine"]["consecutive_failures"], round, "{h}");
        assert_eq!(h["engine"]["last_backoff_s"], backoff, "{h}");
    }
    let r = s.post("/v1/completions", &json!({"prompt": "hello", "max_tokens": 3, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.text());
}
