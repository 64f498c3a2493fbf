//! `PagedKv`: one layer's rows (block tables) and the `CacheLayout` methods.

use crate::pool::{self, Geometry, Shared};
use crate::registry;
use crate::row::Row;
use crate::state::{self, RowIn};
use crate::view;
use model_kit::ops::dtype_size;
use model_kit::{error, Array, Dtype, Result};
use plugin_api::abi_stable::std_types::{ROption, RSlice, RString, RVec};
use plugin_api::*;
use plugin_sdk::kv_need::{array_mask, implicit_mask, KvShape};
use plugin_sdk::{guard, guard_mlx, into_array, into_tensor, mlx_error, quietly, to_array};
use std::sync::atomic::Ordering;

pub struct PagedKv {
    rows: Vec<Row>,
    /// Padding tokens each row's next updates still carry at their front
    /// (`begin_padded`): consumed, never stored.
    pending: Vec<usize>,
    /// Where the rows' blocks live: made at the first write, or joined at
    /// an import while the cache holds nothing (`bind`).
    pool: Option<Shared>,
    geometry: Geometry,
    dtype: Dtype,
    /// Each row's length when the current speculative round began.
    mark: Option<Vec<usize>>,
    /// The last view's gather indices (`view::Table`).
    table: Option<view::Table>,
}

impl PagedKv {
    pub fn new(rows: usize, block: usize, heads: i32, k_dim: i32, v_dim: i32, dtype: Dtype) -> Self {
        pool::BLOCK_TOKENS.store(block as u64, Ordering::Relaxed);
        Self {
            rows: (0..rows).map(|_| Row::new(block)).collect(),
            pending: vec![0; rows],
            pool: None,
            geometry: Geometry { block, heads, k_dim, v_dim },
            dtype,
            mark: None,
            table: None,
        }
    }

    fn block(&self) -> usize {
        self.geometry.block
    }

    fn max_len(&self) -> usize {
        self.rows.iter().map(Row::len).max().unwrap_or(0)
    }

    fn sig(&self) -> RString {
        let g = &self.geometry;
        format!("kv:paged:b{}:{:?}:h{}:k{}:v{}", g.block, self.dtype, g.heads, g.k_dim, g.v_dim).to_lowercase().into()
    }

    fn pool(&mut self) -> Shared {
        self.pool.get_or_insert_with(|| pool::new(self.geometry)).clone()
    }

    /// Drops rows' references.
    fn release(&self, rows: Vec<Row>) {
        match &self.pool {
            Some(p) => {
                let mut p = pool::lock(p);
                rows.into_iter().for_each(|r| r.release(&mut p));
            }
            None => rows.into_iter().for_each(drop),
        }
    }

    /// A cache that holds no block joins the pool where a state's blocks
    /// live, so importing them shares them instead of copying.
    fn bind(&mut self, rows: &[RowIn]) {
        if self.rows.iter().any(|r| !r.blocks.is_empty()) {
            return;
        }
        for &key in rows.iter().flat_map(|r| r.keys.iter()) {
            let found: Option<Shared> = registry::find(key);
            if let Some(p) = found {
                if pool::lock(&p).geometry == self.geometry {
                    self.pool = Some(p);
                    return;
                }
            }
        }
    }

    fn store(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        let aligned = self.write(&k, &v)?;
        let shared = self.pool();
        let p = pool::lock(&shared);
        let dims = (self.geometry.k_dim, self.geometry.v_dim);
        view::gather(&self.rows, &p, aligned, &mut self.table, dims, k.dtype())
    }

    /// Writes a step's keys and values `[B, H, L, D]` into the rows'
    /// blocks; returns whether the rows were uneven before it (the view is
    /// then aligned by blocks, as the mask asked before it assumed).
    fn write(&mut self, k: &Array, v: &Array) -> Result<bool> {
        let (b, l) = (k.shape()[0] as usize, k.shape()[2] as usize);
        if b != self.rows.len() {
            return Err(error(format!("kv-paged: {b} rows given, cache holds {}", self.rows.len())));
        }
        let aligned = view::uneven(&self.rows, &self.pending);
        let shared = self.pool();
        let mut p = pool::lock(&shared);
        let skips: Vec<usize> = self.pending.iter().map(|&owed| owed.min(l)).collect();
        let need: usize = self.rows.iter().zip(&skips).map(|(r, &s)| r.blocks_for(l - s)).sum();
        if need > 0 {
            p.reserve(need, k.dtype())?;
        }
        let (mut slots, mut from) = (Vec::with_capacity(b * l), Vec::with_capacity(b * l));
        for (r, &skip) in skips.iter().enumerate() {
            self.pending[r] -= skip;
            slots.extend(self.rows[r].append(&mut p, l - skip, k.dtype())?);
            from.extend((r * l + skip) as i32..((r + 1) * l) as i32);
        }
        if !slots.is_empty() {
            let all = slots.len() == b * l;
            p.storage_mut()?.put(&slots, k, v, if all { None } else { Some(&from) })?;
        }
        Ok(aligned)
    }

