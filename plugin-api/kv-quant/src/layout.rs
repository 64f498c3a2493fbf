//! [`Quantized`]: a cache layout in a quantized scheme, around a layout that
//! moves token columns ([`Columns`]).
//!
//! Semantics are mlx-lm's `generate_step` with `kv_bits`: the cache starts
//! as a plain one (mlx-lm's `KVCache`) and, once a model call has left it
//! holding at least `quantized_kv_start` tokens (and at least one), every
//! stored token is quantized (`KVCache.to_quantized`) and later tokens are
//! quantized as they arrive (`QuantizedKVCache`). mlx-lm converts right
//! after that call; here the layout converts at its next update (or at
//! `spec_begin`), which no forward pass separates from the call, so every
//! forward sees the same K/V. A speculative round never converts mid-round
//! (its rollback restores what `spec_begin` saw): a round that crosses
//! `quantized_kv_start` converts at the next update after it.
//!
//! Rows: a batch converts as a whole, when its longest row reaches the
//! start; a row joining a converted batch is converted as it joins, and a
//! converted row joining converts the batch. With a start of 0 (the
//! default) every row has converted by the time it joins (its prefill was a
//! model call), so each row converts exactly where it would alone.
//!
//! Exported states carry the scheme and whether they hold codes in their
//! signature (`kv:affine8:g64:<inner>`, `kv:turbo:k8v3:g64:<inner>`, where
//! the inner layout's signature names its widths and dtype), so the prefix
//! cache never mixes schemes.

use crate::attention::QMask;
use crate::codec::Widths;
use crate::scheme::Scheme;
use model_kit::{error, Array, Result};
use plugin_api::abi_stable::std_types::{ROption, RSlice, RString, RVec};
use plugin_api::{
    AttentionMask, CacheLayout, CacheState, KvPair, MaskMode, MaskRef, PResult, PluginError, Positions, Tensor,
    TensorRef,
};
use plugin_sdk::{guard, into_array, into_tensor, mlx_error, quietly, to_array};

/// A layout whose storage is token columns `[B, H, T, width]` of one dtype,
/// moved whole by every operation (grow, write, trim, ring, pad, gather,
/// export): it can hold codes in place of K/V.
pub trait Columns: CacheLayout + Sized {
    /// An empty layout like this one whose tokens are `w` wide: the one-row
    /// form rows travel in when `one_row`, else this layout's own kind.
    fn blank(&self, w: Widths, one_row: bool) -> Self;

    /// Maps every stored key and value array (the whole storage, including
    /// columns not written yet) through `keys` / `values`, token by token,
    /// and takes `w` as its widths from now on.
    fn recode(
        &mut self,
        w: Widths,
        keys: &dyn Fn(&Array) -> Result<Array>,
        values: &dyn Fn(&Array) -> Result<Array>,
    ) -> Result<()>;
}

/// A layout in a quantized scheme (`KvCodec`) around `L`.
pub struct Quantized<L: Columns> {
    inner: L,
    scheme: Scheme,
    /// The layer's K/V widths, and those of its codes.
    plain: Widths,
    packed: Widths,
    /// Whether `inner` holds codes (mlx-lm: a `QuantizedKVCache`).
    coded: bool,
    /// Speculative rounds open (begun, not yet committed or rolled back;
    /// more than one when rounds overlap).
    open_rounds: usize,
}

fn fails(e: model_kit::Exception) -> PluginError {
    mlx_error(e)
}

impl<L: Columns> Quantized<L> {
    /// `inner` is empty, in the layer's plain widths.
    pub fn new(inner: L, scheme: Scheme, plain: Widths) -> Result<Self> {
        let packed = scheme.codec.packed(plain)?;
        Ok(Self { inner, scheme, plain, packed, coded: false, open_rounds: 0 })
    }

    fn convert(&mut self) -> Result<()> {
        let codec = &self.scheme.codec;
        let (keys, values) = (|k: &Array| codec.encode_keys(k), |v: &Array| codec.encode_values(v));
        self.inner.recode(self.packed, &keys, &values)?;
        self.coded = true;
        Ok(())
    }

