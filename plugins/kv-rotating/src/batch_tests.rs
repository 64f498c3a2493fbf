//! The batched ring against the serial one it batches. A `Sim` drives a
//! batch cache through the boundary (positions, mask before the update,
//! update) and, beside it, one serial cache per row fed the same tokens.
//! At every step, for every row and query, the keys the mask lets through
//! must be exactly the row's last `window` tokens (the sliding-window
//! rule), and exactly what the serial cache lets that query see; RoPE
//! positions must be the row's token count. Token t of row r has key
//! `1000 (r + 1) + t` (value: its negation), padding and unused slots 0, so
//! a visible padding column or a foreign row's key shows up as a mismatch.

use super::*;
use crate::geometry::Geometry;
use model_kit::{Array, Dtype};
use plugin_api::abi_stable::std_types::{ROption, RSlice, RVec};
use plugin_sdk::{into_array, into_tensor, mlx_rs};
use std::collections::BTreeSet;

const W: usize = 8;

fn geo(step: usize) -> Geometry {
    Geometry { max_size: W, window: W, step, heads: 1, k_dim: 1, v_dim: 1, dtype: Dtype::Float32 }
}

fn serial(step: usize) -> RotatingKv {
    RotatingKv::serial(geo(step))
}

fn batch(step: usize) -> RotatingKv {
    RotatingKv::batch(geo(step), 0)
}

fn flat<T: mlx_rs::ArrayElement + Copy>(a: &Array) -> Vec<T> {
    let a = a.reshape(&[-1]).unwrap().contiguous().unwrap();
    a.eval().unwrap();
    a.as_slice::<T>().to_vec()
}

fn key(id: usize, t: usize) -> f32 {
    (1000 * (id + 1) + t) as f32
}

/// Tokens `from+1 ..= from+l` of each row `[B, 1, l, 1]` (rows by id).
fn tokens(ids: &[usize], from: &[usize], l: usize) -> (Tensor, Tensor) {
    let k: Vec<f32> = ids.iter().zip(from).flat_map(|(&id, &f)| (f + 1..=f + l).map(move |t| key(id, t))).collect();
    let v: Vec<f32> = k.iter().map(|x| -x).collect();
    let shape = [ids.len() as i32, 1, l as i32, 1];
    (into_tensor(Array::from_slice(&k, &shape)), into_tensor(Array::from_slice(&v, &shape)))
}

/// What query i of `l` may see, per row: keys where the mask is true.
/// `mask` is a boundary mask (any mode), `keys` the fetched `[B, 1, K, 1]`.
fn visible(mask: AttentionMask, keys: &Array, values: &Array, l: usize) -> Vec<Vec<BTreeSet<i64>>> {
    let b = keys.shape()[0] as usize;
    let kn = keys.shape()[2] as usize;
    let kv: Vec<f32> = flat(keys);
    assert_eq!(flat::<f32>(values), kv.iter().map(|x| -x).collect::<Vec<_>>(), "values follow keys");
    let bits: Option<(Vec<bool>, usize)> = match (mask.mode, mask.array) {
        (MaskMode::ARRAY, ROption::RSome(t)) => {
            let a = into_array(t);
            let s = a.shape().to_vec();
            assert_eq!(
                (s.len(), s[1], s[2] as usize, s[3] as usize),
                (4, 1, l, kn),
                "mask shape {s:?} for {l} queries over {kn} keys"
            );
            assert!(s[0] == 1 || s[0] as usize == b);
            Some((flat(&a), s[0] as usize))
        }
        (MaskMode::NONE, _) | (MaskMode::CAUSAL, _) => None,
        (m, _) => panic!("mask mode {}", m.0),
    };
    let causal = mask.mode == MaskMode::CAUSAL;
    (0..b)
        .map(|r| {
            (0..l)
                .map(|i| {
                    (0..kn)
                        .filter(|&j| match &bits {
                            Some((m, mb)) => m[((if *mb == 1 { 0 } else { r }) * l + i) * kn + j],
                            None => !causal || j + l <= kn + i,
                        })
                        .map(|j| kv[r * kn + j] as i64)
                        .collect()
                })
                .collect()
        })
        .collect()
}

