//! What the engine's queue carries (generation jobs and embedding jobs),
//! and why a submission is refused.

use crate::embed::EmbedJob;
use crate::job::Job;

/// What the queue carries.
pub enum Work {
    /// (Boxed: a job with its plan is large, an embedding job small.)
    Generate(Box<Job>),
    /// Runs whole when the engine takes it (between batch iterations).
    Embed(EmbedJob),
}

#[derive(Debug)]
pub enum SubmitError {
    /// The queue holds its limit: try again later.
    Full,
    /// The worker has stopped (shutdown).
    Closed,
    /// The isolated engine's process died and a new one is starting.
    Restarting,
}
