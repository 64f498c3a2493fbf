//! The codec against `mx.quantize` itself, the attention against plain
//! attention over the dequantized K/V, and the scheme's spelling.

use crate::*;
use crate::{lloyd_max, rotation};
use model_kit::{Array, Dtype};
use plugin_sdk::mlx_rs;

fn random(shape: &[i32], seed: u64) -> Array {
    mlx_rs::random::seed(seed).unwrap();
    mlx_rs::random::normal::<f32>(shape, None, None, None).unwrap()
}

fn bits_of(a: &Array) -> Vec<u32> {
    let a = a.as_dtype(Dtype::Float32).unwrap().flatten(None, None).unwrap();
    a.eval().unwrap();
    a.as_slice::<f32>().iter().map(|x| x.to_bits()).collect()
}

fn words(a: &Array) -> Vec<u32> {
    let a = a.flatten(None, None).unwrap();
    a.eval().unwrap();
    a.as_slice::<u32>().to_vec()
}

#[test]
fn codes_round_trip_bit_for_bit_in_f32_and_bf16() {
    for dtype in [Dtype::Float32, Dtype::Bfloat16] {
        for (bits, group) in [(8, 64), (4, 64), (4, 32)] {
            let codec = Affine::new(bits, group).unwrap();
            let x = random(&[2, 3, 5, 64], 7).as_dtype(dtype).unwrap();
            let want = codec.quantize(&x).unwrap();
            let rows = codec.encode(&x).unwrap();
            assert_eq!(rows.dtype(), Affine::storage(dtype).unwrap());
            assert_eq!(*rows.shape().last().unwrap(), codec.width(64, dtype).unwrap());
            // Columns moved as a layout moves them (a strided slice of the
            // token axis), then decoded.
            let moved = model_kit::ops::slice(&rows, &[0, 0, 1, 0], &[2, 3, 4, rows.shape()[3]]).unwrap();
            let got = codec.decode(&moved, 64, dtype).unwrap();
            let cut = |a: &Array| model_kit::ops::slice(a, &[0, 0, 1, 0], &[2, 3, 4, a.shape()[3]]).unwrap();
            assert_eq!(words(&got.words), words(&cut(&want.words)), "{dtype:?} {bits}/{group} words");
            assert_eq!(bits_of(&got.scales), bits_of(&cut(&want.scales)), "{dtype:?} scales");
            assert_eq!(bits_of(&got.biases), bits_of(&cut(&want.biases)), "{dtype:?} biases");
            assert_eq!(got.scales.dtype(), dtype);
        }
    }
}

#[test]
fn widths_count_words_scales_and_biases() {
    let c8 = Affine::new(8, 64).unwrap();
    // 64 values at 8 bits = 16 uint32 words (32 uint16), 1 scale, 1 bias.
    assert_eq!(c8.width(64, Dtype::Float32).unwrap(), 18);
    assert_eq!(c8.width(64, Dtype::Bfloat16).unwrap(), 34);
    let c4 = Affine::new(4, 64).unwrap();
    assert_eq!(c4.width(128, Dtype::Bfloat16).unwrap(), 2 * 16 + 4);
    // Bytes of a token against bf16 K/V: 8-bit 68/128, 4-bit 36/128.
    let plain = Widths { k: 64, v: 64, dtype: Dtype::Bfloat16 };
    let ratio = |c: Affine| c.packed(plain).unwrap().token_bytes() as f64 / plain.token_bytes() as f64;
    assert!((ratio(c8) - 0.53125).abs() < 1e-9);
    assert!((ratio(c4) - 0.28125).abs() < 1e-9);
    assert!(c8.width(16, Dtype::Float32).is_err(), "16 is no whole number of 64-groups");
    assert!(Affine::new(3, 64).is_err() && Affine::new(8, 48).is_err());
}

