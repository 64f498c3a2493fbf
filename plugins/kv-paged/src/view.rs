//! What attention reads: every row's blocks gathered from the pool into one
//! `[B, H, W, D]` array by one `take` per layer, and the mask of that
//! geometry.
//!
//! Rows of equal length (nothing owed by `begin_padded`) are kv-plain's
//! geometry exactly: `W` = their length, no mask for one query, causal for
//! more, so a serial cache attends over the same K/V as kv-plain's.
//!
//! Rows that differ are aligned by whole blocks: row r's `nb_r` blocks are
//! preceded by `nb_max - nb_r` padding entries (any block: they are
//! masked), so its tokens start at column `s_r = (nb_max - nb_r) * block`
//! and the unused end of its last block follows them (masked too). Token-
//! exact left padding would need a per-token gather index (B x T integers
//! per layer and step); blocks keep the index at B x nb. RoPE positions
//! are per row token counts either way, kv-plain's: a row still owed
//! padding by `begin_padded` takes it from the front of its next update
//! without storing it, and its position counts it negatively.

use crate::pool::Pool;
use crate::row::Row;
use model_kit::ops::{slice, zeros};
use model_kit::{Array, Dtype, Result};

/// Rows' lengths after `queries` more tokens, each row first consuming
/// what it is still owed of padding.
pub fn lengths_after(rows: &[Row], pending: &[usize], queries: usize) -> Vec<usize> {
    rows.iter().zip(pending).map(|(r, &p)| r.len() + queries.saturating_sub(p)).collect()
}

/// Whether rows differ (lengths or padding owed): then positions are per
/// row, masks explicit and the view aligned by blocks.
pub fn uneven(rows: &[Row], pending: &[usize]) -> bool {
    pending.iter().any(|&p| p > 0) || rows.windows(2).any(|w| w[0].len() != w[1].len())
}

/// Blocks per row in the aligned view of rows of these lengths (at least
/// one, so a view is never empty).
pub fn aligned_blocks(lens: &[usize], block: usize) -> usize {
    lens.iter().map(|l| l.div_ceil(block)).max().unwrap_or(0).max(1)
}

/// The mask of the aligned view after `queries` more tokens, `[B, 1, n,
/// W]`: query i of row r sees columns `s_r ..= s_r + len_r - n + i`.
pub fn mask(lens: &[usize], queries: usize, block: usize) -> Result<Array> {
    let nb = aligned_blocks(lens, block);
    let w = (nb * block) as i32;
    let n = queries as i32;
    let starts: Vec<i32> = lens.iter().map(|&l| ((nb - l.div_ceil(block)) * block) as i32).collect();
    let lasts: Vec<i32> = starts.iter().zip(lens).map(|(&s, &l)| s + l as i32 - n).collect();
    let b = lens.len() as i32;
    let starts = Array::from_slice(&starts, &[b, 1, 1, 1]);
    let lasts = Array::from_slice(&lasts, &[b, 1, 1, 1]);
    let cols = Array::arange::<_, i32>(0, w, 1)?;
    let queries = Array::arange::<_, i32>(0, n, 1)?.reshape(&[n, 1])?;
    cols.ge(&starts)?.logical_and(cols.subtract(&queries)?.le(&lasts)?)
}

/// The block table of the view, `[B, nb]` row-major, and `nb`: each row's
/// blocks, after padding entries when rows are aligned.
fn table(rows: &[Row], aligned: bool, block: usize) -> (Vec<i32>, usize) {
    let nb = if aligned {
        aligned_blocks(&rows.iter().map(Row::len).collect::<Vec<_>>(), block)
    } else {
        rows.first().map_or(0, |r| r.blocks.len())
    };
    let mut t = Vec::with_capacity(rows.len() * nb);
    for r in rows {
        let pad = nb - r.blocks.len();
        // Padding reads block 0 (present whenever anything is stored);
        // the mask hides it.
        t.extend(std::iter::repeat_n(0, pad));
        t.extend(r.blocks.iter().map(|&b| b as i32));
    }
    (t, nb)
}

/// The last view's block table, the pool capacity it was built for, and
/// its gather indices on the device: a table changes only when a row
/// enters a new block, so most steps upload nothing.
pub type Table = (Vec<i32>, usize, Array);

/// The view's gather indices (`Storage::flat_table`, `[B * H * nb]`) and
/// `nb`, or None when the pool holds nothing to read.
pub fn flat_table(
    rows: &[Row],
    pool: &Pool,
    aligned: bool,
    cached: &mut Option<Table>,
) -> Result<Option<(Array, usize)>> {
    let (table, nb) = table(rows, aligned, pool.geometry.block);
    let storage = match pool.storage() {
        Ok(s) if nb > 0 => s,
        _ => return Ok(None),
    };
    let cap = storage.capacity();
    let flat = match cached {
        Some((t, c, a)) if *t == table && *c == cap => a.clone(),
        _ => {
            let a = storage.flat_table(&table, rows.len(), pool.geometry.heads)?;
            *cached = Some((table, cap, a.clone()));
            a
        }
    };
    Ok(Some((flat, nb)))
}

/// Everything the rows hold, `[B, H, W, D]` keys and values: one gather
/// per array, cut to the rows' length when they are even.
pub fn gather(
    rows: &[Row],
    pool: &Pool,
    aligned: bool,
    cached: &mut Option<Table>,
    dims: (i32, i32),
    dtype: Dtype,
) -> Result<(Array, Array)> {
    let g = pool.geometry;
    let Some((flat, nb)) = flat_table(rows, pool, aligned, cached)? else {
        let nb = table(rows, aligned, g.block).1;
        return zeros_view(rows.len(), if aligned { nb * g.block } else { 0 }, g.heads, dims, dtype);
    };
    let (k, v) = pool.storage()?.blocks(&flat, rows.len() as i32, nb as i32)?;
    let len = rows[0].len() as i32;
    if aligned || len == (nb * g.block) as i32 {
        return Ok((k, v));
    }
    let cut = |a: &Array| {
        let s = a.shape();
        slice(a, &[0, 0, 0, 0], &[s[0], s[1], len, s[3]])
    };
    Ok((cut(&k)?, cut(&v)?))
}

/// A view of zeros `[B, H, w, D]`, for rows when the pool holds nothing.
fn zeros_view(rows: usize, w: usize, heads: i32, dims: (i32, i32), dtype: Dtype) -> Result<(Array, Array)> {
    let (b, w) = (rows as i32, w as i32);
    Ok((zeros(&[b, heads, w, dims.0], dtype)?, zeros(&[b, heads, w, dims.1], dtype)?))
}
