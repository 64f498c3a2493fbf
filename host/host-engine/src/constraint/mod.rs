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

mod clock;
mod compiler;
mod error;
mod grammar;
mod matcher;

pub use clock::MaskClock;
pub use compiler::GrammarCompiler;
pub use error::GrammarError;
pub use grammar::Grammar;
pub use matcher::{Constraint, ConstraintSource, ReasoningGate};