/// The sliding-window rule: query at 0-based position p sees tokens p-W+2 ..= p+1.
fn window_of(id: usize, p: usize) -> BTreeSet<i64> {
    (p.saturating_sub(W - 1)..=p).map(|q| key(id, q + 1) as i64).collect()
}

/// One step through the boundary: positions and mask first, then the update.
fn step_cache(
    c: &mut dyn CacheLayoutish,
    ids: &[usize],
    from: &[usize],
    l: usize,
) -> (Vec<i64>, Vec<Vec<BTreeSet<i64>>>) {
    let pos = c.positions_of(ids.len());
    let mask = c.mask_of(l);
    let (k, v) = tokens(ids, from, l);
    let (k, v) = c.update_of(k, v);
    (pos, visible(mask, &k, &v, l))
}

/// The boundary methods a step uses, for the serial and the batched cache.
trait CacheLayoutish {
    fn positions_of(&self, rows: usize) -> Vec<i64>;
    fn mask_of(&self, l: usize) -> AttentionMask;
    fn update_of(&mut self, k: Tensor, v: Tensor) -> (Array, Array);
}

impl<T: CacheLayout> CacheLayoutish for T {
    fn positions_of(&self, rows: usize) -> Vec<i64> {
        let p = CacheLayout::positions(self).unwrap();
        match p.per_row {
            ROption::RSome(t) => flat::<i32>(&into_array(t)).into_iter().map(i64::from).collect(),
            ROption::RNone => vec![p.offset as i64; rows],
        }
    }
    fn mask_of(&self, l: usize) -> AttentionMask {
        CacheLayout::attention_mask(self, l as u32).unwrap()
    }
    fn update_of(&mut self, k: Tensor, v: Tensor) -> (Array, Array) {
        let kv = CacheLayout::update_and_fetch(self, k, v).unwrap();
        (into_array(kv.keys), into_array(kv.values))
    }
}

/// A batch and, per row, the serial cache that row would be alone.
struct Sim {
    b: RotatingKv,
    refs: Vec<RotatingKv>,
    /// Row identities (key values), and tokens each row has seen.
    ids: Vec<usize>,
    fed: Vec<usize>,
}

/// A serial cache of row `id` after the given steps.
fn grown(id: usize, steps: &[usize]) -> (RotatingKv, usize) {
    let mut c = serial(256);
    let mut t = 0;
    for &l in steps {
        step_cache(&mut c, &[id], &[t], l);
        t += l;
    }
    (c, t)
}

impl Sim {
    fn new(step: usize) -> Self {
        Sim { b: batch(step), refs: Vec::new(), ids: Vec::new(), fed: Vec::new() }
    }

    /// Rows grown serially by `steps` each, exported and merged in one call.
    fn merge(&mut self, rows: &[(usize, &[usize])]) {
        let mut states = RVec::new();
        for &(id, steps) in rows {
            let (c, t) = grown(id, steps);
            states.push(CacheLayout::export_state(&c).unwrap());
            self.refs.push(c);
            self.ids.push(id);
            self.fed.push(t);
        }
        CacheLayout::merge_rows(&mut self.b, states).unwrap();
        self.check_rows();
    }

    fn check_rows(&self) {
        assert_eq!(CacheLayout::rows(&self.b) as usize, self.ids.len());
        assert_eq!(CacheLayout::offset(&self.b) as usize, self.fed.iter().copied().max().unwrap_or(0));
    }

    /// Every row gets `l` tokens; batched and serial must see alike.
    fn step(&mut self, l: usize) {
        let (pos, seen) = step_cache(&mut self.b, &self.ids, &self.fed, l);
        for r in 0..self.ids.len() {
            let at = format!("row {} (id {}) at token {}, step of {l}", r, self.ids[r], self.fed[r]);
            assert_eq!(pos[r], self.fed[r] as i64, "{at}: position");
            let (spos, sseen) = step_cache(&mut self.refs[r], &self.ids[r..r + 1], &self.fed[r..r + 1], l);
            assert_eq!(spos[0], pos[r], "{at}: serial position");
            for i in 0..l {
                assert_eq!(seen[r][i], window_of(self.ids[r], self.fed[r] + i), "{at}: query {i} sees");
                assert_eq!(seen[r][i], sseen[0][i], "{at}: query {i} differs from the serial cache");
            }
            self.fed[r] += l;
        }
        self.check_rows();
    }

