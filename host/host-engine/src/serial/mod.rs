//! The serial decode loop: chunked prefill, then one step per token with
//! the next step queued on the device (async eval) before the previous
//! token is read, so the host builds graphs while the device computes.
//!
//! The prompt is processed as mlx-lm's `generate_step` does: all but the
//! last token as prefill (chunks of `prefill_step`), then the last token
//! alone produces the first logits. Same graphs, same numbers.

use crate::engine::{Engine, EngineError};
use crate::sampling::{top_logprobs, Sampler, SamplingParams};
use mlx_rs::Array;
use plugin_api::abi_stable::std_types::{ROption, RSlice};
use plugin_api::{CacheBox, ForwardArgs, LogitsMode, Tensor, TensorRef};
use std::time::Instant;

pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub params: SamplingParams,
    /// Stop at the model's EOS ids (off to measure exactly `max_tokens`).
    pub stop_on_eos: bool,
    /// Report the chosen token's logprob and this many alternatives.
    pub logprobs: Option<usize>,
    /// Use the engine's drafter when it has one (a per-request off switch).
    pub speculate: bool,
}

/// One generated token as the caller sees it.
pub struct TokenOut {
    pub id: u32,
    pub logprob: Option<f32>,
    pub top: Vec<(u32, f32)>,
}

/// The caller's answer after each token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    /// Stop now (a stop string matched, or the client went away).
    Stop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// An EOS token (not emitted) or the caller stopped.
    Stop,
    /// `max_tokens` reached.
    Length,
}

pub struct GenerateResult {
    pub tokens: Vec<u32>,
    pub finish: Finish,
    pub prompt_tokens: usize,
    /// Prompt tokens whose state came from the prefix cache.
    pub cached_tokens: usize,
    /// Seconds from start to the first token (prefill + first step).
    pub prefill_s: f64,
    /// Seconds from the first token to the last.
    pub decode_s: f64,
    /// What speculative decoding did, when it ran.
    pub speculation: Option<crate::speculative::SpecStats>,
}

impl GenerateResult {
    pub fn prefill_tps(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill_s.max(1e-9)
    }
    pub fn decode_tps(&self) -> f64 {
        if self.tokens.len() < 2 {
            return 0.0;
        }
        (self.tokens.len() - 1) as f64 / self.decode_s.max(1e-9)
    }
}

fn tensor_ref(a: &Array) -> TensorRef<'_> {
    unsafe { TensorRef::from_raw(a.as_ptr()) }
}

fn take(t: ROption<Tensor>, what: &str) -> Result<Array, EngineError> {
    match t {
        ROption::RSome(t) => Ok(unsafe { Array::from_ptr(t.into_raw()) }),
        ROption::RNone => Err(EngineError::Model(format!("forward returned no {what}"))),
    }
}

impl Engine {
    /// Runs the graph over `tokens` `[B, L]`; returns `[B, V]` last logits
    /// when asked, else the final hidden state (to evaluate the caches).
    pub(crate) fn forward(&self, tokens: &Array, caches: &mut [CacheBox], logits: bool) -> Result<Array, EngineError> {
        let args = ForwardArgs {
            tokens: tensor_ref(tokens),
            logits: if logits { LogitsMode::LAST } else { LogitsMode::NONE },
            want_hidden: !logits,
            taps: RSlice::from_slice(&[]),
        };
        let out = self
            .model
            .graph
            .forward(args, caches.into())
            .into_result()
            .map_err(|e| EngineError::Model(e.to_string()))?;
        if logits {
            let l = take(out.logits, "logits")?;
            let v = l.shape()[l.ndim() - 1];
            Ok(l.reshape(&[-1, v])?)
        } else {
            take(out.hidden, "hidden state")
        }
    }

    /// Prefills `tokens` into `caches` in chunks, evaluating each chunk.
    pub fn prefill(&self, tokens: &[u32], caches: &mut [CacheBox]) -> Result<(), EngineError> {
        let chunks = tokens.len().div_ceil(self.prefill_step.max(1));
        for chunk in tokens.chunks(self.prefill_step.max(1)) {
            self.prefill_chunk(&token_array(chunk), caches)?;
            if chunks > 1 {
                // As mlx-lm between prefill chunks: a chunk's activations go
                // back before the next one allocates its own.
                crate::runtime::clear_cache();
            }
        }
        Ok(())
    }

    /// Runs `tokens` `[B, L]` into `caches` and evaluates the final hidden
    /// state (which evaluates the caches). Evaluating the exported cache
    /// states instead, as mlx-lm does, would skip work nothing stored needs
    /// (KV-shared layers, the last MLP), but on the H200 it made a 40-token
    /// prefill ~8x slower through the HTTP server (TTFT 489 vs 57 ms,
    /// docs/benchmarks.md; the cause is not isolated yet).
    pub(crate) fn prefill_chunk(&self, tokens: &Array, caches: &mut [CacheBox]) -> Result<(), EngineError> {
        self.forward(tokens, caches, false)?.eval()?;
        Ok(())
    }

