//! From a parsed request to a job on the engine worker, and back as a
//! stream of events. Sampling precedence: request > server flag >
//! generation_config.json > built-in (temperature 1.0, as OpenAI).

use crate::error::ApiError;
use crate::state::AppState;
use crate::structured::{self, Requested};
use crate::wire::Common;
use host_engine::constraint::ReasoningGate;
use host_engine::work::SubmitError;
use host_engine::{EngineError, Event, InputJob, InputOut, InputTask, Job};
use host_engine::{Flow, GenerateRequest, SamplingParams};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

/// A submitted job: its events, and a flag that stops it (stop string hit).
pub struct Running {
    pub events: UnboundedReceiver<Event>,
    pub stop: Arc<AtomicBool>,
    pub prompt_tokens: usize,
    pub started: std::time::Instant,
}

/// Validates the request against the model and builds one engine request
/// per choice (`n`), each under its own matcher of `grammar` when one is
/// asked for (behind `gate` when the model reasons first: the grammar
/// constrains the answer after its reasoning block). Seeded choices draw
/// from `seed`, `seed + 1`, ...
pub fn requests(
    st: &AppState,
    c: &Common,
    prompt: Vec<u32>,
    logprobs: Option<usize>,
    grammar: Option<&Requested>,
    gate: Option<ReasoningGate>,
) -> Result<Vec<GenerateRequest>, ApiError> {
    let first = request(st, c, prompt, logprobs)?;
    let mut out = Vec::with_capacity(c.n);
    for i in 0..c.n {
        let mut params = first.params.clone();
        params.seed = first.params.seed.map(|s| s.wrapping_add(i as u64));
        let constraint = match grammar {
            Some(g) => {
                let c = structured::compile(st.text.as_deref(), g)?;
                Some(match gate {
                    Some(gate) => c.after_reasoning(gate),
                    None => c,
                })
            }
            None => None,
        };
        out.push(GenerateRequest {
            prompt: first.prompt.clone(),
            max_tokens: first.max_tokens,
            params,
            stop_on_eos: first.stop_on_eos,
            logprobs: first.logprobs,
            constraint,
        });
    }
    Ok(out)
}

/// Validates the request's numbers against the model and builds the engine request.
fn request(st: &AppState, c: &Common, prompt: Vec<u32>, logprobs: Option<usize>) -> Result<GenerateRequest, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::param("prompt", "the prompt is empty"));
    }
    let ctx = st.info.max_context;
    if ctx > 0 && prompt.len() >= ctx {
        return Err(ApiError::context_length(format!(
            "this model's maximum context length is {ctx} tokens, but the prompt has {} tokens",
            prompt.len()
        )));
    }
    let room = if ctx > 0 { ctx - prompt.len() } else { usize::MAX };
    let max_tokens = match c.max_tokens {
        Some(n) if n <= 0 => return Err(ApiError::param("max_tokens", format!("`max_tokens` must be at least 1, got {n}"))),
        Some(n) if n as u64 > room as u64 => {
            return Err(ApiError::context_length(format!(
                "this model's maximum context length is {ctx} tokens; the prompt has {} tokens and `max_tokens` asks for {n} more",
                prompt.len()
            )))
        }
        Some(n) => n as usize,
        None => st.cfg.default_max_tokens.min(room),
    };
    if let Some(why) = st.memory.refuse(&st.budget, prompt.len() as u64, (prompt.len() + max_tokens) as u64) {
        st.worker.stats.admission_refusals.fetch_add(1, Ordering::Relaxed);
        let mut e = ApiError::param("max_tokens", why);
        e.code = Some("insufficient_memory");
        return Err(e);
    }
    if let Some(bad) = prompt.iter().find(|&&t| t >= st.info.vocab_size) {
        return Err(ApiError::param(
            "prompt",
            format!("token id {bad} is outside the vocabulary (size {})", st.info.vocab_size),
        ));
    }
    let gen = st.text.as_ref().map(|t| t.defaults.clone()).unwrap_or_default();
    let d = &st.cfg.defaults;
    let pick = |req: Option<f64>, flag: Option<f32>, file: Option<f32>, builtin: f32| {
        req.map(|v| v as f32).or(flag).or(file).unwrap_or(builtin)
    };
    let top_k = match c.top_k {
        Some(k) if k < 0 => return Err(ApiError::param("top_k", "`top_k` must be 0 (off) or positive")),
        // Past u32 it keeps every token all the same (a wrapped cast could make it 1: greedy).
        Some(k) => u32::try_from(k).unwrap_or(u32::MAX),
        None => d.top_k.or(gen.top_k).unwrap_or(0),
    };
    let seed = match c.seed {
        Some(s) if s < 0 => return Err(ApiError::param("seed", "`seed` must be a non-negative integer")),
        s => s.map(|s| s as u64),
    };
    let params = SamplingParams {
        temperature: pick(c.temperature, d.temperature, gen.temperature, 1.0),
        top_p: pick(c.top_p, d.top_p, gen.top_p, 1.0),
        top_k,
        min_p: pick(c.min_p, d.min_p, gen.min_p, 0.0),
        repetition_penalty: pick(c.repetition_penalty, d.repetition_penalty, gen.repetition_penalty, 1.0),
        presence_penalty: c.presence_penalty.unwrap_or(0.0) as f32,
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0) as f32,
        seed,
        logit_bias: c.logit_bias.clone(),
        ..Default::default()
    };
    if let Some((bad, _)) = c.logit_bias.iter().find(|(id, _)| *id >= st.info.vocab_size) {
        return Err(ApiError::param(
            "logit_bias",
            format!("token id {bad} is outside the vocabulary (size {})", st.info.vocab_size),
        ));
    }
    params.validate().map_err(|e| ApiError::param(e.param, e.message))?;
    Ok(GenerateRequest { prompt, max_tokens, params, stop_on_eos: true, logprobs, constraint: None })
}

