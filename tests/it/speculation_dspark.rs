//! The block drafters (`draft-dspark`: DFlash and DSpark; `draft-deepspec`:
//! DeepSpec, the `Gemma4DSparkModel` release) against mlx-vlm 0.7.10's own
//! classes and round loop (`models/scripts/dspark_oracle.py`,
//! `_dflash_rounds`, fixed width): the tiny random Qwen3.5 hybrid of the
//! MTP test as target (tapped at layers 1 and 3), one drafter of each
//! variant, with agreement arranged so that rounds accept none, some and
//! all of their drafts. Per round the logits each draft was chosen from
//! (after the Markov correction for DSpark), the drafts, the accepted count
//! and DSpark's confidences equal the reference's (float32, the parity
//! tolerance); the emitted tokens equal the reference loop's and plain
//! greedy decoding, 4-bit drafters too, and with speculators' gated and
//! rnn Markov heads. Confidence thresholds prune rounds where the
//! confidences say and stay lossless. A drafter that does not fit its
//! target is refused at start, in one line.

use it::draft_trace::{
    batched_matches_serial, generate_ok, ids, refusal, rounds, run_oracle, run_oracle_with, same_rounds, sample_four,
    speculate, useless_drafter_falls_back, Round, ShortRounds,
};
use it::{rejection_keeps_the_distribution, Scratch, Server};
use serde_json::Value;
use std::path::Path;

const PROMPT: &str = "5,17,33,8,41,60,22,9";
const MAX_TOKENS: usize = 40;
/// The reference runs longer, so its rounds at the indices where our
/// budget cuts a block short are full ones (not compared: a block's width
/// changes every slot).
const REFERENCE_EXTRA: usize = 4;
/// Verify width 4 for every drafter (dspark_oracle.py; DeepSpec's 8 capped
/// by its sliding window under this prompt): three drafts a round.
const DRAFTS: u64 = 3;

/// The drafters the oracle makes, with the kind each folder is detected as.
const KINDS: [(&str, &str); 3] = [("dflash", "dspark"), ("dspark", "dspark"), ("deepspec", "deepspec")];
/// The oracle's DSpark drafter with a reduced draft vocabulary (speculators' layout only).
const REDUCED: &str = "speculators-dspark-reduced";

fn oracle(dir: &Path) -> Value {
    run_oracle("dspark_oracle.py", dir, PROMPT, MAX_TOKENS + REFERENCE_EXTRA)
}

fn totals(rounds: &[Round]) -> (u64, u64) {
    (rounds.iter().map(|r| r.drafts.len() as u64).sum(), rounds.iter().map(|r| r.accepted).sum())
}

#[test]
fn block_rounds_match_the_reference_loop_and_greedy_decoding() {
    let dir = Scratch::new("dspark-oracle");
    let reference = oracle(&dir.0);
    let target = dir.0.join("target");
    let plain_ref = ids(&reference["plain"]);
    let plain = ids(&generate_ok(&target, PROMPT, MAX_TOKENS, &[])["tokens"]);
    assert_eq!(plain, plain_ref[..MAX_TOKENS], "plain greedy differs from mlx-vlm's Qwen3.5");
    for (kind, detected) in KINDS {
        let want = rounds(&reference[kind]["rounds"]);
        assert_eq!(ids(&reference[kind]["emitted"]), plain_ref, "{kind}: the reference loop is not lossless here");
        let drafter = dir.0.join(kind).to_string_lossy().into_owned();
        let trace = dir.0.join(format!("{kind}.jsonl"));
        // The kind is detected from the folder (its `dflash_config`, or
        // DeepSpec's architecture name).
        let (out, ours) = speculate(&target, PROMPT, MAX_TOKENS, &["--draft-model", &drafter], &trace);
        assert_eq!(ids(&out["tokens"]), plain, "{kind}: speculation changed the greedy output");
        same_rounds(&ours, &want, ShortRounds::Unchecked { max_tokens: MAX_TOKENS }, kind);
        let sp = &out["speculation"];
        assert!(sp["disabled"].is_null(), "{kind}: {sp}");
        assert_eq!(sp["kind"].as_str(), Some(detected), "{kind}: {sp}");
        let (drafted, accepted) = totals(&ours);
        assert_eq!((sp["drafted"].as_u64(), sp["accepted"].as_u64()), (Some(drafted), Some(accepted)), "{kind}: {sp}");
        let full: Vec<u64> = ours.iter().filter(|r| r.drafts.len() as u64 == DRAFTS).map(|r| r.accepted).collect();
        assert!(
            full.contains(&0) && full.iter().any(|a| (1..DRAFTS).contains(a)) && full.contains(&DRAFTS),
            "{kind}: full rounds accepted {full:?}: none, some and all should all happen"
        );
    }
}

