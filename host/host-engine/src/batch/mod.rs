//! Continuous batching: requests join a running batch between decode steps
//! and leave it independently.
//!
//! Each iteration of the loop (one "safe unit" of work):
//! 1. admit queued jobs up to the batch limit (a job whose plan is serial
//!    waits until the batch drains, then runs alone: serial and batched work
//!    never share the device);
//! 2. advance prefill by one chunk: joiners that arrived together and have
//!    nothing cached prefill as one left-padded cohort (`cohort.rs`);
//!    otherwise ONE joiner advances on its own 1-row caches. A long prompt
//!    thus stalls running rows for at most one chunk. Rows whose prompt (all
//!    but the last token) is in merge into the batch caches (the layouts
//!    left-pad rows to a common length);
//! 3. one decode step over every row: input `[B, 1]` (each row's pending
//!    token), per-row logits processors, logprobs and sampler (own seed and
//!    key), then per-row stop checks; finished or cancelled rows are filtered
//!    out of the caches.
//!
//! A row's tokens are computed as in the serial loop: its prompt minus the
//! last token is prefilled, then the last token produces the first logits.

use crate::admission::{Budget, MemoryModel};
use crate::cohort::{self, Cohort};
use crate::engine::{Engine, EngineError};
use crate::generate::{token_array, Finish, Flow, GenerateResult, TokenOut};
use crate::plan::{resolve_execution, Mechanism, ServerFeatures};
use crate::sampling::{top_logprobs, Sampler};
use crate::speculative::clock::BatchClock;
use crate::worker::{Event, Job, Stats};
use mlx_rs::Array;
use plugin_api::abi_stable::std_types::{RSlice, RVec};
use plugin_api::CacheBox;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

struct Row {
    job: Job,
    cached: usize,
    sampler: Sampler,
    history: Vec<u32>,
    out: Vec<u32>,
    pending: u32,
    eos: Vec<u32>,
    start: Instant,
    first_at: Option<Instant>,
    stopped_by_caller: bool,
    /// Speculative rounds inside the batch (`scheduler_spec.rs`).
    spec: Option<RowSpec>,
}

struct Joiner {
    job: Job,
    caches: Vec<CacheBox>,
    /// Prompt tokens (of all but the last) already in `caches`.
    done: usize,
    /// Of those, how many came from the prefix cache.
    cached: usize,
    start: Instant,
}

#[path = "scheduler_spec.rs"]
mod spec;
use spec::RowSpec;

/// Batched decode steps between clearings of MLX's buffer cache.
const CLEAR_CACHE_EVERY: u32 = 512;

enum Outcome {
    Continue,
    Done(Finish),
}

pub struct Scheduler<'a> {
    engine: &'a Engine,
    stats: Arc<Stats>,
    shutdown: Arc<AtomicBool>,
    limit: usize,
    rows: Vec<Row>,
    batch: Option<Vec<CacheBox>>,
    joining: VecDeque<Joiner>,
    /// Joiners prefilling together, and their shared caches.
    cohort: Option<(Cohort, Vec<Joiner>)>,
    /// False once a layout refused padded rows: joiners go one at a time.
    padded_prefill: bool,
    /// A job whose plan is serial, waiting for the batch to drain.
    serial_next: Option<Job>,
    /// A job that fits the memory budget only once running rows finish.
    waiting: Option<Job>,
    memory: Option<(MemoryModel, Budget)>,
    /// Decode steps since MLX's buffer cache was last cleared.
    steps_since_clear: u32,
    /// Plain and speculative step times, for the batched cost rule.
    spec_clock: BatchClock,
    /// Per batch cache: whether its layout rolls back by snapshot and replay.
    replay_layers: Vec<bool>,
}

impl<'a> Scheduler<'a> {
    pub fn new(
        engine: &'a Engine,
        stats: Arc<Stats>,
        shutdown: Arc<AtomicBool>,
        limit: usize,
        memory: Option<(MemoryModel, Budget)>,
    ) -> Self {
        Self {
            engine,
            stats,
            shutdown,
            limit,
            rows: Vec::new(),
            batch: None,
            joining: VecDeque::new(),
            cohort: None,
            padded_prefill: true,
            serial_next: None,
            waiting: None,
            memory,
            steps_since_clear: 0,
            spec_clock: BatchClock::default(),
            replay_layers: engine.replay_layers(),
        }
    }