/// softmax(scale q kᵀ + mask) v over the dequantized keys and values.
fn reference(q: &Array, k: &Codes, v: &Codes, scale: f32, mask: Option<&Array>, codec: Affine) -> Array {
    let deq = |c: &Codes| mlx_rs::ops::dequantize(&c.words, &c.scales, &c.biases, codec.group, codec.bits).unwrap();
    let (kd, vd) = (deq(k), deq(v));
    let reps = q.shape()[1] / kd.shape()[1];
    let rep = |a: Array| if reps > 1 { mlx_rs::ops::repeat_axis::<f32>(a, reps, 1).unwrap() } else { a };
    let (kd, vd) = (rep(kd), rep(vd));
    let mut s = q.matmul(kd.transpose_axes(&[0, 1, 3, 2]).unwrap()).unwrap().multiply(Array::from_f32(scale)).unwrap();
    if let Some(m) = mask {
        s = mlx_rs::ops::select(m, &s, Array::from_f32(-1e30)).unwrap();
    }
    mlx_rs::ops::softmax_axes(&s, &[-1], true).unwrap().matmul(&vd).unwrap()
}

/// How far float32 results built on matmuls may part from their
/// reference: `cpu` on the CPU; on a GPU MLX runs float32 matmuls in TF32
/// (10-bit mantissas; `MLX_ENABLE_TF32`, on by default), and these tests
/// passed there at `cpu` only with it off.
fn matmul_tolerance(cpu: f32) -> f32 {
    if model_kit::ops::on_gpu() {
        cpu.max(2e-3)
    } else {
        cpu
    }
}

fn max_diff(a: &Array, b: &Array) -> f32 {
    let d = a.subtract(b).unwrap().abs().unwrap().max(None).unwrap();
    d.eval().unwrap();
    d.as_slice::<f32>()[0]
}

#[test]
fn quantized_attention_equals_attention_over_the_dequantized_kv() {
    let codec = Affine::new(8, 64).unwrap();
    // 4 query heads over 2 K/V heads, 3 queries over 7 keys, two rows.
    let q = random(&[2, 4, 3, 64], 1);
    let (k, v) =
        (codec.quantize(&random(&[2, 2, 7, 64], 2)).unwrap(), codec.quantize(&random(&[2, 2, 7, 64], 3)).unwrap());
    let scale = 0.125;
    let causal: Vec<bool> = (0..3).flat_map(|i| (0..7).map(move |j| j <= 4 + i)).collect();
    let causal = Array::from_slice(&causal, &[3, 7]);
    // A per-row boolean mask [B, 1, L, K]: row 1 hides its first 2 keys.
    let m: Vec<bool> =
        (0..2).flat_map(|r| (0..3).flat_map(move |i| (0..7).map(move |j| j <= 4 + i && (r == 0 || j >= 2)))).collect();
    let m = Array::from_slice(&m, &[2, 1, 3, 7]);
    // The GPU's route (dequantized codes, fused attention) is the same
    // attention.
    // So is the codec's, from the code rows a layout stores (on the GPU the
    // rows dequantized in place by our kernel).
    let rows = |seed| codec.encode(&random(&[2, 2, 7, 64], seed)).unwrap();
    let (kr, vr) = (rows(2), rows(3));
    let plain = Widths { k: 64, v: 64, dtype: Dtype::Float32 };
    for (mask, want) in [(QMask::Causal, Some(&causal)), (QMask::Array(m.clone()), Some(&m)), (QMask::None, None)] {
        let want = reference(&q, &k, &v, scale, want, codec);
        let got = dequantized_sdpa(&q, &k, &v, scale, &mask, codec).unwrap();
        let d = max_diff(&got, &want);
        assert!(d < matmul_tolerance(1e-4), "dequantized route: {d}");
        let got = KvCodec::Affine(codec).attend_by(Route::Dequantized, &q, &kr, &vr, plain, scale, &mask).unwrap();
        let d = max_diff(&got, &want);
        assert!(d < matmul_tolerance(1e-4), "the codec's dequantized route: {d}");
    }
    if model_kit::ops::on_gpu() {
        // MLX's CUDA backend has no quantized matmul for these operands:
        // the route is the CPU's only (`Route::for_device`).
        assert!(quantized_sdpa(&q, &k, &v, scale, &QMask::None, codec).and_then(|o| o.eval()).is_err());
        return;
    }
    let got = quantized_sdpa(&q, &k, &v, scale, &QMask::Causal, codec).unwrap();
    assert!(max_diff(&got, &reference(&q, &k, &v, scale, Some(&causal), codec)) < 1e-4);
    let got = quantized_sdpa(&q, &k, &v, scale, &QMask::Array(m.clone()), codec).unwrap();
    let want = reference(&q, &k, &v, scale, Some(&m), codec);
    assert!(max_diff(&got, &want) < 1e-4);
    let got = quantized_sdpa(&q, &k, &v, scale, &QMask::None, codec).unwrap();
    assert!(max_diff(&got, &reference(&q, &k, &v, scale, None, codec)) < 1e-4);
    assert_eq!(got.shape(), &[2, 4, 3, 64]);
}