/// speculators' gated and rnn Markov heads (`markov_head_type`), which
/// mlx-vlm does not build: the oracle's heads follow speculators' own
/// definitions in MLX inside mlx-vlm's DSpark drafter and round loop. Per
/// round the same logits, drafts and accepted counts; output plain greedy.
#[test]
fn speculators_markov_heads_match_the_reference_loop() {
    let dir = Scratch::new("dspark-heads");
    let reference = oracle(&dir.0);
    let target = dir.0.join("target");
    let plain = ids(&reference["plain"])[..MAX_TOKENS].to_vec();
    for kind in ["dspark-gated", "dspark-rnn"] {
        let drafter = dir.0.join(kind).to_string_lossy().into_owned();
        let trace = dir.0.join(format!("{kind}.jsonl"));
        let (out, ours) = speculate(&target, PROMPT, MAX_TOKENS, &["--draft-model", &drafter], &trace);
        assert_eq!(ids(&out["tokens"]), plain, "{kind}: speculation changed the greedy output");
        same_rounds(
            &ours,
            &rounds(&reference[kind]["rounds"]),
            ShortRounds::Unchecked { max_tokens: MAX_TOKENS },
            kind,
        );
        let (drafted, accepted) = totals(&ours);
        assert!(accepted > 0 && accepted < drafted, "{kind}: drafted {drafted}, accepted {accepted}");
    }
}

/// speculators' on-disk layout (vLLM's drafter library): the oracle writes
/// the same DFlash and DSpark drafters (vanilla, gated and rnn heads) with
/// its config schema and tensor names (`models/scripts/speculators_layout.py`:
/// `speculators_model_type`, `transformer_layer_config`, taps counting the
/// embedding output, `block_size` counting slots). Detected as `dspark`
/// from the folder, each gives the mlx-vlm folder's reference rounds and
/// plain greedy output. Two have a reduced draft vocabulary (48 of the
/// verifier's 96 tokens, `t2d` / `d2t`; the DSpark one with an LM head of
/// its own), which mlx-vlm does not read: their reference is mlx-vlm's
/// loop over its drafter classes with speculators' vocabulary maps added.
#[test]
fn speculators_folders_match_the_reference_loop() {
    let dir = Scratch::new("dspark-speculators");
    let reference = oracle(&dir.0);
    let target = dir.0.join("target");
    let plain = ids(&reference["plain"])[..MAX_TOKENS].to_vec();
    for kind in ["dflash", "dspark", "dspark-gated", "dspark-rnn", "dflash-reduced", "dspark-reduced"] {
        let drafter = dir.0.join(format!("speculators-{kind}")).to_string_lossy().into_owned();
        let trace = dir.0.join(format!("speculators-{kind}.jsonl"));
        let (out, ours) = speculate(&target, PROMPT, MAX_TOKENS, &["--draft-model", &drafter], &trace);
        assert_eq!(ids(&out["tokens"]), plain, "{kind}: speculation changed the greedy output");
        assert_eq!(out["speculation"]["kind"].as_str(), Some("dspark"), "{kind}: {}", out["speculation"]);
        same_rounds(
            &ours,
            &rounds(&reference[kind]["rounds"]),
            ShortRounds::Unchecked { max_tokens: MAX_TOKENS },
            kind,
        );
        // Whole rounds (the width read right), accepting none, some and all.
        let full: Vec<u64> = ours.iter().filter(|r| r.drafts.len() as u64 == DRAFTS).map(|r| r.accepted).collect();
        assert!(
            full.len() + 2 >= ours.len() && full.contains(&0) && full.iter().any(|a| (1..DRAFTS).contains(a)),
            "{kind}: full rounds accepted {full:?} of {} rounds",
            ours.len()
        );
        assert!(full.contains(&DRAFTS), "{kind}: full rounds accepted {full:?}");
    }
}

