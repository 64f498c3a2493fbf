//! Model family `model-llama`: the Llama graph and the HF model types that
//! share it: `llama` (with Llama-3 RoPE scaling), `mistral`, `qwen2` (q/k/v
//! bias), `qwen3` (q/k RMSNorm) and `smollm3` (NoPE layers).
//!
//! References: mlx-lm `models/llama.py`, `qwen2.py`, `qwen3.py`,
//! `smollm3.py` (the numerical oracle); HF `LlamaForCausalLM`.

mod args;

use args::Args;
use model_kit::attention::{attend, masks_by_kind, positions, Mask};
use model_kit::checkpoint::{config_error, Checkpoint};
use model_kit::config::Config;
use model_kit::graph::{input_tokens, into_model, Family};
use model_kit::layers::{Embedding, Linear, LoadCtx, RmsNorm};
use model_kit::lm_head::LmHead;
use model_kit::mlp::Mlp;
use model_kit::rope::Rope;
use model_kit::taps::Taps;
use model_kit::{fused_layers, qk_norm_rope};
use model_kit::{Array, Result};
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
        "Llama lineage: llama, mistral, qwen2, qwen3, smollm3",
        Claims {
            model_types: rstrings(args::MODEL_TYPES),
            architectures: rstrings(&[
                "LlamaForCausalLM",
                "MistralForCausalLM",
                "Qwen2ForCausalLM",
                "Qwen3ForCausalLM",
                "SmolLM3ForCausalLM",
            ]),
            ..Default::default()
        },
        &[
            caps::CONTINUOUS_BATCHING,
            caps::LAYOUT_ATTENTION,
            caps::HIDDEN_TAPS,
            caps::SHARED_EMBEDDINGS,
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
    // mlx-lm's sanitize: precomputed rotary frequencies are not weights, and a
    // tied model's lm_head duplicates the embedding.
    ck.weights.drop_matching(|k| k.contains("self_attn.rotary_emb.inv_freq"));
    if args.tie_word_embeddings {
        ck.weights.drop_matching(|k| k == "lm_head.weight");
    }
    let model = ck.load(|ctx, cfg| Model::load(ctx, args, cfg))?;
    into_model(model, a)
}

struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    /// None on NoPE layers (smollm3).
    rope: Option<Rope>,
    heads: i32,
    kv_heads: i32,
    scale: f32,
}

impl Attention {
    fn load(ctx: &mut LoadCtx, p: &str, a: &Args, use_rope: bool) -> Result<Self> {
        let norm = |ctx: &mut LoadCtx, n: &str| -> Result<Option<RmsNorm>> {
            if a.qk_norm {
                Ok(Some(RmsNorm::load(ctx, &format!("{p}.{n}"), a.head_dim, a.rms_norm_eps)?))
            } else {
                Ok(None)
            }
        };
        let (q_width, kv_width) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
        // With tensor parallelism each rank runs whole heads of its own.
        let heads = ctx.shard.split(a.heads, "attention heads")?;
        let kv_heads = ctx.shard.split(a.kv_heads, "KV heads")?;
        Ok(Self {
            q: Linear::load_column(ctx, &format!("{p}.q_proj"), q_width, a.hidden, a.qkv_bias)?,
            k: Linear::load_column(ctx, &format!("{p}.k_proj"), kv_width, a.hidden, a.qkv_bias)?,
            v: Linear::load_column(ctx, &format!("{p}.v_proj"), kv_width, a.hidden, a.qkv_bias)?,
            o: Linear::load_row(ctx, &format!("{p}.o_proj"), a.hidden, q_width, a.o_bias)?,
            q_norm: norm(ctx, "q_norm")?,
            k_norm: norm(ctx, "k_norm")?,
            rope: if use_rope {
                Some(Rope::new(a.head_dim as i32, a.rope_theta, a.rope_traditional, a.rope_scaling.as_ref())?)
            } else {
                None
            },
            heads: heads as i32,
            kv_heads: kv_heads as i32,
            scale: (a.head_dim as f64).powf(-0.5) as f32,
        })
    }

