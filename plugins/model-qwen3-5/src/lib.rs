//! Model family `model-qwen3-5`: the Qwen3.5 text model (HF `qwen3_5`,
//! `Qwen3_5ForCausalLM` / the text part of
//! `Qwen3_5ForConditionalGeneration`), a hybrid of gated DeltaNet layers
//! (linear attention over a recurrent state, `delta.rs`) and, every
//! `full_attention_interval`-th layer, gated full attention
//! (`model_kit::gated_attention`), each followed by a SwiGLU MLP, or in the MoE variant
//! (`qwen3_5_moe`, `num_experts > 0`) by a sparse one with a shared expert
//! (`moe.rs`).
//!
//! Reference: mlx-lm `models/qwen3_5.py` (+ `qwen3_next.py`,
//! `gated_delta.py`), the numerical oracle, mirrored op for op.
//! DeltaNet layers declare a RECURRENT need (served by `state-recurrent`),
//! attention layers a FULL one (`kv-plain`).

mod args;
mod delta;
mod delta_kernel;
mod gated_norm;
mod moe;
mod options;
mod recurrence;

use args::Args;
use delta::DeltaNet;
use model_kit::attention::Mask;
use model_kit::checkpoint::{config_error, Checkpoint};
use model_kit::config::Config;
use model_kit::gated_attention::GatedAttention as Attention;
use model_kit::graph::{input_tokens, into_model, Family};
use model_kit::layers::{Embedding, LoadCtx, RmsNorm as Norm};
use model_kit::lm_head::LmHead;
use model_kit::mlp::Mlp;
use model_kit::routes::take_options;
use model_kit::taps::Taps;
use model_kit::weights::Weights;
use model_kit::{error, Array, Result};
use moe::SparseMoeBlock;
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
        "Qwen3.5 hybrid text model: gated DeltaNet + gated attention, dense or MoE (qwen3_5, qwen3_5_moe)",
        Claims {
            model_types: rstrings(args::MODEL_TYPES),
            architectures: rstrings(&[
                "Qwen3_5ForCausalLM",
                "Qwen3_5ForConditionalGeneration",
                "Qwen3_5MoeForCausalLM",
                "Qwen3_5MoeForConditionalGeneration",
            ]),
            ..Default::default()
        },
        &[
            caps::CONTINUOUS_BATCHING,
            caps::LAYOUT_ATTENTION,
            caps::HIDDEN_TAPS,
            caps::SHARED_EMBEDDINGS,
            caps::GROUPED_SPECULATIVE
        ],
    )
}

fn plan_model(config: &str) -> std::result::Result<ModelPlan, PluginError> {
    let cfg = Config::parse(config).map_err(config_error)?;
    let args = Args::from_config(&cfg).map_err(config_error)?;
    Ok(args.plan(&cfg))
}

fn open_model(a: &ModelOpenArgs) -> std::result::Result<ModelBox, PluginError> {
    let mut a = a.clone();
    let mine = take_options(&mut a.options, &options::KEYS);
    let options = options::Options::parse(&mine).map_err(|e| PluginError::invalid_input(e.what()))?;
    let a = &a;
    let mut ck = Checkpoint::open(a)?;
    let args = Args::from_config(&ck.cfg).map_err(config_error)?;
    let names = Names::of(&ck.weights);
    // mlx-lm's sanitize: no vision tower, no multi-token-prediction head, and
    // a tied model's head is the embedding.
    ck.weights.drop_matching(|k| k.starts_with("vision_tower") || k.starts_with("model.visual") || k.contains("mtp."));
    if args.tie_word_embeddings {
        let head = names.head.clone();
        ck.weights.drop_matching(|k| k.strip_prefix(head.as_str()).is_some_and(|r| r.starts_with('.')));
    }
    let model = ck.load(|ctx, cfg| Model::load(ctx, args, cfg, &names, options))?;
    into_model(model, a)
}

/// Where the text model's tensors live: mlx-lm folders say
/// `language_model.model.*` / `language_model.lm_head`, Hugging Face
/// multimodal ones `model.language_model.*` / `lm_head`, text-only ones
/// `model.*` / `lm_head`. Names keep the checkpoint's spelling, so the
/// per-layer quantization keys of mlx-lm folders match.
struct Names {
    body: String,
    head: String,
}

impl Names {
    fn of(w: &Weights) -> Self {
        let (body, head) = if w.contains("language_model.model.embed_tokens.weight") {
            ("language_model.model", "language_model.lm_head")
        } else if w.contains("model.language_model.embed_tokens.weight") {
            ("model.language_model", "lm_head")
        } else {
            ("model", "lm_head")
        };
        Self { body: body.into(), head: head.into() }
    }
}

enum Mixer {
    Delta(DeltaNet),
    Attention(Attention),
}

enum Ffn {
    Dense(Box<Mlp>),
    Sparse(Box<SparseMoeBlock>),
}

struct Block {
    mixer: Mixer,
    mlp: Ffn,
    input_norm: Norm,
    post_norm: Norm,
}

