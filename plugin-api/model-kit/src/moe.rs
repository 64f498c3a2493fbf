//! Mixture of experts as mlx-lm computes it (`models/switch_layers.py` and
//! the Qwen MoE blocks): a router picks `k` experts per token, each picked
//! expert's gated MLP (SwiGLU, or another gate activation) runs through
//! `gather_mm` / `gather_qmm` on stacked expert weights, and the outputs
//! are mixed by the router's scores.
//!
//! A sparse block is three calls, and a family adds what it needs around
//! them (Qwen3-Next / Qwen3.5 add `sigmoid(shared_expert_gate(x)) *
//! shared_expert(x)` to the result with model-kit's `Mlp` and `Linear`):
//!
//! ```ignore
//! let (inds, scores) = router.route(&x)?;        // [.., k] each
//! let y = experts.forward(&x, &inds)?;           // [.., k, D]
//! let y = combine(&y, &scores)?;                 // [.., D]
//! ```
//!
//! [`SparseMoe`] is exactly that (Qwen3-MoE's `Qwen3MoeSparseMoeBlock`).
//!
//! Checkpoints: mlx-lm folders store each projection's experts stacked,
//! `{mlp}.switch_mlp.{gate,up,down}_proj.weight` `[E, out, in]` (affine
//! quantized ones add `.scales`/`.biases`); Hugging Face folders store one
//! tensor per expert, `{mlp}.experts.{e}.{gate,up,down}_proj.weight`, which
//! are stacked at load as mlx-lm's `sanitize` does. Expert counts and sizes
//! are checked against the config before MLX sees an index: a gather with an
//! expert index past the stacked weights would read out of bounds.
//!
//! Tensor parallelism (model-kit's `shard`) splits each expert's matrices,
//! as mlx-lm's sharded MoE models do: every rank holds every expert, with
//! `inter / ranks` of its channels (gate/up by output, down by input), and
//! `SwitchGlu::forward` sums the experts' outputs over the ranks. Splitting
//! the experts themselves across ranks would leave a rank idle whenever the
//! router picks none of its experts, and its balance would depend on the
//! routing; split matrices keep every rank's work equal at every step.

use crate::layers::{Linear, LoadCtx, Quantized};
use crate::{error, Array, Result};
use mlx_rs::ops;

/// mlx-lm sorts the (token, expert) pairs by expert when there are at least
/// this many (`indices.size >= 64` in `SwitchGLU`), so each expert's rows are
/// contiguous; the gathers then run with `sorted_indices`. Mirrored because
/// the sorted kernels accumulate in another order.
pub const SORT_THRESHOLD: usize = 64;

/// `SwitchLinear` / `QuantizedSwitchLinear` without bias: one linear per
/// expert, weights stacked `[E, out, in]`, applied to the experts in
/// `indices`.
pub struct SwitchLinear {
    weight: Array,
    quant: Option<Quantized>,
}

impl SwitchLinear {
    /// This rank's part along `axis` (1: output features, 2: input
    /// features) of every expert, in buffers of its own (`Shard::take`).
    fn sharded(self, shard: &crate::shard::Shard, axis: usize, what: &str) -> Result<Self> {
        if shard.size() == 1 {
            return Ok(self);
        }
        let quant = match self.quant {
            Some(q) => {
                let groups = q.scales.shape()[axis] as usize;
                shard.split(groups, &format!("quantization groups of `{what}`"))?;
                Some(Quantized {
                    scales: shard.take(&q.scales, axis)?,
                    biases: shard.take(&q.biases, axis)?,
                    params: q.params,
                })
            }
            None => None,
        };
        Ok(Self { weight: shard.take(&self.weight, axis)?, quant })
    }