    /// Fresh serial caches for one request.
    pub fn new_caches(&self) -> Result<Vec<CacheBox>, EngineError> {
        Ok(self.model.new_caches(1)?)
    }

    /// Last-position logits of a full forward over `prompt` with fresh caches
    /// (float32 copy), for parity checks against the oracle.
    pub fn prompt_logits(&self, prompt: &[u32]) -> Result<Vec<f32>, EngineError> {
        let mut caches = self.new_caches()?;
        let l = self.forward(&token_array(prompt), &mut caches, true)?.as_dtype(mlx_rs::Dtype::Float32)?;
        l.eval()?;
        Ok(l.as_slice::<f32>().to_vec())
    }

    /// Generates for one request: speculatively when the engine has a
    /// drafter and the request allows it (no penalties: they need each
    /// token's history before the next is chosen), else plainly.
    pub fn generate(
        &self,
        req: &GenerateRequest,
        on_token: impl FnMut(&TokenOut) -> Flow,
    ) -> Result<GenerateResult, EngineError> {
        if let (true, Some(d)) = (req.speculate && !req.params.has_penalties(), &self.drafter) {
            let mut guard = d.lock().map_err(|_| EngineError::Model("drafter lock poisoned".into()))?;
            let (drafter, kind, depth) = &mut *guard;
            let (mut r, stats) = self.generate_speculative(req, drafter, *depth, kind, on_token)?;
            r.speculation = Some(stats);
            return Ok(r);
        }
        self.generate_plain(req, on_token)
    }

    pub fn generate_plain(
        &self,
        req: &GenerateRequest,
        mut on_token: impl FnMut(&TokenOut) -> Flow,
    ) -> Result<GenerateResult, EngineError> {
        let (start, mut caches, cached) = self.start_request(req)?;
        let head = &req.prompt[..req.prompt.len() - 1];
        if cached < head.len() {
            // A prompt-boundary snapshot: what the next turn of a chat reuses
            // even when its caches cannot trim (a wrapped ring).
            self.prefix_put(head, &caches);
        }
        let mut d = Decoding::new(self, req)?;
        let finish = self.decode_plain(&mut d, &mut caches, usize::MAX, &mut on_token)?.unwrap_or(Finish::Length);
        Ok(self.end_request(d, &mut caches, finish, cached, start))
    }

    /// What every request must be, serial or batched: a prompt of ids in
    /// the vocabulary, and valid sampling parameters.
    pub(crate) fn check_request(&self, req: &GenerateRequest) -> Result<(), EngineError> {
        if req.prompt.is_empty() {
            return Err(EngineError::InvalidRequest("the prompt is empty".into()));
        }
        req.params.validate().map_err(EngineError::InvalidRequest)?;
        let vocab = self.model.plan.vocab_size;
        if let Some(bad) = req.prompt.iter().find(|&&t| t >= vocab) {
            return Err(EngineError::InvalidRequest(format!(
                "token id {bad} is outside the vocabulary (size {vocab})"
            )));
        }
        Ok(())
    }

    /// A serial request's start, shared by the plain and speculative loops:
    /// checks the request, then prefills all but the prompt's last token
    /// into fresh caches, from the prefix cache where it can. Returns when
    /// it started, the caches, and the prompt tokens the prefix cache served.
    pub(crate) fn start_request(&self, req: &GenerateRequest) -> Result<(Instant, Vec<CacheBox>, usize), EngineError> {
        self.check_request(req)?;
        let start = Instant::now();
        let mut caches = self.new_caches()?;
        let head = &req.prompt[..req.prompt.len() - 1];
        let cached = self.prefix_take(&req.prompt, &mut caches);
        self.prefill(&head[cached..], &mut caches)?;
        Ok((start, caches, cached))
    }

    /// A serial request's end: stores its final state in the prefix cache
    /// and reports it.
    pub(crate) fn end_request(
        &self,
        d: Decoding,
        caches: &mut [CacheBox],
        finish: Finish,
        cached: usize,
        start: Instant,
    ) -> GenerateResult {
        let Decoding { req, history, out, first_at, .. } = d;
        let first_at = first_at.unwrap_or_else(Instant::now);
        self.prefix_put_final(&history, caches);
        GenerateResult {
            tokens: out,
            finish,
            prompt_tokens: req.prompt.len(),
            cached_tokens: cached,
            speculation: None,
            prefill_s: (first_at - start).as_secs_f64(),
            decode_s: first_at.elapsed().as_secs_f64(),
        }
    }
}