    /// A decode step of uneven rows on the GPU (`CacheLayout::attend`):
    /// the new token stored, then attention read straight out of the pool
    /// through the block table (`decode_attention::paged`), so no view is
    /// gathered. Anything else (prompts, verifies, rows of one length, whose
    /// view is kv-plain's K/V exactly, the CPU) declines: the graph then
    /// stores and attends over the gathered view.
    fn attend_paged(&mut self, q: &Array, k: &Array, v: &Array, scale: f32, mask: &Array) -> Result<Option<Array>> {
        let l = k.shape()[2];
        if q.shape()[2] != 1 || l != 1 || !model_kit::ops::on_gpu() || !view::uneven(&self.rows, &self.pending) {
            return Ok(None);
        }
        let aligned = self.write(k, v)?;
        let shared = self.pool();
        let p = pool::lock(&shared);
        if let Some((flat, nb)) = view::flat_table(&self.rows, &p, aligned, &mut self.table)? {
            let storage = p.storage()?;
            let (keys, values) = storage.arrays();
            let flat = flat.reshape(&[self.rows.len() as i32, self.geometry.heads, nb as i32])?;
            let block = self.block() as i32;
            if let Some(out) = model_kit::decode_attention::paged(q, keys, values, &flat, block, scale, mask)? {
                return Ok(Some(out));
            }
        }
        // Stored already: attend over the gathered view instead.
        let dims = (self.geometry.k_dim, self.geometry.v_dim);
        let (keys, values) = view::gather(&self.rows, &p, aligned, &mut self.table, dims, k.dtype())?;
        let mask = model_kit::attention::Mask::Array(mask.clone());
        model_kit::attention::sdpa(q, &keys, &values, scale, &mask).map(Some)
    }

    fn export(&self, rows: &[&Row]) -> Result<CacheState> {
        let guard = self.pool.as_ref().map(pool::lock);
        let (tensors, meta) = state::encode(guard.as_deref(), rows)?;
        let offset = rows.iter().map(|r| r.len()).max().unwrap_or(0) as u64;
        Ok(CacheState { signature: self.sig(), offset, tensors, meta })
    }

    /// A state's rows, checked (nothing changes when it does not fit).
    fn read(&self, s: CacheState) -> Result<Vec<RowIn>> {
        if s.signature != self.sig() {
            return Err(error(format!("state of `{}` cannot be imported into `{}`", s.signature, self.sig())));
        }
        let meta = s.meta.to_vec();
        state::decode(s.tensors, &meta, &self.geometry)
    }

    /// Rows in this cache's pool made of read rows (`state::admit`).
    fn admit(&mut self, rows: Vec<RowIn>) -> Result<Vec<Row>> {
        self.bind(&rows);
        if rows.iter().all(|r| r.len == 0) {
            return Ok(rows.iter().map(|_| Row::new(self.block())).collect());
        }
        let shared = self.pool();
        let mut p = pool::lock(&shared);
        state::admit(&mut p, rows)
    }

    fn merge(&mut self, states: Vec<CacheState>) -> Result<()> {
        for s in states {
            let read = self.read(s)?;
            if read.len() != 1 {
                return Err(error("merge_rows takes 1-row states"));
            }
            let mut rows = self.admit(read)?;
            self.rows.append(&mut rows);
            self.pending.push(0);
            if let Some(m) = &mut self.mark {
                m.push(self.rows.last().map_or(0, Row::len));
            }
        }
        Ok(())
    }

