//! Parity of the gemma4 family plugin with mlx-lm (filled in by that family's work).
