//! The batched ring behind the plugin boundary: the `CacheLayout` methods,
//! and its own state format (a serial state is also accepted on import:
//! it becomes a 1-row batch).

use crate::batch::BatchRotatingKv;
use crate::{bytes_of, len, quietly};
use model_kit::{error, Array};
use plugin_api::abi_stable::std_types::{ROption, RSlice, RString, RVec};
use plugin_api::*;
use plugin_sdk::{guard, guard_mlx, into_array, into_tensor, mlx_error};

/// Metadata integers before the per-row ones: seen, idx, max_size, rotated, rows.
const HEAD: usize = 5;

impl BatchRotatingKv {
    fn check_kv(&self, k: &Array, v: &Array) -> std::result::Result<(), PluginError> {
        let (ks, vs) = (k.shape(), v.shape());
        if k.ndim() != 4
            || v.ndim() != 4
            || ks[1] != self.heads
            || ks[3] != self.k_dim
            || vs[1] != self.heads
            || vs[3] != self.v_dim
            || ks[2] != vs[2]
            || ks[0] != vs[0]
        {
            return Err(PluginError::invalid_input(format!(
                "kv-rotating: keys {ks:?} / values {vs:?} do not match the declared need"
            )));
        }
        if ks[0] as usize != self.rows() {
            return Err(PluginError::invalid_input(format!(
                "kv-rotating: {} rows given, the cache holds {}",
                ks[0],
                self.rows()
            )));
        }
        Ok(())
    }

    /// Raw storage; meta `[seen, idx, max_size, rotated, rows, left pads..,
    /// offsets..]` (offsets as two's-complement: negative mid-cohort).
    fn state(&self) -> CacheState {
        let mut tensors = RVec::new();
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            tensors.push(into_tensor(k.clone()));
            tensors.push(into_tensor(v.clone()));
        }
        let mut meta: RVec<u64> = [self.seen, self.idx, self.max_size, self.rotated as usize, self.rows()]
            .iter()
            .map(|&m| m as u64)
            .collect();
        meta.extend(self.left_pad.iter().map(|&p| p as u64));
        meta.extend(self.offsets.iter().map(|&o| o as u64));
        CacheState { signature: self.serial().signature(), offset: self.max_offset(), tensors, meta }
    }

    fn load(&mut self, state: CacheState) -> std::result::Result<(), PluginError> {
        let sig = self.serial().signature();
        if state.signature != sig {
            return Err(PluginError::invalid_input(format!(
                "state of `{}` cannot be imported into `{sig}`",
                state.signature
            )));
        }
        if state.meta.len() == 4 {
            let mut fresh = BatchRotatingKv::new(&self.serial(), 0);
            fresh.merge(vec![state])?;
            *self = fresh;
            return Ok(());
        }
        let bad = |why: &str| PluginError::invalid_input(format!("kv-rotating batch state: {why}"));
        let m: Vec<u64> = state.meta.iter().copied().collect();
        if m.len() < HEAD || m.len() != HEAD + 2 * m[4] as usize {
            return Err(bad("metadata does not match its row count"));
        }
        let rows = m[4] as usize;
        if m[2] as usize != self.max_size {
            return Err(bad(&format!("max_size {} differs from this cache's {}", m[2], self.max_size)));
        }
        let mut t = state.tensors.into_iter();
        let (keys, values) = match (t.next(), t.next(), t.next()) {
            (None, None, None) => (None, None),
            (Some(k), Some(v), None) => {
                let (k, v) = (into_array(k), into_array(v));
                BatchRotatingKv::new(&self.serial(), rows).check_kv(&k, &v)?;
                if m[1] as usize > len(&k) {
                    return Err(bad("write index out of range"));
                }
                (Some(k), Some(v))
            }
            _ => return Err(bad("expected keys and values")),
        };
        let mut fresh = BatchRotatingKv::new(&self.serial(), rows);
        fresh.keys = keys;
        fresh.values = values;
        fresh.seen = m[0] as usize;
        fresh.idx = m[1] as usize;
        fresh.rotated = m[3] != 0;
        fresh.left_pad = m[HEAD..HEAD + rows].iter().map(|&p| p as usize).collect();
        fresh.offsets = m[HEAD + rows..].iter().map(|&o| o as i64).collect();
        *self = fresh;
        Ok(())
    }
}

