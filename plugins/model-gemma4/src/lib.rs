//! Model family `model-gemma4`: Gemma 4 text models (HF `gemma4_text`,
//! `Gemma4ForCausalLM`; and the text model inside `gemma4`'s
//! `text_config`). Sliding-window and full layers with their own head dims,
//! KV heads and RoPE (`proportional` partial rotation on full layers), q/k
//! norms and a scale-free v norm, attention scale 1, K = V on full layers
//! (`attention_k_eq_v`), KV sharing across the last
//! `num_kv_shared_layers` layers (which hold no cache), double-wide MLPs
//! there, per-layer input embeddings, a layer scalar, soft-capped logits,
//! and the optional MoE block (`enable_moe_block`).
//!
//! Reference: mlx-lm `models/gemma4_text.py` and `models/gemma4.py` (the
//! numerical oracle), mirrored op for op.

mod args;
mod attention;
mod block;
mod moe;
mod per_layer;

use args::Args;
use attention::{KvSource, SharedKv};
use block::Block;
use model_kit::attention::masks_by_kind;
use model_kit::checkpoint::{config_error, Checkpoint};
use model_kit::config::Config;
use model_kit::graph::{input_tokens, into_model, Family};
use model_kit::layers::{Embedding, LoadCtx, RmsNorm};
use model_kit::lm_head::LmHead;
use model_kit::ops::scalar;
use model_kit::taps::Taps;
use model_kit::weights::Weights;
use model_kit::{Array, Result};
use per_layer::PerLayerInputs;
use plugin_api::*;
use plugin_sdk::rstrings;

plugin_sdk::export_plugin! {
    manifest: manifest,
    plan_model: plan_model,
    open_model: open_model,
}

fn manifest() -> PluginManifest {
    plugin_sdk::manifest!(
        PluginKind::MODEL_FAMILY,
        "Gemma 4 text: gemma4_text (and gemma4's text model)",
        Claims {
            model_types: rstrings(args::MODEL_TYPES),
            architectures: rstrings(args::ARCHITECTURES),
            ..Default::default()
        },
        &[caps::CONTINUOUS_BATCHING, caps::HIDDEN_TAPS, caps::GROUPED_SPECULATIVE],
    )
}

fn plan_model(config: &str) -> std::result::Result<ModelPlan, PluginError> {
    let cfg = Config::parse(config).map_err(config_error)?;
    let args = args::text_config(&cfg).and_then(|t| Args::from_config(&t)).map_err(config_error)?;
    Ok(args.plan(&cfg))
}

fn open_model(a: &ModelOpenArgs) -> std::result::Result<ModelBox, PluginError> {
    let mut ck = Checkpoint::open(a)?;
    let args = args::text_config(&ck.cfg).and_then(|t| Args::from_config(&t)).map_err(config_error)?;
    let names = Names::of(&ck.weights);
    sanitize(&mut ck.weights, &names, &args);
    let model = ck.load(|ctx, cfg| Model::load(ctx, args, cfg, &names))?;
    into_model(model, a)
}

/// Where the text model's tensors sit: `model.*` and `lm_head` for
/// `gemma4_text`; inside `gemma4` as mlx-lm saves it
/// (`language_model.model.*`) or as Hugging Face does (`model.language_model.*`).
struct Names {
    root: &'static str,
    lm_head: &'static str,
}

impl Names {
    fn of(w: &Weights) -> Self {
        for root in ["language_model.model.", "model.language_model."] {
            if w.contains(&format!("{root}embed_tokens.weight")) || w.contains(&format!("{root}embed_tokens.scales")) {
                return Self { root, lm_head: "language_model.lm_head" };
            }
        }
        Self { root: "model.", lm_head: "lm_head" }
    }
}

/// mlx-lm's `sanitize`: drops rotary buffers, activation-range statistics,
/// the multimodal towers, and the K/V projections of KV-shared layers.
fn sanitize(w: &mut Weights, names: &Names, a: &Args) {
    const SKIP: &[&str] = &["self_attn.rotary_emb", "input_max", "input_min", "output_max", "output_min"];
    const TOWERS: &[&str] =
        &["vision_tower", "multi_modal_projector", "audio_tower", "embed_audio", "embed_vision", "vision_embedder"];
    let layers = format!("{}layers.", names.root);
    w.drop_matching(|k| {
        let bare = k.strip_prefix("model.").unwrap_or(k);
        if SKIP.iter().any(|s| k.contains(s)) || TOWERS.iter().any(|t| bare.starts_with(t)) {
            return true;
        }
        let Some(rest) = k.strip_prefix(&layers) else { return false };
        let layer = rest.split('.').next().and_then(|i| i.parse::<usize>().ok());
        let kv = [".self_attn.k_proj", ".self_attn.v_proj", ".self_attn.k_norm"].iter().any(|s| k.contains(s));
        kv && layer.is_some_and(|i| i >= a.cached)
    });
}

