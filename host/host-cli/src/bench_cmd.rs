//! `host bench`: in-process throughput of one model folder at several batch
//! sizes, as mlx_lm.benchmark measures it: B requests of a random P-token
//! prompt arrive together (held, then released: one cohort prefill), each
//! generates G tokens greedily without stopping at EOS. Per B: prefill
//! tokens/s (B*P over the time to the last first token), decode tokens/s
//! (B*(G-1) over the time after it), time per decode step, and MLX's peak
//! memory. Runs through the same worker and batch scheduler as `host serve`.
//! `--ragged` gives the rows prompts of different lengths (from P down to
//! about P/2), so the batch is left-padded and decodes with per-row
//! positions and masks, as a server's rows of different conversations do.

use anyhow::{bail, Result};
use host_engine::admission::gib;
use host_engine::plan::Planner;
use host_engine::worker::Worker;
use host_engine::{Engine, Event, Flow, GenerateRequest, Job};
use serde_json::json;
use std::sync::mpsc;
use std::time::Instant;

pub struct BenchArgs {
    pub prompt_len: usize,
    pub gen_len: usize,
    pub batches: Vec<usize>,
    pub trials: usize,
    pub json: bool,
    pub ragged: bool,
    /// MLX's buffer cache limit; `None`: `host serve`'s default.
    pub mlx_cache_bytes: Option<u64>,
}

/// Prompt length of row `i` of `batch`: all `p`, or with `ragged` spread
/// evenly from `p` down towards `p / 2`.
fn prompt_len_of(p: usize, i: usize, batch: usize, ragged: bool) -> usize {
    if ragged {
        (p - i * (p / 2) / batch.max(1)).max(1)
    } else {
        p
    }
}

/// One batch size's figures (the median trial's, by decode rate).
struct Row {
    batch: usize,
    prompt_tokens: usize,
    prefill_tps: f64,
    decode_tps: f64,
    step_ms: f64,
    peak: usize,
}

/// A prompt of `n` ids spread over the vocabulary, different per `salt`
/// (nothing a prefix cache or earlier trial has seen).
fn prompt(n: usize, vocab: u32, salt: u64) -> Vec<u32> {
    let mut x = salt.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % (vocab.saturating_sub(20).max(1) as u64)) as u32 + 10
        })
        .collect()
}

/// B requests released together; returns (prefill s, decode s) measured
/// from the release.
/// How far one benchmark request got.
enum Reached {
    First(Instant),
    Done(Instant),
    Failed(String),
}

fn trial(
    worker: &Worker,
    planner: &Planner,
    shape: (usize, usize, bool),
    batch: usize,
    vocab: u32,
    salt: u64,
) -> Result<(f64, f64)> {
    let (prompt_len, gen_len, ragged) = shape;
    let (tx, rx) = mpsc::channel::<Reached>();
    worker.hold();
    for i in 0..batch {
        let tx = tx.clone();
        let mut first = true;
        let request = GenerateRequest {
            prompt: prompt(prompt_len_of(prompt_len, i, batch, ragged), vocab, salt * 1000 + i as u64),
            max_tokens: gen_len,
            stop_on_eos: false,
            ..Default::default()
        };
        let on_event = Box::new(move |ev: Event| {
            match ev {
                Event::Token(_) if first => {
                    first = false;
                    let _ = tx.send(Reached::First(Instant::now()));
                }
                Event::Done(_) => {
                    let _ = tx.send(Reached::Done(Instant::now()));
                }
                Event::Failed(e) => {
                    let _ = tx.send(Reached::Failed(format!("request {i}: {e}")));
                }
                Event::Token(_) => {}
            }
            Flow::Continue
        });
        // The plan a server would give it.
        let plan = planner.plan(&request);
        if worker.submit(Job { request, plan, on_event }).is_err() {
            worker.release(None);
            bail!("the engine refused the benchmark's requests");
        }
    }
    drop(tx);
    let released = Instant::now();
    worker.release(None);
    let (mut last_first, mut last_done, mut done) = (released, released, 0);
    let mut failures = Vec::new();
    for reached in rx {
        match reached {
            Reached::First(at) => last_first = last_first.max(at),
            Reached::Done(at) => {
                done += 1;
                last_done = last_done.max(at);
            }
            Reached::Failed(e) => failures.push(e),
        }
    }
    // A failed request has no timings: the trial reports the failure, never
    // figures that leave it out.
    if let Some(first) = failures.first() {
        bail!("{} of {batch} benchmark requests failed; {first}", failures.len());
    }
    if done != batch {
        bail!("{} of {batch} benchmark requests ended", done);
    }
    Ok(((last_first - released).as_secs_f64(), (last_done - last_first).as_secs_f64()))
}

