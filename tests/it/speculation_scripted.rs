//! The serial speculative executor with a scripted drafter (a value that
//! implements the ABI trait in this process, not a plugin): it proposes the
//! plain greedy continuation, with a wrong token every few proposals when
//! told. Greedy output equals plain decoding on a KV-only model and on the
//! hybrid one (whose recurrent layers roll back by snapshot and replay); a
//! request stopped in the middle of a round leaves caches holding exactly
//! what it emitted, which the prefix cache hands to the next request; and
//! the plan's prompt-cache decision is obeyed both ways.

use host_engine::{DraftSource, EngineConfig, Flow, GenerateRequest, SamplingParams, SpeculationConfig};
use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::abi_stable::std_types::{ROption, RSlice};
use plugin_api::*;

/// Proposes `want` (prompt + the plain output) from wherever it is asked,
/// with every `wrong_every`-th proposal's middle token changed (0: never).
struct Script {
    want: Vec<u32>,
    wrong_every: usize,
    proposals: usize,
}

impl Drafter for Script {
    fn prefill(&mut self, _prompt: RSlice<'_, u32>) -> PResult<()> {
        PResult::ROk(())
    }

    fn draft(&mut self, args: DraftArgs<'_>) -> PResult<Draft> {
        let from = args.history.len();
        let mut out: Vec<u32> = self.want.iter().skip(from).take(args.max_tokens as usize).copied().collect();
        self.proposals += 1;
        if self.wrong_every > 0 && self.proposals.is_multiple_of(self.wrong_every) && !out.is_empty() {
            let j = out.len() / 2;
            out[j] ^= 1;
        }
        PResult::ROk(Draft { tokens: out.into_iter().collect(), probabilities: ROption::RNone })
    }

    fn commit(&mut self, _accepted: u32) -> PResult<()> {
        PResult::ROk(())
    }
}

const PROMPT: [u32; 15] = [1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 6, 1, 2, 3];
const TOKENS: usize = 40;

fn request(prompt: &[u32], max_tokens: usize) -> GenerateRequest {
    GenerateRequest {
        prompt: prompt.to_vec(),
        max_tokens,
        params: SamplingParams::default(),
        stop_on_eos: false,
        logprobs: None,
        constraint: None,
    }
}

/// An engine speculating with a script of `want`; `prefix_cache` bytes.
fn scripted(target: &str, want: &[u32], wrong_every: usize, prefix_cache: usize) -> host_engine::Engine {
    let script = Script { want: want.to_vec(), wrong_every, proposals: 0 };
    let speculation = SpeculationConfig {
        source: DraftSource::Given {
            drafter: Drafter_TO::from_value(script, TD_Opaque),
            kind: "script".into(),
            capabilities: Vec::new(),
        },
        depth: Some(4),
        always: true,
    };
    it::engine(
        target,
        EngineConfig { prefix_cache_bytes: prefix_cache, speculation: Some(speculation), ..Default::default() },
    )
}

/// Plain greedy tokens of `target`: what a scripted drafter must reproduce.
fn plain(target: &str, max_tokens: usize) -> Vec<u32> {
    let e = it::engine(target, Default::default());
    it::run_serial(&e, &request(&PROMPT, max_tokens), |_| Flow::Continue).tokens
}

#[test]
fn scripted_rounds_keep_the_greedy_output_with_and_without_rejections() {
    let _mlx = it::mlx_exclusive();
    for target in ["tiny/tiny-llama-f32", "tiny/tiny-qwen3_5-f32"] {
        let plain = plain(target, TOKENS + 8);
        let want = [&PROMPT[..], &plain].concat();
        for wrong_every in [0, 3] {
            let e = scripted(target, &want, wrong_every, 0);
            let r = it::run_serial(&e, &request(&PROMPT, TOKENS), |_| Flow::Continue);
            let s = r.speculation.expect("the plan speculated");
            let what = format!("{target}, a wrong token every {wrong_every} proposals: {s:?}");
            assert_eq!(r.tokens, plain[..TOKENS], "{what}");
            assert!(s.disabled.is_none() && s.rounds > 3 && s.drafted > 0, "{what}");
            if wrong_every == 0 {
                assert_eq!(s.accepted, s.drafted, "{what}");
            } else {
                assert!(s.accepted < s.drafted, "{what}");
            }
        }
    }
}

