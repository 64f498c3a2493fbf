//! Whether speculative rounds pay for this request: tokens per second that
//! rounds emit (drafting, verify, rollback and replay included) against
//! plain steps timed in the same loop. Acceptance alone cannot say it: a
//! round that accepts half of 4 drafts still loses when verifying and
//! drafting cost more than 3 plain steps.

/// Plain samples taken right after the first token, each a run of
/// `PLAIN_SAMPLE_TOKENS` steps of the pipelined plain loop (the loop a
/// request falls back to, so the reference is what falling back would
/// give), timed from its first token to its last (the steady rate: the
/// first step of a run has nothing to overlap with); the best time per
/// token interval is the reference. A round of a verify width not seen
/// before is not timed: on a GPU a new width compiles kernels, and the
/// adaptive depth changes the width often at first.
pub const PLAIN_SAMPLES: usize = 2;
pub const PLAIN_SAMPLE_TOKENS: usize = 4;
const JUDGED_ROUNDS: u64 = 4;
/// Rounds must fall below this share of the plain rate to be switched off
/// (timing noise must not cost a request its speculation).
const MARGIN: f64 = 0.9;

#[derive(Default, Debug)]
pub struct RoundClock {
    plain_best: Option<f64>,
    plain_steps: usize,
    rounds: u64,
    widths_seen: Vec<usize>,
    spec_s: f64,
    spec_tokens: usize,
}

impl RoundClock {
    /// Whether the next step should be a plain one, to be timed.
    pub fn wants_plain_sample(&self, emitted_so_far: usize) -> bool {
        emitted_so_far > 0 && self.plain_steps < PLAIN_SAMPLES
    }

    /// A plain sample: `intervals` token-to-token intervals in `seconds`
    /// (a sample cut short by the end of the request does not count).
    pub fn plain(&mut self, seconds: f64, intervals: usize) {
        self.plain_steps += 1;
        if intervals > 0 {
            let per_token = seconds / intervals as f64;
            self.plain_best = Some(self.plain_best.map_or(per_token, |b| b.min(per_token)));
        }
    }

    /// A round that verified `width` positions and emitted `emitted` tokens.
    pub fn round(&mut self, seconds: f64, width: usize, emitted: usize) {
        if !self.widths_seen.contains(&width) {
            self.widths_seen.push(width);
            return;
        }
        self.rounds += 1;
        self.spec_s += seconds;
        self.spec_tokens += emitted;
    }

    /// Why rounds lose, once enough of them are timed (None: keep going).
    pub fn verdict(&self) -> Option<String> {
        let plain = self.plain_best?;
        if self.rounds < JUDGED_ROUNDS || self.spec_s <= 0.0 || plain <= 0.0 {
            return None;
        }
        let (spec_rate, plain_rate) = (self.spec_tokens as f64 / self.spec_s, 1.0 / plain);
        (spec_rate < MARGIN * plain_rate).then(|| format!("speculative rounds emit {spec_rate:.0} tok/s against {plain_rate:.0} tok/s for plain steps: plain steps from here"))
    }
}

/// The batched counterpart. A batched step's cost is shared by every row,
/// so the unit is the plain step: a speculative step that takes c times the
/// time of a plain step at the same number of rows pays for a row only if
/// that row's rounds emit more than c tokens each. Plain steps are timed
/// per batch size (the first step of every rows x width shape is not timed,
/// as above); a batch size without a plain reference takes one plain step
/// first.
#[derive(Default, Debug)]
pub struct BatchClock {
    plain_best: std::collections::BTreeMap<usize, f64>,
    shapes_seen: std::collections::HashSet<(usize, usize)>,
}

impl BatchClock {
    /// Whether the next step at `rows` rows should be a plain one, to be timed.
    pub fn wants_plain_sample(&self, rows: usize) -> bool {
        !self.plain_best.contains_key(&rows)
    }

    pub fn plain(&mut self, rows: usize, seconds: f64) {
        if self.shapes_seen.insert((rows, 1)) {
            return;
        }
        let best = self.plain_best.entry(rows).or_insert(seconds);
        *best = best.min(seconds);
    }

    /// A speculative step's cost in plain steps of the same batch size
    /// (None: not timed).
    pub fn spec_cost(&mut self, rows: usize, width: usize, seconds: f64) -> Option<f64> {
        if self.shapes_seen.insert((rows, width)) {
            return None;
        }
        let plain = *self.plain_best.get(&rows)?;
        (plain > 0.0).then(|| seconds / plain)
    }
}

