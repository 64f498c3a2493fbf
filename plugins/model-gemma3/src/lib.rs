//! Model family `model-gemma3`: Gemma 3 text models (HF `gemma3_text`,
//! `Gemma3ForCausalLM`): (1 + w) RMSNorms before and after both attention
//! and MLP, q/k norms, embeddings scaled by sqrt(hidden_size), a gelu_approx
//! gated MLP, `query_pre_attn_scalar` attention scale, and sliding-window
//! layers (local RoPE base) with a global layer every `sliding_window_pattern`.
//!
//! Reference: mlx-lm `models/gemma3_text.py` (the numerical oracle), mirrored
//! op for op; HF `Gemma3ForCausalLM`.

mod args;

use args::Args;
use mlx_rs::ops;
use model_kit::attention::{attend, masks_by_kind, positions, Mask};
use model_kit::checkpoint::{config_error, Checkpoint};
use model_kit::compiled::gelu_approx;
use model_kit::config::Config;
use model_kit::graph::{input_tokens, into_model, Family};
use model_kit::layers::{Embedding, Linear, LoadCtx};
use model_kit::lm_head::LmHead;
use model_kit::ops::scalar;
use model_kit::rope::Rope;
use model_kit::taps::Taps;
use model_kit::{Array, Dtype, Result};
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
        "Gemma 3 text: gemma3_text",
        Claims {
            model_types: rstrings(args::MODEL_TYPES),
            architectures: rstrings(&["Gemma3ForCausalLM"]),
            ..Default::default()
        },
        &[
            caps::CONTINUOUS_BATCHING,
            caps::LAYOUT_ATTENTION,
            caps::HIDDEN_TAPS,
            caps::GROUPED_SPECULATIVE,
            caps::TENSOR_PARALLEL
        ],
    )
}

fn plan_model(config: &str) -> std::result::Result<ModelPlan, PluginError> {
    let cfg = Config::parse(config).map_err(|e| PluginError::invalid_config(e.what()))?;
    let args = Args::from_config(&cfg).map_err(|e| PluginError::invalid_config(e.what()))?;
    Ok(args.plan(&cfg))
}

fn open_model(a: &ModelOpenArgs) -> std::result::Result<ModelBox, PluginError> {
    let mut ck = Checkpoint::open(a)?;
    let args = Args::from_config(&ck.cfg).map_err(config_error)?;
    // mlx-lm's sanitize: the model is tied exactly when the checkpoint has no
    // lm_head (config.json's tie_word_embeddings is not consulted).
    let tied = !ck.weights.contains("lm_head.weight");
    let model = ck.load(|ctx, cfg| Model::load(ctx, args, cfg, tied))?;
    into_model(model, a)
}

/// mlx-lm's gemma `RMSNorm`: `mx.fast.rms_norm(x, 1.0 + weight, eps)`. The
/// `1.0 + weight` is computed in the weight's dtype (a Python scalar takes
/// the array's dtype); we do it once at load instead of on every call.
struct GemmaRmsNorm {
    weight: Array,
    eps: f32,
}

impl GemmaRmsNorm {
    fn load(ctx: &mut LoadCtx, path: &str, dim: usize, eps: f32) -> Result<Self> {
        let w = ctx.tensor(&format!("{path}.weight"), &[dim])?;
        let weight = scalar(1.0, w.dtype())?.add(&w)?;
        ctx.loaded.push(weight.clone());
        Ok(Self { weight, eps })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        mlx_rs::fast::rms_norm(x, Some(&self.weight), self.eps)
    }
}

/// Gemma's gated MLP: `down(gelu_approx(gate(x)) * up(x))`.
struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
}

impl Mlp {
    fn load(ctx: &mut LoadCtx, p: &str, hidden: usize, inter: usize) -> Result<Self> {
        Ok(Self {
            // Tensor-parallel: gate/up by column, down by row (model-kit's `shard`).
            gate: Linear::load_column(ctx, &format!("{p}.gate_proj"), inter, hidden, false)?,
            down: Linear::load_row(ctx, &format!("{p}.down_proj"), hidden, inter, false)?,
            up: Linear::load_column(ctx, &format!("{p}.up_proj"), inter, hidden, false)?,
        })
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        // mlx-lm's compile boundary: gelu_approx fused, the product separate
        // (on a GPU a fused product would round differently).
        let act = gelu_approx(&self.gate.forward(x)?)?.multiply(self.up.forward(x)?)?;
        self.down.forward(&act)
    }
}

/// mlx-lm's `clip_residual`: a plain add, except in float16 where the sum is
/// taken in float32 and clipped to the float16 range.
fn clip_residual(x: &Array, y: &Array) -> Result<Array> {
    if x.dtype() != Dtype::Float16 {
        return x.add(y);
    }
    let bound = 65504.0f32;
    let s = x.as_dtype(Dtype::Float32)?.add(y.as_dtype(Dtype::Float32)?)?;
    ops::clip(&s, (Array::from_f32(-bound), Array::from_f32(bound)))?.as_dtype(Dtype::Float16)
}

struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: GemmaRmsNorm,
    k_norm: GemmaRmsNorm,
    rope: Rope,
    heads: i32,
    kv_heads: i32,
    scale: f32,
}

