//! Tensor parallelism as mlx-lm's sharded models do it (Megatron-style):
//! a column-parallel linear keeps this rank's slice of the output features
//! (q/k/v, gate/up: whole attention heads, whole MLP channels), a
//! row-parallel linear keeps the matching slice of the input features and
//! sums its partial product over the ranks (o, down: one `all_sum` each).
//! Everything else (embeddings, norms, the LM head, a MoE router) stays
//! whole on every rank, so each block's output, and the logits, are the same
//! on every rank.
//!
//! The host asks for it with the model option `tensor-parallel=<ranks>`
//! (`ModelOpenArgs.options`), only of a family that advertises
//! `caps::TENSOR_PARALLEL`; the ranks' group is MLX's process-wide one, which
//! the host initialized before opening the model (one runtime per process).

use crate::{error, ops, Array, Result};
use mlx_distributed::Group;
use plugin_api::abi_stable::std_types::{RString, Tuple2};
use std::sync::Arc;

/// The model option that carries the number of ranks.
pub const OPTION: &str = plugin_api::caps::TENSOR_PARALLEL_OPTION;

/// This rank's place among the ranks a model is split over (one rank: the
/// whole model, no collectives). One pointer wide: every row-parallel layer
/// holds one.
#[derive(Clone, Default)]
pub struct Shard(Option<Arc<Ranks>>);

struct Ranks {
    group: Group,
    rank: usize,
    size: usize,
}

impl Shard {
    /// The whole model on this process.
    pub fn whole() -> Self {
        Self(None)
    }

    /// Reads `tensor-parallel=<ranks>` from the host's options (absent: the
    /// whole model) and checks it against MLX's process group.
    pub fn from_options(options: &[Tuple2<RString, RString>]) -> Result<Self> {
        let Some(Tuple2(_, v)) = options.iter().find(|Tuple2(k, _)| k.as_str() == OPTION) else {
            return Ok(Self::whole());
        };
        let size: usize = v
            .as_str()
            .parse()
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| error(format!("model option `{OPTION}={v}`: a number of ranks (1 or more)")))?;
        if size == 1 {
            return Ok(Self::whole());
        }
        let group = Group::current().map_err(error)?;
        if group.size() != size {
            return Err(error(format!(
                "model option `{OPTION}={size}`: this process's MLX group has {} ranks (the host starts them: `--tp`)",
                group.size()
            )));
        }
        Ok(Self(Some(Arc::new(Ranks { rank: group.rank(), size, group }))))
    }

    pub fn rank(&self) -> usize {
        self.0.as_ref().map_or(0, |r| r.rank)
    }

    pub fn size(&self) -> usize {
        self.0.as_ref().map_or(1, |r| r.size)
    }

    /// This rank's share of `n` whole units (heads, channels, experts'
    /// channels): `n / ranks`, refused in one line unless it divides.
    pub fn split(&self, n: usize, what: &str) -> Result<usize> {
        let ranks = self.size();
        if !n.is_multiple_of(ranks) {
            return Err(error(format!("tensor parallelism over {ranks} ranks: {n} {what} do not divide by {ranks}")));
        }
        Ok(n / ranks)
    }

    /// The sum of a row-parallel layer's partial products over the ranks.
    pub fn all_sum(&self, x: &Array) -> Result<Array> {
        match &self.0 {
            Some(r) => r.group.all_sum(x).map_err(error),
            None => Ok(x.clone()),
        }
    }

    /// This rank's `[start, stop)` slice of `a` along `axis`, of `n` units of
    /// `unit` elements each, as a fresh buffer of its own: a slice would
    /// keep the whole checkpoint tensor alive, so the slice is read now and
    /// copied, and the whole tensor is dropped with the last reference.
    pub fn take(&self, a: &Array, axis: usize) -> Result<Array> {
        if self.size() == 1 {
            return Ok(a.clone());
        }
        let len = a.shape()[axis] as usize;
        let part = self.split(len, "elements")?;
        let mut start = vec![0i32; a.ndim()];
        let mut stop: Vec<i32> = a.shape().to_vec();
        start[axis] = (self.rank() * part) as i32;
        stop[axis] = ((self.rank() + 1) * part) as i32;
        let s = ops::contiguous(&ops::slice(a, &start, &stop)?)?;
        s.eval()?;
        Ok(s.deep_clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> Vec<Tuple2<RString, RString>> {
        pairs.iter().map(|(k, v)| Tuple2(RString::from(*k), RString::from(*v))).collect()
    }

    #[test]
    fn without_the_option_the_model_is_whole() {
        let s = Shard::from_options(&opts(&[("attention", "mlx")])).unwrap();
        assert_eq!((s.rank(), s.size()), (0, 1));
        assert_eq!(s.split(7, "heads").unwrap(), 7);
        let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]);
        assert_eq!(s.take(&a, 1).unwrap().shape(), [2, 2]);
    }

    /// A process alone has a group of one: asking for two ranks is refused.
    #[test]
    fn more_ranks_than_the_group_has_are_refused() {
        let e = Shard::from_options(&opts(&[(OPTION, "2")])).err().unwrap();
        assert!(e.what().contains("this process's MLX group has 1 ranks"), "{}", e.what());
        let e = Shard::from_options(&opts(&[(OPTION, "zero")])).err().unwrap();
        assert!(e.what().contains("a number of ranks"), "{}", e.what());
    }
}
