//! Per-row speculative rollback: rows that keep different counts leave
//! holes that positions, masks, exports and extracted rows all honour.

use super::*;

pub(crate) fn cache(rows: usize) -> PlainKv {
    PlainKv {
        keys: None,
        values: None,
        idx: 0,
        base: 0,
        left_pad: vec![0; rows],
        holes: Holes::none(rows),
        step: 4,
        heads: 1,
        k_dim: 1,
        v_dim: 1,
        dtype: Dtype::Float32,
        marks: Vec::new(),
        lent_upto: Cell::new(0),
        pending: Cell::new(None),
    }
}

/// Appends per-row values `[B, 1, L, 1]`.
pub(crate) fn push(c: &mut PlainKv, rows: &[&[f32]]) {
    let l = rows[0].len() as i32;
    let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    let a = Array::from_slice(&flat, &[rows.len() as i32, 1, l, 1]);
    c.store(a.clone(), a).unwrap();
}

fn values(s: CacheState) -> Vec<f32> {
    let k = into_array(s.tensors.into_iter().next().unwrap());
    let out = k.flatten(None, None).unwrap();
    out.eval().unwrap();
    out.as_slice::<f32>().to_vec()
}

fn bools(a: Array) -> Vec<bool> {
    let a = a.flatten(None, None).unwrap();
    a.eval().unwrap();
    a.as_slice::<bool>().to_vec()
}

#[test]
fn rows_keeping_different_counts_leave_masked_holes() {
    let mut c = cache(2);
    push(&mut c, &[&[1.0, 2.0], &[11.0, 12.0]]);
    c.spec_begin();
    // Round of 4 columns: row 0 keeps 3, row 1 keeps 1.
    push(&mut c, &[&[3.0, 4.0, 5.0, 6.0], &[13.0, 14.0, 15.0, 16.0]]);
    CacheLayout::spec_rollback(&mut c, RSlice::from_slice(&[3, 1])).unwrap();
    assert_eq!(c.idx, 5, "the write index follows the most-keeping row");
    assert_eq!((c.row_len(0), c.row_len(1)), (5, 3));
    // The next token of row 1 attends to its 3 live columns only.
    let m = bools(c.mask_array(1).unwrap());
    assert_eq!(m, vec![true, true, true, true, true, true, /* row 1 */ true, true, true, false, false, true]);
    // Exported rows are compact: the holes are gone, the live tokens stay in order.
    assert_eq!(values(c.extract(1).unwrap()), vec![11.0, 12.0, 13.0]);
    assert_eq!(values(c.extract(0).unwrap()), vec![1.0, 2.0, 3.0, 4.0, 5.0]);
    // A trim past the holes forgets them.
    assert_eq!(CacheLayout::trim(&mut c, 2), 2);
    assert!(!c.holes.any());
}

/// Overlapping rounds (`caps::SPEC_PIPELINE`): a commit settles the
/// oldest round and a rollback keeps a count of the oldest, dropping every
/// younger round's columns with the rest.
#[test]
fn overlapping_rounds_settle_oldest_first() {
    let mut c = cache(1);
    push(&mut c, &[&[1.0, 2.0]]);
    c.spec_begin();
    push(&mut c, &[&[3.0, 4.0, 5.0]]);
    c.spec_begin();
    push(&mut c, &[&[6.0, 7.0]]);
    CacheLayout::spec_commit(&mut c).unwrap();
    CacheLayout::spec_rollback(&mut c, RSlice::from_slice(&[1])).unwrap();
    assert_eq!(values(c.extract(0).unwrap()), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);

    c.spec_begin();
    push(&mut c, &[&[8.0, 9.0, 10.0]]);
    c.spec_begin();
    push(&mut c, &[&[11.0, 12.0]]);
    CacheLayout::spec_rollback(&mut c, RSlice::from_slice(&[2])).unwrap();
    assert_eq!(values(c.extract(0).unwrap()), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 9.0]);
    assert!(CacheLayout::spec_rollback(&mut c, RSlice::from_slice(&[0])).is_err(), "no round is open");
}

#[test]
fn holes_survive_filter_and_merge_and_compaction_keeps_the_tokens() {
    let mut c = cache(2);
    push(&mut c, &[&[1.0], &[11.0]]);
    c.spec_begin();
    push(&mut c, &[&[2.0, 3.0], &[12.0, 13.0]]);
    CacheLayout::spec_rollback(&mut c, RSlice::from_slice(&[1, 2])).unwrap();
    assert_eq!(values(c.extract(0).unwrap()), vec![1.0, 2.0]);
    // A new row joins: everyone is left-padded, holes shift with the columns.
    let mut one = cache(1);
    push(&mut one, &[&[21.0, 22.0, 23.0, 24.0]]);
    c.merge(vec![one.state().unwrap()]).unwrap();
    assert_eq!(values(c.extract(0).unwrap()), vec![1.0, 2.0]);
    assert_eq!(values(c.extract(2).unwrap()), vec![21.0, 22.0, 23.0, 24.0]);
    c.filter(&[0, 2]).unwrap();
    assert_eq!(values(c.extract(0).unwrap()), vec![1.0, 2.0]);
    c.compact().unwrap();
    assert!(!c.holes.any());
    assert_eq!((c.row_len(0), c.row_len(1)), (2, 4));
    assert_eq!(values(c.extract(0).unwrap()), vec![1.0, 2.0]);
    assert_eq!(values(c.extract(1).unwrap()), vec![21.0, 22.0, 23.0, 24.0]);
}

