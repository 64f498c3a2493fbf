//! One choice's output as it is generated: tokens to text (stop strings
//! held back by the assembler), then, when the request has tools, the
//! model's tool-call syntax parsed out of that text into calls.

use crate::assemble::Assembler;
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

/// What a choice releases: text for `content`, or a whole tool call.
#[derive(Debug, Clone)]
pub enum Piece {
    Text(String),
    Call(Call),
}

pub struct ChoiceOut {
    pub index: usize,
    asm: Assembler,
    tools: Option<ToolCallParser>,
    /// Tokens emitted before any stop string (for logprobs).
    pub toks: Vec<TokenOut>,
    pub calls: Vec<Call>,
    /// Completions' `text_offset` so far.
    pub offset: usize,
}

impl ChoiceOut {
    pub fn new(index: usize, asm: Assembler, tools: Option<ToolCallParser>) -> Self {
        Self { index, asm, tools, toks: Vec::new(), calls: Vec::new(), offset: 0 }
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
        self.shape(text, false)
    }

    /// Releases everything held at the end of generation.
    pub fn finish(&mut self) -> Vec<Piece> {
        let text = self.asm.finish();
        self.shape(text, true)
    }

    fn shape(&mut self, text: String, last: bool) -> Vec<Piece> {
        let Some(parser) = self.tools.as_mut() else {
            return if text.is_empty() { Vec::new() } else { vec![Piece::Text(text)] };
        };
        let mut events = if text.is_empty() { Vec::new() } else { parser.push(&text) };
        if last {
            if let Some(p) = self.tools.take() {
                events.extend(p.finish());
            }
        }
        let mut out = Vec::with_capacity(events.len());
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
        out
    }
}