    /// Loads `{path}.weight` (+ `.scales`/`.biases` when quantized) and checks
    /// it holds `experts` matrices of `[out, inp]`.
    pub fn load(ctx: &mut LoadCtx, path: &str, experts: usize, out: usize, inp: usize) -> Result<Self> {
        let (weight, quant) = ctx.weight(path, &[experts, out, inp])?;
        let layer = match quant {
            // A compute dtype was asked for: run dense, as `Linear` does.
            Some(q) if ctx.dtype.is_some() => Self { weight: ctx.cast(q.dequantize(&weight)?)?, quant: None },
            Some(q) => Self { weight, quant: Some(q) },
            None => Self { weight: ctx.cast(weight)?, quant: None },
        };
        layer.record(ctx);
        Ok(layer)
    }

    /// A dense layer from an already stacked float weight `[E, out, in]`
    /// (e.g. split from a fused `gate_up_proj`), cast to the compute dtype.
    pub fn from_weight(
        ctx: &mut LoadCtx,
        what: &str,
        weight: Array,
        experts: usize,
        out: usize,
        inp: usize,
    ) -> Result<Self> {
        let layer = Self { weight: ctx.cast(weight)?, quant: None };
        layer.check(what, experts, out, inp)?;
        layer.record(ctx);
        Ok(layer)
    }

    fn check(&self, what: &str, experts: usize, out: usize, inp: usize) -> Result<()> {
        crate::shape::expect_shape(&format!("{what}.weight"), self.weight.shape(), &[experts, out, inp])
    }

    fn record(&self, ctx: &mut LoadCtx) {
        ctx.loaded.push(self.weight.clone());
        if let Some(q) = &self.quant {
            ctx.loaded.push(q.scales.clone());
            ctx.loaded.push(q.biases.clone());
        }
    }

    /// `x` `[.., 1, in]` broadcast against `indices` (or `[N, 1, in]` with
    /// `N` sorted indices) → `[.., 1, out]`.
    pub fn forward(&self, x: &Array, indices: &Array, sorted: bool) -> Result<Array> {
        match &self.quant {
            Some(q) => ops::gather_qmm(
                x,
                &self.weight,
                &q.scales,
                &q.biases,
                None::<&Array>,
                indices,
                true,
                q.params.group_size,
                q.params.bits,
                sorted,
            ),
            None => ops::gather_mm(x, self.weight.swap_axes(-1, -2)?, None::<&Array>, indices, sorted),
        }
    }
}

/// A gated expert's combination of its two projections, `act(gate) * up`
/// (fused: `compiled::swiglu`, `compiled::geglu`).
pub type Activation = fn(&Array, &Array) -> Result<Array>;

/// `SwitchGLU`: per token and picked expert, `down(act(gate(x)) * up(x))`,
/// SwiGLU (`act` = silu) unless a family asks for another activation
/// (Gemma 4's experts are GeGLU).
pub struct SwitchGlu {
    gate: SwitchLinear,
    up: SwitchLinear,
    down: SwitchLinear,
    act: Activation,
    /// Tensor-parallel: the ranks each expert's output is summed over.
    reduce: Option<crate::shard::Shard>,
}

impl SwitchGlu {
    /// SwiGLU experts.
    pub fn new(gate: SwitchLinear, up: SwitchLinear, down: SwitchLinear) -> Self {
        Self { gate, up, down, act: crate::compiled::swiglu, reduce: None }
    }

    /// The same experts gated by `act` instead of silu.
    pub fn with_activation(self, act: Activation) -> Self {
        Self { act, ..self }
    }