/// Columns of storage (capacity), not of tokens.
fn capacity(c: &PlainKv) -> i32 {
    c.keys.as_ref().unwrap().shape()[2]
}

#[test]
fn joins_and_leaves_keep_room_for_the_next_token_and_drop_common_padding() {
    let mut c = cache(2);
    push(&mut c, &[&[1.0, 2.0, 3.0], &[11.0, 12.0, 13.0]]);
    assert_eq!(capacity(&c), 4);
    // A shorter joiner: appended under the batch's length, the room kept.
    let mut one = cache(1);
    push(&mut one, &[&[21.0, 22.0]]);
    c.merge(vec![one.state().unwrap()]).unwrap();
    assert_eq!((c.idx, capacity(&c)), (3, 4));
    assert_eq!((c.row_len(0), c.row_len(2)), (3, 2));
    assert_eq!(bools(c.mask_array(1).unwrap())[8..], [false, true, true, true]);
    push(&mut c, &[&[4.0], &[14.0], &[23.0]]);
    assert_eq!(capacity(&c), 4, "the next token is written in place");
    assert_eq!(values(c.extract(2).unwrap()), vec![21.0, 22.0, 23.0]);
    // The longest rows leave: the joiner's padding column goes with them.
    c.filter(&[2]).unwrap();
    assert_eq!((c.idx, c.left_pad.clone()), (3, vec![0]));
    assert_eq!(values(c.state().unwrap()), vec![21.0, 22.0, 23.0]);
    // A longer joiner: everyone is padded to its length, with room past it.
    let mut long = cache(1);
    push(&mut long, &[&[31.0, 32.0, 33.0, 34.0, 35.0, 36.0]]);
    c.merge(vec![long.state().unwrap()]).unwrap();
    assert_eq!((c.idx, capacity(&c), c.left_pad.clone()), (6, 8, vec![3, 0]));
    assert_eq!(values(c.extract(0).unwrap()), vec![21.0, 22.0, 23.0]);
    assert_eq!(values(c.extract(1).unwrap()), vec![31.0, 32.0, 33.0, 34.0, 35.0, 36.0]);
    push(&mut c, &[&[24.0], &[37.0]]);
    assert_eq!(capacity(&c), 8);
    assert_eq!(values(c.extract(0).unwrap()), vec![21.0, 22.0, 23.0, 24.0]);
}

/// 1-row cache holding `vals` as keys and values.
fn one_row(vals: &[f32]) -> CacheState {
    let mut c = cache(1);
    push(&mut c, &[vals]);
    c.state().unwrap()
}

/// Where the key storage's data lives (evaluated first).
fn storage_at(c: &PlainKv) -> usize {
    let k = c.keys.as_ref().unwrap();
    k.eval().unwrap();
    k.as_slice::<f32>().as_ptr() as usize
}

#[test]
fn a_leave_keeps_the_slot_and_a_join_writes_into_it_in_place() {
    let mut c = cache(4);
    push(&mut c, &[&[1.0, 2.0, 3.0], &[11.0, 12.0, 13.0], &[21.0, 22.0, 23.0], &[31.0, 32.0, 33.0]]);
    // Row 1 leaves; row 3 takes its slot, the fourth slot stays.
    c.filter(&[0, 3, 2]).unwrap();
    assert_eq!(values(c.extract(1).unwrap()), vec![31.0, 32.0, 33.0]);
    assert_eq!(values(c.extract(2).unwrap()), vec![21.0, 22.0, 23.0]);
    assert_eq!(c.keys.as_ref().unwrap().shape()[0], 4);
    let at = storage_at(&c);
    // A 2-token joiner takes the free slot, right-aligned at the write index.
    c.merge(vec![one_row(&[41.0, 42.0])]).unwrap();
    assert_eq!((c.rows(), c.left_pad[3], c.row_len(3)), (4, 1, 2));
    assert_eq!(values(c.extract(3).unwrap()), vec![41.0, 42.0]);
    assert_eq!(storage_at(&c), at, "the join wrote one slot, in place");
    // Its padding column (what the slot held before) is masked.
    let m = bools(c.mask_array(1).unwrap());
    assert_eq!(&m[12..16], &[false, true, true, true]);
    // Exported, the batch is compact again.
    let s = c.state().unwrap();
    assert_eq!(s.meta.as_slice(), &[3, 0, 0, 0, 1]);
}

#[test]
fn columns_padded_in_every_row_are_skipped_then_dropped_when_the_storage_grows() {
    let mut c = cache(1);
    push(&mut c, &[&[21.0]]);
    c.merge(vec![one_row(&[1.0, 2.0])]).unwrap();
    // The 2-token row leaves: the 1-token row stays, padded by one column.
    c.filter(&[0]).unwrap();
    assert_eq!((c.base, c.len(), c.row_len(0)), (1, 1, 1));
    assert_eq!(bools(c.mask_array(1).unwrap()), vec![true, true], "the skipped column is not attended");
    assert_eq!(CacheLayout::positions(&c).unwrap().offset, 1);
    // Growing past the capacity (4 columns) drops the skipped column.
    push(&mut c, &[&[22.0, 23.0, 24.0]]);
    assert_eq!((c.base, c.idx, c.left_pad[0]), (0, 4, 0));
    assert_eq!(values(c.extract(0).unwrap()), vec![21.0, 22.0, 23.0, 24.0]);
}