/// One batched row's side of the cost rule: what its timed rounds emitted
/// against what they cost, in plain steps.
#[derive(Default, Debug, Clone)]
pub struct RowCost {
    rounds: u64,
    emitted: usize,
    cost: f64,
}

impl RowCost {
    pub fn round(&mut self, emitted: usize, cost: f64) {
        self.rounds += 1;
        self.emitted += emitted;
        self.cost += cost;
    }

    /// Why this row's rounds lose, once enough are timed (None: keep going).
    pub fn verdict(&self) -> Option<String> {
        if self.rounds < JUDGED_ROUNDS || self.cost <= 0.0 {
            return None;
        }
        let per_step = self.emitted as f64 / self.rounds as f64;
        let cost = self.cost / self.rounds as f64;
        (per_step < MARGIN * cost).then(|| {
            format!(
                "batched rounds emit {per_step:.2} tokens each and cost {cost:.2} plain steps: plain steps from here"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(plain: &[f64], rounds: &[(f64, usize)]) -> RoundClock {
        let mut c = RoundClock::default();
        plain.iter().for_each(|&s| c.plain(s * 3.0, 3));
        rounds.iter().for_each(|&(s, n)| c.round(s, 4, n));
        c
    }

    #[test]
    fn rounds_that_emit_more_per_second_than_plain_steps_continue() {
        // Plain 10 ms/token; rounds of 15 ms emitting 3 tokens (200 tok/s);
        // the first round of a width (0.5 s: compiling) is not timed.
        let c = clock(&[0.012, 0.010], &[(0.5, 1), (0.015, 3), (0.015, 3), (0.015, 3), (0.015, 3)]);
        assert_eq!(c.verdict(), None, "a new width's first round must not count");
        // Within the margin (95 tok/s vs 100): keep speculating.
        assert_eq!(clock(&[0.010], &[(0.021, 2); 6]).verdict(), None);
    }

    #[test]
    fn rounds_slower_than_plain_steps_stop_with_the_rates() {
        // Plain 10 ms/token (100 tok/s); rounds of 30 ms emitting 2 (67 tok/s).
        let c = clock(&[0.010], &[(0.03, 2); 5]);
        let why = c.verdict().expect("rounds lose");
        assert!(why.contains("67 tok/s") && why.contains("100 tok/s"), "{why}");
    }

    #[test]
    fn no_verdict_before_enough_rounds_or_without_a_plain_reference() {
        assert_eq!(clock(&[0.010], &[(0.03, 1); 4]).verdict(), None);
        assert_eq!(clock(&[], &[(0.03, 1); 10]).verdict(), None);
        assert!(!RoundClock::default().wants_plain_sample(0), "the first token comes from a normal step");
        assert!(RoundClock::default().wants_plain_sample(1));
    }

    #[test]
    fn batched_rounds_are_judged_in_plain_steps_of_the_same_batch_size() {
        let mut c = BatchClock::default();
        assert!(c.wants_plain_sample(4));
        c.plain(4, 0.5); // first sight of 4 x 1: compiling, not timed
        assert!(c.wants_plain_sample(4));
        c.plain(4, 0.010);
        assert!(!c.wants_plain_sample(4) && c.wants_plain_sample(3), "a reference per batch size");
        assert_eq!(c.spec_cost(4, 5, 0.3), None, "a new rows x width shape is not timed");
        assert_eq!(c.spec_cost(3, 5, 0.02), None);
        assert_eq!(c.spec_cost(3, 5, 0.02), None, "no plain reference at 3 rows");
        let cost = c.spec_cost(4, 5, 0.025).expect("timed");
        assert!((cost - 2.5).abs() < 1e-9);

        // A row emitting 3 tokens per 2.5-step round pays; 2 per round does not.
        let mut pays = RowCost::default();
        let mut loses = RowCost::default();
        for _ in 0..4 {
            pays.round(3, 2.5);
            loses.round(2, 2.5);
        }
        assert_eq!(pays.verdict(), None);
        let why = loses.verdict().expect("loses");
        assert!(why.contains("2.00 tokens") && why.contains("2.50 plain steps"), "{why}");
        let mut early = RowCost::default();
        early.round(1, 5.0);
        assert_eq!(early.verdict(), None, "no verdict before enough rounds");
    }
}