    fn filter(&mut self, keep: &[u32]) -> Result<()> {
        if keep.iter().any(|&r| r as usize >= self.rows.len()) {
            return Err(error(format!("filter_rows: row out of range (rows = {})", self.rows.len())));
        }
        // Each kept row moves; a row kept twice is duplicated (its last
        // block copied: rows never share a block they write).
        let mut old: Vec<Option<Row>> = std::mem::take(&mut self.rows).into_iter().map(Some).collect();
        let mut moved_to = vec![None; old.len()];
        let mut rows: Vec<Row> = Vec::with_capacity(keep.len());
        for &r in keep {
            let r = r as usize;
            let row = match (old[r].take(), moved_to[r]) {
                (Some(row), _) => row,
                (None, Some(i)) => {
                    let p = self.pool.as_ref().ok_or_else(|| error("kv-paged: a row without a pool"))?;
                    let mut p = pool::lock(p);
                    let row: &Row = &rows[i];
                    row.duplicate(&mut p)?
                }
                (None, None) => unreachable!("a row is either still here or already moved"),
            };
            moved_to[r].get_or_insert(rows.len());
            rows.push(row);
        }
        self.release(old.into_iter().flatten().collect());
        self.rows = rows;
        self.pending = keep.iter().map(|&r| self.pending[r as usize]).collect();
        if let Some(m) = &self.mark {
            self.mark = Some(keep.iter().map(|&r| m[r as usize]).collect());
        }
        Ok(())
    }

    /// Trims row r to `to[r]` tokens.
    fn trim_rows(&mut self, to: impl Fn(usize, &Row) -> usize) -> Result<()> {
        let Some(p) = &self.pool else { return Ok(()) };
        let mut p = pool::lock(p);
        for (r, row) in self.rows.iter_mut().enumerate() {
            let n = to(r, row);
            row.trim_to(&mut p, n)?;
        }
        Ok(())
    }

    fn rollback(&mut self, keep: &[u64]) -> std::result::Result<(), PluginError> {
        let mark = self.mark.take().ok_or_else(|| PluginError::invalid_input("spec_rollback without spec_begin"))?;
        if keep.is_empty() || (keep.len() != 1 && keep.len() != self.rows.len()) {
            return Err(PluginError::invalid_input(format!(
                "spec_rollback: {} keep counts for {} rows",
                keep.len(),
                self.rows.len()
            )));
        }
        self.trim_rows(|r, row| {
            let appended = row.len().saturating_sub(mark[r]);
            mark[r] + (keep[if keep.len() == 1 { 0 } else { r }] as usize).min(appended)
        })
        .map_err(|e| PluginError::mlx(e.what()))
    }
}

impl Drop for PagedKv {
    fn drop(&mut self) {
        let rows = std::mem::take(&mut self.rows);
        self.release(rows);
    }
}

impl CacheLayout for PagedKv {
    fn signature(&self) -> RString {
        quietly(RString::new(), || self.sig())
    }

    fn offset(&self) -> u64 {
        quietly(0, || self.max_len() as u64)
    }

    fn positions(&self) -> PResult<Positions> {
        guard_mlx(|| {
            let per_row = if view::uneven(&self.rows, &self.pending) {
                let offs: Vec<i32> =
                    self.rows.iter().zip(&self.pending).map(|(r, &p)| r.len() as i32 - p as i32).collect();
                ROption::RSome(into_tensor(Array::from_slice(&offs, &[offs.len() as i32])))
            } else {
                ROption::RNone
            };
            Ok(Positions { offset: self.max_len() as u64, per_row })
        })
    }

    fn attention_mask(&self, queries: u32) -> PResult<AttentionMask> {
        guard_mlx(|| {
            let n = queries as usize;
            Ok(if view::uneven(&self.rows, &self.pending) {
                let lens = view::lengths_after(&self.rows, &self.pending, n);
                array_mask(view::mask(&lens, n, self.block())?)
            } else {
                implicit_mask(queries)
            })
        })
    }

    fn update_and_fetch(&mut self, keys: Tensor, values: Tensor) -> PResult<KvPair> {
        guard(|| {
            let (k, v) = (into_array(keys), into_array(values));
            let g = self.geometry;
            KvShape { heads: g.heads, k_dim: g.k_dim, v_dim: g.v_dim }.check("kv-paged", &k, &v)?;
            let (k, v) = self.store(k, v).map_err(mlx_error)?;
            Ok(KvPair { keys: into_tensor(k), values: into_tensor(v) })
        })
    }

