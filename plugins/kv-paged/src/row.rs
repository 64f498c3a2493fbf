//! One row's block table: the blocks holding its tokens, in order, in its
//! cache's pool. Full blocks are sealed and may be shared; a partly filled
//! last block is the row's own and takes new tokens in place.
//!
//! Trimming back into a sealed block keeps it when the row is its only
//! holder (unsealed: it becomes the row's last block again) and otherwise
//! copies the kept part into a block of the row's own: copy-on-write, so a
//! block shared with other rows is never changed under them.
//!
//! A row holds references in its pool, so it is released explicitly
//! (`release`) by the cache that owns it, with that pool at hand.

use crate::pool::{Pool, TAIL_TOKENS};
use model_kit::{Dtype, Result};
use std::sync::atomic::Ordering;

/// The slots of tokens `range` of block `b`.
pub fn slots(b: u32, range: std::ops::Range<usize>, block: usize) -> Vec<i32> {
    range.map(|o| (b as usize * block + o) as i32).collect()
}

pub struct Row {
    pub blocks: Vec<u32>,
    len: usize,
    block: usize,
}

impl Row {
    pub fn new(block: usize) -> Self {
        Self { blocks: Vec::new(), len: 0, block }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Tokens in the row's private last block.
    pub fn tail_len(&self) -> usize {
        self.len % self.block
    }

    /// The sealed (full) blocks.
    pub fn sealed(&self) -> &[u32] {
        &self.blocks[..self.len / self.block]
    }

    /// The private last block, if partly filled.
    pub fn tail(&self) -> Option<u32> {
        (self.tail_len() > 0).then(|| self.blocks[self.blocks.len() - 1])
    }

    fn set_len(&mut self, len: usize) {
        TAIL_TOKENS.fetch_sub(self.tail_len() as u64, Ordering::Relaxed);
        self.len = len;
        TAIL_TOKENS.fetch_add(self.tail_len() as u64, Ordering::Relaxed);
    }

    /// Blocks `n` more tokens will need beyond those held.
    pub fn blocks_for(&self, n: usize) -> usize {
        (self.len + n).div_ceil(self.block) - self.blocks.len()
    }

    /// Makes room for `n` more tokens and returns their slots, sealing
    /// every block they fill. (The caller writes the slots.)
    pub fn append(&mut self, pool: &mut Pool, n: usize, dtype: Dtype) -> Result<Vec<i32>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let off = self.len % self.block;
            if off == 0 {
                self.blocks.push(pool.alloc(dtype)?);
            }
            let b = self.blocks[self.blocks.len() - 1];
            out.push((b as usize * self.block + off) as i32);
            self.set_len(self.len + 1);
            if self.len.is_multiple_of(self.block) {
                pool.seal(b);
            }
        }
        Ok(out)
    }

    /// Takes `blocks` (sealed, already referenced) and a private last block
    /// holding `tail` tokens.
    pub fn from_parts(blocks: Vec<u32>, tail: Option<(u32, usize)>, block: usize) -> Self {
        let mut r = Self::new(block);
        let len = blocks.len() * block + tail.map_or(0, |(_, n)| n);
        r.blocks = blocks;
        r.blocks.extend(tail.map(|(b, _)| b));
        r.set_len(len);
        r
    }

    /// Keeps the first `len` tokens.
    pub fn trim_to(&mut self, pool: &mut Pool, len: usize) -> Result<()> {
        if len >= self.len {
            return Ok(());
        }
        let keep = len.div_ceil(self.block);
        for b in self.blocks.drain(keep..) {
            pool.release(b);
        }
        let rem = len % self.block;
        if rem > 0 {
            let last = self.blocks[keep - 1];
            if pool.refs(last) == 1 {
                pool.unseal(last);
            } else {
                let own = pool.alloc(pool.storage()?.dtype())?;
                pool.storage_mut()?.copy(&slots(last, 0..rem, self.block), &slots(own, 0..rem, self.block))?;
                pool.release(last);
                self.blocks[keep - 1] = own;
            }
        }
        self.set_len(len);
        Ok(())
    }

    /// Another row of the same tokens: the sealed blocks shared, the
    /// private last block copied.
    pub fn duplicate(&self, pool: &mut Pool) -> Result<Row> {
        let sealed = self.sealed().to_vec();
        for &b in &sealed {
            pool.retain(b);
        }
        let tail = match self.tail() {
            Some(t) => {
                let own = pool.alloc(pool.storage()?.dtype())?;
                let n = self.tail_len();
                pool.storage_mut()?.copy(&slots(t, 0..n, self.block), &slots(own, 0..n, self.block))?;
                Some((own, n))
            }
            None => None,
        };
        Ok(Row::from_parts(sealed, tail, self.block))
    }

    /// Drops the row's references.
    pub fn release(mut self, pool: &mut Pool) {
        for b in std::mem::take(&mut self.blocks) {
            pool.release(b);
        }
        self.set_len(0);
    }
}
