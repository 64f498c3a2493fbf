//! The projections of a decode step on a GPU, fused with what surrounds
//! them: `x [M, K] @ w[N, K]^T` in bf16 with float32 sums for a few rows of
//! `x`, with the RMSNorm of `x` computed on the way in, or the residual add,
//! or SwiGLU over a gate and an up projection on the way out; q, k and v
//! from one launch. A Qwen3-8B decode step was 19 kernels a layer, most of
//! them small (norms, adds, the activation, narrow K/V products), each
//! costing the host a launch and the device a few microseconds
//! (docs/benchmarks.md, "Where a batch-1 decode step goes"); with these and
//! `qk_norm_rope` it is 8.
//!
//! Numerics follow the separate ops: the normalized input is rounded to
//! bf16 as MLX's `rms_norm` writes it, each product is rounded to bf16
//! before the residual add or the activation, and SwiGLU's sigmoid rounds
//! where MLX's compiled bf16 kernel does.

use crate::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use crate::{Array, Dtype, Result};

/// Every output count the fused route takes is a multiple of this, which
/// every split's rows a block (at most 8) divide.
const ROW_ALIGN: i32 = 16;
/// The most rows of `x` (batch x tokens) the fused route takes; more go
/// to MLX's matmul (cuBLAS), which is built for them.
pub const MAX_M: i32 = 4;

/// How a launch divides the work: `warps` per block, `rows` of the output
/// per row group, `k_split` warps sharing one group's K (their sums meet
/// in shared memory). A block holds `warps / k_split` row groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub warps: i32,
    pub rows: i32,
    pub k_split: i32,
}

impl Split {
    fn rows_per_block(self) -> i32 {
        self.warps / self.k_split * self.rows
    }

    fn divides(self, k: i32, outs: &[i32]) -> bool {
        k % (256 * self.k_split) == 0 && outs.iter().all(|n| n % self.rows_per_block() == 0)
    }
}

/// The split for `fusion` over outputs of `outs` rows of `k` inputs each,
/// chosen from each kernel's own duration on the H200 at the Qwen3-8B
/// shapes (`gemv_probe.py --ncu-log`, docs/benchmarks.md): four warps a
/// block, each warp over a slice of K of 1024-2048 (more loads in flight
/// from more, shorter warps); q/k/v take four rows a group (the norm's pass
/// over `x` is paid per group), gate/up two (two weights already), a
/// residual product four where K is much longer than the output (down),
/// else one, like the LM head. With several rows of `x` (`m`: a verify's
/// positions, a small batch) a residual product takes two rows a group
/// where K is much longer (down), else four: measured at 3 rows on the
/// H100, 13% and 8% faster than the one-row choice. The rows per group
/// never change the order of a sum (only the K split does), so outputs do
/// not depend on `m`.
pub fn split_rows(fusion: Fusion, k: i32, m: i32, outs: &[i32]) -> Split {
    let total: i32 = outs.iter().sum();
    let (rows, widest_split) = match fusion {
        Fusion::NormThen(_) => (4, 2),
        Fusion::NormSwiGlu => (2, 4),
        Fusion::ThenAdd if m > 1 && k >= 2 * total => (2, 4),
        Fusion::ThenAdd if m > 1 => (4, 4),
        Fusion::ThenAdd if k >= 2 * total => (4, 4),
        Fusion::ThenAdd | Fusion::Plain => (1, 4),
    };
    let mut k_split = widest_split;
    while k_split > 1 && (k / k_split < 1024 || k % (256 * k_split) != 0) {
        k_split /= 2;
    }
    let chosen = Split { warps: 4, rows, k_split };
    let safe = Split { warps: 4, rows: 1, k_split: 1 };
    if chosen.divides(k, outs) {
        chosen
    } else {
        safe
    }
}

/// [`split_rows`] for one row of `x`.
pub fn split(fusion: Fusion, k: i32, outs: &[i32]) -> Split {
    split_rows(fusion, k, 1, outs)
}

