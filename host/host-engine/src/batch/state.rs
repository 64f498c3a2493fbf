//! What the batch scheduler holds between iterations: running rows, their
//! shared caches, joiners still prefilling, and the jobs waiting their turn.

use super::ahead::Ahead;
use super::cohort::Cohort;
use super::row_spec::RowSpec;
use crate::admission::{Budget, MemoryModel};
use crate::constraint::{Constraint, GrammarError};
use crate::engine::Engine;
use crate::hold::Hold;
use crate::job::Job;
use crate::sampling::Sampler;
use crate::speculation::clock::BatchClock;
use crate::stats::Stats;
use crate::target_states::States;
use plugin_api::CacheBox;
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

/// A request decoding inside the batch.
pub(super) struct Row {
    pub job: Job,
    pub cached: usize,
    pub sampler: Sampler,
    pub history: Vec<u32>,
    pub out: Vec<u32>,
    pub pending: u32,
    pub eos: Vec<u32>,
    pub start: Instant,
    pub first_at: Option<Instant>,
    pub stopped_by_caller: bool,
    /// The end-of-sequence token that ended the row (not in `history`).
    pub ended_by: Option<u32>,
    /// Speculative rounds inside the batch, when its plan speculates.
    pub spec: Option<RowSpec>,
    /// The grammar its tokens must follow.
    pub constraint: Option<Constraint>,
    /// Why its grammar failed (a mask it could not compute, a token it could
    /// not take): the row ends with this error, the rows beside it go on.
    pub grammar_failed: Option<GrammarError>,
}

impl Row {
    /// The tokens a constrained row may take next (`Constraint::allowed_words`;
    /// None without a grammar). A grammar that fails here fails the row alone:
    /// it gets every token (its token is then discarded and the row ends).
    pub fn allowed_words(&mut self) -> Option<Vec<u32>> {
        let c = self.constraint.as_mut()?;
        let all = |c: &Constraint| vec![u32::MAX; c.words()];
        if self.grammar_failed.is_some() {
            return Some(all(c));
        }
        Some(c.allowed_words().unwrap_or_else(|e| {
            self.grammar_failed = Some(e);
            all(c)
        }))
    }
}

/// A request whose prompt is being prefilled before it joins the batch.
pub(super) struct Joiner {
    pub job: Job,
    pub caches: Vec<CacheBox>,
    /// Prompt tokens (of all but the last) already in `caches`.
    pub done: usize,
    /// Of those, how many came from the prefix cache.
    pub cached: usize,
    pub start: Instant,
    /// The target states its drafter reads, over the positions prefilled
    /// here (a joiner whose drafter reads states prefills on its own).
    pub states: Option<States>,
}

impl Joiner {
    /// What prefill covers: the prompt but its last token.
    pub fn head(&self) -> &[u32] {
        let prompt = &self.job.request.prompt;
        &prompt[..prompt.len() - 1]
    }
}

pub struct Scheduler<'a> {
    pub(super) engine: &'a Engine,
    pub(super) stats: Arc<Stats>,
    pub(super) shutdown: Arc<AtomicBool>,
    pub(super) hold: Arc<Hold>,
    pub(super) limit: usize,
    pub(super) rows: Vec<Row>,
    pub(super) batch: Option<Vec<CacheBox>>,
    pub(super) joining: VecDeque<Joiner>,
    /// Joiners prefilling together, and their shared caches.
    pub(super) cohort: Option<(Cohort, Vec<Joiner>)>,
    /// False once a layout refused padded rows: joiners go one at a time.
    pub(super) padded_prefill: bool,
    /// A job whose plan is serial, waiting for the batch to drain.
    pub(super) serial_next: Option<Job>,
    /// A job that fits the memory budget only once running rows finish.
    pub(super) waiting: Option<Job>,
    pub(super) memory: Option<(MemoryModel, Budget)>,
    /// Decode steps since MLX's buffer cache was last cleared.
    pub(super) steps_since_clear: u32,
    /// Trims the process heap now and then while rows run (`runtime::HeapTrim`).
    pub(super) heap: crate::runtime::HeapTrim,
    /// Plain and speculative step times, for the batched cost rule.
    pub(super) spec_clock: BatchClock,
    /// Per batch cache: whether its layout rolls back by snapshot and replay.
    pub(super) replay_layers: Vec<bool>,
    /// A decode step queued but not read (`step`: pipelined steps).
    pub(super) ahead: Option<Ahead>,
}

impl<'a> Scheduler<'a> {
    pub fn new(
        engine: &'a Engine,
        stats: Arc<Stats>,
        shutdown: Arc<AtomicBool>,
        hold: Arc<Hold>,
        limit: usize,
        memory: Option<(MemoryModel, Budget)>,
    ) -> Self {
        Self {
            engine,
            stats,
            shutdown,
            hold,
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
            heap: crate::runtime::HeapTrim::new(),
            spec_clock: BatchClock::default(),
            replay_layers: engine.replay_layers(),
            ahead: None,
        }
    }

    pub(super) fn idle(&self) -> bool {
        self.rows.is_empty()
            && self.joining.is_empty()
            && self.cohort.is_none()
            && self.serial_next.is_none()
            && self.waiting.is_none()
    }

    /// Every job in flight: running rows, joiners, cohort members.
    pub(super) fn jobs(&self) -> impl Iterator<Item = &Job> {
        let cohort = self.cohort.iter().flat_map(|(_, m)| m.iter().map(|j| &j.job));
        self.rows.iter().map(|r| &r.job).chain(self.joining.iter().map(|j| &j.job)).chain(cohort)
    }

    pub(super) fn cohort_rows(&self) -> usize {
        self.cohort.as_ref().map_or(0, |(_, m)| m.len())
    }
}
