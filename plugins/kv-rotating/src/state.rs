//! Exported states, in two formats. The serial one is mlx-lm's
//! `RotatingKVCache` `state` and `meta_state`: the raw storage and
//! `[offset, _idx, max_size, keep]`; rows travel in it (`extract_row`,
//! `merge_rows`). The batched one adds what a batch has beyond that:
//! whether the ring has rotated, and each row's padding and offset.

use crate::geometry::Geometry;
use crate::layout::Kind;
use crate::ring::Ring;
use crate::{columns::len, rows};
use model_kit::Array;
use plugin_api::abi_stable::std_types::RVec;
use plugin_api::{CacheState, PluginError, Tensor};
use plugin_sdk::{into_array, into_tensor};

/// Metadata integers of a batched state before the per-row ones: seen,
/// idx, max_size, rotated, rows.
const HEAD: usize = 5;

fn check_signature(geo: &Geometry, state: &CacheState) -> Result<(), PluginError> {
    if state.signature != geo.signature() {
        return Err(PluginError::invalid_input(format!(
            "state of `{}` cannot be imported into `{}`",
            state.signature,
            geo.signature()
        )));
    }
    Ok(())
}

fn storage(ring: &Ring) -> RVec<Tensor> {
    let mut tensors = RVec::new();
    if let (Some(k), Some(v)) = (&ring.keys, &ring.values) {
        tensors.push(into_tensor(k.clone()));
        tensors.push(into_tensor(v.clone()));
    }
    tensors
}

/// A state's keys and values, or neither (an empty ring); `None` for
/// anything else.
fn take_storage(state: CacheState) -> Option<Option<(Array, Array)>> {
    let mut t = state.tensors.into_iter();
    match (t.next(), t.next(), t.next()) {
        (None, None, None) => Some(None),
        (Some(k), Some(v), None) => Some(Some((into_array(k), into_array(v)))),
        _ => None,
    }
}

impl Ring {
    /// The serial format, for a ring of one unpadded row.
    pub fn serial_state(&self) -> CacheState {
        let offset = self.max_offset();
        let meta = RVec::from(vec![offset, self.idx as u64, self.geo.max_size as u64, 0]);
        CacheState { signature: self.geo.signature(), offset, tensors: storage(self), meta }
    }

    /// A ring of one row from the serial format. That format does not say
    /// whether the ring has rotated; it has when the write index stopped
    /// short of both the storage's end and the token count.
    pub fn from_serial_state(geo: Geometry, state: CacheState) -> Result<Ring, PluginError> {
        check_signature(&geo, &state)?;
        let bad = |why: &str| PluginError::invalid_input(format!("kv-rotating state: {why}"));
        let meta: Vec<usize> = state.meta.iter().map(|&m| m as usize).collect();
        let [offset, idx, max_size, keep] = meta[..] else {
            return Err(bad("expected 4 metadata integers (offset, idx, max_size, keep)"));
        };
        if max_size != geo.max_size || keep != 0 {
            return Err(bad(&format!(
                "max_size {max_size} / keep {keep} differ from this cache's {} / 0",
                geo.max_size
            )));
        }
        if state.offset as usize != offset {
            return Err(bad("offset differs from its metadata"));
        }
        let mut ring = Ring::empty(geo, 1);
        match take_storage(state).ok_or_else(|| bad("expected keys and values"))? {
            None if offset != 0 || idx != 0 => return Err(bad("no tensors but a non-zero offset")),
            None => {}
            Some((k, v)) => {
                geo.check_kv(&k, &v)?;
                Kind::Serial.check_rows(k.shape()[0], 1)?;
                // Before the ring wraps, the write index is the token count.
                if idx > len(&k) || (offset < max_size && (idx != offset || offset > len(&k))) {
                    return Err(bad("write index out of range"));
                }
                ring.rotated = idx < offset && idx != len(&k);
                (ring.keys, ring.values) = (Some(k), Some(v));
            }
        }
        ring.offsets = vec![offset as i64];
        ring.seen = offset;
        ring.idx = idx;
        Ok(ring)
    }

    /// The batched format: raw storage; meta `[seen, idx, max_size,
    /// rotated, rows, left pads.., offsets..]` (offsets as two's
    /// complement: negative mid-cohort).
    pub fn batch_state(&self) -> CacheState {
        let mut meta: RVec<u64> = [self.seen, self.idx, self.geo.max_size, self.rotated as usize, self.rows()]
            .iter()
            .map(|&m| m as u64)
            .collect();
        meta.extend(self.left_pad.iter().map(|&p| p as u64));
        meta.extend(self.offsets.iter().map(|&o| o as u64));
        CacheState { signature: self.geo.signature(), offset: self.max_offset(), tensors: storage(self), meta }
    }

    /// A batch from either format: a serial state becomes a 1-row batch,
    /// as `merge_rows` would add it to an empty one.
    pub fn from_batch_state(geo: Geometry, state: CacheState) -> Result<Ring, PluginError> {
        check_signature(&geo, &state)?;
        if state.meta.len() == 4 {
            return rows::merged(geo, vec![state]);
        }
        let bad = |why: &str| PluginError::invalid_input(format!("kv-rotating batch state: {why}"));
        let m: Vec<u64> = state.meta.iter().copied().collect();
        if m.len() < HEAD || m.len() != HEAD + 2 * m[4] as usize {
            return Err(bad("metadata does not match its row count"));
        }
        let rows = m[4] as usize;
        if m[2] as usize != geo.max_size {
            return Err(bad(&format!("max_size {} differs from this cache's {}", m[2], geo.max_size)));
        }
        let mut ring = Ring::empty(geo, rows);
        if let Some((k, v)) = take_storage(state).ok_or_else(|| bad("expected keys and values"))? {
            geo.check_kv(&k, &v)?;
            Kind::Batch.check_rows(k.shape()[0], rows)?;
            if m[1] as usize > len(&k) {
                return Err(bad("write index out of range"));
            }
            (ring.keys, ring.values) = (Some(k), Some(v));
        }
        ring.seen = m[0] as usize;
        ring.idx = m[1] as usize;
        ring.rotated = m[3] != 0;
        ring.left_pad = m[HEAD..HEAD + rows].iter().map(|&p| p as usize).collect();
        ring.offsets = m[HEAD + rows..].iter().map(|&o| o as i64).collect();
        Ok(ring)
    }
}
