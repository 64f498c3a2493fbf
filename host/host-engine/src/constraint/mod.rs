//! Constrained decoding: a grammar per request (JSON Schema, any JSON
//! object, a regular expression, a Lark grammar, or a choice of strings),
//! compiled by llguidance against the model's own tokenizer. Each step, the
//! row's matcher says which tokens may come next; the sampler masks the rest
//! out on the device (`sampling`). EOS is allowed only where the grammar may
//! end, so a grammar that cannot end within `max_tokens` ends with `length`.
//!
//! Why llguidance: it takes every grammar form the API needs (JSON Schema
//! with `$ref`/`anyOf`/patterns, regex, Lark with embedded JSON), computes a
//! token mask in well under a millisecond for common schemas by walking the
//! tokenizer's trie with a lazy lexer, and rolls back token by token
//! (speculative rounds). It is what the field's servers use.

mod compiler;
mod error;
mod matcher;

pub use compiler::GrammarCompiler;
pub use error::GrammarError;
pub use matcher::{Constraint, ConstraintSource, ReasoningGate};

use std::sync::atomic::{AtomicU64, Ordering};

/// CPU time the grammars take, over every matcher of one model (reported
/// in /metrics: what constrained decoding costs per step): computing masks,
/// and moving matchers past tokens.
#[derive(Debug, Default)]
pub struct MaskClock {
    masks: AtomicU64,
    mask_nanos: AtomicU64,
    accept_nanos: AtomicU64,
}

impl MaskClock {
    pub(crate) fn record_mask(&self, took: std::time::Duration) {
        self.masks.fetch_add(1, Ordering::Relaxed);
        self.mask_nanos.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    pub(crate) fn record_accept(&self, took: std::time::Duration) {
        self.accept_nanos.fetch_add(took.as_nanos() as u64, Ordering::Relaxed);
    }

    /// Masks computed, the seconds they took, and the seconds spent
    /// accepting tokens.
    pub fn totals(&self) -> (u64, f64, f64) {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e9;
        (self.masks.load(Ordering::Relaxed), s(&self.mask_nanos), s(&self.accept_nanos))
    }
}

/// What a request constrains its output to.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
pub enum Grammar {
    /// A JSON value valid under this JSON Schema.
    JsonSchema(serde_json::Value),
    /// Any JSON object.
    JsonObject,
    /// A string matching this regular expression (whole output).
    Regex(String),
    /// A Lark grammar (llguidance's dialect: `%json { schema }` embeds a
    /// JSON Schema, `start` is the start rule).
    Lark(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}
