//! The short depthwise causal conv of linear-attention and state-space
//! layers (mlx-lm's `nn.Conv1d(C, C, K, groups=C)` over a window of the last
//! `K - 1` inputs plus the new ones), optionally followed by SiLU.
//!
//! Why not MLX's conv1d everywhere: on a CUDA device it goes to cuDNN, which
//! builds a graph for every new input shape, about 140 ms each on the H200
//! (docs/benchmarks.md). Every new prompt length, batch size, speculative
//! verify width and replay width is a new shape. On a GPU the conv is
//! therefore the K taps times the window summed in float32 and rounded
//! once, in a CUDA kernel of ours that reads the window in place
//! (`depthwise_conv_kernel`; shapeless: no per-shape setup), then MLX's
//! compiled SiLU. On the CPU it stays MLX's conv1d, as mlx-lm
//! computes it (greedy parity there is exact and tested). The model option
//! `conv=mlx` keeps MLX's conv1d on a GPU too (`routes`).

use crate::compiled::{self, silu_ops, Compiled};
use crate::depthwise_conv_kernel;
use crate::ops::slice;
use crate::{error, Array, Dtype, Result};
use mlx_rs::ops;
use std::sync::OnceLock;

pub struct DepthwiseConv {
    /// `[C, K, 1]`, MLX's conv1d layout.
    weight: Array,
    /// Tap j of every channel, `[C]` float32 (exact: from bf16/f16/f32).
    taps: Vec<Array>,
    /// The same taps as one `[C, K]` float32 array (the kernel's).
    tap_matrix: Array,
}

impl DepthwiseConv {
    pub fn new(weight: Array) -> Result<Self> {
        let s = weight.shape().to_vec();
        if s.len() != 3 || s[2] != 1 || s[1] < 1 {
            return Err(error(format!("depthwise conv weight must be [C, K, 1], got {s:?}")));
        }
        let taps = (0..s[1])
            .map(|j| slice(&weight, &[0, j, 0], &[s[0], j + 1, 1])?.reshape(&[s[0]])?.as_dtype(Dtype::Float32))
            .collect::<Result<_>>()?;
        let tap_matrix = weight.reshape(&[s[0], s[1]])?.as_dtype(Dtype::Float32)?;
        Ok(Self { weight, taps, tap_matrix })
    }

    /// Arrays to evaluate with the weights at load.
    pub fn params(&self) -> Vec<Array> {
        [self.weight.clone(), self.tap_matrix.clone()].into_iter().chain(self.taps.iter().cloned()).collect()
    }

    /// `window` `[B, K-1+L, C]` → `[B, L, C]` in the window's dtype.
    pub fn forward(&self, window: &Array) -> Result<Array> {
        if fused_here() {
            if let Some(out) = depthwise_conv_kernel::conv(window, &self.tap_matrix)? {
                return Ok(out);
            }
            static F: OnceLock<Compiled> = OnceLock::new();
            return self.fused(&F, |a| Ok(vec![tap_sum(a)?]), window);
        }
        let c = self.weight.shape()[0];
        ops::conv1d(window, &self.weight, 1, 0, 1, c)
    }

    /// `silu(forward(window))`: on a GPU our conv kernel, then MLX's
    /// compiled SiLU on its output (the roundings of the compiled route).
    pub fn forward_silu(&self, window: &Array) -> Result<Array> {
        if fused_here() {
            if let Some(out) = depthwise_conv_kernel::conv(window, &self.tap_matrix)? {
                return compiled::silu(&out);
            }
            static F: OnceLock<Compiled> = OnceLock::new();
            return self.fused(&F, |a| Ok(vec![silu_ops(&tap_sum(a)?)?]), window);
        }
        compiled::silu(&self.forward(window)?)
    }

    /// `silu(forward(window))` split by channel into three groups of
    /// `(heads, dim)`, each `[B, L, heads, dim]` (a linear-attention
    /// layer's q, k and v).
    pub fn forward_silu_heads(&self, window: &Array, groups: [(i32, i32); 3]) -> Result<[Array; 3]> {
        let conv = self.forward_silu(window)?;
        let (b, l) = (conv.shape()[0], conv.shape()[1]);
        let first = groups[0].0 * groups[0].1;
        let parts = conv.split_at_indices(&[first, first + groups[1].0 * groups[1].1], -1)?;
        let heads = |i: usize| parts[i].reshape(&[b, l, groups[i].0, groups[i].1]);
        Ok([heads(0)?, heads(1)?, heads(2)?])
    }

    /// The GPU path: shifted windows (free views) and taps into `body`.
    fn fused(&self, cell: &'static OnceLock<Compiled>, body: compiled::Body, window: &Array) -> Result<Array> {
        let args = self.shifted(window)?;
        let refs: Vec<&Array> = args.iter().chain(&self.taps).collect();
        compiled::cached(cell, body)?.call1(&refs)
    }

