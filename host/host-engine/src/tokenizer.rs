//! A model folder's text side: `tokenizer.json` (through the `tokenizers`
//! crate), `tokenizer_config.json` (special tokens, chat template,
//! add_bos_token) and `generation_config.json` (EOS ids, sampling defaults).

use crate::chat_template::ChatTemplate;
use crate::constraint::{GrammarCompiler, GrammarError, MaskClock};
use serde_json::Value;
use std::path::Path;
use tokenizers::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{0}")]
    Load(String),
    #[error("tokenizer: {0}")]
    Encode(String),
}

/// Defaults a model folder suggests for sampling (generation_config.json).
#[derive(Debug, Clone, Default)]
pub struct GenerationDefaults {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

pub struct TextSide {
    pub tokenizer: Tokenizer,
    pub template: Option<ChatTemplate>,
    pub eos_ids: Vec<u32>,
    pub bos_token: Option<String>,
    pub add_bos: bool,
    pub defaults: GenerationDefaults,
    /// The model's logits width (a grammar's mask covers every id).
    pub vocab: usize,
    tokenizer_path: std::path::PathBuf,
    /// Built on the first constrained request (the token trie takes a
    /// moment) and shared by every request after it.
    grammar: std::sync::OnceLock<Result<GrammarCompiler, GrammarError>>,
    /// What every constrained row's masks cost.
    pub mask_clock: std::sync::Arc<MaskClock>,
}

fn read_json(path: &Path) -> Option<Value> {
    std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str(&t).ok())
}

/// A special-token field: a string, or `{"content": "..."}`.
fn token_text(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

fn ids(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|n| n as u32)).collect(),
        _ => Vec::new(),
    }
}

