//! kv-plain in the affine schemes (`kv_quant::Quantized` around this
//! layout): when the K/V switch to codes, what a token costs (measured from
//! the stored tensors), states that keep their scheme, rows and rounds.

use super::*;
use plugin_api::abi_stable::std_types::RResult;
use plugin_sdk::mlx_rs::Dtype as MlxDtype;

const HEADS: u32 = 2;
const DIM: u32 = 64;

fn cache(scheme: &str, dtype: plugin_api::Dtype, rows: u32) -> CacheBox {
    let spec = CacheSpec {
        need: LayerNeed {
            kind: NeedKind::FULL,
            window: 0,
            kv_heads: HEADS,
            k_head_dim: DIM,
            v_head_dim: DIM,
            state_shapes: RVec::new(),
        },
        scheme: scheme.into(),
        dtype,
        rows,
        step: 256,
    };
    new_cache(&spec).unwrap_or_else(|e| panic!("{scheme}: {e}"))
}

fn normal(shape: &[i32], seed: u64, dtype: MlxDtype) -> Array {
    mlx_rs::random::seed(seed).unwrap();
    mlx_rs::random::normal::<f32>(shape, None, None, None).unwrap().as_dtype(dtype).unwrap()
}

/// One layer step as model-kit runs it: `attend`, or (declined) the plain
/// update. Returns whether the layout attended itself.
fn step(c: &mut CacheBox, rows: i32, n: i32, seed: u64, dtype: MlxDtype) -> bool {
    let q = normal(&[rows, 4, n, DIM as i32], seed, dtype);
    let k = normal(&[rows, HEADS as i32, n, DIM as i32], seed + 1, dtype);
    let v = normal(&[rows, HEADS as i32, n, DIM as i32], seed + 2, dtype);
    let mode = if n > 1 { MaskMode::CAUSAL } else { MaskMode::NONE };
    let mask = MaskRef { mode, array: ROption::RNone };
    match c.attend(plugin_sdk::lend(&q), plugin_sdk::lend(&k), plugin_sdk::lend(&v), 0.125, mask) {
        RResult::ROk(ROption::RSome(out)) => {
            let out = into_array(out);
            assert_eq!(out.shape(), &[rows, 4, n, DIM as i32]);
            true
        }
        RResult::ROk(ROption::RNone) => {
            c.update_and_fetch(into_tensor(k), into_tensor(v)).unwrap();
            false
        }
        RResult::RErr(e) => panic!("attend: {e}"),
    }
}

fn state_bytes(s: &CacheState) -> usize {
    s.tensors
        .iter()
        .map(|t| {
            let a = plugin_sdk::view(t.borrow());
            a.size() * a.item_size()
        })
        .sum()
}

#[test]
fn the_kv_switch_to_codes_after_the_first_call_that_holds_start_tokens() {
    // start 0 (the default): the first call (a prefill) attends plain K/V,
    // every later one attends codes.
    let mut c = cache("affine8", plugin_api::Dtype::FLOAT32, 1);
    assert!(!step(&mut c, 1, 5, 1, MlxDtype::Float32), "the first call attends plain K/V");
    assert!(step(&mut c, 1, 1, 2, MlxDtype::Float32), "later calls attend codes");
    assert!(c.signature().contains(":uint32:"), "{}", c.signature());
    // start 8: plain until a call leaves 8 tokens held.
    let mut c = cache("affine4:group=32,start=8", plugin_api::Dtype::FLOAT32, 1);
    assert!(!step(&mut c, 1, 5, 1, MlxDtype::Float32));
    assert!(!step(&mut c, 1, 1, 2, MlxDtype::Float32));
    assert!(!step(&mut c, 1, 2, 3, MlxDtype::Float32), "7 held before this call");
    assert!(step(&mut c, 1, 1, 4, MlxDtype::Float32), "9 held: codes from now on");
    // A graph that does not attend through the layout is refused once the
    // K/V are codes, with a message that says why.
    let k = normal(&[1, 2, 1, 64], 9, MlxDtype::Float32);
    let RResult::RErr(e) = c.update_and_fetch(into_tensor(k.clone()), into_tensor(k)) else {
        panic!("a plain update of coded K/V was accepted")
    };
    assert!(e.to_string().contains("layout-attention"), "{e}");
}

#[test]
fn a_token_costs_0_53_0_28_and_0_39_of_bf16_measured_from_the_stored_tensors() {
    let fill = |scheme: &str| {
        let mut c = cache(scheme, plugin_api::Dtype::BFLOAT16, 1);
        step(&mut c, 1, 40, 1, MlxDtype::Bfloat16);
        for i in 0..60 {
            step(&mut c, 1, 1, 10 + i, MlxDtype::Bfloat16);
        }
        assert_eq!(c.offset(), 100);
        let s = c.export_state().unwrap();
        (state_bytes(&s) as f64 / 100.0, c.bytes_per_token())
    };
    let (plain, plain_bpt) = fill("plain");
    assert_eq!(plain, (HEADS * DIM * 2 * 2) as f64, "bf16 K and V per token");
    assert_eq!(plain_bpt as f64, plain);
    // TurboQuant k8v3: 8-bit keys (68 bytes a head row), 3-bit values in 7
    // words and a float32 norm (32 bytes).
    for (scheme, ratio) in [("affine8", 68.0 / 128.0), ("affine4", 36.0 / 128.0), ("turbo", 100.0 / 256.0)] {
        let (q, bpt) = fill(scheme);
        assert_eq!(q / plain, ratio, "{scheme}: stored bytes per token against bf16");
        assert_eq!(bpt as f64, q, "{scheme}: bytes_per_token says what is stored");
    }
    // Before the switch, admission is told the cost of codes too.
    assert_eq!(cache("affine8", plugin_api::Dtype::BFLOAT16, 1).bytes_per_token() as f64, plain * 68.0 / 128.0);
}

