//! The layout as the graph and the host drive it: the conv window (what
//! mlx-lm's GatedDeltaNet does with `cache[0]`), slots, speculative rounds
//! (snapshot and restore), rows, state round trips and refusals.

use super::*;
use plugin_api::abi_stable::std_types::RSlice;

/// Conv window of 2 inputs of 3 channels; slot 1 is a `[2, 2]` state.
fn need() -> LayerNeed {
    LayerNeed {
        kind: NeedKind::RECURRENT,
        window: 0,
        kv_heads: 0,
        k_head_dim: 0,
        v_head_dim: 0,
        state_shapes: RVec::from(vec![RVec::from(vec![2i64, 3]), RVec::from(vec![2i64, 2])]),
    }
}

fn spec(rows: u32) -> CacheSpec {
    CacheSpec { need: need(), scheme: "plain".into(), dtype: plugin_api::Dtype::FLOAT32, rows, step: 256 }
}

fn cache(rows: u32) -> CacheBox {
    new_cache(&spec(rows)).unwrap()
}

fn err<T>(r: PResult<T>) -> PluginError {
    match r.into_result() {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

fn values(a: &Array) -> Vec<f32> {
    let flat = a.reshape(&[-1]).unwrap();
    flat.eval().unwrap();
    flat.as_slice::<f32>().to_vec()
}

/// `[rows, l, 3]` inputs whose values name row, token and channel:
/// `100 * row + 10 * (first + t) + c` for token t of the step.
fn inputs(rows: usize, first: usize, l: usize) -> Array {
    let v: Vec<f32> = (0..rows)
        .flat_map(|r| (0..l).flat_map(move |t| (0..3).map(move |c| (100 * r + 10 * (first + t) + c) as f32)))
        .collect();
    Array::from_slice(&v, &[rows as i32, l as i32, 3])
}

/// One layer step as the graph takes it: the window, then slot 1 = a
/// state that records the step (`first + l` in every element, per row).
fn step(c: &mut CacheBox, rows: usize, first: usize, l: usize) -> Vec<f32> {
    let kv = c.update_and_fetch(into_tensor(inputs(rows, first, l)), into_tensor(inputs(rows, first, l))).unwrap();
    let w = into_array(kv.keys);
    assert_eq!(w.shape(), &[rows as i32, 2 + l as i32, 3]);
    let st: Vec<f32> = (0..rows).flat_map(|r| std::iter::repeat_n((1000 * r + first + l) as f32, 4)).collect();
    c.set_slot(1, into_tensor(Array::from_slice(&st, &[rows as i32, 2, 2]))).unwrap();
    values(&w)
}

fn slot(c: &CacheBox, i: u32) -> Option<Vec<f32>> {
    c.get_slot(i).unwrap().into_option().map(|t| values(&into_array(t)))
}

#[test]
fn the_conv_window_starts_from_zeros_and_keeps_the_last_inputs() {
    let mut c = cache(1);
    assert_eq!((c.offset(), slot(&c, 0), slot(&c, 1)), (0, None, None));
    // Three tokens: window = two zero rows, then tokens 0..3.
    let w = step(&mut c, 1, 0, 3);
    assert_eq!(&w[..6], &[0.0; 6]);
    assert_eq!(&w[6..], &[0.0, 1.0, 2.0, 10.0, 11.0, 12.0, 20.0, 21.0, 22.0]);
    assert_eq!(slot(&c, 0).unwrap(), vec![10.0, 11.0, 12.0, 20.0, 21.0, 22.0]);
    assert_eq!(c.offset(), 3);
    // One more: window = tokens 1, 2 (stored), 3 (new).
    let w = step(&mut c, 1, 3, 1);
    assert_eq!(w, vec![10.0, 11.0, 12.0, 20.0, 21.0, 22.0, 30.0, 31.0, 32.0]);
    assert_eq!(slot(&c, 0).unwrap(), vec![20.0, 21.0, 22.0, 30.0, 31.0, 32.0]);
    assert_eq!(c.offset(), 4);
    assert_eq!(slot(&c, 1).unwrap(), vec![4.0; 4]);
    // The window keeps the dtype of the inputs (zeros too).
    let mut b = cache(1);
    let kv = b
        .update_and_fetch(
            into_tensor(inputs(1, 0, 1).as_dtype(Dtype::Bfloat16).unwrap()),
            into_tensor(Array::from_f32(0.0)),
        )
        .unwrap();
    assert_eq!(into_array(kv.keys).dtype(), Dtype::Bfloat16);
}

#[test]
fn nothing_trims_and_nothing_grows() {
    let mut c = cache(1);
    step(&mut c, 1, 0, 5);
    assert!(!c.is_trimmable());
    assert_eq!(c.trim(2), 0);
    assert_eq!(c.offset(), 5);
    assert_eq!(c.bytes_per_token(), 0);
    let m = c.attention_mask(4).unwrap();
    assert!(m.mode == MaskMode::NONE && m.array.is_none());
    let p = c.positions().unwrap();
    assert!(p.offset == 5 && p.per_row.is_none());
}

#[test]
fn a_round_that_keeps_everything_commits_and_one_that_drops_restores_the_start() {
    for (drafted, keep, restored) in [(3u64, 3u64, false), (3, 4, false), (3, 2, true), (4, 0, true), (1, 0, true)] {
        let mut c = cache(1);
        step(&mut c, 1, 0, 4);
        let (w0, s0) = (slot(&c, 0), slot(&c, 1));
        c.spec_begin().unwrap();
        step(&mut c, 1, 4, drafted as usize);
        let (w1, s1) = (slot(&c, 0), slot(&c, 1));
        c.spec_rollback(RSlice::from_slice(&[keep])).unwrap();
        let at = format!("drafted {drafted}, keep {keep}");
        if restored {
            assert_eq!(
                (c.offset(), slot(&c, 0), slot(&c, 1)),
                (4, w0.clone(), s0.clone()),
                "{at}: back at the round's start"
            );
        } else {
            assert_eq!((c.offset(), slot(&c, 0), slot(&c, 1)), (4 + drafted, w1, s1), "{at}: all kept");
        }
        // Replaying the kept tokens continues exactly as a run that never drafted.
        if restored && keep > 0 {
            step(&mut c, 1, 4, keep as usize);
        }
        let mut r = cache(1);
        step(&mut r, 1, 0, 4);
        if keep.min(drafted) > 0 {
            step(&mut r, 1, 4, keep.min(drafted) as usize);
        }
        let t = 4 + keep.min(drafted) as usize;
        assert_eq!(step(&mut c, 1, t, 1), step(&mut r, 1, t, 1), "{at}: next window");
        assert_eq!((c.offset(), slot(&c, 0), slot(&c, 1)), (r.offset(), slot(&r, 0), slot(&r, 1)), "{at}");
    }
}

#[test]
fn commit_drops_the_snapshot_and_a_rollback_needs_a_round() {
    let mut c = cache(1);
    step(&mut c, 1, 0, 2);
    c.spec_begin().unwrap();
    step(&mut c, 1, 2, 3);
    c.spec_commit().unwrap();
    assert_eq!(c.offset(), 5);
    assert_eq!(err(c.spec_rollback(RSlice::from_slice(&[0]))).code, ErrorCode::INVALID_INPUT);
    c.spec_begin().unwrap();
    assert_eq!(err(c.spec_rollback(RSlice::from_slice(&[0, 0, 0]))).code, ErrorCode::INVALID_INPUT);
}

#[test]
fn rows_merge_filter_and_extract_along_the_batch_axis() {
    // Three serial rows of different lengths; row 1 never ran (offset 0).
    let mut serial: Vec<CacheBox> = (0..3).map(|_| cache(1)).collect();
    step(&mut serial[0], 1, 0, 5);
    step(&mut serial[2], 1, 0, 2);
    let mut batch = new_cache(&spec(0)).unwrap();
    assert_eq!(batch.rows(), 0);
    for s in &serial {
        batch.merge_rows(RVec::from(vec![s.export_state().unwrap()])).unwrap();
    }
    assert_eq!((batch.rows(), batch.offset()), (3, 5));
    // The row that never ran holds zeros, which is where it would start.
    let w = slot(&batch, 0).unwrap();
    assert_eq!(&w[..6], slot(&serial[0], 0).unwrap().as_slice());
    assert_eq!(&w[6..12], &[0.0; 6]);
    assert_eq!(&w[12..], slot(&serial[2], 0).unwrap().as_slice());
    // Each row comes back out exactly as it went in, with its own offset.
    for (r, s) in serial.iter().enumerate() {
        let one = batch.extract_row(r as u32).unwrap();
        assert_eq!(one.offset, s.offset());
        let mut c = cache(1);
        c.import_state(one).unwrap();
        if r != 1 {
            assert_eq!((slot(&c, 0), slot(&c, 1)), (slot(s, 0), slot(s, 1)), "row {r}");
        }
    }
    // A batched step advances every row; filtering keeps rows in the given order.
    step(&mut batch, 3, 7, 1);
    batch.filter_rows(RSlice::from_slice(&[2, 0])).unwrap();
    assert_eq!(batch.rows(), 2);
    let offsets: Vec<u64> = (0..2).map(|r| batch.extract_row(r).unwrap().offset).collect();
    assert_eq!(offsets, vec![3, 6]);
    let w = slot(&batch, 0).unwrap();
    assert_eq!(&w[3..6], &[270.0, 271.0, 272.0], "row 2's newest input first");
    assert_eq!(&w[9..12], &[70.0, 71.0, 72.0]);
    assert_eq!(err(batch.filter_rows(RSlice::from_slice(&[2]))).code, ErrorCode::MLX);
    assert_eq!(err(batch.extract_row(2)).code, ErrorCode::MLX);
    batch.filter_rows(RSlice::from_slice(&[])).unwrap();
    assert_eq!((batch.rows(), batch.offset(), slot(&batch, 0)), (0, 0, None));
}

#[test]
fn state_round_trips_and_other_geometries_are_refused() {
    let mut a = cache(1);
    let empty = a.export_state().unwrap();
    assert_eq!((empty.offset, empty.tensors.len()), (0, 0));
    step(&mut a, 1, 0, 6);
    let st = a.export_state().unwrap();
    assert_eq!(st.signature.as_str(), "state:recurrent:float32:2x3:2x2");
    assert_eq!(st.offset, 6);
    let mut b = cache(1);
    b.import_state(st).unwrap();
    assert_eq!((b.offset(), slot(&b, 0), slot(&b, 1)), (6, slot(&a, 0), slot(&a, 1)));
    assert_eq!(step(&mut a, 1, 6, 2), step(&mut b, 1, 6, 2));
    // An empty state resets.
    b.import_state(empty).unwrap();
    assert_eq!((b.offset(), slot(&b, 0)), (0, None));
    // Another dtype or geometry is another signature.
    let mut other = spec(1);
    other.dtype = plugin_api::Dtype::BFLOAT16;
    let mut o = new_cache(&other).unwrap();
    assert_eq!(err(o.import_state(a.export_state().unwrap())).code, ErrorCode::INVALID_INPUT);
    // Metadata that does not match the tensors.
    for meta in [vec![1u64, 3], vec![2, 3, 8], vec![1, 1, 8], vec![1, 4, 8]] {
        let mut bad = a.export_state().unwrap();
        bad.meta = RVec::from(meta.clone());
        assert_eq!(err(b.import_state(bad)).code, ErrorCode::INVALID_INPUT, "meta {meta:?}");
    }
}

#[test]
fn slots_and_inputs_of_the_wrong_shape_are_refused_without_a_change() {
    let mut c = cache(1);
    step(&mut c, 1, 0, 2);
    let before = (c.offset(), slot(&c, 0), slot(&c, 1));
    assert_eq!(
        err(c.set_slot(1, into_tensor(Array::from_slice(&[1.0f32; 6], &[1, 2, 3])))).code,
        ErrorCode::INVALID_INPUT
    );
    assert_eq!(err(c.set_slot(2, into_tensor(Array::from_f32(1.0)))).code, ErrorCode::INVALID_INPUT);
    assert_eq!(err(c.get_slot(5)).code, ErrorCode::INVALID_INPUT);
    let wide = into_tensor(Array::from_slice(&[1.0f32; 4], &[1, 1, 4]));
    assert_eq!(err(c.update_and_fetch(wide, into_tensor(Array::from_f32(0.0)))).code, ErrorCode::MLX);
    let two_rows = into_tensor(inputs(2, 0, 1));
    assert_eq!(err(c.update_and_fetch(two_rows, into_tensor(Array::from_f32(0.0)))).code, ErrorCode::MLX);
    assert_eq!((c.offset(), slot(&c, 0), slot(&c, 1)), before);
}

#[test]
fn new_cache_serves_only_plain_recurrent_needs_with_sane_shapes() {
    assert_eq!(cache(1).signature().as_str(), "state:recurrent:float32:2x3:2x2");
    let with = |kind, scheme: &str, shapes: Vec<Vec<i64>>| {
        let mut s = spec(1);
        s.need.kind = kind;
        s.scheme = scheme.into();
        s.need.state_shapes = shapes.into_iter().map(RVec::from).collect();
        new_cache(&s).err().map(|e| e.code)
    };
    assert_eq!(with(NeedKind::FULL, "plain", vec![vec![2, 3]]), Some(ErrorCode::UNSUPPORTED));
    assert_eq!(with(NeedKind::RECURRENT, "affine4", vec![vec![2, 3]]), Some(ErrorCode::UNSUPPORTED));
    for bad in [vec![], vec![vec![3]], vec![vec![2, 3], vec![0, 4]], vec![vec![2, 3], vec![1 << 20, 1 << 20]]] {
        assert_eq!(with(NeedKind::RECURRENT, "plain", bad.clone()), Some(ErrorCode::INVALID_INPUT), "{bad:?}");
    }
    let m = manifest();
    let tags: Vec<&str> = m.capabilities.iter().map(|c| c.as_str()).collect();
    assert_eq!(tags, [caps::SPEC_ROUND, caps::SPEC_REPLAY, caps::SPEC_PIPELINE, caps::STATE_IO, caps::ROWS]);
    assert_eq!(m.claims.cache_needs.iter().map(|s| s.as_str()).collect::<Vec<_>>(), ["recurrent"]);
}

/// The mask of the next `l` columns as rows of bools, or None for `NONE`.
fn mask_rows(c: &CacheBox, l: u32) -> Option<Vec<Vec<bool>>> {
    let m = c.attention_mask(l).unwrap();
    if m.mode == MaskMode::NONE {
        assert!(m.array.is_none());
        return None;
    }
    assert_eq!(m.mode, MaskMode::ARRAY);
    let a = into_array(m.array.into_option().unwrap());
    assert_eq!((a.shape()[1], a.dtype()), (l as i32, Dtype::Bool));
    a.eval().unwrap();
    Some(a.as_slice::<bool>().chunks(l as usize).map(<[bool]>::to_vec).collect())
}

/// Columns `from..to` of a left-padded `[rows, width, 3]` batch as the graph
/// hands them over: padding zeroed by the mask (mlx-lm's
/// `where(mask, qkv, 0)`), real token t of row r valued as `inputs` does.
fn padded_inputs(pads: &[usize], from: usize, to: usize) -> Array {
    let v: Vec<f32> = pads
        .iter()
        .enumerate()
        .flat_map(|(r, &p)| {
            (from..to).flat_map(move |col| {
                (0..3).map(move |c| if col < p { 0.0 } else { (100 * r + 10 * (col - p) + c) as f32 })
            })
        })
        .collect();
    Array::from_slice(&v, &[pads.len() as i32, (to - from) as i32, 3])
}

#[test]
fn padded_rows_mask_their_padding_across_updates_and_count_real_tokens_only() {
    // Width 8: row 0 has 1 real token, row 1 eight, row 2 three, row 3 none
    // yet in the first chunk. Chunks of 4 columns: rows 0 and 2 are padding
    // across the chunk boundary.
    let pads = [7usize, 0, 5, 6];
    let mut c = new_cache(&spec(0)).unwrap();
    c.begin_padded(RSlice::from_slice(&pads.map(|p| p as u32))).unwrap();
    assert_eq!((c.rows(), c.offset()), (4, 0));
    let f = false;
    let t = true;
    assert_eq!(mask_rows(&c, 4).unwrap(), vec![vec![f; 4], vec![t; 4], vec![f; 4], vec![f; 4]]);
    c.update_and_fetch(into_tensor(padded_inputs(&pads, 0, 4)), into_tensor(Array::from_f32(0.0))).unwrap();
    assert_eq!(c.offset(), 4, "only row 1's real tokens count");
    let next = vec![vec![f, f, f, t], vec![t; 4], vec![f, t, t, t], vec![f, f, t, t]];
    assert_eq!(mask_rows(&c, 4).unwrap(), next);
    // Mid-padding state round-trips with the padding still to come (the
    // host exports after every prefill chunk), and so does one row.
    let mut copy = new_cache(&spec(0)).unwrap();
    copy.import_state(c.export_state().unwrap()).unwrap();
    assert_eq!((copy.rows(), copy.offset(), mask_rows(&copy, 4).unwrap()), (4, 4, next.clone()));
    let mut row3 = cache(1);
    row3.import_state(c.extract_row(3).unwrap()).unwrap();
    assert_eq!((row3.offset(), mask_rows(&row3, 4).unwrap()), (0, vec![next[3].clone()]));
    c.update_and_fetch(into_tensor(padded_inputs(&pads, 4, 8)), into_tensor(Array::from_f32(0.0))).unwrap();
    assert_eq!(mask_rows(&c, 4), None, "padding consumed");
    assert_eq!(mask_rows(&c, 1), None);
    // Each row equals that row run alone over its real tokens: same offset,
    // same conv window (zeros before a short row's real inputs).
    for (r, &p) in pads.iter().enumerate() {
        let row = c.extract_row(r as u32).unwrap();
        let mut alone = cache(1);
        let real = 8 - p;
        let v: Vec<f32> = (0..real).flat_map(|t| (0..3).map(move |ch| (100 * r + 10 * t + ch) as f32)).collect();
        alone
            .update_and_fetch(
                into_tensor(Array::from_slice(&v, &[1, real as i32, 3])),
                into_tensor(Array::from_f32(0.0)),
            )
            .unwrap();
        assert_eq!(row.offset, real as u64, "row {r}");
        let mut back = cache(1);
        back.import_state(row).unwrap();
        assert_eq!(slot(&back, 0), slot(&alone, 0), "row {r}'s window");
    }
    assert_eq!(c.offset(), 8);
    assert!(c.positions().unwrap().per_row.is_none());
}

#[test]
fn padding_follows_filtered_rows_and_only_an_empty_cache_starts_padded() {
    let mut c = new_cache(&spec(0)).unwrap();
    c.begin_padded(RSlice::from_slice(&[2, 0, 5])).unwrap();
    c.filter_rows(RSlice::from_slice(&[2, 0])).unwrap();
    assert_eq!(mask_rows(&c, 3).unwrap(), vec![vec![false; 3], vec![false, false, true]]);
    // A round that drops its tokens restores the pending padding too.
    c.spec_begin().unwrap();
    c.update_and_fetch(into_tensor(padded_inputs(&[5, 2], 0, 3)), into_tensor(Array::from_f32(0.0))).unwrap();
    assert_eq!(mask_rows(&c, 3).unwrap(), vec![vec![false, false, true], vec![true; 3]]);
    c.spec_rollback(RSlice::from_slice(&[0])).unwrap();
    assert_eq!((c.offset(), mask_rows(&c, 3).unwrap()), (0, vec![vec![false; 3], vec![false, false, true]]));
    // No padding: no mask, as before.
    let mut plain = new_cache(&spec(0)).unwrap();
    plain.begin_padded(RSlice::from_slice(&[0, 0])).unwrap();
    assert_eq!((plain.rows(), mask_rows(&plain, 2)), (2, None));
    // A cache that holds tokens cannot start padded.
    let mut used = cache(1);
    step(&mut used, 1, 0, 2);
    assert_eq!(err(used.begin_padded(RSlice::from_slice(&[1]))).code, ErrorCode::INVALID_INPUT);
    assert_eq!(used.offset(), 2);
}

/// A batched round: rows keep 1, 4 and 2 of 4 appended tokens. The state
/// goes back to the round's start, and the host replays every row's kept
/// tokens in one 4-column update whose columns past a row's count are
/// padding (masked, zeroed by the graph): each row then equals that row run
/// alone over its kept tokens, and the replay's own round keeps it all.
#[test]
fn rows_that_keep_different_counts_replay_in_one_padded_update() {
    let keep = [1u64, 4, 2];
    let mut c = cache(3);
    step(&mut c, 3, 0, 4);
    c.spec_begin().unwrap();
    step(&mut c, 3, 4, 4);
    c.spec_rollback(RSlice::from_slice(&keep)).unwrap();
    assert_eq!(c.offset(), 4, "back at the round's start");
    let (t, f) = (true, false);
    assert_eq!(mask_rows(&c, 4).unwrap(), vec![vec![t, f, f, f], vec![t; 4], vec![t, t, f, f]]);
    assert_eq!(err(c.export_state()).code, ErrorCode::INVALID_INPUT, "no export before the replay");
    assert_eq!(err(c.extract_row(0)).code, ErrorCode::INVALID_INPUT);
    // An update narrower than the longest kept run is refused.
    assert!(c.update_and_fetch(into_tensor(inputs(3, 4, 3)), into_tensor(inputs(3, 4, 3))).into_result().is_err());
    c.spec_begin().unwrap();
    let replay: Vec<f32> = (0..3)
        .flat_map(|r| {
            (0..4).flat_map(move |col| {
                (0..3).map(move |ch| if (col as u64) < keep[r] { (100 * r + 10 * (4 + col) + ch) as f32 } else { 0.0 })
            })
        })
        .collect();
    let replay = Array::from_slice(&replay, &[3, 4, 3]);
    c.update_and_fetch(into_tensor(replay.clone()), into_tensor(replay)).unwrap();
    c.spec_rollback(RSlice::from_slice(&keep)).unwrap();
    assert_eq!(mask_rows(&c, 1), None, "replay consumed");
    for (r, &n) in keep.iter().enumerate() {
        let v: Vec<f32> =
            (0..4 + n as usize).flat_map(|t| (0..3).map(move |ch| (100 * r + 10 * t + ch) as f32)).collect();
        let mut alone = cache(1);
        alone
            .update_and_fetch(
                into_tensor(Array::from_slice(&v, &[1, 4 + n as i32, 3])),
                into_tensor(Array::from_f32(0.0)),
            )
            .unwrap();
        let mut back = cache(1);
        back.import_state(c.extract_row(r as u32).unwrap()).unwrap();
        assert_eq!((back.offset(), slot(&back, 0)), (4 + n, slot(&alone, 0)), "row {r}");
    }
}

/// A pending replay follows filtered rows; merging rows waits for it; a
/// rollback that keeps nothing leaves no replay (the next update is new
/// tokens, all real).
#[test]
fn a_pending_replay_follows_filters_and_blocks_merges() {
    let mut c = cache(2);
    step(&mut c, 2, 0, 2);
    c.spec_begin().unwrap();
    step(&mut c, 2, 2, 3);
    c.spec_rollback(RSlice::from_slice(&[3, 1])).unwrap();
    let other = cache(1).export_state().unwrap();
    assert!(c.merge_rows(RVec::from(vec![other])).into_result().is_err());
    c.filter_rows(RSlice::from_slice(&[1])).unwrap();
    assert_eq!(mask_rows(&c, 3).unwrap(), vec![vec![true, false, false]]);
    let mut none = cache(1);
    step(&mut none, 1, 0, 2);
    none.spec_begin().unwrap();
    step(&mut none, 1, 2, 2);
    none.spec_rollback(RSlice::from_slice(&[0])).unwrap();
    assert_eq!((none.offset(), mask_rows(&none, 1)), (2, None));
    assert!(none.export_state().into_result().is_ok());
}

/// Row r's states after each of `l` positions from token `first`, as
/// `step` records them (`1000 r + first + p + 1` after position p).
fn position_states(rows: usize, first: usize, l: usize) -> Array {
    let v: Vec<f32> = (0..rows)
        .flat_map(|r| (0..l).flat_map(move |p| std::iter::repeat_n((1000 * r + first + p + 1) as f32, 4)))
        .collect();
    Array::from_slice(&v, &[rows as i32, l as i32, 2, 2])
}

/// A round whose first update hands the state after each of its positions
/// keeps any count per row by itself: the state after the row's last kept
/// position and the window ending at its last kept input, as a run that
/// never drafted. Nothing awaits a replay, and the layout says so first.
#[test]
fn position_states_roll_a_round_back_in_place() {
    let keep = [0u64, 1, 3, 4];
    let rows = keep.len();
    let mut c = cache(rows as u32);
    step(&mut c, rows, 0, 2);
    assert!(!c.wants_position_states(), "outside a round");
    c.spec_begin().unwrap();
    assert!(!c.wants_position_states(), "before the round's update");
    step(&mut c, rows, 2, 4);
    assert!(c.wants_position_states() && !c.rolls_back_in_place(), "asked for, not yet handed");
    let wrong = Array::from_slice(&vec![0f32; rows * 3 * 4], &[rows as i32, 3, 2, 2]);
    assert_eq!(err(c.set_position_states(1, into_tensor(wrong))).code, ErrorCode::INVALID_INPUT);
    assert_eq!(err(c.set_position_states(0, into_tensor(position_states(rows, 2, 4)))).code, ErrorCode::INVALID_INPUT);
    c.set_position_states(1, into_tensor(position_states(rows, 2, 4))).unwrap();
    assert!(c.rolls_back_in_place());
    c.spec_rollback(RSlice::from_slice(&keep)).unwrap();
    assert_eq!(mask_rows(&c, 1), None, "no replay pending");
    assert!(c.export_state().into_result().is_ok(), "settled");
    for (r, &n) in keep.iter().enumerate() {
        let v: Vec<f32> =
            (0..2 + n as usize).flat_map(|t| (0..3).map(move |ch| (100 * r + 10 * t + ch) as f32)).collect();
        let mut alone = cache(1);
        alone
            .update_and_fetch(
                into_tensor(Array::from_slice(&v, &[1, 2 + n as i32, 3])),
                into_tensor(Array::from_f32(0.0)),
            )
            .unwrap();
        let mut back = cache(1);
        back.import_state(c.extract_row(r as u32).unwrap()).unwrap();
        let state = vec![(1000 * r + 2 + n as usize) as f32; 4];
        assert_eq!((back.offset(), slot(&back, 0), slot(&back, 1)), (2 + n, slot(&alone, 0), Some(state)), "row {r}");
    }
}

/// Position states serve only the round's first update: a second update
/// in the round, or states handed outside a round, leave the replay path.
#[test]
fn position_states_serve_only_a_rounds_first_update() {
    let mut c = cache(1);
    step(&mut c, 1, 0, 2);
    assert_eq!(err(c.set_position_states(1, into_tensor(position_states(1, 0, 2)))).code, ErrorCode::INVALID_INPUT);
    c.spec_begin().unwrap();
    step(&mut c, 1, 2, 2);
    c.set_position_states(1, into_tensor(position_states(1, 2, 2))).unwrap();
    step(&mut c, 1, 4, 1);
    assert!(!c.wants_position_states() && !c.rolls_back_in_place());
    c.spec_rollback(RSlice::from_slice(&[1])).unwrap();
    assert_eq!(c.offset(), 2, "back at the round's start, for the host to replay");
}

/// Overlapping rounds (`caps::SPEC_PIPELINE`): each keeps its own start
/// and its first update's position states. A commit settles the oldest;
/// a rollback keeps a count of the oldest in place and drops the younger
/// round with the rest.
#[test]
fn overlapping_rounds_settle_oldest_first_in_place() {
    let open = |c: &mut CacheBox, first: usize, l: usize| {
        c.spec_begin().unwrap();
        step(c, 1, first, l);
        c.set_position_states(1, into_tensor(position_states(1, first, l))).unwrap();
    };
    let mut c = cache(1);
    step(&mut c, 1, 0, 2);
    open(&mut c, 2, 3);
    open(&mut c, 5, 2);
    c.spec_commit().unwrap();
    assert!(c.rolls_back_in_place(), "the younger round has its position states");
    c.spec_rollback(RSlice::from_slice(&[1])).unwrap();
    assert_eq!(mask_rows(&c, 1), None, "no replay pending");
    assert_eq!((c.offset(), slot(&c, 1)), (6, Some(vec![6.0; 4])), "the state after the younger round's first token");

    open(&mut c, 6, 3);
    open(&mut c, 9, 2);
    c.spec_rollback(RSlice::from_slice(&[2])).unwrap();
    assert_eq!(mask_rows(&c, 1), None, "no replay pending");
    assert_eq!((c.offset(), slot(&c, 1)), (8, Some(vec![8.0; 4])), "the oldest round's second position");
    assert_eq!(err(c.spec_rollback(RSlice::from_slice(&[0]))).code, ErrorCode::INVALID_INPUT, "no round is open");

    // The oldest round without position states: back to ITS start (not the
    // younger round's), for the host to replay the kept tokens.
    let mut c = cache(1);
    step(&mut c, 1, 0, 2);
    c.spec_begin().unwrap();
    step(&mut c, 1, 2, 3);
    open(&mut c, 5, 2);
    assert!(!c.rolls_back_in_place(), "the oldest round has no position states");
    c.spec_rollback(RSlice::from_slice(&[1])).unwrap();
    assert_eq!((c.offset(), slot(&c, 1)), (2, Some(vec![2.0; 4])), "the oldest round's start");
    assert!(c.export_state().into_result().is_err(), "a replay of the kept token is pending");
}