#[test]
fn schemes_read_as_spelled() {
    assert_eq!(Scheme::parse("plain").unwrap(), None);
    let s = Scheme::parse("affine4").unwrap().unwrap();
    assert_eq!((s.codec.tag(), s.start), ("affine4:g64".to_owned(), 0));
    let s = Scheme::parse("affine8:group=32,start=100").unwrap().unwrap();
    assert_eq!((s.codec.tag(), s.start), ("affine8:g32".to_owned(), 100));
    let s = Scheme::parse("turbo").unwrap().unwrap();
    assert_eq!(s.codec.tag(), "turbo:k8v3:g64");
    let s = Scheme::parse("turbo:k=4,v=2,group=32,start=7").unwrap().unwrap();
    assert_eq!((s.codec.tag(), s.start), ("turbo:k4v2:g32".to_owned(), 7));
    for bad in [
        "affine5",
        "affine8:group=48",
        "affine8:start=x",
        "affine8:size=1",
        "affine8:group",
        "affine8:k=4",
        "turbo:k=7",
        "turbo:v=6",
        "turbo:v=1",
    ] {
        assert!(Scheme::parse(bad).is_err(), "{bad}");
    }
}

#[test]
fn lloyd_max_levels_and_distortions_are_max_1960s() {
    let close = |a: f64, b: f64, tol: f64| (a - b).abs() <= tol;
    let l1 = lloyd_max::levels(1);
    assert!(close(l1[1], (2.0 / std::f64::consts::PI).sqrt(), 1e-6), "{l1:?}");
    let l2 = lloyd_max::levels(2);
    assert!(close(l2[2], 0.4528, 1e-4) && close(l2[3], 1.5104, 1e-4), "{l2:?}");
    let l3 = lloyd_max::levels(3);
    for (got, want) in l3[4..].iter().zip([0.2451, 0.7560, 1.3440, 2.1520]) {
        assert!(close(*got, want, 1e-4), "{l3:?}");
    }
    // Max's (1960) table of mean squared errors; 5 bits: below 4 bits' / 3.5.
    for (bits, want) in [(1, 0.3634), (2, 0.1175), (3, 0.03454), (4, 0.009497)] {
        let lv = lloyd_max::levels(bits);
        assert_eq!(lv.len(), 1 << bits);
        assert!(lv.windows(2).all(|w| w[0] < w[1]) && close(lv[0], -lv[lv.len() - 1], 1e-6));
        let d = lloyd_max::distortion(&lv);
        assert!((d - want).abs() / want < 2e-3, "{bits} bits: distortion {d}, Max's table {want}");
    }
    let d5 = lloyd_max::distortion(&lloyd_max::levels(5));
    assert!(d5 > 0.002 && d5 < 0.009497 / 3.5, "5 bits: {d5}");
}

