//! The gated DeltaNet mixer (mlx-lm `qwen3_5.GatedDeltaNet` with
//! `gated_delta.py`'s ops path, the one mlx-lm runs off Metal): projections,
//! a depthwise causal conv over a window kept by the cache layout, L2-normed
//! q/k, the gated delta recurrence on a float32 state, and a gated RMSNorm
//! before the output projection. On the GPU the norms, gates and
//! recurrence of all tokens are one kernel (`delta_kernel`) and the gated
//! norm another (`gated_norm`); elsewhere they are MLX's ops, one compiled
//! step per token for the recurrence.
//!
//! Cache protocol (plugins/state-recurrent): `attention_mask(L)` first, a
//! bool `[B, L]` mask while a left-padded cohort's padding is pending (as
//! mlx-lm's `create_ssm_mask`); `update_and_fetch(qkv)` returns the conv
//! window and advances the layer; slot 1 holds the SSM state. Inside a
//! speculative round the layout may ask for the state after each position
//! too (`wants_position_states`), so that a rollback needs no replay.

use crate::args::Linear as Geometry;
use crate::delta_kernel::{self, Gates};
use crate::gated_norm;
use crate::options::Options;
use crate::recurrence::{QkNorm, Recurrence};
use model_kit::compiled::{self, silu, Compiled};
use model_kit::depthwise_conv::DepthwiseConv;
use model_kit::fused_layers;
use model_kit::layers::{Linear, LoadCtx, RmsNorm};
use model_kit::ops::{on_gpu, scalar, slice, zeros};
use model_kit::shape::expect_shape;
use model_kit::{error, Array, Dtype, Result};
use plugin_api::abi_stable::std_types::ROption;
use plugin_api::{CacheBox, MaskMode};
use plugin_sdk::mlx_rs::ops;
use plugin_sdk::{into_array, into_tensor, mlx_rs};
use std::sync::OnceLock;

/// The SSM state's slot in the recurrent layout.
const SSM_SLOT: u32 = 1;

pub struct DeltaNet {
    in_qkv: Linear,
    in_z: Linear,
    in_b: Linear,
    in_a: Linear,
    /// `in_b` and `in_a` stacked, for the fused decode kernel (dense
    /// weights only).
    in_ba: Option<Linear>,
    /// Depthwise conv over `[conv_dim, K, 1]` weights (MLX's layout).
    conv: DepthwiseConv,
    dt_bias: Array,
    /// Kept in float32 whatever the compute dtype (mlx-lm's `cast_predicate`).
    a_log: Array,
    norm: Array,
    eps: f32,
    out: Linear,
    g: Geometry,
    /// Whether a GPU runs the recurrence through `delta_kernel` (the
    /// family's `delta` model option).
    kernel: bool,
    /// Whether a layout that asks gets the states after each position
    /// (the `rollback` model option).
    position_states: bool,
}

fn boundary<T>(r: plugin_api::PResult<T>) -> Result<T> {
    r.into_result().map_err(|e| error(format!("cache layout: {e}")))
}

