//! Blocks, sharing, copy-on-write and the view's geometry.
//!
//! The pool's counters are process-wide, so each test reads them as
//! differences while it holds what it made (tests in this file run in one
//! thread: `pool_lock`).

use crate::layout::PagedKv;
use crate::pool;
use model_kit::{Array, Dtype};
use plugin_api::abi_stable::std_types::{RSlice, RVec};
use plugin_api::*;
use plugin_sdk::{into_array, into_tensor};
use std::sync::Mutex;

static POOL: Mutex<()> = Mutex::new(());

fn pool_lock() -> std::sync::MutexGuard<'static, ()> {
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

fn cache(rows: usize) -> PagedKv {
    PagedKv::new(rows, 4, 1, 1, 1, Dtype::Float32)
}

/// Appends per-row values `[B, 1, L, 1]` (keys = values) and returns the
/// view attention would get, as rows of floats.
fn push(c: &mut PagedKv, rows: &[&[f32]]) -> Vec<Vec<f32>> {
    let l = rows[0].len() as i32;
    let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    let a = Array::from_slice(&flat, &[rows.len() as i32, 1, l, 1]);
    let kv = c.update_and_fetch(into_tensor(a.clone()), into_tensor(a)).unwrap();
    split(into_array(kv.keys))
}

fn split(a: Array) -> Vec<Vec<f32>> {
    let s = a.shape().to_vec();
    let f = a.flatten(None, None).unwrap();
    f.eval().unwrap();
    f.as_slice::<f32>().chunks(s[2] as usize).map(<[f32]>::to_vec).collect()
}

/// A `[B, 1, n, W]` mask as its B x n rows of W columns (1.0 = attended).
fn mask_rows(m: Array) -> Vec<Vec<f32>> {
    let s = m.shape().to_vec();
    split(m.as_dtype(Dtype::Float32).unwrap().reshape(&[s[0] * s[2], 1, s[3], 1]).unwrap())
}

fn seq(from: usize, n: usize) -> Vec<f32> {
    (from..from + n).map(|x| x as f32).collect()
}

#[test]
fn tokens_fill_blocks_and_the_view_is_everything_in_order() {
    let _g = pool_lock();
    let before = pool::usage().blocks;
    let mut c = cache(1);
    assert_eq!(push(&mut c, &[&seq(0, 6)]), vec![seq(0, 6)]);
    assert_eq!(pool::usage().blocks - before, 1, "6 tokens: one block of 4 and a tail of 2");
    for t in 6..11 {
        assert_eq!(push(&mut c, &[&[t as f32]]), vec![seq(0, t + 1)]);
    }
    assert_eq!(pool::usage().blocks - before, 2);
    assert_eq!(c.offset(), 11);
    drop(c);
    assert_eq!(pool::usage().blocks, before, "a dropped cache frees its blocks");
}

#[test]
fn an_imported_state_shares_its_blocks_and_writes_copy_on_write() {
    let _g = pool_lock();
    let before = pool::usage();
    let mut a = cache(1);
    push(&mut a, &[&seq(0, 10)]);
    let st = a.export_state().unwrap();
    let mut b = cache(1);
    b.import_state(st).unwrap();
    let u = pool::usage();
    assert_eq!(u.blocks - before.blocks, 2, "b holds a's two blocks, no copy");
    assert_eq!(u.references - before.references, 4);
    // b trims into the second block and writes past it: a's block is untouched.
    assert_eq!(b.trim(3), 3);
    assert_eq!(push(&mut b, &[&[100.0, 101.0]]), vec![[seq(0, 7), vec![100.0, 101.0]].concat()]);
    assert_eq!(push(&mut a, &[&[10.0]]), vec![seq(0, 11)]);
    let u = pool::usage();
    assert_eq!(u.blocks - before.blocks, 3, "shared first block, a's second, b's own second");
    // Merging both rows into a batch copies nothing either.
    let mut batch = cache(0);
    let mut rows = RVec::new();
    rows.push(a.export_state().unwrap());
    rows.push(b.export_state().unwrap());
    batch.merge_rows(rows).unwrap();
    assert_eq!(pool::usage().blocks - before.blocks, 3);
    drop((a, b));
    assert_eq!(pool::usage().blocks - before.blocks, 3, "the batch still holds them");
    CacheLayout::filter_rows(&mut batch, RSlice::from_slice(&[1])).unwrap();
    assert_eq!(pool::usage().blocks - before.blocks, 2, "a's own block left with its row");
}

/// What each row's last query attends to: the view's columns its mask
/// lets through (every column when rows are even and no mask is given).
fn seen(c: &mut PagedKv, rows: &[&[f32]]) -> Vec<Vec<f32>> {
    let l = rows[0].len();
    let m = c.attention_mask(l as u32).unwrap();
    let mask = m.array.into_option().map(|a| mask_rows(into_array(a)));
    let view = push(c, rows);
    match mask {
        None => view,
        Some(mask) => view
            .iter()
            .enumerate()
            .map(|(r, cols)| cols.iter().zip(&mask[r * l + l - 1]).filter(|(_, &m)| m > 0.0).map(|(&x, _)| x).collect())
            .collect(),
    }
}

