//! Which kernels a model's graph takes where model-kit has a choice, set
//! per model at open from the host's options (`ModelOpenArgs.options`,
//! `host --model-option key=value`):
//!
//! | key | values | default | what |
//! |---|---|---|---|
//! | `attention` | `fast`, `mlx` | `fast` | multi-token queries on a GPU: `fast` takes `short_attention`'s paths below the two limits and pads longer causal chunks to a planned shape (`bucketed_attention`), and queries at head sizes past 128 (one, or up to `attention-per-query-max` unmasked or causal) take our decode kernel in one launch (`decode_attention::unmasked`); `mlx` sends every query to MLX's sdpa as it is, as mlx-lm (both limits 0, no padding) |
//! | `attention-per-query-max` | integer | 16 | queries up to this many attend one by one through the fused single-query kernel; at a head size past 128, all of them in one launch of `decode_attention::unmasked` (0: off) |
//! | `attention-unfused-max` | integer | 2048 | longer queries up to this many attend through unfused matmuls while the scores stay small (0: off) |
//! | `conv` | `fused`, `mlx` | `fused` | the depthwise causal conv on a GPU: one fused kernel, or MLX's conv1d |
//! | `gemv` | `fused`, `mlx` | `fused` | a decode step's projections on a GPU: fused with their norm, residual or SwiGLU, and an untied LM head, as our kernels (`fused_layers`), or MLX's matmul and separate ops |
//!
//! On the CPU every choice runs MLX's own kernels. `graph::into_model`
//! parses the options once and puts them in force, for this model only,
//! around each of its forward passes (a target and a draft model of the
//! same family may differ). It refuses any other key, so a family with
//! options of its own takes them out first ([`take_options`]).

use plugin_api::abi_stable::std_types::{RString, RVec, Tuple2};
use std::cell::Cell;

