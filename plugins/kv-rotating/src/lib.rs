//! Cache layout `kv-rotating`: keys and values for sliding-window attention
//! layers, kept exactly as mlx-lm's `RotatingKVCache` keeps them (mlx-lm
//! 0.32.2, `mlx_lm/models/cache.py`), so that attention sees the same keys
//! in the same storage order and greedy decoding matches token for token.
//!
//! The ring holds `max_size = window` slots (`keep = 0`, as mlx-lm's
//! `make_cache` builds it for sliding layers):
//! - one token at a time (`_update_in_place`): storage grows in steps of
//!   `spec.step` up to `max_size`, then the write index wraps to `keep` and
//!   overwrites the oldest slot; attention reads the ring in storage order
//!   (softmax does not care about order, but bitwise parity does);
//! - several tokens at once (`_update_concat`): the ring is put in temporal
//!   order, cut to its last `max_size - 1` tokens, and the new tokens are
//!   appended (storage may exceed `max_size` until the next single token);
//! - masks (`make_mask` with `window_size = window`, asked before the
//!   update): for L > 1 causal, or an explicit window mask `[1, 1, L, K]`
//!   once the window binds; for L == 1 none (every stored key is in the
//!   window when `max_size == window`).
//!
//! Capabilities: `trim` while the ring has not wrapped (mlx-lm's
//! `is_trimmable`: `offset < max_size`), `spec-round` (a serial ring refuses
//! it once wrapped; the batched one rolls back per row), `state-io` (raw
//! storage + `offset`, `_idx`, `max_size`, `keep`, as mlx-lm's
//! `state`/`meta_state`), `rows`: a cache created for other than 1 row is
//! the batched ring of mlx-lm's `BatchRotatingKVCache` (`batch.rs`, row
//! operations in `rows.rs`, per-row speculative rollback in `round.rs`);
//! its rows travel as this serial layout's 1-row states.

use model_kit::ops::{dtype_from_raw, slice, slice_update, zeros};
use model_kit::{error, Array, Dtype, Result};
use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::abi_stable::std_types::{ROption, RSlice, RString, RVec};
use plugin_api::*;
use plugin_sdk::{guard, into_array, into_tensor, mlx_error, mlx_rs, quietly, rstrings};

mod batch;
mod batch_layout;
mod round;
mod rows;

use batch::BatchRotatingKv;

plugin_sdk::export_plugin! {
    manifest: manifest,
    new_cache: new_cache,
}

fn manifest() -> PluginManifest {
    plugin_sdk::manifest!(
        PluginKind::CACHE_LAYOUT,
        "sliding-window K/V in a ring of `window` slots, as mlx-lm's RotatingKVCache",
        Claims { cache_needs: rstrings(&["sliding"]), cache_schemes: rstrings(&["plain"]), ..Default::default() },
        &[caps::TRIM, caps::SPEC_ROUND, caps::STATE_IO, caps::ROWS],
    )
}

fn new_cache(spec: &CacheSpec) -> std::result::Result<CacheBox, PluginError> {
    if spec.need.kind != NeedKind::SLIDING {
        return Err(PluginError::unsupported(format!(
            "kv-rotating serves sliding-window attention, not `{}`",
            spec.need.kind.as_str()
        )));
    }
    if spec.scheme.as_str() != "plain" {
        return Err(PluginError::unsupported(format!("kv-rotating has no scheme `{}`", spec.scheme)));
    }
    if spec.need.window == 0 {
        return Err(PluginError::invalid_input("kv-rotating: a sliding layer needs a window > 0"));
    }
    let dtype = dtype_from_raw(spec.dtype.0).map_err(|e| PluginError::invalid_input(e.what()))?;
    let window = spec.need.window as usize;
    let serial = RotatingKv {
        keys: None,
        values: None,
        offset: 0,
        idx: 0,
        max_size: window,
        keep: 0,
        step: spec.step.max(1) as usize,
        window,
        heads: spec.need.kv_heads as i32,
        k_dim: spec.need.k_head_dim as i32,
        v_dim: spec.need.v_head_dim as i32,
        dtype,
        round: None,
    };
    // A batch cache (0 rows, filled by merges or `begin_padded`, or B
    // unpadded rows) is the batched ring; one row keeps the serial one.
    if spec.rows == 1 {
        Ok(CacheLayout_TO::from_value(serial, TD_Opaque))
    } else {
        Ok(CacheLayout_TO::from_value(BatchRotatingKv::new(&serial, spec.rows as usize), TD_Opaque))
    }
}

