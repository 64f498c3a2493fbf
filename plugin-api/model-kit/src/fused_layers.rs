//! Layer sequences of a decode step that run as one kernel each on a GPU
//! (`gemv`): a norm and the projections it feeds, a projection and the
//! residual it is added to. Elsewhere (the CPU, prompts, quantized or
//! biased or sharded weights, the `gemv=mlx` route) they are the separate
//! ops, as mlx-lm runs them.

use crate::gemv::{self, Fusion};
use crate::layers::{Linear, RmsNorm};
use crate::{ops, routes, Array, Result};

/// The rows of `x` when the fused route may take it against weights of
/// `outs` rows, each of `weights` dense.
fn fused_rows(x: &Array, weights: &[Option<&Array>]) -> Option<i32> {
    if !routes::current().fused_gemv || weights.iter().any(Option::is_none) || !ops::on_gpu() {
        return None;
    }
    let s = x.shape();
    let m: i32 = s[..s.len() - 1].iter().product();
    let outs: Vec<i32> = weights.iter().flatten().map(|w| w.shape()[0]).collect();
    let same_k = weights.iter().flatten().all(|w| w.shape()[1] == s[s.len() - 1] && w.dtype() == x.dtype());
    (same_k && gemv::fits(x, m, &outs)).then_some(m)
}

/// `[l(norm(x)) for l in linears]` (1 to 3 of them).
pub fn norm_linears(x: &Array, norm: &RmsNorm, linears: &[&Linear]) -> Result<Vec<Array>> {
    if let Some(out) = fused_norm_linears(x, norm, linears)? {
        return Ok(out);
    }
    let xn = norm.forward(x)?;
    linears.iter().map(|l| l.forward(&xn)).collect()
}

/// `norm_linears` as one kernel, or `None` where the fused route does not
/// take it (the caller runs the separate ops, perhaps over other layers).
pub fn fused_norm_linears(x: &Array, norm: &RmsNorm, linears: &[&Linear]) -> Result<Option<Vec<Array>>> {
    let weights: Vec<Option<&Array>> = linears.iter().map(|l| l.dense_weight()).collect();
    match fused_rows(x, &weights) {
        Some(m) => {
            let w: Vec<&Array> = weights.into_iter().flatten().collect();
            gemv::apply(Fusion::NormThen(w.len()), x, m, Some(norm.parts()), &w, None).map(Some)
        }
        None => Ok(None),
    }
}

/// `residual + linear(x)`.
pub fn linear_add(x: &Array, linear: &Linear, residual: &Array) -> Result<Array> {
    let w = linear.dense_weight();
    if let Some(m) = fused_rows(x, &[w]) {
        if residual.dtype() == x.dtype() {
            let out = gemv::apply(Fusion::ThenAdd, x, m, None, &[w.expect("checked dense")], Some(residual))?;
            return Ok(out.into_iter().next().expect("one output"));
        }
    }
    residual.add(&linear.forward(x)?)
}

/// `swiglu(gate(norm(x)), up(norm(x)))` as one kernel, or `None` where the
/// fused route does not take it (the caller runs the separate ops).
pub fn norm_swiglu(x: &Array, norm: &RmsNorm, gate: &Linear, up: &Linear) -> Result<Option<Array>> {
    let (g, u) = (gate.dense_weight(), up.dense_weight());
    match fused_rows(x, &[g, u]) {
        Some(m) => {
            let w = [g.expect("checked dense"), u.expect("checked dense")];
            Ok(gemv::apply(Fusion::NormSwiGlu, x, m, Some(norm.parts()), &w, None)?.into_iter().next())
        }
        None => Ok(None),
    }
}

/// `linear(x)` (an LM head).
pub fn linear(x: &Array, linear: &Linear) -> Result<Array> {
    let w = linear.dense_weight();
    if let Some(m) = fused_rows(x, &[w]) {
        let out = gemv::apply(Fusion::Plain, x, m, None, &[w.expect("checked dense")], None)?;
        return Ok(out.into_iter().next().expect("one output"));
    }
    linear.forward(x)
}
