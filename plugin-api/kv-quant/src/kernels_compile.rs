//! kv-quant's CUDA kernels compile for the H200 (`model_kit::kernel_check`)
//! at the launches its routes make: code rows of 4 and 8 bits, groups of
//! 32 to 128, head dims 64 to 256, 1 to 8 query heads per K/V head, 16-bit
//! values with and without a mask, and rows dequantized in place.

use crate::codec::Affine;
use crate::codes_attention::decode_attention;
use crate::dequantize_rows::dequantize_rows;
use crate::{QMask, Widths};
use model_kit::cuda_capture::launches;
use model_kit::kernel_check::{assert_compiles, kernels};
use model_kit::ops::zeros;
use model_kit::{Array, Dtype, Result};

fn code_rows(codec: Affine, rows: i32, heads: i32, keys: i32, d: i32, dtype: Dtype) -> Result<Array> {
    zeros(&[rows, heads, keys, codec.width(d, dtype)?], Affine::storage(dtype)?)
}

#[test]
fn the_codes_kernels_compile_for_the_h200() {
    let recorded = launches(|| -> Result<()> {
        // (bits, group, head dim, query heads, K/V heads): Qwen3-8B at both
        // widths, SmolLM2, one query head per K/V head, Gemma's 256.
        let shapes =
            [(4, 64, 128, 32, 8), (8, 64, 128, 32, 8), (4, 32, 64, 9, 3), (8, 128, 128, 8, 8), (4, 64, 256, 8, 4)];
        for (i, (bits, group, d, hq, hkv)) in shapes.into_iter().enumerate() {
            let codec = Affine::new(bits, group)?;
            for dtype in [Dtype::Bfloat16, Dtype::Float16] {
                let (rows, keys) = (2, 1000);
                let k = code_rows(codec, rows, hkv, keys, d, dtype)?;
                let q = zeros(&[rows, hq, 1, d], dtype)?;
                let plain = Widths { k: d, v: d, dtype };
                let mut masks = vec![QMask::None];
                if i == 0 {
                    masks.push(QMask::Array(zeros(&[rows, 1, 1, keys], Dtype::Bool)?));
                }
                for mask in masks {
                    let out = decode_attention(&q, &k, &k, plain, 0.088, &mask, codec)?;
                    assert!(out.is_some(), "{bits}/{group} d {d} {dtype:?}: the kernel takes it");
                }
            }
        }
        for dtype in [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32] {
            for (bits, group) in [(4, 64), (8, 64)] {
                let codec = Affine::new(bits, group)?;
                let rows = code_rows(codec, 2, 8, 300, 128, dtype)?;
                assert!(dequantize_rows(&rows, 128, dtype, codec)?.is_some(), "{bits}/{group} {dtype:?}");
            }
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(
        kernels(&recorded),
        ["kv_codes_decode_attention", "decode_attention_merge_slices", "kv_codes_dequantize_rows"]
    );
    assert_compiles(&recorded);
}
