//! The ring behind the plugin boundary. A cache answers as one of mlx-lm's
//! two classes over the same ring (`ring.rs`):
//! - serial (created for 1 row), as `RotatingKVCache`: masks in the fused
//!   kernel's modes where they suffice, mlx-lm's state format (which is
//!   also how rows travel), speculative rounds only until the ring wraps
//!   (mlx-lm cannot trim after that), no row operations;
//! - batch (0 or several rows), as `BatchRotatingKVCache`: explicit masks,
//!   per-row positions, its own state format (a serial state imports as a
//!   1-row batch), row operations, per-row rollback.

use crate::geometry::Geometry;
use crate::ring::Ring;
use crate::round::Round;
use model_kit::Array;
use plugin_api::abi_stable::std_types::{ROption, RSlice, RString, RVec};
use plugin_api::*;
use plugin_sdk::kv_need::array_mask;
use plugin_sdk::{guard, into_array, into_tensor, mlx_error, quietly};

/// Which of mlx-lm's classes a cache answers as.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    Serial,
    Batch,
}

impl Kind {
    /// Fails unless an update or state of `given` rows fits a cache of `held`.
    pub fn check_rows(self, given: i32, held: usize) -> Result<(), PluginError> {
        match self {
            Kind::Serial if given != 1 => {
                Err(PluginError::unsupported(format!("kv-rotating is serial: {given} rows given")))
            }
            Kind::Batch if given as usize != held => {
                Err(PluginError::invalid_input(format!("kv-rotating: {given} rows given, the cache holds {held}")))
            }
            _ => Ok(()),
        }
    }
}

pub(crate) struct RotatingKv {
    pub ring: Ring,
    pub round: Option<Round>,
    pub kind: Kind,
}

impl RotatingKv {
    pub fn serial(geo: Geometry) -> Self {
        Self { ring: Ring::empty(geo, 1), round: None, kind: Kind::Serial }
    }

    /// A batch cache: `rows` unpadded rows, or none (rows arrive by
    /// `merge_rows` or `begin_padded`).
    pub fn batch(geo: Geometry, rows: usize) -> Self {
        Self { ring: Ring::empty(geo, rows), round: None, kind: Kind::Batch }
    }

    fn no_round(&self, operation: &str) -> Result<(), PluginError> {
        match self.round {
            Some(_) => Err(PluginError::invalid_input(format!("kv-rotating: {operation} inside a speculative round"))),
            None => Ok(()),
        }
    }

    /// Row operations belong to batch caches; a serial cache answers `refusal`.
    fn batch_only(&self, refusal: &str) -> Result<(), PluginError> {
        match self.kind {
            Kind::Serial => Err(PluginError::unsupported(refusal.to_owned())),
            Kind::Batch => Ok(()),
        }
    }
}

impl CacheLayout for RotatingKv {
    fn signature(&self) -> RString {
        quietly(RString::new(), || self.ring.geo.signature())
    }

    /// Tokens seen (the RoPE offset; per row, the maximum), not slots held:
    /// the ring holds at most `window` of them.
    fn offset(&self) -> u64 {
        quietly(0, || self.ring.max_offset())
    }

    fn positions(&self) -> PResult<Positions> {
        guard(|| {
            Ok(match self.ring.common_offset() {
                Some(o) => Positions { offset: o as u64, per_row: ROption::RNone },
                None => {
                    let offs: Vec<i32> = self.ring.offsets.iter().map(|&o| o as i32).collect();
                    let per_row = Array::from_slice(&offs, &[offs.len() as i32]);
                    Positions { offset: self.ring.max_offset(), per_row: ROption::RSome(into_tensor(per_row)) }
                }
            })
        })
    }

    fn attention_mask(&self, queries: u32) -> PResult<AttentionMask> {
        guard(|| match self.kind {
            Kind::Serial => Ok(self.ring.serial_mask(queries as usize)),
            Kind::Batch => {
                let mask = self.ring.rows_mask(queries as usize).map_err(mlx_error)?;
                Ok(array_mask(mask))
            }
        })
    }

    fn update_and_fetch(&mut self, keys: Tensor, values: Tensor) -> PResult<KvPair> {
        guard(|| {
            let (k, v) = (into_array(keys), into_array(values));
            self.ring.geo.check_kv(&k, &v)?;
            self.kind.check_rows(k.shape()[0], self.ring.rows())?;
            if let Some(r) = self.round.as_mut() {
                r.record(&k, &v);
            }
            let (k, v) = self.ring.store(k, v).map_err(mlx_error)?;
            Ok(KvPair { keys: into_tensor(k), values: into_tensor(v) })
        })
    }

