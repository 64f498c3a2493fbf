//! What the engine's queue carries (generation jobs and whole-input jobs),
//! and why a submission is refused.

use crate::input_job::InputJob;
use crate::job::Job;

/// What the queue carries.
pub enum Work {
    /// (Boxed: a job with its plan is large, a whole-input job small.)
    Generate(Box<Job>),
    /// Runs whole when the engine takes it (between batch iterations).
    Inputs(InputJob),
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
