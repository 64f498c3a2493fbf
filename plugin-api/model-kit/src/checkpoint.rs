//! Opening a model folder the way every family does: config.json parsed
//! and its quantization validated, the compute dtype the host asked for,
//! the weights mapped; then building the graph, reading every tensor once,
//! and refusing tensors the graph did not use (mlx-lm's strict load).

use crate::config::{Config, Quantization};
use crate::layers::LoadCtx;
use crate::ops::dtype_from_raw;
use crate::shard::Shard;
use crate::weights::Weights;
use crate::{Dtype, Result};
use plugin_api::abi_stable::std_types::ROption;
use plugin_api::{ModelOpenArgs, PluginError};
use std::path::Path;

pub struct Checkpoint {
    pub cfg: Config,
    pub quant: Option<Quantization>,
    /// The compute dtype for float weights (None = the checkpoint's).
    pub dtype: Option<Dtype>,
    pub weights: Weights,
    /// This rank's part when the host splits the model over ranks.
    pub shard: Shard,
}

/// A config problem as a boundary error.
pub fn config_error(e: crate::Exception) -> PluginError {
    PluginError::invalid_config(e.what())
}

impl Checkpoint {
    pub fn open(a: &ModelOpenArgs) -> std::result::Result<Self, PluginError> {
        let cfg = Config::parse(&a.config_json).map_err(config_error)?;
        let quant = cfg.quantization().map_err(config_error)?;
        let dtype = match a.compute_dtype {
            ROption::RSome(d) => Some(dtype_from_raw(d.0).map_err(|e| PluginError::invalid_input(e.what()))?),
            ROption::RNone => None,
        };
        let shard = Shard::from_options(&a.options).map_err(|e| PluginError::invalid_input(e.what()))?;
        let weights = Weights::load(Path::new(a.dir.as_str())).map_err(|e| PluginError::io(e.what()))?;
        Ok(Self { cfg, quant, dtype, weights, shard })
    }

    /// Builds the graph from the weights, evaluates every tensor it took, and
    /// refuses a checkpoint with tensors left over.
    pub fn load<M>(
        &mut self,
        build: impl FnOnce(&mut LoadCtx, &Config) -> Result<M>,
    ) -> std::result::Result<M, PluginError> {
        let mut ctx = LoadCtx::new(&mut self.weights, self.quant.as_ref(), self.dtype);
        ctx.shard = self.shard.clone();
        let model = build(&mut ctx, &self.cfg).map_err(config_error)?;
        ctx.materialize().map_err(|e| PluginError::io(e.what()))?;
        let left = self.weights.remaining();
        if !left.is_empty() {
            return Err(PluginError::invalid_config(format!(
                "{} unexpected tensors in the checkpoint (first: {})",
                left.len(),
                left[..left.len().min(3)].join(", ")
            )));
        }
        Ok(model)
    }
}