/// Removes the options whose key is one of `keys` (a family's own) from
/// `options` and returns them, in order, leaving model-kit's for
/// `graph::into_model`.
pub fn take_options(options: &mut RVec<Tuple2<RString, RString>>, keys: &[&str]) -> Vec<(String, String)> {
    let (mine, rest): (Vec<_>, Vec<_>) =
        std::mem::take(options).into_iter().partition(|Tuple2(k, _)| keys.contains(&k.as_str()));
    *options = rest.into_iter().collect();
    mine.into_iter().map(|Tuple2(k, v)| (k.into_string(), v.into_string())).collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Routes {
    pub per_query_max: i32,
    pub unfused_max: i32,
    /// Causal chunks past the unfused path padded to a bucketed shape.
    pub bucket_causal: bool,
    /// Queries at head sizes MLX has no fused kernel for attend through
    /// `decode_attention::unmasked`.
    pub decode_kernel: bool,
    pub fused_conv: bool,
    pub fused_gemv: bool,
}

/// Queries up to this long take `short_attention`'s unfused path on a GPU,
/// unless the model option `attention-unfused-max` says another length.
pub const MAX_QUERY: i32 = 2048;

/// Queries up to this long attend one by one (`short_attention::per_query`)
/// on a GPU when the mask is causal or absent; the model option
/// `attention-per-query-max` overrides (0 = off).
pub const PER_QUERY_MAX: i32 = 16;

impl Default for Routes {
    fn default() -> Self {
        Self {
            per_query_max: PER_QUERY_MAX,
            unfused_max: MAX_QUERY,
            bucket_causal: true,
            decode_kernel: true,
            fused_conv: true,
            fused_gemv: true,
        }
    }
}

impl Routes {
    /// Reads the options model-kit knows; any other key is refused, naming it.
    pub fn from_options(options: &[Tuple2<RString, RString>]) -> crate::Result<Self> {
        let mut r = Self::default();
        for Tuple2(key, value) in options {
            let (k, v) = (key.as_str(), value.as_str());
            let int = || v.parse::<i32>().ok().filter(|n| *n >= 0);
            let bad =
                || crate::error(format!("model option `{k}={v}`: see model-kit's routes for the values it takes"));
            match k {
                "attention" => match v {
                    "fast" => {}
                    "mlx" => {
                        r.per_query_max = 0;
                        r.unfused_max = 0;
                        r.bucket_causal = false;
                        r.decode_kernel = false;
                    }
                    _ => return Err(bad()),
                },
                "attention-per-query-max" => r.per_query_max = int().ok_or_else(bad)?,
                "attention-unfused-max" => r.unfused_max = int().ok_or_else(bad)?,
                "conv" => {
                    r.fused_conv = match v {
                        "fused" => true,
                        "mlx" => false,
                        _ => return Err(bad()),
                    }
                }
                "gemv" => {
                    r.fused_gemv = match v {
                        "fused" => true,
                        "mlx" => false,
                        _ => return Err(bad()),
                    }
                }
                // Read by `shard` when the checkpoint opens.
                crate::shard::OPTION => {}
                _ => return Err(crate::error(format!("unknown model option `{k}` (model-kit takes attention, attention-per-query-max, attention-unfused-max, conv, gemv)"))),
            }
        }
        Ok(r)
    }
}

thread_local! {
    static CURRENT: Cell<Routes> = Cell::new(Routes::default());
}

/// The routes in force for the forward pass running on this thread.
pub fn current() -> Routes {
    CURRENT.with(Cell::get)
}

/// Runs `f` with `routes` in force on this thread, restoring what was
/// before (a drafter's model may run inside the target's pass).
pub fn with<T>(routes: Routes, f: impl FnOnce() -> T) -> T {
    let before = CURRENT.with(|c| c.replace(routes));
    struct Restore(Routes);
    impl Drop for Restore {
        fn drop(&mut self) {
            CURRENT.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(before);
    f()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(kv: &[(&str, &str)]) -> Vec<Tuple2<RString, RString>> {
        kv.iter().map(|(k, v)| Tuple2(RString::from(*k), RString::from(*v))).collect()
    }

    #[test]
    fn options_set_the_routes_and_unknown_ones_are_refused() {
        assert_eq!(Routes::from_options(&[]).unwrap(), Routes::default());
        let mlx = Routes::from_options(&opts(&[("attention", "mlx")])).unwrap();
        assert_eq!((mlx.per_query_max, mlx.unfused_max, mlx.bucket_causal, mlx.decode_kernel), (0, 0, false, false));
        let r =
            Routes::from_options(&opts(&[("attention-unfused-max", "64"), ("conv", "mlx"), ("gemv", "mlx")])).unwrap();
        assert_eq!((r.unfused_max, r.fused_conv, r.fused_gemv), (64, false, false));
        assert!(Routes::from_options(&opts(&[("gemv", "fast")])).unwrap_err().what().contains("gemv=fast"));
        assert!(Routes::from_options(&opts(&[("attention", "slow")])).unwrap_err().what().contains("attention=slow"));
        assert!(Routes::from_options(&opts(&[("colour", "red")]))
            .unwrap_err()
            .what()
            .contains("unknown model option `colour`"));
    }

    #[test]
    fn a_family_takes_its_own_options_out_and_leaves_model_kits() {
        let mut o: RVec<_> = opts(&[("attention", "mlx"), ("my-scale", "2"), ("conv", "mlx")]).into_iter().collect();
        assert_eq!(take_options(&mut o, &["my-scale"]), [("my-scale".to_owned(), "2".to_owned())]);
        assert!(!Routes::from_options(&o).unwrap().fused_conv);
        assert_eq!(o.len(), 2);
    }

    #[test]
    fn routes_are_in_force_only_inside_with() {
        let mlx = Routes {
            per_query_max: 0,
            unfused_max: 0,
            bucket_causal: false,
            decode_kernel: false,
            fused_conv: false,
            fused_gemv: false,
        };
        assert_eq!(with(mlx, current), mlx);
        assert_eq!(current(), Routes::default());
    }
}
