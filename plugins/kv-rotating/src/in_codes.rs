//! The ring as token columns (`kv_quant::Columns`): what an affine scheme
//! needs to keep the ring's tokens as codes.

use crate::layout::{Kind, RotatingKv};
use crate::ring::Ring;
use kv_quant::{Columns, Widths};
use model_kit::{error, Array, Result};

impl Columns for RotatingKv {
    fn blank(&self, w: Widths, one_row: bool) -> Self {
        let mut geo = self.ring.geo;
        (geo.k_dim, geo.v_dim, geo.dtype) = (w.k, w.v, w.dtype);
        match (one_row, self.kind) {
            (true, _) | (false, Kind::Serial) => RotatingKv::serial(geo),
            (false, Kind::Batch) => RotatingKv::batch(geo, 0),
        }
    }

    fn recode(
        &mut self,
        w: Widths,
        keys: &dyn Fn(&Array) -> Result<Array>,
        values: &dyn Fn(&Array) -> Result<Array>,
    ) -> Result<()> {
        if self.round.is_some() {
            return Err(error("kv-rotating: the ring cannot change its columns inside a speculative round"));
        }
        let ring: &mut Ring = &mut self.ring;
        ring.keys = ring.keys.as_ref().map(keys).transpose()?;
        ring.values = ring.values.as_ref().map(values).transpose()?;
        (ring.geo.k_dim, ring.geo.v_dim, ring.geo.dtype) = (w.k, w.v, w.dtype);
        Ok(())
    }
}
