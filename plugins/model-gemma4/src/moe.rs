//! Gemma 4's MoE block (`enable_moe_block`): beside the dense MLP, a router
//! (RMSNorm with `scale * hidden^-0.5`, a linear, top-k by argpartition,
//! softmax over the k picked scores, times a per-expert scale) sends each
//! token to k experts, each a gelu_approx-gated GLU run with
//! `gather_mm`/`gather_qmm` on stacked weights (model-kit's `SwitchGlu`
//! with the gelu_approx activation). The two branches are normed separately
//! and summed.

use mlx_rs::ops;
use model_kit::compiled::geglu;
use model_kit::layers::{Linear, LoadCtx, RmsNorm};
use model_kit::moe::{SwitchGlu, SwitchLinear};
use model_kit::ops::scalar;
use model_kit::{error, ops as kit_ops, Array, Result};

/// `num_experts`, `top_k_experts`, `moe_intermediate_size`.
pub struct MoeArgs {
    pub experts: usize,
    pub top_k: usize,
    pub inter: usize,
}

struct Router {
    proj: Linear,
    /// `scale * hidden^-0.5`, computed once (mlx-lm recomputes it per call,
    /// with the same op and dtype).
    norm_weight: Array,
    per_expert_scale: Array,
    top_k: i32,
    eps: f32,
}

impl Router {
    fn load(ctx: &mut LoadCtx, p: &str, hidden: usize, m: &MoeArgs, eps: f32) -> Result<Self> {
        // One score per expert: an expert index past the stacked weights
        // would read out of bounds in a gather.
        let proj = Linear::load(ctx, &format!("{p}.proj"), m.experts, hidden, false)?;
        let scale = ctx.tensor(&format!("{p}.scale"), &[hidden])?;
        let per_expert_scale = ctx.tensor(&format!("{p}.per_expert_scale"), &[m.experts])?;
        let norm_weight = scale.multiply(scalar((hidden as f64).powf(-0.5), scale.dtype())?)?;
        ctx.loaded.push(norm_weight.clone());
        ctx.loaded.push(per_expert_scale.clone());
        Ok(Self { proj, norm_weight, per_expert_scale, top_k: m.top_k as i32, eps })
    }

    /// (expert ids `[.., k]`, weights `[.., k]`).
    fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let x = mlx_rs::fast::rms_norm(x, Some(&self.norm_weight), self.eps)?;
        let scores = self.proj.forward(&x)?;
        let part = ops::argpartition_axis(&scores, -self.top_k, -1)?;
        let s = part.shape();
        let mut start = vec![0; s.len()];
        start[s.len() - 1] = s[s.len() - 1] - self.top_k;
        let inds = kit_ops::slice(&part, &start, s)?;
        let w = ops::softmax_axis(scores.take_along_axis(&inds, -1)?, -1, None)?;
        let w = w.multiply(self.per_expert_scale.take_axis(&inds, 0)?)?;
        Ok((inds, w))
    }
}

/// `SwitchGLU` with mlx-lm's `GeGLU` activation, `down(gelu_approx(gate(x))
/// * up(x))`: mlx-lm's layout (`{p}.switch_glu.{gate,up,down}_proj`), or
/// Hugging Face's fused `{p}.gate_up_proj` `[E, 2I, H]` and `{p}.down_proj`
/// (split as mlx-lm's `sanitize` does).
fn load_experts(ctx: &mut LoadCtx, p: &str, hidden: usize, m: &MoeArgs) -> Result<SwitchGlu> {
    let (e, i) = (m.experts, m.inter);
    let glu = match ctx.weights.take_opt(&format!("{p}.gate_up_proj")) {
        None => {
            let proj = |ctx: &mut LoadCtx, name: &str, out, inp| {
                SwitchLinear::load(ctx, &format!("{p}.switch_glu.{name}"), e, out, inp)
            };
            SwitchGlu::new(
                proj(ctx, "gate_proj", i, hidden)?,
                proj(ctx, "up_proj", i, hidden)?,
                proj(ctx, "down_proj", hidden, i)?,
            )
        }
        Some(fused) => {
            model_kit::shape::expect_shape(&format!("{p}.gate_up_proj"), fused.shape(), &[e, 2 * i, hidden])?;
            let down = ctx.take(&format!("{p}.down_proj"), &[e, hidden, i])?;
            let halves = fused.split_equal(2, -2)?;
            let [gate, up] =
                <[Array; 2]>::try_from(halves).map_err(|_| error(format!("{p}.gate_up_proj: cannot split in two")))?;
            let what = |n: &str| format!("{p}.switch_glu.{n}");
            SwitchGlu::new(
                SwitchLinear::from_weight(ctx, &what("gate_proj"), gate.contiguous()?, e, i, hidden)?,
                SwitchLinear::from_weight(ctx, &what("up_proj"), up.contiguous()?, e, i, hidden)?,
                SwitchLinear::from_weight(ctx, &what("down_proj"), down, e, hidden, i)?,
            )
        }
    };
    Ok(glu.with_activation(geglu))
}

/// The expert branch of a decoder layer and the extra norms it brings.
pub struct MoeBranch {
    router: Router,
    experts: SwitchGlu,
    /// `post_feedforward_layernorm_1` (on the dense MLP's output).
    dense_norm: RmsNorm,
    pre_norm: RmsNorm,
    post_norm: RmsNorm,
}

impl MoeBranch {
    /// `p` is the decoder layer's path.
    pub fn load(ctx: &mut LoadCtx, p: &str, hidden: usize, m: &MoeArgs, eps: f32) -> Result<Self> {
        Ok(Self {
            router: Router::load(ctx, &format!("{p}.router"), hidden, m, eps)?,
            experts: load_experts(ctx, &format!("{p}.experts"), hidden, m)?,
            dense_norm: RmsNorm::load(ctx, &format!("{p}.post_feedforward_layernorm_1"), hidden, eps)?,
            pre_norm: RmsNorm::load(ctx, &format!("{p}.pre_feedforward_layernorm_2"), hidden, eps)?,
            post_norm: RmsNorm::load(ctx, &format!("{p}.post_feedforward_layernorm_2"), hidden, eps)?,
        })
    }

    /// `norm1(dense) + norm2(experts(pre_norm2(h)))`, routed on the un-normed `h`.
    pub fn forward(&self, h: &Array, dense: &Array) -> Result<Array> {
        let h1 = self.dense_norm.forward(dense)?;
        let (inds, w) = self.router.route(h)?;
        let y = self.experts.forward(&self.pre_norm.forward(h)?, &inds)?;
        let h2 = w.expand_dims(-1)?.multiply(&y)?.sum_axis(-2, None)?;
        h1.add(self.post_norm.forward(&h2)?)
    }
}
