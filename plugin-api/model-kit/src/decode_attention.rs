//! Decode attention under a boolean mask on the GPU: one query per row over
//! the layer's K/V, read in place, with the rows' padding and holes masked,
//! in a CUDA kernel of our own (`cuda_kernel`).
//!
//! Why: a batch of rows of different lengths is left-padded, so every
//! decode step carries a `[B, 1, 1, T]` boolean mask. MLX 0.32's fused
//! CUDA kernels take no array mask for a 1-token query (its vector kernel
//! refuses masks, cuDNN is not used for masked decoding), so
//! `fast::scaled_dot_product_attention` falls back to matmuls, a `where`
//! and a softmax: several launches per layer and step, and scores written
//! out, where equal-length rows take one fused launch.
//!
//! The kernel: one block of 8 warps per (row, K/V head, slice of the keys);
//! a warp scores several keys at once, a group of lanes per key, each lane
//! holding 16 of its dimensions (and of the value's) in float32 for every
//! query head sharing the K/V head (`lanes_per_key`); scores reduce across
//! the group, and an online softmax keeps each group's running maximum,
//! sum and weighted values, as MLX's vector kernel does per warp. The
//! block merges its warps; the slices (`splits`, so that short batches
//! still fill the GPU) are merged by [`merge_slices`], which kv-quant's
//! kernel over affine codes shares.

use crate::cuda_kernel::{cached, Cached, CudaKernel, Launch, Template};
use crate::{error, Array, Dtype, Result};