/// What a speculative round needs to be undone.
struct Round {
    /// The state at `spec_begin` (MLX arrays are immutable: handles suffice).
    keys: Option<Array>,
    values: Option<Array>,
    offset: usize,
    idx: usize,
    /// Keys/values appended since, in order (to replay a kept prefix when
    /// the ring wrapped during the round and trimming is no longer possible).
    appended: Vec<(Array, Array)>,
}

struct RotatingKv {
    /// Ring storage `[1, H, n, D]`: n <= max_size after single-token steps,
    /// up to `max_size - 1 + L` after a step of L tokens.
    keys: Option<Array>,
    values: Option<Array>,
    /// Tokens seen so far (mlx-lm `offset`; the next RoPE position).
    offset: usize,
    /// Next write slot (mlx-lm `_idx`).
    idx: usize,
    max_size: usize,
    /// Leading slots never overwritten (mlx-lm `keep`; 0 for these models).
    keep: usize,
    step: usize,
    /// The attention window (`window_size` of `make_mask`); equals max_size.
    window: usize,
    heads: i32,
    k_dim: i32,
    v_dim: i32,
    dtype: Dtype,
    round: Option<Round>,
}

/// Storage length (axis 2).
fn len(a: &Array) -> usize {
    a.shape()[2] as usize
}

/// `a[..., start:end, :]` with Python's clamping.
fn cols(a: &Array, start: usize, end: usize) -> Result<Array> {
    let s = a.shape();
    let n = s[2] as usize;
    let (start, end) = (start.min(n), end.min(n).max(start.min(n)));
    if start == 0 && end == n {
        return Ok(a.clone());
    }
    slice(a, &[0, 0, start as i32, 0], &[s[0], s[1], end as i32, s[3]])
}

/// mlx-lm's growth step: `shape[2]` zero columns (`[B, H, n, D]`, in the
/// new keys' and values' dtypes) after the storage, or as the first storage.
fn grown(
    keys: Option<Array>,
    values: Option<Array>,
    shape: [i32; 3],
    k: (&Array, i32),
    v: (&Array, i32),
) -> Result<(Array, Array)> {
    let [b, h, n] = shape;
    let nk = zeros(&[b, h, n, k.1], k.0.dtype())?;
    let nv = zeros(&[b, h, n, v.1], v.0.dtype())?;
    match (keys, values) {
        (Some(ok), Some(ov)) => Ok((mlx_rs::ops::concatenate(&[ok, nk], 2)?, mlx_rs::ops::concatenate(&[ov, nv], 2)?)),
        _ => Ok((nk, nv)),
    }
}

fn cat(parts: Vec<Array>) -> Result<Array> {
    // Python concatenates the empty `v[..., :keep]` too; empty parts add
    // nothing, so they are left out.
    let parts: Vec<Array> = parts.into_iter().filter(|p| len(p) > 0).collect();
    mlx_rs::ops::concatenate(&parts, 2)
}

/// mlx-lm `create_causal_mask(n, offset, window_size=window)` as `[1, 1, n, offset + n]`.
fn window_mask(n: usize, offset: usize, window: usize) -> Array {
    let k = offset + n;
    let mut m = Vec::with_capacity(n * k);
    for i in 0..n {
        let l = offset + i;
        for r in 0..k {
            m.push(l >= r && l < r + window);
        }
    }
    Array::from_slice(&m, &[1, 1, n as i32, k as i32])
}

impl RotatingKv {
    /// mlx-lm `_trim`: drops `trim` slots after the first `keep`, appends.
    fn trim_cat(&self, trim: isize, v: &Array, append: Option<&Array>) -> Result<Array> {
        let mut parts = Vec::new();
        if trim > 0 {
            parts.push(cols(v, 0, self.keep)?);
            parts.push(cols(v, trim as usize + self.keep, len(v))?);
        } else {
            parts.push(v.clone());
        }
        if let Some(a) = append {
            parts.push(a.clone());
        }
        cat(parts)
    }

    /// mlx-lm `_temporal_order`: the ring unrolled oldest first, unused tail cut.
    fn temporal_order(&self, v: &Array) -> Result<Array> {
        let n = len(v);
        if self.idx == n {
            Ok(v.clone())
        } else if self.idx < self.offset {
            cat(vec![cols(v, 0, self.keep)?, cols(v, self.idx, n)?, cols(v, self.keep, self.idx)?])
        } else {
            cols(v, 0, self.idx)
        }
    }