#[test]
fn uneven_rows_are_aligned_by_blocks_with_kv_plains_positions() {
    let _g = pool_lock();
    let mut c = cache(0);
    let mut rows = RVec::new();
    for n in [5, 2] {
        let mut one = cache(1);
        push(&mut one, &[&seq(1, n)]);
        rows.push(one.export_state().unwrap());
    }
    c.merge_rows(rows).unwrap();
    let p = c.positions().unwrap();
    let per_row = split(into_array(p.per_row.unwrap()).as_dtype(Dtype::Float32).unwrap().reshape(&[1, 1, 2]).unwrap());
    assert_eq!(per_row, vec![vec![5.0, 2.0]]);
    // After one more token: 6 tokens in two blocks of 4, and 3 in one
    // block behind one padding block.
    let m = c.attention_mask(1).unwrap();
    assert_eq!(m.mode, MaskMode::ARRAY);
    let mask = into_array(m.array.unwrap());
    assert_eq!(mask.shape(), &[2, 1, 1, 8]);
    let want = vec![[vec![1.0; 6], vec![0.0; 2]].concat(), [vec![0.0; 4], vec![1.0; 3], vec![0.0]].concat()];
    assert_eq!(mask_rows(mask), want);
    let view = push(&mut c, &[&[6.0], &[3.0]]);
    assert_eq!(view[0][..6], seq(1, 6)[..]);
    assert_eq!(view[1][4..7], [1.0, 2.0, 3.0]);
    // A speculative round: row 0 keeps 1 of 3, row 1 all 3.
    c.spec_begin().unwrap();
    push(&mut c, &[&[7.0, 8.0, 9.0], &[4.0, 5.0, 6.0]]);
    CacheLayout::spec_rollback(&mut c, RSlice::from_slice(&[1, 3])).unwrap();
    assert_eq!(seen(&mut c, &[&[8.0], &[7.0]]), vec![seq(1, 8), seq(1, 7)]);
    // Row 1 twice (its last block copied: each copy writes its own):
    // rows of one length are kv-plain's geometry, with no mask.
    let before = pool::usage();
    CacheLayout::filter_rows(&mut c, RSlice::from_slice(&[1, 1])).unwrap();
    let u = pool::usage();
    assert_eq!(
        (u.blocks, u.references),
        (before.blocks - 2, before.references - 1),
        "row 0's blocks left, row 1's shared"
    );
    assert!(c.attention_mask(1).unwrap().array.is_none());
    let view = push(&mut c, &[&[8.0], &[80.0]]);
    assert_eq!(view, vec![seq(1, 8), [seq(1, 7), vec![80.0]].concat()]);
}

#[test]
fn a_padded_cohort_stores_no_padding() {
    let _g = pool_lock();
    let mut c = cache(0);
    CacheLayout::begin_padded(&mut c, RSlice::from_slice(&[0, 2])).unwrap();
    let p = c.positions().unwrap();
    let per_row = split(into_array(p.per_row.unwrap()).as_dtype(Dtype::Float32).unwrap().reshape(&[1, 1, 2]).unwrap());
    assert_eq!(per_row, vec![vec![0.0, -2.0]], "padding counts negatively, as kv-plain's left padding");
    let mask = into_array(c.attention_mask(3).unwrap().array.unwrap());
    assert_eq!(
        mask_rows(mask),
        vec![
            vec![1.0, 0.0, 0.0, 0.0],
            vec![1.0, 1.0, 0.0, 0.0],
            vec![1.0, 1.0, 1.0, 0.0],
            vec![0.0; 4],
            vec![0.0; 4],
            vec![1.0, 0.0, 0.0, 0.0]
        ]
    );
    let view = push(&mut c, &[&[1.0, 2.0, 3.0], &[-1.0, -1.0, 9.0]]);
    assert_eq!(view, vec![vec![1.0, 2.0, 3.0, 0.0], vec![9.0, 0.0, 0.0, 0.0]]);
    let one = c.extract_row(1).unwrap();
    assert_eq!(one.offset, 1, "the padding was not stored");
}

#[test]
fn a_state_of_another_geometry_or_with_bad_metadata_is_refused() {
    let _g = pool_lock();
    let mut a = cache(1);
    push(&mut a, &[&seq(0, 6)]);
    let mut st = a.export_state().unwrap();
    st.meta[2] = 9; // a length the tensors do not hold
    assert!(cache(1).import_state(st).into_result().is_err());
    let other = PagedKv::new(1, 8, 1, 1, 1, Dtype::Float32);
    assert!(cache(1).import_state(other.export_state().unwrap()).into_result().is_err());
}

#[test]
fn the_pool_grows_and_reuses_freed_blocks() {
    let _g = pool_lock();
    let before = pool::usage().blocks;
    let mut c = cache(1);
    // Past the first capacity (64 blocks of 4) in uneven steps.
    let mut n = 0;
    for step in [1, 7, 120, 3, 200, 1, 1] {
        assert_eq!(push(&mut c, &[&seq(n, step)]), vec![seq(0, n + step)]);
        n += step;
    }
    assert_eq!(pool::usage().blocks - before, (n / 4) as u64);
    // Trimmed blocks return to the free list and hold the next tokens.
    assert_eq!(c.trim(150), 150);
    n -= 150;
    assert_eq!(push(&mut c, &[&seq(n, 150)]), vec![seq(0, n + 150)]);
    assert_eq!(pool::usage().blocks - before, ((n + 150) / 4) as u64);
    drop(c);
    assert_eq!(pool::usage().blocks, before);
}