/// The kernel up to the block's merge ([`BLOCK_MERGE`]). `KEYS` (where
/// the keys of row `b`, K/V head `h` are: `T`, and `KROW(t)` / `VROW(t)`
/// pointing at key `t`'s first dimension with `KS` / `VS` between
/// dimensions) is spliced in, once per kind of K/V storage (`DENSE`,
/// `PAGED`); `MASK_ROW` and `MASK_LIVE` are the mask's lines
/// ([`MASK_LINES`]) or nothing. A block's row is one (batch row, query)
/// pair: the masked kernels take one query per batch row, the unmasked one
/// up to `routes::PER_QUERY_MAX`; `SEEN` says how many of the `T` keys the
/// pair's query attends to (`TS`).
///
/// `G` lanes share a key (`D / G` dimensions each, [`lanes_per_key`]), so a
/// warp scores `32 / G` keys at once: each lane loads its dimensions of K
/// and V in 16-byte words where they are contiguous and aligned, and a
/// score reduces over `log2 G` shuffles. Each group keeps its own online
/// softmax; the warp's groups are merged by shuffles at the end.
const SOURCE: &str = r#"
    constexpr int WARPS = 8;
    constexpr int DPL = D / G;
    constexpr int KW = 32 / G;
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int grp = lane / G;
    const int gi = lane % G;
    const int blk = blockIdx.x;
    const int QL = q_shape[2];
    const int splits = gridDim.x / (q_shape[0] * QL * HKV);
    const int bh = blk / splits;
    const int split = blk % splits;
    const int b = bh / HKV / QL;
    const int ql = bh / HKV % QL;
    const int h = bh % HKV;
    KEYS
    SEEN
    const int per = (TS + splits - 1) / splits;
    const int t0 = split * per;
    const int t1 = min(TS, t0 + per);
    const float sc = __int_as_float(SCALE_BITS);
    // DPL elements from p, `stride` apart, as floats: 16-byte loads where
    // they are contiguous and p is aligned for them.
    const auto load = [](const auto* p, size_t stride, float* f) {
        constexpr int W = 16 / sizeof(*p);
        if constexpr (DPL % W == 0) {
            if (stride == 1 && (reinterpret_cast<size_t>(p) & 15) == 0) {
                #pragma unroll
                for (int c = 0; c < DPL / W; ++c) {
                    const uint4 w = reinterpret_cast<const uint4*>(p)[c];
                    const auto* e = reinterpret_cast<decltype(p)>(&w);
                    #pragma unroll
                    for (int j = 0; j < W; ++j) f[c * W + j] = static_cast<float>(e[j]);
                }
                return;
            }
        }
        #pragma unroll
        for (int i = 0; i < DPL; ++i) f[i] = static_cast<float>(p[i * stride]);
    };
    float qv[R][DPL];
    #pragma unroll
    for (int r = 0; r < R; ++r)
        #pragma unroll
        for (int i = 0; i < DPL; ++i)
            qv[r][i] = sc * static_cast<float>(q[(size_t)b * q_strides[0] + (size_t)(h * R + r) * q_strides[1]
                                                 + (size_t)ql * q_strides[2] + (size_t)(gi * DPL + i) * q_strides[3]]);
    float m[R], l[R], acc[R][DPL];
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        m[r] = -INFINITY;
        l[r] = 0.f;
        #pragma unroll
        for (int i = 0; i < DPL; ++i) acc[r][i] = 0.f;
    }
    MASK_ROW
    // The loop's bounds are the warp's, so every lane takes every shuffle;
    // a group past the slice's end (or on a masked key) scores nothing.
    for (int base = t0 + warp * KW; base < t1; base += WARPS * KW) {
        const int t = base + grp;
        const bool live = t < t1 MASK_LIVE;
        float kf[DPL], vv[DPL];
        if (live) {
            load(KROW(t) + (size_t)gi * DPL * KS, KS, kf);
            load(VROW(t) + (size_t)gi * DPL * VS, VS, vv);
        } else {
            #pragma unroll
            for (int i = 0; i < DPL; ++i) kf[i] = vv[i] = 0.f;
        }
        float s[R];
        #pragma unroll
        for (int r = 0; r < R; ++r) {
            float x = 0.f;
            #pragma unroll
            for (int i = 0; i < DPL; ++i) x = fmaf(qv[r][i], kf[i], x);
            #pragma unroll
            for (int o = 1; o < G; o <<= 1) x += __shfl_xor_sync(0xffffffff, x, o);
            s[r] = x;
        }
        if (live) {
            #pragma unroll
            for (int r = 0; r < R; ++r) {
                const float mn = fmaxf(m[r], s[r]);
                const float corr = __expf(m[r] - mn);
                const float p = __expf(s[r] - mn);
                l[r] = l[r] * corr + p;
                #pragma unroll
                for (int i = 0; i < DPL; ++i) acc[r][i] = acc[r][i] * corr + p * vv[i];
                m[r] = mn;
            }
        }
    }
    // The warp's groups merged (lanes holding the same dimensions are G
    // apart), then stored for the block's merge.
    __shared__ float sm_m[WARPS][R];
    __shared__ float sm_l[WARPS][R];
    __shared__ float sm_acc[WARPS][R][D];
    #pragma unroll
    for (int r = 0; r < R; ++r) {
        float M = m[r];
        #pragma unroll
        for (int o = G; o < 32; o <<= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffff, M, o));
        const float c = m[r] == -INFINITY ? 0.f : __expf(m[r] - M);
        float L = l[r] * c;
        #pragma unroll
        for (int o = G; o < 32; o <<= 1) L += __shfl_xor_sync(0xffffffff, L, o);
        #pragma unroll
        for (int i = 0; i < DPL; ++i) {
            float a = acc[r][i] * c;
            #pragma unroll
            for (int o = G; o < 32; o <<= 1) a += __shfl_xor_sync(0xffffffff, a, o);
            if (grp == 0) sm_acc[warp][r][gi * DPL + i] = a;
        }
        if (lane == 0) {
            sm_m[warp][r] = M;
            sm_l[warp][r] = L;
        }
    }
"#;

