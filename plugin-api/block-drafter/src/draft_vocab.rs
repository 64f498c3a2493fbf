//! speculators' reduced draft vocabulary (`draft_vocab_size` below the
//! verifier's): the drafter scores only D of the verifier's V tokens
//! (speculators' `DraftVocabMixin`). `t2d` `[V]` (bool) marks them; `d2t`
//! `[D]` maps draft id `i` to verifier id `i + d2t[i]`, as vLLM's EAGLE-3
//! and mlx-vlm's read it. The logits come from the checkpoint's `lm_head`
//! `[D, H]` when it carries one, else from the verifier's head at those D
//! rows (what speculators fills a frozen head with). Drafts leave the
//! drafter as verifier ids; the Markov head reads the previous token by its
//! verifier id (`markov_w1` `[V, r]`) and corrects the D logits
//! (`markov_w2` `[D, r]`); probability rows go to the host over all V.

use model_kit::layers::{Linear, LoadCtx};
use model_kit::{error, Array, Dtype, Result};
use plugin_sdk::mlx_rs::ops;

pub struct DraftVocab {
    /// int32 `[D]`: the verifier id of each draft id, ascending.
    ids: Array,
    /// The checkpoint's own head, when it has one.
    head: Option<Linear>,
    verifier: i32,
}

impl DraftVocab {
    /// The maps (checked against each other) and the head, if any.
    pub fn load(ctx: &mut LoadCtx, draft: usize, verifier: usize, hidden: usize) -> Result<Self> {
        let missing = |name: &str| {
            error(format!(
                "draft_vocab_size {draft} (the verifier's is {verifier}) needs the `{name}` map in the checkpoint"
            ))
        };
        if !ctx.weights.contains("t2d") {
            return Err(missing("t2d"));
        }
        if !ctx.weights.contains("d2t") {
            return Err(missing("d2t"));
        }
        let t2d = ctx.take("t2d", &[verifier])?.as_dtype(Dtype::Bool)?;
        let d2t = ctx.take("d2t", &[draft])?.as_dtype(Dtype::Int32)?;
        plugin_sdk::mlx_rs::transforms::eval([&t2d, &d2t])?;
        let ids = verifier_ids(t2d.as_slice::<bool>(), d2t.as_slice::<i32>())?;
        let head = if ctx.weights.contains("lm_head.weight") {
            Some(Linear::load(ctx, "lm_head", draft, hidden, false)?)
        } else {
            None
        };
        Ok(Self { ids: Array::from_slice(&ids, &[draft as i32]), head, verifier: verifier as i32 })
    }

    /// The checkpoint's own head `[D, H]`, if it has one.
    pub fn head(&self) -> Option<&Linear> {
        self.head.as_ref()
    }

    /// The D logits among the verifier's `[.., V]`: its head's rows at the
    /// draft ids, for a checkpoint without a head of its own. Row-major
    /// (MLX's `take` along the last axis hands back a transposed view, which
    /// the host cannot read as rows).
    pub fn columns(&self, verifier_logits: &Array) -> Result<Array> {
        model_kit::ops::contiguous(&verifier_logits.take_axis(&self.ids, -1)?)
    }

    /// The verifier ids (int32) of draft ids `draft` (any integer shape).
    pub fn to_verifier(&self, draft: &Array) -> Result<Array> {
        let flat = draft.as_dtype(Dtype::Int32)?.reshape(&[-1])?;
        self.ids.take_axis(&flat, 0)?.reshape(draft.shape())
    }

    /// Probability rows over the draft ids `[k, D]` as rows over the
    /// verifier's vocabulary `[k, V]` (zero outside the draft vocabulary).
    pub fn spread(&self, q: &Array) -> Result<Array> {
        let (k, d) = (q.shape()[0], q.shape()[1]);
        let at = ops::broadcast_to(self.ids.reshape(&[1, d])?, &[k, d])?;
        ops::zeros_dtype(&[k, self.verifier], q.dtype())?.put_along_axis(&at, q, -1)
    }
}

/// Each draft id's verifier id, `i + d2t[i]`, refused unless they are the
/// tokens `t2d` marks, in order.
fn verifier_ids(t2d: &[bool], d2t: &[i32]) -> Result<Vec<i32>> {
    let marked: Vec<i32> = t2d.iter().enumerate().filter(|(_, &m)| m).map(|(i, _)| i as i32).collect();
    if marked.len() != d2t.len() {
        return Err(error(format!("t2d marks {} verifier tokens, draft_vocab_size is {}", marked.len(), d2t.len())));
    }
    let ids: Vec<i32> = d2t.iter().enumerate().map(|(i, &off)| i as i32 + off).collect();
    if let Some(i) = (0..ids.len()).find(|&i| ids[i] != marked[i]) {
        return Err(error(format!(
            "d2t maps draft id {i} to verifier id {}, but the {i}-th token t2d marks is {}",
            ids[i], marked[i]
        )));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::verifier_ids;

    #[test]
    fn d2t_must_map_onto_the_tokens_t2d_marks() {
        let t2d = [false, true, true, false, true];
        assert_eq!(verifier_ids(&t2d, &[1, 1, 2]).unwrap(), vec![1, 2, 4]);
        let e = verifier_ids(&t2d, &[1, 1, 1]).unwrap_err();
        assert!(e.what().contains("draft id 2 to verifier id 3"), "{}", e.what());
        let e = verifier_ids(&t2d, &[1, 1]).unwrap_err();
        assert!(e.what().contains("t2d marks 3 verifier tokens, draft_vocab_size is 2"), "{}", e.what());
    }
}
