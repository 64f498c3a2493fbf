//! Reasoning ("thinking") output: models whose chat template writes a
//! reasoning block (`<think> … </think>`) before the answer. Which models
//! these are is read from the template (it names the block's end marker)
//! and the tokenizer (the markers as added tokens), never from a family
//! name. Each request asks for reasoning through its API's switch
//! (`chat_template_kwargs.enable_thinking`, `reasoning_effort`,
//! Anthropic's `thinking`, Responses' `reasoning.effort`), which becomes the
//! template's `enable_thinking` where the template reads it; the rendered
//! prompt then says whether the answer starts inside a block
//! (`Plan`), and each choice's text is split (`split`) into reasoning and
//! answer. A grammar constrains only the answer after the block
//! (`Plan::gate`).

pub mod split;

use host_engine::constraint::ReasoningGate;
use serde_json::{Map, Value};
pub use split::{Segment, Splitter};

/// Block markers, by the end marker a template names.
const MARKERS: &[(&str, &str)] = &[("<think>", "</think>"), ("[THINK]", "[/THINK]"), ("<seed:think>", "</seed:think>")];

/// How the served model marks its reasoning block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Markers {
    pub start: &'static str,
    pub end: &'static str,
    /// Each marker's id where the tokenizer has it as one added token.
    pub start_id: Option<u32>,
    pub end_id: Option<u32>,
    /// A marker is a special token (dropped by a detokenizer that skips
    /// specials, so the text must keep them).
    pub special: bool,
}

/// What the served model's template does with reasoning.
#[derive(Debug, Clone, Default)]
pub struct ReasoningSupport {
    /// None: the template writes no reasoning block; requests' switches
    /// are ignored and answers are never split.
    pub markers: Option<Markers>,
    /// The template reads `enable_thinking`.
    pub switch: bool,
    /// The template reads `preserve_thinking` (past reasoning stays in the
    /// history when it is true).
    pub preserve: bool,
}

impl ReasoningSupport {
    /// From the template's source and the tokenizer's added tokens
    /// (`(id, text, special)`).
    pub fn detect(template: &str, added: &[(u32, String, bool)]) -> Self {
        let markers = MARKERS.iter().find(|(_, end)| template.contains(end)).map(|&(start, end)| {
            let find = |m: &str| added.iter().find(|(_, t, _)| t == m);
            let (s, e) = (find(start), find(end));
            Markers {
                start,
                end,
                start_id: s.map(|t| t.0),
                end_id: e.map(|t| t.0),
                special: s.is_some_and(|t| t.2) || e.is_some_and(|t| t.2),
            }
        });
        Self {
            switch: markers.is_some() && template.contains("enable_thinking"),
            preserve: markers.is_some() && template.contains("preserve_thinking"),
            markers,
        }
    }
}

/// The server's default for the reasoning switch (`--thinking`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ThinkingDefault {
    /// Whatever the template does when `enable_thinking` is not given.
    #[default]
    Template,
    On,
    Off,
}

/// The efforts OpenAI's APIs name; `none` asks for no reasoning.
pub const EFFORTS: &[&str] = &["none", "minimal", "low", "medium", "high", "xhigh"];

/// What one request asks of reasoning, in its API's own fields.
#[derive(Debug, Clone, Default)]
pub struct Ask {
    /// On or off, where the API has a switch (Anthropic's `thinking`).
    pub enable: Option<bool>,
    /// `reasoning_effort` / `reasoning.effort`: handed to the template as
    /// `reasoning_effort`; `none` turns the switch off, others on.
    pub effort: Option<String>,
}

impl Ask {
    /// Reads an effort value (one of `EFFORTS`), naming `param` when it is wrong.
    pub fn effort(v: Option<&Value>, param: &str) -> Result<Option<String>, crate::error::ApiError> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if EFFORTS.contains(&s.as_str()) => Ok(Some(s.clone())),
            Some(_) => {
                Err(crate::error::ApiError::param(param, format!("`{param}` must be one of {}", EFFORTS.join(", "))))
            }
        }
    }
}

/// The template variables a request's reasoning sets, where the client's
/// `chat_template_kwargs` did not set them itself: `enable_thinking` (the
/// request's switch, else its effort, else the server's default) for a
/// template that reads it, `reasoning_effort` as given, and
/// `preserve_thinking: true` when the server keeps past reasoning.
pub fn template_kwargs(
    support: &ReasoningSupport,
    default: ThinkingDefault,
    preserve: bool,
    ask: &Ask,
    kwargs: &mut Map<String, Value>,
) {
    if support.switch && !kwargs.contains_key("enable_thinking") {
        let on = ask.enable.or_else(|| ask.effort.as_deref().map(|e| e != "none")).or(match default {
            ThinkingDefault::Template => None,
            ThinkingDefault::On => Some(true),
            ThinkingDefault::Off => Some(false),
        });
        if let Some(on) = on {
            kwargs.insert("enable_thinking".into(), Value::Bool(on));
        }
    }
    if let Some(e) = &ask.effort {
        kwargs.entry("reasoning_effort").or_insert_with(|| Value::String(e.clone()));
    }
    if support.preserve && preserve {
        kwargs.entry("preserve_thinking").or_insert(Value::Bool(true));
    }
}