/// The kernel's body. A configuration is chosen by the defines prepended to
/// it (`NORM`, `WEIGHTS` 1-3, `PAIR`, `RESIDUAL`), template constants give
/// the shapes (`M`, `K`, `N0`..`N2`, `EPS_BITS`) and the [`Split`]
/// (`WARPS`, `R`, `KS`). Every
/// `Ni` is a multiple of a block's rows, `K` of `256 * KS`; inputs are
/// row-contiguous.
pub const SOURCE: &str = r#"
    constexpr int GROUPS = WARPS / KS;      // row groups per block
    constexpr int VK = K / 8;               // 16-byte vectors per row
    constexpr int PER_LANE = VK / 32 / KS;  // vectors per lane in its warp's slice of K
    __shared__ float sm_sq[KS > 1 ? WARPS * M : 1];
    __shared__ float sm_acc[KS > 1 ? WARPS * M * R * 2 : 1];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int part = warp % KS;
    const int group = warp / KS;
    const int first = part * PER_LANE * 32;
    int row = (blockIdx.x * GROUPS + group) * R;
    const uint4* xv = reinterpret_cast<const uint4*>(x);
    const uint4* wa;
    __nv_bfloat16* o;
    int n;
#if WEIGHTS == 1 || PAIR
    wa = reinterpret_cast<const uint4*>(w0); o = out0; n = N0;
#elif WEIGHTS == 2
    if (row < N0) { wa = reinterpret_cast<const uint4*>(w0); o = out0; n = N0; }
    else { row -= N0; wa = reinterpret_cast<const uint4*>(w1); o = out1; n = N1; }
#else
    if (row < N0) { wa = reinterpret_cast<const uint4*>(w0); o = out0; n = N0; }
    else if (row < N0 + N1) { row -= N0; wa = reinterpret_cast<const uint4*>(w1); o = out1; n = N1; }
    else { row -= N0 + N1; wa = reinterpret_cast<const uint4*>(w2); o = out2; n = N2; }
#endif
    wa += (size_t)row * VK;
#if PAIR
    const uint4* wb = reinterpret_cast<const uint4*>(w1) + (size_t)row * VK;
#endif
#if NORM
    const uint4* gv = reinterpret_cast<const uint4*>(g);
    const float eps = __int_as_float(EPS_BITS);
    float inv[M];
    #pragma unroll
    for (int m = 0; m < M; ++m) {
        float s = 0.f;
        #pragma unroll 4
        for (int j = 0; j < PER_LANE; ++j) {
            const uint4 v = __ldg(xv + (size_t)m * VK + first + lane + 32 * j);
            const __nv_bfloat162* p = reinterpret_cast<const __nv_bfloat162*>(&v);
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float2 f = __bfloat1622float2(p[e]);
                s = fmaf(f.x, f.x, fmaf(f.y, f.y, s));
            }
        }
        for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffff, s, off);
        inv[m] = s;
    }
    if constexpr (KS > 1) {
        if (lane == 0) {
            #pragma unroll
            for (int m = 0; m < M; ++m) sm_sq[warp * M + m] = inv[m];
        }
        __syncthreads();
        #pragma unroll
        for (int m = 0; m < M; ++m) {
            float s = 0.f;
            for (int p = 0; p < KS; ++p) s += sm_sq[(group * KS + p) * M + m];
            inv[m] = s;
        }
    }
    #pragma unroll
    for (int m = 0; m < M; ++m) inv[m] = rsqrtf(inv[m] / K + eps);
#endif
    float acc[M][R];
#if PAIR
    float accb[M][R];
#endif
    #pragma unroll
    for (int m = 0; m < M; ++m)
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            acc[m][r] = 0.f;
#if PAIR
            accb[m][r] = 0.f;
