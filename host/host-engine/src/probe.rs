//! A quick measurement of the loaded runtime: square matmul throughput in a
//! chosen dtype. Used to prove the GPU switch and to sanity-check a machine
//! (the CPU wheel's reference BLAS vs OpenBLAS shows up here at once).

use mlx_rs::{random, Array, Dtype};
use std::time::Instant;

pub struct MatmulFigure {
    pub size: i32,
    pub dtype: Dtype,
    pub iters: usize,
    pub seconds_per_iter: f64,
    pub gflops: f64,
}

/// Times `iters` evaluations of an `n x n` by `n x n` matmul after a warm-up.
pub fn matmul(n: i32, dtype: Dtype, iters: usize) -> Result<MatmulFigure, mlx_rs::error::Exception> {
    let key = random::key(0)?;
    let a = random::normal::<f32>(&[n, n], None, None, &key)?.as_dtype(dtype)?;
    let b = random::normal::<f32>(&[n, n], None, None, &key)?.as_dtype(dtype)?;
    mlx_rs::transforms::eval([&a, &b])?;
    let run = |k: usize| -> Result<(), mlx_rs::error::Exception> {
        let outs: Vec<Array> = (0..k).map(|_| a.matmul(&b)).collect::<Result<_, _>>()?;
        mlx_rs::transforms::eval(outs.iter())?;
        Ok(())
    };
    run(1)?; // warm-up: kernel selection, allocation
    let t = Instant::now();
    run(iters)?;
    let secs = t.elapsed().as_secs_f64() / iters as f64;
    let flops = 2.0 * (n as f64).powi(3);
    Ok(MatmulFigure { size: n, dtype, iters, seconds_per_iter: secs, gflops: flops / secs / 1e9 })
}
