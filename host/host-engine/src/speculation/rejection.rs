//! Rejection sampling of a round's drafts (speculative sampling, Leviathan
//! et al. 2023; Chen et al. 2023). Draft d_j was drawn from the drafter's
//! q_j; the target's processed distribution at that position is p_j. d_j is
//! accepted with probability min(1, p_j(d_j)/q_j(d_j)); the first rejected
//! position emits a draw from normalise(max(0, p_j − q_j)); after a full
//! accept the bonus is drawn from p_k. Each emitted token is then
//! distributed as p, whatever q is: the closer q is to p, the more is
//! accepted. The uniforms and draws come from the request's key chain.

use crate::sampling::Sampler;
use mlx_rs::ops::indexing::{take_along_axis, IndexOp};
use mlx_rs::{ops, Array};

type R<T> = Result<T, mlx_rs::error::Exception>;

/// The round's verdict as one lazy uint32 `[2k+1]` array (a single
/// evaluation reads it): `[0, k)` is 1 where d_j passes its accept test;
/// `[k, 2k+1)` holds the token emitted when position j is the first
/// rejection (j < k: a residual draw) or the bonus (j = k: a draw from p_k).
/// `p` `[k+1, Vp]` and `q` `[k, Vq]` are float32 rows; the narrower is
/// widened with zero columns (a draft vocabulary may be padded differently).
pub(crate) fn verdict(p: &Array, q: &Array, drafts: &[u32], sampler: &mut Sampler) -> R<Array> {
    let k = drafts.len() as i32;
    let w = p.shape()[1].max(q.shape()[1]);
    let (p, q) = (widen(p, w)?, widen(q, w)?);
    let (p_draft, p_bonus) = (p.index(0..k), p.index(k..k + 1));
    let d: Vec<i32> = drafts.iter().map(|&t| t as i32).collect();
    let d = Array::from_slice(&d, &[k, 1]);
    let p_d = take_along_axis(&p_draft, &d, -1)?;
    let q_d = take_along_axis(&q, &d, -1)?;
    // u < p/q, without dividing by q.
    let u = sampler.uniforms(k)?.reshape(&[k, 1])?;
    let accept = u.multiply(&q_d)?.lt(&p_d)?.reshape(&[k])?;
    let residual = ops::maximum(p_draft.subtract(&q)?, Array::from_f32(0.0))?;
    // p == q to the bit leaves no residual, and such a position is only
    // rejected by rounding: then draw from p itself.
    let some = residual.sum_axis(-1, true)?.gt(Array::from_f32(0.0))?;
    let residual = ops::select(&some, &residual, &p_draft)?;
    let replace = sampler.draw(&ops::concatenate(&[residual, p_bonus], 0)?)?;
    ops::concatenate(&[accept.as_dtype(mlx_rs::Dtype::Uint32)?, replace.as_dtype(mlx_rs::Dtype::Uint32)?], 0)
}

/// What the round emits from an evaluated verdict: the accepted drafts
/// then the first rejection's draw (or the bonus), and how many drafts
/// were accepted.
pub(crate) fn emitted(verdict: &[u32], drafts: &[u32]) -> (Vec<u32>, usize) {
    let k = drafts.len();
    let n = verdict[..k].iter().take_while(|&&a| a == 1).count();
    let mut t = drafts[..n].to_vec();
    t.push(verdict[k + n]);
    (t, n)
}

