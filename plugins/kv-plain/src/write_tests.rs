//! Which updates `kv_write` takes in place: never one over columns a lent
//! view covers (an exported state, an extracted row, a drafter's view, an
//! imported state's storage), nor one through
//! `update_and_fetch` (whose readers the write cannot order), every other
//! one; and every other reader of the storage schedules the last write
//! first. Launches are recorded, not run (`model_kit::cuda_capture`), so
//! this checks the rules, not the kernel; the GPU runs check what it writes.

use super::tests::{cache, push};
use super::*;
use model_kit::cuda_capture::launches;

/// A cache of one row whose storage grows 16 columns at a time.
fn roomy() -> PlainKv {
    let mut c = cache(1);
    c.step = 16;
    c
}

/// Whether storing `values` (one row) for attention went through the
/// in-place kernel.
fn in_place(c: &mut PlainKv, values: &[f32]) -> bool {
    in_place_rows(c, &[values])
}

/// Whether storing per-row `rows` for attention went through the in-place
/// kernel, checking that the layout says so and hands back queries of the
/// shape it was given.
fn in_place_rows(c: &mut PlainKv, rows: &[&[f32]]) -> bool {
    let (b, l) = (rows.len() as i32, rows[0].len() as i32);
    let mut said = None;
    let recorded = launches(|| {
        let flat: Vec<f32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        let a = Array::from_slice(&flat, &[b, 1, l, 1]);
        let q = Array::from_slice(&vec![0.5f32; 2 * flat.len()], &[b, 2, l, 1]);
        let (queries, _, _, written) = c.store_for(q.clone(), a.clone(), a)?;
        assert_eq!(queries.shape(), q.shape());
        said = Some(written);
        Ok(())
    })
    .unwrap();
    let writes = recorded.iter().filter(|l| l.kernel.starts_with("kv_write")).count();
    assert!(writes <= 1, "one launch writes K, V and the queries");
    assert_eq!(said, Some(writes == 1), "the layout says whether it wrote in place");
    writes == 1
}

#[test]
fn columns_no_lent_view_covers_are_written_in_place() {
    let mut c = roomy();
    assert!(!in_place(&mut c, &[1.0, 2.0]), "new storage is written by a slice update");
    assert!(in_place(&mut c, &[3.0]));
    assert!(c.pending.take().is_some(), "the write's mark is kept");
    assert!(in_place(&mut c, &[3.5]));
    // An exported state holds columns 0..4 and schedules the write before it.
    let _state = c.state().unwrap();
    assert!(c.pending.take().is_none(), "scheduled");
    assert!(in_place(&mut c, &[4.0]));
    // A round, its row lent to a drafter, then rolled back under the view.
    CacheLayout::spec_begin(&mut c);
    assert!(in_place(&mut c, &[5.0, 6.0]));
    let _view = c.view(0).unwrap();
    CacheLayout::spec_rollback(&mut c, RSlice::from_slice(&[0])).unwrap();
    assert!(!in_place(&mut c, &[7.0]), "column 5 is under the view");
    // The slice update's result is held by no view: in place again.
    assert!(in_place(&mut c, &[8.0]));
    assert_eq!(c.idx, 7);
    // `update_and_fetch` stores by a slice update, after the last write.
    assert!(in_place(&mut c, &[9.0]));
    push(&mut c, &[&[10.0]]);
    assert!(c.pending.take().is_none());
}

#[test]
fn shared_storage_is_never_written_in_place() {
    let mut c = roomy();
    push(&mut c, &[&[1.0, 2.0]]);
    assert!(in_place(&mut c, &[3.0]));
    // A row extracted, trimmed under and written again.
    let _row = c.extract(0).unwrap();
    CacheLayout::trim(&mut c, 1);
    assert!(!in_place(&mut c, &[5.0]));
    // An imported state is the exporter's storage, exactly full: the next
    // update grows it into storage of the importer's own.
    let mut other = roomy();
    other.load(c.state().unwrap()).unwrap();
    assert!(!in_place(&mut other, &[6.0]), "grown by a slice update");
    assert!(in_place(&mut other, &[7.0]));
}

#[test]
fn a_state_of_rows_with_holes_lends_only_the_columns_it_reads() {
    let mut c = cache(2);
    c.step = 16;
    push(&mut c, &[&[1.0], &[11.0]]);
    CacheLayout::spec_begin(&mut c);
    push(&mut c, &[&[2.0, 3.0], &[12.0, 13.0]]);
    CacheLayout::spec_rollback(&mut c, RSlice::from_slice(&[2, 1])).unwrap();
    assert!(c.holes.any());
    let _state = c.state().unwrap();
    assert!(in_place_rows(&mut c, &[&[4.0], &[14.0]]), "past the exported columns");
    CacheLayout::trim(&mut c, 2);
    assert!(!in_place_rows(&mut c, &[&[5.0], &[15.0]]), "under them");
}
