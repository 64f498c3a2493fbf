//! A paged cache's exported state: per row, its sealed blocks' K/V as one
//! tensor pair with the blocks' keys in `meta`, then its last block's
//! tokens.
//!
//! `meta` = `[FORMAT, rows]`, then per row its length, its sealed block
//! count and each block's key (`nonce`, `serial`: two entries). `tensors`
//! = per row, `[1, H, n * block, D]` keys and values of its `n` sealed
//! blocks when it has some, then `[1, H, t, D]` of its last `t < block`
//! tokens when it has them. Each tensor is a gather of its own exact size
//! (lazy until used), so a state owns exactly its bytes, and an import
//! that finds every block alive never computes it.

use crate::pool::{Geometry, Pool};
use crate::registry::Key;
use crate::row::{slots, Row};
use model_kit::{error, Array, Result};
use plugin_api::abi_stable::std_types::RVec;
use plugin_api::Tensor;
use plugin_sdk::{into_array, into_tensor, mlx_rs};

const FORMAT: u64 = 2;

pub fn encode(pool: Option<&Pool>, rows: &[&Row]) -> Result<(RVec<Tensor>, RVec<u64>)> {
    let mut tensors = RVec::new();
    let mut meta: RVec<u64> = RVec::new();
    meta.push(FORMAT);
    meta.push(rows.len() as u64);
    for r in rows {
        let sealed = r.sealed();
        meta.push(r.len() as u64);
        meta.push(sealed.len() as u64);
        if r.len() == 0 {
            continue;
        }
        let pool = pool.ok_or_else(|| error("kv-paged: a row holds tokens without a pool"))?;
        let storage = pool.storage()?;
        let heads = pool.geometry.heads;
        if !sealed.is_empty() {
            for &b in sealed {
                let (nonce, serial) = pool.key(b).ok_or_else(|| error("kv-paged: a full block has no key"))?;
                meta.push(nonce);
                meta.push(serial);
            }
            let table: Vec<i32> = sealed.iter().map(|&b| b as i32).collect();
            let flat = storage.flat_table(&table, 1, heads)?;
            let (k, v) = storage.blocks(&flat, 1, sealed.len() as i32)?;
            tensors.push(into_tensor(k));
            tensors.push(into_tensor(v));
        }
        if let Some(t) = r.tail() {
            let (k, v) = storage.read(&slots(t, 0..r.tail_len(), pool.geometry.block))?;
            tensors.push(into_tensor(k));
            tensors.push(into_tensor(v));
        }
    }
    Ok((tensors, meta))
}

/// One row of a state, as read.
pub struct RowIn {
    pub len: usize,
    pub keys: Vec<Key>,
    /// `[1, H, n * block, D]` keys and values of the sealed blocks.
    pub sealed: Option<(Array, Array)>,
    /// `[1, H, t, D]` of the last block's tokens.
    pub tail: Option<(Array, Array)>,
}

fn check(a: &Array, g: &Geometry, dim: i32, tokens: usize) -> Result<()> {
    let s = a.shape();
    if s.len() == 4 && s[0] == 1 && s[1] == g.heads && s[3] == dim && s[2] as usize == tokens {
        Ok(())
    } else {
        Err(error(format!("kv-paged state: a tensor of shape {s:?} does not fit this cache")))
    }
}

/// Reads and checks a state's rows.
pub fn decode(tensors: RVec<Tensor>, meta: &[u64], g: &Geometry) -> Result<Vec<RowIn>> {
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
        let mut pair = |tokens: usize| -> Result<(Array, Array)> {
            let (k, v) = (t.next().ok_or_else(bad)?, t.next().ok_or_else(bad)?);
            check(&k, g, g.k_dim, tokens)?;
            check(&v, g, g.v_dim, tokens)?;
            Ok((k, v))
        };
        let mut keys = Vec::with_capacity(n);
        for _ in 0..n {
            keys.push((m.next().ok_or_else(bad)?, m.next().ok_or_else(bad)?));
        }
        let sealed = if n > 0 { Some(pair(n * g.block)?) } else { None };
        let rest = len - n * g.block;
        let tail = if rest > 0 { Some(pair(rest)?) } else { None };
        rows.push(RowIn { len, keys, sealed, tail });
    }
    if m.next().is_some() || t.next().is_some() {
        return Err(bad());
    }
    Ok(rows)
}

/// Rows of the pool made of read rows: every sealed block still held in
/// the pool is shared (one more reference), the rest are written in.
pub fn admit(pool: &mut Pool, rows: Vec<RowIn>) -> Result<Vec<Row>> {
    let block = pool.geometry.block;
    // The sources written are evaluated first (see `Storage::copy`): they
    // may be gathers of this very pool.
    let mut sources: Vec<Array> = Vec::new();
    let mut plans = Vec::with_capacity(rows.len());
    for r in &rows {
        let mut blocks = Vec::with_capacity(r.keys.len());
        let mut missing = Vec::new();
        for (j, &key) in r.keys.iter().enumerate() {
            match pool.adopt(key) {
                Some(b) => blocks.push(b),
                None => {
                    let dtype =
                        r.sealed.as_ref().map(|(k, _)| k.dtype()).ok_or_else(|| error("kv-paged: no tensor"))?;
                    let b = pool.alloc(dtype)?;
                    pool.register(b, key);
                    blocks.push(b);
                    missing.push(j);
                }
            }
        }
        if !missing.is_empty() {
            if let Some((k, v)) = &r.sealed {
                sources.extend([k.clone(), v.clone()]);
            }
        }
        let tail = match &r.tail {
            Some((k, v)) => {
                sources.extend([k.clone(), v.clone()]);
                Some(pool.alloc(k.dtype())?)
            }
            None => None,
        };
        plans.push((blocks, missing, tail));
    }
    mlx_rs::transforms::eval(sources.iter())?;
    let mut out = Vec::with_capacity(rows.len());
    for (r, (blocks, missing, tail)) in rows.into_iter().zip(plans) {
        if let Some((k, v)) = &r.sealed {
            let mut to = Vec::with_capacity(missing.len() * block);
            let mut from = Vec::with_capacity(missing.len() * block);
            for &j in &missing {
                to.extend(slots(blocks[j], 0..block, block));
                from.extend((j * block..(j + 1) * block).map(|x| x as i32));
            }
            let all = missing.len() == blocks.len();
            pool.storage_mut()?.put(&to, k, v, if all { None } else { Some(&from) })?;
        }
        let tail = match (tail, &r.tail) {
            (Some(b), Some((k, v))) => {
                let n = r.len % block;
                pool.storage_mut()?.put(&slots(b, 0..n, block), k, v, None)?;
                Some((b, n))
            }
            _ => None,
        };
        out.push(Row::from_parts(blocks, tail, block));
    }
    Ok(out)
}