/// What every decode kernel of this kind ends with, once each of its
/// `WARPS` warps has stored its running maximum `sm_m[WARPS][R]`, sum
/// `sm_l` and weighted values `sm_acc[WARPS][R][D]` in shared memory: the
/// warps merged into this block's partial output `part` and running
/// maximum and sum `ml` (merged across slices by [`merge_slices`]).
/// kv-quant's kernel over affine codes ends the same.
pub const BLOCK_MERGE: &str = r#"    __syncthreads();
    for (int idx = threadIdx.x; idx < R * D; idx += blockDim.x) {
        const int r = idx / D, d = idx % D;
        float M = -INFINITY;
        for (int w = 0; w < WARPS; ++w) M = fmaxf(M, sm_m[w][r]);
        float L = 0.f, A = 0.f;
        if (M > -INFINITY) {
            for (int w = 0; w < WARPS; ++w) {
                const float c = __expf(sm_m[w][r] - M);
                L += sm_l[w][r] * c;
                A += sm_acc[w][r][d] * c;
            }
        }
        part[((size_t)blk * R + r) * D + d] = A;
        if (d == 0) {
            ml[((size_t)blk * R + r) * 2] = M;
            ml[((size_t)blk * R + r) * 2 + 1] = L;
        }
    }
"#;

/// `k` / `v` `[B, Hkv, T, D]`, any strides.
pub(crate) const DENSE: &str = r#"
    const int T = k_shape[2];
    const size_t kb = (size_t)b * k_strides[0] + (size_t)h * k_strides[1];
    const size_t vb = (size_t)b * v_strides[0] + (size_t)h * v_strides[1];
    const size_t KS = k_strides[3], VS = v_strides[3];
    #define KROW(t) (k + kb + (size_t)(t) * k_strides[2])
    #define VROW(t) (v + vb + (size_t)(t) * v_strides[2])
"#;

/// `k` / `v` a block pool `[Hkv, capacity * BLOCK, D]`; `flat` `[B, Hkv,
/// nb]` names each row's blocks as `h * capacity + block` (kv-paged's
/// gather indices), so key `t` of the row is slot `t % BLOCK` of its
/// `t / BLOCK`-th block.
pub(crate) const PAGED: &str = r#"
    const int T = flat_shape[2] * BLOCK;
    const int cap = k_shape[1] / BLOCK;
    const size_t fb = (size_t)b * flat_strides[0] + (size_t)h * flat_strides[1];
    const size_t KS = k_strides[2], VS = v_strides[2];
    #define SLOT(t) ((size_t)(flat[fb + (size_t)((t) / BLOCK) * flat_strides[2]] % cap) * BLOCK + (t) % BLOCK)
    #define KROW(t) (k + (size_t)h * k_strides[0] + SLOT(t) * k_strides[1])
    #define VROW(t) (v + (size_t)h * v_strides[0] + SLOT(t) * v_strides[1])
"#;

/// The slices' partial results as one: each slice's running maximum and
/// sum rescaled to the overall maximum (a slice that saw no key, m = -inf,
/// weighs nothing). One thread per output element. `part` comes as
/// `[B * Hkv, splits, R, D]`, so the count of slices is a shape, not an
/// array the host uploads every step.
pub(crate) const MERGE_SOURCE: &str = r#"
    const int SPLITS = part_shape[1];
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t n = (size_t)part_shape[0] * R * D;
    if (i >= n) return;
    const int d = i % D;
    const size_t bq = i / D;
    const size_t bh = bq / R;
    const int r = bq % R;
    float M = -INFINITY;
    for (int s = 0; s < SPLITS; ++s) M = fmaxf(M, ml[((bh * SPLITS + s) * R + r) * 2]);
    float L = 0.f, A = 0.f;
    if (M > -INFINITY) {
        for (int s = 0; s < SPLITS; ++s) {
            const size_t at = (bh * SPLITS + s) * R + r;
            const float c = __expf(ml[at * 2] - M);
            L += ml[at * 2 + 1] * c;
            A += part[at * D + d] * c;
        }
    }
    out[i] = L > 0.f ? A / L : 0.f;
"#;

/// Threads per block (8 warps, as the sources' WARPS).
pub const THREADS: i32 = 256;
/// Blocks the GPU should get at least: two per SM of an H200 (132 SMs).
pub const TARGET_BLOCKS: i32 = 264;
/// Keys a slice holds at least.
const MIN_SLICE: i32 = 256;

