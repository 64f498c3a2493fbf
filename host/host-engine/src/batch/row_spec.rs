//! A batched row's speculation: its statistics, adaptive depth, cost
//! against plain steps, and its own drafter when the drafter keeps
//! per-request state.

use crate::engine::Engine;
use crate::job::Job;
use crate::plan::Method;
use crate::speculation::clock::RowCost;
use crate::speculation::SpecStats;
use crate::target_states::States;
use plugin_api::abi_stable::std_types::RSlice;
use plugin_api::DrafterBox;

/// A row's speculation state.
pub struct RowSpec {
    pub stats: SpecStats,
    pub(super) depth: usize,
    pub(super) max_depth: usize,
    pub(super) cost: RowCost,
    /// This row's own drafter, for drafters with per-request state
    /// (two-model: its own draft caches over the shared draft weights).
    /// None: the engine's one history-only drafter serves the row.
    pub(super) own: Option<DrafterBox>,
}

impl RowSpec {
    /// Speculation for a batched row, when its plan speculates (the plan
    /// only says so inside a batch when the drafter can serve batched rows).
    /// `states`: the prompt's target states, for a drafter that reads them.
    pub fn for_job(engine: &Engine, job: &Job, states: Option<States>) -> Option<Self> {
        let drafting = engine.drafting().filter(|_| job.plan.method == Method::Speculative)?;
        let max_depth = drafting.depth;
        let mut spec = Self {
            stats: SpecStats {
                kind: drafting.kind.clone(),
                accepted_by_position: vec![0; max_depth],
                ..Default::default()
            },
            depth: max_depth,
            max_depth,
            cost: RowCost::default(),
            own: None,
        };
        if !drafting.history_only() {
            // Its own instance, fed the prompt as the serial path does.
            let prompt = RSlice::from_slice(&job.request.prompt);
            let opened = drafting.open_instance().map_err(|e| e.to_string()).and_then(|mut d| {
                let prefilled = match &states {
                    Some(s) => s.lend(|s| d.prefill_states(prompt, s)),
                    None => d.prefill(prompt),
                };
                prefilled.into_result().map(|_| d).map_err(|e| e.to_string())
            });
            match opened {
                Ok(d) => spec.own = Some(d),
                Err(e) => spec.stats.disabled = Some(format!("could not open this row's drafter ({e}): plain steps")),
            }
        }
        Some(spec)
    }

    pub(super) fn active(&self) -> bool {
        self.stats.disabled.is_none()
    }
}
