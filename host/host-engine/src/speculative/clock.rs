//! Whether speculative rounds pay for this request: tokens per second that
//! rounds emit (drafting, verify, rollback and replay included) against
//! plain steps timed in the same loop. Acceptance alone cannot say it: a
//! round that accepts half of 4 drafts still loses when verifying and
//! drafting cost more than 3 plain steps.

/// Plain steps timed right after the first token (their best is the
/// reference), rounds skipped as warm-up (a new verify width compiles
/// kernels on a GPU), and timed rounds before judging.
pub const PLAIN_SAMPLES: usize = 2;
const WARMUP_ROUNDS: u64 = 2;
const JUDGED_ROUNDS: u64 = 4;

#[derive(Default, Debug)]
pub struct RoundClock {
    plain_best: Option<f64>,
    plain_steps: usize,
    rounds: u64,
    spec_s: f64,
    spec_tokens: usize,
}

impl RoundClock {
    /// Whether the next step should be a plain one, to be timed.
    pub fn wants_plain_sample(&self, emitted_so_far: usize) -> bool {
        emitted_so_far > 0 && self.plain_steps < PLAIN_SAMPLES
    }

    pub fn plain(&mut self, seconds: f64) {
        self.plain_steps += 1;
        self.plain_best = Some(self.plain_best.map_or(seconds, |b| b.min(seconds)));
    }

    pub fn round(&mut self, seconds: f64, emitted: usize) {
        self.rounds += 1;
        if self.rounds > WARMUP_ROUNDS {
            self.spec_s += seconds;
            self.spec_tokens += emitted;
        }
    }

    /// Why rounds lose, once enough of them are timed (None: keep going).
    pub fn verdict(&self) -> Option<String> {
        let plain = self.plain_best?;
        if self.rounds < WARMUP_ROUNDS + JUDGED_ROUNDS || self.spec_s <= 0.0 || plain <= 0.0 {
            return None;
        }
        let (spec_rate, plain_rate) = (self.spec_tokens as f64 / self.spec_s, 1.0 / plain);
        (spec_rate < plain_rate).then(|| format!("speculative rounds emit {spec_rate:.0} tok/s against {plain_rate:.0} tok/s for plain steps: plain steps from here"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock(plain: &[f64], rounds: &[(f64, usize)]) -> RoundClock {
        let mut c = RoundClock::default();
        plain.iter().for_each(|&s| c.plain(s));
        rounds.iter().for_each(|&(s, n)| c.round(s, n));
        c
    }

    #[test]
    fn rounds_that_emit_more_per_second_than_plain_steps_continue() {
        // Plain 10 ms/token; rounds of 15 ms emitting 3 tokens (200 tok/s).
        let c = clock(&[0.012, 0.010], &[(0.5, 1), (0.5, 1), (0.015, 3), (0.015, 3), (0.015, 3), (0.015, 3)]);
        assert_eq!(c.verdict(), None, "warm-up rounds must not count");
    }

    #[test]
    fn rounds_slower_than_plain_steps_stop_with_the_rates() {
        // Plain 10 ms/token (100 tok/s); rounds of 30 ms emitting 2 (67 tok/s).
        let c = clock(&[0.010], &[(0.03, 2); 6]);
        let why = c.verdict().expect("rounds lose");
        assert!(why.contains("67 tok/s") && why.contains("100 tok/s"), "{why}");
    }

    #[test]
    fn no_verdict_before_enough_rounds_or_without_a_plain_reference() {
        assert_eq!(clock(&[0.010], &[(0.03, 1); 5]).verdict(), None);
        assert_eq!(clock(&[], &[(0.03, 1); 10]).verdict(), None);
        assert!(!RoundClock::default().wants_plain_sample(0), "the first token comes from a normal step");
        assert!(RoundClock::default().wants_plain_sample(1));
    }
}
