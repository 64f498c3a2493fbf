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

    // The API asked the engine to hold; the new engine process holds too.
    assert_eq!(s.stats()["hold"]["held"], true);
    s.release();
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

/// Four concurrent streams (three greedy, one sampled with a seed); the
/// engine process is killed twice while they run. With
/// `--generation-checkpoint`, each stream goes on in the next engine process
/// from the tokens it had delivered: its whole text equals an uninterrupted
/// run's (a server without isolation), with no error, token lost or repeated;
/// and the resumed requests found their checkpoints on disk.
#[test]
fn generations_resume_in_a_new_engine_process_as_if_nothing_had_happened() {
    let bodies = [
        json!({"prompt": "The numbers from one to fifty, in words: one, two, three,", "max_tokens": 40, "temperature": 0}),
        json!({"prompt": "Count from 1 to 100: 1, 2, 3,", "max_tokens": 40, "temperature": 0}),
        json!({"prompt": "The alphabet in capitals: A, B, C,", "max_tokens": 40, "temperature": 0}),
        json!({"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0.9, "seed": 7}),
    ];
    let smollm = model("smollm2-135m-instruct");
    let expected: Vec<(String, u64)> = {
        let plain = Server::start(&smollm, &["--batch", "4"]);
        bodies
            .iter()
            .map(|b| {
                let r = plain.post("/v1/completions", b).json();
                (r["choices"][0]["text"].as_str().unwrap().to_owned(), r["usage"]["prompt_tokens"].as_u64().unwrap())
            })
            .collect()
    };
    let dir = it::Scratch::new("resume-ssd");
    let ssd = dir.0.to_str().unwrap();
    let s = Server::start(
        &smollm,
        &["--isolate", "--debug-endpoints", "--batch", "4", "--ssd-cache", ssd, "--generation-checkpoint", "8"],
    );
    let streamed = |b: &Value| {
        let mut b = b.clone();
        b["stream"] = json!(true);
        b
    };
    s.hold();
    let (s, streamed) = (&s, &streamed);
    let raws = std::thread::scope(|sc| {
        let hs: Vec<_> = bodies.iter().map(|b| sc.spawn(move || s.post("/v1/completions", &streamed(b)))).collect();
        s.wait_for("four requests queued", |st| st["queued"] == 4);
        for (kill, steps) in [(true, 12), (true, 10), (false, 0)] {
            if !kill {
                s.release();
                break;
            }
            let r = s.request("POST", &format!("/debug/release?steps={steps}"), &[], b"");
            assert_eq!(r.status, 200, "{}", r.text());
            // Held again mid-generation, with every checkpoint on disk.
            s.wait_for("the rows mid-generation and their checkpoints written", |st| {
                st["hold"]["parked"] == true && st["queued"] == 0 && st["ssd_cache_pending"] == 0
            });
            let pid = engine_pid(s);
            assert!(signal(pid, SIGKILL));
            wait_until_serving(s, pid);
            // The new engine process holds (the API asked for it) with the
            // resumed requests queued.
            s.wait_for("the resumed requests queued", |st| st["queued"] == 4 && st["hold"]["held"] == true);
        }
        hs.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    let st = s.wait_for("the last engine idle", |st| st["engine_idle"] == true);
    for (r, (want, _)) in raws.iter().zip(&expected) {
        let raw = r.text();
        let (text, error) = read_stream(&raw);
        assert_eq!(error, None, "{raw}");
        assert_eq!(&text, want, "the resumed stream's text is the uninterrupted run's");
        assert!(raw.trim_end().ends_with("data: [DONE]"), "{raw}");
    }
    let h = s.request("GET", "/health", &[], b"").json();
    assert_eq!(h["engine"]["restarts"], 2, "{h}");
    // The last engine process found each request's state on disk: at least
    // the prompt and the first checkpoint's 8 tokens.
    let floor: u64 = expected.iter().map(|(_, p)| p + 8).sum();
    assert!(st["ssd_cache_hits"].as_u64().unwrap() >= 4, "{st}");
    assert!(st["prefix_cache_hit_tokens"].as_u64().unwrap_or(0) >= floor, "{st}");
}
