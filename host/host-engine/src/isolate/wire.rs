//! What the API process and its engine child say to each other over their
//! socket: length-prefixed JSON messages (a u32 little-endian byte count,
//! then the message). JSON keeps the protocol readable in a packet dump and
//! costs microseconds per token, far below a decode step.

use crate::admission::{Budget, MemoryModel};
use crate::constraint::ConstraintSource;
use crate::input_job::{InputOut, InputTask};
use crate::job::{GenerateResult, TokenOut};
use crate::plan::{Planner, ResolvedExecution};
use crate::pooling::{Pooling, PoolingError};
use crate::request::GenerateRequest;
use crate::sampling::SamplingParams;
use crate::stats::StatsSnapshot;
use serde::{Deserialize, Serialize};
use std::io::{self, Read, Write};

/// Largest message either side accepts (a request's prompt and grammar, an
/// embedding batch's vectors); anything larger means a broken peer.
const MAX_MESSAGE: usize = 1 << 30;

/// What the engine tells the API process once it has loaded the model.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    pub planner: Planner,
    pub memory: MemoryModel,
    pub budget: Budget,
    pub max_context: usize,
    pub vocab_size: u32,
    pub hidden_size: usize,
    pub embeddings: Result<Pooling, PoolingError>,
    /// The engine has an SSD prefix tier (its counters travel in stats).
    pub ssd: bool,
    /// The child's process id (for logs and /health).
    pub pid: u32,
}

/// A generation request as it crosses: the constraint by its source (the
/// engine compiles it again against the same tokenizer).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub params: SamplingParams,
    pub stop_on_eos: bool,
    pub logprobs: Option<usize>,
    pub constraint: Option<ConstraintSource>,
    /// Tokens at the prompt's end that the request generated before it was
    /// resumed here (its grammar moves past them).
    #[serde(default)]
    pub resumed: usize,
}

impl WireRequest {
    /// None when the request holds a constraint that was not compiled from
    /// a grammar (only tests build those).
    pub fn from_request(r: &GenerateRequest) -> Option<Self> {
        let constraint = match &r.constraint {
            Some(c) => Some(c.source()?.clone()),
            None => None,
        };
        Some(Self {
            prompt: r.prompt.clone(),
            max_tokens: r.max_tokens,
            params: r.params.clone(),
            stop_on_eos: r.stop_on_eos,
            logprobs: r.logprobs,
            constraint,
            resumed: 0,
        })
    }

    /// The request again, its grammar compiled against `text`'s tokenizer
    /// and moved past the tokens it already generated.
    pub fn into_request(self, text: Option<&crate::tokenizer::TextSide>) -> Result<GenerateRequest, String> {
        let constraint = match &self.constraint {
            None => None,
            Some(src) => {
                let compiler = text
                    .ok_or("this model has no tokenizer to compile a grammar against")?
                    .grammar()
                    .map_err(|e| e.to_string())?;
                let generated = &self.prompt[self.prompt.len().saturating_sub(self.resumed)..];
                let mut c = compiler.rebuild(src).map_err(|e| e.to_string())?;
                for &t in generated {
                    c.accept(t).map_err(|e| e.to_string())?;
                }
                Some(c)
            }
        };
        Ok(GenerateRequest {
            prompt: self.prompt,
            max_tokens: self.max_tokens,
            params: self.params,
            stop_on_eos: self.stop_on_eos,
            logprobs: self.logprobs,
            constraint,
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireJob {
    pub id: u64,
    pub request: WireRequest,
    pub plan: ResolvedExecution,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ToEngine {
    /// One request's jobs, all or none; answered by `Submitted`.
    Submit {
        seq: u64,
        jobs: Vec<WireJob>,
    },
    /// A whole-input job; answered by `InputsDone`.
    Inputs {
        id: u64,
        inputs: Vec<Vec<u32>>,
        task: InputTask,
    },
    /// The caller stopped listening to this job.
    Cancel {
        id: u64,
    },
    Hold,
    Release {
        steps: Option<u64>,
    },
    /// Send the counters now (answered by `Stats` with this `seq`).
    Stats {
        seq: u64,
    },
}

/// Why a submission was not queued.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum Refusal {
    Full,
    Closed,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WireEvent {
    Token(TokenOut),
    Done(GenerateResult),
    /// The engine's error, by its message and its kind.
    Failed {
        message: String,
        kind: FailedBy,
    },
}

/// Whose fault a failed request was, as the host's error kinds say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailedBy {
    /// The request (`EngineError::InvalidRequest`).
    Request,
    /// The request's grammar, part-way (`EngineError::Grammar`).
    Grammar,
    /// The engine.
    Engine,
}

impl FailedBy {
    pub fn of(e: &crate::error::EngineError) -> Self {
        use crate::error::EngineError as E;
        match e {
            E::InvalidRequest(_) => Self::Request,
            E::Grammar(_) => Self::Grammar,
            _ => Self::Engine,
        }
    }

    /// The error the host's side reports for `message`.
    pub fn error(self, message: String) -> crate::error::EngineError {
        use crate::error::EngineError as E;
        match self {
            Self::Request => E::InvalidRequest(message),
            Self::Grammar => E::Grammar(crate::constraint::GrammarError(message)),
            Self::Engine => E::Reported(message),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum FromEngine {
    Hello(Box<Hello>),
    Submitted {
        seq: u64,
        refused: Option<Refusal>,
    },
    Event {
        id: u64,
        event: WireEvent,
    },
    InputsDone {
        id: u64,
        result: Result<InputOut, (String, FailedBy)>,
    },
    /// The engine's counters: pushed when they change (`seq` None), or
    /// as the answer to `ToEngine::Stats`.
    Stats {
        seq: Option<u64>,
        stats: StatsSnapshot,
        held: bool,
        parked: bool,
        mlx: [u64; 3],
    },
}

pub fn write_message<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    w.write_all(&(body.len() as u32).to_le_bytes())?;
    w.write_all(&body)
}

/// The next message, or None at a clean end of stream.
pub fn read_message<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_MESSAGE {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("a message of {n} bytes")));
    }
    let mut body = vec![0u8; n];
    r.read_exact(&mut body)?;
    serde_json::from_slice(&body).map(Some).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_and_a_clean_end_reads_as_none() {
        let mut buf = Vec::new();
        write_message(&mut buf, &ToEngine::Cancel { id: 7 }).unwrap();
        write_message(&mut buf, &ToEngine::Release { steps: Some(3) }).unwrap();
        let mut r = buf.as_slice();
        assert!(matches!(read_message(&mut r).unwrap(), Some(ToEngine::Cancel { id: 7 })));
        assert!(matches!(read_message(&mut r).unwrap(), Some(ToEngine::Release { steps: Some(3) })));
        assert!(read_message::<ToEngine>(&mut r).unwrap().is_none());
    }

    #[test]
    fn a_truncated_message_is_an_error_not_an_end() {
        let mut buf = Vec::new();
        write_message(&mut buf, &ToEngine::Hold).unwrap();
        buf.pop();
        assert!(read_message::<ToEngine>(&mut buf.as_slice()).is_err());
    }
}