/// What the block drafters do not build of speculators' format is refused
/// at start in one line naming the key: a reduced draft vocabulary, a
/// target hidden size of its own, the embedding output as a tap, another
/// algorithm; a tap past the target's layers names the decoder layer the
/// id means (speculators' ids count the embedding output).
#[test]
fn speculators_configs_the_block_drafters_do_not_build_are_refused_at_start() {
    let dir = Scratch::new("dspark-speculators-refused");
    oracle(&dir.0);
    let cases = [
        ("cfg['draft_vocab_size'] = 32", "draft_vocab_size 32 (the verifier's is 96) needs the `t2d` map"),
        ("cfg['draft_vocab_size'] = 97", "draft_vocab_size 97 must be between 1 and the verifier's vocabulary 96"),
        ("cfg['target_hidden_size'] = 128", "target_hidden_size 128 differs from the draft's hidden_size 64"),
        ("cfg['aux_hidden_state_layer_ids'] = [0, 2]", "aux_hidden_state_layer_ids: 0 (the embedding output)"),
        ("cfg['aux_hidden_state_layer_ids'] = [2, 5]", "taps layer 4, the target has 4 decoder layers"),
        ("cfg['speculators_model_type'] = 'eagle3'", "speculators_model_type `eagle3` is not built"),
        ("cfg['transformer_layer_config']['attention_bias'] = True", "attention_bias"),
    ];
    for (edit, want) in cases {
        let line =
            refusal(&dir.0.join("target"), &dir.0.join("speculators-dspark"), edit, &["`draft-dspark`", "`dspark`"]);
        assert!(line.contains(want), "{edit}: {line}");
    }
}

/// 4-bit drafters (their linear layers whose inputs split into groups of
/// 32 affine-quantized, `quantization` in their configs): the rounds still
/// equal the reference loop's over the same quantized drafters, and the
/// output stays plain greedy.
#[test]
fn quantized_block_drafters_match_the_reference_loop() {
    let dir = Scratch::new("dspark-oracle-q4");
    let reference = run_oracle_with("dspark_oracle.py", &dir.0, PROMPT, MAX_TOKENS + REFERENCE_EXTRA, &["4"]);
    let target = dir.0.join("target");
    let plain = ids(&reference["plain"])[..MAX_TOKENS].to_vec();
    for (kind, _) in KINDS {
        let cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.0.join(kind).join("config.json")).unwrap()).unwrap();
        assert_eq!(cfg["quantization"]["bits"], 4, "{cfg}");
        let drafter = dir.0.join(kind).to_string_lossy().into_owned();
        let trace = dir.0.join(format!("{kind}.jsonl"));
        let (out, ours) = speculate(&target, PROMPT, MAX_TOKENS, &["--draft-model", &drafter], &trace);
        assert_eq!(ids(&out["tokens"]), plain, "{kind}: speculation changed the greedy output");
        same_rounds(
            &ours,
            &rounds(&reference[kind]["rounds"]),
            ShortRounds::Unchecked { max_tokens: MAX_TOKENS },
            kind,
        );
        let (drafted, accepted) = totals(&ours);
        assert!(accepted > 0 && accepted < drafted, "{kind}: drafted {drafted}, accepted {accepted}");
    }
}

#[test]
fn confidence_thresholds_cut_rounds_where_the_confidences_fall() {
    let dir = Scratch::new("dspark-prune");
    let reference = oracle(&dir.0);
    let target = dir.0.join("target");
    let plain = ids(&generate_ok(&target, PROMPT, MAX_TOKENS, &[])["tokens"]);
    // A threshold between the reference's confidences, so some rounds are
    // cut and some are not.
    let mut all: Vec<f64> = rounds(&reference["dspark"]["rounds"]).iter().flat_map(|r| r.confidence.clone()).collect();
    all.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let threshold = all[all.len() / 3];
    let drafter = dir.0.join("dspark").to_string_lossy().into_owned();
    let option = format!("confidence-thresholds={threshold}");
    let trace = dir.0.join("pruned.jsonl");
    let source = ["--draft-model", drafter.as_str(), "--draft-option", option.as_str()];
    let (out, ours) = speculate(&target, PROMPT, MAX_TOKENS, &source, &trace);
    assert_eq!(ids(&out["tokens"]), plain, "pruned rounds changed the greedy output");
    let mut cut = 0;
    for (i, r) in ours.iter().enumerate() {
        let keep = r.confidence.iter().position(|&c| c < threshold).unwrap_or(r.confidence.len());
        assert_eq!(r.drafts.len(), keep, "round {i}: confidences {:?} under {threshold}", r.confidence);
        cut += usize::from(keep < r.confidence.len());
    }
    let kept: Vec<usize> = ours.iter().map(|r| r.drafts.len()).collect();
    assert!(cut > 0 && kept.contains(&(DRAFTS as usize)), "rounds kept {kept:?}: some cut and some whole expected");
}

/// The speculation cost rule covers the block drafters: made useless, each
/// falls back to plain steps on its own.
#[test]
fn useless_block_drafters_fall_back_to_plain_steps() {
    let dir = Scratch::new("dspark-useless");
    let reference = oracle(&dir.0);
    let plain = ids(&reference["plain"])[..MAX_TOKENS].to_vec();
    for (kind, _) in KINDS {
        let edit = "w['norm.weight'] = -w['norm.weight']";
        useless_drafter_falls_back(&dir.0.join("target"), PROMPT, &dir.0.join(kind), edit, &plain, kind);
    }
}

