//! Cache layout `toy-layout`, written against plugin-api alone, out of
//! tree: keys and values of ONE row of a full-attention layer, concatenated
//! at each update. It serves the `plain` scheme with trim, speculative
//! rounds and state export/import, and no rows (a host that batches falls
//! back to serial plans with it). Small on purpose: the in-tree `kv-plain`
//! is the layout to read for storage grown in steps and left-padded rows.

use model_kit::ops::{dtype_size, slice};
use model_kit::{error, Array, Result};
use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::abi_stable::std_types::{ROption, RSlice, RString, RVec};
use plugin_api::*;
use plugin_sdk::kv_need::{implicit_mask, KvShape};
use plugin_sdk::{guard, guard_mlx, into_array, into_tensor, mlx_error, quietly, rstrings};

plugin_sdk::export_plugin! {
    manifest: manifest,
    new_cache: new_cache,
}

fn manifest() -> PluginManifest {
    plugin_sdk::manifest!(
        PluginKind::CACHE_LAYOUT,
        "one row of full-attention K/V, concatenated per update (third-party proof of the layout ABI)",
        Claims { cache_needs: rstrings(&["full"]), cache_schemes: rstrings(&["plain"]), ..Default::default() },
        &[caps::TRIM, caps::SPEC_ROUND, caps::STATE_IO],
    )
}

fn new_cache(spec: &CacheSpec) -> std::result::Result<CacheBox, PluginError> {
    if spec.need.kind != NeedKind::FULL || spec.scheme.as_str() != "plain" {
        return Err(PluginError::unsupported(format!(
            "toy-layout serves full attention in the plain scheme, not `{}` in `{}`",
            spec.need.kind.as_str(),
            spec.scheme
        )));
    }
    if spec.rows > 1 {
        return Err(PluginError::unsupported("toy-layout holds one row"));
    }
    let kv = ToyKv {
        keys: None,
        values: None,
        heads: spec.need.kv_heads as i32,
        k_dim: spec.need.k_head_dim as i32,
        v_dim: spec.need.v_head_dim as i32,
        dtype_bytes: dtype_size(
            model_kit::ops::dtype_from_raw(spec.dtype.0).map_err(|e| PluginError::invalid_input(e.what()))?,
        ),
        mark: None,
    };
    Ok(CacheLayout_TO::from_value(kv, TD_Opaque))
}

struct ToyKv {
    /// `[1, H, T, D]`, None before the first update.
    keys: Option<Array>,
    values: Option<Array>,
    heads: i32,
    k_dim: i32,
    v_dim: i32,
    dtype_bytes: usize,
    /// The token count when the current speculative round began.
    mark: Option<u64>,
}

impl ToyKv {
    fn len(&self) -> u64 {
        self.keys.as_ref().map_or(0, |k| k.shape()[2] as u64)
    }

    /// Keeps the first `n` tokens.
    fn keep(&mut self, n: u64) -> Result<()> {
        let cut = |a: &Array| slice(a, &[0, 0, 0, 0], &[a.shape()[0], a.shape()[1], n as i32, a.shape()[3]]);
        if let (Some(k), Some(v)) = (&self.keys, &self.values) {
            let (k, v) = (cut(k)?, cut(v)?);
            self.keys = Some(k);
            self.values = Some(v);
        }
        Ok(())
    }

    fn append(&mut self, k: Array, v: Array) -> Result<(Array, Array)> {
        let (k, v) = match (self.keys.take(), self.values.take()) {
            (Some(ok), Some(ov)) => (mlx_rs::ops::concatenate(&[ok, k], 2)?, mlx_rs::ops::concatenate(&[ov, v], 2)?),
            _ => (k, v),
        };
        self.keys = Some(k.clone());
        self.values = Some(v.clone());
        Ok((k, v))
    }
}

impl CacheLayout for ToyKv {
    fn signature(&self) -> RString {
        format!("toy-kv:h{}:d{}x{}:b{}", self.heads, self.k_dim, self.v_dim, self.dtype_bytes).into()
    }

    fn offset(&self) -> u64 {
        self.len()
    }

    fn positions(&self) -> PResult<Positions> {
        guard(|| Ok(Positions { offset: self.len(), per_row: ROption::RNone }))
    }

    fn attention_mask(&self, queries: u32) -> PResult<AttentionMask> {
        guard(|| Ok(implicit_mask(queries)))
    }

