//! Pipelined speculative rounds (`Drafter::draft_ahead`) are lossless:
//! with a scripted drafter that proposes the plain greedy continuation
//! (and, when told, a wrong token every few rounds), the serial executor
//! queues round i+1 before reading round i, keeps the queued rounds while
//! everything is accepted, and throws them away, rolling the caches back
//! past both rounds, when not. Greedy output equals plain decoding on a
//! KV-only model and on the hybrid one (whose recurrent layers roll back by
//! snapshot and replay of the whole chain); a stop in the middle of a chain
//! leaves caches that the prefix cache can hand to the next request.
//!
//! In-process: the engine and the plugins run in this test binary, and the
//! drafter is a value implementing the ABI trait, not a plugin.

use host_engine::{DraftAhead, DtypeChoice, Engine, Flow, GenerateRequest, SamplingParams};
use host_loader::Registry;
use mlx_rs::Array;
use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::abi_stable::std_types::{ROption, RSlice};
use plugin_api::*;

/// Proposes `want` (prompt + the plain output) from wherever it is asked,
/// with every `wrong_every`-th proposal's middle token changed (0: never).
struct Oracle {
    want: Vec<u32>,
    wrong_every: usize,
    proposals: usize,
    /// History plus everything proposed since the last `draft`.
    assumed: Vec<u32>,
}

impl Oracle {
    fn propose(&mut self, from: usize, n: usize) -> Vec<u32> {
        let mut out: Vec<u32> = self.want.iter().skip(from).take(n).copied().collect();
        self.proposals += 1;
        if self.wrong_every > 0 && self.proposals % self.wrong_every == 0 && !out.is_empty() {
            let j = out.len() / 2;
            out[j] = out[j] ^ 1;
        }
        out
    }
}

impl Drafter for Oracle {
    fn prefill(&mut self, _prompt: RSlice<'_, u32>) -> PResult<()> {
        PResult::ROk(())
    }

    fn draft(&mut self, args: DraftArgs<'_>) -> PResult<Draft> {
        let h = args.history.as_slice();
        let out = self.propose(h.len(), args.max_tokens as usize);
        self.assumed = [h, &out].concat();
        PResult::ROk(Draft { tokens: out.into_iter().collect(), probabilities: ROption::RNone })
    }

    fn draft_ahead(&mut self, args: DraftAheadArgs<'_>) -> PResult<AheadDraft> {
        // Guesses `pending` as the oracle's next token: right exactly when
        // everything assumed so far is right.
        let at = self.assumed.len();
        let out = self.propose(at + 1, args.max_tokens as usize);
        if !out.is_empty() {
            self.assumed.push(self.want.get(at).copied().unwrap_or(0));
            self.assumed.extend_from_slice(&out);
        }
        let ids: Vec<i32> = out.iter().map(|&t| t as i32).collect();
        let a = Array::from_slice(&ids, &[ids.len() as i32]);
        let raw = a.as_ptr();
        std::mem::forget(a);
        PResult::ROk(AheadDraft { tokens: unsafe { Tensor::from_raw(raw) }, probabilities: ROption::RNone })
    }

    fn commit(&mut self, _accepted: u32) -> PResult<()> {
        PResult::ROk(())
    }
}

const PROMPT: [u32; 15] = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3];
const TOKENS: usize = 40;

fn request(prompt: &[u32], max_tokens: usize, speculate: bool) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        params: SamplingParams::default(),
        stop_on_eos: false,
        logprobs: None,
        speculate,
    }
}

fn engine(target: &str) -> Engine {
    let info = HostInfo { abi_version: ABI_VERSION, host_version: "it".into(), mlx_version: "test".into() };
    let reg = Registry::discover(&it::repo_root().join("plugins"), &info).unwrap();
    Engine::load(&reg, &it::model(target), DtypeChoice::Native).unwrap()
}