    /// mlx-lm `_update_concat` (several tokens at once).
    fn update_concat(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        let l = len(&k);
        match (self.keys.take(), self.values.take()) {
            (Some(ok), Some(ov)) => {
                let ok = self.temporal_order(&ok)?;
                let ov = self.temporal_order(&ov)?;
                self.idx = len(&ok);
                // At most max_size - 1 old tokens, so that every new token
                // sees at least max_size keys.
                let trim = self.idx as isize - self.max_size as isize + 1;
                self.keys = Some(self.trim_cat(trim, &ok, Some(&k))?);
                self.values = Some(self.trim_cat(trim, &ov, Some(&v))?);
            }
            _ => {
                self.keys = Some(k);
                self.values = Some(v);
            }
        }
        self.offset += l;
        self.idx = len(self.keys.as_ref().unwrap());
        Ok((self.keys.clone().unwrap(), self.values.clone().unwrap()))
    }

    /// mlx-lm `_update_in_place` (one token): grow, trim, rotate, assign.
    fn update_in_place(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        let (b, s) = (k.shape()[0], len(&k));
        let prev = self.offset;
        let grow = match &self.keys {
            None => true,
            Some(ks) => prev >= len(ks) && len(ks) < self.max_size,
        };
        if grow {
            let new_size = self.step.min(self.max_size.saturating_sub(prev));
            if new_size == 0 {
                return Err(error(format!("kv-rotating: no room to grow (offset {prev}, max_size {})", self.max_size)));
            }
            let (ks, vs) = grown(
                self.keys.take(),
                self.values.take(),
                [b, self.heads, new_size as i32],
                (&k, self.k_dim),
                (&v, self.v_dim),
            )?;
            (self.keys, self.values) = (Some(ks), Some(vs));
            self.idx = prev;
        }
        let (ks, vs) = (self.keys.take().unwrap(), self.values.take().unwrap());
        // Trim storage left over from a multi-token step.
        let trim = len(&ks) as isize - self.max_size as isize;
        let (ks, vs) = if trim > 0 {
            self.idx = self.max_size;
            (self.trim_cat(trim, &ks, None)?, self.trim_cat(trim, &vs, None)?)
        } else {
            (ks, vs)
        };
        // Rotate.
        if self.idx == self.max_size {
            self.idx = self.keep;
        }
        let (start, end) = (self.idx as i32, (self.idx + s) as i32);
        let ks = slice_update(&ks, &k, &[0, 0, start, 0], &[b, self.heads, end, self.k_dim])?;
        let vs = slice_update(&vs, &v, &[0, 0, start, 0], &[b, self.heads, end, self.v_dim])?;
        self.keys = Some(ks);
        self.values = Some(vs);
        self.offset += s;
        self.idx += s;
        self.keys_and_values()
    }

    /// mlx-lm `keys_and_values`: the storage, cut to `offset` while it is
    /// not full yet.
    fn keys_and_values(&self) -> Result<(Array, Array)> {
        let (k, v) = (self.keys.as_ref().unwrap(), self.values.as_ref().unwrap());
        if self.offset < len(k) {
            Ok((cols(k, 0, self.offset)?, cols(v, 0, self.offset)?))
        } else {
            Ok((k.clone(), v.clone()))
        }
    }

    fn store(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        if len(&k) == 1 {
            self.update_in_place(k, v)
        } else {
            self.update_concat(k, v)
        }
    }

    /// mlx-lm `make_mask(n, window_size=window)`, asked before the update.
    fn mask(&self, n: usize) -> AttentionMask {
        let none = AttentionMask { mode: MaskMode::NONE, array: ROption::RNone };
        if n > 1 {
            let window = if self.window > 0 { self.window } else { self.max_size };
            let offset = (self.max_size - 1).min(self.offset);
            if offset + n > window {
                AttentionMask {
                    mode: MaskMode::ARRAY,
                    array: ROption::RSome(into_tensor(window_mask(n, offset, window))),
                }
            } else {
                AttentionMask { mode: MaskMode::CAUSAL, array: ROption::RNone }
            }
        } else if self.offset >= self.window && self.max_size > self.window {
            // Only when the window is narrower than the ring (never for
            // max_size == window, as mlx-lm builds these caches): the ring
            // positions that are within the window, rolled to storage order.
            let idx = if self.idx >= self.max_size { 0 } else { self.idx };
            let size = if self.offset < self.max_size { self.offset + 1 } else { self.max_size };
            let base: Vec<bool> = (0..size).map(|i| i >= size - self.window).collect();
            let shift = (idx + 1) % size;
            let rolled: Vec<bool> = (0..size).map(|j| base[(j + size - shift) % size]).collect();
            AttentionMask {
                mode: MaskMode::ARRAY,
                array: ROption::RSome(into_tensor(Array::from_slice(&rolled, &[1, 1, 1, size as i32]))),
            }
        } else {
            none
        }
    }

