//! Whether speculative rounds pay for this request: tokens per second that
//! rounds emit (drafting, verify, rollback and replay included) against
//! plain steps timed in the same loop. Acceptance alone cannot say it: a
//! round that accepts half of 4 drafts still loses when verifying and
//! drafting cost more than 3 plain steps.

/// Plain samples taken right after the first token, each a run of
/// `PLAIN_SAMPLE_TOKENS` steps of the pipelined plain loop (the loop a
/// request falls back to, so the reference is what falling back would
/// give); the best per-token time is the reference. A round of a verify
/// width not seen before is not timed: on a GPU a new width compiles
/// kernels, and the adaptive depth changes the width often at first.
pub const PLAIN_SAMPLES: usize = 2;
pub const PLAIN_SAMPLE_TOKENS: usize = 3;
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

    /// A plain sample: `tokens` emitted in `seconds` (a sample cut short by
    /// the end of the request does not count).
    pub fn plain(&mut self, seconds: f64, tokens: usize) {
        self.plain_steps += 1;
        if tokens > 0 {
            let per_token = seconds / tokens as f64;
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
}
