//! The assistant's logits from its normed state: its own embedding matrix
//! (`model.embed_tokens`, tied), an `lm_head` (untied), or the centroid
//! head of mlx-vlm's `MaskedEmbedder` (`use_ordered_embeddings`):
//! `masked_embedding.centroids` scores `C` clusters, the top `k` clusters'
//! tokens (`token_ordering` lists each cluster's `V / C` token ids, one
//! cluster after another) are scored against the embedding matrix, and
//! every other token gets the lowest selected logit minus one, so it never
//! wins an argmax and keeps a small share of a sampled distribution.

use crate::config::Args;
use model_kit::layers::{Embedding, Linear, LoadCtx};
use model_kit::{error, Array, Result};
use plugin_sdk::mlx_rs::ops::indexing::{put_along_axis, IndexOp};
use plugin_sdk::mlx_rs::{ops, Dtype};

pub struct Centroids {
    centroids: Linear,
    /// int32 `[C, V / C]`.
    ordering: Array,
    top_k: i32,
}

pub struct Head {
    embed: Embedding,
    lm_head: Option<Linear>,
    centroids: Option<Centroids>,
    vocab: i32,
}

impl Head {
    pub fn load(ctx: &mut LoadCtx, a: &Args) -> Result<Self> {
        let embed = Embedding::load(ctx, "model.embed_tokens", a.vocab_size, a.hidden)?;
        let lm_head = if a.tied { None } else { Some(Linear::load(ctx, "lm_head", a.vocab_size, a.hidden, false)?) };
        let centroids = match a.centroids {
            None => None,
            Some((c, k)) => {
                if c == 0 || !a.vocab_size.is_multiple_of(c) || k == 0 || k > c {
                    return Err(error(format!(
                        "centroid head: {c} centroids (top {k}) do not split the vocabulary of {}",
                        a.vocab_size
                    )));
                }
                let ordering = ctx.take("masked_embedding.token_ordering", &[a.vocab_size])?;
                let ordering = ordering.as_dtype(Dtype::Int32)?.reshape(&[c as i32, (a.vocab_size / c) as i32])?;
                ctx.loaded.push(ordering.clone());
                Some(Centroids {
                    centroids: Linear::load(ctx, "masked_embedding.centroids", c, a.hidden, false)?,
                    ordering,
                    top_k: k as i32,
                })
            }
        };
        Ok(Self { embed, lm_head, centroids, vocab: a.vocab_size as i32 })
    }

    /// Logits `[1, L, V]` for the normed state `h` `[1, L, hidden]`.
    pub fn logits(&self, h: &Array) -> Result<Array> {
        match (&self.centroids, &self.lm_head) {
            (Some(c), _) => self.sparse(c, h),
            (None, Some(l)) => l.forward(h),
            (None, None) => self.embed.as_linear(h),
        }
    }

    /// The centroid head over one row's positions (`[1, L, hidden]`).
    fn sparse(&self, c: &Centroids, h: &Array) -> Result<Array> {
        let l = h.shape()[1];
        let scores = c.centroids.forward(h)?;
        let clusters = ops::argpartition_axis(&scores, -c.top_k, -1)?;
        let n = scores.shape()[2];
        let clusters = clusters.index((.., .., (n - c.top_k)..n));
        // [1, L, k, V/C] token ids, flattened per position.
        let ids = c.ordering.take_axis(&clusters, 0)?.reshape(&[1, l, -1])?;
        let rows = self.embed.forward(&ids)?;
        let selected = h.expand_dims(-2)?.matmul(rows.swap_axes(-1, -2)?)?.squeeze_axes(&[-2])?;
        let fill = selected.min(None)?.subtract(Array::from_f32(1.0).as_dtype(selected.dtype())?)?;
        let full = ops::broadcast_to(&fill, &[1, l, self.vocab])?;
        put_along_axis(&full, &ids, &selected, -1)
    }
}
