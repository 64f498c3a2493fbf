//! `CacheSpec.scheme` for the affine schemes: `affine8` or `affine4`, with
//! parameters after a colon, `affine8:group=64,start=0` (mlx-lm's
//! `kv_group_size` and `quantized_kv_start`; these are the defaults).

use crate::codec::Affine;

/// An affine scheme as a layout reads it from its spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AffineScheme {
    pub codec: Affine,
    /// Tokens held before the K/V switch to codes (mlx-lm
    /// `quantized_kv_start`: the cache converts after the first model call
    /// that leaves it holding at least this many, and at least one).
    pub start: u64,
}

impl AffineScheme {
    /// The scheme names this crate serves (claimed as `scheme:<name>`).
    pub const NAMES: [&'static str; 2] = ["affine8", "affine4"];

    /// `Ok(None)` for `plain`, the affine scheme it names, or why not.
    pub fn parse(scheme: &str) -> Result<Option<Self>, String> {
        let (name, params) = scheme.split_once(':').unwrap_or((scheme, ""));
        let bits = match name {
            "plain" => return Ok(None),
            "affine8" => 8,
            "affine4" => 4,
            other => return Err(format!("no scheme `{other}`")),
        };
        let (mut group, mut start) = (64, 0u64);
        for kv in params.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| format!("scheme `{scheme}`: `{kv}` is not key=value"))?;
            let bad = |e: std::num::ParseIntError| format!("scheme `{scheme}`: {k}: {e}");
            match k {
                "group" => group = v.parse().map_err(bad)?,
                "start" => start = v.parse().map_err(bad)?,
                other => return Err(format!("scheme `{scheme}`: unknown parameter `{other}`")),
            }
        }
        let codec = Affine::new(bits, group).map_err(|e| e.what().to_owned())?;
        Ok(Some(Self { codec, start }))
    }
}