impl CacheLayout for BatchRotatingKv {
    fn signature(&self) -> RString {
        quietly(RString::new(), || self.serial().signature())
    }

    fn offset(&self) -> u64 {
        quietly(0, || self.max_offset())
    }

    fn positions(&self) -> PResult<Positions> {
        guard(|| {
            Ok(match self.common_offset() {
                Some(o) => Positions { offset: o as u64, per_row: ROption::RNone },
                None => {
                    let offs: Vec<i32> = self.offsets.iter().map(|&o| o as i32).collect();
                    Positions {
                        offset: self.max_offset(),
                        per_row: ROption::RSome(into_tensor(Array::from_slice(&offs, &[offs.len() as i32]))),
                    }
                }
            })
        })
    }

    /// Always explicit, as mlx-lm's batched ring (rows differ in padding).
    fn attention_mask(&self, queries: u32) -> PResult<AttentionMask> {
        guard_mlx(|| {
            Ok(AttentionMask {
                mode: MaskMode::ARRAY,
                array: ROption::RSome(into_tensor(self.mask(queries as usize)?)),
            })
        })
    }

    fn update_and_fetch(&mut self, keys: Tensor, values: Tensor) -> PResult<KvPair> {
        guard(|| {
            let (k, v) = (into_array(keys), into_array(values));
            self.check_kv(&k, &v)?;
            let l = len(&k);
            if let Some(r) = self.round.as_mut() {
                r.updates += 1;
                r.appended += l;
            }
            let (k, v) = self.store(k, v).map_err(mlx_error)?;
            Ok(KvPair { keys: into_tensor(k), values: into_tensor(v) })
        })
    }

    fn is_trimmable(&self) -> bool {
        quietly(false, || self.trimmable())
    }

    fn trim(&mut self, n: u64) -> u64 {
        quietly(0, || self.trim_tokens(n))
    }

    /// A slot per row while the ring is filling, nothing once it is full.
    fn bytes_per_token(&self) -> u64 {
        quietly(0, || {
            if self.seen >= self.max_size {
                0
            } else {
                (self.rows().max(1) * self.heads as usize * (self.k_dim + self.v_dim) as usize * bytes_of(self.dtype))
                    as u64
            }
        })
    }

    fn export_state(&self) -> PResult<CacheState> {
        guard(|| Ok(self.state()))
    }

    fn import_state(&mut self, state: CacheState) -> PResult<()> {
        guard(|| self.load(state))
    }

    fn spec_begin(&mut self) -> PResult<()> {
        guard(|| BatchRotatingKv::spec_begin(self))
    }

    fn spec_commit(&mut self) -> PResult<()> {
        guard(|| {
            self.round = None;
            Ok(())
        })
    }

    fn spec_rollback(&mut self, keep: RSlice<'_, u64>) -> PResult<()> {
        guard(|| self.rollback(keep.as_slice()))
    }

    fn rows(&self) -> u32 {
        quietly(0, || BatchRotatingKv::rows(self) as u32)
    }

    fn filter_rows(&mut self, keep: RSlice<'_, u32>) -> PResult<()> {
        guard_mlx(|| {
            if self.round.is_some() {
                return Err(error("kv-rotating: filter_rows inside a speculative round"));
            }
            self.filter(keep.as_slice())
        })
    }

    fn extract_row(&self, row: u32) -> PResult<CacheState> {
        guard(|| self.extract(row as usize))
    }

    fn merge_rows(&mut self, rows: RVec<CacheState>) -> PResult<()> {
        guard(|| self.merge(rows.into_vec()))
    }

    fn get_slot(&self, _i: u32) -> PResult<ROption<Tensor>> {
        guard(|| Err(PluginError::unsupported("kv-rotating has no recurrent slots")))
    }

    fn set_slot(&mut self, _i: u32, _value: Tensor) -> PResult<()> {
        guard(|| Err(PluginError::unsupported("kv-rotating has no recurrent slots")))
    }

    fn begin_padded(&mut self, pads: RSlice<'_, u32>) -> PResult<()> {
        guard(|| BatchRotatingKv::begin_padded(self, pads.as_slice()))
    }
}