fn install(e: &mut Engine, want: &[u32], wrong_every: usize, ahead: bool) {
    let oracle = Oracle { want: want.to_vec(), wrong_every, proposals: 0, assumed: Vec::new() };
    e.set_drafter(Drafter_TO::from_value(oracle, TD_Opaque), "oracle", "test", vec![caps::DRAFT_AHEAD.to_owned()], 4);
    e.speculate_always = true;
    e.draft_ahead = if ahead { DraftAhead::Auto } else { DraftAhead::Off };
}

#[test]
fn pipelined_rounds_keep_the_greedy_output_and_roll_back_past_voided_rounds() {
    let _mlx = it::mlx_exclusive();
    for target in ["tiny/tiny-llama-f32", "tiny/tiny-qwen3_5-f32"] {
        let mut e = engine(target);
        let plain = e.generate_plain(&request(&PROMPT, TOKENS + 8, false), |_| Flow::Continue).unwrap().tokens;
        let want = [&PROMPT[..], &plain].concat();
        let plain = &plain[..TOKENS];
        for (wrong_every, ahead) in [(0, true), (5, true), (5, false)] {
            install(&mut e, &want, wrong_every, ahead);
            let r = e.generate(&request(&PROMPT, TOKENS, true), |_| Flow::Continue).unwrap();
            let s = r.speculation.expect("the request speculated");
            let what = format!("{target}, a wrong token every {wrong_every} proposals, ahead {ahead}: {s:?}");
            assert_eq!(r.tokens, plain, "{what}");
            assert!(s.disabled.is_none() && s.rounds > 3, "{what}");
            match (wrong_every, ahead) {
                // Rounds are queued ahead after two full accepts in a row.
                (0, _) => {
                    assert!(s.accepted == s.drafted && s.ahead_rounds + 4 >= s.rounds && s.ahead_voided == 0, "{what}")
                }
                (_, true) => assert!(s.accepted < s.drafted && s.ahead_rounds > 0 && s.ahead_voided > 0, "{what}"),
                (_, false) => assert!(s.ahead_rounds == 0 && s.ahead_voided == 0, "{what}"),
            }
        }
    }
}

/// A request that ends inside a chain (its length, or the caller's stop
/// after a token of a round that had the next one queued) emits exactly
/// the plain prefix, and stores caches holding exactly that history: the
/// next request, continuing it from the prefix cache, decodes as a fresh
/// plain run would.
#[test]
fn a_request_ending_inside_a_chain_leaves_consistent_caches() {
    let _mlx = it::mlx_exclusive();
    let mut e = engine("tiny/tiny-llama-f32");
    let plain = e.generate_plain(&request(&PROMPT, TOKENS + 8, false), |_| Flow::Continue).unwrap().tokens;
    let want = [&PROMPT[..], &plain].concat();
    e.set_prefix_cache(1 << 30);
    for cut in [13, 18] {
        install(&mut e, &want, 0, true);
        // Stopped by the caller after `cut` tokens (as a stop string does).
        let mut seen = 0;
        let r = e.generate(&request(&PROMPT, TOKENS, true), |_| {
            seen += 1;
            if seen == cut {
                Flow::Stop
            } else {
                Flow::Continue
            }
        });
        let r = r.unwrap();
        let s = r.speculation.unwrap();
        assert_eq!(r.tokens, plain[..cut], "cut {cut}: {s:?}");
        assert!(s.ahead_rounds > 0, "cut {cut}: no chain ran: {s:?}");
        // The next turn: the history so far as its prompt.
        let next_prompt = [&PROMPT[..], &plain[..cut]].concat();
        let next = e.generate_plain(&request(&next_prompt, 8, false), |_| Flow::Continue).unwrap();
        assert!(next.cached_tokens > PROMPT.len(), "cut {cut}: the prefix cache served {} tokens", next.cached_tokens);
        assert_eq!(next.tokens, plain[cut..cut + 8], "cut {cut}: decoding from the stored caches diverged");
        // And by length, on the same engine.
        let r = e.generate(&request(&PROMPT, cut, true), |_| Flow::Continue).unwrap();
        assert_eq!(r.tokens, plain[..cut], "max_tokens {cut}");
    }
}
