//! Tokens to text for a response: incremental detokenizing, and stop
//! strings matched on the decoded text with hold-back, so that a stop string
//! (or its beginning) is never sent to the client.

use host_engine::tokenizer::{Detokenizer, TextSide};
use std::sync::Arc;

pub struct Assembler {
    detok: Detokenizer,
    stops: Vec<String>,
    /// Decoded text not yet released (could be the start of a stop string).
    held: String,
    /// Longest stop string in bytes: we hold back at most that minus one.
    hold: usize,
    pub stopped: bool,
    /// The stop string that matched (the earliest in the text).
    pub matched: Option<String>,
}

impl Assembler {
    pub fn new(text: Arc<TextSide>, stops: Vec<String>) -> Self {
        Self::over(Detokenizer::new(text), stops)
    }

    /// An assembler whose text keeps special tokens (a tool-call syntax
    /// may mark calls with them).
    pub fn keeping_special(text: Arc<TextSide>, stops: Vec<String>) -> Self {
        Self::over(Detokenizer::keeping_special(text), stops)
    }

    fn over(detok: Detokenizer, stops: Vec<String>) -> Self {
        let hold = stops.iter().map(String::len).max().unwrap_or(0);
        Self { detok, stops, held: String::new(), hold, stopped: false, matched: None }
    }

    /// Adds one token; returns the text that can be released now. After a
    /// stop string matched, `stopped` is set and nothing more is released.
    pub fn push(&mut self, id: u32) -> String {
        if self.stopped {
            return String::new();
        }
        self.held.push_str(&self.detok.push(id));
        self.release(false)
    }

    /// Releases what is held at the end of generation.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        self.held.push_str(&self.detok.finish());
        self.release(true)
    }

    fn release(&mut self, all: bool) -> String {
        let hit = self.stops.iter().filter_map(|s| self.held.find(s.as_str()).map(|at| (at, s))).min_by_key(|h| h.0);
        if let Some((pos, stop)) = hit {
            self.stopped = true;
            self.matched = Some(stop.clone());
            let out = self.held[..pos].to_owned();
            self.held.clear();
            return out;
        }
        if all || self.hold == 0 {
            return std::mem::take(&mut self.held);
        }
        // Keep the last hold-1 bytes (on a char boundary): a stop string that
        // completes later must start inside them.
        let mut cut = self.held.len().saturating_sub(self.hold - 1);
        while !self.held.is_char_boundary(cut) {
            cut -= 1;
        }
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        out
    }
}
