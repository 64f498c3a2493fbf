//! Engine isolation (`host serve --isolate`): the model, its plugins and
//! MLX run in a child process (the same binary, `host engine-child`), and
//! the API process talks to it over a Unix socket. A crash in the child (a
//! plugin's native code, MLX, an out-of-memory kill) ends the requests it
//! was running with a clear error; the API process keeps serving and starts
//! a new child (with a back-off while children keep dying).
//!
//! `wire` is the protocol, `child` the engine's side, `remote` the API
//! process's view of the engine's jobs, `supervisor` the child's lifecycle.

pub mod child;
pub mod remote;
pub mod supervisor;
pub mod wire;

pub use remote::Remote;
pub use supervisor::{ChildCommand, EngineHealth, Supervisor};
pub use wire::Hello;