impl DeltaNet {
    /// `conv` is the layer's conv1d weight, already in MLX's layout;
    /// `hidden` the model width; `options` the family's own.
    pub fn load(
        ctx: &mut LoadCtx,
        p: &str,
        g: Geometry,
        hidden: usize,
        eps: f32,
        conv: Array,
        options: Options,
    ) -> Result<Self> {
        expect_shape(&format!("{p}.conv1d.weight"), conv.shape(), &[g.conv_dim(), g.conv_kernel, 1])?;
        let conv = DepthwiseConv::new(ctx.cast(conv)?)?;
        let a_log = ctx.take(&format!("{p}.A_log"), &[g.v_heads])?;
        let dt_bias = ctx.tensor(&format!("{p}.dt_bias"), &[g.v_heads])?;
        let norm = ctx.tensor(&format!("{p}.norm.weight"), &[g.v_dim])?;
        ctx.loaded.extend(conv.params());
        ctx.loaded.extend([a_log.clone(), dt_bias.clone(), norm.clone()]);
        let proj = |ctx: &mut LoadCtx, name: &str, out: usize, inp: usize| {
            Linear::load(ctx, &format!("{p}.{name}"), out, inp, false)
        };
        let in_b = proj(ctx, "in_proj_b", g.v_heads, hidden)?;
        let in_a = proj(ctx, "in_proj_a", g.v_heads, hidden)?;
        let in_ba = Linear::stacked(ctx, &in_b, &in_a)?;
        Ok(Self {
            in_qkv: proj(ctx, "in_proj_qkv", g.conv_dim(), hidden)?,
            in_z: proj(ctx, "in_proj_z", g.value_dim(), hidden)?,
            in_b,
            in_a,
            in_ba,
            conv,
            dt_bias,
            a_log,
            norm,
            eps,
            out: proj(ctx, "out_proj", hidden, g.value_dim())?,
            g,
            kernel: options.kernel,
            position_states: options.position_states,
        })
    }

    /// `x + mixer(norm(x))`, the mixer half of a pre-norm block: on a GPU
    /// decode step or short verify, the norm and the four input projections
    /// as one fused kernel (`in_ba` for the two narrow ones) and the output
    /// projection with the residual as another (`fused_layers`), else the
    /// separate ops.
    pub fn forward_residual(&self, x: &Array, norm: &RmsNorm, cache: &mut CacheBox) -> Result<Array> {
        let fused = match &self.in_ba {
            Some(ba) => fused_layers::fused_norm_linears(x, norm, &[&self.in_qkv, &self.in_z, ba])?,
            None => None,
        };
        let [qkv, z, beta_in, a] = match fused {
            Some(p) => {
                let ba = p[2].split_at_indices(&[self.in_b.outputs()], -1)?;
                [p[0].clone(), p[1].clone(), ba[0].clone(), ba[1].clone()]
            }
            None => {
                let n = norm.forward(x)?;
                [self.in_qkv.forward(&n)?, self.in_z.forward(&n)?, self.in_b.forward(&n)?, self.in_a.forward(&n)?]
            }
        };
        let y = self.mix(qkv, z, beta_in, a, cache)?;
        fused_layers::linear_add(&y, &self.out, x)
    }

    /// The mixer from its input projections, up to the output projection:
    /// `[B, S, value_dim]`.
    fn mix(&self, qkv: Array, z: Array, beta_in: Array, a: Array, cache: &mut CacheBox) -> Result<Array> {
        let (b, s) = (qkv.shape()[0], qkv.shape()[1]);
        let g = &self.g;
        let z = z.reshape(&[b, s, g.v_heads as i32, g.v_dim as i32])?;
        let mask = padding_mask(cache, b, s)?;
        // Padded columns enter the conv as zeros, as the zeros before a
        // row's first input do when it runs alone.
        let qkv = match &mask {
            Some(m) => ops::select(&m.expand_dims(-1)?, &qkv, scalar(0.0, qkv.dtype())?)?,
            None => qkv,
        };
        // The layout ignores `values`; it returns the window as both.
        let window = into_array(boundary(cache.update_and_fetch(into_tensor(qkv.clone()), into_tensor(qkv)))?.keys);
        let (kh, vh) = ((g.k_heads as i32, g.k_dim as i32), (g.v_heads as i32, g.v_dim as i32));
        let [q, k, v] = self.conv.forward_silu_heads(&window, [kh, kh, vh])?;
        let state = match boundary(cache.get_slot(SSM_SLOT))? {
            ROption::RSome(t) => into_array(t),
            ROption::RNone => zeros(&[b, g.v_heads as i32, g.v_dim as i32, g.k_dim as i32], Dtype::Float32)?,
        };
        let every = self.position_states && cache.wants_position_states();
        let gpu = self.kernel && on_gpu();
        let on_kernel = if gpu {
            let gates = Gates { b: &beta_in, a: &a, a_log: &self.a_log, dt_bias: &self.dt_bias };
            delta_kernel::core((&q, &k, &v), &gates, &state, mask.as_ref(), every)?
        } else {
            None
        };
        let Recurrence { y, state, states } = match on_kernel {
            Some(done) => done,
            None => {
                let (q, k) = normalize_qk(&q, &k, &QkNorm::of(g.k_dim))?;
                let beta = ops::sigmoid(&beta_in)?;
                let decay = compute_g(&self.a_log, &a, &self.dt_bias)?;
                let (q, k) = repeat_heads(&q, &k, g.v_heads / g.k_heads)?;
                recurrence(&q, &k, &v, &decay, &beta, state, mask.as_ref(), every)?
            }
        };
        boundary(cache.set_slot(SSM_SLOT, into_tensor(state)))?;
        if let Some(states) = states {
            boundary(cache.set_position_states(SSM_SLOT, into_tensor(states)))?;
        }
        match gpu.then(|| gated_norm::fused(&y, &z, &self.norm, self.eps)).transpose()?.flatten() {
            Some(out) => Ok(out),
            None => self.gated_norm(&y, &z)?.reshape(&[b, s, -1]),
        }
    }