    /// mlx-lm's `maybe_quantize_kv_cache`: converts once the cache holds
    /// `start` tokens (and any at all), outside speculative rounds.
    fn convert_if_due(&mut self) -> Result<()> {
        let held = CacheLayout::offset(&self.inner);
        if !self.coded && self.open_rounds == 0 && held > 0 && held >= self.scheme.start {
            self.convert()?;
        }
        Ok(())
    }

    fn signature_of(&self, inner: &str) -> RString {
        format!("kv:{}:{inner}", self.scheme.codec.tag()).into()
    }

    fn wrap(&self, mut state: CacheState) -> CacheState {
        state.signature = self.signature_of(&state.signature);
        state
    }

    /// Whether a state of this scheme holds codes; its signature becomes
    /// the inner layout's.
    fn unwrap(&self, state: &mut CacheState) -> std::result::Result<bool, PluginError> {
        for coded in [false, true] {
            let inner = CacheLayout::signature(&self.inner.blank(self.widths(coded), true));
            if state.signature == self.signature_of(&inner) {
                state.signature = inner;
                return Ok(coded);
            }
        }
        Err(PluginError::invalid_input(format!(
            "state of `{}` cannot be imported into `{}`",
            state.signature,
            CacheLayout::signature(self)
        )))
    }

    fn widths(&self, coded: bool) -> Widths {
        if coded {
            self.packed
        } else {
            self.plain
        }
    }

    /// A one-row plain state as codes.
    fn coded_row(&self, state: CacheState) -> std::result::Result<CacheState, PluginError> {
        let mut one = self.inner.blank(self.plain, true);
        one.import_state(state).into_result()?;
        let codec = &self.scheme.codec;
        let (keys, values) = (|k: &Array| codec.encode_keys(k), |v: &Array| codec.encode_values(v));
        one.recode(self.packed, &keys, &values).map_err(fails)?;
        one.export_state().into_result()
    }

    /// Stores `k`/`v` as codes and attends `q` over every stored code.
    fn attend_codes(&mut self, q: &Array, k: &Array, v: &Array, scale: f32, mask: QMask) -> Result<Array> {
        if k.dtype() != self.plain.dtype || v.dtype() != self.plain.dtype {
            return Err(error(format!(
                "quantized K/V: keys in {:?} / values in {:?}, the cache was made for {:?}",
                k.dtype(),
                v.dtype(),
                self.plain.dtype
            )));
        }
        let codec = &self.scheme.codec;
        let stored = self
            .inner
            .update_and_fetch(into_tensor(codec.encode_keys(k)?), into_tensor(codec.encode_values(v)?))
            .into_result()
            .map_err(|e| error(e.to_string()))?;
        codec.attend(q, &into_array(stored.keys), &into_array(stored.values), self.plain, scale, &mask)
    }
}

impl<L: Columns> CacheLayout for Quantized<L> {
    fn signature(&self) -> RString {
        quietly(RString::new(), || self.signature_of(&CacheLayout::signature(&self.inner)))
    }

    fn offset(&self) -> u64 {
        CacheLayout::offset(&self.inner)
    }

    fn positions(&self) -> PResult<Positions> {
        self.inner.positions()
    }

    fn attention_mask(&self, queries: u32) -> PResult<AttentionMask> {
        self.inner.attention_mask(queries)
    }