    fn trimmable(&self) -> bool {
        self.offset < self.max_size
    }

    /// mlx-lm `trim`, refused (0) once the ring has wrapped.
    fn trim_tokens(&mut self, n: u64) -> u64 {
        if !self.trimmable() {
            return 0;
        }
        let n = (n as usize).min(self.offset).min(self.idx);
        self.offset -= n;
        self.idx -= n;
        n as u64
    }

    fn signature(&self) -> RString {
        format!("kv:rotating:w{}:{:?}:h{}:k{}:v{}", self.window, self.dtype, self.heads, self.k_dim, self.v_dim)
            .to_lowercase()
            .into()
    }

    fn check_kv(&self, k: &Array, v: &Array) -> std::result::Result<(), PluginError> {
        let (ks, vs) = (k.shape(), v.shape());
        if k.ndim() != 4
            || v.ndim() != 4
            || ks[1] != self.heads
            || ks[3] != self.k_dim
            || vs[1] != self.heads
            || vs[3] != self.v_dim
            || ks[2] != vs[2]
        {
            return Err(PluginError::invalid_input(format!(
                "kv-rotating: keys {ks:?} / values {vs:?} do not match the declared need"
            )));
        }
        if ks[0] != 1 || vs[0] != 1 {
            return Err(PluginError::unsupported(format!("kv-rotating is serial: {} rows given", ks[0])));
        }
        Ok(())
    }

    /// Raw storage plus mlx-lm's meta state: `[offset, _idx, max_size, keep]`.
    fn state(&self) -> CacheState {
        let mut tensors = RVec::new();
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            tensors.push(into_tensor(k.clone()));
            tensors.push(into_tensor(v.clone()));
        }
        let meta: RVec<u64> = [self.offset, self.idx, self.max_size, self.keep].iter().map(|&m| m as u64).collect();
        CacheState { signature: self.signature(), offset: self.offset as u64, tensors, meta }
    }

    fn load(&mut self, state: CacheState) -> std::result::Result<(), PluginError> {
        if state.signature != self.signature() {
            return Err(PluginError::invalid_input(format!(
                "state of `{}` cannot be imported into `{}`",
                state.signature,
                self.signature()
            )));
        }
        let bad = |why: &str| PluginError::invalid_input(format!("kv-rotating state: {why}"));
        let meta: Vec<usize> = state.meta.iter().map(|&m| m as usize).collect();
        let [offset, idx, max_size, keep] = meta[..] else {
            return Err(bad("expected 4 metadata integers (offset, idx, max_size, keep)"));
        };
        if max_size != self.max_size || keep != self.keep {
            return Err(bad(&format!(
                "max_size {max_size} / keep {keep} differ from this cache's {} / {}",
                self.max_size, self.keep
            )));
        }
        if state.offset as usize != offset {
            return Err(bad("offset differs from its metadata"));
        }
        let mut t = state.tensors.into_iter();
        let (keys, values) = match (t.next(), t.next(), t.next()) {
            (None, None, None) => {
                if offset != 0 || idx != 0 {
                    return Err(bad("no tensors but a non-zero offset"));
                }
                (None, None)
            }
            (Some(k), Some(v), None) => {
                let (k, v) = (into_array(k), into_array(v));
                self.check_kv(&k, &v)?;
                // Before the ring wraps, the write index is the token count.
                if idx > len(&k) || (offset < max_size && (idx != offset || offset > len(&k))) {
                    return Err(bad("write index out of range"));
                }
                (Some(k), Some(v))
            }
            _ => return Err(bad("expected keys and values")),
        };
        self.keys = keys;
        self.values = values;
        self.offset = offset;
        self.idx = idx;
        self.round = None;
        Ok(())
    }

    fn rollback(&mut self, keep: &[u64]) -> std::result::Result<(), PluginError> {
        let round = self.round.take().ok_or_else(|| PluginError::invalid_input("spec_rollback without spec_begin"))?;
        let &[kept] = keep else {
            return Err(PluginError::invalid_input(format!(
                "kv-rotating holds 1 row; spec_rollback got {} keep counts",
                keep.len()
            )));
        };
        let appended = self.offset.saturating_sub(round.offset);
        let kept = (kept as usize).min(appended);
        if self.trimmable() {
            // Not wrapped: what mlx-lm's speculative decoding does, a trim.
            self.trim_tokens((appended - kept) as u64);
            return Ok(());
        }
        // The ring wrapped during the round: the dropped tokens overwrote
        // slots, so go back to the round's start and append the kept ones.
        self.keys = round.keys;
        self.values = round.values;
        self.offset = round.offset;
        self.idx = round.idx;
        if kept > 0 {
            let (ks, vs): (Vec<Array>, Vec<Array>) = round.appended.into_iter().unzip();
            let mut replay = || -> Result<()> {
                let k = cols(&mlx_rs::ops::concatenate(&ks, 2)?, 0, kept)?;
                let v = cols(&mlx_rs::ops::concatenate(&vs, 2)?, 0, kept)?;
                self.store(k, v)?;
                Ok(())
            };
            replay().map_err(mlx_error)?;
        }
        Ok(())
    }
}