#endif
        }
    #pragma unroll 4
    for (int j = 0; j < PER_LANE; ++j) {
        const int i = first + lane + 32 * j;
        uint4 wr[R];
        #pragma unroll
        for (int r = 0; r < R; ++r) wr[r] = __ldg(wa + (size_t)r * VK + i);
#if PAIR
        uint4 wq[R];
        #pragma unroll
        for (int r = 0; r < R; ++r) wq[r] = __ldg(wb + (size_t)r * VK + i);
#endif
#if NORM
        const uint4 gr = __ldg(gv + i);
        const __nv_bfloat162* gp2 = reinterpret_cast<const __nv_bfloat162*>(&gr);
#endif
        #pragma unroll
        for (int m = 0; m < M; ++m) {
            const uint4 xr = __ldg(xv + (size_t)m * VK + i);
            const __nv_bfloat162* xp2 = reinterpret_cast<const __nv_bfloat162*>(&xr);
            float xf[8];
            #pragma unroll
            for (int e = 0; e < 4; ++e) {
                float2 f = __bfloat1622float2(xp2[e]);
#if NORM
                // MLX's rms_norm: w * T(x * normalizer), each rounded to T; two
                // elements at a time (a bf16 product is exact in float, so the
                // bf16x2 multiply rounds as MLX's float multiply then cast).
                const __nv_bfloat162 y = __floats2bfloat162_rn(f.x * inv[m], f.y * inv[m]);
                f = __bfloat1622float2(__hmul2(gp2[e], y));
#endif
                xf[2 * e] = f.x;
                xf[2 * e + 1] = f.y;
            }
            #pragma unroll
            for (int r = 0; r < R; ++r) {
                const __nv_bfloat16* wp = reinterpret_cast<const __nv_bfloat16*>(&wr[r]);
                #pragma unroll
                for (int e = 0; e < 8; ++e) acc[m][r] = fmaf(__bfloat162float(wp[e]), xf[e], acc[m][r]);
#if PAIR
                const __nv_bfloat16* qp = reinterpret_cast<const __nv_bfloat16*>(&wq[r]);
                #pragma unroll
                for (int e = 0; e < 8; ++e) accb[m][r] = fmaf(__bfloat162float(qp[e]), xf[e], accb[m][r]);
#endif
            }
        }
    }
    // Each warp's sums, then (KS > 1) the slices of K added in their order.
    #pragma unroll
    for (int m = 0; m < M; ++m)
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            for (int off = 16; off > 0; off >>= 1) acc[m][r] += __shfl_xor_sync(0xffffffff, acc[m][r], off);
#if PAIR
            for (int off = 16; off > 0; off >>= 1) accb[m][r] += __shfl_xor_sync(0xffffffff, accb[m][r], off);
#endif
        }
    if constexpr (KS > 1) {
        if (lane == 0) {
            #pragma unroll
            for (int m = 0; m < M; ++m)
                #pragma unroll
                for (int r = 0; r < R; ++r) {
                    sm_acc[((warp * M + m) * R + r) * 2] = acc[m][r];
#if PAIR
                    sm_acc[((warp * M + m) * R + r) * 2 + 1] = accb[m][r];
#endif
                }
        }
        __syncthreads();
        if (part != 0) return;
        #pragma unroll
        for (int m = 0; m < M; ++m)
            #pragma unroll
            for (int r = 0; r < R; ++r) {
                float s = 0.f;
                for (int p = 0; p < KS; ++p) s += sm_acc[(((group * KS + p) * M + m) * R + r) * 2];
                acc[m][r] = s;
#if PAIR
                float u = 0.f;
                for (int p = 0; p < KS; ++p) u += sm_acc[(((group * KS + p) * M + m) * R + r) * 2 + 1];
                accb[m][r] = u;
#endif
            }
    }
    if (lane != 0) return;
    #pragma unroll
    for (int m = 0; m < M; ++m)
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            const float s = acc[m][r];
            const size_t idx = (size_t)m * n + row + r;
            const float p = __bfloat162float(__float2bfloat16(s));
#if RESIDUAL
            o[idx] = __float2bfloat16(__bfloat162float(res[idx]) + p);
#elif PAIR
            // MLX's bf16 Sigmoid, 1 / (1 + exp(|x|)) flipped for x >= 0, each
            // step rounded to bf16; then silu = g * sigmoid(g), times up.
            const float e1 = __bfloat162float(__float2bfloat16(expf(fabsf(p))));
            const float d1 = __bfloat162float(__float2bfloat16(1.f + e1));
            const float y1 = __bfloat162float(__float2bfloat16(1.f / d1));
            const float sg = p < 0.f ? y1 : __bfloat162float(__float2bfloat16(1.f - y1));
            const float silu = __bfloat162float(__float2bfloat16(p * sg));
            o[idx] = __float2bfloat16(silu * __bfloat162float(__float2bfloat16(accb[m][r])));
#else
            o[idx] = __float2bfloat16(p);
#endif
        }
"#;

/// One configuration of [`SOURCE`]: what is fused around the products.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Fusion {
    /// RMSNorm of `x`, then 1 to 3 projections from one launch.
    NormThen(usize),
    /// RMSNorm of `x`, then SwiGLU of a gate and an up projection.
    NormSwiGlu,
    /// One projection plus a residual.
    ThenAdd,
    /// One projection alone.
    Plain,
}