struct Model {
    plan: ModelPlan,
    embed: Embedding,
    /// sqrt(hidden_size), a Python float in mlx-lm (rounded to the
    /// activations' dtype at use, unlike Gemma 3's bfloat16 constant).
    embed_scale: f64,
    per_layer: Option<PerLayerInputs>,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: LmHead,
    softcap: Option<f32>,
    /// Layers `0..cached` own caches (one per plan entry).
    cached: usize,
    kv_source: Vec<usize>,
}

impl Model {
    fn load(ctx: &mut LoadCtx, args: Args, cfg: &Config, names: &Names) -> Result<Self> {
        let root = names.root;
        let embed = Embedding::load(ctx, &format!("{root}embed_tokens"), args.vocab_size, args.hidden)?;
        let per_layer = if args.per_layer_hidden > 0 { Some(PerLayerInputs::load(ctx, root, &args)?) } else { None };
        let layers = (0..args.layers)
            .map(|i| Block::load(ctx, &format!("{root}layers.{i}"), &args, i))
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::load(ctx, &format!("{root}norm"), args.hidden, args.rms_norm_eps)?;
        // gemma4_text ties by config (default true), not by the checkpoint.
        let lm_head = LmHead::load(ctx, names.lm_head, args.vocab_size, args.hidden, args.tie_word_embeddings)?;
        Ok(Self {
            plan: args.plan(cfg),
            embed,
            embed_scale: (args.hidden as f64).sqrt(),
            per_layer,
            layers,
            norm,
            lm_head,
            softcap: args.final_logit_softcapping,
            cached: args.cached,
            kv_source: args.kv_source,
        })
    }
}

impl Family for Model {
    fn plan(&self) -> &ModelPlan {
        &self.plan
    }

    fn embed_tokens(&self, ids: &Array) -> Result<Array> {
        self.embed.forward(ids)
    }

    /// LM head then `tanh(x / cap) * cap`.
    fn head(&self, h: &Array) -> Result<Array> {
        let logits = self.lm_head.forward(&self.embed, h)?;
        let Some(cap) = self.softcap else { return Ok(logits) };
        model_kit::compiled::softcap(&logits, &scalar(cap as f64, logits.dtype())?)
    }

    fn run(&self, args: &ForwardArgs<'_>, caches: &mut [CacheBox]) -> Result<ForwardOutput> {
        let tokens = input_tokens(args, caches.len(), self.cached)?;
        let l = tokens.shape()[1];
        let e = self.embed.forward(&tokens)?;
        let mut h = e.multiply(scalar(self.embed_scale, e.dtype())?)?;
        let per_layer = match &self.per_layer {
            Some(p) => Some(p.compute(&tokens, &h)?),
            None => None,
        };
        // One mask per attention kind, from the first cached layer of that
        // kind, asked before any cache is updated; shared layers use their
        // kind's mask, as mlx-lm's `_make_masks`.
        let masks = masks_by_kind(caches, |i| self.layers[i].sliding, l)?;
        let mut shared: Vec<Option<SharedKv>> = (0..self.cached).map(|_| None).collect();
        let mut taps = Taps::new(args, self.layers.len())?;
        for (i, block) in self.layers.iter().enumerate() {
            let mask = masks[usize::from(block.sliding)].as_ref().expect("a mask of this kind");
            let input = per_layer.as_ref().map(|all| PerLayerInputs::layer(all, i)).transpose()?;
            let kv = match caches.get_mut(i) {
                Some(cache) => KvSource::Own(cache),
                None => KvSource::Shared(shared[self.kv_source[i]].as_ref().expect("source layers run first")),
            };
            let (out, kv) = block.forward(&h, mask, kv, input.as_ref())?;
            h = out;
            if i < self.cached && self.kv_source[self.cached..].contains(&i) {
                shared[i] = kv;
            }
            taps.offer(i, &h);
        }
        let h = self.norm.forward(&h)?;
        model_kit::graph::finish(args, h, |x| self.head(x), taps)
    }
}
