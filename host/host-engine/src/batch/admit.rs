//! Taking jobs in: the plan's mechanism (a serial plan waits for the batch
//! to drain), the request's checks, memory (reserved as the layouts hold
//! batched rows, and by what MLX really holds), and the prefix cache, which
//! gets what the budget leaves beside the work in flight.

use super::state::{Joiner, Scheduler};
use crate::admission::MemoryModel;
use crate::error::EngineError;
use crate::job::{Event, Job};
use crate::plan::Mechanism;
use std::sync::atomic::Ordering;
use std::time::Instant;

impl Scheduler<'_> {
    pub(super) fn admit(&mut self, mut job: Job) {
        self.stats.queued.fetch_sub(1, Ordering::SeqCst);
        if self.own_shutdown().load(Ordering::SeqCst) {
            let _ = (job.on_event)(Event::Failed(EngineError::InvalidRequest("the server is shutting down".into())));
            return;
        }
        if job.plan.mechanism == Mechanism::Serial {
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

    /// Starts prefilling a job's prompt on its own 1-row caches, from the
    /// prefix cache where its plan allows.
    pub(super) fn start(&mut self, job: Job) {
        self.stats.requests.fetch_add(1, Ordering::SeqCst);
        self.stats.active.fetch_add(1, Ordering::SeqCst);
        self.stats.prompt_tokens.fetch_add(job.request.prompt.len() as u64, Ordering::SeqCst);
        match self.engine.new_caches() {
            Ok(mut caches) => {
                let start = Instant::now();
                let cached = if job.plan.prompt_cache {
                    let fresh = || self.engine.new_caches().ok();
                    self.engine.prefix().take(&job.request.prompt, &mut caches, &fresh)
                } else {
                    0
                };
                self.joining.push_back(Joiner { job, caches, done: cached, cached, start, states: None })
            }
            Err(e) => self.fail_job(job, e),
        }
    }

    pub(super) fn fail_job(&mut self, mut job: Job, e: EngineError) {
        self.stats.active.fetch_sub(1, Ordering::SeqCst);
        self.stats.failed.fetch_add(1, Ordering::SeqCst);
        let _ = (job.on_event)(Event::Failed(e));
    }

    /// KV and transient bytes of the work in flight, plus `extra` if given:
    /// batched rows as wide as the widest, in whole growth steps; layers in
    /// a block pool by its blocks (`MemoryModel::paged_kv`).
    fn committed(&self, m: &MemoryModel, extra: Option<&Job>) -> (u64, u64) {
        let mut transient = 0u64;
        for job in self.jobs().chain(extra) {
            let r = &job.request;
            let end = (r.prompt.len() + r.max_tokens) as u64;
            transient = transient.max(m.need(r.prompt.len() as u64, end).transient);
        }
        let end = |j: &Job| (j.request.prompt.len() + j.request.max_tokens) as u64;
        // Tokens each holds now (a row's history is its prompt and output;
        // the caches hold all of it but the pending token).
        let rows = self.rows.iter().map(|r| (r.history.len().saturating_sub(1) as u64, end(&r.job)));
        let joiners = self.joining.iter().map(|j| (j.done as u64, end(&j.job)));
        let cohort = self.cohort.iter().flat_map(|(_, m)| m.iter().map(|j| (0, end(&j.job))));
        let all: Vec<(u64, u64)> = rows.chain(joiners).chain(cohort).chain(extra.map(|j| (0, end(j)))).collect();
        let pool = if m.paged.is_some() { self.engine.kv_pool().map_or(0, |u| u.bytes) } else { 0 };
        (m.paged_kv(&all, pool, host_loader::compose::KV_STEP as u64), transient)
    }

    /// Whether a job fits beside what runs now, by the layouts' reservation
    /// and by the bytes MLX really holds (minus the prefix cache, which
    /// gives its bytes back). Whatever fits alone runs when nothing else does.
    pub(super) fn fits(&self, job: &Job) -> bool {
        crate::lockstep::agreed(self.fits_here(job))
    }

    fn fits_here(&self, job: &Job) -> bool {
        let Some((m, b)) = &self.memory else { return true };
        if self.jobs().next().is_none() {
            return true;
        }
        let (kv, transient) = self.committed(m, Some(job));
        let r = &job.request;
        let need = m.need(r.prompt.len() as u64, (r.prompt.len() + r.max_tokens) as u64);
        let held = crate::runtime::active_memory() as u64;
        let real = held.saturating_sub(self.engine.prefix().counters().bytes) + need.kv + need.transient;
        m.fits_now(b, kv, transient) && real + b.mlx_cache_bytes <= b.memory_bytes
    }

    /// Bounds the prefix cache by what the budget leaves beside the work in
    /// flight (reserved, and really held by MLX).
    pub(super) fn bound_prefix_cache(&self) {
        let Some(room) = crate::lockstep::agreed(self.prefix_room()) else { return };
        if self.engine.prefix().shrink(room) {
            self.stats.sync_prefix(self.engine);
        }
    }

    fn prefix_room(&self) -> Option<u64> {
        let (m, b) = self.memory.as_ref()?;
        let (kv, transient) = self.committed(m, None);
        self.stats.kv_reserved.store(kv, Ordering::Relaxed);
        let held = (crate::runtime::active_memory() as u64).saturating_sub(self.engine.prefix().counters().bytes);
        let real_room = b.memory_bytes.saturating_sub(held + b.mlx_cache_bytes + transient);
        Some(m.prefix_room(b, kv, transient).min(real_room))
    }
}
