//! A cache's state for export and import (prefix cache entries, rows
//! moved between batches): the attended window of K and V, its length, each
//! row's left padding, and the signature a state must match to be loaded.

use super::*;

impl PlainKv {
    pub(crate) fn state(&self) -> Result<CacheState> {
        self.settle()?;
        if self.holes.any() {
            return self.compacted()?.state();
        }
        let mut tensors = RVec::new();
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            tensors.push(into_tensor(self.window(k)?));
            tensors.push(into_tensor(self.window(v)?));
            self.lend(self.idx);
        }
        let mut meta: RVec<u64> = RVec::new();
        meta.push(self.len() as u64);
        meta.extend(self.left_pad.iter().map(|&p| (p - self.base) as u64));
        Ok(CacheState { signature: self.signature(), offset: self.len() as u64, tensors, meta })
    }

    /// This cache with its holes squeezed out, for export: a copy whose
    /// storage is gathered from this one's (which lends the columns read).
    fn compacted(&self) -> Result<Self> {
        self.lend(self.idx);
        let mut copy = PlainKv {
            keys: self.keys.clone(),
            values: self.values.clone(),
            idx: self.idx,
            base: self.base,
            left_pad: self.left_pad.clone(),
            holes: self.holes.clone(),
            ..self.emptied(0)
        };
        copy.compact()?;
        Ok(copy)
    }

    pub(crate) fn load(&mut self, state: CacheState) -> Result<()> {
        if state.signature != self.signature() {
            return Err(error(format!(
                "state of `{}` cannot be imported into `{}`",
                state.signature,
                self.signature()
            )));
        }
        let meta: Vec<usize> = state.meta.iter().map(|&m| m as usize).collect();
        let mut t = state.tensors.into_iter();
        match (t.next(), t.next()) {
            (Some(k), Some(v)) => {
                let (k, v) = (into_array(k), into_array(v));
                let rows = k.shape()[0] as usize;
                if meta.len() != 1 + rows || meta[0] != k.shape()[2] as usize {
                    return Err(error("kv-plain state: metadata does not match its tensors"));
                }
                self.keys = Some(k);
                self.values = Some(v);
                // The exporter's storage, or views of it.
                self.lent_upto.set(usize::MAX);
                self.idx = meta[0];
                self.base = 0;
                self.left_pad = meta[1..].to_vec();
                self.holes = Holes::none(rows);
            }
            _ => {
                self.keys = None;
                self.values = None;
                self.idx = 0;
                self.base = 0;
                self.left_pad = vec![0; meta.len().saturating_sub(1).max(1)];
                self.holes = Holes::none(self.left_pad.len());
            }
        }
        self.marks.clear();
        Ok(())
    }

    pub(crate) fn signature(&self) -> RString {
        format!("kv:plain:{:?}:h{}:k{}:v{}", self.dtype, self.heads, self.k_dim, self.v_dim).to_lowercase().into()
    }
}
