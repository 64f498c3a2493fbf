//! OpenAI request bodies as the server reads them. Everything is parsed
//! from a `serde_json::Value` by hand so that each wrong type gets a 400
//! naming its parameter (serde's messages are not client-friendly), unknown
//! fields are ignored, and recognised-but-unsupported ones are refused.

use crate::error::ApiError;
use serde_json::{Map, Value};

/// Sampling and output fields shared by chat and completions.
#[derive(Debug, Clone, Default)]
pub struct Common {
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub seed: Option<i64>,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// Token id → bias added to its logit (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    /// Choices to generate for the one prompt.
    pub n: usize,
}

/// Most choices one request may ask for (OpenAI's limit).
pub const MAX_N: i64 = host_engine::queue::MAX_GROUP as i64;

pub struct Fields<'a>(pub &'a Map<String, Value>);

impl<'a> Fields<'a> {
    fn get(&self, k: &str) -> Option<&'a Value> {
        self.0.get(k).filter(|v| !v.is_null())
    }

    pub fn number(&self, k: &str) -> Result<Option<f64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .filter(|f| f.is_finite())
                .map(Some)
                .ok_or_else(|| ApiError::param(k, format!("`{k}` must be a number"))),
        }
    }

    pub fn integer(&self, k: &str) -> Result<Option<i64>, ApiError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v.as_i64().map(Some).ok_or_else(|| ApiError::param(k, format!("`{k}` must be an integer"))),
        }
    }

    pub fn boolean(&self, k: &str) -> Result<bool, ApiError> {
        match self.get(k) {
            None => Ok(false),
            Some(v) => v.as_bool().ok_or_else(|| ApiError::param(k, format!("`{k}` must be true or false"))),
        }
    }

    pub fn value(&self, k: &str) -> Option<&'a Value> {
        self.get(k)
    }
}

impl Common {
    pub fn parse(f: &Fields, max_tokens_field: &str) -> Result<Self, ApiError> {
        // One model is served, whatever a request names, but a name that is
        // not a string is a malformed request.
        if f.value("model").is_some_and(|m| !m.is_string()) {
            return Err(ApiError::param("model", "`model` must be a string"));
        }
        // `max_completion_tokens` is the newer name and wins when both are given.
        let max_tokens = match f.integer("max_completion_tokens")? {
            Some(n) => Some(n),
            None => f.integer(max_tokens_field)?,
        };
        let n = match f.integer("n")? {
            None => 1,
            Some(n) if (1..=MAX_N).contains(&n) => n as usize,
            Some(n) => return Err(ApiError::param("n", format!("`n` must be between 1 and {MAX_N}, got {n}"))),
        };
        if f.integer("best_of")?.is_some_and(|b| b != 1 && b != n as i64) {
            return Err(ApiError::unsupported("best_of", "best_of other than n is not supported"));
        }
        let logit_bias = logit_bias(f)?;
        let stop = match f.value("stop") {
            None => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => {
                let v: Option<Vec<String>> = a.iter().map(|x| x.as_str().map(str::to_owned)).collect();
                let v = v.ok_or_else(|| ApiError::param("stop", "`stop` must be a string or an array of strings"))?;
                if v.len() > 4 {
                    return Err(ApiError::param("stop", "`stop` takes at most 4 sequences"));
                }
                v
            }
            Some(_) => return Err(ApiError::param("stop", "`stop` must be a string or an array of strings")),
        };
        if stop.iter().any(String::is_empty) {
            return Err(ApiError::param("stop", "stop sequences must not be empty"));
        }
        let include_usage = match f.value("stream_options") {
            None => false,
            Some(Value::Object(o)) => match o.get("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(ApiError::param(
                        "stream_options",
                        "`stream_options.include_usage` must be true or false",
                    ))
                }
            },
            Some(_) => return Err(ApiError::param("stream_options", "`stream_options` must be an object")),
        };
        Ok(Self {
            max_tokens,
            temperature: f.number("temperature")?,
            top_p: f.number("top_p")?,
            top_k: f.integer("top_k")?,
            min_p: f.number("min_p")?,
            repetition_penalty: f.number("repetition_penalty")?,
            presence_penalty: f.number("presence_penalty")?,
            frequency_penalty: f.number("frequency_penalty")?,
            seed: f.integer("seed")?,
            stop,
            stream: f.boolean("stream")?,
            include_usage,
            logit_bias,
            n,
        })
    }

    /// Chat's sampling fields that another API (Anthropic Messages, OpenAI
    /// Responses) lacks, read as extensions of it: `top_k`, `min_p`,
    /// `repetition_penalty`, `presence_penalty`, `frequency_penalty`,
    /// `seed`, `logit_bias`. Those the request does not give keep their values.
    pub fn sampling_extensions(mut self, f: &Fields) -> Result<Self, ApiError> {
        self.top_k = f.integer("top_k")?.or(self.top_k);
        self.min_p = f.number("min_p")?.or(self.min_p);
        self.repetition_penalty = f.number("repetition_penalty")?.or(self.repetition_penalty);
        self.presence_penalty = f.number("presence_penalty")?.or(self.presence_penalty);
        self.frequency_penalty = f.number("frequency_penalty")?.or(self.frequency_penalty);
        self.seed = f.integer("seed")?.or(self.seed);
        let bias = logit_bias(f)?;
        if !bias.is_empty() {
            self.logit_bias = bias;
        }
        Ok(self)
    }
}

/// `logit_bias`: token id → bias from -100 to 100.
fn logit_bias(f: &Fields) -> Result<Vec<(u32, f32)>, ApiError> {
    match f.value("logit_bias") {
        None => Ok(Vec::new()),
        Some(Value::Object(o)) => {
            let mut out = Vec::with_capacity(o.len());
            for (k, v) in o {
                let id = k.parse::<u32>().map_err(|_| {
                    ApiError::param("logit_bias", format!("`logit_bias` keys are token ids; `{k}` is not one"))
                })?;
                let b = v.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| {
                    ApiError::param("logit_bias", format!("the bias of token {id} must be a number from -100 to 100"))
                })?;
                out.push((id, b as f32));
            }
            Ok(out)
        }
        Some(_) => Err(ApiError::param("logit_bias", "`logit_bias` must be an object of token id → bias")),
    }
}
