//! An answer's text split into its reasoning block and the answer after
//! it, as the text streams. The block is `start … end` (e.g. `<think> …
//! </think>`); the prompt may have opened it already, or the answer may
//! open it as the first thing it writes. Whitespace the template's layout
//! puts around the block is not part of either side: the reasoning is the
//! text between the markers without the whitespace at its ends, and the
//! answer begins at the first non-whitespace text after the end marker.
//! Whatever else the model writes (an answer that opens no block, a start
//! marker later on) is answer text as written.

/// A piece of the answer's text and which side it belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Reasoning(String),
    Content(String),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace so far: the answer may open a block.
    MayOpen,
    /// Inside the block; `began`: reasoning text went out already.
    Reasoning {
        began: bool,
    },
    /// Right after the end marker: whitespace is dropped.
    AfterEnd,
    Content,
}

pub struct Splitter {
    start: String,
    end: String,
    state: State,
    /// Text not yet released: a marker's beginning, or whitespace whose
    /// side is not known yet.
    held: String,
}

impl Splitter {
    /// `open`: the prompt opened the block (the answer starts inside it).
    pub fn new(start: &str, end: &str, open: bool) -> Self {
        let state = if open { State::Reasoning { began: false } } else { State::MayOpen };
        Self { start: start.to_owned(), end: end.to_owned(), state, held: String::new() }
    }

    /// Inside the reasoning block now.
    pub fn in_reasoning(&self) -> bool {
        matches!(self.state, State::Reasoning { .. })
    }

    /// Adds decoded text; returns what can be released.
    pub fn push(&mut self, text: &str) -> Vec<Segment> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::MayOpen => {
                    let rest = self.held.trim_start();
                    if rest.starts_with(self.start.as_str()) {
                        self.held = rest[self.start.len()..].to_owned();
                        self.state = State::Reasoning { began: false };
                    } else if rest.is_empty() || self.start.starts_with(rest) {
                        return out;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Reasoning { began } => {
                    if let Some(at) = self.held.find(self.end.as_str()) {
                        let inside = self.held[..at].trim_end();
                        let inside = if began { inside } else { inside.trim_start() };
                        if !inside.is_empty() {
                            out.push(Segment::Reasoning(inside.to_owned()));
                        }
                        self.held.drain(..at + self.end.len());
                        self.state = State::AfterEnd;
                        continue;
                    }
                    // Hold a possible beginning of the end marker, and
                    // whitespace that may turn out to end the block.
                    let keep = partial_suffix(&self.held, &self.end);
                    let release = self.held[..keep].trim_end().len();
                    let mut from = 0;
                    if !began {
                        from = release - self.held[..release].trim_start().len();
                    }
                    if release > from {
                        out.push(Segment::Reasoning(self.held[from..release].to_owned()));
                        self.state = State::Reasoning { began: true };
                    }
                    // (Leading whitespace before the first reasoning text goes too.)
                    self.held.drain(..release);
                    return out;
                }
                State::AfterEnd => {
                    let rest = self.held.trim_start();
                    if rest.is_empty() {
                        self.held.clear();
                        return out;
                    }
                    self.held = rest.to_owned();
                    self.state = State::Content;
                }
                State::Content => {
                    if !self.held.is_empty() {
                        out.push(Segment::Content(std::mem::take(&mut self.held)));
                    }
                    return out;
                }
            }
        }
    }

    /// Releases what is held at the end of the answer (a block the token
    /// limit cut keeps its text as reasoning).
    pub fn finish(&mut self) -> Vec<Segment> {
        let held = std::mem::take(&mut self.held);
        match self.state {
            State::MayOpen | State::Content if !held.is_empty() => vec![Segment::Content(held)],
            State::Reasoning { began } => {
                let t = held.trim_end();
                let t = if began { t } else { t.trim_start() };
                if t.is_empty() {
                    Vec::new()
                } else {
                    vec![Segment::Reasoning(t.to_owned())]
                }
            }
            _ => Vec::new(),
        }
    }
}

/// Where the longest suffix of `text` that is a proper beginning of
/// `marker` starts (`text.len()` when none is).
fn partial_suffix(text: &str, marker: &str) -> usize {
    let longest = marker.len().saturating_sub(1).min(text.len());
    for n in (1..=longest).rev() {
        let at = text.len() - n;
        if text.is_char_boundary(at) && marker.starts_with(&text[at..]) {
            return at;
        }
    }
    text.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every split of `text` into pieces gives the same segments, joined.
    fn split_all_ways(text: &str, open: bool) -> (String, String) {
        let whole = run(&[text], open);
        let chars: Vec<char> = text.chars().collect();
        for cut in 0..=chars.len() {
            let (a, b): (String, String) = (chars[..cut].iter().collect(), chars[cut..].iter().collect());
            assert_eq!(run(&[&a, &b], open), whole, "cut at {cut} of {text:?}");
        }
        let singles: Vec<String> = chars.iter().map(|c| c.to_string()).collect();
        let refs: Vec<&str> = singles.iter().map(String::as_str).collect();
        assert_eq!(run(&refs, open), whole, "char by char: {text:?}");
        whole
    }

    fn run(pieces: &[&str], open: bool) -> (String, String) {
        let mut s = Splitter::new("<think>", "</think>", open);
        let mut segs = Vec::new();
        for p in pieces {
            segs.extend(s.push(p));
        }
        segs.extend(s.finish());
        let (mut r, mut c) = (String::new(), String::new());
        for seg in segs {
            match seg {
                Segment::Reasoning(t) => r.push_str(&t),
                Segment::Content(t) => c.push_str(&t),
            }
        }
        (r, c)
    }

    #[test]
    fn a_block_the_prompt_opened() {
        let r = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(
            split_all_ways("\nStep 1.\n\nStep 2.\n</think>\n\nThe answer.", true),
            r("Step 1.\n\nStep 2.", "The answer.")
        );
        assert_eq!(split_all_ways("</think>Answer </think> too", true), r("", "Answer </think> too"));
        assert_eq!(split_all_ways("  cut by the limit </th", true), r("cut by the limit </th", ""));
        assert_eq!(split_all_ways("a < b </thinking> still </think>x", true), r("a < b </thinking> still", "x"));
    }

    #[test]
    fn a_block_the_answer_opens() {
        let r = |a: &str, b: &str| (a.to_owned(), b.to_owned());
        assert_eq!(split_all_ways("<think>\nhmm\n</think>\n\nYes.", false), r("hmm", "Yes."));
        assert_eq!(split_all_ways("\n <think>é🦀</think>ok", false), r("é🦀", "ok"));
        assert_eq!(split_all_ways("No block <think>here</think>", false), r("", "No block <think>here</think>"));
        assert_eq!(split_all_ways("  <thin", false), r("", "  <thin"));
        assert_eq!(split_all_ways("", false), r("", ""));
    }
}
