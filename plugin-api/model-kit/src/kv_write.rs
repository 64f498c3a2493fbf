//! New keys and values written into a cache layout's storage in place, on
//! the GPU: one launch for both, where `slice_update` is two and, while the
//! previous step still runs, a copy of the whole storage besides.
//!
//! Why the copy: MLX writes a slice update into its source's buffer only when
//! nothing else holds that buffer, and the CUDA backend holds every input of
//! a launched kernel until the kernel has run. A decode step is built and
//! launched while the previous one runs, so the previous step's attention
//! still holds the storage and MLX copies it, every layer and step (at the
//! Qwen3-8B shape and 640 tokens, 59 of 72 K/V writes a step did).
//!
//! The kernel writes through its input's pointer, which MLX's ops never do,
//! and MLX orders kernels only by the arrays they produce (its CUDA graphs
//! run kernels that share no produced array in any order). So the launch
//! also produces the queries of the attention about to read the storage (a
//! copy of them), and takes the previous write's as an input: every write
//! runs before the attention that reads it, and after the writes before it.
//! The caller (the layout, which owns the storage) keeps the rest safe:
//! - nothing that outlives the step may read the written columns (the
//!   layout lends views only of columns before the ones it writes, and
//!   falls back to `slice_update` otherwise);
//! - before any other op reads the storage, the last write is scheduled
//!   (`async_eval` of its mark), so that op lands in a later CUDA graph;
//! - readers of earlier steps were launched before it on the same stream,
//!   and read columns it does not touch.

use crate::cuda_kernel::{cached, Cached, CudaKernel, Launch};
use crate::ops::dtype_size;
use crate::{Array, Dtype, Result};
use std::cell::RefCell;

/// One thread per element of `k`, `v` (`[B, H, L, D]`, read strided), then
/// `q` (`[B, HQ, L, DQ]`), copied as raw words `W` of the element's size:
/// `k`/`v` into column `column[0] + l` of `ks` / `vs` (`[B', H, capacity,
/// D]`, strided, B' >= B), `q` into `qo` (row-major). `after` is only an
/// input (the previous write's `done`): it orders the launches.
pub(crate) const SOURCE: &str = r#"
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i == 0) done[0] = 1;
    const int B = k_shape[0], H = k_shape[1], L = k_shape[2], DK = k_shape[3], DV = v_shape[3];
    const int HQ = q_shape[1], DQ = q_shape[3];
    const size_t nk = (size_t)B * H * L * DK;
    const size_t nkv = nk + (size_t)B * H * L * DV;
    if (i >= nkv + (size_t)B * HQ * L * DQ) return;
    // Element j of a row-major [B, N, L, D] array as (b, n, l, d), and that
    // element's offset at position `l` in an array of strides `s`.
    struct At { int b, n, l, d; };
    const auto split = [](size_t j, int N, int L, int D) {
        const size_t r = j / D;
        return At{(int)(r / L / N), (int)(r / L % N), (int)(r % L), (int)(j % D)};
    };
    const auto offset = [](const At& a, const auto& s, int64_t l) {
        return a.b * s[0] + a.n * s[1] + l * s[2] + a.d * s[3];
    };
    if (i >= nkv) {
        const size_t j = i - nkv;
        const At a = split(j, HQ, L, DQ);
        reinterpret_cast<W*>(qo)[j] = reinterpret_cast<const W*>(q)[offset(a, q_strides, a.l)];
        return;
    }
    const bool is_k = i < nk;
    const At a = split(is_k ? i : i - nk, H, L, is_k ? DK : DV);
    const int64_t col = column[0] + a.l;
    if (is_k) {
        const_cast<W*>(reinterpret_cast<const W*>(ks))[offset(a, ks_strides, col)] =
            reinterpret_cast<const W*>(k)[offset(a, k_strides, a.l)];
    } else {
        const_cast<W*>(reinterpret_cast<const W*>(vs))[offset(a, vs_strides, col)] =
            reinterpret_cast<const W*>(v)[offset(a, v_strides, a.l)];
    }
"#;

const THREADS: i32 = 256;

