//! What attention reads: every row's blocks gathered into one contiguous
//! `[B, H, W, D]` array, shorter rows left-padded with zeros, and the
//! positions and masks of that geometry.
//!
//! The geometry is kv-plain's for the same rows: width = the longest row
//! (at least the queries), row r's first `W - len_r` columns are padding,
//! a row still owed `pad` padding tokens by `begin_padded` (a cohort) takes
//! them from the front of its next update without storing them, and its
//! RoPE position counts them negatively, as kv-plain's left-padded buffer
//! does. So the same K/V meet the same mask in the same columns.

use crate::row::Row;
use model_kit::ops::zeros;
use model_kit::{Array, Dtype, Result};
use plugin_sdk::mlx_rs;

/// Rows' lengths after `queries` more tokens, each row first consuming
/// what it is still owed of padding.
pub fn lengths_after(rows: &[Row], pending: &[usize], queries: usize) -> Vec<usize> {
    rows.iter().zip(pending).map(|(r, &p)| r.len() + queries.saturating_sub(p)).collect()
}

/// Whether rows differ (lengths or padding owed): then positions are per
/// row and masks explicit.
pub fn uneven(rows: &[Row], pending: &[usize]) -> bool {
    pending.iter().any(|&p| p > 0) || rows.windows(2).any(|w| w[0].len() != w[1].len())
}

/// The view's width for these lengths and queries.
pub fn width(lens: &[usize], queries: usize) -> usize {
    lens.iter().copied().max().unwrap_or(0).max(queries)
}

/// kv-plain's causal mask with left padding, `[B, 1, n, W]`.
pub fn mask(lens: &[usize], queries: usize) -> Result<Array> {
    let w = width(lens, queries) as i32;
    let n = queries as i32;
    let cols = Array::arange::<_, i32>(0, w, 1)?;
    let rows = Array::arange::<_, i32>(w - n, w, 1)?.reshape(&[n, 1])?;
    let causal = rows.ge(&cols)?;
    let pads: Vec<i32> = lens.iter().map(|&l| w - l as i32).collect();
    let pads = Array::from_slice(&pads, &[lens.len() as i32, 1, 1, 1]);
    causal.logical_and(cols.ge(&pads)?)
}

/// Everything stored, `[B, H, w, D]` keys and values (`w` at least the
/// longest row; `width`).
pub fn gather(rows: &[Row], w: usize, heads: i32, dims: (i32, i32), dtype: Dtype) -> Result<(Array, Array)> {
    let mut ks = Vec::with_capacity(rows.len());
    let mut vs = Vec::with_capacity(rows.len());
    for r in rows {
        let pad = w - r.len();
        let zeros_kv = if pad > 0 {
            Some((zeros(&[1, heads, pad as i32, dims.0], dtype)?, zeros(&[1, heads, pad as i32, dims.1], dtype)?))
        } else {
            None
        };
        let (mut k, mut v) = r.pieces(zeros_kv.as_ref().map(|(k, v)| (k, v)));
        if k.len() == 1 {
            ks.push(k.pop().unwrap());
            vs.push(v.pop().unwrap());
        } else {
            ks.push(mlx_rs::ops::concatenate(&k, 2)?);
            vs.push(mlx_rs::ops::concatenate(&v, 2)?);
        }
    }
    if ks.len() == 1 {
        return Ok((ks.pop().unwrap(), vs.pop().unwrap()));
    }
    Ok((mlx_rs::ops::concatenate(&ks, 0)?, mlx_rs::ops::concatenate(&vs, 0)?))
}
