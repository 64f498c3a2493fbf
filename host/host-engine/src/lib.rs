//! The generation core of the host.
//!
//! Owns: the process's view of the MLX runtime, the served model (composed
//! by host-loader) with its tokenizer and chat template, sampling, and the
//! decode loop. Does not own: HTTP (host-server), plugin discovery
//! (host-loader) or any model family.

pub mod admission;
pub mod chat_template;
pub mod cohort;
pub mod engine;
pub mod generate;
pub mod histogram;
pub mod owned_state;
pub mod plan;
pub mod prefix_cache;
pub mod probe;
pub mod runtime;
pub mod sampling;
pub mod scheduler;
pub mod speculative;
pub mod tokenizer;
pub mod worker;

pub use engine::{DraftAhead, DtypeChoice, Engine, EngineError};
pub use generate::{Finish, Flow, GenerateRequest, GenerateResult, TokenOut};
pub use sampling::SamplingParams;