/// The kernel copying elements of `bytes` bytes (1, 2 or 4).
fn kernel(bytes: usize) -> Result<&'static CudaKernel> {
    static CELLS: [Cached; 3] = [const { Cached::new() }; 3];
    let (slot, word) = match bytes {
        1 => (0, "unsigned char"),
        2 => (1, "unsigned short"),
        _ => (2, "unsigned int"),
    };
    cached(&CELLS[slot], || {
        let src = format!("using W = {word};\n{SOURCE}");
        let inputs = ["ks", "vs", "k", "v", "q", "column", "after"];
        CudaKernel::new(&format!("kv_write_{bytes}"), &inputs, &["qo", "done"], &src)
    })
}

/// `column` as a one-element array. Every layer of a step writes at the
/// same column, so the last one made is kept and shared: one upload a step
/// rather than one a layer.
fn column_array(column: usize) -> Array {
    thread_local! {
        static LAST: RefCell<Option<(usize, Array)>> = const { RefCell::new(None) };
    }
    LAST.with_borrow_mut(|last| match last {
        Some((c, a)) if *c == column => a.clone(),
        _ => {
            let a = Array::from_slice(&[column as i32], &[1]);
            *last = Some((column, a.clone()));
            a
        }
    })
}

/// What a write returns: the queries as the attention over the storage
/// must take them, and the mark the next write (or `async_eval`, before any
/// other reader) takes.
pub struct Written {
    pub queries: Array,
    pub done: Array,
}

/// Writes `k` / `v` (`[B, H, L, D]`) into columns `column .. column + L` of
/// the storage `ks` / `vs` (`[B', H, capacity, D]`, the same dtypes, B' >= B)
/// in place, after the write whose mark is `after`, with the queries `q`
/// (`[B, HQ, L, DQ]`, the same dtype) passed through; `None` where this
/// route does not apply (not a GPU, dtypes that differ or are 8 bytes wide,
/// shapes that do not fit), and the caller writes with `slice_update`.
pub fn write(
    (ks, vs): (&Array, &Array),
    (k, v, q): (&Array, &Array, &Array),
    column: usize,
    after: Option<&Array>,
) -> Result<Option<Written>> {
    let (kss, vss, kn, vn, qn) = (ks.shape(), vs.shape(), k.shape(), v.shape(), q.shape());
    let bytes = dtype_size(k.dtype());
    let fits = |store: &[i32], new: &[i32]| {
        store.len() == 4
            && new.len() == 4
            && new[0] <= store[0]
            && new[1] == store[1]
            && new[3] == store[3]
            && column + new[2] as usize <= store[2] as usize
    };
    if !crate::ops::on_gpu()
        || !matches!(bytes, 1 | 2 | 4)
        || [vs.dtype(), v.dtype(), ks.dtype(), q.dtype()].iter().any(|&d| d != k.dtype())
        || !fits(kss, kn)
        || !fits(vss, vn)
        || kn[..3] != vn[..3]
        || qn.len() != 4
        || (qn[0], qn[2]) != (kn[0], kn[2])
        || kn.iter().chain(vn).chain(qn).any(|&n| n == 0)
    {
        return Ok(None);
    }
    let count = |s: &[i32]| s.iter().map(|&n| i64::from(n)).product::<i64>();
    let elements = count(kn) + count(vn) + count(qn);
    let per = i64::from(THREADS);
    let Ok(threads) = i32::try_from((elements + per - 1) / per * per) else { return Ok(None) };
    let col = column_array(column);
    let out = kernel(bytes)?.apply(
        &[ks, vs, k, v, q, &col, after.unwrap_or(&col)],
        &Launch {
            grid: [threads, 1, 1],
            threads: [THREADS, 1, 1],
            outputs: &[(qn, q.dtype()), (&[1], Dtype::Uint32)],
            template: &[],
        },
    )?;
    let mut out = out.into_iter();
    match (out.next(), out.next()) {
        (Some(queries), Some(done)) => Ok(Some(Written { queries, done })),
        _ => Err(crate::error("kv_write: the kernel returned fewer than two outputs")),
    }
}
