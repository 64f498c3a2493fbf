//! The attention mask of one layer's next queries (what a cache layout
//! answers: `attention::Mask::for_cache`).

use crate::Array;

/// The attention mask for the next `queries` tokens of one layer.
pub enum Mask {
    None,
    Causal,
    Array(Array),
}
