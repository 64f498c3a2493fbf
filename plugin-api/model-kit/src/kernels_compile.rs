//! model-kit's CUDA kernels compile for the H200 (`kernel_check`) at the
//! launches the engine makes for real shapes: Qwen3-8B's (32 query heads
//! over 8 K/V heads of 128, hidden 4096, MLP 12288) and SmolLM2's (9 over 3
//! of 64), in each dtype the routes take.

use crate::cuda_capture::{launches, Launched};
use crate::gemv::{self, Fusion};
use crate::kernel_check::{assert_compiles, kernels};
use crate::layers::RmsNorm;
use crate::ops::zeros;
use crate::rope::{Position, Rope};
use crate::{decode_attention, kv_write, qk_norm_rope, Dtype, Result};

#[test]
fn the_decode_attention_kernels_compile_for_the_h200() {
    let recorded = launches(|| -> Result<()> {
        for dtype in [Dtype::Bfloat16, Dtype::Float16, Dtype::Float32] {
            for (b, hq, hkv, d, t) in [(1, 32, 8, 128, 4096), (16, 9, 3, 64, 700), (2, 8, 2, 96, 300)] {
                let q = zeros(&[b, hq, 1, d], dtype)?;
                let kv = zeros(&[b, hkv, t, d], dtype)?;
                let mask = zeros(&[b, 1, 1, t], Dtype::Bool)?;
                let out = decode_attention::masked(&q, &kv, &kv, 0.088, &mask)?;
                assert_eq!(out.expect("the kernel takes it").shape(), [b, hq, 1, d]);
            }
        }
        // One query at Qwen3.5's head size (256, where MLX has no fused
        // kernel): ours, unless the routes are MLX's.
        let q = zeros(&[1, 16, 1, 256], Dtype::Bfloat16)?;
        let kv = zeros(&[1, 4, 1000, 256], Dtype::Bfloat16)?;
        let out = decode_attention::unmasked(&q, &kv, &kv, 0.0625, false)?;
        assert_eq!(out.expect("the kernel takes it").shape(), [1, 16, 1, 256]);
        let mlx = crate::routes::Routes { decode_kernel: false, ..Default::default() };
        assert!(crate::routes::with(mlx, || decode_attention::unmasked(&q, &kv, &kv, 0.0625, false))?.is_none());
        // A 3-wide causal verify (two rows) in one launch, unless the
        // per-query route is off; 17 queries are past it.
        let q3 = zeros(&[2, 16, 3, 256], Dtype::Bfloat16)?;
        let kv2 = zeros(&[2, 4, 1000, 256], Dtype::Bfloat16)?;
        let out = crate::attention::sdpa(&q3, &kv2, &kv2, 0.0625, &crate::attention::Mask::Causal)?;
        assert_eq!(out.shape(), [2, 16, 3, 256]);
        let off = crate::routes::Routes { per_query_max: 0, ..Default::default() };
        assert!(crate::routes::with(off, || decode_attention::unmasked(&q3, &kv2, &kv2, 0.0625, true))?.is_none());
        let q17 = zeros(&[1, 16, 17, 256], Dtype::Bfloat16)?;
        assert!(decode_attention::unmasked(&q17, &kv, &kv, 0.0625, true)?.is_none());
        let (q128, kv128) = (zeros(&[1, 32, 1, 128], Dtype::Bfloat16)?, zeros(&[1, 8, 1000, 128], Dtype::Bfloat16)?);
        assert!(
            decode_attention::unmasked(&q128, &kv128, &kv128, 0.088, false)?.is_none(),
            "MLX's vector kernel takes 128"
        );
        let (rows, hkv, block, nb) = (4, 8, 16, 64);
        let q = zeros(&[rows, 32, 1, 128], Dtype::Bfloat16)?;
        let pool = zeros(&[hkv, 512 * block, 128], Dtype::Bfloat16)?;
        let flat = zeros(&[rows, hkv, nb], Dtype::Int32)?;
        let mask = zeros(&[rows, 1, 1, nb * block], Dtype::Bool)?;
        let out = decode_attention::paged(&q, &pool, &pool, &flat, block, 0.088, &mask)?;
        assert!(out.is_some(), "the paged kernel takes it");
        Ok(())
    })
    .unwrap();
    assert_eq!(
        kernels(&recorded),
        ["masked_decode_attention", "decode_attention_merge_slices", "decode_attention", "paged_decode_attention"]
    );
    let unmasked: Vec<_> = recorded.iter().filter(|l| l.kernel == "decode_attention").collect();
    assert_eq!(unmasked.len(), 2, "the single query, then the whole verify");
    assert_eq!(
        unmasked[1].grid[0],
        2 * 3 * 4 * decode_attention::splits(2, 4, 1000, decode_attention::TARGET_BLOCKS) * 256,
        "a block per (row, query, K/V head, slice)"
    );
    assert_compiles(&recorded);
}