    fn steps(&mut self, ls: &[usize]) {
        ls.iter().for_each(|&l| self.step(l));
    }

    /// A speculative round: `l` tokens per row, then each row keeps `keep[r]`.
    fn round(&mut self, l: usize, keep: &[u64]) {
        CacheLayout::spec_begin(&mut self.b).unwrap();
        let (_, seen) = step_cache(&mut self.b, &self.ids, &self.fed, l);
        assert_eq!(seen.len(), self.ids.len());
        for (r, queries) in seen.iter().enumerate() {
            assert_eq!(queries.len(), l);
            for (i, sees) in queries.iter().enumerate() {
                assert_eq!(*sees, window_of(self.ids[r], self.fed[r] + i), "round: row {r} query {i}");
            }
        }
        CacheLayout::spec_rollback(&mut self.b, RSlice::from_slice(keep)).unwrap();
        for r in 0..self.ids.len() {
            let k = keep[if keep.len() == 1 { 0 } else { r }] as usize;
            if k > 0 {
                step_cache(&mut self.refs[r], &self.ids[r..r + 1], &self.fed[r..r + 1], k);
                self.fed[r] += k;
            }
        }
        self.check_rows();
    }

    fn filter(&mut self, keep: &[u32]) {
        CacheLayout::filter_rows(&mut self.b, RSlice::from_slice(keep)).unwrap();
        let pick = |v: &Vec<usize>| keep.iter().map(|&r| v[r as usize]).collect::<Vec<_>>();
        self.ids = pick(&self.ids);
        self.fed = pick(&self.fed);
        let mut refs: Vec<Option<RotatingKv>> = std::mem::take(&mut self.refs).into_iter().map(Some).collect();
        self.refs = keep.iter().map(|&r| refs[r as usize].take().unwrap()).collect();
        self.check_rows();
    }

    /// Row r extracted and imported into a fresh serial cache: a compact
    /// state in temporal order whose future equals the row's serial one.
    fn check_extract(&self, r: usize) {
        let st = CacheLayout::extract_row(&self.b, r as u32).unwrap();
        assert_eq!(st.offset as usize, self.fed[r]);
        let mut a = serial(256);
        CacheLayout::import_state(&mut a, st).unwrap();
        let held: Vec<i64> =
            a.ring.keys.as_ref().map(|k| flat::<f32>(k).into_iter().map(|x| x as i64).collect()).unwrap_or_default();
        let first = held.first().map_or(0, |&k| (k as usize) % 1000);
        let want: Vec<i64> = (first..first + held.len()).map(|t| key(self.ids[r], t) as i64).collect();
        assert_eq!(held, want, "row {r}: extracted storage is the row's latest tokens, oldest first, no padding");
        assert!(held.len() >= self.fed[r].min(W - 1), "row {r}: the window's tokens are all there");
        let mut b = serial(256);
        CacheLayout::import_state(&mut b, CacheLayout::export_state(&self.refs[r]).unwrap()).unwrap();
        let id = [self.ids[r]];
        let mut t = self.fed[r];
        for l in [1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 9, 1, 1] {
            let (pa, sa) = step_cache(&mut a, &id, &[t], l);
            let (pb, sb) = step_cache(&mut b, &id, &[t], l);
            assert_eq!((pa, sa), (pb, sb), "row {r}: extracted row diverged at token {t}");
            t += l;
        }
    }

    fn check_extract_all(&self) {
        (0..self.ids.len()).for_each(|r| self.check_extract(r));
    }
}

#[test]
fn rows_of_different_lengths_merge_including_a_wrapped_ring() {
    let mut s = Sim::new(256);
    // 3 tokens; 20 tokens, the ring rotated mid-way (storage order is not
    // temporal order); a 12-token prompt in one step (storage longer than
    // the ring); 7 tokens (one short of full).
    s.merge(&[(0, &[2, 1]), (1, &[5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]), (2, &[12]), (3, &[6, 1])]);
    s.check_extract_all();
    s.steps(&[1; 5]);
    s.check_extract_all();
    s.steps(&[1; 12]);
    s.check_extract_all();
}

