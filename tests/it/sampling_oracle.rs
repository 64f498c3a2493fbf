//! The sampler against mlx-lm's on fixed logits: logit bias and the
//! repetition, presence and frequency penalties (mlx-lm's logits
//! processors), and the distribution each setting of temperature, top-p,
//! min-p and top-k draws from (mlx-lm's sampler filters), computed by
//! `models/scripts/sampling_oracle.py` on the very same logits and history.

use host_engine::sampling::{Sampler, SamplingParams};
use it::{python, run_ok, Scratch};
use mlx_rs::Array;
use serde_json::{json, Value};

const V: usize = 257;

/// Deterministic logits with a few clear leaders and a long tail.
fn logits(seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..V)
        .map(|i| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let u = (x >> 40) as f32 / (1u64 << 24) as f32;
            let lead = if i % 37 == 5 { 4.0 } else { 0.0 };
            (u - 0.5) * 6.0 + lead
        })
        .collect()
}

fn cases() -> Vec<(SamplingParams, Vec<u32>)> {
    let history: Vec<u32> = vec![5, 42, 42, 7, 5, 5, 200, 42, 9, 11, 5, 3, 1, 2, 42, 100, 101, 102, 5, 250, 33, 34];
    let base = SamplingParams { temperature: 1.0, ..Default::default() };
    let p = |f: &dyn Fn(&mut SamplingParams)| {
        let mut s = base.clone();
        f(&mut s);
        s
    };
    vec![
        (p(&|_| {}), history.clone()),
        (p(&|s| s.temperature = 0.6), history.clone()),
        (p(&|s| s.top_p = 0.8), history.clone()),
        (p(&|s| s.top_p = 0.3), history.clone()),
        (p(&|s| s.min_p = 0.05), history.clone()),
        (p(&|s| s.top_k = 7), history.clone()),
        (p(&|s| (s.top_p, s.min_p, s.top_k, s.temperature) = (0.9, 0.02, 20, 0.7)), history.clone()),
        (p(&|s| s.repetition_penalty = 1.3), history.clone()),
        (p(&|s| s.repetition_penalty = 0.8), history.clone()),
        (p(&|s| s.presence_penalty = 0.7), history.clone()),
        (p(&|s| s.frequency_penalty = 0.4), history.clone()),
        (p(&|s| s.frequency_penalty = -0.5), history.clone()),
        (p(&|s| s.logit_bias = vec![(42, 5.0), (7, -100.0), (0, 2.5)]), history.clone()),
        (
            p(&|s| {
                s.logit_bias = vec![(5, -3.0)];
                (s.repetition_penalty, s.presence_penalty, s.frequency_penalty) = (1.1, 0.3, 0.2);
                (s.top_p, s.top_k) = (0.95, 40);
            }),
            history.clone(),
        ),
    ]
}

fn params_json(s: &SamplingParams) -> Value {
    let bias: serde_json::Map<String, Value> = s.logit_bias.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    json!({
        "temperature": s.temperature, "top_p": s.top_p, "min_p": s.min_p, "top_k": s.top_k,
        "repetition_penalty": s.repetition_penalty, "presence_penalty": s.presence_penalty,
        "frequency_penalty": s.frequency_penalty, "logit_bias": bias,
    })
}

fn close(what: &str, a: &[f32], b: &[f64], atol: f64) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        let (x, y) = (*x as f64, *y);
        let same_inf = x.is_infinite() && y.is_infinite() && x.signum() == y.signum();
        assert!(same_inf || (x - y).abs() <= atol, "{what}: token {i}: ours {x}, mlx-lm {y}");
    }
}

#[test]
fn penalties_bias_and_filters_match_mlx_lm_on_fixed_logits() {
    let _mlx = it::mlx_exclusive();
    let cases = cases();
    let input: Vec<Value> = cases
        .iter()
        .enumerate()
        .map(|(i, (s, h))| json!({ "logits": logits(i as u64), "history": h, "params": params_json(s) }))
        .collect();
    let dir = Scratch::new("sampling-oracle");
    let (cases_path, out_path) = (dir.0.join("cases.json"), dir.0.join("out.json"));
    std::fs::write(&cases_path, serde_json::to_string(&input).unwrap()).unwrap();
    run_ok(python().arg(it::repo_root().join("models/scripts/sampling_oracle.py")).arg(&cases_path).arg(&out_path));
    let want: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    assert_eq!(want.len(), cases.len());
    let mut filtered = 0;
    for (i, ((params, history), w)) in cases.into_iter().zip(&want).enumerate() {
        let what = format!("case {i} ({params:?})");
        let sampler = Sampler::new(SamplingParams { seed: Some(1), ..params }).unwrap();
        let raw = Array::from_slice(&logits(i as u64), &[1, V as i32]);
        let processed = sampler.process(raw, &history).unwrap();
        let probs = sampler.probabilities(&Sampler::logprobs(&processed).unwrap()).unwrap();
        processed.eval().unwrap();
        probs.eval().unwrap();
        let floats = |v: &Value| -> Vec<f64> {
            v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap_or(f64::NEG_INFINITY)).collect()
        };
        close(&format!("{what}: processed logits"), processed.as_slice::<f32>(), &floats(&w["processed"]), 1e-5);
        close(&format!("{what}: sampling distribution"), probs.as_slice::<f32>(), &floats(&w["probabilities"]), 1e-6);
        let kept = probs.as_slice::<f32>().iter().filter(|&&p| p > 0.0).count();
        assert!(kept >= 1, "{what}: an empty distribution");
        filtered += usize::from(kept < V);
    }
    // Some cases must actually filter: the comparison of zeros bites.
    assert!(filtered >= 2, "only {filtered} case(s) removed any token from the distribution");
}