    fn idle(&self) -> bool {
        self.rows.is_empty()
            && self.joining.is_empty()
            && self.cohort.is_none()
            && self.serial_next.is_none()
            && self.waiting.is_none()
    }

    /// Every job in flight: running rows, joiners, cohort members.
    fn jobs(&self) -> impl Iterator<Item = &Job> {
        let cohort = self.cohort.iter().flat_map(|(_, m)| m.iter().map(|j| &j.job));
        self.rows.iter().map(|r| &r.job).chain(self.joining.iter().map(|j| &j.job)).chain(cohort)
    }

    /// KV and transient bytes of the work in flight, plus `extra` if given:
    /// batched rows as wide as the widest, in whole growth steps.
    fn committed(&self, m: &MemoryModel, extra: Option<&Job>) -> (u64, u64) {
        let (mut rows, mut widest, mut transient) = (0u64, 0u64, 0u64);
        for job in self.jobs().chain(extra) {
            let r = &job.request;
            let end = (r.prompt.len() + r.max_tokens) as u64;
            rows += 1;
            widest = widest.max(end);
            transient = transient.max(m.need(r.prompt.len() as u64, end).transient);
        }
        (m.batch_kv(rows, widest, host_loader::compose::KV_STEP as u64), transient)
    }

    /// Whether a job fits beside what runs now, by the layouts' reservation
    /// and by the bytes MLX really holds (minus the prefix cache, which
    /// gives its bytes back). Whatever fits alone runs when nothing else does.
    fn fits(&self, job: &Job) -> bool {
        let Some((m, b)) = &self.memory else { return true };
        if self.jobs().next().is_none() {
            return true;
        }
        let (kv, transient) = self.committed(m, Some(job));
        let r = &job.request;
        let need = m.need(r.prompt.len() as u64, (r.prompt.len() + r.max_tokens) as u64);
        let held = crate::runtime::active_memory() as u64;
        let real = held.saturating_sub(self.engine.prefix_counters().bytes) + need.kv + need.transient;
        m.fits_now(b, kv, transient) && real + b.mlx_cache_bytes <= b.memory_bytes
    }

    /// Bounds the prefix cache by what the budget leaves beside the work in
    /// flight (reserved, and really held by MLX).
    fn bound_prefix_cache(&self) {
        let Some((m, b)) = &self.memory else { return };
        let (kv, transient) = self.committed(m, None);
        let held = (crate::runtime::active_memory() as u64).saturating_sub(self.engine.prefix_counters().bytes);
        let real_room = b.memory_bytes.saturating_sub(held + b.mlx_cache_bytes + transient);
        if self.engine.prefix_shrink(m.prefix_room(b, kv, transient).min(real_room)) {
            self.stats.sync_prefix(self.engine);
        }
    }