    /// The experts of the MLP at `mlp` (e.g. `model.layers.3.mlp`): stacked
    /// `{mlp}.switch_mlp.*` tensors, or per-expert `{mlp}.experts.{e}.*`
    /// ones (stacked here). `hidden` is the model width, `inter` each
    /// expert's intermediate size.
    /// With `ctx.shard` over several ranks, each rank keeps `inter / ranks`
    /// channels of every expert (module docs).
    pub fn load(ctx: &mut LoadCtx, mlp: &str, experts: usize, hidden: usize, inter: usize) -> Result<Self> {
        let shard = ctx.shard.clone();
        shard.split(inter, "expert channels")?;
        let mark = ctx.loaded.len();
        let mut proj = |name: &str, out: usize, inp: usize| -> Result<SwitchLinear> {
            let stacked = format!("{mlp}.switch_mlp.{name}");
            if ctx.weights.contains(&format!("{stacked}.weight"))
                || !ctx.weights.contains(&format!("{mlp}.experts.0.{name}.weight"))
            {
                return SwitchLinear::load(ctx, &stacked, experts, out, inp);
            }
            let parts = (0..experts)
                .map(|e| ctx.take(&format!("{mlp}.experts.{e}.{name}.weight"), &[out, inp]))
                .collect::<Result<Vec<_>>>()?;
            SwitchLinear::from_weight(ctx, &stacked, ops::stack(&parts, 0)?, experts, out, inp)
        };
        let (gate, up, down) =
            (proj("gate_proj", inter, hidden)?, proj("up_proj", inter, hidden)?, proj("down_proj", hidden, inter)?);
        if shard.size() == 1 {
            return Ok(Self::new(gate, up, down));
        }
        // The whole stacks are not kept: the slices are recorded instead.
        ctx.loaded.truncate(mark);
        let glu = Self {
            gate: gate.sharded(&shard, 1, &format!("{mlp} gate_proj"))?,
            up: up.sharded(&shard, 1, &format!("{mlp} up_proj"))?,
            down: down.sharded(&shard, 2, &format!("{mlp} down_proj"))?,
            act: crate::compiled::swiglu,
            reduce: Some(shard),
        };
        for l in [&glu.gate, &glu.up, &glu.down] {
            l.record(ctx);
        }
        Ok(glu)
    }

    /// `x` `[.., D]` and the picked experts `indices` `[.., k]` → `[.., k, D]`.
    pub fn forward(&self, x: &Array, indices: &Array) -> Result<Array> {
        let x = x.expand_dims_axes(&[-2, -3])?;
        let sorted = indices.size() >= SORT_THRESHOLD;
        let (x, idx, inv) = if sorted {
            let (x, idx, inv) = gather_sort(&x, indices)?;
            (x, idx, Some(inv))
        } else {
            (x, indices.clone(), None)
        };
        let up = self.up.forward(&x, &idx, sorted)?;
        let gate = self.gate.forward(&x, &idx, sorted)?;
        let act = (self.act)(&gate, &up)?;
        let y = self.down.forward(&act, &idx, sorted)?;
        let y = match inv {
            Some(inv) => ops::unflatten(y.take_axis(&inv, 0)?, 0, indices.shape())?,
            None => y,
        };
        let y = y.squeeze_axes(&[-2])?;
        match &self.reduce {
            Some(shard) => shard.all_sum(&y),
            None => Ok(y),
        }
    }
}

/// `_gather_sort`: the (token, expert) pairs in expert order. Returns the
/// token rows `[N*k, 1, D]`, the sorted expert ids `[N*k]` and the inverse
/// permutation that restores the original order.
fn gather_sort(x: &Array, indices: &Array) -> Result<(Array, Array, Array)> {
    let k = *indices.shape().last().ok_or_else(|| error("moe: indices must have an experts axis"))?;
    let flat = indices.flatten(None, None)?;
    let order = ops::argsort_axis(&flat, -1)?;
    let inv = ops::argsort_axis(&order, -1)?;
    // `order // k` with order's own dtype (uint32), as Python's weak scalar.
    let rows = order.floor_divide(Array::from_slice(&[k as u32], &[]))?;
    Ok((x.flatten(0, -3)?.take_axis(&rows, 0)?, flat.take_axis(&order, 0)?, inv))
}