/// [`SOURCE`]'s mask lines: a key scores nothing where the row's mask is false.
const MASK_LINES: [(&str, &str); 2] = [
    ("MASK_ROW", "const size_t mb = (size_t)b * mask_strides[0];"),
    ("MASK_LIVE", "&& mask[mb + (size_t)t * mask_strides[1]]"),
];

/// [`SOURCE`]'s keys seen without a mask: all `T`, or when `CAUSAL` (a
/// template argument) query `ql` of `QL` sits at key `T - QL + ql` and sees
/// the keys up to it.
const UNMASKED_SEEN: &str = "const int TS = CAUSAL ? T - (QL - 1 - ql) : T;";

/// The whole kernel over `keys` (`DENSE` or `PAGED`), with or without a mask.
pub(crate) fn source(keys: &str, masked: bool) -> String {
    let mut s = SOURCE.replace("KEYS", keys).replace("SEEN", if masked { "const int TS = T;" } else { UNMASKED_SEEN });
    for (slot, line) in MASK_LINES {
        s = s.replace(slot, if masked { line } else { "" });
    }
    format!("{s}{BLOCK_MERGE}")
}

fn kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || {
        CudaKernel::new("masked_decode_attention", &["q", "k", "v", "mask"], &["part", "ml"], &source(DENSE, true))
    })
}

fn unmasked_kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || CudaKernel::new("decode_attention", &["q", "k", "v"], &["part", "ml"], &source(DENSE, false)))
}

fn paged_kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || {
        let source = source(PAGED, true);
        CudaKernel::new("paged_decode_attention", &["q", "k", "v", "mask", "flat"], &["part", "ml"], &source)
    })
}

fn merge_kernel() -> Result<&'static CudaKernel> {
    static KERNEL: Cached = Cached::new();
    cached(&KERNEL, || CudaKernel::new("decode_attention_merge_slices", &["part", "ml"], &["out"], MERGE_SOURCE))
}

/// Lanes that share one key in [`SOURCE`] at head size `d` (a multiple of
/// 32): 16 dimensions each where `d / 16` is a power of two, so that each
/// lane loads two 16-byte words of a 16-bit key and a warp scores several
/// keys at once (more loads in flight, fewer shuffles per key); else the
/// whole warp, `d / 32` dimensions each.
pub(crate) fn lanes_per_key(d: i32) -> i32 {
    match d / 16 {
        g @ (1 | 2 | 4 | 8 | 16 | 32) if d % 16 == 0 => g,
        _ => 32,
    }
}

/// How many slices of the keys each (row, K/V head) is cut into: at least
/// `target` blocks for the GPU, slices of at least `MIN_SLICE` keys.
pub fn splits(rows: i32, kv_heads: i32, keys: i32, target: i32) -> i32 {
    let want = (target + rows * kv_heads - 1) / (rows * kv_heads);
    want.min(keys / MIN_SLICE).max(1)
}

/// The partial results `part` `[blocks, R, D]` and `ml` `[blocks, R, 2]`
/// (running maximum, sum) of `splits` slices per (row, K/V head) merged
/// into the attention output `[b, hq, 1, d]` in `dtype`.
pub fn merge_slices(part: &Array, ml: &Array, splits: i32, out: [i32; 4], dtype: Dtype) -> Result<Array> {
    let [b, hq, _, d] = out;
    let pairs = part.shape()[0] / splits;
    let r = hq / (pairs / b).max(1);
    let part = part.reshape(&[pairs, splits, r, d])?;
    let merged = merge_kernel()?.apply(
        &[&part, ml],
        &Launch {
            grid: [(b * hq * d + THREADS - 1) / THREADS * THREADS, 1, 1],
            threads: [THREADS, 1, 1],
            outputs: &[(&out, dtype)],
            template: &[Template::Int("D", d), Template::Int("R", r)],
        },
    )?;
    merged.into_iter().next().ok_or_else(|| error("the merge kernel returned nothing"))
}

