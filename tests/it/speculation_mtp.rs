//! The `mtp` drafter (Qwen3.5 multi-token prediction) against mlx-vlm
//! 0.7.10's own round loop (`models/scripts/mtp_oracle.py`): a tiny random
//! Qwen3.5 hybrid and an MTP head built with the reference's classes, with
//! agreement arranged so that rounds accept 0, 1 and 2 drafts. Per round the
//! drafter's logits at each draft step (float32, within the suite's parity
//! tolerance 1e-4 + 1e-4|b|: the target's hidden states carry its own
//! accumulation-order noise, up to 1.1e-4 on logits near 5), its drafts and the
//! accepted count equal the reference's; the emitted tokens equal the
//! reference loop's and plain greedy decoding. The head is read from a
//! `qwen3_5_mtp` folder, the `mtp.*` tensors of the target's checkpoint and
//! speculators' mtp folder;
//! a 4-bit head matches the reference loop over the same quantized head.
//! A head that does not fit its target is refused at start, in one line.
//! Inside continuous batches and at temperature > 0 (rejection sampling)
//! the output stays the target's.

use it::draft_trace::{
    batched_matches_serial, ids, refusal, rounds, run_oracle, run_oracle_with, same_rounds, sample_four, speculate,
    ShortRounds,
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
    run_oracle("mtp_oracle.py", dir, PROMPT, MAX_TOKENS + REFERENCE_EXTRA)
}

#[test]
fn mtp_rounds_match_the_reference_loop_and_greedy_decoding() {
    let dir = Scratch::new("mtp-oracle");
    let reference = oracle(&dir.0);
    let want = rounds(&reference["rounds"]);
    let target = dir.0.join("target");

    // The reference itself: lossless, and a trace that can fail.
    let plain_ref = ids(&reference["plain"]);
    assert_eq!(ids(&reference["emitted"]), plain_ref, "the reference loop is not lossless here");
    let plain = it::draft_trace::generate_ok(&target, PROMPT, MAX_TOKENS, &[]);
    let plain_tokens = ids(&plain["tokens"]);
    assert_eq!(plain_tokens, plain_ref[..MAX_TOKENS], "plain greedy differs from mlx-vlm's Qwen3.5");

    let head = target.join("mtp").to_string_lossy().into_owned();
    let inside = dir.0.join("inside");
    // The same head in speculators' layout (speculators_layout.py): its
    // config schema and `mtp_layers.0.*` names, detected as `mtp`.
    let speculators = dir.0.join("speculators-mtp").to_string_lossy().into_owned();
    for (what, model, source) in [
        ("a qwen3_5_mtp folder", &target, vec!["--draft-model", head.as_str()]),
        ("mtp.* tensors in the target", &inside, vec!["--draft-kind", "mtp"]),
        ("a speculators mtp folder", &target, vec!["--draft-model", speculators.as_str()]),
    ] {
        let trace = dir.0.join("trace.jsonl");
        let (out, ours) = speculate(model, PROMPT, MAX_TOKENS, &source, &trace);
        assert_eq!(ids(&out["tokens"]), plain_tokens, "{what}: speculation changed the greedy output");
        same_rounds(&ours, &want, ShortRounds::Prefix { max_tokens: MAX_TOKENS }, what);
        let sp = &out["speculation"];
        assert!(sp["disabled"].is_null(), "{what}: {sp}");
        assert_eq!(sp["kind"].as_str(), Some("mtp"), "{what}: {sp}");
        let drafted: u64 = ours.iter().map(|r| r.drafts.len() as u64).sum();
        let accepted: u64 = ours.iter().map(|r| r.accepted).sum();
        assert_eq!((sp["drafted"].as_u64(), sp["accepted"].as_u64()), (Some(drafted), Some(accepted)), "{what}: {sp}");
        // Accepted and rejected drafts both happened, partial rounds too.
        let counts: Vec<u64> = ours.iter().map(|r| r.accepted).collect();
        assert!(counts.contains(&0) && counts.contains(&1) && counts.contains(&2), "{what}: accepted {counts:?}");
        // Rounds ran pipelined (queued before the verdict before them was
        // read), and partial rounds dropped the round queued behind them.
        let (pipelined, dropped) = (sp["pipelined"].as_u64().unwrap(), sp["pipelined_dropped"].as_u64().unwrap());
        assert!(pipelined > 0 && dropped > 0, "{what}: {sp}");
    }
}

