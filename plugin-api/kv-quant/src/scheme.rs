//! `CacheSpec.scheme` for the quantized schemes, with parameters after a
//! colon: `affine8` / `affine4` (`affine8:group=64,start=0`, mlx-lm's
//! `kv_group_size` and `quantized_kv_start`; these are the defaults) and
//! `turbo` (`turbo:k=8,v=3,group=64,start=0`: 8-bit affine keys, 3-bit
//! rotated Lloyd-Max values, the defaults).

use crate::attention::{dequantized_sdpa, quantized_sdpa, QMask, Route};
use crate::codec::{Affine, Widths};
use crate::dequantize_rows::dequantize_rows;
use crate::turbo::Turbo;
use model_kit::attention::sdpa;
use model_kit::{Array, Result};

/// How a scheme codes one token's keys and values, and attends them.
#[derive(Clone, Debug, PartialEq)]
pub enum KvCodec {
    Affine(Affine),
    Turbo(Turbo),
}

impl KvCodec {
    /// The codec's part of a state's signature (`affine8:g64`, `turbo:k8v3:g64`).
    pub fn tag(&self) -> String {
        match self {
            KvCodec::Affine(a) => format!("affine{}:g{}", a.bits, a.group),
            KvCodec::Turbo(t) => format!("turbo:k{}v{}:g{}", t.keys.bits, t.v_bits, t.keys.group),
        }
    }

    /// The code widths of a layer whose plain K/V are `plain`.
    pub fn packed(&self, plain: Widths) -> Result<Widths> {
        match self {
            KvCodec::Affine(a) => a.packed(plain),
            KvCodec::Turbo(t) => t.packed(plain),
        }
    }

    pub fn encode_keys(&self, k: &Array) -> Result<Array> {
        match self {
            KvCodec::Affine(a) => a.encode(k),
            KvCodec::Turbo(t) => t.keys.encode(k),
        }
    }

    pub fn encode_values(&self, v: &Array) -> Result<Array> {
        match self {
            KvCodec::Affine(a) => a.encode(v),
            KvCodec::Turbo(t) => t.encode_values(v),
        }
    }

    /// Attention of `q` over stored key and value codes of a layer whose
    /// plain K/V are `plain`, by the route the default device runs.
    pub fn attend(
        &self,
        q: &Array,
        keys: &Array,
        values: &Array,
        plain: Widths,
        scale: f32,
        mask: &QMask,
    ) -> Result<Array> {
        self.attend_by(Route::for_device(), q, keys, values, plain, scale, mask)
    }

    /// `attend` by a given route.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_by(
        &self,
        route: Route,
        q: &Array,
        keys: &Array,
        values: &Array,
        plain: Widths,
        scale: f32,
        mask: &QMask,
    ) -> Result<Array> {
        match self {
            KvCodec::Affine(a) => {
                if route == Route::Dequantized {
                    if let Some(out) =
                        crate::codes_attention::decode_attention(q, keys, values, plain, scale, mask, *a)?
                    {
                        return Ok(out);
                    }
                    if let (Some(k), Some(v)) = (
                        dequantize_rows(keys, plain.k, plain.dtype, *a)?,
                        dequantize_rows(values, plain.v, plain.dtype, *a)?,
                    ) {
                        return sdpa(q, &k, &v, scale, &mask.as_mask());
                    }
                }
                let k = a.decode(keys, plain.k, plain.dtype)?;
                let v = a.decode(values, plain.v, plain.dtype)?;
                match route {
                    Route::QuantizedMatmul => quantized_sdpa(q, &k, &v, scale, mask, *a),
                    Route::Dequantized => dequantized_sdpa(q, &k, &v, scale, mask, *a),
                }
            }
            KvCodec::Turbo(t) => {
                let k = t.keys.decode(keys, plain.k, plain.dtype)?;
                t.attend(route, q, &k, values, plain, scale, mask)
            }
        }
    }
}

/// A quantized scheme as a layout reads it from its spec.
#[derive(Clone, Debug, PartialEq)]
pub struct Scheme {
    pub codec: KvCodec,
    /// Tokens held before the K/V switch to codes (mlx-lm
    /// `quantized_kv_start`: the cache converts after the first model call
    /// that leaves it holding at least this many, and at least one).
    pub start: u64,
}

impl Scheme {
    /// The affine scheme names (claimed as `scheme:<name>`).
    pub const AFFINE: [&'static str; 2] = ["affine8", "affine4"];
    /// TurboQuant's scheme name.
    pub const TURBO: &'static str = "turbo";

    /// `Ok(None)` for `plain`, the scheme it names, or why not.
    pub fn parse(scheme: &str) -> std::result::Result<Option<Self>, String> {
        let (name, params) = scheme.split_once(':').unwrap_or((scheme, ""));
        let bits = match name {
            "plain" => return Ok(None),
            "affine8" => 8,
            "affine4" => 4,
            Self::TURBO => 0,
            other => return Err(format!("no scheme `{other}`")),
        };
        let (mut group, mut start, mut k, mut v) = (64i32, 0u64, 8i32, 3u32);
        for kv in params.split(',').filter(|p| !p.is_empty()) {
            let (key, val) = kv.split_once('=').ok_or_else(|| format!("scheme `{scheme}`: `{kv}` is not key=value"))?;
            let bad = |e: std::num::ParseIntError| format!("scheme `{scheme}`: {key}: {e}");
            match key {
                "group" => group = val.parse().map_err(bad)?,
                "start" => start = val.parse().map_err(bad)?,
                "k" if bits == 0 => k = val.parse().map_err(bad)?,
                "v" if bits == 0 => v = val.parse().map_err(bad)?,
                other => return Err(format!("scheme `{scheme}`: unknown parameter `{other}`")),
            }
        }
        let codec = if bits == 0 {
            KvCodec::Turbo(Turbo::new(k, v, group).map_err(|e| e.what().to_owned())?)
        } else {
            KvCodec::Affine(Affine::new(bits, group).map_err(|e| e.what().to_owned())?)
        };
        Ok(Some(Self { codec, start }))
    }
}