impl Attention {
    fn load(ctx: &mut LoadCtx, p: &str, a: &Args, sliding: bool) -> Result<Self> {
        let rope = if sliding {
            Rope::new(a.head_dim as i32, a.rope_local_base_freq, false, None)?
        } else {
            Rope::new(a.head_dim as i32, a.rope_theta, false, a.rope_scaling.as_ref())?
        };
        let (q_width, kv_width) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
        // With tensor parallelism each rank runs whole heads of its own.
        let heads = ctx.shard.split(a.heads, "attention heads")?;
        let kv_heads = ctx.shard.split(a.kv_heads, "KV heads")?;
        Ok(Self {
            q: Linear::load_column(ctx, &format!("{p}.q_proj"), q_width, a.hidden, false)?,
            k: Linear::load_column(ctx, &format!("{p}.k_proj"), kv_width, a.hidden, false)?,
            v: Linear::load_column(ctx, &format!("{p}.v_proj"), kv_width, a.hidden, false)?,
            o: Linear::load_row(ctx, &format!("{p}.o_proj"), a.hidden, q_width, false)?,
            q_norm: GemmaRmsNorm::load(ctx, &format!("{p}.q_norm"), a.head_dim, a.rms_norm_eps)?,
            k_norm: GemmaRmsNorm::load(ctx, &format!("{p}.k_norm"), a.head_dim, a.rms_norm_eps)?,
            rope,
            heads: heads as i32,
            kv_heads: kv_heads as i32,
            scale: a.query_pre_attn_scalar.powf(-0.5) as f32,
        })
    }

    fn forward(&self, x: &Array, mask: &Mask, cache: &mut CacheBox) -> Result<Array> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let split = |t: Array, n: i32| t.reshape(&[b, l, n, -1])?.transpose_axes(&[0, 2, 1, 3]);
        // As mlx-lm: reshape + transpose, then the q/k norms.
        let q = self.q_norm.forward(&split(self.q.forward(x)?, self.heads)?)?;
        let k = self.k_norm.forward(&split(self.k.forward(x)?, self.kv_heads)?)?;
        let v = split(self.v.forward(x)?, self.kv_heads)?;
        let pos = positions(cache)?;
        let q = self.rope.apply(&q, &pos)?;
        let k = self.rope.apply(&k, &pos)?;
        let out = attend(cache, &q, k, v, self.scale, mask)?;
        self.o.forward(&out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
    }
}

struct Block {
    attn: Attention,
    mlp: Mlp,
    input_norm: GemmaRmsNorm,
    post_attn_norm: GemmaRmsNorm,
    pre_ff_norm: GemmaRmsNorm,
    post_ff_norm: GemmaRmsNorm,
    sliding: bool,
}

impl Block {
    fn forward(&self, x: &Array, mask: &Mask, cache: &mut CacheBox) -> Result<Array> {
        let r = self.attn.forward(&self.input_norm.forward(x)?, mask, cache)?;
        let h = clip_residual(x, &self.post_attn_norm.forward(&r)?)?;
        let r = self.mlp.forward(&self.pre_ff_norm.forward(&h)?)?;
        clip_residual(&h, &self.post_ff_norm.forward(&r)?)
    }
}

struct Model {
    plan: ModelPlan,
    embed: Embedding,
    /// sqrt(hidden_size) as mlx-lm rounds it: to bfloat16 (then to the
    /// activations' dtype at use).
    embed_scale: Array,
    layers: Vec<Block>,
    norm: GemmaRmsNorm,
    lm_head: LmHead,
}

impl Model {
    fn load(ctx: &mut LoadCtx, args: Args, cfg: &Config, tied: bool) -> Result<Self> {
        let (hidden, eps) = (args.hidden, args.rms_norm_eps);
        let embed = Embedding::load(ctx, "model.embed_tokens", args.vocab_size, hidden)?;
        let mut layers = Vec::with_capacity(args.layers);
        for i in 0..args.layers {
            let p = format!("model.layers.{i}");
            let norm = |ctx: &mut LoadCtx, name: &str| GemmaRmsNorm::load(ctx, &format!("{p}.{name}"), hidden, eps);
            layers.push(Block {
                attn: Attention::load(ctx, &format!("{p}.self_attn"), &args, args.sliding[i])?,
                mlp: Mlp::load(ctx, &format!("{p}.mlp"), hidden, args.intermediate)?,
                input_norm: norm(ctx, "input_layernorm")?,
                post_attn_norm: norm(ctx, "post_attention_layernorm")?,
                pre_ff_norm: norm(ctx, "pre_feedforward_layernorm")?,
                post_ff_norm: norm(ctx, "post_feedforward_layernorm")?,
                sliding: args.sliding[i],
            });
        }
        let norm = GemmaRmsNorm::load(ctx, "model.norm", hidden, eps)?;
        let lm_head = LmHead::load(ctx, "lm_head", args.vocab_size, hidden, tied)?;
        let embed_scale = Array::from_f32((args.hidden as f64).sqrt() as f32).as_dtype(Dtype::Bfloat16)?;
        ctx.loaded.push(embed_scale.clone());
        let plan = args.plan(cfg);
        Ok(Self { plan, embed, embed_scale, layers, norm, lm_head })
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
        let l = tokens.shape()[1];
        let h = self.embed.forward(&tokens)?;
        let mut h = h.multiply(self.embed_scale.as_dtype(h.dtype())?)?;
        // One mask per attention kind, from the first layer of that kind
        // (mlx-lm: cache[sliding_window_pattern - 1] and cache[0]), asked
        // before any cache is updated.
        let masks = masks_by_kind(caches, |i| self.layers[i].sliding, l)?;
        let mut taps = Taps::new(args, self.layers.len())?;
        for (i, (block, cache)) in self.layers.iter().zip(caches.iter_mut()).enumerate() {
            let mask = masks[usize::from(block.sliding)].as_ref().expect("a mask of this kind");
            h = block.forward(&h, mask, cache)?;
            taps.offer(i, &h);
        }
        let h = self.norm.forward(&h)?;
        model_kit::graph::finish(args, h, |x| self.head(x), taps)
    }
}