fn matrix(v: Vec<f32>, d: i32) -> Array {
    Array::from_slice(&v, &[d, d])
}

#[test]
fn the_randomized_hadamard_rotation_is_orthogonal_and_invertible() {
    for d in [64, 128] {
        let r = matrix(rotation::randomized_hadamard(d as usize, 7).unwrap(), d);
        let eye = mlx_rs::ops::eye::<f32>(d, None, None).unwrap();
        let eye_diff = max_diff(&r.matmul(r.transpose().unwrap()).unwrap(), &eye);
        assert!(eye_diff < matmul_tolerance(1e-6), "R Rᵀ = I, d = {d}: {eye_diff}");
        let x = random(&[5, d], 3);
        let back = x.matmul(r.transpose().unwrap()).unwrap().matmul(&r).unwrap();
        assert!(max_diff(&back, &x) < matmul_tolerance(1e-5), "rotating back gives the rows again");
        // The signs are random: not the plain Hadamard matrix, and fixed by the seed.
        assert_ne!(rotation::randomized_hadamard(d as usize, 7), rotation::randomized_hadamard(d as usize, 8));
        assert_eq!(rotation::randomized_hadamard(d as usize, 7), rotation::randomized_hadamard(d as usize, 7));
    }
    assert!(rotation::randomized_hadamard(48, 7).is_none(), "no Hadamard matrix of order 48 here");
}

/// What `Turbo` keeps of rows `v`: decoded, rotated back.
fn round_trip(t: &Turbo, v: &Array) -> Array {
    let d = *v.shape().last().unwrap();
    let codes = t.encode_values(v).unwrap();
    let rot = t.decode_values(&codes, d, v.dtype()).unwrap();
    let r = matrix(rotation::randomized_hadamard(d as usize, 0x7475_7262_6f71_7561).unwrap(), d);
    rot.matmul(&r).unwrap()
}

#[test]
fn turbo_values_round_trip_within_the_lloyd_max_distortion() {
    let v = random(&[2, 2, 1024, 64], 11);
    let energy = v.square().unwrap().sum(None).unwrap();
    for bits in 2..=5u32 {
        let t = Turbo::new(8, bits, 64).unwrap();
        let err = round_trip(&t, &v).subtract(&v).unwrap().square().unwrap().sum(None).unwrap();
        let rel = err.divide(&energy).unwrap();
        rel.eval().unwrap();
        let rel = rel.as_slice::<f32>()[0] as f64;
        let want = lloyd_max::distortion(&lloyd_max::levels(bits));
        // A coordinate of a rotated row scaled to norm sqrt(d) is nearly
        // N(0, 1); its tails are lighter, so the error is at most Max's.
        assert!(rel <= want * 1.05 && rel >= want * 0.8, "{bits} bits: relative error {rel}, Lloyd-Max {want}");
    }
    // A zero row (padding) decodes to zeros.
    let t = Turbo::new(8, 3, 64).unwrap();
    let zero = model_kit::ops::zeros(&[1, 1, 1, 64], Dtype::Float32).unwrap();
    assert_eq!(max_diff(&round_trip(&t, &zero), &zero), 0.0);
    // bf16 rows: the norm stays float32 beside the indices.
    let vb = v.as_dtype(Dtype::Bfloat16).unwrap();
    let codes = t.encode_values(&vb).unwrap();
    assert_eq!((codes.dtype(), *codes.shape().last().unwrap()), (Dtype::Uint16, 2 * 7 + 2));
    let back = round_trip(&t, &vb);
    let rel = back.subtract(vb.as_dtype(Dtype::Float32).unwrap()).unwrap().square().unwrap().sum(None).unwrap();
    let rel = rel.divide(&energy).unwrap();
    rel.eval().unwrap();
    assert!((rel.as_slice::<f32>()[0] as f64) < 0.036);
}

