//! Replays `tests/mlx_lm_trace.txt` (recorded from mlx-lm's RotatingKVCache
//! by `tests/trace_mlx_lm.py`) through this layout: the mask asked before
//! each update, the keys fetched (token order), the raw storage, offset,
//! write index and trimmability must all be the same. Then the host-driven
//! parts mlx-lm has no trace for: speculative rounds, state round trips,
//! refusals.

use super::*;
use crate::columns::len;
use crate::geometry::Geometry;
use crate::ring::Ring;
use model_kit::{Array, Dtype};
use plugin_api::abi_stable::std_types::{ROption, RSlice, RVec};
use plugin_sdk::{into_array, into_tensor};

const TRACE: &str = include_str!("../tests/mlx_lm_trace.txt");

fn cache(max_size: usize, window: usize) -> RotatingKv {
    let geo = Geometry { max_size, window, step: 256, heads: 1, k_dim: 1, v_dim: 1, dtype: Dtype::Float32 };
    RotatingKv::serial(geo)
}

/// mlx-lm's `offset`: the ring's timeline, which for its one unpadded row
/// is the row's offset.
fn offset(c: &RotatingKv) -> usize {
    assert_eq!((c.ring.left_pad.as_slice(), c.ring.offsets.as_slice()), (&[0][..], &[c.ring.seen as i64][..]));
    c.ring.seen
}

