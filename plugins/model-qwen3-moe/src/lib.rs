//! Model family `model-qwen3-moe`: Qwen3-MoE (`qwen3_moe`,
//! `Qwen3MoeForCausalLM`). Qwen3 attention (q/k RMSNorm over head_dim, plain
//! RoPE) over full-attention caches; the MLP of each layer is either a sparse
//! mixture of experts (model-kit's `moe`: softmax top-k router, SwitchGLU
//! experts) or a dense SwiGLU, per `decoder_sparse_step` / `mlp_only_layers`.
//!
//! Reference: mlx-lm `models/qwen3_moe.py` and `models/switch_layers.py`
//! (the numerical oracle).

mod args;

use args::Args;
use model_kit::attention::{attend, masks_by_kind, positions, Mask};
use model_kit::checkpoint::{config_error, Checkpoint};
use model_kit::config::Config;
use model_kit::graph::{input_tokens, into_model, Family};
use model_kit::layers::{Embedding, Linear, LoadCtx, RmsNorm};
use model_kit::lm_head::LmHead;
use model_kit::mlp::Mlp;
use model_kit::moe::{Router, SparseMoe, SwitchGlu};
use model_kit::rope::Rope;
use model_kit::taps::Taps;
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
        "Qwen3-MoE: qwen3 attention, sparse mixture-of-experts MLPs",
        Claims {
            model_types: rstrings(&[args::MODEL_TYPE]),
            architectures: rstrings(&["Qwen3MoeForCausalLM"]),
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
    let cfg = Config::parse(config).map_err(config_error)?;
    let args = Args::from_config(&cfg).map_err(config_error)?;
    Ok(args.plan(&cfg))
}

fn open_model(a: &ModelOpenArgs) -> std::result::Result<ModelBox, PluginError> {
    let mut ck = Checkpoint::open(a)?;
    let args = Args::from_config(&ck.cfg).map_err(config_error)?;
    // mlx-lm's sanitize: a tied model's lm_head duplicates the embedding.
    // (Per-expert HF tensors are stacked by SwitchGlu::load.)
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
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    rope: Rope,
    heads: i32,
    kv_heads: i32,
    scale: f32,
}

impl Attention {
    fn load(ctx: &mut LoadCtx, p: &str, a: &Args) -> Result<Self> {
        let (q_width, kv_width) = (a.heads * a.head_dim, a.kv_heads * a.head_dim);
        // With tensor parallelism each rank runs whole heads of its own.
        let heads = ctx.shard.split(a.heads, "attention heads")?;
        let kv_heads = ctx.shard.split(a.kv_heads, "KV heads")?;
        Ok(Self {
            q: Linear::load_column(ctx, &format!("{p}.q_proj"), q_width, a.hidden, false)?,
            k: Linear::load_column(ctx, &format!("{p}.k_proj"), kv_width, a.hidden, false)?,
            v: Linear::load_column(ctx, &format!("{p}.v_proj"), kv_width, a.hidden, false)?,
            o: Linear::load_row(ctx, &format!("{p}.o_proj"), a.hidden, q_width, false)?,
            q_norm: RmsNorm::load(ctx, &format!("{p}.q_norm"), a.head_dim, a.rms_norm_eps)?,
            k_norm: RmsNorm::load(ctx, &format!("{p}.k_norm"), a.head_dim, a.rms_norm_eps)?,
            // qwen3_moe.py builds nn.RoPE from rope_theta alone: no scaling.
            rope: Rope::new(a.head_dim as i32, a.rope_theta, false, None)?,
            heads: heads as i32,
            kv_heads: kv_heads as i32,
            scale: (a.head_dim as f64).powf(-0.5) as f32,
        })
    }

    fn forward(&self, x: &Array, mask: &Mask, cache: &mut CacheBox) -> Result<Array> {
        let (b, l) = (x.shape()[0], x.shape()[1]);
        let heads = |t: Array, n: i32| t.reshape(&[b, l, n, -1]);
        let q = self.q_norm.forward(&heads(self.q.forward(x)?, self.heads)?)?.transpose_axes(&[0, 2, 1, 3])?;
        let k = self.k_norm.forward(&heads(self.k.forward(x)?, self.kv_heads)?)?.transpose_axes(&[0, 2, 1, 3])?;
        let v = heads(self.v.forward(x)?, self.kv_heads)?.transpose_axes(&[0, 2, 1, 3])?;
        let pos = positions(cache)?;
        let (q, k) = (self.rope.apply(&q, &pos)?, self.rope.apply(&k, &pos)?);
        let out = attend(cache, &q, k, v, self.scale, mask)?;
        self.o.forward(&out.transpose_axes(&[0, 2, 1, 3])?.reshape(&[b, l, -1])?)
    }
}

enum Ffn {
    Dense(Mlp),
    Sparse(SparseMoe),
}

impl Ffn {
    fn load(ctx: &mut LoadCtx, p: &str, a: &Args, sparse: bool) -> Result<Self> {
        if !sparse {
            return Ok(Self::Dense(Mlp::load(ctx, p, a.hidden, a.intermediate, false)?));
        }
        Ok(Self::Sparse(SparseMoe {
            router: Router::load(ctx, &format!("{p}.gate"), a.hidden, a.num_experts, a.top_k, a.norm_topk_prob)?,
            experts: SwitchGlu::load(ctx, p, a.num_experts, a.hidden, a.moe_intermediate_size)?,
        }))
    }

    fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            Self::Dense(m) => m.forward(x),
            Self::Sparse(m) => m.forward(x),
        }
    }
}

struct Block {
    attn: Attention,
    mlp: Ffn,
    input_norm: RmsNorm,
    post_norm: RmsNorm,
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
                attn: Attention::load(ctx, &format!("{p}.self_attn"), &args)?,
                mlp: Ffn::load(ctx, &format!("{p}.mlp"), &args, args.sparse[i])?,
                input_norm: RmsNorm::load(ctx, &format!("{p}.input_layernorm"), hidden, eps)?,
                post_norm: RmsNorm::load(ctx, &format!("{p}.post_attention_layernorm"), hidden, eps)?,
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
        // Every layer attends fully: one mask, asked of the first cache (as mlx-lm).
        let [mask, _] = masks_by_kind(caches, |_| false, l)?;
        let mask = mask.expect("a full-attention mask");
        let mut taps = Taps::new(args, self.layers.len())?;
        for (i, (block, cache)) in self.layers.iter().zip(caches.iter_mut()).enumerate() {
            let r = block.attn.forward(&block.input_norm.forward(&h)?, &mask, cache)?;
            let hh = h.add(&r)?;
            let r = block.mlp.forward(&block.post_norm.forward(&hh)?)?;
            h = hh.add(&r)?;
            taps.offer(i, &h);
        }
        let h = self.norm.forward(&h)?;
        model_kit::graph::finish(args, h, |x| self.head(x), taps)
    }
}