#[test]
fn turbo_attention_equals_attention_over_the_decoded_values() {
    let t = Turbo::new(8, 3, 64).unwrap();
    let plain = Widths { k: 64, v: 64, dtype: Dtype::Float32 };
    let q = random(&[2, 4, 3, 64], 1);
    let (kx, vx) = (random(&[2, 2, 7, 64], 2), random(&[2, 2, 7, 64], 3));
    let k = t.keys.quantize(&kx).unwrap();
    let vc = t.encode_values(&vx).unwrap();
    let scale = 0.125;
    let got =
        KvCodec::Turbo(t.clone()).attend(&q, &t.keys.encode(&kx).unwrap(), &vc, plain, scale, &QMask::None).unwrap();
    // The reference: dequantized keys, values decoded and rotated back.
    let v_back = round_trip(&t, &vx);
    let deq = |c: &Codes| mlx_rs::ops::dequantize(&c.words, &c.scales, &c.biases, 64, 8).unwrap();
    let rep = |a: Array| mlx_rs::ops::repeat_axis::<f32>(a, 2, 1).unwrap();
    let (kd, vd) = (rep(deq(&k)), rep(v_back));
    let s = q.matmul(kd.transpose_axes(&[0, 1, 3, 2]).unwrap()).unwrap().multiply(Array::from_f32(scale)).unwrap();
    let want = mlx_rs::ops::softmax_axes(&s, &[-1], true).unwrap().matmul(&vd).unwrap();
    assert!(max_diff(&got, &want) < matmul_tolerance(1e-4), "{}", max_diff(&got, &want));
    let (kc, route) = (t.keys.encode(&kx).unwrap(), Route::Dequantized);
    let got = KvCodec::Turbo(t.clone()).attend_by(route, &q, &kc, &vc, plain, scale, &QMask::None).unwrap();
    let d = max_diff(&got, &want);
    assert!(d < matmul_tolerance(1e-4), "dequantized route: {d}");
    // Widths: 8-bit keys as the affine scheme's, 3-bit values in 7 words and a norm.
    let w = KvCodec::Turbo(t).packed(Widths { dtype: Dtype::Bfloat16, ..plain }).unwrap();
    assert_eq!((w.k, w.v, w.dtype), (34, 16, Dtype::Uint16));
    assert_eq!(w.token_bytes(), 100, "of bf16's 256");
}

/// On the GPU, stored code rows dequantized in place by our kernel are
/// `mx.dequantize` of the same codes bit for bit; elsewhere the kernel does
/// not apply (None), and the attention takes the rows apart instead.
#[test]
fn code_rows_dequantize_in_place_as_mlx_dequantizes_them() {
    let gpu = model_kit::ops::on_gpu();
    for dtype in [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32] {
        for (bits, group, dim) in [(8, 64, 128), (4, 64, 128), (4, 32, 64), (8, 128, 128)] {
            let codec = Affine::new(bits, group).unwrap();
            let rows = codec.encode(&random(&[2, 3, 9, dim], 5).as_dtype(dtype).unwrap()).unwrap();
            // A window of the token axis, as a layout hands its storage out.
            let w = rows.shape()[3];
            let window = model_kit::ops::slice(&rows, &[0, 0, 2, 0], &[2, 3, 8, w]).unwrap();
            let got = crate::dequantize_rows::dequantize_rows(&window, dim, dtype, codec).unwrap();
            let Some(got) = got else {
                assert!(!gpu, "{dtype:?} {bits}/{group}: the kernel applies on the GPU");
                continue;
            };
            let c = codec.decode(&window, dim, dtype).unwrap();
            let want = mlx_rs::ops::dequantize(&c.words, &c.scales, &c.biases, group, bits).unwrap();
            assert_eq!((got.shape(), got.dtype()), (want.shape(), dtype));
            assert_eq!(bits_of(&got), bits_of(&want), "{dtype:?} {bits}/{group} d {dim}");
        }
    }
}

