//! The `CacheLayout` methods: each one guarded (no panic crosses the
//! boundary) and answered by the storage's own methods.

use super::*;
use plugin_sdk::kv_need::{array_mask, implicit_mask, KvShape};
use plugin_sdk::mlx_error;

impl CacheLayout for PlainKv {
    fn signature(&self) -> RString {
        quietly(RString::new(), || PlainKv::signature(self))
    }

    fn offset(&self) -> u64 {
        self.len() as u64
    }

    fn positions(&self) -> PResult<Positions> {
        guard_mlx(|| {
            let per_row = if self.padded() {
                let offs: Vec<i32> = (0..self.rows()).map(|r| self.row_len(r) as i32).collect();
                ROption::RSome(into_tensor(Array::from_slice(&offs, &[offs.len() as i32])))
            } else {
                ROption::RNone
            };
            Ok(Positions { offset: self.len() as u64, per_row })
        })
    }

    fn attention_mask(&self, queries: u32) -> PResult<AttentionMask> {
        guard_mlx(|| {
            Ok(if self.padded() { array_mask(self.mask_array(queries as usize)?) } else { implicit_mask(queries) })
        })
    }

    fn update_and_fetch(&mut self, keys: Tensor, values: Tensor) -> PResult<KvPair> {
        guard(|| {
            let (k, v) = self.checked(keys, values)?;
            let (k, v) = self.store(k, v).map_err(mlx_error)?;
            Ok(KvPair { keys: into_tensor(k), values: into_tensor(v) })
        })
    }

    fn update_for_queries(&mut self, queries: Tensor, keys: Tensor, values: Tensor) -> PResult<KvQueries> {
        guard(|| {
            let (k, v) = self.checked(keys, values)?;
            let (q, k, v, written_in_place) = self.store_for(into_array(queries), k, v).map_err(mlx_error)?;
            Ok(KvQueries { queries: into_tensor(q), keys: into_tensor(k), values: into_tensor(v), written_in_place })
        })
    }

    fn is_trimmable(&self) -> bool {
        true
    }

    fn trim(&mut self, n: u64) -> u64 {
        quietly(0, || {
            // Left padding never trims below a row's own start.
            let floor = self.left_pad.iter().copied().max().unwrap_or(0);
            let n = (n as usize).min(self.idx.saturating_sub(floor));
            self.idx -= n;
            self.holes.cut(self.idx);
            n as u64
        })
    }

    fn bytes_per_token(&self) -> u64 {
        (self.rows().max(1) * self.heads as usize * (self.k_dim + self.v_dim) as usize * dtype_size(self.dtype)) as u64
    }

    fn export_state(&self) -> PResult<CacheState> {
        guard_mlx(|| self.state())
    }

    fn import_state(&mut self, state: CacheState) -> PResult<()> {
        guard_mlx(|| self.load(state))
    }

    fn spec_begin(&mut self) -> PResult<()> {
        self.marks.push(self.idx);
        PResult::ROk(())
    }

    /// Settles the oldest open round (`caps::SPEC_PIPELINE`).
    fn spec_commit(&mut self) -> PResult<()> {
        if !self.marks.is_empty() {
            self.marks.remove(0);
        }
        PResult::ROk(())
    }

    /// Keeps `keep` of the oldest open round and drops the rest, younger
    /// rounds included.
    fn spec_rollback(&mut self, keep: RSlice<'_, u64>) -> PResult<()> {
        guard(|| {
            let mark =
                *self.marks.first().ok_or_else(|| PluginError::invalid_input("spec_rollback without spec_begin"))?;
            self.marks.clear();
            if keep.is_empty() || (keep.len() != 1 && keep.len() != self.rows()) {
                return Err(PluginError::invalid_input(format!(
                    "spec_rollback: {} keep counts for {} rows",
                    keep.len(),
                    self.rows()
                )));
            }
            let appended = self.idx - mark;
            let keep_of = |r: usize| (keep[if keep.len() == 1 { 0 } else { r }] as usize).min(appended);
            let most = (0..self.rows().max(1)).map(keep_of).max().unwrap_or(0);
            self.idx = mark + most;
            // Rows that kept fewer than the most-keeping row: the rest of
            // their round is dead columns, masked from now on.
            for r in 0..self.rows() {
                self.holes.add(r, mark + keep_of(r), mark + most);
            }
            if self.holes.max_count() > COMPACT_AFTER {
                self.compact().map_err(|e| PluginError::mlx(e.what()))?;
            }
            Ok(())
        })
    }

    fn rows(&self) -> u32 {
        quietly(0, || PlainKv::rows(self) as u32)
    }

    fn filter_rows(&mut self, keep: RSlice<'_, u32>) -> PResult<()> {
        guard_mlx(|| self.filter(keep.as_slice()))
    }

    fn extract_row(&self, row: u32) -> PResult<CacheState> {
        guard_mlx(|| self.extract(row))
    }

    fn merge_rows(&mut self, rows: RVec<CacheState>) -> PResult<()> {
        guard_mlx(|| self.merge(rows.into_vec()))
    }

    fn get_slot(&self, _i: u32) -> PResult<ROption<Tensor>> {
        PResult::RErr(PluginError::unsupported("kv-plain has no recurrent slots"))
    }

    fn set_slot(&mut self, _i: u32, _value: Tensor) -> PResult<()> {
        PResult::RErr(PluginError::unsupported("kv-plain has no recurrent slots"))
    }

    fn kv_view(&self, row: u32) -> PResult<KvView> {
        guard_mlx(|| self.view(row))
    }

    fn begin_padded(&mut self, pads: RSlice<'_, u32>) -> PResult<()> {
        guard(|| {
            if self.idx > 0 {
                return Err(PluginError::invalid_input("kv-plain: begin_padded on a cache that holds tokens"));
            }
            // The padding columns are written by the next update (whatever the
            // model computes for them) and hidden by the mask from then on.
            self.keys = None;
            self.values = None;
            self.base = 0;
            self.left_pad = pads.iter().map(|&p| p as usize).collect();
            self.holes = Holes::none(pads.len());
            Ok(())
        })
    }
}

impl PlainKv {
    /// New keys and values as arrays, refused unless they fit this cache.
    fn checked(&self, keys: Tensor, values: Tensor) -> std::result::Result<(Array, Array), PluginError> {
        let (k, v) = (into_array(keys), into_array(values));
        KvShape { heads: self.heads, k_dim: self.k_dim, v_dim: self.v_dim }.check("kv-plain", &k, &v)?;
        if k.shape()[0] as usize != self.rows() {
            return Err(PluginError::invalid_input(format!(
                "kv-plain: {} rows given, cache holds {}",
                k.shape()[0],
                self.rows()
            )));
        }
        Ok((k, v))
    }
}
