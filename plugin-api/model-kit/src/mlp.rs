//! The gated MLP of a transformer block.

use crate::layers::{Linear, LoadCtx, RmsNorm};
use crate::{Array, Result};

/// The gated MLP `down(act(gate(x)) * up(x))`: SwiGLU (silu) of the Llama
/// lineage, tensor-parallel (column gate/up, row down) when `ctx.shard` has
/// ranks; or Gemma's GeGLU (tanh-approximated gelu), unsharded.
pub struct Mlp {
    gate: Linear,
    up: Linear,
    down: Linear,
    gelu: bool,
}

impl Mlp {
    /// `hidden` is the model width, `inter` the MLP's intermediate size.
    pub fn load(ctx: &mut LoadCtx, path: &str, hidden: usize, inter: usize, bias: bool) -> Result<Self> {
        Ok(Self {
            gate: Linear::load_column(ctx, &format!("{path}.gate_proj"), inter, hidden, bias)?,
            up: Linear::load_column(ctx, &format!("{path}.up_proj"), inter, hidden, bias)?,
            down: Linear::load_row(ctx, &format!("{path}.down_proj"), hidden, inter, bias)?,
            gelu: false,
        })
    }

    /// The GeGLU MLP (no biases).
    pub fn load_geglu(ctx: &mut LoadCtx, path: &str, hidden: usize, inter: usize) -> Result<Self> {
        Ok(Self {
            gate: Linear::load(ctx, &format!("{path}.gate_proj"), inter, hidden, false)?,
            up: Linear::load(ctx, &format!("{path}.up_proj"), inter, hidden, false)?,
            down: Linear::load(ctx, &format!("{path}.down_proj"), hidden, inter, false)?,
            gelu: true,
        })
    }

    /// `h + mlp(norm(h))`, the MLP half of a pre-norm block: one fused
    /// kernel for the norm, gate, up and SwiGLU and one for down and the
    /// residual on a GPU decode step (`fused_layers`), the separate ops
    /// otherwise.
    pub fn forward_residual(&self, norm: &RmsNorm, h: &Array) -> Result<Array> {
        if !self.gelu {
            if let Some(act) = crate::fused_layers::norm_swiglu(h, norm, &self.gate, &self.up)? {
                return crate::fused_layers::linear_add(&act, &self.down, h);
            }
        }
        h.add(&self.forward(&norm.forward(h)?)?)
    }

    pub fn forward(&self, x: &Array) -> Result<Array> {
        let (g, u) = (self.gate.forward(x)?, self.up.forward(x)?);
        // mlx-lm's compiled activations: silu(g) = g * sigmoid(g), gelu's tanh form.
        let act = if self.gelu { crate::compiled::geglu(&g, &u)? } else { crate::compiled::swiglu(&g, &u)? };
        self.down.forward(&act)
    }
}