/// Queues the request; the job stops when `stop` is set or the receiver is gone.
pub fn submit(st: &AppState, id: &str, req: GenerateRequest) -> Result<Running, ApiError> {
    Ok(submit_all(st, id, vec![req])?.remove(0))
}

/// Queues one job per choice, all or none (a 503 queues nothing).
pub fn submit_all(st: &AppState, id: &str, reqs: Vec<GenerateRequest>) -> Result<Vec<Running>, ApiError> {
    if let Some(why) = reqs.iter().find_map(|r| st.worker.refusal(r)) {
        return Err(ApiError::invalid(why));
    }
    let (jobs, runs): (Vec<Job>, Vec<Running>) = reqs.into_iter().map(|req| job(st, id, req)).unzip();
    st.worker.submit_all(jobs).map_err(refused)?;
    Ok(runs)
}

/// Why the worker queued nothing, as the API says it (503s and 500s).
fn refused(e: SubmitError) -> ApiError {
    match e {
        SubmitError::Full => ApiError::busy(),
        SubmitError::Closed => ApiError::internal("the engine has stopped"),
        SubmitError::Restarting => ApiError::restarting(),
    }
}

/// A job for the engine and the handler's end of it.
fn job(st: &AppState, id: &str, req: GenerateRequest) -> (Job, Running) {
    // Resolved once, here; the engine runs what it says.
    let plan = st.planner.plan(&req);
    tracing::info!(id, prompt_tokens = req.prompt.len(), max_tokens = req.max_tokens, plan = %plan.summary(), "request accepted");
    let (tx, rx) = unbounded_channel();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let stats = st.stats.clone();
    let prompt_tokens = req.prompt.len();
    let on_event = Box::new(move |ev: Event| {
        if tx.send(ev).is_err() {
            // The handler (and so the client connection) is gone.
            if !flag.swap(true, Ordering::SeqCst) {
                crate::state::ServerStats::bump(&stats.client_disconnects);
            }
            return Flow::Stop;
        }
        if flag.load(Ordering::SeqCst) {
            Flow::Stop
        } else {
            Flow::Continue
        }
    });
    let running = Running { events: rx, stop, prompt_tokens, started: std::time::Instant::now() };
    (Job { request: req, plan, on_event }, running)
}

/// Runs a whole-input job (embeddings, prompt scoring) on the engine thread
/// and waits for it. `what` names the task in an internal error.
pub async fn run_inputs(
    st: &AppState,
    inputs: Vec<Vec<u32>>,
    task: InputTask,
    what: &str,
) -> Result<InputOut, ApiError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let on_done = Box::new(move |r| {
        let _ = tx.send(r);
    });
    st.worker.inputs(InputJob { inputs, task, on_done }).map_err(refused)?;
    match rx.await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(EngineError::InvalidRequest(m))) => Err(ApiError::invalid(m)),
        Ok(Err(e)) => Err(ApiError::internal(format!("{what} failed: {e}"))),
        Err(_) => Err(ApiError::internal("the engine dropped the request")),
    }
}