/// `a` `[N, V]` with zero columns up to `w`.
fn widen(a: &Array, w: i32) -> R<Array> {
    let (n, v) = (a.shape()[0], a.shape()[1]);
    if v == w {
        return Ok(a.clone());
    }
    ops::concatenate(&[a.clone(), ops::zeros::<f32>(&[n, w - v])?], 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampling::SamplingParams;

    fn sampler(seed: u64) -> Sampler {
        Sampler::new(SamplingParams { temperature: 1.0, seed: Some(seed), ..Default::default() }).unwrap()
    }

    fn rows(r: &[&[f32]]) -> Array {
        let flat: Vec<f32> = r.iter().flat_map(|r| r.iter().copied()).collect();
        Array::from_slice(&flat, &[r.len() as i32, r[0].len() as i32])
    }

    fn run(p: &Array, q: &Array, drafts: &[u32], seed: u64) -> (Vec<u32>, usize) {
        let v = verdict(p, q, drafts, &mut sampler(seed)).unwrap();
        v.eval().unwrap();
        emitted(v.as_slice::<u32>(), drafts)
    }

    #[test]
    fn equal_distributions_always_accept_and_draw_the_bonus_from_p() {
        let p = rows(&[&[0.1, 0.2, 0.3, 0.4], &[0.25, 0.25, 0.25, 0.25], &[0.0, 0.0, 1.0, 0.0]]);
        let q = rows(&[&[0.1, 0.2, 0.3, 0.4], &[0.25, 0.25, 0.25, 0.25]]);
        for seed in 0..200 {
            let (t, n) = run(&p, &q, &[3, 1], seed);
            assert_eq!((t, n), (vec![3, 1, 2], 2), "seed {seed}");
        }
    }

    #[test]
    fn a_draft_where_p_has_no_mass_is_rejected_and_replaced_from_p() {
        // q puts all its mass on 2 and 3, p none: always rejected; the
        // residual max(0, p - q) is p itself.
        let p = rows(&[&[0.5, 0.5, 0.0, 0.0], &[0.0, 0.0, 0.0, 1.0]]);
        let q = rows(&[&[0.0, 0.0, 0.5, 0.5]]);
        let mut seen = [0; 4];
        for seed in 0..200 {
            let (t, n) = run(&p, &q, &[2], seed);
            assert_eq!((n, t.len()), (0, 1), "seed {seed}");
            seen[t[0] as usize] += 1;
        }
        assert_eq!(seen[2] + seen[3], 0, "{seen:?}");
        assert!(seen[0] > 60 && seen[1] > 60, "{seen:?}");
    }

    #[test]
    fn a_narrower_draft_vocabulary_is_widened_with_zeros() {
        let p = rows(&[&[0.0, 0.0, 0.0, 0.0, 1.0], &[1.0, 0.0, 0.0, 0.0, 0.0]]);
        let q = rows(&[&[0.0, 1.0, 0.0, 0.0]]);
        assert_eq!(run(&p, &q, &[1], 7), (vec![4], 0));
    }

    /// Accept-or-resample keeps p at every position: 4000 independent
    /// positions with d ~ q; the emitted token's frequencies match p
    /// (binomial 5-sigma bounds), although q is far from p.
    #[test]
    fn the_emitted_token_is_distributed_as_p() {
        let (pv, qv) = ([0.5f32, 0.3, 0.2, 0.0], [0.1f32, 0.2, 0.3, 0.4]);
        let k = 4000usize;
        let cdf = |x: f32| {
            qv.iter()
                .scan(0.0, |a, &v| {
                    *a += v;
                    Some(*a)
                })
                .position(|c| x < c)
                .unwrap_or(3) as u32
        };
        // Drafts ~ q from a fixed LCG (independent of the sampler's chain).
        let mut s = 12345u64;
        let drafts: Vec<u32> = (0..k)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                cdf((s >> 40) as f32 / (1u64 << 24) as f32)
            })
            .collect();
        let p = rows(&vec![&pv[..]; k + 1]);
        let q = rows(&vec![&qv[..]; k]);
        let v = verdict(&p, &q, &drafts, &mut sampler(3)).unwrap();
        v.eval().unwrap();
        let v = v.as_slice::<u32>();
        // Position j on its own: the draft when accepted, else its residual draw.
        let mut counts = [0f64; 4];
        let mut rejected = 0;
        for j in 0..k {
            let t = if v[j] == 1 { drafts[j] } else { v[k + j] };
            rejected += usize::from(v[j] == 0);
            counts[t as usize] += 1.0;
        }
        assert!(rejected > k / 4, "q differs from p: many rejections expected, got {rejected}");
        for (c, &pi) in counts.iter().zip(&pv) {
            let sd = (k as f64 * pi as f64 * (1.0 - pi as f64)).sqrt();
            assert!((c - k as f64 * pi as f64).abs() <= 5.0 * sd + 0.5, "counts {counts:?} vs p {pv:?}");
        }
    }
}