/// A request's reasoning as its rendered prompt leaves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub markers: Markers,
    /// The prompt opened the block: the answer starts as reasoning.
    /// Otherwise the answer may open one as the first thing it writes.
    pub open: bool,
}

impl Plan {
    /// None when the model has no reasoning block or the prompt closed it
    /// (a template turning reasoning off writes an empty block).
    pub fn of(support: &ReasoningSupport, rendered: &str) -> Option<Self> {
        let markers = support.markers.clone()?;
        let tail = rendered.trim_end();
        if tail.ends_with(markers.end) {
            return None;
        }
        Some(Self { open: tail.ends_with(markers.start), markers })
    }

    pub fn splitter(&self) -> Splitter {
        Splitter::new(self.markers.start, self.markers.end, self.open)
    }

    /// Where a grammar starts: after the block, found by its single-token
    /// markers. None (the grammar applies from the first token, so no
    /// block is written) when the end marker is not one token, or when
    /// the answer would have to open the block with a start marker that
    /// is not one.
    pub fn gate(&self) -> Option<ReasoningGate> {
        let end = self.markers.end_id?;
        if !self.open && self.markers.start_id.is_none() {
            return None;
        }
        Some(ReasoningGate { start: self.markers.start_id, end, open: self.open })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const QWEN_LIKE: &str = "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{% if preserve_thinking %}{% endif %}";

    fn added() -> Vec<(u32, String, bool)> {
        vec![(7, "<think>".into(), false), (8, "</think>".into(), false), (2, "<|im_end|>".into(), true)]
    }

    #[test]
    fn support_is_read_from_the_template_and_tokens() {
        let s = ReasoningSupport::detect(QWEN_LIKE, &added());
        let m = s.markers.clone().unwrap();
        assert_eq!((m.start, m.end, m.start_id, m.end_id, m.special), ("<think>", "</think>", Some(7), Some(8), false));
        assert!(s.switch && s.preserve);
        let plain = ReasoningSupport::detect("{{ messages }} enable_thinking", &added());
        assert!(plain.markers.is_none() && !plain.switch, "no block in the template: nothing to split or switch");
        let opened = ReasoningSupport::detect("{{ '<｜Assistant｜><think>\\n' }}{{ c.split('</think>')[-1] }}", &[]);
        let m = opened.markers.unwrap();
        assert_eq!((m.start_id, m.end_id), (None, None));
        assert!(!opened.switch);
    }

    #[test]
    fn the_prompt_says_where_the_answer_starts() {
        let s = ReasoningSupport::detect(QWEN_LIKE, &added());
        assert_eq!(Plan::of(&s, "<|im_start|>assistant\n").map(|p| p.open), Some(false));
        assert_eq!(Plan::of(&s, "<|im_start|>assistant\n<think>\n").map(|p| p.open), Some(true));
        assert_eq!(Plan::of(&s, "<|im_start|>assistant\n<think>\n\n</think>\n\n"), None, "reasoning turned off");
        let p = Plan::of(&s, "x<think>\n").unwrap();
        assert_eq!(p.gate(), Some(ReasoningGate { start: Some(7), end: 8, open: true }));
    }

    #[test]
    fn a_request_sets_what_the_client_did_not() {
        let s = ReasoningSupport::detect(QWEN_LIKE, &added());
        let kw = |ask: Ask, default, preserve, given: Value| {
            let mut m = given.as_object().unwrap().clone();
            template_kwargs(&s, default, preserve, &ask, &mut m);
            Value::Object(m)
        };
        let effort = |e: &str| Ask { enable: None, effort: Some(e.into()) };
        assert_eq!(kw(Ask::default(), ThinkingDefault::Template, false, json!({})), json!({}));
        assert_eq!(kw(Ask::default(), ThinkingDefault::Off, false, json!({})), json!({"enable_thinking": false}));
        assert_eq!(
            kw(effort("none"), ThinkingDefault::On, true, json!({})),
            json!({"enable_thinking": false, "reasoning_effort": "none", "preserve_thinking": true})
        );
        assert_eq!(
            kw(effort("low"), ThinkingDefault::Off, false, json!({"enable_thinking": false})),
            json!({"enable_thinking": false, "reasoning_effort": "low"}),
            "the client's own kwargs win"
        );
        assert_eq!(
            kw(Ask { enable: Some(true), effort: None }, ThinkingDefault::Off, false, json!({})),
            json!({"enable_thinking": true})
        );
    }
}