#[test]
fn rows_join_a_rotated_batch_and_leave_it() {
    let mut s = Sim::new(256);
    s.merge(&[(0, &[4]), (1, &[1, 1])]);
    s.steps(&[1; 9]);
    assert!(s.b.ring.rotated, "the batch ring has rotated");
    // New rows (one empty: a 1-token prompt has nothing to prefill) join
    // a rotated ring: both sides are put in temporal order and aligned.
    s.merge(&[(2, &[]), (3, &[10, 1, 1]), (4, &[3])]);
    s.check_extract_all();
    s.steps(&[1; 3]);
    s.filter(&[4, 2, 0]);
    s.check_extract_all();
    s.steps(&[1; 10]);
    s.merge(&[(5, &[2])]);
    s.steps(&[1; 4]);
    s.filter(&[3]);
    s.steps(&[1; 9]);
    s.check_extract_all();
}

#[test]
fn multi_token_steps_in_a_batch_keep_every_window() {
    // Steps of several tokens (a chunked prefill, a verify forward) before
    // and after the ring wrapped, on a rotated ring too; growth in steps
    // of 3 slots so the storage is sometimes longer than what is written.
    let mut s = Sim::new(3);
    s.merge(&[(0, &[1, 1]), (1, &[])]);
    s.steps(&[3, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 12, 1]);
    s.merge(&[(2, &[5])]);
    s.steps(&[2, 1, 1]);
    s.check_extract_all();
}

#[test]
fn a_cohort_prefills_left_padded_and_wraps_while_batched() {
    for chunks in [&[13][..], &[4, 9], &[2, 2, 9]] {
        let ids = [0usize, 1, 2];
        let heads = [13usize, 10, 5];
        let width = 13;
        let mut b = batch(256);
        let pads: Vec<u32> = heads.iter().map(|&h| (width - h) as u32).collect();
        CacheLayout::begin_padded(&mut b, RSlice::from_slice(&pads)).unwrap();
        let mut col = 0;
        for &l in chunks {
            let pos = b.positions_of(3);
            let mask = b.mask_of(l);
            // Padding columns carry key 0.
            let k: Vec<f32> = ids
                .iter()
                .zip(&heads)
                .flat_map(|(&id, &h)| {
                    (col..col + l).map(move |c| if c < width - h { 0.0 } else { key(id, c - (width - h) + 1) })
                })
                .collect();
            let v: Vec<f32> = k.iter().map(|x| -x).collect();
            let shape = [3, 1, l as i32, 1];
            let (fk, fv) =
                b.update_of(into_tensor(Array::from_slice(&k, &shape)), into_tensor(Array::from_slice(&v, &shape)));
            let seen = visible(mask, &fk, &fv, l);
            for r in 0..3 {
                let pad = width - heads[r];
                assert_eq!(pos[r], col as i64 - pad as i64, "row {r}: position (negative inside the padding)");
                assert_eq!(seen[r].len(), l);
                for (i, sees) in seen[r].iter().enumerate() {
                    let c = col + i;
                    if c >= pad {
                        assert_eq!(*sees, window_of(ids[r], c - pad), "chunks {chunks:?}: row {r} column {c}");
                    }
                }
            }
            col += l;
        }
        // The cohort's rows, then decoding on together past the window.
        let mut s = Sim { b, refs: Vec::new(), ids: ids.to_vec(), fed: heads.to_vec() };
        for (&id, &h) in ids.iter().zip(&heads) {
            s.refs.push(grown(id, &[h]).0);
        }
        s.check_extract_all();
        s.steps(&[1; 10]);
        s.check_extract_all();
    }
}

#[test]
fn per_row_speculative_rollback_keeps_each_rows_count() {
    let mut s = Sim::new(256);
    s.merge(&[(0, &[3]), (1, &[1, 1, 1, 1, 1, 1]), (2, &[20])]);
    // Rows keep different counts (1 = only the pending token), before and
    // after the ring wraps, and on a rotated ring.
    s.round(4, &[1, 4, 2]);
    s.steps(&[1, 1]);
    s.round(3, &[3, 1, 1]);
    s.steps(&[1; 6]);
    assert!(s.b.ring.rotated);
    s.round(5, &[2, 5, 1]);
    s.check_extract_all();
    s.round(2, &[2]);
    s.round(2, &[1]);
    s.steps(&[1; 9]);
    // A one-token round on a rotated ring where one row keeps nothing.
    s.steps(&[1; 3]);
    assert!(s.b.ring.rotated);
    s.round(1, &[1, 0, 1]);
    s.steps(&[1; 4]);
    s.check_extract_all();
    // Nobody keeps anything: the snapshot comes back.
    let before = flat::<f32>(s.b.ring.keys.as_ref().unwrap());
    s.round(3, &[0]);
    assert_eq!(flat::<f32>(s.b.ring.keys.as_ref().unwrap()), before);
    s.steps(&[1; 10]);
    s.check_extract_all();
}