/// A 4-bit head (its linear layers affine-quantized in groups of 32, as
/// mlx-lm quantizes a checkpoint, `quantization` in its config): the
/// drafter reads the codes, and its rounds still equal the reference loop's
/// over the same quantized head; the output stays plain greedy.
#[test]
fn a_quantized_mtp_head_matches_the_reference_loop() {
    let dir = Scratch::new("mtp-oracle-q4");
    let reference = run_oracle_with("mtp_oracle.py", &dir.0, PROMPT, MAX_TOKENS + REFERENCE_EXTRA, &["4"]);
    let target = dir.0.join("target");
    let cfg: Value = serde_json::from_str(&std::fs::read_to_string(target.join("mtp/config.json")).unwrap()).unwrap();
    assert_eq!(cfg["quantization"]["bits"], 4, "{cfg}");
    let head = target.join("mtp").to_string_lossy().into_owned();
    let trace = dir.0.join("trace.jsonl");
    let (out, ours) = speculate(&target, PROMPT, MAX_TOKENS, &["--draft-model", head.as_str()], &trace);
    assert_eq!(ids(&out["tokens"]), ids(&reference["plain"])[..MAX_TOKENS], "speculation changed the greedy output");
    same_rounds(&ours, &rounds(&reference["rounds"]), ShortRounds::Prefix { max_tokens: MAX_TOKENS }, "a 4-bit head");
    let counts: Vec<u64> = ours.iter().map(|r| r.accepted).collect();
    assert!(counts.contains(&0) && counts.iter().any(|&n| n > 0), "accepted {counts:?}");
}

/// The line the host refuses `dir/target` with, its `mtp/` head changed by `edit`.
fn refused(dir: &Path, edit: &str) -> String {
    refusal(&dir.join("target"), &dir.join("target/mtp"), edit, &["drafter `draft-mtp`"])
}

/// The speculation cost rule covers MTP: a head made useless falls back to
/// plain steps on its own.
#[test]
fn a_useless_mtp_head_falls_back_to_plain_steps() {
    let dir = Scratch::new("mtp-useless");
    let reference = oracle(&dir.0);
    let plain = ids(&reference["plain"])[..MAX_TOKENS].to_vec();
    let edit = "w['norm.weight'] = -w['norm.weight']";
    let head = dir.0.join("target/mtp");
    it::draft_trace::useless_drafter_falls_back(&dir.0.join("target"), PROMPT, &head, edit, &plain, "mtp");
}

#[test]
fn an_mtp_head_that_does_not_fit_its_target_is_refused_at_start() {
    let dir = Scratch::new("mtp-mismatch");
    oracle(&dir.0);
    let line = refused(&dir.0, "cfg['text_config']['hidden_size'] = 32");
    assert!(line.contains("hidden size 32 differs from the target's 64"), "{line}");
    let line = refused(&dir.0, "cfg['text_config']['vocab_size'] = 128");
    assert!(line.contains("vocabulary (128) differs from the target's (96)"), "{line}");
    let line = refused(&dir.0, "del w['fc.weight']");
    assert!(line.contains("missing tensor `fc.weight`"), "{line}");
    let line = refused(&dir.0, "w['layers.0.self_attn.k_proj.weight'] = w['layers.0.self_attn.k_proj.weight'][:16]");
    assert!(line.contains("layers.0.self_attn.k_proj.weight"), "{line}");
    // speculators' layout: what it has and draft-mtp does not build.
    let speculators = dir.0.join("speculators-mtp");
    for (edit, want) in [
        ("cfg['transformer_layer_config']['model_type'] = 'qwen3'", "transformer_layer_config.model_type `qwen3`"),
        ("cfg['num_nextn_predict_layers'] = 2", "num_nextn_predict_layers 2 is not built"),
        ("del w['mtp_layers.0.input_proj.weight']", "missing tensor `mtp_layers.0.input_proj.weight`"),
    ] {
        let line = refusal(&dir.0.join("target"), &speculators, edit, &["drafter `draft-mtp`"]);
        assert!(line.contains(want), "{edit}: {line}");
    }
}

