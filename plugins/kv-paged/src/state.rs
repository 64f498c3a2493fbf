//! A paged cache's exported state: each row's blocks as tensors (the
//! blocks' own arrays: exporting copies nothing) with their pool keys in
//! `meta`, then its tail.
//!
//! `meta` = `[FORMAT, rows]`, then per row its length, its block count
//! and each block's key (`nonce`, `serial`: two entries). `tensors` = per
//! row, each block's keys and values, then the tail's when it has tokens.

use crate::pool::{self, Key};
use crate::row::Row;
use model_kit::{error, Array, Result};
use plugin_api::abi_stable::std_types::RVec;
use plugin_api::Tensor;
use plugin_sdk::{into_array, into_tensor};

const FORMAT: u64 = 1;

/// What a state must match besides its signature.
pub struct Geometry {
    pub block: usize,
    pub heads: i32,
    pub k_dim: i32,
    pub v_dim: i32,
}

pub fn encode(rows: &[&Row]) -> (RVec<Tensor>, RVec<u64>) {
    let mut tensors = RVec::new();
    let mut meta: RVec<u64> = RVec::new();
    meta.push(FORMAT);
    meta.push(rows.len() as u64);
    for r in rows {
        meta.push(r.len() as u64);
        meta.push(r.blocks.len() as u64);
        for b in &r.blocks {
            meta.push(b.key.0);
            meta.push(b.key.1);
            tensors.push(into_tensor(b.keys.clone()));
            tensors.push(into_tensor(b.values.clone()));
        }
        if let Some((k, v)) = r.tail() {
            tensors.push(into_tensor(k.clone()));
            tensors.push(into_tensor(v.clone()));
        }
    }
    (tensors, meta)
}

fn check(a: &Array, g: &Geometry, dim: i32, tokens: Option<usize>) -> Result<()> {
    let s = a.shape();
    let ok = s.len() == 4
        && s[0] == 1
        && s[1] == g.heads
        && s[3] == dim
        && tokens.is_none_or(|t| s[2] as usize == t)
        && (1..=g.block).contains(&(s[2] as usize));
    if ok {
        Ok(())
    } else {
        Err(error(format!("kv-paged state: a tensor of shape {s:?} does not fit this cache")))
    }
}

/// The rows of a state, sharing every block still alive in the pool.
pub fn decode(tensors: RVec<Tensor>, meta: &[u64], g: &Geometry) -> Result<Vec<Row>> {
    let bad = || error("kv-paged state: metadata does not match its tensors");
    if meta.len() < 2 || meta[0] != FORMAT {
        return Err(bad());
    }
    let mut t = tensors.into_iter().map(into_array);
    let mut m = meta[2..].iter().copied();
    let mut rows = Vec::new();
    for _ in 0..meta[1] {
        let (len, n) = (m.next().ok_or_else(bad)? as usize, m.next().ok_or_else(bad)? as usize);
        if n * g.block > len || len - n * g.block >= g.block {
            return Err(bad());
        }
        let mut blocks = Vec::with_capacity(n);
        for _ in 0..n {
            let key: Key = (m.next().ok_or_else(bad)?, m.next().ok_or_else(bad)?);
            let (k, v) = (t.next().ok_or_else(bad)?, t.next().ok_or_else(bad)?);
            check(&k, g, g.k_dim, Some(g.block))?;
            check(&v, g, g.v_dim, Some(g.block))?;
            blocks.push(pool::adopt(key, k, v));
        }
        let rest = len - n * g.block;
        let tail = if rest > 0 {
            let (k, v) = (t.next().ok_or_else(bad)?, t.next().ok_or_else(bad)?);
            check(&k, g, g.k_dim, Some(rest))?;
            check(&v, g, g.v_dim, Some(rest))?;
            Some((k, v))
        } else {
            None
        };
        rows.push(Row::from_parts(blocks, tail, g.block));
    }
    if m.next().is_some() || t.next().is_some() {
        return Err(bad());
    }
    Ok(rows)
}
