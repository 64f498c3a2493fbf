//! One constrained row's grammar state: which tokens may come next, the
//! tokens it accepted, and rollback (a speculative round's rejected drafts).
//! A row may reason before it answers: behind a `ReasoningGate` the
//! grammar constrains only what follows the reasoning block's end marker.

use super::clock::MaskClock;
use super::error::{reason, GrammarError};
use llguidance::Matcher;
use std::sync::Arc;
use std::time::Instant;

/// (A clone continues independently from the same point.)
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    vocab: usize,
    eos: Vec<u32>,
    clock: Arc<MaskClock>,
    gate: Option<Gate>,
    /// What it was compiled from, so that another process (an isolated
    /// engine) can compile the same constraint.
    source: Option<ConstraintSource>,
    /// The grammar's mask at the matcher's present state, once computed
    /// (compile's check computes the first, which the first step reuses);
    /// dropped whenever the matcher moves.
    known: Option<Vec<u32>>,
}

/// A constraint as a request asked for it: its grammar and reasoning gate.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
pub struct ConstraintSource {
    pub grammar: super::grammar::Grammar,
    pub gate: Option<ReasoningGate>,
}

/// Where the grammar starts when the model reasons first, by the single
/// tokens that mark its reasoning block (as a reasoning parser finds them):
/// `open` when the prompt already opened the block, otherwise the answer
/// may open one with `start` as its first token, or begin the grammar at once.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningGate {
    pub start: Option<u32>,
    pub end: u32,
    pub open: bool,
}

/// Where a gated row stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The first token: `start` opens a block, anything else is the grammar's.
    Opening,
    /// Inside the reasoning block: anything but EOS, until `end`.
    Free,
    /// The grammar runs.
    Active,
}

#[derive(Debug, Clone)]
struct Gate {
    start: Option<u32>,
    end: u32,
    phase: Phase,
    /// Per accepted token: the phase before it, and whether the matcher
    /// took it (rollback crosses the reasoning's end).
    trail: Vec<(Phase, bool)>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint").field("vocab", &self.vocab).finish_non_exhaustive()
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> GrammarError {
    GrammarError(format!("the grammar's matcher failed to {what}: {}", reason(e)))
}

impl Constraint {
    pub(crate) fn new(matcher: Matcher, vocab: usize, eos: Vec<u32>, clock: Arc<MaskClock>) -> Self {
        Self { matcher, vocab, eos, clock, gate: None, source: None, known: None }
    }

    pub(crate) fn compiled_from(mut self, grammar: &super::grammar::Grammar) -> Self {
        self.source = Some(ConstraintSource { grammar: grammar.clone(), gate: None });
        self
    }

    /// The grammar and gate it was made from (None: built by hand in a test).
    pub fn source(&self) -> Option<&ConstraintSource> {
        self.source.as_ref()
    }

    /// This grammar behind `gate`: it constrains only the answer after the
    /// reasoning block. Inside the block every token but EOS is allowed
    /// (an answer that ends with `stop` still follows the grammar).
    pub fn after_reasoning(mut self, gate: ReasoningGate) -> Self {
        let phase = match (gate.open, gate.start) {
            (true, _) => Phase::Free,
            (false, Some(_)) => Phase::Opening,
            (false, None) => Phase::Active,
        };
        self.gate = Some(Gate { start: gate.start, end: gate.end, phase, trail: Vec::new() });
        if let Some(src) = &mut self.source {
            src.gate = Some(gate);
        }
        self
    }

    fn phase(&self) -> Phase {
        self.gate.as_ref().map_or(Phase::Active, |g| g.phase)
    }

    /// The tokens allowed next as bit words (bit `id % 32` of word
    /// `id / 32`, as llguidance keeps them), covering the model's
    /// vocabulary. Every EOS id is allowed exactly where the grammar may
    /// end; once it has ended, only EOS is.
    pub fn allowed_words(&mut self) -> Result<Vec<u32>, GrammarError> {
        let n = self.vocab.div_ceil(32);
        let mut words = match self.phase() {
            Phase::Free => {
                let mut words = vec![u32::MAX; n];
                for &t in self.eos.iter().filter(|&&t| (t as usize) < self.vocab) {
                    words[t as usize / 32] &= !(1u32 << (t % 32));
                }
                words
            }
            Phase::Opening | Phase::Active => self.grammar_words()?,
        };
        if let (Phase::Opening, Some(start)) = (self.phase(), self.gate.as_ref().and_then(|g| g.start)) {
            if (start as usize) < self.vocab {
                words[start as usize / 32] |= 1u32 << (start % 32);
            }
        }
        // Ids past the model's vocabulary (the last word's tail) stay off.
        if !self.vocab.is_multiple_of(32) {
            words[n - 1] &= (1u32 << (self.vocab % 32)) - 1;
        }
        Ok(words)
    }