#[test]
fn states_keep_their_scheme_and_whether_they_hold_codes() {
    let mut c = cache("affine8", plugin_api::Dtype::FLOAT32, 1);
    step(&mut c, 1, 6, 1, MlxDtype::Float32);
    let plain_state = c.export_state().unwrap();
    assert!(plain_state.signature.starts_with("kv:affine8:g64:kv:plain:float32"), "{}", plain_state.signature);
    step(&mut c, 1, 1, 2, MlxDtype::Float32);
    let coded = c.export_state().unwrap();
    assert!(coded.signature.starts_with("kv:affine8:g64:kv:plain:uint32"), "{}", coded.signature);
    // Into a fresh cache of the scheme: it holds codes and attends them.
    let mut d = cache("affine8", plugin_api::Dtype::FLOAT32, 1);
    d.import_state(c.export_state().unwrap()).unwrap();
    assert_eq!(d.offset(), 7);
    assert!(step(&mut d, 1, 1, 3, MlxDtype::Float32));
    // A plain-phase state imports as plain and switches at the next call.
    let mut e = cache("affine8", plugin_api::Dtype::FLOAT32, 1);
    e.import_state(plain_state).unwrap();
    assert!(step(&mut e, 1, 1, 2, MlxDtype::Float32), "6 held: the next call converts first");
    // Other schemes refuse it.
    for other in ["plain", "affine4", "affine8:group=32", "turbo"] {
        let mut x = cache(other, plugin_api::Dtype::FLOAT32, 1);
        assert!(x.import_state(c.export_state().unwrap()).is_err(), "{other} took an affine8/g64 state");
    }
}

#[test]
fn rows_join_as_codes_and_rounds_never_convert_midway() {
    // Row a holds codes, row b is still plain (start 4, 3 tokens).
    let mut a = cache("affine8:start=4", plugin_api::Dtype::FLOAT32, 1);
    step(&mut a, 1, 5, 1, MlxDtype::Float32);
    step(&mut a, 1, 1, 2, MlxDtype::Float32);
    let mut b = cache("affine8:start=4", plugin_api::Dtype::FLOAT32, 1);
    step(&mut b, 1, 3, 3, MlxDtype::Float32);
    let mut batch = cache("affine8:start=4", plugin_api::Dtype::FLOAT32, 0);
    batch.merge_rows(vec![a.extract_row(0).unwrap(), b.extract_row(0).unwrap()].into()).unwrap();
    assert_eq!(batch.rows(), 2);
    assert!(batch.signature().contains(":uint32:"), "a coded row converts the batch");
    // Row 1 comes back out as codes of its own 3 tokens.
    let r1 = batch.extract_row(1).unwrap();
    assert_eq!(r1.offset, 3);
    assert!(r1.signature.contains(":uint32:"));
    assert!(step(&mut batch, 2, 1, 4, MlxDtype::Float32));
    batch.filter_rows(RSlice::from_slice(&[1])).unwrap();
    assert_eq!(batch.offset(), 4);
    // A serial round that crosses the start stays plain until it ends.
    let mut c = cache("affine8:start=4", plugin_api::Dtype::FLOAT32, 1);
    step(&mut c, 1, 2, 5, MlxDtype::Float32);
    c.spec_begin().unwrap();
    assert!(!step(&mut c, 1, 4, 6, MlxDtype::Float32), "a verify inside the round stays plain");
    c.spec_rollback(RSlice::from_slice(&[1])).unwrap();
    assert_eq!(c.offset(), 3);
    assert!(!step(&mut c, 1, 1, 7, MlxDtype::Float32), "3 held after the rollback");
    assert!(step(&mut c, 1, 1, 8, MlxDtype::Float32), "4 held: codes");
    c.spec_begin().unwrap();
    assert!(step(&mut c, 1, 3, 9, MlxDtype::Float32));
    c.spec_rollback(RSlice::from_slice(&[2])).unwrap();
    assert_eq!(c.offset(), 7);
}

/// Overlapping rounds (`caps::SPEC_PIPELINE`): the switch to codes waits
/// until every open round is settled, and then comes at the next call.
#[test]
fn overlapping_rounds_convert_only_once_every_round_is_settled() {
    let mut c = cache("affine8:start=4", plugin_api::Dtype::FLOAT32, 1);
    step(&mut c, 1, 2, 10, MlxDtype::Float32);
    c.spec_begin().unwrap();
    assert!(!step(&mut c, 1, 3, 11, MlxDtype::Float32), "the older round's verify stays plain");
    c.spec_begin().unwrap();
    assert!(!step(&mut c, 1, 2, 12, MlxDtype::Float32), "a round opened inside another stays plain");
    c.spec_commit().unwrap();
    c.spec_begin().unwrap();
    assert!(!step(&mut c, 1, 2, 13, MlxDtype::Float32), "one round is still open: no switch");
    c.spec_rollback(RSlice::from_slice(&[1])).unwrap();
    assert_eq!(c.offset(), 6, "the oldest open round (from 5) kept 1 and the younger one went");
    assert!(step(&mut c, 1, 1, 14, MlxDtype::Float32), "every round settled: codes");
}
