//! Cohort prefill: requests that arrive together prefill as ONE left-padded
//! `[B, L]` batch instead of one after another, so a burst of clients gets
//! its first tokens after one pass over the device rather than B passes.
//!
//! The caches are told each row's padding before the first chunk
//! (`CacheLayout::begin_padded`); positions and masks then hide the padding
//! exactly as they do for rows merged later. Chunks run over columns, at
//! most `prefill_step / B` at a time, so running rows still wait at most
//! about one serial chunk's worth of work between decode steps.

use crate::engine::{Engine, EngineError};
use plugin_api::abi_stable::std_types::RSlice;
use plugin_api::CacheBox;

/// A cohort's shared prefill state.
pub struct Cohort {
    /// Batch caches, one row per member, left-padded to the longest head.
    pub caches: Vec<CacheBox>,
    /// Each member's prompt minus its last token (what prefill covers).
    heads: Vec<Vec<u32>>,
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
    pub fn start(engine: &Engine, heads: Vec<Vec<u32>>) -> Result<Option<Self>, EngineError> {
        let width = heads.iter().map(Vec::len).max().unwrap_or(0);
        let pads: Vec<usize> = heads.iter().map(|h| width - h.len()).collect();
        let mut caches = engine.model().new_caches(0)?;
        let p32: Vec<u32> = pads.iter().map(|&p| p as u32).collect();
        for c in caches.iter_mut() {
            if c.begin_padded(RSlice::from_slice(&p32)).into_result().is_err() {
                return Ok(None);
            }
        }
        Ok(Some(Self { caches, heads, pads, done: 0, width }))
    }

    pub fn rows(&self) -> usize {
        self.heads.len()
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
        let input = crate::engine::token_array(&ids).reshape(&[b as i32, cols as i32])?;
        engine.prefill_chunk(&input, &mut self.caches)?;
        self.done += cols;
        Ok(self.done >= self.width)
    }

    /// The 1-row state of member `row` (prefix cache, merging into a batch).
    pub fn row_state(&self, row: usize) -> Result<Vec<plugin_api::CacheState>, EngineError> {
        self.caches
            .iter()
            .map(|c| {
                c.extract_row(row as u32).into_result().map_err(|e| EngineError::Model(format!("extract_row: {e}")))
            })
            .collect()
    }

    pub fn head(&self, row: usize) -> &[u32] {
        &self.heads[row]
    }
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
