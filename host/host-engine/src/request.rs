//! What a caller asks the engine to generate: the prompt's ids, the
//! length, sampling, and the grammar the output must follow.

use crate::sampling::SamplingParams;

#[derive(Debug, Clone, Default)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub params: SamplingParams,
    /// Stop at the model's EOS ids (off to measure exactly `max_tokens`).
    pub stop_on_eos: bool,
    /// Report the chosen token's logprob and this many alternatives.
    pub logprobs: Option<usize>,
    /// The grammar the output must follow (structured output, tool calls).
    pub constraint: Option<crate::constraint::Constraint>,
}