/// Whether queries `q` `[B, Hq, L, D]` (one per row under a boolean
/// `mask`, `[B, .., T]` or one row for all; up to `t` without) over K/V of
/// `hkv` heads and `t` keys are what the kernels were built for, on the
/// current device.
fn fits(q: &Array, hkv: i32, dims: (i32, i32), t: i32, mask: Option<&Array>, kv_dtype: Dtype) -> bool {
    let &[b, hq, l, d] = q.shape() else { return false };
    (l == 1 || (mask.is_none() && (1..=t).contains(&l)))
        && hkv > 0
        && hq % hkv == 0
        && d % 32 == 0
        && dims == (d, d)
        && (hq / hkv) * d <= 1024
        && t > 0
        && mask.is_none_or(|m| m.dtype() == Dtype::Bool && (m.size() as i32 == b * t || m.size() as i32 == t))
        && matches!(q.dtype(), Dtype::Bfloat16 | Dtype::Float16 | Dtype::Float32)
        && kv_dtype == q.dtype()
        && crate::ops::on_gpu()
}

/// Launches `kernel` over `inputs` (`q`, `k`, `v`, then the mask, if any,
/// as `[B, T]`, then `extra`) and merges its slices into `[B, Hq, L, D]`.
/// Each query gets the slices a lone query of its row would (`splits` of
/// the `B` rows), so a verify's query is cut as a decode step's is.
fn launch(
    kernel: &CudaKernel,
    q: &Array,
    kv: (&Array, &Array),
    mask: Option<&Array>,
    extra: &[&Array],
    (hkv, t, scale): (i32, i32, f32),
    more: &[Template],
) -> Result<Array> {
    let &[b, hq, l, d] = q.shape() else { return Err(error("the decode kernel takes [B, Hq, L, D] queries")) };
    let r = hq / hkv;
    let mask = mask.map(|m| mlx_rs::ops::broadcast_to(&m.reshape(&[-1, t])?, &[b, t])).transpose()?;
    let splits = splits(b, hkv, t, TARGET_BLOCKS);
    let blocks = b * l * hkv * splits;
    let mut inputs = vec![q, kv.0, kv.1];
    inputs.extend(mask.as_ref());
    inputs.extend_from_slice(extra);
    // The scale as a compile-time constant (its bits): one per model, and
    // nothing to upload per layer and step.
    let mut template = vec![
        Template::Int("D", d),
        Template::Int("G", lanes_per_key(d)),
        Template::Int("R", r),
        Template::Int("HKV", hkv),
        Template::Int("SCALE_BITS", scale.to_bits() as i32),
    ];
    template.extend(more.iter().map(|t| match *t {
        Template::Int(n, v) => Template::Int(n, v),
        Template::Bool(n, v) => Template::Bool(n, v),
    }));
    let outs = kernel.apply(
        &inputs,
        &Launch {
            grid: [blocks * THREADS, 1, 1],
            threads: [THREADS, 1, 1],
            outputs: &[(&[blocks, r, d], Dtype::Float32), (&[blocks, r, 2], Dtype::Float32)],
            template: &template,
        },
    )?;
    let [part, ml]: [Array; 2] = outs.try_into().map_err(|_| error("the decode kernel returned other outputs"))?;
    // Merged in block order, (row, query) pairs: `[B, L, Hq, D]`.
    let out = merge_slices(&part, &ml, splits, [b * l, hq, 1, d], q.dtype())?;
    if l == 1 {
        return Ok(out);
    }
    out.reshape(&[b, l, hq, d])?.swap_axes(1, 2)
}

/// Attention of one query per row, `q` `[B, Hq, 1, D]`, over `k` / `v`
/// `[B, Hkv, T, D]` (read in place, any strides) where the boolean `mask`
/// (`[B, 1, 1, T]`, or one row for all) is true; None where the kernel does
/// not apply (more queries, another mask dtype or shape, head sizes it was
/// not built for, not on a GPU): the caller then attends through MLX.
pub fn masked(q: &Array, k: &Array, v: &Array, scale: f32, mask: &Array) -> Result<Option<Array>> {
    let Some((hkv, t)) = dense_fits(q, k, v, Some(mask)) else { return Ok(None) };
    launch(kernel()?, q, (k, v), Some(mask), &[], (hkv, t, scale), &[]).map(Some)
}

