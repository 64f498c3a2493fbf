//! `PagedKv`: one layer's rows (block tables) and the `CacheLayout` methods.

use crate::pool;
use crate::row::Row;
use crate::state::{self, Geometry};
use crate::view;
use model_kit::ops::{dtype_size, slice};
use model_kit::{error, Array, Dtype, Result};
use plugin_api::abi_stable::std_types::{ROption, RSlice, RString, RVec};
use plugin_api::*;
use plugin_sdk::{guard, guard_mlx, into_array, into_tensor, quietly};
use std::sync::atomic::Ordering;

pub struct PagedKv {
    rows: Vec<Row>,
    /// Padding tokens each row's next updates still carry at their front
    /// (`begin_padded`): consumed, never stored.
    pending: Vec<usize>,
    block: usize,
    heads: i32,
    k_dim: i32,
    v_dim: i32,
    dtype: Dtype,
    /// Each row's length when the current speculative round began.
    mark: Option<Vec<usize>>,
}

impl PagedKv {
    pub fn new(rows: usize, block: usize, heads: i32, k_dim: i32, v_dim: i32, dtype: Dtype) -> Self {
        pool::BLOCK_TOKENS.store(block as u64, Ordering::Relaxed);
        Self {
            rows: (0..rows).map(|_| Row::new(block)).collect(),
            pending: vec![0; rows],
            block,
            heads,
            k_dim,
            v_dim,
            dtype,
            mark: None,
        }
    }

    fn geometry(&self) -> Geometry {
        Geometry { block: self.block, heads: self.heads, k_dim: self.k_dim, v_dim: self.v_dim }
    }

    fn max_len(&self) -> usize {
        self.rows.iter().map(Row::len).max().unwrap_or(0)
    }

    fn sig(&self) -> RString {
        format!("kv:paged:b{}:{:?}:h{}:k{}:v{}", self.block, self.dtype, self.heads, self.k_dim, self.v_dim)
            .to_lowercase()
            .into()
    }

    fn store(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        let (b, l) = (k.shape()[0] as usize, k.shape()[2] as usize);
        if b != self.rows.len() {
            return Err(error(format!("kv-paged: {b} rows given, cache holds {}", self.rows.len())));
        }
        let width = view::width(&view::lengths_after(&self.rows, &self.pending, l), l);
        for r in 0..b {
            let skip = self.pending[r].min(l);
            self.pending[r] -= skip;
            if skip == l {
                continue;
            }
            let (rk, rv) = if b == 1 && skip == 0 {
                (k.clone(), v.clone())
            } else {
                let (sk, sv) = (k.shape(), v.shape());
                let (r0, r1, s) = (r as i32, r as i32 + 1, skip as i32);
                (
                    slice(&k, &[r0, 0, s, 0], &[r1, sk[1], sk[2], sk[3]])?,
                    slice(&v, &[r0, 0, s, 0], &[r1, sv[1], sv[2], sv[3]])?,
                )
            };
            self.rows[r].append(rk, rv)?;
        }
        view::gather(&self.rows, width, self.heads, (self.k_dim, self.v_dim), k.dtype())
    }

    fn export(&self, rows: &[&Row]) -> CacheState {
        let (tensors, meta) = state::encode(rows);
        let offset = rows.iter().map(|r| r.len()).max().unwrap_or(0) as u64;
        CacheState { signature: self.sig(), offset, tensors, meta }
    }

    fn import(&self, s: CacheState) -> Result<Vec<Row>> {
        if s.signature != self.sig() {
            return Err(error(format!("state of `{}` cannot be imported into `{}`", s.signature, self.sig())));
        }
        let meta = s.meta.to_vec();
        state::decode(s.tensors, &meta, &self.geometry())
    }

    fn merge(&mut self, states: Vec<CacheState>) -> Result<()> {
        for s in states {
            let mut rows = self.import(s)?;
            if rows.len() != 1 {
                return Err(error("merge_rows takes 1-row states"));
            }
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
        self.rows = keep.iter().map(|&r| self.rows[r as usize].clone()).collect();
        self.pending = keep.iter().map(|&r| self.pending[r as usize]).collect();
        if let Some(m) = &self.mark {
            self.mark = Some(keep.iter().map(|&r| m[r as usize]).collect());
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
        for (r, row) in self.rows.iter_mut().enumerate() {
            let appended = row.len().saturating_sub(mark[r]);
            let k = (keep[if keep.len() == 1 { 0 } else { r }] as usize).min(appended);
            row.trim_to(mark[r] + k).map_err(|e| PluginError::mlx(e.what()))?;
        }
        Ok(())
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
                AttentionMask { mode: MaskMode::ARRAY, array: ROption::RSome(into_tensor(view::mask(&lens, n)?)) }
            } else if queries <= 1 {
                AttentionMask { mode: MaskMode::NONE, array: ROption::RNone }
            } else {
                AttentionMask { mode: MaskMode::CAUSAL, array: ROption::RNone }
            })
        })
    }

    fn update_and_fetch(&mut self, keys: Tensor, values: Tensor) -> PResult<KvPair> {
        guard_mlx(|| {
            let (k, v) = (into_array(keys), into_array(values));
            if k.ndim() != 4 || k.shape()[1] != self.heads || k.shape()[3] != self.k_dim || v.shape()[3] != self.v_dim {
                return Err(error(format!(
                    "kv-paged: keys {:?} / values {:?} do not match the declared need",
                    k.shape(),
                    v.shape()
                )));
            }
            let (k, v) = self.store(k, v)?;
            Ok(KvPair { keys: into_tensor(k), values: into_tensor(v) })
        })
    }

    fn is_trimmable(&self) -> bool {
        true
    }

    fn trim(&mut self, n: u64) -> u64 {
        quietly(0, || {
            let n = (n as usize).min(self.max_len());
            for row in &mut self.rows {
                let to = row.len().saturating_sub(n);
                if row.trim_to(to).is_err() {
                    return 0;
                }
            }
            n as u64
        })
    }

    fn bytes_per_token(&self) -> u64 {
        (self.rows.len().max(1) * self.heads as usize * (self.k_dim + self.v_dim) as usize * dtype_size(self.dtype))
            as u64
    }

    fn export_state(&self) -> PResult<CacheState> {
        guard(|| Ok(self.export(&self.rows.iter().collect::<Vec<_>>())))
    }

    fn import_state(&mut self, state: CacheState) -> PResult<()> {
        guard_mlx(|| {
            let rows = self.import(state)?;
            self.pending = vec![0; rows.len()];
            self.rows = rows;
            self.mark = None;
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
            Ok(self.export(&[r]))
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
            self.rows = pads.iter().map(|_| Row::new(self.block)).collect();
            self.pending = pads.iter().map(|&p| p as usize).collect();
            self.mark = None;
            Ok(())
        })
    }

    fn pool_usage(&self) -> ROption<PoolUsage> {
        quietly(ROption::RNone, || ROption::RSome(pool::usage()))
    }
}
