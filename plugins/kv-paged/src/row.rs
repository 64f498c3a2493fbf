//! One row's block table: the sealed blocks it refers to (shared or its
//! own) and its tail, the partly filled last block, which is private.
//!
//! Appending never writes a block: new tokens join the tail (a fresh array
//! each time, at most `block - 1` tokens copied), and every `block` tokens
//! the tail is sealed into a pool block. Trimming back into a sealed block
//! drops the reference and copies the kept part of it into a new tail:
//! copy-on-write, so a block shared with other rows or the prefix cache is
//! never changed under them.

use crate::pool::{self, Block};
use model_kit::ops::slice;
use model_kit::{Array, Result};
use plugin_sdk::mlx_rs;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub struct Row {
    pub blocks: Vec<Arc<Block>>,
    /// `[1, H, t, D]` keys and values of the last `t < block` tokens.
    tail: Option<(Array, Array)>,
    tail_len: usize,
    block: usize,
}

/// `a[:, :, from:to, :]` of a `[1, H, T, D]` array.
fn columns(a: &Array, from: usize, to: usize) -> Result<Array> {
    let s = a.shape();
    slice(a, &[0, 0, from as i32, 0], &[s[0], s[1], to as i32, s[3]])
}

/// A buffer of its own for `a` (a block or tail must not keep a larger
/// source alive: MLX shares a row-contiguous source only when it is at most
/// 16 KiB larger).
fn own(a: Array) -> Result<Array> {
    a.contiguous()
}

impl Row {
    pub fn new(block: usize) -> Self {
        Self { blocks: Vec::new(), tail: None, tail_len: 0, block }
    }

    /// A row of `blocks` and a tail of `tail.0`'s columns.
    pub fn from_parts(blocks: Vec<Arc<Block>>, tail: Option<(Array, Array)>, block: usize) -> Self {
        let mut r = Self::new(block);
        r.blocks = blocks;
        r.set_tail(tail);
        r
    }

    pub fn len(&self) -> usize {
        self.blocks.len() * self.block + self.tail_len
    }

    pub fn tail(&self) -> Option<&(Array, Array)> {
        self.tail.as_ref()
    }

    fn set_tail(&mut self, tail: Option<(Array, Array)>) {
        let n = tail.as_ref().map_or(0, |(k, _)| k.shape()[2] as usize);
        pool::TAIL_TOKENS.fetch_sub(self.tail_len as u64, Ordering::Relaxed);
        pool::TAIL_TOKENS.fetch_add(n as u64, Ordering::Relaxed);
        self.tail = tail;
        self.tail_len = n;
    }

    /// Appends `[1, H, L, D]` keys and values.
    pub fn append(&mut self, k: Array, v: Array) -> Result<()> {
        let n = k.shape()[2] as usize;
        if n == 0 {
            return Ok(());
        }
        let (k, v) = match self.tail.take() {
            Some((tk, tv)) => (mlx_rs::ops::concatenate(&[tk, k], 2)?, mlx_rs::ops::concatenate(&[tv, v], 2)?),
            None => (k, v),
        };
        let total = self.tail_len + n;
        pool::TAIL_TOKENS.fetch_sub(self.tail_len as u64, Ordering::Relaxed);
        self.tail_len = 0;
        let full = total / self.block;
        for i in 0..full {
            let (a, b) = (i * self.block, (i + 1) * self.block);
            self.blocks.push(pool::seal(own(columns(&k, a, b)?)?, own(columns(&v, a, b)?)?));
        }
        let sealed = full * self.block;
        let tail = match (sealed, total) {
            (_, t) if t == sealed => None,
            (0, _) => Some((k, v)),
            (s, t) => Some((own(columns(&k, s, t)?)?, own(columns(&v, s, t)?)?)),
        };
        self.set_tail(tail);
        Ok(())
    }

    /// Keeps the first `len` tokens.
    pub fn trim_to(&mut self, len: usize) -> Result<()> {
        if len >= self.len() {
            return Ok(());
        }
        let sealed = self.blocks.len() * self.block;
        if len >= sealed {
            let t = self.tail.take().map(|(k, v)| -> Result<_> {
                Ok((own(columns(&k, 0, len - sealed)?)?, own(columns(&v, 0, len - sealed)?)?))
            });
            self.set_tail(if len > sealed { t.transpose()? } else { None });
            return Ok(());
        }
        let (n, rem) = (len / self.block, len % self.block);
        let cut = self.blocks[n].clone();
        self.blocks.truncate(n);
        let tail =
            if rem > 0 { Some((own(columns(&cut.keys, 0, rem)?)?, own(columns(&cut.values, 0, rem)?)?)) } else { None };
        self.set_tail(tail);
        Ok(())
    }

    /// Everything stored, in order, as pieces to concatenate: `pad` zero
    /// columns first (left padding), then the blocks, then the tail.
    pub fn pieces(&self, pad: Option<(&Array, &Array)>) -> (Vec<Array>, Vec<Array>) {
        let mut ks = Vec::with_capacity(self.blocks.len() + 2);
        let mut vs = Vec::with_capacity(self.blocks.len() + 2);
        if let Some((k, v)) = pad {
            ks.push(k.clone());
            vs.push(v.clone());
        }
        for b in &self.blocks {
            ks.push(b.keys.clone());
            vs.push(b.values.clone());
        }
        if let Some((k, v)) = &self.tail {
            ks.push(k.clone());
            vs.push(v.clone());
        }
        (ks, vs)
    }
}

impl Clone for Row {
    fn clone(&self) -> Self {
        Self::from_parts(self.blocks.clone(), self.tail.clone(), self.block)
    }
}

impl Drop for Row {
    fn drop(&mut self) {
        pool::TAIL_TOKENS.fetch_sub(self.tail_len as u64, Ordering::Relaxed);
    }
}