/// `fits` for dense K/V, `k` / `v` `[B, Hkv, T, D]` of `q`'s rows: their
/// K/V heads and keys when the kernels take them.
fn dense_fits(q: &Array, k: &Array, v: &Array, mask: Option<&Array>) -> Option<(i32, i32)> {
    let (&[b, ..], &[kb, hkv, t, kd]) = (q.shape(), k.shape()) else { return None };
    let fit = kb == b && v.shape() == k.shape() && fits(q, hkv, (kd, v.shape()[3]), t, mask, k.dtype());
    fit.then_some((hkv, t))
}

/// Head sizes past this have neither of MLX 0.32's fused CUDA kernels for
/// a 1-token query (its vector kernel takes 64, 96 and 128; cuDNN at most
/// 128): there MLX attends through its fallback, two matmuls and a softmax,
/// and the product with the values (not transposed) is a cuBLAS call that
/// MLX captures into a graph of its own on every launch. On the 8B-scale
/// Qwen3.5 hybrid (head size 256) those were 8 of a plain step's captures
/// and 24 of an MTP round's 35 (docs/benchmarks.md, "An MTP round on the
/// CUDA timeline").
pub const MLX_FUSED_MAX_HEAD: i32 = 128;

/// Attention of `L` queries per row with no mask or a causal one, `q`
/// `[B, Hq, L, D]` over `k` / `v` `[B, Hkv, T, D]` read in place, in one
/// launch and one merge, where MLX has no fused kernel for the head size
/// ([`MLX_FUSED_MAX_HEAD`]) and the routes allow it: one query (a decode
/// step; causal is the same for it) unless the model option `attention`
/// is `mlx`, and up to `attention-per-query-max` queries (a verify, a
/// drafter's catch-up), each over its causal prefix when `causal`, in
/// place of `short_attention::per_query`'s launches per query. None
/// otherwise.
pub fn unmasked(q: &Array, k: &Array, v: &Array, scale: f32, causal: bool) -> Result<Option<Array>> {
    let &[_, _, l, d] = q.shape() else { return Ok(None) };
    let routes = crate::routes::current();
    if !(d > MLX_FUSED_MAX_HEAD && routes.decode_kernel && (l == 1 || l <= routes.per_query_max)) {
        return Ok(None);
    }
    let Some((hkv, t)) = dense_fits(q, k, v, None) else { return Ok(None) };
    let causal = [Template::Bool("CAUSAL", causal && l > 1)];
    launch(unmasked_kernel()?, q, (k, v), None, &[], (hkv, t, scale), &causal).map(Some)
}

/// As [`masked`], over a block pool read in place: `k` / `v` `[Hkv,
/// capacity * block, D]`, `flat` `[B, Hkv, nb]` each row's blocks as
/// `h * capacity + block` (kv-paged's gather indices), the row's key `t`
/// being slot `t % block` of its `t / block`-th block, and `mask` over
/// the `nb * block` keys of each row.
pub fn paged(
    q: &Array,
    k: &Array,
    v: &Array,
    flat: &Array,
    block: i32,
    scale: f32,
    mask: &Array,
) -> Result<Option<Array>> {
    let (&[b, ..], &[hkv, slots, kd], &[fb, fh, nb]) = (q.shape(), k.shape(), flat.shape()) else { return Ok(None) };
    let t = nb * block;
    let even = block > 0 && slots % block == 0 && fb == b && fh == hkv && v.shape()[..2] == k.shape()[..2];
    if !even || !fits(q, hkv, (kd, v.shape()[2]), t, Some(mask), k.dtype()) {
        return Ok(None);
    }
    launch(paged_kernel()?, q, (k, v), Some(mask), &[flat], (hkv, t, scale), &[Template::Int("BLOCK", block)]).map(Some)
}
