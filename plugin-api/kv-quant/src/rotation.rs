//! A randomized Hadamard transform: `R = H diag(s) / sqrt(d)`, with `H` the
//! Sylvester-Hadamard matrix of order d (a power of two) and `s` random
//! signs from a fixed seed. R is orthogonal (R Rᵀ = I), so rotating a row
//! (`x Rᵀ`) keeps its norm and `y R` undoes it; the random signs spread
//! any vector's energy evenly over the coordinates, which is what lets one
//! scalar quantizer serve every coordinate (TurboQuant).

/// splitmix64: a fixed, portable sequence for the signs.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// R as row-major `d x d` values, or `None` when d is no power of two.
pub fn randomized_hadamard(d: usize, seed: u64) -> Option<Vec<f32>> {
    if d == 0 || !d.is_power_of_two() {
        return None;
    }
    let mut state = seed;
    let signs: Vec<f64> = (0..d).map(|_| if splitmix(&mut state) & 1 == 1 { -1.0 } else { 1.0 }).collect();
    let scale = 1.0 / (d as f64).sqrt();
    // Sylvester: H[i][j] = (-1)^popcount(i & j).
    Some(
        (0..d * d)
            .map(|k| {
                let (i, j) = (k / d, k % d);
                let h = if (i & j).count_ones() % 2 == 0 { 1.0 } else { -1.0 };
                (h * signs[j] * scale) as f32
            })
            .collect(),
    )
}
