//! The prefix cache's SSD tier (`--ssd-cache DIR`): entries written to
//! disk survive a restart and are reused (`cached_tokens` > 0, output equal
//! to a cold server's, time to first token far below a cold prefill);
//! damaged, foreign and other-namespace files are skipped and counted
//! (`ssd_cache_rejected`) without changing the output; the size cap evicts
//! the least recently used files; a leftover temp file is removed at start.

use it::{model, Scratch, Server};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// A chat whose history is `turns` exchanges of numbered filler sentences.
fn conversation(tag: &str, turns: usize, sentences: usize) -> Value {
    let mut msgs = vec![json!({ "role": "system", "content": format!("You are a careful archivist ({tag}).") })];
    for t in 0..turns {
        let body: String = (0..sentences)
            .map(|i| {
                format!(
                    "Record {tag}-{t}-{i}: the {} crate holds {} parcels. ",
                    ["red", "green", "blue"][i % 3],
                    i * 7 + t
                )
            })
            .collect();
        msgs.push(json!({ "role": "user", "content": body }));
        msgs.push(json!({ "role": "assistant", "content": format!("Noted {sentences} records of batch {t}.") }));
    }
    msgs.push(json!({ "role": "user", "content": "Which colour came first? Answer in one word." }));
    Value::Array(msgs)
}

/// (text, prompt tokens, cached tokens) of a greedy answer.
fn ask(s: &Server, msgs: &Value, max_tokens: u32) -> (String, u64, u64) {
    let body = json!({ "messages": msgs, "temperature": 0, "max_tokens": max_tokens }).to_string();
    // A cold 4k-token prefill on a busy CPU can take minutes.
    let r = s
        .request_within(
            "POST",
            "/v1/chat/completions",
            &[("Content-Type", "application/json")],
            body.as_bytes(),
            std::time::Duration::from_secs(600),
        )
        .expect("an answer");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    (
        v["choices"][0]["message"]["content"].as_str().unwrap().to_owned(),
        v["usage"]["prompt_tokens"].as_u64().unwrap(),
        v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
    )
}

fn stat(s: &Server, name: &str) -> u64 {
    let v = s.stats();
    v[name].as_u64().unwrap_or_else(|| panic!("/stats has no {name}: {v}"))
}

/// Waits until the writer has nothing queued (each write is on disk).
fn drain(s: &Server) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while stat(s, "ssd_cache_pending") > 0 {
        assert!(std::time::Instant::now() < deadline, "the SSD writer never drained");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

fn files(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

fn ssd<'a>(dir: &'a Path, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["--ssd-cache", dir.to_str().unwrap()];
    a.extend_from_slice(extra);
    a
}

fn metric(s: &Server, name: &str) -> f64 {
    let m = s.request("GET", "/metrics", &[], b"").text();
    m.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing:\n{m}"))
}

/// Restarting with the same directory reuses the stored prompt state:
/// the answer equals the cold server's, and the state comes from disk.
#[test]
fn a_restarted_server_reuses_the_prompt_state_from_disk() {
    restart_reuse("tiny/tiny-llama-f32", &[]);
}

/// Quantized K/V (uint32 codes, scales and biases) round-trips too.
#[test]
fn a_restarted_server_reuses_quantized_kv_from_disk() {
    restart_reuse("tiny/tiny-llama-hd64-f32", &["--kv-quant", "8"]);
}

/// Paged K/V (blocks and their pool keys in the state's meta): another
/// process's keys never alias this one's blocks; the blocks read back are
/// adopted as the pool's.
#[test]
fn a_restarted_server_reuses_paged_kv_from_disk() {
    restart_reuse("tiny/tiny-llama-f32", &["--paged-kv"]);
}

/// A recurrent state that cannot be trimmed is reused at its exact length
/// (the prompt-boundary snapshot).
#[test]
fn a_restarted_server_reuses_a_recurrent_state_from_disk() {
    restart_reuse("tiny/tiny-qwen3_5-f32", &[]);
}

/// Sliding-window layers (a ring, with its positions in the state's meta)
/// beside full-attention ones.
#[test]
fn a_restarted_server_reuses_a_sliding_window_state_from_disk() {
    restart_reuse("tiny/tiny-gemma3-f32", &[]);
}

fn restart_reuse(model_dir: &str, extra: &[&str]) {
    let m = model(model_dir);
    let dir = Scratch::new("ssd-restart");
    let chat = conversation("restart", 4, 12);
    let args = |batch: &'static str| {
        let mut a = vec!["--batch", batch];
        a.extend_from_slice(extra);
        a
    };
    let (want, prompt, cold_cached) = {
        let cold = Server::start(&m, &ssd(&dir.0, &args("1")));
        let r = ask(&cold, &chat, 16);
        drain(&cold);
        assert!(stat(&cold, "ssd_cache_writes") >= 1);
        assert_eq!(stat(&cold, "ssd_cache_rejected"), 0);
        r
    };
    assert_eq!(cold_cached, 0);
    assert!(!files(&dir.0, "mlxkv").is_empty());
    for batch in ["1", "8"] {
        let warm = Server::start(&m, &ssd(&dir.0, &args(batch)));
        assert!(stat(&warm, "ssd_cache_entries") >= 1);
        let (got, p, cached) = ask(&warm, &chat, 16);
        assert_eq!(got, want, "state read back from disk changed the output (batch {batch})");
        assert_eq!(p, prompt);
        assert_eq!(cached, prompt - 1, "the whole prompt but its last token comes from disk (batch {batch})");
        assert_eq!(stat(&warm, "ssd_cache_hits"), 1);
        assert_eq!(metric(&warm, "mlx_engine_ssd_cache_hits_total"), 1.0);
        drain(&warm);
    }
}