fn err<T>(r: PResult<T>) -> PluginError {
    match r.into_result() {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

fn ids(a: &Array) -> Vec<i64> {
    let flat = a.reshape(&[-1]).unwrap();
    flat.eval().unwrap();
    flat.as_slice::<f32>().iter().map(|&x| x as i64).collect()
}

fn mask_text(m: AttentionMask) -> String {
    match (m.mode, m.array) {
        (MaskMode::NONE, ROption::RNone) => "none".into(),
        (MaskMode::CAUSAL, ROption::RNone) => "causal".into(),
        (MaskMode::ARRAY, ROption::RSome(t)) => {
            let a = into_array(t);
            let s = a.shape().to_vec();
            assert_eq!((s.len(), s[0], s[1]), (4, 1, 1), "array masks are [1, 1, L, K]");
            a.eval().unwrap();
            let bits: String = a.as_slice::<bool>().iter().map(|&b| if b { '1' } else { '0' }).collect();
            format!("{}x{}:{bits}", s[2], s[3])
        }
        (mode, _) => panic!("mask mode {} with a mismatched array", mode.0),
    }
}

/// Tokens `from+1 ..= from+l` as keys (values negated), `[1, 1, l, 1]`.
fn tokens(from: usize, l: usize) -> (Tensor, Tensor) {
    let k: Vec<f32> = (from + 1..=from + l).map(|t| t as f32).collect();
    let v: Vec<f32> = k.iter().map(|x| -x).collect();
    (into_tensor(Array::from_slice(&k, &[1, 1, l as i32, 1])), into_tensor(Array::from_slice(&v, &[1, 1, l as i32, 1])))
}

/// One step as the model graph drives it: mask first, then the update.
/// Returns (mask, fetched token ids).
fn step(c: &mut RotatingKv, from: usize, l: usize) -> (String, Vec<i64>) {
    let mask = mask_text(CacheLayout::attention_mask(c, l as u32).unwrap());
    let (k, v) = tokens(from, l);
    let kv = CacheLayout::update_and_fetch(c, k, v).unwrap();
    let (k, v) = (into_array(kv.keys), into_array(kv.values));
    let (ki, vi) = (ids(&k), ids(&v));
    assert_eq!(ki.iter().map(|x| -x).collect::<Vec<_>>(), vi, "values follow keys");
    (mask, ki)
}

fn storage(c: &RotatingKv) -> Vec<i64> {
    let st = CacheLayout::export_state(c).unwrap();
    st.tensors.into_iter().next().map(|t| ids(&into_array(t))).unwrap_or_default()
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

fn list(s: &str) -> Vec<i64> {
    s.split(',').filter(|x| !x.is_empty()).map(|x| x.parse().unwrap()).collect()
}

#[test]
fn replays_mlx_lm_rotating_kv_cache_exactly() {
    let mut cur: Option<(String, RotatingKv, usize)> = None;
    let mut checked = 0;
    for line in TRACE.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut w = line.split_whitespace();
        match w.next().unwrap() {
            "seq" => {
                let name = w.next().unwrap().to_owned();
                let c = cache(field(line, "max_size").parse().unwrap(), field(line, "window").parse().unwrap());
                cur = Some((name, c, 0));
            }
            "update" => {
                let (name, c, t) = cur.as_mut().unwrap();
                let l: usize = w.next().unwrap().parse().unwrap();
                let (mask, fetched) = step(c, *t, l);
                *t += l;
                let at = format!("{name}, update of {l} at token {}", *t - l);
                assert_eq!(mask, field(line, "mask"), "{at}: mask");
                assert_eq!(fetched, list(field(line, "fetched")), "{at}: fetched keys");
                assert_eq!(storage(c), list(field(line, "storage")), "{at}: storage");
                assert_eq!(offset(c).to_string(), field(line, "offset"), "{at}: offset");
                assert_eq!(CacheLayout::offset(c).to_string(), field(line, "offset"), "{at}: offset()");
                assert_eq!(c.ring.idx.to_string(), field(line, "idx"), "{at}: write index");
                assert_eq!(
                    (CacheLayout::is_trimmable(c) as u8).to_string(),
                    field(line, "trimmable"),
                    "{at}: trimmable"
                );
                checked += 1;
            }
            "trim" => {
                // Token numbers go on after a trim (as in the trace script).
                let (name, c, _) = cur.as_mut().unwrap();
                let n: u64 = w.next().unwrap().parse().unwrap();
                let removed = CacheLayout::trim(c, n);
                assert_eq!(removed.to_string(), field(line, "removed"), "{name}: trim {n}");
                assert_eq!(
                    (offset(c).to_string(), c.ring.idx.to_string()),
                    (field(line, "offset").to_owned(), field(line, "idx").to_owned()),
                    "{name}: trim {n}"
                );
                assert_eq!((CacheLayout::is_trimmable(c) as u8).to_string(), field(line, "trimmable"));
            }
            other => panic!("unknown trace line `{other}`"),
        }
    }
    assert!(checked > 150, "trace too short: {checked}");
}

/// mlx-lm's serial state does not say whether the ring has rotated: an
/// import must tell from the write index, at every point of every traced
/// sequence, and rebuild the rest of the ring as it was.
#[test]
fn a_serial_state_rebuilds_the_ring_it_came_from() {
    let mut c = cache(8, 8);
    let mut t = 0;
    let mut checked = 0;
    for line in TRACE.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
        let mut w = line.split_whitespace();
        match w.next().unwrap() {
            "seq" => {
                c = cache(field(line, "max_size").parse().unwrap(), field(line, "window").parse().unwrap());
                t = 0;
            }
            "update" => {
                let l: usize = w.next().unwrap().parse().unwrap();
                step(&mut c, t, l);
                t += l;
            }
            "trim" => {
                CacheLayout::trim(&mut c, w.next().unwrap().parse().unwrap());
            }
            other => panic!("unknown trace line `{other}`"),
        }
        let back = Ring::from_serial_state(c.ring.geo, CacheLayout::export_state(&c).unwrap()).unwrap();
        let r = &c.ring;
        let at = format!("after `{line}`");
        assert_eq!(
            (back.idx, back.seen, &back.offsets, &back.left_pad),
            (r.idx, r.seen, &r.offsets, &r.left_pad),
            "{at}"
        );
        let held = |r: &Ring| r.keys.as_ref().map(ids).unwrap_or_default();
        assert_eq!(held(&back), held(r), "{at}: storage");
        // A rotated ring whose write index reached the storage's end is in
        // temporal order again: unrolling it changes nothing.
        let out_of_order = r.rotated && r.idx != r.keys.as_ref().map_or(0, len);
        assert_eq!(back.rotated, out_of_order, "{at}: rotation");
        checked += usize::from(out_of_order);
    }
    assert!(checked > 20, "too few rotated rings: {checked}");
}

#[test]
fn a_wrapped_ring_is_not_trimmable_and_refuses_a_speculative_round() {
    let mut c = cache(8, 8);
    step(&mut c, 0, 7);
    assert!(CacheLayout::is_trimmable(&c));
    step(&mut c, 7, 1);
    assert!(!CacheLayout::is_trimmable(&c));
    assert_eq!(CacheLayout::trim(&mut c, 1), 0);
    assert_eq!(offset(&c), 8);
    let e = err(CacheLayout::spec_begin(&mut c));
    assert_eq!(e.code, ErrorCode::UNSUPPORTED, "{e}");
}

/// Continues `a` and `b` with the same steps; both must mask and fetch alike.
fn same_future(a: &mut RotatingKv, b: &mut RotatingKv, from: usize, steps: &[usize]) {
    let mut t = from;
    for &l in steps {
        assert_eq!(step(a, t, l), step(b, t, l), "diverged at token {t} (step of {l})");
        t += l;
    }
    assert_eq!((offset(a), CacheLayout::is_trimmable(a)), (offset(b), CacheLayout::is_trimmable(b)));
}

const FUTURE: &[usize] = &[1, 1, 3, 1, 1, 1, 1, 1, 1, 1, 1, 12, 1, 1, 2, 1];

#[test]
fn rollback_before_the_wrap_trims_like_mlx_lm() {
    for (prompt, drafted, kept) in [(3, 3, 1), (3, 4, 0), (2, 5, 5), (1, 6, 3)] {
        let mut c = cache(8, 8);
        step(&mut c, 0, prompt);
        CacheLayout::spec_begin(&mut c).unwrap();
        step(&mut c, prompt, drafted);
        CacheLayout::spec_rollback(&mut c, RSlice::from_slice(&[kept as u64])).unwrap();
        assert_eq!(offset(&c), prompt + kept);
        // The reference never saw the rejected tokens.
        let mut r = cache(8, 8);
        step(&mut r, 0, prompt);
        if kept > 0 {
            step(&mut r, prompt, kept);
        }
        same_future(&mut c, &mut r, prompt + kept, FUTURE);
    }
}

#[test]
fn rollback_across_a_wrap_restores_and_replays_the_kept_tokens() {
    for (prompt, drafted, kept) in [(6, 4, 2), (7, 3, 0), (5, 9, 1), (4, 6, 6)] {
        let mut c = cache(8, 8);
        step(&mut c, 0, prompt);
        CacheLayout::spec_begin(&mut c).unwrap();
        step(&mut c, prompt, drafted);
        assert!(!CacheLayout::is_trimmable(&c), "the round wrapped the ring");
        CacheLayout::spec_rollback(&mut c, RSlice::from_slice(&[kept as u64])).unwrap();
        let mut r = cache(8, 8);
        step(&mut r, 0, prompt);
        if kept > 0 {
            step(&mut r, prompt, kept);
        }
        assert_eq!(storage(&c), storage(&r));
        same_future(&mut c, &mut r, prompt + kept, FUTURE);
    }
}

#[test]
fn commit_keeps_everything_and_rollback_needs_a_round() {
    let mut c = cache(8, 8);
    step(&mut c, 0, 2);
    CacheLayout::spec_begin(&mut c).unwrap();
    step(&mut c, 2, 3);
    CacheLayout::spec_commit(&mut c).unwrap();
    assert_eq!(offset(&c), 5);
    let e = err(CacheLayout::spec_rollback(&mut c, RSlice::from_slice(&[0])));
    assert_eq!(e.code, ErrorCode::INVALID_INPUT);
}

#[test]
fn state_round_trips_at_every_phase_of_the_ring() {
    // Snapshots: empty, growing, just full, wrapped, after a long concat.
    for prefix in [&[][..], &[3, 1], &[7, 1], &[4, 1, 1, 1, 1, 1, 1, 1, 1, 1], &[20], &[20, 1, 1], &[3, 1, 1, 4]] {
        let mut a = cache(8, 8);
        let mut t = 0;
        for &l in prefix {
            step(&mut a, t, l);
            t += l;
        }
        let st = CacheLayout::export_state(&a).unwrap();
        assert_eq!(st.offset as usize, t);
        let mut b = cache(8, 8);
        CacheLayout::import_state(&mut b, st).unwrap();
        assert_eq!((offset(&b), b.ring.idx), (offset(&a), a.ring.idx));
        assert_eq!(storage(&a), storage(&b));
        same_future(&mut a, &mut b, t, FUTURE);
    }
}

#[test]
fn state_of_another_geometry_is_refused() {
    let mut a = cache(8, 8);
    step(&mut a, 0, 3);
    let st = CacheLayout::export_state(&a).unwrap();
    assert_eq!(st.signature.as_str(), "kv:rotating:w8:float32:h1:k1:v1");
    let mut b = cache(16, 16);
    assert_eq!(err(CacheLayout::import_state(&mut b, st)).code, ErrorCode::INVALID_INPUT);
    let mut bad = CacheLayout::export_state(&a).unwrap();
    bad.meta = RVec::from(vec![3u64, 2, 8, 0]);
    assert_eq!(err(CacheLayout::import_state(&mut cache(8, 8), bad)).code, ErrorCode::INVALID_INPUT);
}

/// A serial cache is its one row; rows merge into batch caches (batch_tests.rs).
#[test]
fn a_serial_cache_is_its_one_row_and_has_no_slots() {
    let mut c = cache(8, 8);
    step(&mut c, 0, 3);
    assert_eq!(CacheLayout::rows(&c), 1);
    CacheLayout::filter_rows(&mut c, RSlice::from_slice(&[0])).unwrap();
    assert_eq!(err(CacheLayout::filter_rows(&mut c, RSlice::from_slice(&[1]))).code, ErrorCode::INVALID_INPUT);
    assert_eq!(CacheLayout::extract_row(&c, 0).unwrap().offset, 3);
    assert_eq!(err(CacheLayout::extract_row(&c, 1)).code, ErrorCode::INVALID_INPUT);
    assert_eq!(err(CacheLayout::merge_rows(&mut c, RVec::new())).code, ErrorCode::UNSUPPORTED);
    assert_eq!(err(CacheLayout::get_slot(&c, 0)).code, ErrorCode::UNSUPPORTED);
    let m = manifest();
    assert!(m.capabilities.iter().any(|c| c.as_str() == caps::ROWS));
    assert_eq!(m.claims.cache_needs.iter().map(|s| s.as_str()).collect::<Vec<_>>(), ["sliding"]);
}

#[test]
fn new_cache_serves_sliding_layers_plain_and_affine() {
    let need = |kind, window| LayerNeed {
        kind,
        window,
        kv_heads: 2,
        k_head_dim: 16,
        v_head_dim: 16,
        state_shapes: RVec::new(),
    };
    let spec = |need, scheme: &str, rows| CacheSpec {
        need,
        scheme: scheme.into(),
        dtype: plugin_api::Dtype::BFLOAT16,
        rows,
        step: 256,
    };
    let c = new_cache(&spec(need(NeedKind::SLIDING, 8), "plain", 1)).unwrap();
    assert_eq!(c.signature().as_str(), "kv:rotating:w8:bfloat16:h2:k16:v16");
    assert_eq!(c.bytes_per_token(), 2 * 32 * 2);
    // Other row counts get the batched ring, with the same signature.
    for rows in [0, 2] {
        let b = new_cache(&spec(need(NeedKind::SLIDING, 8), "plain", rows)).unwrap();
        assert_eq!((b.rows(), b.signature().as_str()), (rows, "kv:rotating:w8:bfloat16:h2:k16:v16"));
    }
    for bad in [spec(need(NeedKind::FULL, 0), "plain", 1), spec(need(NeedKind::SLIDING, 8), "affine5", 1)] {
        assert_eq!(new_cache(&bad).err().unwrap().code, ErrorCode::UNSUPPORTED);
    }
    // Affine codes: head rows of 16 are no whole number of 64-groups; of 32-groups neither.
    let e = new_cache(&spec(need(NeedKind::SLIDING, 8), "affine4", 1)).err().unwrap();
    assert_eq!(e.code, ErrorCode::INVALID_INPUT, "{e}");
    let mut wide = need(NeedKind::SLIDING, 8);
    (wide.k_head_dim, wide.v_head_dim) = (64, 64);
    let q = new_cache(&spec(wide, "affine4:group=32", 1)).unwrap();
    assert_eq!(q.signature().as_str(), "kv:affine4:g32:kv:rotating:w8:bfloat16:h2:k64:v64");
    // 64 values: 8 uint32 words (16 uint16) and 2 scales, 2 biases, per K and V.
    assert_eq!(q.bytes_per_token(), 2 * 2 * 20 * 2);
    assert_eq!(new_cache(&spec(need(NeedKind::SLIDING, 0), "plain", 1)).err().unwrap().code, ErrorCode::INVALID_INPUT);
}

#[test]
fn a_wrong_shape_is_refused_without_changing_the_cache() {
    let mut c = cache(8, 8);
    step(&mut c, 0, 2);
    let k = into_tensor(Array::from_slice(&[1.0f32, 2.0], &[1, 2, 1, 1]));
    let v = into_tensor(Array::from_slice(&[1.0f32, 2.0], &[1, 2, 1, 1]));
    assert_eq!(err(CacheLayout::update_and_fetch(&mut c, k, v)).code, ErrorCode::INVALID_INPUT);
    assert_eq!(offset(&c), 2);
}
