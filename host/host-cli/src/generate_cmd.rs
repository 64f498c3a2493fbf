//! `host generate` and `host logits`: one request through the engine, from
//! the command line.

use anyhow::{bail, Context, Result};
use host_engine::{Engine, Flow, GenerateRequest, SamplingParams};
use serde_json::json;
use std::io::Write;

pub struct Prompt {
    pub text: Option<String>,
    pub chat: Option<String>,
    pub ids: Option<String>,
}

/// Turns exactly one of --prompt / --chat / --prompt-ids into token ids.
pub fn prompt_ids(engine: &Engine, p: &Prompt) -> Result<Vec<u32>> {
    let given = [p.text.is_some(), p.chat.is_some(), p.ids.is_some()].iter().filter(|x| **x).count();
    if given != 1 {
        bail!("give exactly one of --prompt, --chat or --prompt-ids");
    }
    if let Some(ids) = &p.ids {
        return ids
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| s.trim().parse::<u32>().with_context(|| format!("--prompt-ids: `{s}` is not a token id")))
            .collect();
    }
    let text = engine.text().context("this model folder has no tokenizer.json: use --prompt-ids")?;
    if let Some(t) = &p.text {
        return Ok(text.encode_prompt(t)?);
    }
    let chat = p.chat.as_ref().unwrap();
    let tmpl = text.template.as_ref().context("this model has no chat template: use --prompt")?;
    let rendered = tmpl.render(&json!([{ "role": "user", "content": chat }]), true, &Default::default())?;
    Ok(text.encode_rendered(&rendered)?)
}

pub fn generate(
    engine: &Engine,
    prompt: Vec<u32>,
    max_tokens: usize,
    params: SamplingParams,
    ignore_eos: bool,
    logprobs: Option<usize>,
    as_json: bool,
) -> Result<()> {
    let req = GenerateRequest {
        prompt: prompt.clone(),
        max_tokens,
        params,
        stop_on_eos: !ignore_eos,
        logprobs,
        constraint: None,
    };
    // One request from the command line: serial, no prompt cache. The plan
    // is what runs (a fallback from speculation decodes plainly).
    let plan = engine.plan(&req, 1);
    // Before the request: the weights this process (this rank) holds.
    let weights_bytes = host_engine::runtime::active_memory();
    let mut detok = engine.text().cloned().map(host_engine::tokenizer::Detokenizer::new);
    let mut lps = Vec::new();
    let mut stdout = std::io::stdout();
    let result = host_engine::serial::generate(engine, &req, &plan, |t| {
        if logprobs.is_some() {
            lps.push(json!({ "id": t.id, "logprob": t.logprob, "top": t.top.iter().map(|(i, l)| json!([i, l])).collect::<Vec<_>>() }));
        }
        if !as_json {
            if let Some(d) = detok.as_mut() {
                let _ = write!(stdout, "{}", d.push(t.id));
                let _ = stdout.flush();
            }
        }
        Flow::Continue
    })?;
    let text = engine.text().map(|t| t.decode(&result.tokens));
    let finish = match result.finish {
        host_engine::Finish::Stop => "stop",
        host_engine::Finish::Length => "length",
    };
    if as_json {
        let mut out = json!({
            "prompt_tokens": prompt,
            "tokens": result.tokens,
            "text": text,
            "finish_reason": finish,
            "prefill_tokens_per_s": result.prefill_tps(),
            "decode_tokens_per_s": result.decode_tps(),
            "compute_dtype": engine.dtype_name(),
            "weights_bytes": weights_bytes,
            "dtype_reason": engine.dtype_reason(),
            "family_plugin": engine.model().family_plugin,
            "cache_layouts": engine.model().layouts,
            "kv_scheme": engine.model().scheme,
            "layer_kv_schemes": engine.model().layer_schemes,
            "execution": { "plan": plan.summary(), "reasons": plan.reasons },
        });
        if logprobs.is_some() {
            out["logprobs"] = json!(lps);
        }
        if let Some(sp) = &result.speculation {
            out["speculation"] = sp.report();
        }
        println!("{}", serde_json::to_string(&out)?);
    } else {
        if let Some(d) = detok.as_mut() {
            println!("{}", d.finish());
        } else {
            println!("{:?}", result.tokens);
        }
        if !crate::tp_launch::is_rank0() {
            return Ok(());
        }
        eprintln!(
            "[{} prompt tokens, {} generated ({finish}); prefill {:.1} tok/s, decode {:.1} tok/s; dtype {} — {}]",
            result.prompt_tokens,
            result.tokens.len(),
            result.prefill_tps(),
            result.decode_tps(),
            engine.dtype_name(),
            engine.dtype_reason()
        );
    }
    Ok(())
}

pub fn logits(engine: &Engine, prompt: Vec<u32>) -> Result<()> {
    let l = engine.prompt_logits(&prompt)?;
    println!(
        "{}",
        serde_json::to_string(&json!({ "prompt_tokens": prompt, "logits": l, "compute_dtype": engine.dtype_name() }))?
    );
    Ok(())
}
