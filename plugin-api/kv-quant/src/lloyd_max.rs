//! Lloyd-Max scalar quantizers for a standard normal variable: the 2^b
//! levels that minimise the mean squared error (Max 1960, Lloyd 1982).
//! After a random rotation, each coordinate of a vector scaled to norm
//! sqrt(d) is close to N(0, 1) (TurboQuant, Zandieh et al. 2025), so these
//! levels are the per-coordinate quantizer of its MSE variant.

/// The complementary error function, |error| < 1.2e-7 everywhere
/// (Numerical Recipes' Chebyshev fit, `erfcc`).
fn erfc(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.26551223
        + t * (1.00002368
            + t * (0.37409196
                + t * (0.09678418
                    + t * (-0.18628806
                        + t * (0.27886807
                            + t * (-1.13520398 + t * (1.48851587 + t * (-0.82215223 + t * 0.17087277))))))));
    let r = t * poly.exp();
    if x >= 0.0 {
        r
    } else {
        2.0 - r
    }
}

/// The standard normal CDF and density.
fn cdf(x: f64) -> f64 {
    0.5 * erfc(-x / std::f64::consts::SQRT_2)
}

fn pdf(x: f64) -> f64 {
    (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
}

/// The optimal levels for `bits` (1..=8), ascending and symmetric: Lloyd's
/// iteration (each level the mean of its cell, each boundary the midpoint
/// of its levels) from the quantiles, until nothing moves.
pub fn levels(bits: u32) -> Vec<f64> {
    let n = 1usize << bits;
    // Start at the cells' quantile midpoints.
    let mut lv: Vec<f64> = (0..n).map(|i| quantile((i as f64 + 0.5) / n as f64)).collect();
    for _ in 0..10_000 {
        let bounds: Vec<f64> = std::iter::once(f64::NEG_INFINITY)
            .chain(lv.windows(2).map(|w| 0.5 * (w[0] + w[1])))
            .chain(std::iter::once(f64::INFINITY))
            .collect();
        let next: Vec<f64> = bounds
            .windows(2)
            .map(|c| {
                let mass = cdf(c[1]) - cdf(c[0]);
                (pdf(c[0]) - pdf(c[1])) / mass
            })
            .collect();
        let moved = next.iter().zip(&lv).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        lv = next;
        if moved < 1e-12 {
            break;
        }
    }
    lv
}

/// The boundaries between consecutive levels (midpoints).
pub fn thresholds(levels: &[f64]) -> Vec<f64> {
    levels.windows(2).map(|w| 0.5 * (w[0] + w[1])).collect()
}

/// The mean squared error of quantizing N(0, 1) to `levels`.
pub fn distortion(levels: &[f64]) -> f64 {
    let t = thresholds(levels);
    let bounds: Vec<f64> =
        std::iter::once(f64::NEG_INFINITY).chain(t.iter().copied()).chain(std::iter::once(f64::INFINITY)).collect();
    // E[(z - c)^2 | cell] mass = ∫ z² φ - 2c ∫ z φ + c² ∫ φ over the cell.
    let second = |x: f64| if x.is_infinite() { 0.0 } else { -x * pdf(x) } + cdf(x);
    bounds
        .windows(2)
        .zip(levels)
        .map(|(c, &l)| {
            let (a, b) = (c[0], c[1]);
            let m0 = cdf(b) - cdf(a);
            let m1 = pdf(a) - pdf(b);
            let m2 = second(b) - second(a);
            m2 - 2.0 * l * m1 + l * l * m0
        })
        .sum()
}

/// The standard normal quantile, by bisection on `cdf`.
fn quantile(p: f64) -> f64 {
    let (mut lo, mut hi) = (-40.0, 40.0);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if cdf(mid) < p {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}
