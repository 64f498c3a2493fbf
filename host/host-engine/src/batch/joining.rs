//! Joining the batch: each iteration advances prefill by one chunk. Joiners
//! that arrived together with nothing cached prefill as one left-padded
//! cohort (`cohort`); otherwise ONE joiner advances on its own 1-row
//! caches, so a long prompt stalls running rows for at most one chunk.
//! Rows whose prompt (all but the last token) is in merge into the batch
//! caches (the layouts left-pad rows to a common length) and, where their
//! plan allows, into the prefix cache.

use super::cohort::{self, Cohort};
use super::row_spec::RowSpec;
use super::state::{Joiner, Row, Scheduler};
use crate::error::EngineError;
use crate::sampling::Sampler;
use plugin_api::abi_stable::std_types::RVec;
use plugin_api::CacheBox;
use std::sync::atomic::Ordering;

/// A cohort that cannot start from its members' cached tokens (`cohort`,
/// "seeded") recomputes them: a joiner whose prefix-cache hit is at most
/// this many tokens still joins it, because recomputing a short shared
/// prefix costs less than prefilling the burst one joiner after another.
/// A longer hit joins only a cohort that starts from it.
const COHORT_RECOMPUTES_CACHED: usize = 256;

impl Scheduler<'_> {
    /// One prefill chunk: of the cohort when there is (or can be) one, else
    /// of the first joiner. Rows whose prompt is in join the batch.
    pub(super) fn advance_joiner(&mut self) {
        if self.cohort.is_none() {
            self.form_cohort();
        }
        if self.cohort.is_some() {
            return self.advance_cohort();
        }
        let Some(mut j) = self.joining.pop_front() else { return };
        let head = j.head().len();
        let step = self.engine.prefill_step();
        if j.done < head {
            let end = (j.done + step).min(head);
            let chunk = &j.job.request.prompt[j.done..end];
            let prefilled = match self.reads_states(&j.job) {
                Some(wants) => self
                    .engine
                    .prefill_states(chunk, &mut j.caches, wants, j.done as u64)
                    .and_then(|s| j.states.get_or_insert_with(Default::default).extend(s)),
                None => self.engine.prefill(chunk, &mut j.caches),
            };
            if let Err(e) = prefilled {
                return self.fail_job(j.job, e);
            }
            j.done = end;
        }
        if j.done < head {
            self.joining.push_front(j);
            return;
        }
        // The prompt (but its last token) is in: the row joins the batch.
        if j.job.plan.prompt_cache && j.done > j.cached {
            self.engine.prefix().put(&j.job.request.prompt[..head], &j.caches);
        }
        self.settle_or_fail();
        if let Err(e) = self.merge(&mut j.caches) {
            return self.fail_job(j.job, e);
        }
        self.push_row(j);
    }

    /// Groups joiners that have nothing prefilled and at most a short prefix
    /// cached (a burst of new requests) into a cohort, unless a joiner is
    /// already mid-prefill.
    fn form_cohort(&mut self) {
        if !self.padded_prefill || self.joining.front().is_some_and(|j| j.done > j.cached) {
            return;
        }
        let fresh: Vec<usize> = (0..self.joining.len())
            .filter(|&i| {
                let j = &self.joining[i];
                j.done == j.cached && self.reads_states(&j.job).is_none()
            })
            .collect();
        // Grouped by what each has left to compute when the cohort starts
        // from the cache (it computes as many columns as the longest of
        // those), else by whole heads among the short hits.
        let mut picked = self.choose_members(&fresh, true);
        if picked.is_empty() || !self.starts_seeded(&picked) {
            let short: Vec<usize> =
                fresh.into_iter().filter(|&i| self.joining[i].cached <= COHORT_RECOMPUTES_CACHED).collect();
            picked = self.choose_members(&short, false);
        }
        if picked.is_empty() {
            return;
        }
        let mut members: Vec<Joiner> =
            picked.iter().rev().map(|&i| self.joining.remove(i).expect("index in range")).collect();
        members.reverse();
        let seeds = members
            .iter_mut()
            .map(|j| cohort::Member { head: j.head().to_vec(), cached: j.cached, caches: &mut j.caches })
            .collect();
        match Cohort::start(self.engine, seeds) {
            Ok(Some(c)) => {
                // The cohort's caches hold what each member had cached
                // (`seeded`) or nothing: a member's own caches are spent.
                for (m, j) in members.iter_mut().enumerate() {
                    j.caches.clear();
                    (j.done, j.cached) = (c.seeded(m), c.seeded(m));
                }
                self.cohort = Some((c, members))
            }
            Ok(None) => {
                self.padded_prefill = false;
                for j in members.into_iter().rev() {
                    self.joining.push_front(j);
                }
            }
            Err(e) => self.fail_all(members, &e),
        }
    }

    /// The joiners among `candidates` (indices into `joining`) that
    /// prefill together (`cohort::choose`), by the length of their heads
    /// less what they have cached (`uncached`) or of their whole heads.
    fn choose_members(&self, candidates: &[usize], uncached: bool) -> Vec<usize> {
        let lengths: Vec<usize> = candidates
            .iter()
            .map(|&i| {
                let j = &self.joining[i];
                j.head().len() - if uncached { j.cached } else { 0 }
            })
            .collect();
        cohort::choose(&lengths).into_iter().map(|p| candidates[p]).collect()
    }

    /// Whether a cohort of these joiners would start from their cached
    /// tokens.
    fn starts_seeded(&self, picked: &[usize]) -> bool {
        let members = picked.iter().map(|&i| &self.joining[i]);
        cohort::start_column(members.map(|j| (j.head(), cohort::seed_of(j.cached, &j.caches)))).is_some()
    }

    fn advance_cohort(&mut self) {
        let Some((mut c, members)) = self.cohort.take() else { return };
        match c.advance(self.engine) {
            Ok(false) => self.cohort = Some((c, members)),
            Ok(true) => {
                self.settle_or_fail();
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
    /// Members that share a head land from its one row.
    fn land_cohort(&mut self, c: Cohort, members: &[Joiner]) -> Result<(), EngineError> {
        let trimmable = c.caches.iter().all(|l| l.is_trimmable());
        for (m, member) in members.iter().enumerate() {
            if member.job.plan.prompt_cache && c.first_with_its_head(m) {
                self.engine.prefix().insert(c.head(m).to_vec(), c.row_state(m)?, trimmable);
            }
        }
        if self.batch.is_none() && c.one_row_per_member() {
            self.batch = Some(c.caches);
            return Ok(());
        }
        if self.batch.is_none() {
            self.batch = Some(self.engine.model().new_caches(0)?);
        }
        let batch = self.batch.as_mut().unwrap();
        for (l, b) in batch.iter_mut().enumerate() {
            let states = (0..members.len()).map(|m| c.layer_row_state(l, m)).collect::<Result<RVec<_>, _>>()?;
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
    fn push_row(&mut self, mut j: Joiner) {
        let constraint = j.job.request.constraint.take();
        let req = &j.job.request;
        let sampler = match Sampler::new(req.params.clone()) {
            Ok(s) => s,
            Err(e) => return self.fail_job(j.job, e.into()),
        };
        let eos = if req.stop_on_eos { self.engine.eos_ids() } else { Vec::new() };
        let pending = *req.prompt.last().unwrap();
        // A drafter reading states hears of the prompt's, none when the
        // prefix cache served it all.
        let states = j.states.take().or_else(|| {
            self.reads_states(&j.job)
                .map(|_| crate::target_states::States { first: j.done as u64, ..Default::default() })
        });
        let spec = RowSpec::for_job(self.engine, &j.job, states);
        self.rows.push(Row {
            history: req.prompt.clone(),
            out: Vec::new(),
            pending,
            eos,
            sampler,
            start: j.start,
            first_at: None,
            stopped_by_caller: false,
            ended_by: None,
            cached: j.cached,
            spec,
            constraint,
            grammar_failed: None,
            job: j.job,
        });
    }

    /// The states `job`'s drafter reads, when it speculates with one that
    /// reads any.
    pub(super) fn reads_states(&self, job: &crate::job::Job) -> Option<&plugin_api::TargetWants> {
        let d = self.engine.drafting().filter(|_| job.plan.method == crate::plan::Method::Speculative)?;
        d.reads_states()
    }

    /// Appends a 1-row cache set to the batch caches, layer by layer.
    fn merge(&mut self, single: &mut [CacheBox]) -> Result<(), EngineError> {
        if self.batch.is_none() {
            self.batch = Some(self.engine.model().new_caches(0)?);
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
}
