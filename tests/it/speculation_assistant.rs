//! The `assistant` drafter (Gemma 4 assistant heads) against mlx-vlm
//! 0.7.10's own round loop (`models/scripts/assistant_oracle.py`): a tiny
//! random Gemma 4 target (sliding and full layers of different head sizes)
//! and assistant heads built with the reference's classes, tied and with
//! the centroid LM head, with agreement arranged so that rounds accept 0,
//! 1, 2 and 3 drafts. Per round the drafter's logits at each draft step
//! (float32, within 1e-4 + 1e-4|b|), its drafts and the accepted count
//! equal the reference's; the emitted tokens equal plain greedy decoding.
//! The head's query-only layers attend the target's K/V of its last
//! sliding and last full layer, lent by the cache layouts (plugin-api 2.5);
//! its sliding window (8) is narrower than the run, so its sliding layers
//! read only the view's newest positions. Inside continuous batches (over
//! a target whose rings wrap) and at temperature > 0 (rejection sampling)
//! the output stays the target's. A head that does not fit its target, or
//! a target whose layouts lend no K/V, is refused at start in one line.

use it::draft_trace::{
    batched_matches_serial, generate, ids, refusal, rounds, run_oracle, run_oracle_with, same_rounds, sample_four,
    speculate, ShortRounds,
};
use it::{rejection_keeps_the_distribution, Scratch, Server};
use serde_json::Value;
use std::path::Path;

const PROMPT: &str = "5,17,33,8,41,60,22,9";
const MAX_TOKENS: usize = 40;
/// The reference runs a few tokens longer: its last rounds draft up to the
/// budget (and drop what does not fit), ours only what can be emitted, so
/// our last rounds are prefixes of its rounds at the same index.
const REFERENCE_EXTRA: usize = 4;

fn oracle(dir: &Path) -> Value {
    run_oracle("assistant_oracle.py", dir, PROMPT, MAX_TOKENS + REFERENCE_EXTRA)
}

#[test]
fn assistant_rounds_match_the_reference_loop_and_greedy_decoding() {
    let dir = Scratch::new("assistant-oracle");
    let reference = oracle(&dir.0);
    let target = dir.0.join("target");
    let plain_ref = ids(&reference["plain"]);
    let plain = it::draft_trace::generate_ok(&target, PROMPT, MAX_TOKENS, &[]);
    let plain_tokens = ids(&plain["tokens"]);
    assert_eq!(plain_tokens, plain_ref[..MAX_TOKENS], "plain greedy differs from mlx-vlm's Gemma 4");
    for variant in ["assistant", "centroids"] {
        let want = &reference[variant];
        assert_eq!(ids(&want["emitted"]), plain_ref, "{variant}: the reference loop is not lossless here");
        let head = dir.0.join(variant).to_string_lossy().into_owned();
        let trace = dir.0.join("trace.jsonl");
        let (out, ours) = speculate(&target, PROMPT, MAX_TOKENS, &["--draft-model", &head], &trace);
        assert_eq!(ids(&out["tokens"]), plain_tokens, "{variant}: speculation changed the greedy output");
        same_rounds(&ours, &rounds(&want["rounds"]), ShortRounds::Prefix { max_tokens: MAX_TOKENS }, variant);
        let sp = &out["speculation"];
        assert!(sp["disabled"].is_null(), "{variant}: {sp}");
        assert_eq!(sp["kind"].as_str(), Some("assistant"), "{variant}: {sp}");
        let drafted: u64 = ours.iter().map(|r| r.drafts.len() as u64).sum();
        let accepted: u64 = ours.iter().map(|r| r.accepted).sum();
        assert_eq!((sp["drafted"].as_u64(), sp["accepted"].as_u64()), (Some(drafted), Some(accepted)), "{sp}");
        // Rejected, partly and wholly accepted rounds all happened.
        let counts: Vec<u64> = ours.iter().map(|r| r.accepted).collect();
        for n in 0..=3 {
            assert!(counts.contains(&n), "{variant}: no round accepted {n}: {counts:?}");
        }
    }
}

/// The line the host refuses `dir/target` with, its `assistant/` head changed by `edit`.
fn refused(dir: &Path, target: &str, edit: &str) -> String {
    refusal(&dir.join(target), &dir.join("assistant"), edit, &["drafter `draft-assistant`"])
}

/// A 4-bit head (its linear layers affine-quantized in groups of 32,
/// `quantization` in its config): the drafter reads the codes, and its
/// rounds still equal the reference loop's over the same quantized head;
/// the output stays plain greedy.
#[test]
fn a_quantized_assistant_head_matches_the_reference_loop() {
    let dir = Scratch::new("assistant-oracle-q4");
    let reference = run_oracle_with("assistant_oracle.py", &dir.0, PROMPT, MAX_TOKENS + REFERENCE_EXTRA, &["4"]);
    let head = dir.0.join("assistant");
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(head.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["quantization"]["bits"], 4, "{cfg}");
    let head = head.to_string_lossy().into_owned();
    let trace = dir.0.join("trace.jsonl");
    let (out, ours) = speculate(&dir.0.join("target"), PROMPT, MAX_TOKENS, &["--draft-model", &head], &trace);
    assert_eq!(ids(&out["tokens"]), ids(&reference["plain"])[..MAX_TOKENS], "speculation changed the greedy output");
    same_rounds(
        &ours,
        &rounds(&reference["assistant"]["rounds"]),
        ShortRounds::Prefix { max_tokens: MAX_TOKENS },
        "a 4-bit head",
    );
    let counts: Vec<u64> = ours.iter().map(|r| r.accepted).collect();
    assert!(counts.contains(&0) && counts.iter().any(|&n| n > 0), "accepted {counts:?}");
}