    /// The grammar's own mask, EOS allowed exactly where it may end.
    fn grammar_words(&mut self) -> Result<Vec<u32>, GrammarError> {
        if let Some(words) = &self.known {
            return Ok(words.clone());
        }
        let started = Instant::now();
        let vob = self.matcher.compute_mask_or_eos().map_err(|e| failed("compute a mask", e))?;
        let n = self.vocab.div_ceil(32);
        let mut words: Vec<u32> = vob.as_slice().iter().copied().chain(std::iter::repeat(0)).take(n).collect();
        let get = |w: &[u32], t: u32| (t as usize) < self.vocab && w[t as usize / 32] >> (t % 32) & 1 == 1;
        let may_end = self.matcher.is_stopped() || self.eos.iter().any(|&t| get(&words, t));
        for &t in self.eos.iter().filter(|&&t| (t as usize) < self.vocab) {
            let (i, bit) = (t as usize / 32, 1u32 << (t % 32));
            words[i] = if may_end { words[i] | bit } else { words[i] & !bit };
        }
        self.known = Some(words.clone());
        self.clock.record_mask(started.elapsed());
        Ok(words)
    }

    /// How many bit words a mask has.
    pub fn words(&self) -> usize {
        self.vocab.div_ceil(32)
    }

    /// `allowed_words` as one flag per id.
    pub fn allowed(&mut self) -> Result<Vec<bool>, GrammarError> {
        let words = self.allowed_words()?;
        Ok((0..self.vocab).map(|id| words[id / 32] >> (id % 32) & 1 == 1).collect())
    }

    /// Moves past `token` (which the last mask allowed). EOS needs no move:
    /// it ends the request.
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        if self.eos.contains(&token) {
            return Ok(());
        }
        let started = Instant::now();
        let r = self.advance(token);
        self.clock.record_accept(started.elapsed());
        r
    }

    /// Moves past a token that is not EOS: through the gate, into the
    /// matcher when the grammar runs.
    fn advance(&mut self, token: u32) -> Result<(), GrammarError> {
        let Some(g) = self.gate.as_mut() else {
            self.known = None;
            return self.matcher.consume_token(token).map_err(|e| failed("accept a token", e));
        };
        let before = g.phase;
        let to_matcher = match before {
            Phase::Opening if Some(token) == g.start => {
                g.phase = Phase::Free;
                false
            }
            Phase::Free => {
                if token == g.end {
                    g.phase = Phase::Active;
                }
                false
            }
            Phase::Opening | Phase::Active => {
                g.phase = Phase::Active;
                true
            }
        };
        g.trail.push((before, to_matcher));
        if to_matcher {
            self.known = None;
            self.matcher.consume_token(token).map_err(|e| failed("accept a token", e))?;
        }
        Ok(())
    }

    /// The masks a speculative round verifies under, one `allowed_words`
    /// row per position of `[pending, drafts..]`, flattened: row i is what may follow
    /// the first i drafts. `drafts` is cut before the first token the
    /// grammar forbids (or an EOS, which ends the request anyway), so the
    /// round counts it as a mismatch. The matcher ends where it started.
    pub fn draft_masks(&mut self, drafts: &mut Vec<u32>) -> Result<Vec<u32>, GrammarError> {
        let mut rows = Vec::with_capacity((drafts.len() + 1) * self.vocab.div_ceil(32));
        let mut consumed = 0;
        loop {
            let words = self.allowed_words()?;
            let next = drafts.get(consumed).copied();
            let ok = next.is_some_and(|t| {
                (t as usize) < self.vocab
                    && words[t as usize / 32] >> (t % 32) & 1 == 1
                    && !self.eos.contains(&t)
                    && !self.is_done()
            });
            rows.extend(words);
            if !ok {
                drafts.truncate(consumed);
                break;
            }
            self.advance(next.expect("checked above"))?;
            consumed += 1;
        }
        self.rollback(consumed)?;
        Ok(rows)
    }

    /// Undoes the last `n` accepted tokens.
    pub fn rollback(&mut self, n: usize) -> Result<(), GrammarError> {
        if n == 0 {
            return Ok(());
        }
        let in_matcher = match self.gate.as_mut() {
            None => n,
            Some(g) => {
                let undone = g.trail.split_off(g.trail.len().saturating_sub(n));
                if let Some(&(phase, _)) = undone.first() {
                    g.phase = phase;
                }
                undone.iter().filter(|(_, m)| *m).count()
            }
        };
        if in_matcher == 0 {
            return Ok(());
        }
        self.known = None;
        self.matcher.rollback(in_matcher).map_err(|e| failed("roll back", e))
    }