#[test]
fn the_fused_decode_projections_compile_for_the_h200() {
    let (hidden, kv, mlp) = (4096, 1024, 12288);
    let recorded = launches(|| -> Result<()> {
        for m in [1, 4] {
            let x = zeros(&[m, 1, hidden], Dtype::Bfloat16)?;
            let g = zeros(&[hidden], Dtype::Bfloat16)?;
            let w = |n: i32, k: i32| zeros(&[n, k], Dtype::Bfloat16);
            let (wq, wk, wv) = (w(hidden, hidden)?, w(kv, hidden)?, w(kv, hidden)?);
            let norm = Some((&g, 1e-6));
            gemv::apply(Fusion::NormThen(3), &x, m, norm, &[&wq, &wk, &wv], None)?;
            gemv::apply(Fusion::NormThen(2), &x, m, norm, &[&wq, &wk], None)?;
            gemv::apply(Fusion::NormThen(1), &x, m, norm, &[&wq], None)?;
            let (gate, up) = (w(mlp, hidden)?, w(mlp, hidden)?);
            gemv::apply(Fusion::NormSwiGlu, &x, m, norm, &[&gate, &up], None)?;
            let (down, h) = (w(hidden, mlp)?, zeros(&[m, 1, mlp], Dtype::Bfloat16)?);
            gemv::apply(Fusion::ThenAdd, &h, m, None, &[&down], Some(&x))?;
            gemv::apply(Fusion::ThenAdd, &x, m, None, &[&wq], Some(&x))?;
            gemv::apply(Fusion::Plain, &x, m, None, &[&w(49152, hidden)?], None)?;
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(
        kernels(&recorded),
        ["gemv_norm_then_3", "gemv_norm_then_2", "gemv_norm_then_1", "gemv_norm_swiglu", "gemv_then_add", "gemv_plain"]
    );
    assert_compiles(&recorded);
}

#[test]
fn the_qk_norm_rope_kernels_compile_for_the_h200() {
    let llama3 = serde_json::json!({"rope_type": "llama3", "factor": 8.0});
    let recorded = launches(|| -> Result<()> {
        let norm = RmsNorm::new(zeros(&[128], Dtype::Bfloat16)?, 1e-6);
        for (scaling, pos) in
            [(None, Position::Offset(7)), (Some(&llama3), Position::PerRow(zeros(&[4], Dtype::Int32)?))]
        {
            let rope = Rope::new(128, 1_000_000.0, false, scaling)?;
            let (b, l) = if matches!(pos, Position::Offset(_)) { (1, 5) } else { (4, 1) };
            let q = zeros(&[b, l, 32 * 128], Dtype::Bfloat16)?;
            let k = zeros(&[b, l, 8 * 128], Dtype::Bfloat16)?;
            let out = qk_norm_rope::fused(&q, &k, (&norm, &norm), &rope, &pos, (32, 8))?;
            assert!(out.is_some(), "the fused route takes it");
        }
        Ok(())
    })
    .unwrap();
    assert_eq!(kernels(&recorded), ["qk_norm_rope", "qk_norm_rope_freqs"]);
    assert_compiles(&recorded);
}

#[test]
fn the_kv_write_kernels_compile_for_the_h200() {
    let recorded = launches(|| -> Result<()> {
        // A decode step's key (contiguous), value (a transposed view of the
        // projection) and queries, a prompt's 2048 columns, and codes of 1
        // and 4 bytes; each write after the one before it.
        let mut after = None;
        for (dtype, l) in [(Dtype::Bfloat16, 1), (Dtype::Bfloat16, 2048), (Dtype::Uint8, 1), (Dtype::Uint32, 3)] {
            let store = zeros(&[1, 8, 4096, 128], dtype)?;
            let k = zeros(&[1, 8, l, 128], dtype)?;
            let v = zeros(&[1, l, 8, 128], dtype)?.transpose_axes(&[0, 2, 1, 3])?;
            let q = zeros(&[1, l, 32, 128], dtype)?.transpose_axes(&[0, 2, 1, 3])?;
            let written = kv_write::write((&store, &store), (&k, &v, &q), 700, after.as_ref())?.expect("it applies");
            assert_eq!(written.queries.shape(), [1, 32, l, 128]);
            after = Some(written.done);
        }
        let (store, k) = (zeros(&[1, 8, 4096, 128], Dtype::Float32)?, zeros(&[1, 8, 1, 128], Dtype::Bfloat16)?);
        assert!(kv_write::write((&store, &store), (&k, &k, &k), 700, None)?.is_none(), "dtypes that differ");
        let k = zeros(&[1, 8, 2, 128], Dtype::Float32)?;
        assert!(kv_write::write((&store, &store), (&k, &k, &k), 4095, None)?.is_none(), "past the capacity");
        Ok(())
    })
    .unwrap();
    assert_eq!(kernels(&recorded), ["kv_write_2", "kv_write_1", "kv_write_4"]);
    let threads = |l: i32| (l * 8 * 128 * 2 + l * 32 * 128 + 255) / 256 * 256;
    assert_eq!(recorded[1].grid[0], threads(2048), "a thread per element of K, V and the queries");
    assert_compiles(&recorded);
}

#[test]
fn a_kernel_that_does_not_compile_fails_the_check_with_the_compilers_words() {
    let launched = crate::cuda_capture::Launched {
        kernel: "broken".into(),
        function: "custom_kernel_broken".into(),
        input_types: String::new(),
        source: crate::cuda_source::source(
            "custom_kernel_broken",
            "out[0] = undeclared;",
            &[],
            &[("out", Dtype::Float32)],
            &[],
        ),
        grid: [32, 1, 1],
        threads: [32, 1, 1],
    };
    let log = crate::kernel_check::compile(&launched).unwrap_err();
    assert!(log.contains("undeclared") && log.contains("error"), "{log}");
}

/// A launch whose blocks need more registers than an SM holds compiles,
/// but the device would refuse it: the check fails it too.
#[test]
fn a_launch_past_the_register_file_fails_the_check() {
    let mut recorded = launches(|| -> Result<()> {
        let x = zeros(&[4, 1, 4096], Dtype::Bfloat16)?;
        let (g, w) = (zeros(&[4096], Dtype::Bfloat16)?, zeros(&[4096, 4096], Dtype::Bfloat16)?);
        gemv::apply(Fusion::NormThen(3), &x, 4, Some((&g, 1e-6)), &[&w, &w, &w], None)?;
        Ok(())
    })
    .unwrap();
    let fits = crate::kernel_check::compile(&recorded[0]).expect("it compiles at its own block size");
    assert!(fits.registers * recorded[0].block_threads() <= 65536);
    let blocks = recorded[0].grid[0] / recorded[0].threads[0];
    recorded[0].threads = [1024, 1, 1];
    recorded[0].grid = [blocks * 1024, 1, 1];
    let refused = crate::kernel_check::compile(&recorded[0]).unwrap_err();
    assert!(refused.contains("registers") && refused.contains("65536"), "{refused}");
}

/// Launches the device would refuse, or run with fewer threads a block than
/// the kernel was written for, fail the check before any compiling.
#[test]
fn launch_shapes_the_device_refuses_fail_the_check() {
    let recorded = launches(|| -> Result<()> {
        let q = zeros(&[1, 32, 1, 128], Dtype::Bfloat16)?;
        let kv = zeros(&[1, 8, 300, 128], Dtype::Bfloat16)?;
        decode_attention::masked(&q, &kv, &kv, 0.088, &zeros(&[1, 1, 1, 300], Dtype::Bool)?)?;
        Ok(())
    })
    .unwrap();
    let good = recorded[0].clone();
    let with =
        |grid: [i32; 3], threads: [i32; 3]| crate::kernel_check::compile(&Launched { grid, threads, ..good.clone() });
    let cases = [
        ([2048, 1, 1], [2048, 1, 1], "threads a block"),
        ([64, 1, 128], [1, 1, 128], "threads a block"),
        ([128, 70000, 1], [128, 1, 1], "blocks"),
        ([64, 1, 1], [128, 1, 1], "fewer threads"),
    ];
    for (grid, threads, why) in cases {
        let err = with(grid, threads).unwrap_err();
        assert!(err.contains(why), "{grid:?} / {threads:?}: {err}");
    }
}

/// The short conv's kernels at Qwen3.5's 8B-scale DeltaNet (8192 channels,
/// a window of 3) for a decode step, a verify and a prompt, in bf16 and
/// float32.
#[test]
fn the_short_conv_kernels_compile_for_the_h200() {
    let (k, c) = (4, 8192);
    let recorded = launches(|| -> Result<()> {
        for dtype in [Dtype::Bfloat16, Dtype::Float32] {
            for (b, l) in [(1, 1), (2, 3), (1, 512)] {
                let stored = zeros(&[b, k - 1, c], dtype)?;
                let (window, state) = crate::conv_window::step(&stored, &zeros(&[b, l, c], dtype)?)?.expect("taken");
                assert_eq!((window.shape(), state.shape()), (&[b, k - 1 + l, c][..], &[b, k - 1, c][..]));
                let out = crate::depthwise_conv_kernel::conv(&window, &zeros(&[c, k], Dtype::Float32)?)?;
                assert_eq!(out.expect("taken").shape(), [b, l, c]);
            }
        }
        let short = zeros(&[1, k - 1, c], Dtype::Bfloat16)?;
        assert!(crate::depthwise_conv_kernel::conv(&short, &zeros(&[c, k], Dtype::Float32)?)?.is_none());
        Ok(())
    })
    .unwrap();
    assert_eq!(kernels(&recorded), ["conv_window", "depthwise_conv"]);
    assert_compiles(&recorded);
}

/// The same kernel at Qwen3.5's gated attention (16 query heads of 256,
/// each the first half of a query-and-gate head, over 2 K/V heads; the
/// rotation over the first 64 dims) for a decode step and a verify.
#[test]
fn the_partial_qk_norm_rope_kernel_compiles_for_the_h200() {
    let recorded = launches(|| -> Result<()> {
        let norm = RmsNorm::new(zeros(&[256], Dtype::Bfloat16)?, 1e-6);
        let rope = Rope::new(64, 10_000_000.0, false, None)?;
        for l in [1, 3] {
            let qg = zeros(&[1, l, 16, 512], Dtype::Bfloat16)?.split_equal(2, -1)?;
            let k = zeros(&[1, l, 2, 256], Dtype::Bfloat16)?;
            let out = qk_norm_rope::fused_heads(&qg[0], &k, (&norm, &norm), &rope, &Position::Offset(9))?;
            let (q, k) = out.expect("the fused route takes it");
            assert_eq!((q.shape(), k.shape()), (&[1, 16, l, 256][..], &[1, 2, l, 256][..]));
        }
        // The benchmarks' 8B-scale hybrid: heads of 128, 32 dims rotated.
        let (norm128, rope32) = (RmsNorm::new(zeros(&[128], Dtype::Bfloat16)?, 1e-6), Rope::new(32, 1e7, false, None)?);
        let qg = zeros(&[1, 1, 16, 256], Dtype::Bfloat16)?.split_equal(2, -1)?;
        let k = zeros(&[1, 1, 2, 128], Dtype::Bfloat16)?;
        let out = qk_norm_rope::fused_heads(&qg[0], &k, (&norm128, &norm128), &rope32, &Position::Offset(9))?;
        assert!(out.is_some(), "32 rotated dims");
        let traditional = Rope::new(64, 10_000_000.0, true, None)?;
        let k = zeros(&[1, 1, 2, 256], Dtype::Bfloat16)?;
        let q = zeros(&[1, 1, 16, 256], Dtype::Bfloat16)?;
        assert!(qk_norm_rope::fused_heads(&q, &k, (&norm, &norm), &traditional, &Position::Offset(0))?.is_none());
        Ok(())
    })
    .unwrap();
    assert_eq!(kernels(&recorded), ["qk_norm_rope"]);
    assert_compiles(&recorded);
}