impl TextSide {
    /// Loads the text side of `dir`; `config` is its config.json and
    /// `vocab` the model's logits width.
    pub fn load(dir: &Path, config: &Value, vocab: usize) -> Result<Self, TokenizerError> {
        let path = dir.join("tokenizer.json");
        let tokenizer =
            Tokenizer::from_file(&path).map_err(|e| TokenizerError::Load(format!("{}: {e}", path.display())))?;
        let tc = read_json(&dir.join("tokenizer_config.json")).unwrap_or(Value::Null);
        let gc = read_json(&dir.join("generation_config.json")).unwrap_or(Value::Null);
        let bos_token = token_text(tc.get("bos_token"));
        let eos_token = token_text(tc.get("eos_token"));
        // EOS ids: generation_config.json wins over config.json (as mlx-lm's
        // load_config), and the tokenizer's own EOS token is added.
        let mut eos_ids = ids(gc.get("eos_token_id"));
        if eos_ids.is_empty() {
            eos_ids = ids(config.get("eos_token_id"));
        }
        if let Some(id) = eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t)) {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let template = template_text(dir, &tc)
            .map(|t| ChatTemplate::new(&t, bos_token.clone(), eos_token.clone()))
            .transpose()
            .map_err(|e| TokenizerError::Load(e.to_string()))?;
        let f = |k: &str| gc.get(k).and_then(Value::as_f64).map(|x| x as f32);
        let defaults = GenerationDefaults {
            temperature: f("temperature"),
            top_p: f("top_p"),
            top_k: gc.get("top_k").and_then(Value::as_u64).map(|x| x as u32),
            min_p: f("min_p"),
            repetition_penalty: f("repetition_penalty"),
        };
        Ok(Self {
            tokenizer,
            template,
            eos_ids,
            add_bos: tc.get("add_bos_token").and_then(Value::as_bool).unwrap_or(false),
            bos_token,
            defaults,
            vocab,
            tokenizer_path: path,
            grammar: std::sync::OnceLock::new(),
            mask_clock: Default::default(),
        })
    }

    /// The chat template's source text (what tool-call syntax detection reads).
    pub fn template_source(&self) -> Option<&str> {
        self.template.as_ref().map(|t| t.source())
    }

    /// The tokenizer's added tokens by id: their text and whether each is
    /// special.
    pub fn added_tokens(&self) -> Vec<(u32, String, bool)> {
        let mut v: Vec<(u32, String, bool)> =
            self.tokenizer.get_added_tokens_decoder().into_iter().map(|(id, t)| (id, t.content, t.special)).collect();
        v.sort();
        v
    }

    /// Compiles grammars against this tokenizer (structured output, tool
    /// calls), or why this tokenizer cannot be constrained.
    pub fn grammar(&self) -> Result<&GrammarCompiler, GrammarError> {
        self.grammar
            .get_or_init(|| {
                GrammarCompiler::new(&self.tokenizer_path, self.vocab, &self.eos_ids, self.mask_clock.clone())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Encodes raw text the way mlx_lm.generate does for a plain prompt:
    /// the tokenizer's special-token handling, plus BOS when the config asks
    /// and the text does not already start with it.
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.tokenizer.encode(text, true).map_err(|e| TokenizerError::Encode(e.to_string()))?;
        let mut out = enc.get_ids().to_vec();
        if self.add_bos {
            if let Some(bos) = self.bos_token.as_deref().and_then(|t| self.tokenizer.token_to_id(t)) {
                if out.first() != Some(&bos) {
                    out.insert(0, bos);
                }
            }
        }
        Ok(out)
    }

    /// Encodes text that a chat template rendered: special tokens are already
    /// in the text, so none are added.
    pub fn encode_rendered(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.tokenizer.encode(text, false).map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> String {
        self.tokenizer.decode(ids, true).unwrap_or_default()
    }

    /// Token text for logprob reports (not skipping specials).
    pub fn token_str(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }
}

/// Incremental detokenizer: text deltas that never split a UTF-8 sequence
/// (an incomplete character is held back until it completes). It decodes a
/// short window (the tokens since the last emitted boundary) rather than the
/// whole output each time, so a long generation stays linear.
pub struct Detokenizer {
    text: std::sync::Arc<TextSide>,
    ids: Vec<u32>,
    /// Start of the decoding window (keeps context for merges and spaces).
    prefix: usize,
    /// Leave special tokens out of the text (the usual); tool calls keep
    /// them, since a model's tool-call markers may be special tokens.
    skip_special: bool,
    /// Tokens whose text has been emitted.
    read: usize,
}

impl Detokenizer {
    pub fn new(text: std::sync::Arc<TextSide>) -> Self {
        Self { text, ids: Vec::new(), prefix: 0, read: 0, skip_special: true }
    }

    /// A detokenizer that writes special tokens out as their text.
    pub fn keeping_special(text: std::sync::Arc<TextSide>) -> Self {
        Self { skip_special: false, ..Self::new(text) }
    }

    fn decode(&self, ids: &[u32]) -> String {
        self.text.tokenizer.decode(ids, self.skip_special).unwrap_or_default()
    }

    /// Adds a token; returns the new text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> String {
        self.ids.push(id);
        let before = self.decode(&self.ids[self.prefix..self.read]);
        let now = self.decode(&self.ids[self.prefix..]);
        if now.len() > before.len() && !now.ends_with('\u{FFFD}') && now.is_char_boundary(before.len()) {
            let delta = now[before.len()..].to_owned();
            self.prefix = self.read;
            self.read = self.ids.len();
            delta
        } else {
            String::new()
        }
    }

    /// Everything still held back.
    pub fn finish(&mut self) -> String {
        let before = self.decode(&self.ids[self.prefix..self.read]);
        let now = self.decode(&self.ids[self.prefix..]);
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        now.get(before.len()..).unwrap_or("").to_owned()
    }
}

/// The chat template as transformers finds it: `chat_template.jinja` (what
/// recent versions save, and mlx_lm.convert copies), else
/// `chat_template.json`, else `tokenizer_config.json`'s `chat_template`
/// (a string, or a list of named templates of which `default` is used).
fn template_text(dir: &Path, tokenizer_config: &Value) -> Option<String> {
    if let Ok(t) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        return Some(t);
    }
    let from = |v: Option<&Value>| -> Option<String> {
        match v? {
            Value::String(s) => Some(s.clone()),
            Value::Array(named) => named
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_owned)),
            _ => None,
        }
    };
    let json = read_json(&dir.join("chat_template.json")).unwrap_or(Value::Null);
    from(json.get("chat_template")).or_else(|| from(tokenizer_config.get("chat_template")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn side() -> Option<Arc<TextSide>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/smollm2-135m-instruct");
        let config = serde_json::json!({});
        TextSide::load(&dir, &config, 49152).ok().map(Arc::new)
    }

    #[test]
    fn streamed_deltas_concatenate_to_the_full_decode() {
        let Some(t) = side() else {
            panic!("models/smollm2-135m-instruct is missing: run `cargo xtask test`");
        };
        for text in [
            "Hello world, this is   spaced\ttext.",
            "héllo wörld — naïve café, 日本語, emoji 🦀🎉 done",
            "def f(x):\n    return x**2  # code 12345",
        ] {
            let ids = t.encode_rendered(text).unwrap();
            let mut d = Detokenizer::new(t.clone());
            let mut out = String::new();
            for &id in &ids {
                out.push_str(&d.push(id));
            }
            out.push_str(&d.finish());
            assert_eq!(out, t.decode(&ids), "{text}");
        }
    }
}