    /// The grammar is complete and nothing may follow it but EOS.
    pub fn is_done(&self) -> bool {
        self.phase() == Phase::Active && self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llguidance::api::TopLevelGrammar;
    use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
    use llguidance::ParserFactory;

    /// Bytes are tokens 0..=255, then `<think>`, `</think>` and EOS.
    const THINK: u32 = 256;
    const END: u32 = 257;
    const EOS: u32 = 258;

    fn constraint(regex: &str) -> Constraint {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for s in ["<think>", "</think>", "<|end|>"] {
            let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            w.extend_from_slice(s.as_bytes());
            words.push(w);
        }
        let info = TokRxInfo::new(words.len() as u32, EOS);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env).unwrap();
        factory.quiet();
        let m = Matcher::new(factory.create_parser(TopLevelGrammar::from_regex(regex)));
        Constraint::new(m, words.len(), vec![EOS], Default::default())
    }

    fn allowed(c: &mut Constraint) -> Vec<u32> {
        let flags = c.allowed().unwrap();
        (0..flags.len() as u32).filter(|&t| flags[t as usize]).collect()
    }

    #[test]
    fn an_open_block_is_free_until_its_end_then_the_grammar_runs() {
        let mut c = constraint("yes|no").after_reasoning(ReasoningGate { start: None, end: END, open: true });
        let free = allowed(&mut c);
        assert_eq!(free.len(), 258, "everything but EOS inside the block");
        assert!(!free.contains(&EOS));
        for t in b"any text, <think> too".iter().map(|&b| u32::from(b)).chain([THINK]) {
            c.accept(t).unwrap();
        }
        assert!(!c.is_done());
        c.accept(END).unwrap();
        assert_eq!(allowed(&mut c), vec![u32::from(b'n'), u32::from(b'y')]);
        for b in b"yes" {
            c.accept(u32::from(*b)).unwrap();
        }
        assert!(c.is_done());
        assert_eq!(allowed(&mut c), vec![EOS]);
    }

    #[test]
    fn the_first_token_may_open_a_block_or_begin_the_grammar() {
        let gate = ReasoningGate { start: Some(THINK), end: END, open: false };
        let mut c = constraint("yes|no").after_reasoning(gate);
        assert_eq!(allowed(&mut c), vec![u32::from(b'n'), u32::from(b'y'), THINK]);
        c.accept(u32::from(b'y')).unwrap();
        assert_eq!(allowed(&mut c), vec![u32::from(b'e')], "the grammar took the first token");
        c.rollback(1).unwrap();
        assert_eq!(allowed(&mut c), vec![u32::from(b'n'), u32::from(b'y'), THINK], "back at the start");
        let mut c = constraint("yes|no").after_reasoning(gate);
        c.accept(THINK).unwrap();
        assert_eq!(allowed(&mut c).len(), 258, "a block opened");
    }

    #[test]
    fn drafts_and_rollback_cross_the_end_of_the_block() {
        let mut c = constraint("yes|no").after_reasoning(ReasoningGate { start: None, end: END, open: true });
        c.accept(u32::from(b'x')).unwrap();
        // x is accepted; drafts: more reasoning, the end, then the answer
        // until a token the grammar forbids.
        let mut drafts = vec![u32::from(b'z'), END, u32::from(b'n'), u32::from(b'q')];
        let rows = c.draft_masks(&mut drafts).unwrap();
        assert_eq!(drafts, vec![u32::from(b'z'), END, u32::from(b'n')], "q is cut");
        let words = 259usize.div_ceil(32);
        assert_eq!(rows.len(), 4 * words);
        let row_allows = |r: usize, t: u32| rows[r * words + t as usize / 32] >> (t % 32) & 1 == 1;
        assert!(row_allows(1, u32::from(b'q')), "still free after z");
        assert!(!row_allows(2, u32::from(b'q')) && row_allows(2, u32::from(b'y')), "the grammar after the end");
        assert!(row_allows(3, u32::from(b'o')) && !row_allows(3, u32::from(b'q')));
        // The matcher ended where it started: free.
        assert_eq!(allowed(&mut c).len(), 258);
        for t in [u32::from(b'z'), END, u32::from(b'n')] {
            c.accept(t).unwrap();
        }
        c.rollback(2).unwrap();
        assert_eq!(allowed(&mut c).len(), 258, "rolled back before the end: free again");
        c.accept(END).unwrap();
        assert_eq!(allowed(&mut c), vec![u32::from(b'n'), u32::from(b'y')]);
    }
}
