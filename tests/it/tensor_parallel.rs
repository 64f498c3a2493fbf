//! `--tp N`: one model split over N ranks by tensor parallelism, on the CPU
//! through MLX's ring backend between processes on this machine
//! (host-cli's `tp_launch`, model-kit's `shard`).
//!
//! The reference for `--tp 2` is the same command at `--tp 1` (itself held
//! to mlx-lm by the parity tests): greedy tokens identical, in float32,
//! float32-computed bf16, and 4-bit weights (row-parallel layers then slice
//! whole quantization groups). Rank 0's weights shrink by half of exactly
//! the layers that are split, so the split is real. Refusals come in one
//! line; a rank that never comes or dies ends the run with its name.

use it::{host_bin, model, run_ok, Scratch};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PROMPT: &str = "1,2,3,4,5,6,7,8,9,10,11,12";

fn host(args: &[&str]) -> Command {
    let mut c = Command::new(host_bin());
    c.current_dir(it::repo_root()).args(args).env("RUST_BACKTRACE", "0");
    c
}

fn generate(dir: &Path, tp: usize, max_tokens: usize) -> Value {
    let out = run_ok(host(&["generate", "--model"]).arg(dir).args([
        "--prompt-ids",
        PROMPT,
        "--max-tokens",
        &max_tokens.to_string(),
        "--ignore-eos",
        "--json",
        "--tp",
        &tp.to_string(),
    ]));
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("no JSON ({e}): {out}"))
}

fn tokens(v: &Value) -> Vec<u64> {
    v["tokens"].as_array().expect("tokens").iter().map(|t| t.as_u64().unwrap()).collect()
}

fn same_tokens(folder: &str) {
    let dir = model(folder);
    let one = generate(&dir, 1, 24);
    let two = generate(&dir, 2, 24);
    assert_eq!(tokens(&one).len(), 24, "{one}");
    assert_eq!(tokens(&two), tokens(&one), "{folder}: --tp 2 parted from --tp 1");
}

#[test]
fn llama_tp2_matches_tp1() {
    same_tokens("tiny/tiny-llama-f32");
}

#[test]
fn qwen3_tp2_matches_tp1() {
    same_tokens("tiny/tiny-qwen3-f32");
}

/// Sliding-window layers (window 8) over a 36-token history.
#[test]
fn gemma3_sliding_window_tp2_matches_tp1() {
    same_tokens("tiny/tiny-gemma3-f32");
}

/// Every expert's channels split; the experts' outputs summed over ranks.
#[test]
fn moe_tp2_matches_tp1() {
    same_tokens("tiny/tiny-qwen3_moe-f32");
    same_tokens("tiny/tiny-qwen3_moe-q4");
}

#[test]
fn quantized_and_bf16_tp2_match_tp1() {
    same_tokens("tiny/tiny-llama-q4");
    same_tokens("tiny/tiny-llama-bf16");
}

/// Rank 0 holds the embedding, norms and LM head whole, and half of every
/// q/k/v/o and gate/up/down projection (float32: 4 bytes a weight).
#[test]
fn each_rank_holds_half_of_the_split_layers() {
    let dir = model("tiny/tiny-llama-f32");
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let n = |k: &str| cfg[k].as_u64().unwrap_or_else(|| panic!("config {k}"));
    let (hidden, inter, layers) = (n("hidden_size"), n("intermediate_size"), n("num_hidden_layers"));
    let (q, kv) = (n("num_attention_heads") * n("head_dim"), n("num_key_value_heads") * n("head_dim"));
    let split = layers * 4 * (2 * q * hidden + 2 * kv * hidden + 3 * inter * hidden);
    let one = generate(&dir, 1, 2)["weights_bytes"].as_u64().unwrap();
    let two = generate(&dir, 2, 2)["weights_bytes"].as_u64().unwrap();
    assert_eq!(one - two, split / 2, "--tp 1 holds {one} bytes, rank 0 of --tp 2 {two}");
}