    /// Runs until the queue is closed and all work is done.
    pub fn run(mut self, rx: Receiver<Job>) {
        let mut open = true;
        loop {
            if self.idle() {
                if !open {
                    return;
                }
                // Between requests: freed buffers go back (mlx-lm clears its
                // buffer cache between requests too).
                crate::runtime::clear_cache();
                self.steps_since_clear = 0;
                match rx.recv() {
                    Ok(job) => self.admit(job),
                    Err(_) => return,
                }
            }
            if let Some(job) = self.waiting.take() {
                if self.fits(&job) {
                    self.start(job);
                } else {
                    self.waiting = Some(job);
                }
            }
            while open
                && self.serial_next.is_none()
                && self.waiting.is_none()
                && self.rows.len() + self.joining.len() + self.cohort_rows() < self.limit
            {
                match rx.try_recv() {
                    Ok(job) => self.admit(job),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            if self.rows.is_empty() && self.joining.is_empty() && self.cohort.is_none() {
                if let Some(job) = self.serial_next.take() {
                    self.run_serial(job);
                }
                continue;
            }
            // A joiner that fails is answered with its error; the batch goes on.
            self.advance_joiner();
            self.bound_prefix_cache();
            if !self.rows.is_empty() {
                if let Err(e) = self.step() {
                    // A failed batch step fails every row in it (joiners stay).
                    for mut r in self.rows.drain(..) {
                        self.stats.active.fetch_sub(1, Ordering::SeqCst);
                        self.stats.failed.fetch_add(1, Ordering::SeqCst);
                        let _ = (r.job.on_event)(Event::Failed(EngineError::Model(e.to_string())));
                    }
                    self.batch = None;
                }
            }
        }
    }

    fn admit(&mut self, mut job: Job) {
        self.stats.queued.fetch_sub(1, Ordering::SeqCst);
        if self.shutdown.load(Ordering::SeqCst) {
            let _ = (job.on_event)(Event::Failed(EngineError::InvalidRequest("the server is shutting down".into())));
            return;
        }
        let features = ServerFeatures {
            batch_limit: self.limit,
            speculation_enabled: self.engine.drafter.is_some(),
            ..Default::default()
        };
        let plan = resolve_execution(&self.engine.facts(&job.request), &self.engine.capabilities(), &features);
        if plan.mechanism == Mechanism::Serial {
            self.serial_next = Some(job);
            return;
        }
        if let Err(e) = self.engine.check_request(&job.request) {
            self.stats.failed.fetch_add(1, Ordering::SeqCst);
            let _ = (job.on_event)(Event::Failed(e));
            return;
        }
        if !self.fits(&job) {
            // It fits alone (the server refused what never fits): wait for rows to finish.
            self.waiting = Some(job);
            return;
        }
        self.start(job);
    }

    fn start(&mut self, job: Job) {
        self.stats.requests.fetch_add(1, Ordering::SeqCst);
        self.stats.active.fetch_add(1, Ordering::SeqCst);
        self.stats.prompt_tokens.fetch_add(job.request.prompt.len() as u64, Ordering::SeqCst);
        match self.engine.new_caches() {
            Ok(mut caches) => {
                let start = Instant::now();
                let cached = self.engine.prefix_take(&job.request.prompt, &mut caches);
                self.joining.push_back(Joiner { job, caches, done: cached, cached, start })
            }
            Err(e) => self.fail_job(job, e),
        }
    }

    fn fail_job(&mut self, mut job: Job, e: EngineError) {
        self.stats.active.fetch_sub(1, Ordering::SeqCst);
        self.stats.failed.fetch_add(1, Ordering::SeqCst);
        let _ = (job.on_event)(Event::Failed(e));
    }

    /// A serial-only job, alone on the device (the batch has drained).
    fn run_serial(&mut self, job: Job) {
        crate::worker::run_one(self.engine, job, &self.stats, &self.shutdown);
    }

    fn cohort_rows(&self) -> usize {
        self.cohort.as_ref().map_or(0, |(_, m)| m.len())
    }

    /// One prefill chunk: of the cohort when there is (or can be) one, else
    /// of the first joiner. Rows whose prompt is in join the batch.
    fn advance_joiner(&mut self) {
        if self.cohort.is_none() {
            self.form_cohort();
        }
        if self.cohort.is_some() {
            return self.advance_cohort();
        }
        let Some(mut j) = self.joining.pop_front() else { return };
        let head = j.job.request.prompt.len() - 1;
        let step = self.engine.prefill_step.max(1);
        if j.done < head {
            let end = (j.done + step).min(head);
            if let Err(e) = self.engine.prefill(&j.job.request.prompt[j.done..end], &mut j.caches) {
                return self.fail_job(j.job, e);
            }
            j.done = end;
        }
        if j.done < head {
            self.joining.push_front(j);
            return;
        }
        // The prompt (but its last token) is in: the row joins the batch.
        if j.done > j.cached {
            self.engine.prefix_put(&j.job.request.prompt[..head], &j.caches);
        }
        if let Err(e) = self.merge(&mut j.caches) {
            return self.fail_job(j.job, e);
        }
        self.push_row(j);
    }

    /// Groups joiners that have nothing prefilled or cached (a burst of new
    /// requests) into a cohort, unless a joiner is already mid-prefill.
    fn form_cohort(&mut self) {
        if !self.padded_prefill || self.joining.front().is_some_and(|j| j.done > 0) {
            return;
        }
        let fresh: Vec<usize> =
            (0..self.joining.len()).filter(|&i| self.joining[i].done == 0 && self.joining[i].cached == 0).collect();
        let heads: Vec<usize> = fresh.iter().map(|&i| self.joining[i].job.request.prompt.len() - 1).collect();
        let picked: Vec<usize> = cohort::choose(&heads).into_iter().map(|p| fresh[p]).collect();
        if picked.is_empty() {
            return;
        }
        let mut members: Vec<Joiner> =
            picked.iter().rev().map(|&i| self.joining.remove(i).expect("index in range")).collect();
        members.reverse();
        let heads = members.iter().map(|j| j.job.request.prompt[..j.job.request.prompt.len() - 1].to_vec()).collect();
        match Cohort::start(self.engine, heads) {
            Ok(Some(c)) => self.cohort = Some((c, members)),
            Ok(None) => {
                self.padded_prefill = false;
                for j in members.into_iter().rev() {
                    self.joining.push_front(j);
                }
            }
            Err(e) => self.fail_all(members, &e),
        }
    }

    fn advance_cohort(&mut self) {
        let Some((mut c, members)) = self.cohort.take() else { return };
        match c.advance(self.engine) {
            Ok(false) => self.cohort = Some((c, members)),
            Ok(true) => {
                if let Err(e) = self.land_cohort(c, &members) {
                    return self.fail_all(members, &e);
                }
                self.stats.cohorts.fetch_add(1, Ordering::Relaxed);
                self.stats.cohort_rows.fetch_add(members.len() as u64, Ordering::Relaxed);
                for j in members {
                    self.push_row(j);
                }
            }
            Err(e) => self.fail_all(members, &e),
        }
    }

    /// A prefilled cohort's rows into the batch caches (the cohort's caches
    /// become the batch when there is none), and into the prefix cache.
    fn land_cohort(&mut self, c: Cohort, members: &[Joiner]) -> Result<(), EngineError> {
        if self.engine.prefix.lock().map(|p| p.enabled()).unwrap_or(false) {
            for r in 0..members.len() {
                self.engine.prefix_insert(
                    c.head(r).to_vec(),
                    c.row_state(r)?,
                    c.caches.iter().all(|l| l.is_trimmable()),
                );
            }
        }
        if self.batch.is_none() {
            self.batch = Some(c.caches);
            return Ok(());
        }
        let batch = self.batch.as_mut().unwrap();
        for (b, layer) in batch.iter_mut().zip(&c.caches) {
            let mut states = RVec::new();
            for r in 0..members.len() {
                states.push(
                    layer
                        .extract_row(r as u32)
                        .into_result()
                        .map_err(|e| EngineError::Model(format!("extract_row: {e}")))?,
                );
            }
            b.merge_rows(states).into_result().map_err(|e| EngineError::Model(format!("merge_rows: {e}")))?;
        }
        Ok(())
    }

    fn fail_all(&mut self, members: Vec<Joiner>, e: &EngineError) {
        for j in members {
            self.fail_job(j.job, EngineError::Model(e.to_string()));
        }
    }

    /// A joiner whose prompt is in its batch row becomes a running row.
    fn push_row(&mut self, j: Joiner) {
        let req = &j.job.request;
        let sampler = match Sampler::new(req.params.clone()) {
            Ok(s) => s,
            Err(e) => return self.fail_job(j.job, e.into()),
        };
        let eos = if req.stop_on_eos { self.engine.eos_ids() } else { Vec::new() };
        let pending = *req.prompt.last().unwrap();
        let spec = RowSpec::for_request(self.engine, req);
        self.rows.push(Row {
            history: req.prompt.clone(),
            out: Vec::new(),
            pending,
            eos,
            sampler,
            start: j.start,
            first_at: None,
            stopped_by_caller: false,
            cached: j.cached,
            spec,
            job: j.job,
        });
    }

    /// Appends a 1-row cache set to the batch caches, layer by layer.
    fn merge(&mut self, single: &mut [CacheBox]) -> Result<(), EngineError> {
        if self.batch.is_none() {
            self.batch = Some(self.engine.model.new_caches(0)?);
        }
        let batch = self.batch.as_mut().unwrap();
        for (b, s) in batch.iter_mut().zip(single.iter_mut()) {
            let state = s.export_state().into_result().map_err(|e| EngineError::Model(format!("export_state: {e}")))?;
            let mut v = RVec::new();
            v.push(state);
            b.merge_rows(v).into_result().map_err(|e| EngineError::Model(format!("merge_rows: {e}")))?;
        }
        Ok(())
    }

    /// One decode step over every row.
    fn step(&mut self) -> Result<(), EngineError> {
        let started = std::time::Instant::now();
        self.steps_since_clear += 1;
        if self.steps_since_clear >= CLEAR_CACHE_EVERY {
            // As mlx-lm's batch generator: freed buffers go back every 512 steps.
            crate::runtime::clear_cache();
            self.steps_since_clear = 0;
        }
        if let Some(drafts) = self.draft_rows() {
            return self.spec_step(drafts, started);
        }
        let ids: Vec<u32> = self.rows.iter().map(|r| r.pending).collect();
        self.stats.decode_steps.fetch_add(1, Ordering::Relaxed);
        self.stats.max_batch_rows.fetch_max(ids.len() as u64, Ordering::Relaxed);
        let input = token_array(&ids).reshape(&[ids.len() as i32, 1])?;
        let batch = self.batch.as_mut().expect("rows have batch caches");
        let logits = self.engine.forward(&input, batch, true)?;
        // Rows without penalties share one logprobs computation; when every
        // row is greedy, one argmax picks all tokens (per-row results equal
        // the per-row computation: each reduction runs within its row).
        let plain = self.rows.iter().all(|r| !r.sampler.params.has_penalties());
        let all_lp = if plain { Some(Sampler::logprobs(&logits)?) } else { None };
        let mut lps = Vec::with_capacity(self.rows.len());
        let y = match &all_lp {
            Some(lp) if self.rows.iter().all(|r| r.sampler.params.is_greedy()) => {
                for i in 0..self.rows.len() as i32 {
                    use mlx_rs::ops::indexing::IndexOp;
                    lps.push(lp.index(i..i + 1));
                }
                mlx_rs::ops::indexing::argmax_axis(lp, -1, None)?
            }
            _ => {
                let mut ys = Vec::with_capacity(self.rows.len());
                for (i, r) in self.rows.iter_mut().enumerate() {
                    use mlx_rs::ops::indexing::IndexOp;
                    let lp = match &all_lp {
                        Some(all) => all.index(i as i32..i as i32 + 1),
                        None => {
                            Sampler::logprobs(&r.sampler.process(logits.index(i as i32..i as i32 + 1), &r.history)?)?
                        }
                    };
                    ys.push(r.sampler.sample(&lp)?);
                    lps.push(lp);
                }
                mlx_rs::ops::concatenate(&ys, 0)?
            }
        };
        let y = y.as_dtype(mlx_rs::Dtype::Uint32)?;
        y.eval()?;
        let tokens: Vec<u32> = y.as_slice::<u32>().to_vec();
        self.spec_clock.plain(self.rows.len(), started.elapsed().as_secs_f64());
        if spec::trace_steps() {
            eprintln!("batch plain rows {} ms {:.2}", self.rows.len(), started.elapsed().as_secs_f64() * 1e3);
        }
        let mut keep: Vec<u32> = Vec::new();
        let mut finished = Vec::new();
        for (i, (r, lp)) in self.rows.iter_mut().zip(lps).enumerate() {
            match handle_token(r, tokens[i], &lp, &self.stats, &self.shutdown)? {
                Outcome::Continue => keep.push(i as u32),
                Outcome::Done(f) => finished.push((i, f)),
            }
        }
        self.retire(finished, keep)
    }

    /// Removes finished rows (answering them) and filters the batch caches
    /// down to the rows in `keep`.
    fn retire(&mut self, finished: Vec<(usize, Finish)>, keep: Vec<u32>) -> Result<(), EngineError> {
        if finished.is_empty() {
            return Ok(());
        }
        for (i, f) in finished.into_iter().rev() {
            self.keep_final_state(i);
            let r = self.rows.remove(i);
            finish_row(r, f, &self.stats, self.engine);
        }
        let batch = self.batch.as_mut().unwrap();
        if keep.is_empty() {
            self.batch = None;
        } else {
            for c in batch.iter_mut() {
                c.filter_rows(RSlice::from_slice(&keep))
                    .into_result()
                    .map_err(|e| EngineError::Model(format!("filter_rows: {e}")))?;
            }
        }
        Ok(())
    }
}

impl Scheduler<'_> {
    /// Offers a finishing row's state to the prefix cache (multi-turn reuse).
    fn keep_final_state(&mut self, i: usize) {
        if !self.engine.prefix.lock().map(|p| p.enabled()).unwrap_or(false) {
            return;
        }
        let Some(batch) = self.batch.as_ref() else { return };
        let states: Option<Vec<_>> = batch.iter().map(|c| c.extract_row(i as u32).into_result().ok()).collect();
        let Some(states) = states else { return };
        let held = states.first().map(|s| s.offset as usize).unwrap_or(0);
        let known = &self.rows[i].history;
        if held > 0 && held <= known.len() {
            self.engine.prefix_insert(known[..held].to_vec(), states, batch.iter().all(|c| c.is_trimmable()));
        }
    }
}

/// The serial loop's per-token rules: EOS ends without emitting; the caller
/// may stop; `max_tokens` ends with `length`.
fn handle_token(
    r: &mut Row,
    id: u32,
    lp: &Array,
    stats: &Stats,
    shutdown: &AtomicBool,
) -> Result<Outcome, EngineError> {
    r.first_at.get_or_insert_with(Instant::now);
    if r.eos.contains(&id) {
        return Ok(Outcome::Done(Finish::Stop));
    }
    let (logprob, top) = match r.job.request.logprobs {
        Some(k) => {
            use mlx_rs::ops::indexing::IndexOp;
            let chosen = lp.index((0, id as i32)).as_dtype(mlx_rs::Dtype::Float32)?.try_item_cast::<f32>()?;
            (Some(chosen), top_logprobs(lp, k)?)
        }
        None => (None, Vec::new()),
    };
    r.out.push(id);
    r.history.push(id);
    r.pending = id;
    stats.generated_tokens.fetch_add(1, Ordering::SeqCst);
    let flow = (r.job.on_event)(Event::Token(TokenOut { id, logprob, top }));
    if flow == Flow::Stop || shutdown.load(Ordering::SeqCst) {
        r.stopped_by_caller = true;
        return Ok(Outcome::Done(Finish::Stop));
    }
    if r.out.len() >= r.job.request.max_tokens {
        return Ok(Outcome::Done(Finish::Length));
    }
    Ok(Outcome::Continue)
}

fn finish_row(mut r: Row, finish: Finish, stats: &Stats, engine: &Engine) {
    stats.active.fetch_sub(1, Ordering::SeqCst);
    if r.stopped_by_caller {
        stats.cancelled.fetch_add(1, Ordering::SeqCst);
        stats.last_cancelled_tokens.store(r.out.len() as u64, Ordering::SeqCst);
    } else {
        stats.completed.fetch_add(1, Ordering::SeqCst);
    }
    let first = r.first_at.unwrap_or_else(Instant::now);
    let result = GenerateResult {
        prompt_tokens: r.job.request.prompt.len(),
        cached_tokens: r.cached,
        prefill_s: (first - r.start).as_secs_f64(),
        decode_s: first.elapsed().as_secs_f64(),
        tokens: std::mem::take(&mut r.out),
        finish,
        speculation: r.spec.take().map(|s| s.stats),
    };
    stats.record(&result, engine);
    let _ = (r.job.on_event)(Event::Done(result));
}
