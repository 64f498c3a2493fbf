//! Parity of the hybrid family plugin with mlx-lm (filled in by that family's work).