fn bytes_of(dtype: Dtype) -> usize {
    match dtype {
        Dtype::Float32 => 4,
        _ => 2,
    }
}

impl CacheLayout for RotatingKv {
    fn signature(&self) -> RString {
        quietly(RString::new(), || RotatingKv::signature(self))
    }

    /// Tokens seen (the RoPE offset), not slots held: the ring holds at most
    /// `window` of them.
    fn offset(&self) -> u64 {
        quietly(0, || self.offset as u64)
    }

    fn positions(&self) -> PResult<Positions> {
        guard(|| Ok(Positions { offset: self.offset as u64, per_row: ROption::RNone }))
    }

    fn attention_mask(&self, queries: u32) -> PResult<AttentionMask> {
        guard(|| Ok(self.mask(queries as usize)))
    }

    fn update_and_fetch(&mut self, keys: Tensor, values: Tensor) -> PResult<KvPair> {
        guard(|| {
            let (k, v) = (into_array(keys), into_array(values));
            self.check_kv(&k, &v)?;
            if let Some(r) = self.round.as_mut() {
                r.appended.push((k.clone(), v.clone()));
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

    /// What one more token adds: a slot while the ring is filling, nothing
    /// once it is full (a new token overwrites the oldest). A step of L
    /// tokens briefly holds `window - 1 + L`.
    fn bytes_per_token(&self) -> u64 {
        quietly(0, || {
            if self.offset >= self.max_size {
                0
            } else {
                (self.heads as usize * (self.k_dim + self.v_dim) as usize * bytes_of(self.dtype)) as u64
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
        guard(|| {
            if !self.trimmable() {
                return Err(PluginError::unsupported(format!(
                    "kv-rotating: the ring has wrapped ({} tokens in a window of {}); a speculative round cannot be undone",
                    self.offset, self.max_size
                )));
            }
            self.round = Some(Round {
                keys: self.keys.clone(),
                values: self.values.clone(),
                offset: self.offset,
                idx: self.idx,
                appended: Vec::new(),
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
        guard(|| self.rollback(keep.as_slice()))
    }

    fn rows(&self) -> u32 {
        quietly(1, || 1)
    }

    /// A serial cache is its one row: keeping row 0 changes nothing.
    fn filter_rows(&mut self, keep: RSlice<'_, u32>) -> PResult<()> {
        guard(|| match keep.as_slice() {
            [0] => Ok(()),
            k => Err(PluginError::invalid_input(format!(
                "kv-rotating: a serial cache holds row 0 only, asked to keep {k:?}"
            ))),
        })
    }

    fn extract_row(&self, row: u32) -> PResult<CacheState> {
        guard(|| match row {
            0 => Ok(self.state()),
            r => Err(PluginError::invalid_input(format!("extract_row: row {r} of a serial cache"))),
        })
    }

    fn merge_rows(&mut self, _rows: RVec<CacheState>) -> PResult<()> {
        guard(|| {
            Err(PluginError::unsupported(
                "kv-rotating: rows merge into a batch cache (created with 0 rows), not a serial one",
            ))
        })
    }

    fn get_slot(&self, _i: u32) -> PResult<ROption<Tensor>> {
        guard(|| Err(PluginError::unsupported("kv-rotating has no recurrent slots")))
    }

    fn set_slot(&mut self, _i: u32, _value: Tensor) -> PResult<()> {
        guard(|| Err(PluginError::unsupported("kv-rotating has no recurrent slots")))
    }
}

#[cfg(test)]
mod batch_tests;
#[cfg(test)]
mod tests;