    fn is_trimmable(&self) -> bool {
        true
    }

    fn trim(&mut self, n: u64) -> u64 {
        quietly(0, || {
            let n = (n as usize).min(self.max_len());
            match self.trim_rows(|_, row| row.len().saturating_sub(n)) {
                Ok(()) => n as u64,
                Err(_) => 0,
            }
        })
    }

    fn bytes_per_token(&self) -> u64 {
        let g = &self.geometry;
        (self.rows.len().max(1) * g.heads as usize * (g.k_dim + g.v_dim) as usize * dtype_size(self.dtype)) as u64
    }

    fn export_state(&self) -> PResult<CacheState> {
        guard_mlx(|| self.export(&self.rows.iter().collect::<Vec<_>>()))
    }

    fn import_state(&mut self, state: CacheState) -> PResult<()> {
        guard_mlx(|| {
            let read = self.read(state)?;
            let old = std::mem::take(&mut self.rows);
            self.release(old);
            self.mark = None;
            self.pending.clear();
            let rows = self.admit(read)?;
            self.pending = vec![0; rows.len()];
            self.rows = rows;
            Ok(())
        })
    }

    fn spec_begin(&mut self) -> PResult<()> {
        self.mark = Some(self.rows.iter().map(Row::len).collect());
        PResult::ROk(())
    }

    fn spec_commit(&mut self) -> PResult<()> {
        self.mark = None;
        PResult::ROk(())
    }

    fn spec_rollback(&mut self, keep: RSlice<'_, u64>) -> PResult<()> {
        guard(|| self.rollback(keep.as_slice()))
    }

    fn rows(&self) -> u32 {
        self.rows.len() as u32
    }

    fn filter_rows(&mut self, keep: RSlice<'_, u32>) -> PResult<()> {
        guard_mlx(|| self.filter(keep.as_slice()))
    }

    fn extract_row(&self, row: u32) -> PResult<CacheState> {
        guard(|| {
            let r = self.rows.get(row as usize).ok_or_else(|| {
                PluginError::invalid_input(format!("extract_row: row {row} out of range (rows = {})", self.rows.len()))
            })?;
            self.export(&[r]).map_err(|e| PluginError::mlx(e.what()))
        })
    }

    fn merge_rows(&mut self, rows: RVec<CacheState>) -> PResult<()> {
        guard_mlx(|| self.merge(rows.into_vec()))
    }

    fn get_slot(&self, _i: u32) -> PResult<ROption<Tensor>> {
        PResult::RErr(PluginError::unsupported("kv-paged has no recurrent slots"))
    }

    fn set_slot(&mut self, _i: u32, _value: Tensor) -> PResult<()> {
        PResult::RErr(PluginError::unsupported("kv-paged has no recurrent slots"))
    }

    fn begin_padded(&mut self, pads: RSlice<'_, u32>) -> PResult<()> {
        guard(|| {
            if self.max_len() > 0 {
                return Err(PluginError::invalid_input("kv-paged: begin_padded on a cache that holds tokens"));
            }
            let old = std::mem::take(&mut self.rows);
            self.release(old);
            self.rows = pads.iter().map(|_| Row::new(self.block())).collect();
            self.pending = pads.iter().map(|&p| p as usize).collect();
            self.mark = None;
            Ok(())
        })
    }

    fn attend(
        &mut self,
        queries: TensorRef<'_>,
        keys: TensorRef<'_>,
        values: TensorRef<'_>,
        scale: f32,
        mask: MaskRef<'_>,
    ) -> PResult<ROption<Tensor>> {
        guard_mlx(|| {
            let (MaskMode::ARRAY, ROption::RSome(m)) = (mask.mode, mask.array) else { return Ok(ROption::RNone) };
            let (q, k, v, m) = (to_array(queries), to_array(keys), to_array(values), to_array(m));
            Ok(match self.attend_paged(&q, &k, &v, scale, &m)? {
                Some(out) => ROption::RSome(into_tensor(out)),
                None => ROption::RNone,
            })
        })
    }

    fn pool_usage(&self) -> ROption<PoolUsage> {
        quietly(ROption::RNone, || ROption::RSome(pool::usage()))
    }
}
