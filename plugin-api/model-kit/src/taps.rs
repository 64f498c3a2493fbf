//! Hidden taps (`ForwardArgs::taps`, capability `hidden-taps`): the
//! residual stream `[B, L, H]` right after decoder layer `i` (the whole
//! layer: attention, MLP and whatever the family adds to the residual
//! before the next layer), before the final norm. `i` counts every decoder
//! layer from 0, including layers that hold no cache (Gemma 4's KV-shared
//! ones). Taps come back in the order they were asked for, one per index.

use crate::{error, Array, Result};
use plugin_api::abi_stable::std_types::RVec;
use plugin_api::{ForwardArgs, Tensor};
use plugin_sdk::into_tensor;

/// Collects the taps one forward pass was asked for.
pub struct Taps<'a> {
    wanted: &'a [u32],
    got: Vec<Option<Array>>,
}

impl<'a> Taps<'a> {
    /// Refuses an index past the model's `layers` decoder layers.
    pub fn new(args: &ForwardArgs<'a>, layers: usize) -> Result<Self> {
        let wanted = args.taps.as_slice();
        if let Some(bad) = wanted.iter().find(|&&i| i as usize >= layers) {
            return Err(error(format!("forward: tap at layer {bad}, the model has {layers} layers")));
        }
        Ok(Self { wanted, got: vec![None; wanted.len()] })
    }

    /// Call with each decoder layer's output, `layer` counting from 0.
    pub fn offer(&mut self, layer: usize, h: &Array) {
        for (slot, &w) in self.got.iter_mut().zip(self.wanted) {
            if w as usize == layer {
                *slot = Some(h.clone());
            }
        }
    }

    /// The taps in the order asked; an error if a layer was never offered.
    pub fn into_tensors(self) -> Result<RVec<Tensor>> {
        self.got
            .into_iter()
            .zip(self.wanted)
            .map(|(a, w)| a.map(into_tensor).ok_or_else(|| error(format!("forward: layer {w} was not tapped"))))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plugin_api::abi_stable::std_types::RSlice;
    use plugin_api::LogitsMode;
    use plugin_sdk::into_array;

    #[test]
    fn taps_come_back_in_the_order_asked_and_bad_indices_are_refused() {
        let tokens = into_tensor(Array::from_slice(&[1i32], &[1, 1]));
        let args = |taps: &'static [u32]| ForwardArgs {
            tokens: tokens.borrow(),
            logits: LogitsMode::NONE,
            want_hidden: false,
            taps: RSlice::from_slice(taps),
        };
        let mut t = Taps::new(&args(&[2, 0, 2]), 3).unwrap();
        for layer in 0..3 {
            t.offer(layer, &Array::from_int(layer as i32));
        }
        let got: Vec<i32> = t.into_tensors().unwrap().into_iter().map(|x| into_array(x).item_cast::<i32>()).collect();
        assert_eq!(got, [2, 0, 2]);
        let e = Taps::new(&args(&[3]), 3).err().unwrap();
        assert!(e.what().contains("tap at layer 3, the model has 3 layers"), "{}", e.what());
        let e = Taps::new(&args(&[1]), 3).unwrap().into_tensors().err().expect("layer 1 was never offered");
        assert!(e.what().contains("layer 1 was not tapped"), "{}", e.what());
    }
}