    /// `window[:, j : j + L]` for each tap j.
    fn shifted(&self, window: &Array) -> Result<Vec<Array>> {
        let s = window.shape();
        let k = self.taps.len() as i32;
        if s.len() != 3 || s[1] < k || s[2] != self.weight.shape()[0] {
            return Err(error(format!(
                "depthwise conv window {s:?} does not fit a weight of {:?}",
                self.weight.shape()
            )));
        }
        let l = s[1] - k + 1;
        (0..k).map(|j| slice(window, &[0, j, 0], &[s[0], j + l, s[2]])).collect()
    }

    /// The GPU formula run on any device (tests compare it with conv1d).
    #[cfg(test)]
    fn tap_sum_unfused(&self, window: &Array) -> Result<Array> {
        let args: Vec<Array> = self.shifted(window)?.into_iter().chain(self.taps.iter().cloned()).collect();
        tap_sum(&args)
    }
}

/// The fused path: on a GPU, unless the model option `conv=mlx` (`routes`).
fn fused_here() -> bool {
    crate::ops::on_gpu() && crate::routes::current().fused_conv
}

/// `args` = K shifted windows then K taps: Σ_j window_j · tap_j in float32,
/// rounded once to the windows' dtype.
fn tap_sum(args: &[Array]) -> Result<Array> {
    let k = args.len() / 2;
    let dtype = args[0].dtype();
    let mut acc = args[0].as_dtype(Dtype::Float32)?.multiply(&args[k])?;
    for j in 1..k {
        acc = acc.add(args[j].as_dtype(Dtype::Float32)?.multiply(&args[k + j])?)?;
    }
    acc.as_dtype(dtype)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_arrays::normal;

    fn max_diff(a: &Array, b: &Array) -> f32 {
        assert_eq!(a.shape(), b.shape());
        a.as_dtype(Dtype::Float32)
            .unwrap()
            .subtract(b.as_dtype(Dtype::Float32).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .max(None)
            .unwrap()
            .item_cast::<f32>()
    }

    /// The GPU formula is MLX's conv1d (groups = channels, no flip): equal
    /// within float32 rounding, and in bf16 within one rounding of the output.
    #[test]
    fn the_tap_sum_is_mlx_conv1d() {
        for (b, l) in [(1, 1), (2, 5), (3, 17)] {
            let (c, k) = (24, 4);
            let window = normal(&[b, k - 1 + l, c], 1);
            let conv = DepthwiseConv::new(normal(&[c, k, 1], 2)).unwrap();
            let want = ops::conv1d(&window, &conv.weight, 1, 0, 1, c).unwrap();
            let got = conv.tap_sum_unfused(&window).unwrap();
            assert_eq!(got.shape(), &[b, l, c]);
            assert!(max_diff(&got, &want) < 1e-5, "f32 b={b} l={l}: {}", max_diff(&got, &want));
            let (wb, cb) = (
                window.as_dtype(Dtype::Bfloat16).unwrap(),
                DepthwiseConv::new(conv.weight.as_dtype(Dtype::Bfloat16).unwrap()).unwrap(),
            );
            let want = ops::conv1d(&wb, &cb.weight, 1, 0, 1, c).unwrap();
            let got = cb.tap_sum_unfused(&wb).unwrap();
            assert_eq!(got.dtype(), Dtype::Bfloat16);
            // One bf16 rounding of values of order 4: 2^-8 * 4.
            assert!(max_diff(&got, &want) <= 0.016, "bf16 b={b} l={l}: {}", max_diff(&got, &want));
        }
    }

    /// The compiled kernels serve every length from one trace, and the SiLU
    /// variant is SiLU of the plain one.
    #[test]
    fn the_fused_kernels_take_any_length() {
        let conv = DepthwiseConv::new(normal(&[8, 4, 1], 3)).unwrap();
        static F: OnceLock<Compiled> = OnceLock::new();
        static G: OnceLock<Compiled> = OnceLock::new();
        for l in [1, 2, 7] {
            let window = normal(&[2, 3 + l, 8], 4 + l as u64);
            let plain = conv.fused(&F, |a| Ok(vec![tap_sum(a)?]), &window).unwrap();
            assert!(max_diff(&plain, &conv.tap_sum_unfused(&window).unwrap()) == 0.0, "l={l}");
            let act = conv.fused(&G, |a| Ok(vec![silu_ops(&tap_sum(a)?)?]), &window).unwrap();
            assert!(max_diff(&act, &compiled::silu(&plain).unwrap()) < 1e-6, "l={l}");
        }
        assert!(conv.forward(&normal(&[1, 2, 8], 9)).is_err(), "a window shorter than K is refused");
    }
}