    /// `Qwen3NextRMSNormGated` with a gate: `rms_norm(y)` times `silu(z)`,
    /// both in float32 (`precise_swiglu`), back in `y`'s dtype.
    fn gated_norm(&self, y: &Array, z: &Array) -> Result<Array> {
        let normed = mlx_rs::fast::rms_norm(y, Some(&self.norm), self.eps)?;
        let gate = silu(&z.as_dtype(Dtype::Float32)?)?;
        gate.multiply(normed.as_dtype(Dtype::Float32)?)?.as_dtype(y.dtype())
    }
}

/// The layout's `[B, L]` padding mask (true = real column), or None.
fn padding_mask(cache: &CacheBox, b: i32, l: i32) -> Result<Option<Array>> {
    let m = boundary(cache.attention_mask(l as u32))?;
    match (m.mode, m.array) {
        (MaskMode::NONE, _) => Ok(None),
        (MaskMode::ARRAY, ROption::RSome(t)) => {
            let m = into_array(t);
            if m.shape() != [b, l] || m.dtype() != Dtype::Bool {
                return Err(error(format!(
                    "recurrent layout gave a {:?} {:?} mask, expected bool [{b}, {l}]",
                    m.dtype(),
                    m.shape()
                )));
            }
            Ok(Some(m))
        }
        (mode, _) => Err(error(format!("recurrent layout gave mask mode {} for a DeltaNet layer", mode.0))),
    }
}

/// mlx-lm's `normalize_qk`: RMS norms, then each scale as a scalar of q's
/// and k's dtype.
fn normalize_qk(q: &Array, k: &Array, n: &QkNorm) -> Result<(Array, Array)> {
    let q = scalar(n.q_scale, q.dtype())?.multiply(mlx_rs::fast::rms_norm(q, None, n.eps)?)?;
    let k = scalar(n.k_scale, k.dtype())?.multiply(mlx_rs::fast::rms_norm(k, None, n.eps)?)?;
    Ok((q, k))
}