/// A folder of links to `src` with config.json changed by `edit`.
fn edited_folder(scratch: &Scratch, src: &str, edit: impl Fn(&mut Value)) -> PathBuf {
    let src = model(src);
    let dir = scratch.0.join("model");
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        if p.file_name().unwrap() != "config.json" {
            std::os::unix::fs::symlink(&p, dir.join(p.file_name().unwrap())).unwrap();
        }
    }
    let mut cfg: Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    dir
}

fn fails(cmd: &mut Command) -> String {
    let out: Output = cmd.output().expect("spawn host");
    assert!(!out.status.success(), "{cmd:?} succeeded: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// KV heads are split, never replicated: one KV head over two ranks is
/// refused from the config, before any weight is read.
#[test]
fn one_kv_head_is_refused() {
    let scratch = Scratch::new("tp-kv1");
    let dir = edited_folder(&scratch, "tiny/tiny-qwen3-f32", |c| c["num_key_value_heads"] = 1.into());
    let err = fails(host(&["generate", "--prompt-ids", PROMPT, "--max-tokens", "2", "--tp", "2", "--model"]).arg(&dir));
    assert!(err.contains("--tp 2: the model has 1 KV heads per layer, which do not divide by 2 ranks"), "{err}");
}

#[test]
fn tp_larger_than_the_heads_is_refused() {
    let dir = model("tiny/tiny-llama-f32");
    let err = fails(host(&["generate", "--prompt-ids", PROMPT, "--max-tokens", "2", "--tp", "8", "--model"]).arg(&dir));
    assert!(err.contains("--tp 8: the model has 2 KV heads per layer, which do not divide by 8 ranks"), "{err}");
    // One line from the launcher, before any rank starts.
    assert_eq!(err.matches("do not divide").count(), 1, "{err}");
    assert!(!err.contains("--tp: rank"), "{err}");
}

#[test]
fn a_family_without_tensor_parallel_is_refused() {
    let dir = model("tiny/tiny-qwen3_5-f32");
    let err = fails(host(&["generate", "--prompt-ids", PROMPT, "--max-tokens", "2", "--tp", "2", "--model"]).arg(&dir));
    assert!(err.contains("--tp 2: family plugin `model-qwen3-5` does not advertise `tensor-parallel`"), "{err}");
}

/// NCCL asked for on a runtime without it (the CPU wheel): one line, before
/// any rank starts.
#[test]
fn nccl_without_a_gpu_runtime_is_refused() {
    let err = fails(
        host(&["generate", "--prompt-ids", PROMPT, "--max-tokens", "2", "--tp", "2", "--tp-backend", "nccl"])
            .arg("--model")
            .arg(model("tiny/tiny-llama-f32")),
    );
    assert!(err.contains("--tp 2: this MLX runtime has no `nccl` backend"), "{err}");
    assert!(!err.contains("--tp: rank"), "{err}");
}

/// Rank 0 started by hand (mlx.launch's MLX_RANK and MLX_HOSTFILE) whose
/// peer never comes: it gives up after --tp-timeout, naming the hostfile.
#[test]
fn a_missing_rank_times_out() {
    let scratch = Scratch::new("tp-missing");
    let ports: Vec<u16> =
        (0..2).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()).collect();
    let hostfile = scratch.0.join("hosts.json");
    std::fs::write(&hostfile, format!(r#"[["127.0.0.1:{}"],["127.0.0.1:{}"]]"#, ports[0], ports[1])).unwrap();
    let started = std::time::Instant::now();
    let err = fails(
        host(&["generate", "--prompt-ids", PROMPT, "--max-tokens", "2", "--tp", "2", "--tp-timeout", "2", "--model"])
            .arg(model("tiny/tiny-llama-f32"))
            .env("MLX_RANK", "0")
            .env("MLX_HOSTFILE", &hostfile),
    );
    assert!(err.contains("rank 0 of 2: the other ranks did not connect within 2 s"), "{err}");
    assert!(err.contains(hostfile.to_str().unwrap()), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(30), "took {:?}", started.elapsed());
}

fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(list.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    out
}

/// Killing rank 1 mid-run: the launcher names it, stops rank 0 and fails,
/// instead of leaving rank 0 waiting on a collective.
#[test]
fn a_dead_rank_ends_the_run() {
    let scratch = Scratch::new("tp-dead");
    let dir = edited_folder(&scratch, "tiny/tiny-llama-f32", |c| c["max_position_embeddings"] = 100_000.into());
    let mut launcher = host(&["generate", "--prompt-ids", PROMPT, "--max-tokens", "50000", "--ignore-eos", "--json"])
        .args(["--tp", "2", "--model"])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ranks = loop {
        let c = children_of(launcher.id());
        if c.len() == 2 {
            break c;
        }
        assert!(launcher.try_wait().unwrap().is_none(), "the launcher exited before starting two ranks");
        std::thread::yield_now();
    };
    // Children are listed in start order: rank 0, then rank 1.
    let status = Command::new("kill").args(["-KILL", &ranks[1].to_string()]).status().unwrap();
    assert!(status.success());
    let out = launcher.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    // The launcher names every rank that ended; rank 0 may have ended too,
    // on its lost peer, before the launcher looked.
    assert!(err.contains("--tp: rank 1 exited (signal: 9"), "{err}");
    assert!(err.contains("--tp: stopping the other ranks"), "{err}");
    assert!(!Path::new(&format!("/proc/{}", ranks[0])).exists() || zombie(ranks[0]), "rank 0 still runs");
}

fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z "))
}

/// The way ranks start on several hosts, here with both on 127.0.0.1: no
/// launcher, each rank started by hand with MLX_RANK and one shared
/// MLX_HOSTFILE. Rank 0 prints what `--tp 1` prints.
#[test]
fn ranks_started_by_hand_share_one_hostfile() {
    let scratch = Scratch::new("tp-by-hand");
    let ports: Vec<u16> =
        (0..2).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()).collect();
    let hostfile = scratch.0.join("hosts.json");
    std::fs::write(&hostfile, format!(r#"[["127.0.0.1:{}"],["127.0.0.1:{}"]]"#, ports[0], ports[1])).unwrap();
    let dir = model("tiny/tiny-qwen3-f32");
    let rank = |r: &str| {
        host(&["generate", "--prompt-ids", PROMPT, "--max-tokens", "16", "--ignore-eos", "--json", "--tp", "2"])
            .args(["--tp-timeout", "60", "--model"])
            .arg(&dir)
            .env("MLX_RANK", r)
            .env("MLX_HOSTFILE", &hostfile)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (one, zero) = (rank("1"), rank("0"));
    let (one, zero) = (one.wait_with_output().unwrap(), zero.wait_with_output().unwrap());
    for (r, o) in [(1, &one), (0, &zero)] {
        assert!(o.status.success(), "rank {r}: {}", String::from_utf8_lossy(&o.stderr));
    }
    let printed: Value = serde_json::from_slice(&zero.stdout).expect("rank 0's JSON");
    assert_eq!(tokens(&printed), tokens(&generate(&dir, 1, 16)));
}

/// Sampling at temperature 1 with a seed: every rank draws the same token
/// from the same logits, and rank 0's tokens are `--tp 1`'s.
#[test]
fn seeded_sampling_tp2_matches_tp1() {
    let dir = model("tiny/tiny-llama-f32");
    let sampled = |tp: &str| {
        let out = run_ok(
            host(&["generate", "--prompt-ids", PROMPT, "--max-tokens", "16", "--ignore-eos", "--json"])
                .args(["--temp", "1.0", "--seed", "7", "--tp", tp, "--model"])
                .arg(&dir),
        );
        tokens(&serde_json::from_str(out.trim()).unwrap())
    };
    let one = sampled("1");
    assert_eq!(sampled("2"), one);
    // Not the greedy path: the draw matters.
    assert_ne!(one, tokens(&generate(&dir, 1, 16)));
}

fn completion(prompt: &str) -> Value {
    serde_json::json!({ "prompt": prompt, "max_tokens": 12, "temperature": 0 })
}

fn text(r: &Value) -> String {
    r["choices"][0]["text"].as_str().unwrap_or_else(|| panic!("no text: {r}")).to_owned()
}

/// The bodies of the batched tests: greedy rows, a repeated prompt, a row
/// that a stop string ends early (its client stops it), a seeded sampled
/// row, and a JSON-object grammar (rank 0 sends its source; every rank
/// compiles and follows it).
fn mixed_bodies() -> Vec<Value> {
    let mut stopped = completion("the quick brown fox");
    stopped["max_tokens"] = 40.into();
    vec![
        completion("hello there"),
        serde_json::json!({ "prompt": "one two three", "max_tokens": 12, "temperature": 1.0, "seed": 5 }),
        completion("hello there"),
        stopped,
        serde_json::json!({
            "prompt": "a json object:", "max_tokens": 16, "temperature": 0,
            "response_format": { "type": "json_object" },
        }),
        completion("one two three four"),
    ]
}

/// A `--tp 1` server's answers, one request at a time.
fn serial_answers(dir: &Path, bodies: &[Value]) -> Vec<String> {
    let one = it::Server::start(dir, &["--batch", "1"]);
    bodies.iter().map(|b| text(&one.post("/v1/completions", b).json())).collect()
}

/// `host serve --tp 2` batches: every rank runs the same continuous batch
/// (rank 0 decides; the others take its decisions). Requests that arrive
/// together, requests that join a running batch, a stop string ending one
/// row while others go on, and a second pass served from the prefix cache
/// all answer what a `--tp 1` server answers one request at a time.
#[test]
fn serve_tp2_batches_requests_as_tp1() {
    let dir = model("tiny/tiny-llama-f32");
    let mut bodies = mixed_bodies();
    let serial = serial_answers(&dir, &bodies);
    // The stop string: a piece of what the row says when nothing stops it.
    let whole = &serial[3];
    let stop: String = whole.chars().skip(whole.chars().count() / 2).take(3).collect();
    bodies[3]["stop"] = serde_json::json!([stop]);
    let serial = serial_answers(&dir, &bodies);
    assert!(serial[3].chars().count() < whole.chars().count(), "the stop string did not end the row");

    let two = it::Server::start(&dir, &["--tp", "2", "--batch", "8", "--debug-endpoints"]);
    let texts = |rs: Vec<Value>| -> Vec<String> { rs.iter().map(text).collect() };
    assert_eq!(texts(two.post_burst("/v1/completions", &bodies)), serial, "a burst");
    assert!(two.stats()["max_batch_rows"].as_u64().unwrap() >= 4, "{}", two.stats());
    let again = two.post_joining("/v1/completions", &bodies, 2);
    assert_eq!(texts(again.clone()), serial, "joining a running batch");
    let cached: u64 =
        again.iter().map(|r| r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()).sum();
    assert!(cached > 0, "the second pass reused no prompt: {again:?}");
    assert_eq!(two.stats()["failed"], 0);
}

/// A client that goes away mid-stream: its row leaves the batch on every
/// rank, and the rows beside it still answer as `--tp 1`.
#[test]
fn serve_tp2_drops_an_abandoned_row_on_every_rank() {
    let dir = model("tiny/tiny-llama-f32");
    let bodies = mixed_bodies();
    let serial = serial_answers(&dir, &bodies);
    let two = it::Server::start(&dir, &["--tp", "2", "--batch", "8", "--debug-endpoints"]);
    let long = serde_json::json!({ "prompt": "count with me", "max_tokens": 400, "stream": true, "temperature": 0 });
    // The long row and the others are queued while the engine is held and
    // start together; the long row's client leaves after 3 events.
    two.hold();
    std::thread::scope(|sc| {
        let gone = sc.spawn(|| two.abandon_stream("/v1/completions", &long, 3));
        two.wait_for("the long request to be queued", |st| st["queued"] == 1);
        let mut hs = Vec::new();
        for (i, b) in bodies.iter().enumerate() {
            let two = &two;
            hs.push(sc.spawn(move || text(&two.post("/v1/completions", b).json())));
            two.wait_for("the next request to be queued", |st| st["queued"].as_u64() == Some(i as u64 + 2));
        }
        two.release();
        let answers: Vec<String> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(answers, serial);
        assert!(gone.join().unwrap() < 400);
    });
    let rows = two.stats()["max_batch_rows"].as_u64().unwrap();
    assert!(rows as usize > bodies.len(), "the abandoned row never ran beside the others: {rows} rows at most");
    assert_eq!(two.stats()["active"], 0, "{}", two.stats());
    let answers: Vec<String> = bodies.iter().map(|b| text(&two.post("/v1/completions", b).json())).collect();
    assert_eq!(answers, serial, "after the abandoned row");
}

#[test]
fn serve_tp_refuses_what_does_not_run_in_lockstep() {
    let dir = model("tiny/tiny-llama-f32");
    let err = fails(host(&["serve", "--tp", "2", "--isolate", "--model"]).arg(&dir));
    assert!(err.contains("--tp 2: engine isolation (--isolate) is not served with --tp"), "{err}");
    assert_eq!(err.lines().filter(|l| !l.trim().is_empty()).count(), 1, "{err}");
}

/// Speculation under `--tp 2`: every rank drafts alike (n-gram drafts, and
/// the model's own copy as a two-model draft, itself split over the ranks),
/// and the cost rule's timings are rank 0's on every rank. `host generate`
/// (serial rounds, judged and always) and a batching server (rounds inside
/// the batch) give `--tp 1`'s plain tokens, with drafts both accepted and
/// rejected.
#[test]
fn speculation_tp2_matches_tp1() {
    let dir = model("tiny/tiny-llama-f32");
    let d = dir.to_str().unwrap().to_owned();
    let ids = "1,2,3,4,5,6,1,2,3,4,5,6,1,2,3";
    let run = |tp: &str, extra: &[&str]| -> Value {
        let out = run_ok(
            host(&["generate", "--prompt-ids", ids, "--max-tokens", "40", "--ignore-eos", "--json", "--tp", tp])
                .args(extra)
                .arg("--model")
                .arg(&dir),
        );
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("no JSON ({e}): {out}"))
    };
    let want = tokens(&run("1", &[]));
    let (mut drafted, mut accepted) = (0, 0);
    for draft in [
        &["--draft-kind", "ngram", "--speculate-always"][..],
        &["--draft-kind", "ngram"][..],
        &["--draft-kind", "two-model", "--draft-model", &d][..],
    ] {
        let got = run("2", draft);
        assert_eq!(tokens(&got), want, "{draft:?}: --tp 2 speculation parted from --tp 1");
        drafted += got["speculation"]["drafted"].as_u64().unwrap_or(0);
        accepted += got["speculation"]["accepted"].as_u64().unwrap_or(0);
    }
    assert!(accepted > 0 && accepted < drafted, "drafted {drafted}, accepted {accepted}");

    let bodies: Vec<Value> = ["1 2 3 1 2 3 1 2", "hello there", "one two one two one two"]
        .iter()
        .map(|p| serde_json::json!({ "prompt": p, "max_tokens": 24, "temperature": 0 }))
        .collect();
    let serial = serial_answers(&dir, &bodies);
    let two =
        it::Server::start(&dir, &["--tp", "2", "--draft-kind", "ngram", "--speculate-always", "--debug-endpoints"]);
    let got = two.post_burst("/v1/completions", &bodies);
    assert_eq!(got.iter().map(text).collect::<Vec<_>>(), serial);
    let drafted: u64 = got.iter().map(|r| r["usage"]["speculation"]["drafted"].as_u64().unwrap_or(0)).sum();
    assert!(drafted > 0, "no row drafted: {got:?}");
}

/// A follower killed under a running server: the launcher names it, stops
/// rank 0 (the HTTP server) and exits with an error instead of hanging.
#[test]
fn serve_tp2_exits_when_a_rank_dies() {
    let dir = model("tiny/tiny-llama-f32");
    let mut s = it::Server::start(&dir, &["--tp", "2"]);
    let ranks = children_of(s.child.id());
    assert_eq!(ranks.len(), 2, "{ranks:?}");
    assert!(Command::new("kill").args(["-KILL", &ranks[1].to_string()]).status().unwrap().success());
    let status = s.child.wait().unwrap();
    assert!(!status.success());
    let log = std::fs::read_to_string(&s.log).unwrap();
    assert!(log.contains("--tp: rank 1 exited (signal: 9"), "{log}");
    assert!(log.contains("--tp: stopping the other ranks"), "{log}");
    assert!(std::net::TcpStream::connect(("127.0.0.1", s.port)).is_err(), "rank 0 still serves");
}

/// Embeddings and prompt scoring under `--tp 2`: rank 0 broadcasts the
/// inputs, every rank runs its part of the forward, and rank 0's vectors
/// and prompt logprobs equal `--tp 1`'s (float32; the split sums add in
/// another order). Generation goes on.
#[test]
fn serve_tp2_embeds_as_tp1() {
    let scratch = Scratch::new("tp-embed");
    let folder = scratch.0.join("embed-mean");
    run_ok(
        it::python()
            .arg(it::repo_root().join("models/scripts/make_embedding.py"))
            .arg(model("tiny/tiny-qwen3-f32"))
            .arg(&folder)
            .args(["--pooling", "mean"]),
    );
    let body = serde_json::json!({ "input": ["hello", "the quick brown fox jumps"] });
    let vectors = |s: &it::Server| -> Vec<Vec<f64>> {
        let r = s.post("/v1/embeddings", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
            .collect()
    };
    // Prompt scoring (`echo` with `logprobs`) crosses the ranks the same way.
    let scored = |s: &it::Server| -> Vec<f64> {
        let body = serde_json::json!({ "prompt": "the quick brown fox jumps", "echo": true, "logprobs": 2, "max_tokens": 1, "temperature": 0 });
        let r = s.post("/v1/completions", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        let lps = r.json()["choices"][0]["logprobs"]["token_logprobs"].as_array().unwrap().clone();
        lps.iter().skip(1).map(|x| x.as_f64().unwrap()).collect()
    };
    let tp1 = it::Server::start(&folder, &["--batch", "1"]);
    let (one, one_scored) = (vectors(&tp1), scored(&tp1));
    drop(tp1);
    let s = it::Server::start(&folder, &["--tp", "2"]);
    let two = vectors(&s);
    assert_eq!(two.len(), 2);
    for (a, b) in one.iter().zip(&two) {
        assert_eq!(a.len(), b.len());
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        assert!(worst < 1e-4, "--tp 2 embeddings differ from --tp 1 by {worst}");
    }
    let two_scored = scored(&s);
    assert!(one_scored.len() > 3 && one_scored.len() == two_scored.len(), "{one_scored:?} vs {two_scored:?}");
    let worst = one_scored.iter().zip(&two_scored).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    assert!(worst < 1e-3, "--tp 2 prompt logprobs differ from --tp 1 by {worst}");
    let r = s.post("/v1/completions", &completion("hello there"));
    assert_eq!(r.status, 200, "{}", r.text());
}

/// `host bench --tp 2`: rank 0 benchmarks through its lockstep worker, the
/// other rank follows, and every batch size gets its row.
#[test]
fn bench_tp2_reports_every_batch() {
    let out = run_ok(
        host(&["bench", "--prompt-len", "16", "--gen-len", "4", "--batch", "1,3", "--trials", "1", "--json"])
            .args(["--tp", "2", "--model"])
            .arg(model("tiny/tiny-llama-f32")),
    );
    let rows: Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("no JSON ({e}): {out}"));
    let rows = rows.as_array().expect("a list of rows");
    assert_eq!(rows.iter().map(|r| r["batch"].as_u64().unwrap()).collect::<Vec<_>>(), [1, 3]);
    for r in rows {
        assert!(r["decode_tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["prefill_tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
}