/// A ~4k-token history on the default model: time to first token after a
/// restart (the server's own measure, which includes reading the file) is
/// at least 5x below the cold prefill.
#[test]
fn warm_after_restart_time_to_first_token_beats_a_cold_prefill_fivefold() {
    let m = model("smollm2-135m-instruct");
    let dir = Scratch::new("ssd-ttft");
    let chat = conversation("ttft", 8, 24);
    let ttft = |s: &Server| metric(s, "mlx_engine_time_to_first_token_seconds_sum");
    let (want, prompt, cold) = {
        let s = Server::start(&m, &ssd(&dir.0, &[]));
        let (text, prompt, cached) = ask(&s, &chat, 4);
        assert_eq!(cached, 0);
        drain(&s);
        (text, prompt, ttft(&s))
    };
    assert!((3500..6000).contains(&prompt), "the history should be ~4k tokens, is {prompt}");
    let s = Server::start(&m, &ssd(&dir.0, &[]));
    let (text, _, cached) = ask(&s, &chat, 4);
    let warm = ttft(&s);
    eprintln!(
        "ssd tier, {prompt} prompt tokens: cold TTFT {cold:.3}s, warm after restart {warm:.3}s ({:.1}x)",
        cold / warm
    );
    assert_eq!(text, want);
    assert_eq!(cached, prompt - 1);
    assert!(warm * 5.0 <= cold, "warm TTFT {warm:.3}s is not 5x below cold {cold:.3}s");
}