#[test]
fn a_round_of_several_updates_is_refused_per_row_but_committed_whole() {
    let mut s = Sim::new(256);
    s.merge(&[(0, &[3]), (1, &[5])]);
    CacheLayout::spec_begin(&mut s.b).unwrap();
    s.b.update_of(tokens(&s.ids, &s.fed, 1).0, tokens(&s.ids, &s.fed, 1).1);
    s.b.update_of(tokens(&s.ids, &[4, 6], 1).0, tokens(&s.ids, &[4, 6], 1).1);
    let e = CacheLayout::spec_rollback(&mut s.b, RSlice::from_slice(&[1, 2])).into_result().err().unwrap();
    assert_eq!(e.code, ErrorCode::UNSUPPORTED, "{e}");
    let e = CacheLayout::spec_rollback(&mut s.b, RSlice::from_slice(&[1])).into_result().err().unwrap();
    assert_eq!(e.code, ErrorCode::INVALID_INPUT, "no round any more: {e}");
}

#[test]
fn batch_state_round_trips_and_serial_states_import_as_one_row() {
    let mut s = Sim::new(256);
    s.merge(&[(0, &[3]), (1, &[11, 1, 1])]);
    s.steps(&[1; 7]);
    let st = CacheLayout::export_state(&s.b).unwrap();
    assert_eq!(st.offset as usize, *s.fed.iter().max().unwrap());
    let mut again = batch(256);
    CacheLayout::import_state(&mut again, st).unwrap();
    s.b = again;
    s.steps(&[1; 5]);
    // A serial state imported into a batch cache is a 1-row batch.
    let (c, t) = grown(7, &[9, 1]);
    let mut one = Sim { b: batch(256), refs: vec![c], ids: vec![7], fed: vec![t] };
    CacheLayout::import_state(&mut one.b, CacheLayout::export_state(&one.refs[0]).unwrap()).unwrap();
    one.steps(&[1; 4]);
    // Another geometry is refused.
    let other = RotatingKv::batch(Geometry { max_size: 16, window: 16, ..geo(256) }, 0);
    let e = CacheLayout::import_state(&mut batch(256), CacheLayout::export_state(&other).unwrap())
        .into_result()
        .err()
        .unwrap();
    assert_eq!(e.code, ErrorCode::INVALID_INPUT);
}

#[test]
fn masks_mirror_mlx_lm_make_mask_bit_for_bit() {
    // Two rows merged at 3 and 6 tokens (left padding 3 and 0), then
    // decoded until the ring rotates; expected bits from mlx-lm's
    // BatchRotatingKVCache.make_mask(1, window_size=8) on the same history.
    let mut b = batch(256);
    let (a, _) = grown(0, &[3]);
    let (c, _) = grown(1, &[6]);
    CacheLayout::merge_rows(
        &mut b,
        RVec::from(vec![CacheLayout::export_state(&a).unwrap(), CacheLayout::export_state(&c).unwrap()]),
    )
    .unwrap();
    let bits = |b: &RotatingKv, l: usize| -> String {
        flat::<bool>(&b.ring.rows_mask(l).unwrap()).iter().map(|&x| if x { '1' } else { '0' }).collect()
    };
    // [B=2, 1, 1, 7]: row 0 hides its 3 padding columns.
    assert_eq!(bits(&b, 1), "00011111111111");
    // Two queries: causal inside the new tokens, padding hidden.
    assert_eq!(bits(&b, 2), "00011110000111111111111011111111");
    let mut fed = vec![3, 6];
    for _ in 0..2 {
        b.update_of(tokens(&[0, 1], &fed, 1).0, tokens(&[0, 1], &fed, 1).1);
        fed.iter_mut().for_each(|f| *f += 1);
    }
    // Full ring, next write at slot 0 (rotation): rolled by 1; the write
    // evicts a padding column first, so one fewer is hidden.
    assert_eq!(b.ring.idx, 8);
    assert_eq!(bits(&b, 1), "1001111111111111");
    b.update_of(tokens(&[0, 1], &fed, 1).0, tokens(&[0, 1], &fed, 1).1);
    // (mlx-lm's left padding reads [2, -1]: the same columns hidden.)
    assert_eq!(b.ring.left_pad, vec![2, 0]);
    assert_eq!(bits(&b, 1), "1101111111111111");
}

