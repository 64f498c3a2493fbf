//! Compiling grammars against one tokenizer. The token trie behind every
//! mask is built once per model (lazily, on the first constrained request)
//! and shared by every row's matcher.

use super::clock::MaskClock;
use super::error::{reason, GrammarError};
use super::grammar::Grammar;
use super::matcher::{Constraint, ConstraintSource};
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use std::path::Path;
use std::sync::Arc;

pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    /// The model's logits width (the mask's length).
    vocab: usize,
    /// Every id that ends a generation (the model's EOS set).
    eos: Vec<u32>,
    clock: Arc<MaskClock>,
}

impl GrammarCompiler {
    /// The compiler for the tokenizer in `tokenizer_json`, masks `vocab`
    /// wide (the model's logits may be wider than the tokenizer's
    /// vocabulary), with `eos` as the ids that may end a grammar.
    pub fn new(tokenizer_json: &Path, vocab: usize, eos: &[u32], clock: Arc<MaskClock>) -> Result<Self, GrammarError> {
        let err =
            |e: anyhow::Error| GrammarError(format!("constrained decoding is unavailable for this tokenizer: {e}"));
        let mut tok = toktrie_hf_tokenizers::ByteTokenizer::from_file(tokenizer_json).map_err(err)?;
        let known: Vec<u32> = eos.iter().copied().filter(|&t| (t as usize) < vocab).collect();
        if !known.is_empty() {
            tok.set_eos_tokens(&known);
        }
        let env = tok.into_tok_env(Some(vocab)).map_err(err)?;
        let mut factory = ParserFactory::new_simple(&env).map_err(err)?;
        factory.quiet();
        Ok(Self { factory: Arc::new(factory), vocab, eos: known, clock })
    }

    /// The constraint `source` describes, compiled afresh.
    pub fn rebuild(&self, source: &ConstraintSource) -> Result<Constraint, GrammarError> {
        let c = self.compile(&source.grammar)?;
        Ok(match source.gate {
            Some(gate) => c.after_reasoning(gate),
            None => c,
        })
    }

    /// A fresh matcher for `grammar`, or why the grammar is refused (a
    /// schema llguidance does not support, a regex or grammar that does not
    /// parse, or one that no text matches: its first mask cannot be
    /// computed or allows nothing, found here rather than in a running batch).
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, GrammarError> {
        // A mask moves nothing: the matcher stays at the grammar's start,
        // and the first step reuses this mask.
        let mut c = self.parse(grammar)?;
        let first = c.allowed_words()?;
        if first.iter().all(|&w| w == 0) {
            return Err(GrammarError("no text matches the grammar: it allows no first token".into()));
        }
        Ok(c)
    }

    fn parse(&self, grammar: &Grammar) -> Result<Constraint, GrammarError> {
        let top = match grammar {
            Grammar::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(GrammarError("a JSON Schema must be an object (or true/false)".into()));
                }
                TopLevelGrammar::from_json_schema(with_layout(schema.clone()))
            }
            Grammar::JsonObject => {
                TopLevelGrammar::from_json_schema(with_layout(serde_json::json!({ "type": "object" })))
            }
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
            Grammar::Choice(options) => {
                if options.is_empty() {
                    return Err(GrammarError("a choice needs at least one option".into()));
                }
                let alternatives: Vec<String> =
                    options.iter().map(|o| serde_json::to_string(o).expect("a string serialises")).collect();
                TopLevelGrammar::from_lark(format!("start: {}", alternatives.join(" | ")))
            }
        };
        let parser = self.factory.create_parser(top).map_err(|e| GrammarError(reason(e)))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError(reason(e)));
        }
        Ok(Constraint::new(matcher, self.vocab, self.eos.clone(), self.clock.clone()).compiled_from(grammar))
    }
}

/// `schema` with the JSON layout answers are written in, unless the client
/// chose one (llguidance's `x-guidance` options): Python's `json.dumps`
/// separators and no other whitespace. Free whitespace lets a model spend
/// its whole budget on newlines between two keys (seen with random weights,
/// and a known failure of weak models), and a fixed layout is what JSON
/// parsers and prompt caches like best.
fn with_layout(schema: serde_json::Value) -> serde_json::Value {
    match schema {
        serde_json::Value::Object(mut o) if !o.contains_key("x-guidance") => {
            o.insert(
                "x-guidance".into(),
                serde_json::json!({ "whitespace_flexible": false, "item_separator": ", ", "key_separator": ": " }),
            );
            serde_json::Value::Object(o)
        }
        // `true`/`false` and schemas with their own layout.
        other => other,
    }
}
