//! The sparse MLP of the MoE variant (mlx-lm `Qwen3NextSparseMoeBlock`):
//! model-kit's softmax top-k router and SwitchGLU experts, plus a shared
//! expert (a SwiGLU MLP) scaled by `sigmoid(shared_expert_gate(x))`.

use crate::args::Moe;
use model_kit::layers::{Linear, LoadCtx};
use model_kit::mlp::Mlp;
use model_kit::moe::{Router, SparseMoe, SwitchGlu, SwitchLinear};
use model_kit::ops::slice;
use model_kit::{Array, Result};
use plugin_sdk::mlx_rs::ops;

pub struct SparseMoeBlock {
    moe: SparseMoe,
    shared: Mlp,
    shared_gate: Linear,
}

impl SparseMoeBlock {
    /// `p` is the layer's `mlp` path.
    pub fn load(ctx: &mut LoadCtx, p: &str, m: &Moe, hidden: usize) -> Result<Self> {
        let router = Router::load(ctx, &format!("{p}.gate"), hidden, m.experts, m.top_k, m.norm_topk_prob)?;
        let experts = if ctx.weights.contains(&format!("{p}.experts.gate_up_proj")) {
            fused_experts(ctx, p, m, hidden)?
        } else {
            SwitchGlu::load(ctx, p, m.experts, hidden, m.inter)?
        };
        Ok(Self {
            moe: SparseMoe { router, experts },
            shared: Mlp::load(ctx, &format!("{p}.shared_expert"), hidden, m.shared_inter, false)?,
            shared_gate: Linear::load(ctx, &format!("{p}.shared_expert_gate"), 1, hidden, false)?,
        })
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = self.moe.forward(x)?;
        let shared = ops::sigmoid(self.shared_gate.forward(x)?)?.multiply(self.shared.forward(x)?)?;
        y.add(shared)
    }
}

/// Hugging Face's Qwen3.5-MoE layout (mlx-lm `qwen3_5_moe.sanitize`): one
/// `experts.gate_up_proj` `[E, 2I, D]` split in half along its rows into
/// gate and up, and `experts.down_proj` `[E, D, I]`.
fn fused_experts(ctx: &mut LoadCtx, p: &str, m: &Moe, hidden: usize) -> Result<SwitchGlu> {
    let (e, i) = (m.experts, m.inter);
    let gate_up = ctx.take(&format!("{p}.experts.gate_up_proj"), &[e, 2 * i, hidden])?;
    let down = ctx.take(&format!("{p}.experts.down_proj"), &[e, hidden, i])?;
    let s = gate_up.shape().to_vec();
    let mid = s[1] / 2;
    let gate = slice(&gate_up, &[0, 0, 0], &[s[0], mid, s[2]])?;
    let up = slice(&gate_up, &[0, mid, 0], &[s[0], s[1], s[2]])?;
    Ok(SwitchGlu::new(
        SwitchLinear::from_weight(ctx, &format!("{p}.switch_mlp.gate_proj"), gate, e, i, hidden)?,
        SwitchLinear::from_weight(ctx, &format!("{p}.switch_mlp.up_proj"), up, e, i, hidden)?,
        SwitchLinear::from_weight(ctx, &format!("{p}.switch_mlp.down_proj"), down, e, hidden, i)?,
    ))
}