#[test]
fn an_assistant_that_does_not_fit_its_target_is_refused_at_start() {
    let dir = Scratch::new("assistant-mismatch");
    oracle(&dir.0);
    for (target, edit, want) in [
        (
            "target",
            "cfg['backbone_hidden_size'] = 32",
            "backbone_hidden_size 32 differs from the target's hidden size 64",
        ),
        ("target", "cfg['text_config']['vocab_size'] = 128", "vocabulary (128) differs from the target's (96)"),
        ("target", "del w['pre_projection.weight']", "missing tensor `pre_projection.weight`"),
        (
            "target",
            "cfg['text_config']['global_head_dim'] = 64",
            "full-attention layers have head size 64, the target's last full-attention layer 32",
        ),
        (
            "target",
            "cfg['text_config']['num_attention_heads'] = 3",
            "3 query heads do not group over the target's 2 K/V heads",
        ),
        ("target-full", "pass", "the head has sliding-window layers and the target no sliding-window layer to attend"),
    ] {
        let line = refused(&dir.0, target, edit);
        assert!(line.contains(want), "{edit}: {line}");
    }
}

/// A cache layout that lends no K/V views (kv-paged, whose gathered pool
/// has no per-row storage to slice) makes the start fail in one line
/// naming the layer, the layout and the tag it lacks.
#[test]
fn an_assistant_over_layouts_that_lend_no_kv_is_refused_at_start() {
    let dir = Scratch::new("assistant-paged");
    oracle(&dir.0);
    let head = dir.0.join("assistant").to_string_lossy().into_owned();
    let out = generate(&dir.0.join("target"), "1,2,3", 4, &["--draft-model", &head, "--paged-kv"]);
    assert!(!out.status.success(), "the host started an assistant over paged K/V");
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("`assistant` drafter reads the K/V")).collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("`kv-paged` cannot lend") && lines[0].contains("no `kv-view:paged`"), "{}", lines[0]);
}

/// The speculation cost rule covers the assistant: a head made useless
/// falls back to plain steps on its own.
#[test]
fn a_useless_assistant_falls_back_to_plain_steps() {
    let dir = Scratch::new("assistant-useless");
    let reference = oracle(&dir.0);
    let plain = ids(&reference["plain"])[..MAX_TOKENS].to_vec();
    let edit = "w['model.norm.weight'] = -w['model.norm.weight']";
    let head = dir.0.join("assistant");
    it::draft_trace::useless_drafter_falls_back(&dir.0.join("target"), PROMPT, &head, edit, &plain, "assistant");
}

/// Inside continuous batches: one head instance per speculating row, each
/// lent its row's K/V of the batch caches; over a target whose sliding
/// window (8) the rows outgrow, so the batched rings wrap and roll back per
/// row; greedy output equals the plain serial server's.
#[test]
fn assistant_inside_continuous_batches_is_lossless() {
    let dir = Scratch::new("assistant-batched");
    oracle(&dir.0);
    for variant in ["assistant", "centroids"] {
        let head = dir.0.join(variant).to_string_lossy().into_owned();
        let (drafted, accepted) = batched_matches_serial(&dir.0.join("target-w8"), &["--draft-model", &head], variant);
        assert!(drafted > 0 && accepted > 0 && accepted < drafted, "{variant}: accepted {accepted} of {drafted}");
    }
}

/// Each batched row drafts as it would alone: over a target whose rings
/// never wrap (serial rounds go on to the end there), every speculating
/// request's drafted and accepted counts in a batch with staggered
/// arrivals equal the same request's served alone. A view lent for the
/// wrong row or the wrong span changes the drafts, whatever the output.
#[test]
fn batched_rows_draft_as_they_would_alone() {
    let dir = Scratch::new("assistant-rows");
    oracle(&dir.0);
    let target = dir.0.join("target");
    let head = dir.0.join("assistant").to_string_lossy().into_owned();
    let bodies = it::draft_trace::mixed_bodies();
    let counts = |v: &Value| {
        let sp = &v["usage"]["speculation"];
        (sp["drafted"].as_u64(), sp["accepted"].as_u64())
    };
    let alone: Vec<_> = {
        let s = Server::start(&target, &["--batch", "1", "--speculate-always", "--draft-model", &head]);
        bodies.iter().map(|b| counts(&s.post("/v1/completions", b).json())).collect()
    };
    let s =
        Server::start(&target, &["--batch", "8", "--speculate-always", "--debug-endpoints", "--draft-model", &head]);
    let together: Vec<_> = s.post_joining("/v1/completions", &bodies, 3).iter().map(counts).collect();
    assert_eq!(together, alone, "(drafted, accepted) per request: batched, then alone");
    assert!(together.iter().any(|c| c.0.unwrap_or(0) > 0), "nothing drafted: {together:?}");
}

/// At temperature > 0 the head draws its drafts from the request's
/// processed distribution and returns it: rejection sampling keeps the
/// target's distribution (four sampled tokens, 400 seeds per arm,
/// chi-square at 99.9% against plain sampling).
#[test]
fn sampled_assistant_drafts_keep_the_target_distribution() {
    let dir = Scratch::new("assistant-sampled");
    oracle(&dir.0);
    let target = dir.0.join("target");
    let head = dir.0.join("assistant").to_string_lossy().into_owned();
    let plain = Server::start(&target, &["--batch", "1"]);
    let spec = Server::start(&target, &["--batch", "1", "--draft-model", &head, "--speculate-always"]);
    let (drafted, accepted) = rejection_keeps_the_distribution(&plain, &spec, 400, sample_four, "assistant");
    assert!(0 < accepted && accepted < drafted, "accepted {accepted} of {drafted}: both outcomes expected");
}