impl Block {
    /// Each half as its norm, its work and the residual add; on a GPU
    /// decode step or short verify the projections run fused with their
    /// norms and residuals (`model_kit::fused_layers`).
    fn forward(&self, x: &Array, mask: Option<&Mask>, cache: &mut CacheBox) -> Result<Array> {
        let h = match (&self.mixer, mask) {
            (Mixer::Delta(d), _) => d.forward_residual(x, &self.input_norm, cache)?,
            (Mixer::Attention(a), Some(m)) => a.forward_residual(x, &self.input_norm, m, cache)?,
            (Mixer::Attention(_), None) => return Err(error("attention layer without a mask")),
        };
        match &self.mlp {
            Ffn::Dense(m) => m.forward_residual(&self.post_norm, &h),
            Ffn::Sparse(m) => h.add(m.forward(&self.post_norm.forward(&h)?)?),
        }
    }
}

struct Model {
    plan: ModelPlan,
    embed: Embedding,
    layers: Vec<Block>,
    norm: Norm,
    lm_head: LmHead,
    /// The first attention layer: its cache gives the attention mask (as
    /// mlx-lm's `fa_idx`).
    first_attention: Option<usize>,
}

impl Model {
    /// `options`: the family's own (`options`).
    fn load(ctx: &mut LoadCtx, args: Args, cfg: &Config, names: &Names, options: options::Options) -> Result<Self> {
        let body = &names.body;
        // mlx-lm's sanitize: a conv1d weight in Hugging Face's layout
        // `[C, 1, K]` marks an unsanitized checkpoint, whose conv weights are
        // moved to MLX's `[C, K, 1]` and whose norm weights get +1.
        let mut convs = Vec::new();
        for i in (0..args.layers).filter(|&i| args.is_linear[i]) {
            convs.push(ctx.weights.take(&format!("{body}.layers.{i}.linear_attn.conv1d.weight"))?);
        }
        let raw_hf = convs.iter().any(|c| c.shape().last() != Some(&1));
        let mut convs = convs.into_iter().map(|c| if c.shape().last() != Some(&1) { c.swap_axes(1, 2) } else { Ok(c) });
        let (hidden, eps) = (args.hidden, args.rms_norm_eps);
        let embed = Embedding::load(ctx, &format!("{body}.embed_tokens"), args.vocab_size, hidden)?;
        let mut layers = Vec::with_capacity(args.layers);
        for i in 0..args.layers {
            let p = format!("{body}.layers.{i}");
            let mixer = if args.is_linear[i] {
                let conv = convs.next().ok_or_else(|| error("conv1d weights out of step"))??;
                Mixer::Delta(DeltaNet::load(ctx, &format!("{p}.linear_attn"), args.linear, hidden, eps, conv, options)?)
            } else {
                Mixer::Attention(Attention::load(ctx, &format!("{p}.self_attn"), &args.attention_shape(raw_hf))?)
            };
            layers.push(Block {
                mixer,
                mlp: match &args.moe {
                    Some(m) => Ffn::Sparse(Box::new(SparseMoeBlock::load(ctx, &format!("{p}.mlp"), m, hidden)?)),
                    None => {
                        Ffn::Dense(Box::new(Mlp::load(ctx, &format!("{p}.mlp"), hidden, args.intermediate, false)?))
                    }
                },
                input_norm: Norm::load_shifted(ctx, &format!("{p}.input_layernorm"), hidden, eps, raw_hf)?,
                post_norm: Norm::load_shifted(ctx, &format!("{p}.post_attention_layernorm"), hidden, eps, raw_hf)?,
            });
        }
        let norm = Norm::load_shifted(ctx, &format!("{body}.norm"), hidden, eps, raw_hf)?;
        let lm_head = LmHead::load(ctx, &names.head, args.vocab_size, hidden, args.tie_word_embeddings)?;
        let first_attention = args.is_linear.iter().position(|&l| !l);
        Ok(Self { plan: args.plan(cfg), embed, layers, norm, lm_head, first_attention })
    }
}

impl Family for Model {
    fn plan(&self) -> &ModelPlan {
        &self.plan
    }

    fn embed_tokens(&self, ids: &Array) -> Result<Array> {
        self.embed.forward(ids)
    }

    fn head(&self, h: &Array) -> Result<Array> {
        self.lm_head.forward(&self.embed, h)
    }

    fn run(&self, args: &ForwardArgs<'_>, caches: &mut [CacheBox]) -> Result<ForwardOutput> {
        let tokens = input_tokens(args, caches.len(), self.layers.len())?;
        let mut h = self.embed.forward(&tokens)?;
        // Asked before any cache is updated. Each DeltaNet layer asks its
        // own layout for its padding mask (mlx-lm's `create_ssm_mask`).
        let mask = match self.first_attention {
            Some(i) => Some(Mask::for_cache(&caches[i], tokens.shape()[1])?),
            None => None,
        };
        let mut taps = Taps::new(args, self.layers.len())?;
        for (i, (block, cache)) in self.layers.iter().zip(caches.iter_mut()).enumerate() {
            h = block.forward(&h, mask.as_ref(), cache)?;
            taps.offer(i, &h);
        }
        let h = self.norm.forward(&h)?;
        model_kit::graph::finish(args, h, |x| self.head(x), taps)
    }
}
