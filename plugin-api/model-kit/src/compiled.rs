//! Elementwise chains fused into one kernel by MLX's compiler, as mlx-lm
//! fuses them with `mx.compile` (its `swiglu`, `gelu_approx`,
//! `logit_softcap`). A family fuses exactly what its mlx-lm model compiles:
//! on the CPU fused and separate ops give the same bits, but on a GPU they
//! can round differently, and greedy parity there needs the same boundaries.
//!
//! Why: a decode step of a small model is bound by the host's kernel
//! launches, not by the device (docs/benchmarks.md, session 4). SwiGLU as
//! separate ops is three kernels per layer, Gemma's GeGLU about a dozen; fused
//! each is one. On the CPU the numbers do not change (MLX's compiled code
//! keeps every intermediate in its op's dtype; unit-tested bit for bit); on
//! the H200 the hybrid's bf16 greedy output changed with fusing off.
//!
//! Why not mlx-rs's `compile`: it numbers functions from a counter that
//! starts at 1 in every copy of mlx-rs, and libmlx keys its one compile cache
//! by that number. Every plugin carries its own copy, so two plugins' first
//! compiled functions would share an entry and one would run the other's
//! graph. `mlx_compile` on a closure keys the cache by the address of the
//! closure it wraps, which is unique in the process.

use crate::ops::{self, scalar};
use crate::{Array, Result};
use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

/// The traced body: arrays in, arrays out, built from ordinary MLX ops.
pub type Body = fn(&[Array]) -> Result<Vec<Array>>;

/// A compiled function. The helpers below hold theirs in a `static` for the
/// life of the process, so libmlx's cache entry (and the closure it calls
/// back into) never outlives the plugin's code.
pub struct Compiled {
    closure: mlx_sys::mlx_closure,
}

impl Drop for Compiled {
    /// Releases the closure; libmlx erases the cache entry with it.
    fn drop(&mut self) {
        unsafe { mlx_sys::mlx_closure_free(self.closure) };
    }
}

// SAFETY: the closure is an immutable handle; MLX serialises its compile
// cache, and the payload is a plain `fn` pointer.
unsafe impl Send for Compiled {}
unsafe impl Sync for Compiled {}

/// Called by libmlx when it traces the function (once per input dtypes and
/// ranks with `shapeless`); never afterwards. A panic or error becomes a
/// failing status, so nothing unwinds into C++.
extern "C" fn trampoline(
    out: *mut mlx_sys::mlx_vector_array,
    input: mlx_sys::mlx_vector_array,
    payload: *mut c_void,
) -> i32 {
    let body: Body = unsafe { std::mem::transmute::<*mut c_void, Body>(payload) };
    let run = catch_unwind(AssertUnwindSafe(|| -> Result<()> {
        let n = unsafe { mlx_sys::mlx_vector_array_size(input) };
        let args = (0..n)
            .map(|i| ops::raw("compile input", |res| unsafe { mlx_sys::mlx_vector_array_get(res, input, i) }))
            .collect::<Result<Vec<_>>>()?;
        let results = body(&args)?;
        let handles: Vec<mlx_sys::mlx_array> = results.iter().map(|a| a.as_ptr()).collect();
        // `out` arrives as an empty handle (no vector behind it) that mlx-c
        // frees after the call; the new vector holds its own references, so
        // `results` may drop after.
        unsafe { *out = mlx_sys::mlx_vector_array_new_data(handles.as_ptr(), handles.len()) };
        Ok(())
    }));
    match run {
        Ok(Ok(())) => 0,
        _ => 1,
    }
}

impl Compiled {
    /// Compiles `body`; `shapeless` as in `mx.compile` (one trace serves
    /// every shape of the same ranks: right for elementwise chains).
    pub fn new(body: Body, shapeless: bool) -> Result<Self> {
        let inner = unsafe { mlx_sys::mlx_closure_new_func_payload(Some(trampoline), body as *mut c_void, None) };
        let mut closure = unsafe { mlx_sys::mlx_closure_new() };
        let compiled = ops::checked("compile", || unsafe { mlx_sys::mlx_compile(&mut closure, inner, shapeless) });
        // The compiled closure holds its own reference to `inner`.
        unsafe { mlx_sys::mlx_closure_free(inner) };
        if let Err(e) = compiled {
            unsafe { mlx_sys::mlx_closure_free(closure) };
            return Err(e);
        }
        Ok(Self { closure })
    }

    /// Applies the compiled function (lazily, like any op).
    pub fn call(&self, args: &[&Array]) -> Result<Vec<Array>> {
        ops::vector_call("compiled call", args, |out, input| unsafe {
            mlx_sys::mlx_closure_apply(out, self.closure, input)
        })
    }

    /// The single result of a one-output function.
    pub fn call1(&self, args: &[&Array]) -> Result<Array> {
        self.call(args)?.pop().ok_or_else(|| crate::error("compiled function returned nothing"))
    }
}