/// The softmax top-k router of the Qwen MoE blocks: `gate` (a linear to one
/// logit per expert), `softmax(precise)` over experts, the `k` largest by
/// `argpartition`, and their probabilities, renormalised to sum to 1 when
/// `norm_topk_prob`.
pub struct Router {
    gate: Linear,
    top_k: i32,
    norm_topk_prob: bool,
}

impl Router {
    /// Loads `{path}` (Qwen: `{mlp}.gate`), which must map `hidden` inputs
    /// to one logit per expert (an index past the experts would reach a
    /// gather); `top_k` must not exceed `experts`.
    pub fn load(
        ctx: &mut LoadCtx,
        path: &str,
        hidden: usize,
        experts: usize,
        top_k: usize,
        norm_topk_prob: bool,
    ) -> Result<Self> {
        if top_k > experts {
            return Err(error(format!("num_experts_per_tok {top_k} exceeds num_experts {experts}")));
        }
        let gate = Linear::load(ctx, path, experts, hidden, false)?;
        Ok(Self { gate, top_k: top_k as i32, norm_topk_prob })
    }

    /// `x` `[.., D]` → (expert ids `[.., k]` uint32, scores `[.., k]` in the
    /// gate's output dtype).
    pub fn route(&self, x: &Array) -> Result<(Array, Array)> {
        let gates = ops::softmax_axis(self.gate.forward(x)?, -1, true)?;
        let k = self.top_k;
        let part = ops::argpartition_axis(&gates, -k, -1)?;
        let s = part.shape();
        let mut start = vec![0; s.len()];
        start[s.len() - 1] = s[s.len() - 1] - k;
        let inds = crate::ops::slice(&part, &start, s)?;
        let mut scores = gates.take_along_axis(&inds, -1)?;
        if self.norm_topk_prob {
            scores = scores.divide(scores.sum_axis(-1, true)?)?;
        }
        Ok((inds, scores))
    }
}

/// Mixes the experts' outputs `y` `[.., k, D]` by their `scores` `[.., k]`:
/// `(y * scores[..., None]).sum(-2)`, kept in `y`'s dtype.
pub fn combine(y: &Array, scores: &Array) -> Result<Array> {
    y.multiply(scores.expand_dims(-1)?)?.sum_axis(-2, None)?.as_dtype(y.dtype())
}

/// A sparse MoE MLP: route, run the picked experts, mix
/// (`Qwen3MoeSparseMoeBlock`).
pub struct SparseMoe {
    pub router: Router,
    pub experts: SwitchGlu,
}

impl SparseMoe {
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (inds, scores) = self.router.route(x)?;
        let y = self.experts.forward(x, &inds)?;
        combine(&y, &scores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::random;

    fn normal(shape: &[i32], seed: u64) -> Array {
        random::normal::<f32>(shape, None, 0.5, &random::key(seed).unwrap()).unwrap()
    }

    fn dense(shape: &[i32], seed: u64) -> SwitchLinear {
        SwitchLinear { weight: normal(shape, seed), quant: None }
    }

    fn values(a: &Array) -> Vec<f32> {
        a.eval().unwrap();
        a.as_slice::<f32>().to_vec()
    }

    fn close(a: &[f32], b: &[f32]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= 1e-4 + 1e-4 * y.abs())
    }

    /// 8 experts of width 16 over a model width of 8; 40 tokens, top 2.
    fn fixture() -> (SwitchGlu, Array, Array) {
        let glu = SwitchGlu::new(dense(&[8, 16, 8], 1), dense(&[8, 16, 8], 2), dense(&[8, 8, 16], 3));
        let x = normal(&[1, 40, 8], 4);
        let inds = random::randint::<_, i32>(0, 8, &[1, 40, 2][..], &random::key(5).unwrap())
            .unwrap()
            .as_dtype(mlx_rs::Dtype::Uint32)
            .unwrap();
        (glu, x, inds)
    }