/// One damaged copy of a stored directory per case: the server skips and
/// counts the bad file, serves the same answer as cold, and keeps serving.
#[test]
fn damaged_foreign_and_other_namespace_files_are_skipped_and_counted() {
    let m = model("tiny/tiny-llama-f32");
    let src = Scratch::new("ssd-damage-src");
    let chat = conversation("damage", 3, 10);
    let want = {
        let s = Server::start(&m, &ssd(&src.0, &["--batch", "1"]));
        let (text, _, _) = ask(&s, &chat, 12);
        drain(&s);
        text
    };
    let stored = files(&src.0, "mlxkv");
    assert!(!stored.is_empty());
    let copy = |tag: &str| {
        let d = Scratch::new(tag);
        for f in &stored {
            std::fs::copy(f, d.0.join(f.file_name().unwrap())).unwrap();
        }
        d
    };
    let check = |dir: &Path, extra: &[&str], rejected: u64, reuse: bool, why: &str| {
        let s = Server::start(&m, &ssd(dir, extra));
        let (text, prompt, cached) = ask(&s, &chat, 12);
        assert_eq!(text, want, "{why}: the output changed");
        assert_eq!(stat(&s, "ssd_cache_rejected"), rejected, "{why}");
        assert_eq!(metric(&s, "mlx_engine_ssd_cache_rejected_total"), rejected as f64, "{why}");
        if reuse {
            assert_eq!(cached, prompt - 1, "{why}: the good entry should still be used");
        } else {
            assert_eq!(cached, 0, "{why}: nothing usable was on disk");
        }
        // The server keeps serving.
        let (again, _, _) = ask(&s, &chat, 12);
        assert_eq!(again, want, "{why}");
    };

    // Truncated: the sizes do not add up (found at start, from the header).
    let d = copy("ssd-truncated");
    for f in files(&d.0, "mlxkv") {
        let len = std::fs::metadata(&f).unwrap().len();
        std::fs::File::options().write(true).open(&f).unwrap().set_len(len - 100).unwrap();
    }
    check(&d.0, &["--batch", "1"], stored.len() as u64, false, "truncated");

    // A flipped byte in the header (a token id): seen without --ssd-cache-verify.
    let d = copy("ssd-header-flip");
    for f in files(&d.0, "mlxkv") {
        let mut bytes = std::fs::read(&f).unwrap();
        let at = 32 + bytes[32..].windows(10).position(|w| w == b"\"tokens\":[").unwrap() + 10;
        bytes[at] ^= 0x01;
        std::fs::write(&f, &bytes).unwrap();
    }
    check(&d.0, &["--batch", "1"], stored.len() as u64, false, "flipped header byte");

    // Flipped bytes in the tensor data: only the content hash sees them.
    let d = copy("ssd-flipped");
    let mut flipped = Vec::new();
    for f in files(&d.0, "mlxkv") {
        let mut bytes = std::fs::read(&f).unwrap();
        let n = bytes.len();
        for i in [n - 1, n - 1000, n / 2 + 17] {
            bytes[i] ^= 0x5a;
        }
        std::fs::write(&f, &bytes).unwrap();
        flipped.push((f, bytes));
    }
    check(&d.0, &["--batch", "1", "--ssd-cache-verify"], stored.len() as u64, false, "flipped bytes");
    for (f, bad) in flipped {
        // Deleted when it failed its hash (and written afresh by the cold prefill).
        assert!(std::fs::read(&f).map_or(true, |now| now != bad), "{} still holds the damaged bytes", f.display());
    }

    // A foreign file under an entry's name, beside the good entries; and a
    // leftover temp file of an interrupted write, removed at start.
    let d = copy("ssd-foreign");
    std::fs::write(d.0.join(format!("{}.mlxkv", "ab".repeat(16))), b"not a cache entry at all, just bytes").unwrap();
    let tmp = d.0.join(format!("{}.tmp", "cd".repeat(16)));
    std::fs::write(&tmp, b"MLXKVSSD half-written").unwrap();
    check(&d.0, &["--batch", "1"], 1, true, "foreign file");
    assert!(!tmp.exists(), "the leftover temp file was not removed at start");

    // Another namespace (another compute dtype): skipped, counted, kept.
    let d = copy("ssd-namespace");
    let want16 = {
        let cold = Server::start(&m, &["--dtype", "float16", "--prompt-cache", "0"]);
        ask(&cold, &chat, 12).0
    };
    let s = Server::start(&m, &ssd(&d.0, &["--dtype", "float16"]));
    let (text, _, cached) = ask(&s, &chat, 12);
    assert_eq!(text, want16, "another namespace's state changed the output");
    assert_eq!(cached, 0);
    assert_eq!(stat(&s, "ssd_cache_rejected"), stored.len() as u64);
    drop(s);
    for f in &stored {
        assert!(d.0.join(f.file_name().unwrap()).exists(), "another namespace's file was deleted");
    }
}

/// The cap keeps the most recently used entries: four conversations
/// through a cap that holds the last two leave those two, and after a
/// restart the newest is served from disk and the oldest is not.
#[test]
fn the_size_cap_evicts_the_least_recently_used_files() {
    let m = model("tiny/tiny-llama-f32");
    let chats: Vec<Value> = ["amber", "basalt", "cobalt", "dune"].iter().map(|t| conversation(t, 2, 10)).collect();
    // Each conversation's file size, from an uncapped directory.
    let sizes: Vec<u64> = {
        let d = Scratch::new("ssd-sizes");
        let s = Server::start(&m, &ssd(&d.0, &["--batch", "1"]));
        let mut last = 0;
        chats
            .iter()
            .map(|c| {
                ask(&s, c, 8);
                drain(&s);
                let now = stat(&s, "ssd_cache_bytes");
                let size = now - last;
                last = now;
                size
            })
            .collect()
    };
    let cap = sizes[2] + sizes[3] + 512;
    assert!(cap < sizes[1] + sizes[2] + sizes[3]);
    let cap_gib = format!("{:.15}", cap as f64 / (1u64 << 30) as f64);
    let dir = Scratch::new("ssd-cap");
    let args = ssd(&dir.0, &["--batch", "1", "--ssd-cache-max", &cap_gib]);
    {
        let s = Server::start(&m, &args);
        for c in &chats {
            ask(&s, c, 8);
            drain(&s);
        }
        assert_eq!(stat(&s, "ssd_cache_entries"), 2);
        assert!(stat(&s, "ssd_cache_evictions") >= 2);
        assert!(stat(&s, "ssd_cache_bytes") <= cap);
    }
    assert_eq!(files(&dir.0, "mlxkv").len(), 2);
    let s = Server::start(&m, &args);
    let (_, prompt, cached) = ask(&s, &chats[3], 8);
    assert_eq!(cached, prompt - 1, "the newest entry should be on disk");
    let (_, prompt, cached) = ask(&s, &chats[0], 8);
    assert!(cached < prompt / 2, "the oldest entry should have been evicted: {cached} of {prompt} reused");
}
