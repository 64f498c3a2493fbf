//! Parity of the moe family plugin with mlx-lm (filled in by that family's work).