/// Inside continuous batches, as the block drafters (`speculation_dspark`):
/// one head instance per speculating row, fed its prompt's hidden states and
/// every verify's; greedy output equals the plain serial server's.
#[test]
fn mtp_inside_continuous_batches_is_lossless() {
    let dir = Scratch::new("mtp-batched");
    oracle(&dir.0);
    let head = dir.0.join("target/mtp").to_string_lossy().into_owned();
    let (drafted, accepted) = batched_matches_serial(&dir.0.join("target"), &["--draft-model", &head], "mtp");
    assert!(drafted > 0 && accepted > 0 && accepted < drafted, "accepted {accepted} of {drafted}");
}

/// At temperature > 0 the head draws its drafts from the request's processed
/// distribution and returns it: rejection sampling keeps the target's
/// distribution (as `speculation_dspark`: four sampled tokens, 400 seeds per
/// arm, chi-square at 99.9% against plain sampling).
#[test]
fn sampled_mtp_drafts_keep_the_target_distribution() {
    let dir = Scratch::new("mtp-sampled");
    oracle(&dir.0);
    let target = dir.0.join("target");
    let head = target.join("mtp").to_string_lossy().into_owned();
    let plain = Server::start(&target, &["--batch", "1"]);
    let spec = Server::start(&target, &["--batch", "1", "--draft-model", &head, "--speculate-always"]);
    let (drafted, accepted) = rejection_keeps_the_distribution(&plain, &spec, 400, sample_four, "mtp");
    assert!(0 < accepted && accepted < drafted, "accepted {accepted} of {drafted}: both outcomes expected");
}

/// Pipelined rounds (a round queued before the verdict before it is read)
/// stop where the text does: a stop string cuts the request at several
/// points, and each answer is the plain server's up to the stop; the whole
/// answer afterwards (the prompt's state from the prefix cache) is the
/// plain server's too.
#[test]
fn pipelined_rounds_stop_where_the_text_does() {
    let dir = Scratch::new("mtp-stop");
    oracle(&dir.0);
    let target = dir.0.join("target");
    let head = target.join("mtp").to_string_lossy().into_owned();
    let prompt: Vec<u32> = PROMPT.split(',').map(|t| t.parse().unwrap()).collect();
    let body = |stop: Option<&str>| {
        let mut b = serde_json::json!({"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0});
        if let Some(s) = stop {
            b["stop"] = serde_json::json!([s]);
        }
        b
    };
    let plain = Server::start(&target, &["--batch", "1"]);
    let whole = plain.post("/v1/completions", &body(None)).json()["choices"][0]["text"].as_str().unwrap().to_owned();
    let chars: Vec<char> = whole.chars().collect();
    let spec = Server::start(&target, &["--batch", "1", "--draft-model", &head, "--speculate-always"]);
    let mut pipelined = 0;
    for at in (4..chars.len().saturating_sub(4)).step_by((chars.len() / 6).max(1)) {
        let stop: String = chars[at..at + 2].iter().collect();
        let want = plain.post("/v1/completions", &body(Some(&stop))).json();
        let got = spec.post("/v1/completions", &body(Some(&stop))).json();
        assert_eq!(got["choices"][0]["text"], want["choices"][0]["text"], "stop {stop:?}");
        assert_eq!(got["choices"][0]["finish_reason"], "stop", "stop {stop:?}: {got}");
        pipelined += got["usage"]["speculation"]["pipelined"].as_u64().unwrap();
    }
    assert!(pipelined > 0, "no round ran pipelined");
    let again = spec.post("/v1/completions", &body(None)).json();
    assert_eq!(again["choices"][0]["text"].as_str(), Some(whole.as_str()), "after the stops");
}