#[test]
fn a_block_drafter_that_does_not_fit_its_target_is_refused_at_start() {
    let dir = Scratch::new("dspark-mismatch");
    oracle(&dir.0);
    let cases = [
        ("cfg['hidden_size'] = 32", "hidden size 32 differs from the target's 64"),
        ("cfg['vocab_size'] = 128", "vocabulary (128) differs from the target's (96)"),
        ("cfg['dflash_config']['num_target_layers'] = 6", "made for 6 target layers, the target has 4"),
        ("cfg['dflash_config']['target_layer_ids'] = [1, 9]", "taps layer 9, the target has 4 decoder layers"),
        ("cfg['dflash_config']['markov_head_type'] = 'lstm'", "markov_head_type `lstm` is not built"),
        // An rnn head asked of a vanilla head's weights.
        ("cfg['dflash_config']['markov_head_type'] = 'rnn'", "missing tensor `markov_head.joint_proj.weight`"),
        ("del w['fc.weight']", "missing tensor `fc.weight`"),
        (
            "w['markov_head.markov_w1.weight'] = w['markov_head.markov_w1.weight'][:, :4]",
            "markov_head.markov_w1.weight",
        ),
    ];
    for (edit, want) in cases {
        let line = refusal(&dir.0.join("target"), &dir.0.join("dspark"), edit, &["`draft-dspark`", "`dspark`"]);
        assert!(line.contains(want), "{edit}: {line}");
    }
    let cases = [
        ("cfg['hidden_size'] = 32", "hidden size 32 differs from the target's 64"),
        ("cfg['target_layer_ids'] = [1, 9]", "taps layer 9, the target has 4 decoder layers"),
        ("cfg['layer_types'][1] = 'sliding_attention'", "`sliding_attention` is not built"),
        ("cfg['markov_head_type'] = 'lstm'", "markov_head_type `lstm` is not built"),
        // Keys and values of their own: two KV heads, no `v_proj` on file.
        (
            "cfg['attention_k_eq_v'] = False",
            "`layers.0.self_attn.k_proj.weight` has shape [32, 64], config.json implies [64, 64]",
        ),
        ("del w['lm_head.weight']", "missing tensor `lm_head.weight`"),
        ("del w['layers.1.layer_scalar']", "missing tensor `layers.1.layer_scalar`"),
    ];
    for (edit, want) in cases {
        let line = refusal(&dir.0.join("target"), &dir.0.join("deepspec"), edit, &["`draft-deepspec`", "`deepspec`"]);
        assert!(line.contains(want), "{edit}: {line}");
    }
}

/// At temperature > 0 the drafters draw their drafts from the request's
/// processed distribution and return it; rejection sampling then keeps the
/// target's distribution: the joint outcome of four sampled tokens (top_k
/// 2 at temperature 1: 16 cells; a plain first step, then rounds of up to
/// two drafts and the bonus), 400 seeds per arm, chi-square at 99.9%
/// against plain sampling.
#[test]
fn sampled_block_drafts_keep_the_target_distribution() {
    let dir = Scratch::new("dspark-sampled");
    oracle(&dir.0);
    let target = dir.0.join("target");
    let plain = Server::start(&target, &["--batch", "1"]);
    // With them, a reduced draft vocabulary: its probabilities, over 48 of
    // the 96 tokens, reach the host spread over all of them.
    for kind in KINDS.iter().map(|k| k.0).chain([REDUCED]) {
        let drafter = dir.0.join(kind).to_string_lossy().into_owned();
        let spec = Server::start(&target, &["--batch", "1", "--draft-model", &drafter, "--speculate-always"]);
        let (drafted, accepted) = rejection_keeps_the_distribution(&plain, &spec, 400, sample_four, kind);
        assert!(0 < accepted && accepted < drafted, "{kind}: accepted {accepted} of {drafted}: both outcomes expected");
    }
}

/// Inside continuous batches: each speculating row has its own drafter
/// instance fed its prompt's taps and every verify's; rows arrive while
/// others decode, plain rows (a penalty) share the steps, and the second
/// pass starts from the prefix cache. Greedy output equals the plain serial
/// server's.
#[test]
fn block_drafters_inside_continuous_batches_are_lossless() {
    let dir = Scratch::new("dspark-batched");
    oracle(&dir.0);
    let target = dir.0.join("target");
    for kind in KINDS.iter().map(|k| k.0).chain([REDUCED]) {
        let drafter = dir.0.join(kind).to_string_lossy().into_owned();
        let (drafted, accepted) = batched_matches_serial(&target, &["--draft-model", &drafter], kind);
        assert!(drafted > 0 && accepted > 0 && accepted < drafted, "{kind}: accepted {accepted} of {drafted}");
    }
}
