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

#[test]
fn uneven_rows_get_left_padding_positions_and_masks_as_kv_plain() {
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
    let m = c.attention_mask(1).unwrap();
    assert_eq!(m.mode, MaskMode::ARRAY);
    let mask = into_array(m.array.unwrap()).as_dtype(Dtype::Float32).unwrap();
    assert_eq!(mask.shape(), &[2, 1, 1, 6]);
    assert_eq!(split(mask.reshape(&[2, 1, 6, 1]).unwrap()), vec![vec![1.0; 6], vec![0.0, 0.0, 0.0, 1.0, 1.0, 1.0]]);
    let view = push(&mut c, &[&[6.0], &[3.0]]);
    assert_eq!(view, vec![seq(1, 6), vec![0.0, 0.0, 0.0, 1.0, 2.0, 3.0]]);
    // A speculative round: row 0 keeps 1 of 3, row 1 all 3.
    c.spec_begin().unwrap();
    push(&mut c, &[&[7.0, 8.0, 9.0], &[4.0, 5.0, 6.0]]);
    CacheLayout::spec_rollback(&mut c, RSlice::from_slice(&[1, 3])).unwrap();
    assert_eq!(push(&mut c, &[&[8.0], &[7.0]]), vec![seq(1, 8), seq(0, 8)]);
}

#[test]
fn a_padded_cohort_stores_no_padding() {
    let _g = pool_lock();
    let mut c = cache(0);
    CacheLayout::begin_padded(&mut c, RSlice::from_slice(&[0, 2])).unwrap();
    let p = c.positions().unwrap();
    let per_row = split(into_array(p.per_row.unwrap()).as_dtype(Dtype::Float32).unwrap().reshape(&[1, 1, 2]).unwrap());
    assert_eq!(per_row, vec![vec![0.0, -2.0]], "padding counts negatively, as kv-plain's left padding");
    let mask = into_array(c.attention_mask(3).unwrap().array.unwrap()).as_dtype(Dtype::Float32).unwrap();
    assert_eq!(
        split(mask),
        vec![
            vec![1.0, 0.0, 0.0],
            vec![1.0, 1.0, 0.0],
            vec![1.0, 1.0, 1.0],
            vec![0.0; 3],
            vec![0.0; 3],
            vec![0.0, 0.0, 1.0]
        ]
    );
    let view = push(&mut c, &[&[1.0, 2.0, 3.0], &[-1.0, -1.0, 9.0]]);
    assert_eq!(view, vec![vec![1.0, 2.0, 3.0], vec![0.0, 0.0, 9.0]]);
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