    fn update_and_fetch(&mut self, keys: Tensor, values: Tensor) -> PResult<KvPair> {
        guard(|| {
            let (k, v) = (into_array(keys), into_array(values));
            KvShape { heads: self.heads, k_dim: self.k_dim, v_dim: self.v_dim }.check("toy-layout", &k, &v)?;
            if k.shape()[0] != 1 {
                return Err(PluginError::invalid_input(format!("toy-layout: {} rows given, it holds one", k.shape()[0])));
            }
            #[cfg(feature = "faults")]
            faults::on_update(k.shape()[2]);
            let (k, v) = self.append(k, v).map_err(mlx_error)?;
            Ok(KvPair { keys: into_tensor(k), values: into_tensor(v) })
        })
    }

    fn is_trimmable(&self) -> bool {
        true
    }

    fn trim(&mut self, n: u64) -> u64 {
        quietly(0, || {
            let n = n.min(self.len());
            match self.keep(self.len() - n) {
                Ok(()) => n,
                Err(_) => 0,
            }
        })
    }

    fn bytes_per_token(&self) -> u64 {
        (self.heads as usize * (self.k_dim + self.v_dim) as usize * self.dtype_bytes) as u64
    }

    fn export_state(&self) -> PResult<CacheState> {
        guard(|| {
            let mut tensors = RVec::new();
            if let (Some(k), Some(v)) = (&self.keys, &self.values) {
                tensors.push(into_tensor(k.clone()));
                tensors.push(into_tensor(v.clone()));
            }
            Ok(CacheState { signature: self.signature(), offset: self.len(), tensors, meta: RVec::new() })
        })
    }

    fn import_state(&mut self, state: CacheState) -> PResult<()> {
        guard(|| {
            if state.signature != self.signature() {
                return Err(PluginError::invalid_input(format!(
                    "toy-layout: state `{}` is not `{}`",
                    state.signature,
                    self.signature()
                )));
            }
            let mut t = state.tensors.into_iter().map(into_array);
            (self.keys, self.values) = (t.next(), t.next());
            Ok(())
        })
    }

    fn spec_begin(&mut self) -> PResult<()> {
        guard(|| {
            self.mark = Some(self.len());
            Ok(())
        })
    }

    fn spec_commit(&mut self) -> PResult<()> {
        guard(|| {
            self.mark = None;
            Ok(())
        })
    }

    fn spec_rollback(&mut self, keep: RSlice<'_, u64>) -> PResult<()> {
        guard_mlx(|| {
            let mark = self.mark.take().ok_or_else(|| error("toy-layout: rollback without a round"))?;
            self.keep(mark + keep.first().copied().unwrap_or(0))
        })
    }

    fn rows(&self) -> u32 {
        1
    }

    fn filter_rows(&mut self, keep: RSlice<'_, u32>) -> PResult<()> {
        guard(|| match keep.as_slice() {
            [0] => Ok(()),
            _ => Err(PluginError::unsupported("toy-layout holds one row")),
        })
    }

    fn extract_row(&self, row: u32) -> PResult<CacheState> {
        if row != 0 {
            return guard(|| Err(PluginError::unsupported("toy-layout holds one row")));
        }
        self.export_state()
    }

    fn merge_rows(&mut self, _rows: RVec<CacheState>) -> PResult<()> {
        guard(|| Err(PluginError::unsupported("toy-layout holds one row")))
    }

    fn get_slot(&self, _i: u32) -> PResult<ROption<Tensor>> {
        guard(|| Ok(ROption::RNone))
    }

    fn set_slot(&mut self, _i: u32, _value: Tensor) -> PResult<()> {
        guard(|| Err(PluginError::unsupported("toy-layout keeps no recurrent state")))
    }
}

/// The `faults` variant: what a broken layout does to the process that runs
/// it, on purpose, when one update brings 13 tokens (panics), 14 (aborts)
/// or 15 (writes through a wild pointer).
#[cfg(feature = "faults")]
mod faults {
    pub fn on_update(tokens: i32) {
        match tokens {
            13 => panic!("toy-layout panics on an update of 13 tokens (built with feature faults)"),
            14 => std::process::abort(),
            // SAFETY: none; this variant exists to crash its process.
            15 => unsafe { std::ptr::write_volatile(std::ptr::without_provenance_mut::<u8>(16), 1) },
            _ => {}
        }
    }
}
