//! What an engine is built from: one value, set by the command line (or a
//! test) before the engine exists. The engine never changes after that.

use plugin_api::{DrafterBox, Dtype};
use std::path::PathBuf;

/// What the user asked for: `auto` picks per device, `native` keeps the
/// checkpoint's dtype (and quantization), or a named float dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DtypeChoice {
    Auto,
    Native,
    Fixed(Dtype),
}

impl DtypeChoice {
    pub fn parse(s: &str) -> Result<Self, crate::EngineError> {
        Ok(match s {
            "auto" => Self::Auto,
            "native" => Self::Native,
            "float32" | "f32" => Self::Fixed(Dtype::FLOAT32),
            "bfloat16" | "bf16" => Self::Fixed(Dtype::BFLOAT16),
            "float16" | "f16" => Self::Fixed(Dtype::FLOAT16),
            other => {
                return Err(crate::EngineError::Config(format!(
                    "unknown dtype `{other}` (auto, native, float32, bfloat16, float16)"
                )))
            }
        })
    }
}

pub struct EngineConfig {
    pub dtype: DtypeChoice,
    /// Prompt tokens per prefill chunk (mlx-lm's default: 2048).
    pub prefill_step: usize,
    /// Prefix cache capacity in bytes (0: no prefix cache).
    pub prefix_cache_bytes: usize,
    /// Options handed to the model family at open (`key=value`), e.g. the
    /// attention route model-kit takes on a GPU.
    pub model_options: Vec<(String, String)>,
    /// Speculative decoding, when configured.
    pub speculation: Option<SpeculationConfig>,
    /// The KV storage scheme every cache is made in (`CacheSpec.scheme`):
    /// `plain`, or e.g. `affine8:group=64,start=0` ([`kv_scheme`]).
    pub kv_scheme: String,
    /// The prefix cache's SSD tier (`--ssd-cache`), when configured.
    pub ssd_cache: Option<crate::ssd_cache::SsdConfig>,
    /// Every this many generated tokens, a running request's state goes to
    /// the prefix cache (and its SSD tier): a resumed generation
    /// (`--generation-checkpoint`) prefills only what came after.
    pub generation_checkpoint: Option<usize>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            dtype: DtypeChoice::Auto,
            prefill_step: 2048,
            prefix_cache_bytes: 0,
            model_options: Vec::new(),
            speculation: None,
            kv_scheme: "plain".to_owned(),
            ssd_cache: None,
            generation_checkpoint: None,
        }
    }
}

/// The scheme string for `--kv-quant` (`off`, `8`, `4`, `turbo[:kXvY]`),
/// `--kv-group-size` and `--quantized-kv-start`: `plain`,
/// `affine<bits>:group=<g>,start=<s>` or `turbo:k=<X>,v=<Y>,group=<g>,start=<s>`
/// (the form `CacheSpec.scheme` documents; layouts claim the name).
pub fn kv_scheme(kv_quant: &str, group_size: u32, start: u64) -> Result<String, crate::EngineError> {
    let bad = |why: String| crate::EngineError::Config(why);
    if !matches!(group_size, 32 | 64 | 128) {
        return Err(bad(format!("--kv-group-size {group_size}: expected 32, 64 or 128")));
    }
    let tail = format!("group={group_size},start={start}");
    match kv_quant {
        "off" | "none" | "plain" => Ok("plain".to_owned()),
        "8" | "4" => Ok(format!("affine{kv_quant}:{tail}")),
        "turbo" => Ok(format!("turbo:k=8,v=3,{tail}")),
        t if t.starts_with("turbo:") => {
            let kv = &t["turbo:".len()..];
            let parsed = kv
                .strip_prefix('k')
                .and_then(|r| r.split_once('v'))
                .and_then(|(k, v)| Some((k.parse::<u32>().ok()?, v.parse::<u32>().ok()?)));
            match parsed {
                Some((k, v)) if matches!(k, 2..=6 | 8) && (2..=5).contains(&v) => {
                    Ok(format!("turbo:k={k},v={v},{tail}"))
                }
                _ => Err(bad(format!(
                    "--kv-quant `{t}`: expected turbo:k<bits>v<bits>, keys at 2-6 or 8 bits, values at 2-5 (default turbo = turbo:k8v3)"
                ))),
            }
        }
        other => Err(bad(format!("--kv-quant `{other}`: expected off, 8, 4 or turbo[:k<bits>v<bits>]"))),
    }
}

/// The scheme string of `--paged-kv` with `--kv-block-size block`.
pub fn paged_scheme(block: u32) -> Result<String, crate::EngineError> {
    if !(1..=4096).contains(&block) {
        return Err(crate::EngineError::Config(format!("--kv-block-size {block}: expected 1 to 4096 tokens")));
    }
    Ok(format!("paged:block={block}"))
}

/// Where the drafter comes from.
pub enum DraftSource {
    /// A drafter plugin: of `kind`, or the kind the drafter plugins detect
    /// in `draft_model`'s files when `kind` is None.
    Plugin { kind: Option<String>, draft_model: Option<PathBuf>, options: Vec<(String, String)> },
    /// A drafter made by the embedding program (tests drive scripted ones):
    /// its kind, and the capability tags it would advertise.
    Given { drafter: DrafterBox, kind: String, capabilities: Vec<String> },
}

pub struct SpeculationConfig {
    pub source: DraftSource,
    /// Most tokens drafted per round (None: the drafter's own default,
    /// its `default-depth:<n>` tag, else 3).
    pub depth: Option<usize>,
    /// Never switch a request to plain steps because rounds do not pay
    /// (measurements, experiments).
    pub always: bool,
}