impl Fusion {
    pub(crate) fn defines(self) -> String {
        let (norm, weights, pair, residual) = match self {
            Fusion::NormThen(w) => (1, w, 0, 0),
            Fusion::NormSwiGlu => (1, 2, 1, 0),
            Fusion::ThenAdd => (0, 1, 0, 1),
            Fusion::Plain => (0, 1, 0, 0),
        };
        format!("#define NORM {norm}\n#define WEIGHTS {weights}\n#define PAIR {pair}\n#define RESIDUAL {residual}\n")
    }

    fn names(self) -> (Vec<&'static str>, Vec<&'static str>) {
        match self {
            Fusion::NormThen(1) => (vec!["x", "g", "w0"], vec!["out0"]),
            Fusion::NormThen(2) => (vec!["x", "g", "w0", "w1"], vec!["out0", "out1"]),
            Fusion::NormThen(_) => (vec!["x", "g", "w0", "w1", "w2"], vec!["out0", "out1", "out2"]),
            Fusion::NormSwiGlu => (vec!["x", "g", "w0", "w1"], vec!["out0"]),
            Fusion::ThenAdd => (vec!["x", "w0", "res"], vec!["out0"]),
            Fusion::Plain => (vec!["x", "w0"], vec!["out0"]),
        }
    }

    /// The configuration's kernel, built on first use: its slot among the
    /// six and its name.
    fn kernel(self) -> Result<&'static CudaKernel> {
        static CELLS: [Cached; 6] = [const { Cached::new() }; 6];
        let (slot, name) = match self {
            Fusion::NormThen(1) => (0, "gemv_norm_then_1"),
            Fusion::NormThen(2) => (1, "gemv_norm_then_2"),
            Fusion::NormThen(_) => (2, "gemv_norm_then_3"),
            Fusion::NormSwiGlu => (3, "gemv_norm_swiglu"),
            Fusion::ThenAdd => (4, "gemv_then_add"),
            Fusion::Plain => (5, "gemv_plain"),
        };
        cached(&CELLS[slot], || {
            let (ins, outs) = self.names();
            CudaKernel::new_contiguous(name, &ins, &outs, &(self.defines() + SOURCE))
        })
    }
}

/// Whether the fused route takes `x` (`[.., K]`, `m` rows in all) against
/// weights of `outs` rows: bf16, few rows, whole blocks of rows and of K.
pub fn fits(x: &Array, m: i32, outs: &[i32]) -> bool {
    let k = *x.shape().last().unwrap_or(&0);
    x.dtype() == Dtype::Bfloat16
        && (1..=MAX_M).contains(&m)
        && k > 0
        && k % 256 == 0
        && outs.iter().all(|n| *n > 0 && n % ROW_ALIGN == 0)
}