/// `compute_g`: the per-token decay `exp(-exp(A_log) * softplus(a + dt_bias))`,
/// float32 (A_log is), with softplus = `logaddexp(x, 0)`. One fused kernel,
/// as mlx-lm compiles it.
fn compute_g(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<Array> {
    static F: OnceLock<Compiled> = OnceLock::new();
    compiled::cached(&F, |x| Ok(vec![compute_g_ops(&x[0], &x[1], &x[2])?]))?.call1(&[a_log, a, dt_bias])
}

fn compute_g_ops(a_log: &Array, a: &Array, dt_bias: &Array) -> Result<Array> {
    let x = a.add(dt_bias)?;
    let softplus = ops::logaddexp(&x, scalar(0.0, x.dtype())?)?;
    let rate = ops::negative(ops::exp(a_log.as_dtype(Dtype::Float32)?)?)?;
    ops::exp(rate.multiply(softplus)?)
}

/// `gated_delta_ops`' first step: q/k repeated to the value heads.
fn repeat_heads(q: &Array, k: &Array, repeat: usize) -> Result<(Array, Array)> {
    if repeat > 1 {
        Ok((
            Array::repeat_axis::<f32>(q.clone(), repeat as i32, -2)?,
            Array::repeat_axis::<f32>(k.clone(), repeat as i32, -2)?,
        ))
    } else {
        Ok((q.clone(), k.clone()))
    }
}

/// `gated_delta_ops` after `repeat_heads`: one step per token. With a
/// padding `mask` `[B, T]`, a padded step keeps its row's state. `every`
/// keeps the state after each token too.
#[allow(clippy::too_many_arguments)]
fn recurrence(
    q: &Array,
    k: &Array,
    v: &Array,
    g: &Array,
    beta: &Array,
    mut state: Array,
    mask: Option<&Array>,
    every: bool,
) -> Result<Recurrence> {
    let t_len = q.shape()[1];
    let mut ys = Vec::with_capacity(t_len as usize);
    let mut states = Vec::with_capacity(if every { t_len as usize } else { 0 });
    for t in 0..t_len {
        let at = |a: &Array| token(a, t);
        let (y, next) = step(&at(q)?, &at(k)?, &at(v)?, &at(g)?, &at(beta)?, &state)?;
        ys.push(y);
        state = match mask {
            // `where(mask[:, t, None, None, None], state, old_state)`.
            Some(m) => ops::select(&at(m)?.expand_dims_axes(&[1, 2, 3])?, &next, &state)?,
            None => next,
        };
        if every {
            states.push(state.clone());
        }
    }
    let states = if every { Some(ops::stack(&states, 1)?) } else { None };
    Ok(Recurrence { y: ops::stack(&ys, 1)?, state, states })
}

/// `a[:, t]`.
fn token(a: &Array, t: i32) -> Result<Array> {
    let s = a.shape();
    let mut start = vec![0; s.len()];
    let mut stop = s.to_vec();
    start[1] = t;
    stop[1] = t + 1;
    let one = slice(a, &start, &stop)?;
    let mut shape = s.to_vec();
    shape.remove(1);
    one.reshape(&shape)
}

/// One token of the recurrence, compiled: the prefill runs it once per token
/// and layer, and as separate ops each step is about ten kernel launches;
/// compiled, the elementwise runs between its two reductions fuse.
fn step(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> Result<(Array, Array)> {
    static F: OnceLock<Compiled> = OnceLock::new();
    let body = |a: &[Array]| {
        let (y, state) = step_ops(&a[0], &a[1], &a[2], &a[3], &a[4], &a[5])?;
        Ok(vec![y, state])
    };
    let mut out = compiled::cached(&F, body)?.call(&[q, k, v, g, beta, state])?;
    match (out.pop(), out.pop()) {
        (Some(state), Some(y)) => Ok((y, state)),
        _ => Err(error("the compiled delta step returned too few arrays")),
    }
}

/// `_gated_delta_step_ops` with a scalar gate per head: decay the state,
/// read what it predicts for k, write the beta-weighted error back along k,
/// read the output along q.
fn step_ops(q: &Array, k: &Array, v: &Array, g: &Array, beta: &Array, state: &Array) -> Result<(Array, Array)> {
    let decay = g.expand_dims_axes(&[-1, -2])?;
    let state = state.multiply(&decay)?;
    let k_row = k.expand_dims(-2)?;
    let kv_mem = state.multiply(&k_row)?.sum_axis(-1, None)?;
    let delta = v.subtract(&kv_mem)?.multiply(beta.expand_dims(-1)?)?;
    let state = state.add(k_row.multiply(delta.expand_dims(-1)?)?)?;
    let y = state.multiply(q.expand_dims(-2)?)?.sum_axis(-1, None)?;
    Ok((y.as_dtype(q.dtype())?, state))
}
