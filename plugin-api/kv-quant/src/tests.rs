//! The codec against `mx.quantize` itself, the attention against plain
//! attention over the dequantized K/V, and the scheme's spelling.

use crate::*;
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
    let got = quantized_sdpa(&q, &k, &v, scale, &QMask::Causal, codec).unwrap();
    assert!(max_diff(&got, &reference(&q, &k, &v, scale, Some(&causal), codec)) < 1e-4);
    // A per-row boolean mask [B, 1, L, K]: row 1 hides its first 2 keys.
    let m: Vec<bool> =
        (0..2).flat_map(|r| (0..3).flat_map(move |i| (0..7).map(move |j| j <= 4 + i && (r == 0 || j >= 2)))).collect();
    let m = Array::from_slice(&m, &[2, 1, 3, 7]);
    let got = quantized_sdpa(&q, &k, &v, scale, &QMask::Array(m.clone()), codec).unwrap();
    let want = reference(&q, &k, &v, scale, Some(&m), codec);
    assert!(max_diff(&got, &want) < 1e-4);
    let got = quantized_sdpa(&q, &k, &v, scale, &QMask::None, codec).unwrap();
    assert!(max_diff(&got, &reference(&q, &k, &v, scale, None, codec)) < 1e-4);
    assert_eq!(got.shape(), &[2, 4, 3, 64]);
}

#[test]
fn schemes_read_as_spelled() {
    assert_eq!(AffineScheme::parse("plain").unwrap(), None);
    let s = AffineScheme::parse("affine4").unwrap().unwrap();
    assert_eq!((s.codec.bits, s.codec.group, s.start), (4, 64, 0));
    let s = AffineScheme::parse("affine8:group=32,start=100").unwrap().unwrap();
    assert_eq!((s.codec.bits, s.codec.group, s.start), (8, 32, 100));
    for bad in ["affine5", "affine8:group=48", "affine8:start=x", "affine8:size=1", "affine8:group"] {
        assert!(AffineScheme::parse(bad).is_err(), "{bad}");
    }
}
