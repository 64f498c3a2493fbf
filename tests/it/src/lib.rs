//! Helpers shared by the end-to-end tests: where the build put things.

use std::path::PathBuf;

pub mod draft_trace;

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo root")
}

/// The cargo profile folder this test binary was built into
/// (`target/<profile>`), which also holds the workspace's cdylibs and binaries.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test exe");
    exe.parent().and_then(|deps| deps.parent()).expect("target/<profile>").to_path_buf()
}

/// A workspace cdylib by crate name, e.g. `proof_maker` → `libproof_maker.so`.
pub fn cdylib(name: &str) -> PathBuf {
    let p = profile_dir().join(format!("lib{name}.so"));
    assert!(p.exists(), "{} is missing: run `cargo xtask build` (or the README's test command)", p.display());
    p
}

/// The `host` binary of the same profile.
pub fn host_bin() -> PathBuf {
    let p = profile_dir().join("host");
    assert!(p.exists(), "{} is missing: run `cargo xtask build`", p.display());
    p
}

/// The oracle environment's Python (mlx-lm), made by `cargo xtask test`,
/// running on the SAME libmlx as the engine (`.mlx/lib` first on the
/// loader path; the wheel's libmlx is only reached through RUNPATH).
pub fn python() -> std::process::Command {
    let p = repo_root().join(".venv/bin/python");
    assert!(p.exists(), "{} is missing: run `cargo xtask test` (it creates the oracle environment)", p.display());
    let mut c = std::process::Command::new(p);
    c.env("LD_LIBRARY_PATH", repo_root().join(".mlx/lib"));
    c
}

/// A model folder under `models/`, which must exist.
pub fn model(rel: &str) -> PathBuf {
    let p = repo_root().join("models").join(rel);
    assert!(
        p.join("config.json").exists(),
        "{} is missing: run `cargo xtask test` (it makes the model folders)",
        p.display()
    );
    p
}

/// tiny-llama-f32 with a chat template that speaks the Hermes
/// `<tool_call>` syntax (as Qwen 2.5 and Qwen 3 templates do), in a folder
/// of links under `tag` (one per test module, so tests run side by side).
pub fn hermes_folder(tag: &str) -> PathBuf {
    let src = model("tiny/tiny-llama-f32");
    let dir = profile_dir().join("tmp").join(tag).join("tiny-llama-hermes");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        std::os::unix::fs::symlink(&p, dir.join(p.file_name().unwrap())).unwrap();
    }
    // chat_template.jinja wins over tokenizer_config.json's template, here
    // and in transformers.
    std::fs::copy(repo_root().join("tests/http/templates/hermes_tools.jinja"), dir.join("chat_template.jinja"))
        .unwrap();
    dir
}

/// The ids `thinking_folder`'s tokenizer gives the reasoning markers.
pub const THINK_ID: u32 = 8;
pub const END_THINK_ID: u32 = 9;

/// tiny-qwen3-f32 as a reasoning model, under `tag` (one per test module):
/// its tokenizer has `<think>` and `</think>` as added tokens that are not
/// special (as Qwen3's: ids `THINK_ID`, `END_THINK_ID`, two unused added
/// tokens renamed), and `tests/http/templates/think_tools.jinja` is its
/// chat template (the generation prompt opens `<think>`; `enable_thinking`
/// and `preserve_thinking` switches; Hermes tool calls).
pub fn thinking_folder(tag: &str) -> PathBuf {
    let src = model("tiny/tiny-qwen3-f32");
    let dir = profile_dir().join("tmp").join(tag).join("tiny-qwen3-thinking");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let rewritten = ["tokenizer.json", "tokenizer_config.json"];
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !rewritten.contains(&name.as_str()) {
            std::os::unix::fs::symlink(&p, dir.join(&name)).unwrap();
        }
    }
    let read = |name: &str| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(src.join(name)).unwrap()).unwrap()
    };
    let renames = [(THINK_ID, "<think>"), (END_THINK_ID, "</think>")];
    let mut tok = read("tokenizer.json");
    for (id, to) in renames {
        let entry = tok["added_tokens"].as_array_mut().unwrap().iter_mut().find(|t| t["id"] == id).unwrap();
        let from = entry["content"].as_str().unwrap().to_owned();
        entry["content"] = to.into();
        entry["special"] = false.into();
        let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
        let v = vocab.remove(&from).unwrap();
        vocab.insert(to.into(), v);
    }
    std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    let mut cfg = read("tokenizer_config.json");
    cfg.as_object_mut().unwrap().remove("chat_template");
    for (id, to) in renames {
        let entry = &mut cfg["added_tokens_decoder"][id.to_string()];
        entry["content"] = to.into();
        entry["special"] = false.into();
    }
    std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    std::fs::copy(repo_root().join("tests/http/templates/think_tools.jinja"), dir.join("chat_template.jinja")).unwrap();
    dir
}