/// A request's decoding in progress. The caches hold `history` minus its
/// last token, which the next step feeds (the same invariant in the plain
/// loop and between speculative rounds, so either can continue the other).
pub(crate) struct Decoding<'r> {
    pub req: &'r GenerateRequest,
    pub sampler: Sampler,
    pub eos: Vec<u32>,
    /// Prompt plus every emitted token.
    pub history: Vec<u32>,
    pub out: Vec<u32>,
    pub first_at: Option<Instant>,
}

impl<'r> Decoding<'r> {
    pub fn new(engine: &Engine, req: &'r GenerateRequest) -> Result<Self, EngineError> {
        let eos = if req.stop_on_eos { engine.eos_ids() } else { Vec::new() };
        Ok(Decoding {
            req,
            sampler: Sampler::new(req.params.clone())?,
            eos,
            history: req.prompt.clone(),
            out: Vec::new(),
            first_at: None,
        })
    }
}

impl Engine {
    /// Plain steps until the request ends (`Some`: EOS, the caller's stop,
    /// or `max_tokens`) or `limit` more tokens were emitted (`None`, with
    /// nothing queued, so speculation can take over again). Penalties read
    /// the full history, so those steps wait for each token; everything
    /// else keeps one step queued ahead.
    pub(crate) fn decode_plain(
        &self,
        d: &mut Decoding,
        caches: &mut [CacheBox],
        limit: usize,
        on_token: &mut impl FnMut(&TokenOut) -> Flow,
    ) -> Result<Option<Finish>, EngineError> {
        let req = d.req;
        let budget = limit.min(req.max_tokens.saturating_sub(d.out.len()));
        if budget == 0 {
            return Ok((d.out.len() >= req.max_tokens).then_some(Finish::Length));
        }
        let pipelined = !req.params.has_penalties();
        let sampler = &mut d.sampler;
        // HOST_STEP_TRACE=1: each step's host time building its graph and
        // handing it to the device (async_eval), on stderr.
        let trace = std::env::var_os("HOST_STEP_TRACE").is_some();
        let mut step =
            |input: &Array, history: &[u32], caches: &mut [CacheBox]| -> Result<(Array, Array), EngineError> {
                let t0 = Instant::now();
                let logits = self.forward(input, caches, true)?;
                let logits = sampler.process(logits, history)?;
                let lp = Sampler::logprobs(&logits)?;
                let y = sampler.sample(&lp)?;
                let t1 = Instant::now();
                mlx_rs::transforms::async_eval([&y])?;
                if trace {
                    eprintln!(
                        "step-trace graph_ms={:.2} launch_ms={:.2}",
                        (t1 - t0).as_secs_f64() * 1e3,
                        t1.elapsed().as_secs_f64() * 1e3
                    );
                }
                Ok((y, lp))
            };
        let pending = *d.history.last().expect("a decoding has a prompt");
        let (mut y, mut lp) = step(&token_array(&[pending]), &d.history, caches)?;
        for n in 0..budget {
            let next =
                if pipelined && n + 1 < budget { Some(step(&y.reshape(&[1, 1])?, &d.history, caches)?) } else { None };
            let id = y.try_item_cast::<u32>()?;
            d.first_at.get_or_insert_with(Instant::now);
            if d.eos.contains(&id) {
                return Ok(Some(Finish::Stop));
            }
            let (logprob, top) = match req.logprobs {
                Some(k) => (Some(lp.index_id(id)?), top_logprobs(&lp, k)?),
                None => (None, Vec::new()),
            };
            d.out.push(id);
            d.history.push(id);
            if on_token(&TokenOut { id, logprob, top }) == Flow::Stop {
                return Ok(Some(Finish::Stop));
            }
            if d.out.len() >= req.max_tokens {
                return Ok(Some(Finish::Length));
            }
            if n + 1 == budget {
                break;
            }
            if d.out.len() % CLEAR_CACHE_EVERY == 0 {
                // As mlx-lm's generate_step: freed buffers go back every 256 tokens.
                crate::runtime::clear_cache();
            }
            (y, lp) = match next {
                Some(v) => v,
                None => step(&token_array(&[id]), &d.history, caches)?,
            };
        }
        Ok(None)
    }
}

/// Serial decode steps between clearings of MLX's buffer cache.
const CLEAR_CACHE_EVERY: usize = 256;

/// int32 `[1, L]` token ids.
pub fn token_array(ids: &[u32]) -> Array {
    let v: Vec<i32> = ids.iter().map(|&t| t as i32).collect();
    Array::from_slice(&v, &[1, v.len() as i32])
}

pub(crate) trait IndexId {
    fn index_id(&self, id: u32) -> Result<f32, EngineError>;
}

impl IndexId for Array {
    /// `self[0, id]` as f32.
    fn index_id(&self, id: u32) -> Result<f32, EngineError> {
        use mlx_rs::ops::indexing::IndexOp;
        let v = self.index((0, id as i32)).as_dtype(mlx_rs::Dtype::Float32)?;
        Ok(v.try_item_cast::<f32>()?)
    }
}
