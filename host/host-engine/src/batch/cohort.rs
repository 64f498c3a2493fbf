//! Cohort prefill: requests that arrive together prefill as ONE left-padded
//! `[B, L]` batch instead of one after another, so a burst of clients gets
//! its first tokens after one pass over the device rather than B passes.
//!
//! The caches are told each row's padding before the first chunk
//! (`CacheLayout::begin_padded`); positions and masks then hide the padding
//! exactly as they do for rows merged later. Chunks run over columns, at
//! most `prefill_step / B` at a time, so running rows still wait at most
//! about one serial chunk's worth of work between decode steps.
//!
//! Members with the same head (the choices of one `n` > 1 request, or
//! identical prompts) prefill it ONCE: the cohort's caches hold one row per
//! distinct head, and each member lands from that row's state. Layouts that
//! share by reference (kv-paged) then hold one copy for all of them.

use crate::engine::Engine;
use crate::error::EngineError;
use plugin_api::abi_stable::std_types::RSlice;
use plugin_api::CacheBox;

/// A cohort's shared prefill state.
pub struct Cohort {
    /// Batch caches, one row per distinct head, left-padded to the longest.
    pub caches: Vec<CacheBox>,
    /// Each distinct head (a member's prompt minus its last token: what
    /// prefill covers), in the order first met.
    heads: Vec<Vec<u32>>,
    /// Each member's row in `caches`.
    row_of: Vec<usize>,
    pads: Vec<usize>,
    /// Columns of the padded `[B, width]` token matrix already prefilled.
    done: usize,
    width: usize,
}

/// Which of the candidates (head lengths, in arrival order) prefill
/// together: the first one and every later one within a factor of two of
/// its length, so padding never exceeds half of the computed columns.
/// Fewer than two members is no cohort.
pub fn choose(heads: &[usize]) -> Vec<usize> {
    let Some(&anchor) = heads.first() else { return Vec::new() };
    if anchor == 0 {
        return Vec::new();
    }
    let picked: Vec<usize> = heads
        .iter()
        .enumerate()
        .filter(|&(_, &n)| n > 0 && n <= anchor * 2 && n * 2 >= anchor)
        .map(|(i, _)| i)
        .collect();
    if picked.len() < 2 {
        Vec::new()
    } else {
        picked
    }
}

impl Cohort {
    /// Fresh padded caches for these heads, or `None` when a layout cannot
    /// start padded rows (the caller then prefills one at a time).
    pub fn start(engine: &Engine, members: Vec<Vec<u32>>) -> Result<Option<Self>, EngineError> {
        let mut heads: Vec<Vec<u32>> = Vec::new();
        let row_of = members
            .into_iter()
            .map(|h| match heads.iter().position(|u| *u == h) {
                Some(r) => r,
                None => {
                    heads.push(h);
                    heads.len() - 1
                }
            })
            .collect();
        let width = heads.iter().map(Vec::len).max().unwrap_or(0);
        let pads: Vec<usize> = heads.iter().map(|h| width - h.len()).collect();
        let mut caches = engine.model().new_caches(0)?;
        let p32: Vec<u32> = pads.iter().map(|&p| p as u32).collect();
        for c in caches.iter_mut() {
            if c.begin_padded(RSlice::from_slice(&p32)).into_result().is_err() {
                return Ok(None);
            }
        }
        Ok(Some(Self { caches, heads, row_of, pads, done: 0, width }))
    }

    /// Rows the caches hold (distinct heads).
    pub fn rows(&self) -> usize {
        self.heads.len()
    }

    /// Whether every member has a row of its own (no head repeats): the
    /// caches can then become the batch as they are.
    pub fn one_row_per_member(&self) -> bool {
        self.row_of.len() == self.heads.len()
    }

    /// Whether member `m` is the first with its head (the one whose state
    /// the prefix cache gets).
    pub fn first_with_its_head(&self, m: usize) -> bool {
        self.row_of.iter().position(|&r| r == self.row_of[m]) == Some(m)
    }

    /// Runs the next chunk of columns; true once every head is in.
    pub fn advance(&mut self, engine: &Engine) -> Result<bool, EngineError> {
        let b = self.rows();
        let cols = (engine.prefill_step() / b).max(32).min(self.width - self.done);
        let mut ids = Vec::with_capacity(b * cols);
        for (h, &pad) in self.heads.iter().zip(&self.pads) {
            for c in self.done..self.done + cols {
                // Padding columns carry the row's first token: any valid id
                // works, the mask hides them from every real query.
                ids.push(if c < pad { h[0] } else { h[c - pad] });
            }
        }
        let input = crate::tensors::token_array(&ids).reshape(&[b as i32, cols as i32])?;
        engine.prefill_chunk(&input, &mut self.caches)?;
        self.done += cols;
        Ok(self.done >= self.width)
    }

    /// The 1-row state of member `m` (prefix cache, merging into a batch).
    pub fn row_state(&self, m: usize) -> Result<Vec<plugin_api::CacheState>, EngineError> {
        self.caches.iter().map(|c| extract(c, self.row_of[m])).collect()
    }

    /// Member `m`'s state in layer `layer`'s cache.
    pub fn layer_row_state(&self, layer: usize, m: usize) -> Result<plugin_api::CacheState, EngineError> {
        extract(&self.caches[layer], self.row_of[m])
    }

    pub fn head(&self, m: usize) -> &[u32] {
        &self.heads[self.row_of[m]]
    }
}

fn extract(c: &CacheBox, row: usize) -> Result<plugin_api::CacheState, EngineError> {
    c.extract_row(row as u32).into_result().map_err(|e| EngineError::Model(format!("extract_row: {e}")))
}

#[cfg(test)]
mod tests {
    use super::choose;

    #[test]
    fn members_are_within_a_factor_of_two_of_the_first() {
        assert_eq!(choose(&[100, 60, 201, 50, 200, 10]), vec![0, 1, 3, 4]);
        assert_eq!(choose(&[100, 10, 300]), Vec::<usize>::new(), "alone is no cohort");
        assert_eq!(choose(&[0, 0]), Vec::<usize>::new(), "nothing to prefill");
        assert_eq!(choose(&[]), Vec::<usize>::new());
    }
}
