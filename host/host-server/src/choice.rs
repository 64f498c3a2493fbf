//! One choice's output as it is generated: tokens to text (stop strings
//! held back by the assembler), then, when the model reasons, the text
//! split into its reasoning block and the answer, and, when the request has
//! tools, the model's tool-call syntax parsed out of the answer into calls.

use crate::assemble::Assembler;
use crate::reasoning::{Segment, Splitter};
use host_engine::TokenOut;
use host_tools::{ParsedEvent, ToolCallParser};

/// A tool call as the response reports it.
#[derive(Debug, Clone)]
pub struct Call {
    pub index: usize,
    pub id: String,
    pub name: String,
    /// The arguments, a JSON object as text (as OpenAI sends them).
    pub arguments: String,
}

/// What a choice releases: reasoning, text for `content`, or a whole tool call.
#[derive(Debug, Clone)]
pub enum Piece {
    Reasoning(String),
    Text(String),
    Call(Call),
}

pub struct ChoiceOut {
    pub index: usize,
    asm: Assembler,
    /// Splits reasoning from the answer (a model that reasons).
    split: Option<Splitter>,
    tools: Option<ToolCallParser>,
    /// Tokens emitted before any stop string (for logprobs).
    pub toks: Vec<TokenOut>,
    pub calls: Vec<Call>,
    /// Completions' `text_offset` so far.
    pub offset: usize,
    /// Tokens written inside the reasoning block (its markers included).
    pub reasoning_tokens: usize,
    /// Completions' `echo`: what the response puts ahead of the generated
    /// text (outside the stop-string search, which sees only what the model
    /// writes).
    pub echo: Option<Echo>,
}

/// The prompt as `echo` shows it: its text, and, with `logprobs`, each of
/// its tokens scored (the first without a logprob).
#[derive(Debug, Clone)]
pub struct Echo {
    pub text: String,
    pub scores: Vec<TokenOut>,
}

impl ChoiceOut {
    pub fn new(index: usize, asm: Assembler, split: Option<Splitter>, tools: Option<ToolCallParser>) -> Self {
        Self {
            index,
            asm,
            split,
            tools,
            toks: Vec::new(),
            calls: Vec::new(),
            offset: 0,
            reasoning_tokens: 0,
            echo: None,
        }
    }

    /// Shows `echo` ahead of the generated text, as completions' `echo` asks.
    pub fn echoing(mut self, echo: Echo) -> Self {
        self.echo = Some(echo);
        self
    }

    /// A stop string matched: nothing more is released.
    pub fn stopped(&self) -> bool {
        self.asm.stopped
    }

    /// The stop string that ended the text, if one did.
    pub fn stop_sequence(&self) -> Option<&str> {
        self.asm.matched.as_deref()
    }

    /// Adds one token; returns what can be released now.
    pub fn push(&mut self, t: &TokenOut) -> Vec<Piece> {
        let text = self.asm.push(t.id);
        if !self.asm.stopped {
            self.toks.push(t.clone());
        }
        let was_reasoning = self.split.as_ref().is_some_and(Splitter::in_reasoning);
        let pieces = self.shape(text, false);
        if was_reasoning || self.split.as_ref().is_some_and(Splitter::in_reasoning) {
            self.reasoning_tokens += 1;
        }
        pieces
    }

    /// Releases everything held at the end of generation.
    pub fn finish(&mut self) -> Vec<Piece> {
        let text = self.asm.finish();
        self.shape(text, true)
    }

    fn shape(&mut self, text: String, last: bool) -> Vec<Piece> {
        let segments = match self.split.as_mut() {
            None if text.is_empty() => Vec::new(),
            None => vec![Segment::Content(text)],
            Some(s) => {
                let mut v = if text.is_empty() { Vec::new() } else { s.push(&text) };
                if last {
                    v.extend(s.finish());
                }
                v
            }
        };
        let mut out = Vec::with_capacity(segments.len());
        for seg in segments {
            match seg {
                Segment::Reasoning(r) => out.push(Piece::Reasoning(r)),
                Segment::Content(c) => self.answer(c, &mut out),
            }
        }
        if last {
            if let Some(p) = self.tools.take() {
                let events = p.finish();
                self.calls_and_text(events, &mut out);
            }
        }
        out
    }

    /// Answer text, through the tool-call parser when calls may appear.
    fn answer(&mut self, text: String, out: &mut Vec<Piece>) {
        match self.tools.as_mut() {
            None => out.push(Piece::Text(text)),
            Some(parser) => {
                let events = parser.push(&text);
                self.calls_and_text(events, out);
            }
        }
    }

    fn calls_and_text(&mut self, events: Vec<ParsedEvent>, out: &mut Vec<Piece>) {
        for e in events {
            match e {
                ParsedEvent::Text(s) if s.is_empty() => {}
                ParsedEvent::Text(s) => out.push(Piece::Text(s)),
                ParsedEvent::Call { index, id, name, arguments } => {
                    let c = Call { index, id, name, arguments };
                    self.calls.push(c.clone());
                    out.push(Piece::Call(c));
                }
            }
        }
    }
}
