//! The generation core of the host.
//!
//! Owns: the process's view of the MLX runtime, the served model (composed
//! by host-loader) with its tokenizer and chat template, sampling, the
//! execution plan of each request, and the executors that run it: serial
//! (`serial`) and continuously batched (`batch`), on one worker thread
//! (`worker`). Does not own: HTTP (host-server), plugin discovery
//! (host-loader) or any model family.
//!
//! A request flows: `Engine::plan` → a `Job` (request + plan + callback) →
//! `worker` queue → `batch::Scheduler` (continuous plans) or `serial::run`
//! (serial plans) → `Event`s back through the job's callback. An
//! embedding job (`embed`) takes the same queue and runs whole when taken.

pub mod admission;
pub mod batch;
pub mod chat_template;
pub mod config;
pub mod constraint;
pub mod drafting;
pub mod embed;
pub mod engine;
pub mod error;
mod graph_dump;
pub mod histogram;
pub mod hold;
mod idle;
pub mod input_job;
pub mod isolate;
pub mod job;
pub mod lockstep;
pub mod owned_state;
pub mod plan;
pub mod pooling;
pub mod prefix_cache;
pub mod probe;
pub mod queue;
pub mod request;
pub mod runtime;
pub mod sampling;
mod score;
pub mod serial;
pub mod speculation;
pub mod ssd_cache;
pub mod stats;
mod target_kv;
mod target_states;
mod template_json;
mod tensors;
mod thread_clock;
pub mod tokenizer;
mod warm_up;
pub mod work;
pub mod worker;

pub use config::{kv_scheme, paged_scheme, DraftSource, DtypeChoice, EngineConfig, SpeculationConfig};
pub use engine::Engine;
pub use error::EngineError;
pub use input_job::{InputJob, InputOut, InputResult, InputTask};
pub use job::{Event, Finish, Flow, GenerateResult, Job, TokenOut};
pub use request::GenerateRequest;
pub use sampling::SamplingParams;