/// Runs `fusion` over `x` (`[.., K]`, `m` rows) with `g` the norm's weight
/// (`NormThen`, `NormSwiGlu`), the weights `w` (`[Ni, K]`) and `res` the
/// residual (`ThenAdd`, shaped as the output). Outputs are `[.., Ni]`.
pub fn apply(
    fusion: Fusion,
    x: &Array,
    m: i32,
    g: Option<(&Array, f32)>,
    w: &[&Array],
    res: Option<&Array>,
) -> Result<Vec<Array>> {
    let shape = x.shape();
    let k = shape[shape.len() - 1];
    let outs: Vec<i32> = w.iter().map(|a| a.shape()[0]).collect();
    let mut inputs: Vec<&Array> = vec![x];
    if let Some((gw, _)) = g {
        inputs.push(gw);
    }
    inputs.extend_from_slice(w);
    if let Some(r) = res {
        inputs.push(r);
    }
    let out_rows: Vec<i32> = match fusion {
        Fusion::NormSwiGlu | Fusion::ThenAdd | Fusion::Plain => vec![outs[0]],
        Fusion::NormThen(_) => outs.clone(),
    };
    let shapes: Vec<Vec<i32>> = out_rows
        .iter()
        .map(|n| {
            let mut s = shape[..shape.len() - 1].to_vec();
            s.push(*n);
            s
        })
        .collect();
    let out_specs: Vec<(&[i32], Dtype)> = shapes.iter().map(|s| (s.as_slice(), Dtype::Bfloat16)).collect();
    let n_at = |i: usize| *out_rows.get(i).unwrap_or(&0);
    let eps = g.map(|(_, e)| e).unwrap_or(0.0);
    let s = split_rows(fusion, k, m, &out_rows);
    let blocks = out_rows.iter().sum::<i32>() / s.rows_per_block();
    fusion.kernel()?.apply(
        &inputs,
        &Launch {
            grid: [blocks * s.warps * 32, 1, 1],
            threads: [s.warps * 32, 1, 1],
            outputs: &out_specs,
            template: &[
                Template::Int("M", m),
                Template::Int("K", k),
                Template::Int("N0", n_at(0)),
                Template::Int("N1", n_at(1)),
                Template::Int("N2", n_at(2)),
                Template::Int("R", s.rows),
                Template::Int("WARPS", s.warps),
                Template::Int("KS", s.k_split),
                Template::Int("EPS_BITS", eps.to_bits() as i32),
            ],
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(shape: &[i32], dtype: Dtype) -> Array {
        mlx_rs::ops::zeros_dtype(shape, dtype).unwrap()
    }

    #[test]
    fn the_fused_route_takes_few_bf16_rows_over_whole_blocks() {
        let one = x(&[1, 1, 4096], Dtype::Bfloat16);
        assert!(fits(&one, 1, &[4096, 1024, 1024]));
        assert!(fits(&x(&[2, 2, 4096], Dtype::Bfloat16), 4, &[12288]));
        // More rows than the kernel is built for go to MLX's matmul.
        assert!(!fits(&x(&[5, 1, 4096], Dtype::Bfloat16), 5, &[4096]));
        // SmolLM2's hidden 576 is not a whole number of 256-wide passes.
        assert!(!fits(&x(&[1, 1, 576], Dtype::Bfloat16), 1, &[576]));
        assert!(!fits(&x(&[1, 1, 4096], Dtype::Float32), 1, &[4096]));
        assert!(!fits(&one, 1, &[4096, 1000]));
    }

    #[test]
    fn each_split_covers_whole_blocks_of_rows_and_slices_of_k() {
        let s = |warps, rows, k_split| Split { warps, rows, k_split };
        // The Qwen3-8B shapes the splits were measured at.
        assert_eq!(split(Fusion::NormThen(3), 4096, &[4096, 1024, 1024]), s(4, 4, 2));
        assert_eq!(split(Fusion::NormSwiGlu, 4096, &[12288]), s(4, 2, 4));
        assert_eq!(split(Fusion::ThenAdd, 4096, &[4096]), s(4, 1, 4));
        assert_eq!(split(Fusion::ThenAdd, 12288, &[4096]), s(4, 4, 4));
        assert_eq!(split(Fusion::Plain, 4096, &[151936]), s(4, 1, 4));
        // Narrow K keeps each warp's slice at 1024 or more.
        assert_eq!(split(Fusion::ThenAdd, 3072, &[1024]), s(4, 4, 2));
        assert_eq!(split(Fusion::NormThen(3), 1024, &[2048, 1024, 1024]), s(4, 4, 1));
        // Several rows of x: other rows per group, the same K split (the
        // same order of every sum).
        assert_eq!(split_rows(Fusion::ThenAdd, 4096, 3, &[4096]), s(4, 4, 4));
        assert_eq!(split_rows(Fusion::ThenAdd, 12288, 3, &[4096]), s(4, 2, 4));
        // Every output the route takes (multiples of ROW_ALIGN) is whole blocks.
        for f in [Fusion::NormThen(2), Fusion::NormSwiGlu, Fusion::ThenAdd, Fusion::Plain] {
            for (k, m) in [256, 1024, 2816, 12288].into_iter().flat_map(|k| [(k, 1), (k, 3)]) {
                let outs = [ROW_ALIGN, 3 * ROW_ALIGN];
                let sp = split_rows(f, k, m, &outs);
                assert!(outs.iter().all(|n| n % sp.rows_per_block() == 0) && k % (256 * sp.k_split) == 0);
                assert_eq!(sp.k_split, split(f, k, &outs).k_split, "the order of a sum must not depend on m");
            }
        }
    }

    #[test]
    fn each_fusion_names_its_inputs_and_outputs_as_its_defines_read_them() {
        for (f, ins, outs) in [
            (Fusion::NormThen(3), 5, 3),
            (Fusion::NormThen(1), 3, 1),
            (Fusion::NormSwiGlu, 4, 1),
            (Fusion::ThenAdd, 3, 1),
        ] {
            let (i, o) = f.names();
            assert_eq!((i.len(), o.len()), (ins, outs));
            let d = f.defines();
            assert_eq!(d.contains("#define RESIDUAL 1"), i.contains(&"res"));
            assert_eq!(d.contains("#define NORM 1"), i.contains(&"g"));
        }
    }
}