    /// `h + attention(norm(h))`: the norm and the q/k/v projections, and the
    /// output projection and the residual, are one kernel each on a GPU
    /// decode step (`fused_layers`).
    fn forward(&self, h: &Array, norm: &RmsNorm, mask: &Mask, cache: &mut CacheBox) -> Result<Array> {
        let (b, l) = (h.shape()[0], h.shape()[1]);
        let split = |t: &Array, n: i32, norm: &Option<RmsNorm>| -> Result<Array> {
            let t = t.reshape(&[b, l, n, -1])?;
            let t = match norm {
                Some(nm) => nm.forward(&t)?,
                None => t,
            };
            t.transpose_axes(&[0, 2, 1, 3])
        };
        let qkv = fused_layers::norm_linears(h, norm, &[&self.q, &self.k, &self.v])?;
        let pos = match &self.rope {
            Some(_) => Some(positions(cache)?),
            None => None,
        };
        let fused = match (&self.q_norm, &self.k_norm, &self.rope, &pos) {
            (Some(qn), Some(kn), Some(rope), Some(pos)) => {
                qk_norm_rope::fused(&qkv[0], &qkv[1], (qn, kn), rope, pos, (self.heads, self.kv_heads))?
            }
            _ => None,
        };
        let (q, k) = match fused {
            Some(qk) => qk,
            None => {
                let mut q = split(&qkv[0], self.heads, &self.q_norm)?;
                let mut k = split(&qkv[1], self.kv_heads, &self.k_norm)?;
                if let (Some(rope), Some(pos)) = (&self.rope, &pos) {
                    q = rope.apply(&q, pos)?;
                    k = rope.apply(&k, pos)?;
                }
                (q, k)
            }
        };
        let v = split(&qkv[2], self.kv_heads, &None)?;
        let out = attend(cache, &q, k, v, self.scale, mask)?;
        fused_layers::linear_add(&out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?, &self.o, h)
    }
}

struct Block {
    attn: Attention,
    mlp: Mlp,
    input_norm: RmsNorm,
    post_norm: RmsNorm,
    sliding: bool,
}

struct Model {
    plan: ModelPlan,
    embed: Embedding,
    layers: Vec<Block>,
    norm: RmsNorm,
    lm_head: LmHead,
}

impl Model {
    fn load(ctx: &mut LoadCtx, args: Args, cfg: &Config) -> Result<Self> {
        let (hidden, eps) = (args.hidden, args.rms_norm_eps);
        let embed = Embedding::load(ctx, "model.embed_tokens", args.vocab_size, hidden)?;
        let mut layers = Vec::with_capacity(args.layers);
        for i in 0..args.layers {
            let p = format!("model.layers.{i}");
            layers.push(Block {
                attn: Attention::load(ctx, &format!("{p}.self_attn"), &args, args.use_rope[i])?,
                mlp: Mlp::load(ctx, &format!("{p}.mlp"), hidden, args.intermediate, args.mlp_bias)?,
                input_norm: RmsNorm::load(ctx, &format!("{p}.input_layernorm"), hidden, eps)?,
                post_norm: RmsNorm::load(ctx, &format!("{p}.post_attention_layernorm"), hidden, eps)?,
                sliding: args.sliding[i],
            });
        }
        let norm = RmsNorm::load(ctx, "model.norm", hidden, eps)?;
        let lm_head = LmHead::load(ctx, "lm_head", args.vocab_size, hidden, args.tie_word_embeddings)?;
        let plan = args.plan(cfg);
        Ok(Self { plan, embed, layers, norm, lm_head })
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
        let mut h = self.embed.forward(&tokens)?;
        // One mask per attention kind, from the first layer of that kind (as mlx-lm).
        let masks = masks_by_kind(caches, |i| self.layers[i].sliding, l)?;
        let mut taps = Taps::new(args, self.layers.len())?;
        for (i, (block, cache)) in self.layers.iter().zip(caches.iter_mut()).enumerate() {
            let mask = masks[usize::from(block.sliding)].as_ref().expect("a mask of this kind");
            let hh = block.attn.forward(&h, &block.input_norm, mask, cache)?;
            h = block.mlp.forward_residual(&block.post_norm, &hh)?;
            taps.offer(i, &h);
        }
        let h = self.norm.forward(&h)?;
        model_kit::graph::finish(args, h, |x| self.head(x), taps)
    }
}