/// On the GPU, one query per row over stored code rows of 16-bit values
/// (the decode kernel, which reads the codes in place) is the attention
/// over the dequantized K/V, with and without a mask of left-padded rows,
/// over a window of the token axis; float32 rows, and every row off the
/// GPU, are not the kernel's (None: the caller dequantizes).
#[test]
fn codes_decode_attention_equals_attention_over_the_dequantized_kv() {
    let gpu = model_kit::ops::on_gpu();
    // Keys: one slice ending in a partial tile of 16 (77), and several
    // slices (1000).
    for (bits, group, dim, keys) in [(8, 64, 128, 1000), (4, 64, 128, 1000), (4, 32, 64, 77), (8, 128, 128, 300)] {
        let codec = Affine::new(bits, group).unwrap();
        for dtype in [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32] {
            let window = |seed| {
                let rows = codec.encode(&random(&[2, 2, keys + 2, dim], seed).as_dtype(dtype).unwrap()).unwrap();
                let w = rows.shape()[3];
                model_kit::ops::slice(&rows, &[0, 0, 2, 0], &[2, 2, keys + 2, w]).unwrap()
            };
            let (kr, vr) = (window(11), window(12));
            let q = random(&[2, 8, 1, dim], 13).as_dtype(dtype).unwrap();
            // Row 1 starts a third of the keys in.
            let m: Vec<bool> = (0..2).flat_map(|r| (0..keys).map(move |j| r == 0 || j >= keys / 3)).collect();
            let m = Array::from_slice(&m, &[2, 1, 1, keys]);
            let plain = Widths { k: dim, v: dim, dtype };
            let scale = 1.0 / (dim as f32).sqrt();
            for (mask, keep) in [(QMask::None, None), (QMask::Array(m.clone()), Some(&m))] {
                let got = crate::codes_attention::decode_attention(&q, &kr, &vr, plain, scale, &mask, codec).unwrap();
                let served = gpu && dtype != Dtype::Float32;
                assert_eq!(got.is_some(), served, "{dtype:?} {bits}/{group} d {dim}: the kernel's, or not");
                let Some(got) = got else { continue };
                let (k, v) = (codec.decode(&kr, dim, dtype).unwrap(), codec.decode(&vr, dim, dtype).unwrap());
                let want = reference(&q.as_dtype(Dtype::Float32).unwrap(), &k, &v, scale, keep, codec);
                assert_eq!((got.shape(), got.dtype()), (&[2, 8, 1, dim][..], dtype));
                let tolerance = 8e-3;
                let d = max_diff(&got.as_dtype(Dtype::Float32).unwrap(), &want);
                assert!(d < tolerance, "{dtype:?} {bits}/{group} d {dim}, {keys} keys, mask {}: {d}", keep.is_some());
            }
        }
    }
}

/// The codes kernel serves head dims whose value dimensions split into
/// whole words per lane inside one group; others (96, 80, 192) go to the
/// dequantized route instead of a layout the kernel cannot read.
#[test]
fn the_codes_kernel_takes_only_head_dims_its_lanes_split_evenly() {
    use crate::codes_attention::head_dim_fits;
    let (a4, a8) = (Affine::new(4, 64).unwrap(), Affine::new(8, 64).unwrap());
    for d in [64, 128, 256] {
        assert!(head_dim_fits(d, a4) && head_dim_fits(d, a8), "d {d}");
    }
    for d in [0, 48, 80, 96, 192] {
        assert!(!head_dim_fits(d, a4) && !head_dim_fits(d, a8), "d {d}");
    }
    assert!(head_dim_fits(32, a8) && !head_dim_fits(32, a4), "d 32: a 4-bit lane would hold half a word");
    assert!(head_dim_fits(256, Affine::new(4, 32).unwrap()));
    assert!(!head_dim_fits(512, Affine::new(4, 32).unwrap()), "a lane's 64 dimensions span two groups of 32");
}