    fn is_trimmable(&self) -> bool {
        quietly(false, || self.ring.trimmable())
    }

    fn trim(&mut self, n: u64) -> u64 {
        quietly(0, || self.ring.trim(n))
    }

    fn bytes_per_token(&self) -> u64 {
        quietly(0, || self.ring.bytes_per_token())
    }

    fn export_state(&self) -> PResult<CacheState> {
        guard(|| {
            Ok(match self.kind {
                Kind::Serial => self.ring.serial_state(),
                Kind::Batch => self.ring.batch_state(),
            })
        })
    }

    fn import_state(&mut self, state: CacheState) -> PResult<()> {
        guard(|| {
            self.ring = match self.kind {
                Kind::Serial => Ring::from_serial_state(self.ring.geo, state)?,
                Kind::Batch => Ring::from_batch_state(self.ring.geo, state)?,
            };
            self.round = None;
            Ok(())
        })
    }

    fn spec_begin(&mut self) -> PResult<()> {
        guard(|| {
            self.round = Some(match self.kind {
                Kind::Serial if !self.ring.trimmable() => {
                    return Err(PluginError::unsupported(format!(
                        "kv-rotating: the ring has wrapped ({} tokens in a window of {}); a speculative round cannot be undone",
                        self.ring.seen, self.ring.geo.max_size
                    )));
                }
                Kind::Serial => Round::serial(&self.ring),
                Kind::Batch => Round::rows(&self.ring),
            });
            Ok(())
        })
    }

    fn spec_commit(&mut self) -> PResult<()> {
        guard(|| {
            self.round = None;
            Ok(())
        })
    }

    fn spec_rollback(&mut self, keep: RSlice<'_, u64>) -> PResult<()> {
        guard(|| {
            let round =
                self.round.take().ok_or_else(|| PluginError::invalid_input("spec_rollback without spec_begin"))?;
            round.rollback(&mut self.ring, keep.as_slice())
        })
    }

    fn rows(&self) -> u32 {
        quietly(0, || self.ring.rows() as u32)
    }

    fn filter_rows(&mut self, keep: RSlice<'_, u32>) -> PResult<()> {
        guard(|| match (self.kind, keep.as_slice()) {
            // A serial cache is its one row: keeping row 0 changes nothing.
            (Kind::Serial, [0]) => Ok(()),
            (Kind::Serial, k) => Err(PluginError::invalid_input(format!(
                "kv-rotating: a serial cache holds row 0 only, asked to keep {k:?}"
            ))),
            (Kind::Batch, k) => {
                self.no_round("filter_rows")?;
                self.ring.filter(k).map_err(mlx_error)
            }
        })
    }

    fn extract_row(&self, row: u32) -> PResult<CacheState> {
        guard(|| match (self.kind, row) {
            (Kind::Serial, 0) => Ok(self.ring.serial_state()),
            (Kind::Serial, r) => Err(PluginError::invalid_input(format!("extract_row: row {r} of a serial cache"))),
            (Kind::Batch, r) => self.ring.extract(r as usize),
        })
    }

    fn merge_rows(&mut self, rows: RVec<CacheState>) -> PResult<()> {
        guard(|| {
            self.batch_only("kv-rotating: rows merge into a batch cache (created with 0 rows), not a serial one")?;
            self.no_round("merge_rows")?;
            self.ring.merge(rows.into_vec())
        })
    }

    fn get_slot(&self, _i: u32) -> PResult<ROption<Tensor>> {
        guard(|| Err(PluginError::unsupported("kv-rotating has no recurrent slots")))
    }

    fn set_slot(&mut self, _i: u32, _value: Tensor) -> PResult<()> {
        guard(|| Err(PluginError::unsupported("kv-rotating has no recurrent slots")))
    }

    fn kv_view(&self, row: u32) -> PResult<KvView> {
        guard(|| self.ring.view(row as usize))
    }

    fn begin_padded(&mut self, pads: RSlice<'_, u32>) -> PResult<()> {
        guard(|| {
            self.batch_only("this cache layout cannot start left-padded rows")?;
            self.no_round("begin_padded")?;
            self.ring.begin_padded(pads.as_slice())
        })
    }
}