#[test]
fn filter_and_extract_check_their_rows() {
    let mut s = Sim::new(256);
    s.merge(&[(0, &[3])]);
    assert_eq!(
        CacheLayout::filter_rows(&mut s.b, RSlice::from_slice(&[1])).into_result().err().unwrap().code,
        ErrorCode::MLX
    );
    assert_eq!(CacheLayout::extract_row(&s.b, 1).into_result().err().unwrap().code, ErrorCode::INVALID_INPUT);
    let k = into_tensor(Array::from_slice(&[1.0f32, 2.0], &[2, 1, 1, 1]));
    let v = into_tensor(Array::from_slice(&[1.0f32, 2.0], &[2, 1, 1, 1]));
    assert_eq!(
        CacheLayout::update_and_fetch(&mut s.b, k, v).into_result().err().unwrap().code,
        ErrorCode::INVALID_INPUT,
        "2 rows into a 1-row batch"
    );
}

/// The serial cache is the batched ring with one row: fed the same steps, a
/// 1-row batch fetches the same keys in the same storage order, and its
/// explicit masks let each query see what the serial cache's modes let it see.
#[test]
fn a_one_row_batch_stores_exactly_what_the_serial_cache_stores() {
    for growth in [256, 3] {
        let (mut s, mut b) = (serial(growth), RotatingKv::batch(geo(growth), 1));
        let mut t = 0;
        for l in [3, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 4, 1, 1, 1, 12, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1] {
            let at = format!("growth {growth}, step of {l} at token {t}");
            assert_eq!(s.positions_of(1), b.positions_of(1), "{at}: positions");
            let (sm, bm) = (s.mask_of(l), b.mask_of(l));
            let (sk, sv) = s.update_of(tokens(&[0], &[t], l).0, tokens(&[0], &[t], l).1);
            let (bk, bv) = b.update_of(tokens(&[0], &[t], l).0, tokens(&[0], &[t], l).1);
            assert_eq!(flat::<f32>(&sk), flat::<f32>(&bk), "{at}: fetched keys");
            assert_eq!(visible(sm, &sk, &sv, l), visible(bm, &bk, &bv, l), "{at}: what each query sees");
            let (sr, br) = (&s.ring, &b.ring);
            assert_eq!((sr.idx, sr.seen, sr.rotated), (br.idx, br.seen, br.rotated), "{at}: ring");
            t += l;
        }
        assert!(b.ring.rotated, "the ring wrapped");
    }
}

#[test]
fn row_operations_wait_for_the_end_of_a_speculative_round() {
    let mut s = Sim::new(256);
    s.merge(&[(0, &[3])]);
    CacheLayout::spec_begin(&mut s.b).unwrap();
    let (c, _) = grown(1, &[2]);
    let state = || RVec::from(vec![CacheLayout::export_state(&c).unwrap()]);
    let code = |r: PResult<()>| r.into_result().err().unwrap().code;
    assert_eq!(code(CacheLayout::merge_rows(&mut s.b, state())), ErrorCode::INVALID_INPUT);
    assert_eq!(code(CacheLayout::filter_rows(&mut s.b, RSlice::from_slice(&[0]))), ErrorCode::INVALID_INPUT);
    assert_eq!(code(CacheLayout::begin_padded(&mut s.b, RSlice::from_slice(&[1]))), ErrorCode::INVALID_INPUT);
    CacheLayout::spec_commit(&mut s.b).unwrap();
    CacheLayout::merge_rows(&mut s.b, state()).unwrap();
    CacheLayout::filter_rows(&mut s.b, RSlice::from_slice(&[1, 0])).unwrap();
    assert_eq!(CacheLayout::rows(&s.b), 2);
}