/// A request that ends in the middle of a round (the caller's stop after a
/// token that was not the round's last) emits exactly the plain prefix, and
/// stores caches holding exactly that history: the next request, continuing
/// it from the prefix cache, decodes as a fresh plain run would.
#[test]
fn a_request_stopped_inside_a_round_leaves_consistent_caches() {
    let _mlx = it::mlx_exclusive();
    let target = "tiny/tiny-llama-f32";
    let plain = plain(target, TOKENS + 8);
    let want = [&PROMPT[..], &plain].concat();
    for cut in [13, 18] {
        let e = scripted(target, &want, 0, 1 << 30);
        let mut seen = 0;
        let r = it::run_serial(&e, &request(&PROMPT, TOKENS), |_| {
            seen += 1;
            if seen == cut {
                Flow::Stop
            } else {
                Flow::Continue
            }
        });
        let s = r.speculation.expect("the plan speculated");
        assert_eq!(r.tokens, plain[..cut], "cut {cut}: {s:?}");
        assert!(s.drafted > 0, "cut {cut}: nothing was drafted: {s:?}");
        let next_prompt = [&PROMPT[..], &plain[..cut]].concat();
        let next = it::run_serial(&e, &request(&next_prompt, 8), |_| Flow::Continue);
        assert!(next.cached_tokens > PROMPT.len(), "cut {cut}: the prefix cache served {} tokens", next.cached_tokens);
        assert_eq!(next.tokens, plain[cut..cut + 8], "cut {cut}: decoding from the stored caches diverged");
    }
}

/// The plan's `prompt_cache` is obeyed: a request whose plan says "no
/// prompt cache" neither reads the prefix cache nor writes it, and one
/// whose plan allows it does both, on the same engine.
#[test]
fn a_plan_without_the_prompt_cache_neither_reads_nor_writes_it() {
    let _mlx = it::mlx_exclusive();
    let e = it::engine("tiny/tiny-llama-f32", EngineConfig { prefix_cache_bytes: 1 << 30, ..Default::default() });
    let first = request(&PROMPT, 8);
    let mut plan = e.plan(&first, 1);
    assert!(plan.prompt_cache, "{plan}");
    plan.prompt_cache = false;
    let r = host_engine::serial::generate(&e, &first, &plan, |_| Flow::Continue).unwrap();
    assert_eq!(r.cached_tokens, 0);
    assert_eq!(e.prefix().counters().entries, 0, "a plan without the prompt cache wrote to it");
    // The same request with the cache allowed: it writes...
    let r = it::run_serial(&e, &first, |_| Flow::Continue);
    assert_eq!(r.cached_tokens, 0);
    let entries = e.prefix().counters().entries;
    assert!(entries > 0, "a plan with the prompt cache wrote nothing");
    let counters = e.prefix().counters();
    // ...and a follow-up whose plan says no does not read what is there.
    let next = request(&[&PROMPT[..], &r.tokens].concat(), 4);
    let mut plan = e.plan(&next, 1);
    plan.prompt_cache = false;
    let r = host_engine::serial::generate(&e, &next, &plan, |_| Flow::Continue).unwrap();
    assert_eq!(r.cached_tokens, 0, "a plan without the prompt cache read from it");
    let after = e.prefix().counters();
    assert_eq!((after.hits, after.misses, after.entries), (counters.hits, counters.misses, counters.entries));
    // Allowed, it reads.
    let r = it::run_serial(&e, &next, |_| Flow::Continue);
    assert!(r.cached_tokens > 0, "a plan with the prompt cache did not reuse the stored prefix");
}