/// Compiles `body` on first use and keeps it in `cell` (a `static` of the
/// caller's: one per function per plugin).
pub fn cached(cell: &'static OnceLock<Compiled>, body: Body) -> Result<&'static Compiled> {
    if let Some(c) = cell.get() {
        return Ok(c);
    }
    let compiled = Compiled::new(body, true)?;
    Ok(cell.get_or_init(|| compiled))
}

/// `nn.silu` as mlx-lm computes it: `x * sigmoid(x)` (unfused; inside a
/// compiled body it fuses with its neighbours).
pub fn silu_ops(x: &Array) -> Result<Array> {
    x.multiply(mlx_rs::ops::sigmoid(x)?)
}

/// `nn.gelu_approx`: `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 *
/// x**3)))`, the same ops in the same order, each constant in `x`'s dtype.
pub fn gelu_approx_ops(x: &Array) -> Result<Array> {
    let dt = x.dtype();
    let x3 = mlx_rs::ops::power(x, scalar(3.0, dt)?)?;
    let inner = x.add(scalar(0.044715, dt)?.multiply(&x3)?)?;
    let t = mlx_rs::ops::tanh(&scalar((2.0 / std::f64::consts::PI).sqrt(), dt)?.multiply(&inner)?)?;
    let one_plus = scalar(1.0, dt)?.add(&t)?;
    scalar(0.5, dt)?.multiply(x)?.multiply(&one_plus)
}

/// `silu(gate) * up`, one kernel (mlx-lm's compiled `swiglu`).
pub fn swiglu(gate: &Array, up: &Array) -> Result<Array> {
    static F: OnceLock<Compiled> = OnceLock::new();
    cached(&F, |a| Ok(vec![silu_ops(&a[0])?.multiply(&a[1])?]))?.call1(&[gate, up])
}

/// `silu(x)`, one kernel.
pub fn silu(x: &Array) -> Result<Array> {
    static F: OnceLock<Compiled> = OnceLock::new();
    cached(&F, |a| Ok(vec![silu_ops(&a[0])?]))?.call1(&[x])
}

/// `gelu_approx(x)`, one kernel (mlx-lm's compiled `nn.gelu_approx`).
pub fn gelu_approx(x: &Array) -> Result<Array> {
    static F: OnceLock<Compiled> = OnceLock::new();
    cached(&F, |a| Ok(vec![gelu_approx_ops(&a[0])?]))?.call1(&[x])
}

/// `gelu_approx(gate) * up`, one kernel (Gemma's gated MLP).
pub fn geglu(gate: &Array, up: &Array) -> Result<Array> {
    static F: OnceLock<Compiled> = OnceLock::new();
    cached(&F, |a| Ok(vec![gelu_approx_ops(&a[0])?.multiply(&a[1])?]))?.call1(&[gate, up])
}

/// `tanh(x / cap) * cap`, one kernel; `cap` is a scalar array in `x`'s dtype
/// (an input, so one trace serves every cap).
pub fn softcap(x: &Array, cap: &Array) -> Result<Array> {
    static F: OnceLock<Compiled> = OnceLock::new();
    cached(&F, |a| Ok(vec![mlx_rs::ops::tanh(&a[0].divide(&a[1])?)?.multiply(&a[1])?]))?.call1(&[x, cap])
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_rs::random;

    fn same(a: &Array, b: &Array) {
        assert_eq!(a.shape(), b.shape());
        assert_eq!(a.dtype(), b.dtype());
        let equal = a.eq_values(b).unwrap();
        assert!(equal, "compiled result differs from the separate ops");
    }

    fn normal(shape: &[i32], seed: u64) -> Array {
        let key = random::key(seed).unwrap();
        random::normal::<f32>(shape, None, None, Some(&key)).unwrap()
    }

    #[test]
    fn fused_chains_equal_the_separate_ops_bit_for_bit() {
        for dtype in [crate::Dtype::Float32, crate::Dtype::Bfloat16] {
            let g = normal(&[2, 3, 40], 1).as_dtype(dtype).unwrap();
            let u = normal(&[2, 3, 40], 2).as_dtype(dtype).unwrap();
            same(&swiglu(&g, &u).unwrap(), &silu_ops(&g).unwrap().multiply(&u).unwrap());
            same(&silu(&g).unwrap(), &silu_ops(&g).unwrap());
            same(&gelu_approx(&g).unwrap(), &gelu_approx_ops(&g).unwrap());
            same(&geglu(&g, &u).unwrap(), &gelu_approx_ops(&g).unwrap().multiply(&u).unwrap());
            let cap = scalar(3.0, dtype).unwrap();
            let plain = mlx_rs::ops::tanh(g.divide(&cap).unwrap()).unwrap().multiply(&cap).unwrap();
            same(&softcap(&g, &cap).unwrap(), &plain);
        }
    }

    #[test]
    fn one_trace_serves_other_shapes_and_each_function_keeps_its_own_graph() {
        // Two compiled functions with the same inputs live in one cache: each
        // must run its own graph (the collision mlx-rs's counter ids cause
        // across plugins would show here as equal results).
        let x = normal(&[5, 7], 3);
        let y = normal(&[5, 7], 4);
        let a = swiglu(&x, &y).unwrap();
        let b = geglu(&x, &y).unwrap();
        assert!(!a.eq_values(&b).unwrap());
        let add = Compiled::new(|a| Ok(vec![a[0].add(&a[1])?]), true).unwrap();
        let sub = Compiled::new(|a| Ok(vec![a[0].subtract(&a[1])?]), true).unwrap();
        same(&add.call1(&[&x, &y]).unwrap(), &x.add(&y).unwrap());
        same(&sub.call1(&[&x, &y]).unwrap(), &x.subtract(&y).unwrap());
        let wide = normal(&[3, 11, 9], 5);
        same(&swiglu(&wide, &wide).unwrap(), &silu_ops(&wide).unwrap().multiply(&wide).unwrap());
    }

    #[test]
    fn an_error_in_the_body_is_an_error_not_a_crash() {
        let bad = Compiled::new(|_| Err(crate::error("the body refused")), true).unwrap();
        assert!(bad.call(&[&normal(&[2], 6)]).is_err());
        let panics = Compiled::new(|_| panic!("a panic inside a trace"), true).unwrap();
        assert!(panics.call(&[&normal(&[2], 7)]).is_err());
        let mismatched = swiglu(&normal(&[2, 3], 8), &normal(&[4, 5], 9));
        assert!(mismatched.is_err());
    }
}