/// Makes a model folder made of links (`hermes_folder`, `thinking_folder`)
/// declare a context of `n` tokens: its config.json becomes a copy with
/// `max_position_embeddings` = n (RoPE has no length of its own).
pub fn with_context(dir: &std::path::Path, n: u64) {
    let path = dir.join("config.json");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    cfg["max_position_embeddings"] = n.into();
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, cfg.to_string()).unwrap();
}

/// Runs a command and returns its stdout, failing the test with stderr.
pub fn run_ok(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(out.status.success(), "{:?} failed:\n{}", cmd, String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).expect("utf-8 stdout")
}

/// A fresh scratch folder under target/ (removed when dropped).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = profile_dir().join("scratch").join(format!(
            "{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Self(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `host serve` child process on a free port, killed (SIGTERM) on drop.
pub struct Server {
    pub child: std::process::Child,
    pub port: u16,
    pub log: PathBuf,
}

impl Server {
    /// Starts `host serve --model <model> <extra>` and waits for /health.
    pub fn start(model: &std::path::Path, extra: &[&str]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = profile_dir().join(format!("serve-{port}.log"));
        let child = std::process::Command::new(host_bin())
            .current_dir(repo_root())
            .args(["serve", "--model"])
            .arg(model)
            .args(["--port", &port.to_string()])
            .args(extra)
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(std::fs::File::options().append(true).open(&log).unwrap())
            .spawn()
            .expect("spawn host serve");
        let s = Self { child, port, log };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while std::time::Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", s.port)).is_ok()
                && s.request("GET", "/health", &[], b"").status == 200
            {
                return s;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        panic!("server did not come up:\n{}", std::fs::read_to_string(&s.log).unwrap_or_default());
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// One raw HTTP/1.1 request (Connection: close); the whole response.
    pub fn request(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> HttpResponse {
        let (raw, _) = self.exchange(method, path, headers, body, std::time::Duration::from_secs(120));
        HttpResponse::parse(&raw)
    }

    /// As `request`, but a response that has not ended within `timeout`
    /// of the last byte read is an error (a hang), not a truncated answer.
    pub fn request_within(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: std::time::Duration,
    ) -> std::io::Result<HttpResponse> {
        let (raw, read) = self.exchange(method, path, headers, body, timeout);
        read.map(|()| HttpResponse::parse(&raw))
    }

    /// Sends one request and reads until the server closes the connection.
    fn exchange(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout: std::time::Duration,
    ) -> (Vec<u8>, std::io::Result<()>) {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(timeout)).unwrap();
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n");
        let mut has_len = false;
        for (k, v) in headers {
            has_len |= k.eq_ignore_ascii_case("content-length") || k.eq_ignore_ascii_case("transfer-encoding");
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if !has_len {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).unwrap();
        s.write_all(body).unwrap();
        let mut raw = Vec::new();
        let read = s.read_to_end(&mut raw).map(drop);
        (raw, read)
    }

    /// POSTs JSON.
    pub fn post(&self, path: &str, body: &serde_json::Value) -> HttpResponse {
        self.request("POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes())
    }

    /// POSTs JSON that must be answered 200; returns the answer's JSON.
    pub fn post_ok(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        let r = self.post(path, body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }

    /// Starts a streamed POST, reads until `events` SSE `data:` lines came,
    /// and goes away; then waits until the server cancelled the job, and
    /// returns how many tokens it had made.
    pub fn abandon_stream(&self, path: &str, body: &serde_json::Value, events: usize) -> u64 {
        use std::io::{Read, Write};
        let body = body.to_string();
        let mut sock = std::net::TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        write!(
            sock,
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut buf = [0u8; 4096];
        let mut seen = 0;
        while seen < events {
            let n = sock.read(&mut buf).unwrap();
            assert!(n > 0, "the stream ended early");
            seen += String::from_utf8_lossy(&buf[..n]).matches("data: ").count();
        }
        let cancelled = self.stats()["cancelled"].as_u64().unwrap_or(0);
        drop(sock);
        let st = self.wait_for("the job to be cancelled", |st| st["cancelled"].as_u64() == Some(cancelled + 1));
        st["last_cancelled_tokens"].as_u64().unwrap_or(u64::MAX)
    }

    pub fn stats(&self) -> serde_json::Value {
        self.request("GET", "/stats", &[], b"").json()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        unsafe { libc_kill(self.child.id() as i32, 15) };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `sig` to process `pid` (tests kill engine children with it).
pub fn signal(pid: u32, sig: i32) -> bool {
    unsafe { libc_kill(pid as i32, sig) == 0 }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    fn parse(raw: &[u8]) -> Self {
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(raw.len());
        let head = String::from_utf8_lossy(&raw[..split]).into_owned();
        let mut lines = head.lines();
        let status = lines.next().and_then(|l| l.split_whitespace().nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':').map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned())))
            .collect();
        let mut body = raw.get(split + 4..).unwrap_or(&[]).to_vec();
        if headers.iter().any(|(k, v)| k == "transfer-encoding" && v.contains("chunked")) {
            body = dechunk(&body);
        }
        Self { status, headers, body }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = b.windows(2).position(|w| w == b"\r\n") {
        let n = usize::from_str_radix(String::from_utf8_lossy(&b[..eol]).trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        let start = eol + 2;
        out.extend_from_slice(&b[start..(start + n).min(b.len())]);
        b = b.get(start + n + 2..).unwrap_or(&[]);
    }
    out
}

/// Serialises the tests that run MLX inside this test process. One MLX
/// runtime is shared by every thread of the test harness, and its process-wide
/// counters (active memory) and default stream are not meant for unrelated
/// graphs evaluated at once from several threads: an allocator assertion in
/// one test saw another test's frees. Tests that only spawn `host` need no
/// lock. A test that panicked while holding it does not poison the others.
pub fn mlx_exclusive() -> MlxExclusive {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    MlxExclusive(LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
}

/// The lock of [`mlx_exclusive`]. Released only once MLX has run what the
/// test queued (a step queued ahead still runs on the stream thread after
/// the last token is read), so neither the next test's counters nor the
/// process's exit meet it.
pub struct MlxExclusive(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl Drop for MlxExclusive {
    fn drop(&mut self) {
        host_engine::runtime::wait_for_streams();
    }
}

/// The in-tree plugins, loaded into this test process.
pub fn registry() -> std::sync::Arc<host_loader::Registry> {
    let info = plugin_api::HostInfo {
        abi_version: plugin_api::ABI_VERSION,
        host_version: "it".into(),
        mlx_version: "test".into(),
    };
    std::sync::Arc::new(host_loader::Registry::discover(&repo_root().join("plugins"), &info).expect("plugins folder"))
}

/// An engine in this process for a model folder under `models/`, in the
/// checkpoint's dtype, built from `cfg` otherwise.
pub fn engine(folder: &str, cfg: host_engine::EngineConfig) -> host_engine::Engine {
    let cfg = host_engine::EngineConfig { dtype: host_engine::DtypeChoice::Native, ..cfg };
    host_engine::Engine::load(&registry(), &model(folder), cfg).expect("engine")
}

/// Runs `req` alone as its plan on `engine` says (serial, `--batch 1`).
pub fn run_serial(
    engine: &host_engine::Engine,
    req: &host_engine::GenerateRequest,
    on_token: impl FnMut(&host_engine::TokenOut) -> host_engine::Flow,
) -> host_engine::GenerateResult {
    let plan = engine.plan(req, 1);
    host_engine::serial::generate(engine, req, &plan, on_token).expect("generation")
}

/// Deterministic concurrency through the engine's hold (`host serve
/// --debug-endpoints`): tests wait for conditions the server reports in
/// /stats, never for time to pass.
impl Server {
    /// Polls /stats until `ready` holds (fails after 120 s).
    pub fn wait_for(&self, what: &str, ready: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        let t = std::time::Instant::now();
        loop {
            let st = self.stats();
            if ready(&st) {
                return st;
            }
            assert!(t.elapsed().as_secs() < 120, "waited 120 s for {what}: {st}");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    fn debug(&self, path: &str) {
        let r = self.request("POST", path, &[], b"");
        assert_eq!(r.status, 200, "{path}: {} (start the server with --debug-endpoints)", r.text());
    }

    /// Holds the engine's loop at its next checkpoint.
    pub fn hold(&self) {
        self.debug("/debug/hold");
    }

    /// Lets the engine's loop run freely.
    pub fn release(&self) {
        self.debug("/debug/release");
    }

    /// POSTs every body together: they are queued while the engine is held
    /// and admitted in one iteration when it is released (a burst). They
    /// are queued in the order given, so each run gives every request the
    /// same row of the batch (a row's rounding can depend on its place in
    /// a batched kernel).
    pub fn post_burst(&self, path: &str, bodies: &[serde_json::Value]) -> Vec<serde_json::Value> {
        self.burst(path, bodies).iter().map(HttpResponse::json).collect()
    }

    /// `post_burst`'s whole responses (status, headers, a stream's text).
    pub fn burst(&self, path: &str, bodies: &[serde_json::Value]) -> Vec<HttpResponse> {
        self.hold();
        std::thread::scope(|sc| {
            let mut hs = Vec::new();
            for (i, b) in bodies.iter().enumerate() {
                hs.push(sc.spawn(move || self.post(path, b)));
                let n = i as u64 + 1;
                self.wait_for("the burst's next request to be queued", |st| st["queued"].as_u64() == Some(n));
            }
            self.release();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// POSTs the bodies so that each joins a live batch: body i is queued
    /// while the engine is held, then the engine runs `steps` decode steps
    /// (admitting it) and holds again before body i + 1 is queued. The
    /// earlier rows are still decoding when a later one joins as long as
    /// their `max_tokens` exceed `steps` times the bodies after them.
    pub fn post_joining(&self, path: &str, bodies: &[serde_json::Value], steps: u64) -> Vec<serde_json::Value> {
        self.hold();
        std::thread::scope(|sc| {
            let mut hs = Vec::new();
            for b in bodies {
                hs.push(sc.spawn(move || self.post(path, b).json()));
                self.wait_for("the request to be queued", |st| st["queued"].as_u64() == Some(1));
                let r = self.request("POST", &format!("/debug/release?steps={steps}"), &[], b"");
                assert_eq!(r.status, 200, "{}", r.text());
                // The engine holds again after its steps, or as soon as it
                // has nothing to step.
                self.wait_for("the engine to run its steps and hold", |st| {
                    st["hold"]["parked"] == true && st["hold"]["held"] == true && st["queued"] == 0
                });
            }
            self.release();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }
}

/// Chi-square two-sample statistic over cells of counts `[a, b]` (equal
/// totals), and its critical value at 99.9% (z = 3.09, Wilson-Hilferty).
pub fn chi2_two_sample(cells: &[[f64; 2]]) -> (f64, f64) {
    let total = [cells.iter().map(|c| c[0]).sum::<f64>(), cells.iter().map(|c| c[1]).sum::<f64>()];
    let mut chi2 = 0.0;
    for c in cells {
        let row = c[0] + c[1];
        for k in 0..2 {
            let e = row * total[k] / (total[0] + total[1]);
            chi2 += (c[k] - e).powi(2) / e;
        }
    }
    let df = (cells.len() - 1) as f64;
    let z = 3.09;
    (chi2, df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3))
}

/// Draws `n` samples from `reference` and from `speculative` (seeds 0.. and
/// 10000..; `sample` returns a joint outcome and the response's
/// `usage.speculation`), asserts each speculative answer verified by
/// rejection sampling and that both sets of outcomes come from one
/// distribution (chi-square at 99.9%); returns the drafted and accepted
/// totals.
pub fn rejection_keeps_the_distribution<T: Ord + Clone + std::fmt::Debug>(
    reference: &Server,
    speculative: &Server,
    n: u64,
    sample: impl Fn(&Server, u64) -> (T, serde_json::Value),
    what: &str,
) -> (u64, u64) {
    let mut counts: std::collections::BTreeMap<T, [f64; 2]> = Default::default();
    for seed in 0..n {
        counts.entry(sample(reference, seed).0).or_default()[0] += 1.0;
    }
    let (mut drafted, mut accepted) = (0, 0);
    for seed in 0..n {
        let (t, sp) = sample(speculative, 10_000 + seed);
        counts.entry(t).or_default()[1] += 1.0;
        assert_eq!(sp["rejection_sampling"], true, "{what}: the drafter returned no probabilities: {sp}");
        drafted += sp["drafted"].as_u64().unwrap();
        accepted += sp["accepted"].as_u64().unwrap();
    }
    let cells: Vec<[f64; 2]> = counts.values().copied().collect();
    let (chi2, crit) = chi2_two_sample(&cells);
    assert!(chi2 < crit, "{what}: distributions differ: chi2 {chi2:.1} >= {crit:.1}; counts {counts:?}");
    eprintln!("{what}: accepted {accepted} of {drafted}; chi2 {chi2:.1} < {crit:.1} over {} cells", cells.len());
    (drafted, accepted)
}
