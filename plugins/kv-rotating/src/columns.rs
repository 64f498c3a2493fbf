//! Array helpers along the token axis (axis 2 of `[B, H, n, D]`), with the
//! semantics of the Python and mlx ops that mlx-lm's caches use.

use model_kit::ops::{slice, zeros};
use model_kit::{Array, Result};
use plugin_sdk::mlx_rs;

/// Storage length (axis 2).
pub fn len(a: &Array) -> usize {
    a.shape()[2] as usize
}

/// `a[..., start:end, :]` with Python's clamping.
pub fn cols(a: &Array, start: usize, end: usize) -> Result<Array> {
    let s = a.shape();
    let n = s[2] as usize;
    let (start, end) = (start.min(n), end.min(n).max(start.min(n)));
    if start == 0 && end == n {
        return Ok(a.clone());
    }
    slice(a, &[0, 0, start as i32, 0], &[s[0], s[1], end as i32, s[3]])
}

/// Concatenation along axis 2. Python concatenates empty parts too (such
/// as `v[..., :keep]` with `keep = 0`); they add nothing, so they are left out.
pub fn cat(parts: Vec<Array>) -> Result<Array> {
    let parts: Vec<Array> = parts.into_iter().filter(|p| len(p) > 0).collect();
    mlx_rs::ops::concatenate(&parts, 2)
}

/// `a` rolled along axis 2 by `shift` (mlx `roll`: column j gets j - shift).
pub fn roll(a: &Array, shift: isize) -> Result<Array> {
    let n = len(a) as isize;
    let s = shift.rem_euclid(n.max(1)) as usize;
    if s == 0 {
        return Ok(a.clone());
    }
    let n = n as usize;
    cat(vec![cols(a, n - s, n)?, cols(a, 0, n - s)?])
}

/// Each row of `a` rolled right along axis 2 by `shifts[r]` (mlx-lm `dynamic_roll`).
pub fn roll_rows(a: &Array, shifts: &[usize]) -> Result<Array> {
    let s = a.shape();
    let n = s[2] as usize;
    let idx: Vec<i32> =
        shifts.iter().flat_map(|&d| (0..n).map(move |j| ((j + n - d % n.max(1)) % n.max(1)) as i32)).collect();
    let idx = Array::from_slice(&idx, &[s[0], 1, s[2], 1]);
    let idx = mlx_rs::ops::broadcast_to(&idx, s)?;
    a.take_along_axis(&idx, 2)
}

/// mlx-lm's growth step: `shape[2]` zero columns (`[B, H, n, D]`, in the
/// new keys' and values' dtypes) after the storage, or as the first storage.
pub fn grown(
    keys: Option<Array>,
    values: Option<Array>,
    shape: [i32; 3],
    k: (&Array, i32),
    v: (&Array, i32),
) -> Result<(Array, Array)> {
    let [b, h, n] = shape;
    let nk = zeros(&[b, h, n, k.1], k.0.dtype())?;
    let nv = zeros(&[b, h, n, v.1], v.0.dtype())?;
    match (keys, values) {
        (Some(ok), Some(ov)) => Ok((mlx_rs::ops::concatenate(&[ok, nk], 2)?, mlx_rs::ops::concatenate(&[ov, nv], 2)?)),
        _ => Ok((nk, nv)),
    }
}

/// Zeros `[rows, H, n, dim]` in `like`'s head count and dtype.
pub fn blank(like: &Array, rows: i32, n: usize, dim: i32) -> Result<Array> {
    zeros(&[rows, like.shape()[1], n as i32, dim], like.dtype())
}

/// Row r of `a` (axis 0).
pub fn row_of(a: &Array, r: usize) -> Result<Array> {
    let s = a.shape();
    slice(a, &[r as i32, 0, 0, 0], &[r as i32 + 1, s[1], s[2], s[3]])
}

/// `a` with `left` zero columns in front and `right` behind (mlx `pad`).
pub fn pad_cols(a: Array, left: usize, right: usize) -> Result<Array> {
    if left == 0 && right == 0 {
        return Ok(a);
    }
    let (b, dim) = (a.shape()[0], a.shape()[3]);
    let parts = vec![blank(&a, b, left, dim)?, a.clone(), blank(&a, b, right, dim)?];
    cat(parts)
}