    #[test]
    fn sorted_pairs_come_back_in_token_order() {
        let (glu, x, inds) = fixture();
        assert!(inds.size() >= SORT_THRESHOLD);
        let all = values(&glu.forward(&x, &inds).unwrap());
        // Token by token: 2 pairs each, below the threshold, never sorted.
        let mut one_by_one = Vec::new();
        for t in 0..40 {
            let xt = crate::ops::slice(&x, &[0, t, 0], &[1, t + 1, 8]).unwrap();
            let it = crate::ops::slice(&inds, &[0, t, 0], &[1, t + 1, 2]).unwrap();
            one_by_one.extend(values(&glu.forward(&xt, &it).unwrap()));
        }
        assert!(close(&all, &one_by_one));
    }

    /// Pair (17, 1) of the fixture computed by hand with `act` on gate and up.
    fn one_pair_by_hand(glu: &SwitchGlu, x: &Array, inds: &Array, act: Activation) {
        let y = glu.forward(x, inds).unwrap();
        assert_eq!(y.shape(), [1, 40, 2, 8]);
        inds.eval().unwrap();
        let ids = inds.as_slice::<u32>().to_vec();
        let (t, j) = (17, 1);
        let e = Array::from_int(ids[t * 2 + j] as i32);
        let w = |l: &SwitchLinear| l.weight.take_axis(&e, 0).unwrap();
        let xt = crate::ops::slice(x, &[0, t as i32, 0], &[1, t as i32 + 1, 8]).unwrap().reshape(&[1, 8]).unwrap();
        let g = xt.matmul(w(&glu.gate).transpose_axes(&[1, 0]).unwrap()).unwrap();
        let u = xt.matmul(w(&glu.up).transpose_axes(&[1, 0]).unwrap()).unwrap();
        let h = act(&g, &u).unwrap();
        let want = h.matmul(w(&glu.down).transpose_axes(&[1, 0]).unwrap()).unwrap();
        let got = crate::ops::slice(&y, &[0, t as i32, j as i32, 0], &[1, t as i32 + 1, j as i32 + 1, 8]).unwrap();
        assert!(close(&values(&got), &values(&want)));
    }

    #[test]
    fn each_pair_runs_its_own_expert() {
        let (glu, x, inds) = fixture();
        one_pair_by_hand(&glu, &x, &inds, |g, u| g.multiply(ops::sigmoid(g)?)?.multiply(u));
    }

    #[test]
    fn the_gate_activation_is_a_parameter() {
        let (glu, x, inds) = fixture();
        let act: Activation = |g, u| ops::tanh(g)?.multiply(u);
        let glu = glu.with_activation(act);
        one_pair_by_hand(&glu, &x, &inds, act);
        // Sorted and unsorted paths apply it alike.
        let all = values(&glu.forward(&x, &inds).unwrap());
        let first = crate::ops::slice(&x, &[0, 0, 0], &[1, 1, 8]).unwrap();
        let first_inds = crate::ops::slice(&inds, &[0, 0, 0], &[1, 1, 2]).unwrap();
        assert!(close(&all[..16], &values(&glu.forward(&first, &first_inds).unwrap())));
    }

    #[test]
    fn combine_weights_each_expert_by_its_score() {
        let y = Array::from_slice(&[1.0f32, 2.0, 10.0, 20.0], &[1, 2, 2]);
        let scores = Array::from_slice(&[0.25f32, 0.75], &[1, 2]);
        assert_eq!(values(&combine(&y, &scores).unwrap()), [7.75, 15.5]);
    }

    #[test]
    fn expert_weights_must_match_the_config() {
        let l = dense(&[4, 16, 8], 1);
        assert!(l.check("w", 4, 16, 8).is_ok());
        let e = l.check("w", 8, 16, 8).unwrap_err();
        assert!(e.what().contains("[4, 16, 8]") && e.what().contains("[8, 16, 8]"), "{}", e.what());
    }
}