    fn update_and_fetch(&mut self, keys: Tensor, values: Tensor) -> PResult<KvPair> {
        guard(|| {
            self.convert_if_due().map_err(fails)?;
            if self.coded {
                return Err(PluginError::unsupported(
                    "quantized K/V are stored as codes: the model graph must attend through the layout \
                     (CacheLayout::attend, advertised as `layout-attention`)",
                ));
            }
            self.inner.update_and_fetch(keys, values).into_result()
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
        guard(|| {
            self.convert_if_due().map_err(fails)?;
            if !self.coded {
                // Plain K/V until the start: the graph attends as usual.
                return Ok(ROption::RNone);
            }
            let mask = match (mask.mode, mask.array) {
                (MaskMode::NONE, _) => QMask::None,
                (MaskMode::CAUSAL, _) => QMask::Causal,
                (MaskMode::ARRAY, ROption::RSome(a)) => QMask::Array(to_array(a)),
                (mode, _) => {
                    return Err(PluginError::invalid_input(format!("attend: mask mode {} without an array", mode.0)))
                }
            };
            let (q, k, v) = (to_array(queries), to_array(keys), to_array(values));
            let out = self.attend_codes(&q, &k, &v, scale, mask).map_err(fails)?;
            Ok(ROption::RSome(into_tensor(out)))
        })
    }

    fn is_trimmable(&self) -> bool {
        self.inner.is_trimmable()
    }

    fn trim(&mut self, n: u64) -> u64 {
        self.inner.trim(n)
    }

    /// What a token costs once stored as codes (also before the switch:
    /// admission plans for the steady state).
    fn bytes_per_token(&self) -> u64 {
        quietly(0, || {
            let inner = self.inner.bytes_per_token();
            if self.coded {
                inner
            } else {
                inner * self.packed.token_bytes() / self.plain.token_bytes().max(1)
            }
        })
    }

    fn export_state(&self) -> PResult<CacheState> {
        guard(|| Ok(self.wrap(self.inner.export_state().into_result()?)))
    }

    fn import_state(&mut self, mut state: CacheState) -> PResult<()> {
        guard(|| {
            let coded = self.unwrap(&mut state)?;
            let mut inner = self.inner.blank(self.widths(coded), false);
            inner.import_state(state).into_result()?;
            self.inner = inner;
            self.coded = coded;
            self.open_rounds = 0;
            Ok(())
        })
    }

    fn spec_begin(&mut self) -> PResult<()> {
        guard(|| {
            self.convert_if_due().map_err(fails)?;
            self.inner.spec_begin().into_result()?;
            self.open_rounds += 1;
            Ok(())
        })
    }

    fn spec_commit(&mut self) -> PResult<()> {
        self.open_rounds = self.open_rounds.saturating_sub(1);
        self.inner.spec_commit()
    }

    fn spec_rollback(&mut self, keep: RSlice<'_, u64>) -> PResult<()> {
        self.open_rounds = 0;
        self.inner.spec_rollback(keep)
    }

    fn rows(&self) -> u32 {
        self.inner.rows()
    }

    fn filter_rows(&mut self, keep: RSlice<'_, u32>) -> PResult<()> {
        self.inner.filter_rows(keep)
    }

    fn extract_row(&self, row: u32) -> PResult<CacheState> {
        guard(|| Ok(self.wrap(self.inner.extract_row(row).into_result()?)))
    }

    fn merge_rows(&mut self, rows: RVec<CacheState>) -> PResult<()> {
        guard(|| {
            let mut states = rows.into_vec();
            let mut coded = Vec::with_capacity(states.len());
            for s in states.iter_mut() {
                coded.push(self.unwrap(s)?);
            }
            if !self.coded && coded.iter().any(|&c| c) {
                self.convert().map_err(fails)?;
            }
            if self.coded {
                states = states
                    .into_iter()
                    .zip(coded)
                    .map(|(s, c)| if c { Ok(s) } else { self.coded_row(s) })
                    .collect::<std::result::Result<_, _>>()?;
            }
            self.inner.merge_rows(states.into()).into_result()
        })
    }

    fn get_slot(&self, _i: u32) -> PResult<ROption<Tensor>> {
        PResult::RErr(PluginError::unsupported("quantized K/V have no recurrent slots"))
    }

    fn set_slot(&mut self, _i: u32, _value: Tensor) -> PResult<()> {
        PResult::RErr(PluginError::unsupported("quantized K/V have no recurrent slots"))
    }

    fn begin_padded(&mut self, pads: RSlice<'_, u32>) -> PResult<()> {
        self.inner.begin_padded(pads)
    }
}