/// `ranks` > 1: this process is one rank of `--tp`; rank 0 runs the
/// benchmark through a lockstep worker, the others follow it.
pub fn run(engine: Engine, a: BenchArgs, ranks: usize) -> Result<()> {
    if a.prompt_len == 0 || a.gen_len < 2 || a.batches.is_empty() || a.batches.contains(&0) {
        bail!("--prompt-len must be >= 1, --gen-len >= 2, and every --batch size >= 1");
    }
    // The buffer cache a server runs with, so the figures are the server's.
    let limit = a.mlx_cache_bytes.unwrap_or_else(|| {
        host_engine::admission::default_mlx_cache_limit(host_engine::admission::default_memory_budget())
    });
    host_engine::runtime::set_cache_limit(limit as usize);
    let vocab = engine.model().plan.vocab_size;
    let most = *a.batches.iter().max().expect("checked non-empty");
    let planner = engine.planner(most.max(2));
    let worker = if ranks > 1 {
        let lock = host_engine::lockstep::Lockstep::current()?;
        if lock.rank() > 0 {
            host_engine::worker::follow(&engine, most.max(2), None, lock);
            return Ok(());
        }
        Worker::start_lockstep(engine, most * 2, most.max(2), None, lock)
    } else {
        Worker::start(engine, most * 2, most.max(2), None)
    };
    let mut rows = Vec::new();
    for (k, &b) in a.batches.iter().enumerate() {
        // One untimed trial of the timed shape first, as mlx_lm.benchmark
        // warms up: kernels compiled and attention plans made for these
        // lengths and this batch size stay outside the figures (a length
        // new to the process is bench_generate.py's subject).
        trial(&worker, &planner, (a.prompt_len, a.gen_len, a.ragged), b, vocab, 7 + k as u64)?;
        let mut trials = Vec::new();
        for t in 0..a.trials.max(1) {
            host_engine::runtime::reset_peak_memory();
            let (prefill_s, decode_s) =
                trial(&worker, &planner, (a.prompt_len, a.gen_len, a.ragged), b, vocab, 100 + (k * 100 + t) as u64)?;
            let prompt_tokens: usize = (0..b).map(|i| prompt_len_of(a.prompt_len, i, b, a.ragged)).sum();
            trials.push(Row {
                batch: b,
                prompt_tokens,
                prefill_tps: prompt_tokens as f64 / prefill_s.max(1e-9),
                decode_tps: (b * (a.gen_len - 1)) as f64 / decode_s.max(1e-9),
                step_ms: decode_s * 1e3 / (a.gen_len - 1) as f64,
                peak: host_engine::runtime::peak_memory(),
            });
        }
        trials.sort_by(|x, y| x.decode_tps.total_cmp(&y.decode_tps));
        rows.push(trials.swap_remove(trials.len() / 2));
    }
    if a.json {
        let out: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({
                    "batch": r.batch,
                    "prompt_tokens": r.prompt_tokens,
                    "prefill_tokens_per_s": r.prefill_tps,
                    "decode_tokens_per_s": r.decode_tps,
                    "step_ms": r.step_ms,
                    "peak_memory_bytes": r.peak,
                    "mlx_cache_limit_bytes": limit,
                })
            })
            .collect();
        println!("{}", serde_json::to_string(&out)?);
    } else {
        let lengths = if a.ragged {
            format!("{} down to about {}", a.prompt_len, a.prompt_len / 2)
        } else {
            a.prompt_len.to_string()
        };
        println!(
            "prompt {lengths} tokens, {} generated, greedy, median of {} trials, MLX buffer cache bound to {:.3} GiB",
            a.gen_len,
            a.trials,
            gib(limit)
        );
        println!("| batch | prefill tok/s | decode tok/s | step ms | peak memory GiB |");
        println!("|---|---|---|---|---|");
        for r in &rows {
            println!(
                "| {} | {:.1} | {:.1} | {:.2} | {:.3} |",
                r.batch,
                r.prefill_tps,
                r.decode_tps,
                r.step_ms,
                gib(r.peak as u64)
            );
        }
    }
    Ok(())
}
