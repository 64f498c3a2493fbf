//! The foundation invariant: the host and every plugin cdylib share ONE MLX
//! runtime (one libmlx, one libmlxc, one allocator, one error path).
//!
//! These tests fail if a plugin linked its own MLX copy: the symbol it calls
//! would resolve inside the plugin instead of the shared libmlxc, and arrays
//! would not cross.

use host_engine::runtime;
use it::{cdylib, host_bin};
use libloading::{Library, Symbol};
use mlx_rs::Array;
use std::ffi::{c_char, c_void, CStr};

type Make = unsafe extern "C" fn(i32) -> mlx_sys::mlx_array;
type Sum = unsafe extern "C" fn(mlx_sys::mlx_array) -> mlx_sys::mlx_array;
type Fail = unsafe extern "C" fn(*mut c_char, usize) -> usize;
type SymbolOf = unsafe extern "C" fn() -> *const c_void;

/// Loaded once and never unloaded, as the host never unloads a plugin. Each
/// library's mlx-rs registers its own error handler inside libmlxc on its
/// first op; after a `Library` drop (dlclose) libmlxc could still call a
/// handler in unmapped code, or in whatever library was mapped there next.
/// That crashed this test binary with SIGSEGV about one run in ten.
fn load() -> &'static (Library, Library) {
    static LIBS: std::sync::OnceLock<(Library, Library)> = std::sync::OnceLock::new();
    LIBS.get_or_init(|| unsafe {
        (Library::new(cdylib("proof_maker")).unwrap(), Library::new(cdylib("proof_consumer")).unwrap())
    })
}

#[test]
fn a_lazy_array_made_in_one_plugin_evaluates_in_the_host_and_feeds_another() {
    let _mlx = it::mlx_exclusive();
    let (maker, consumer) = load();
    unsafe {
        let make: Symbol<Make> = maker.get(b"proof_make").unwrap();
        let sum: Symbol<Sum> = consumer.get(b"proof_sum").unwrap();

        let before = runtime::active_memory();
        let raw = make(1 << 20);
        assert!(!raw.ctx.is_null(), "plugin failed to build the array");
        // Ownership transferred: the host now owns and will free this handle.
        let x = Array::from_ptr(raw);
        x.eval().unwrap();
        // The allocator the host reads is the one the plugin's graph used.
        assert!(
            runtime::active_memory() >= before + 4 * (1 << 20),
            "the host's allocator did not see the plugin's array"
        );
        assert_eq!(x.shape(), &[1 << 20]);
        assert_eq!(x.as_slice::<i32>()[..4], [0, 2, 4, 6]);

        // Borrowed by the second plugin; its result is transferred back.
        let s = Array::from_ptr(sum(x.as_ptr()));
        let n: i64 = 1 << 20;
        assert_eq!(s.item_cast::<i32>() as i64, (n * (n - 1)) as i32 as i64);
    }
}

#[test]
fn every_plugin_reaches_the_same_shared_libmlxc() {
    let _mlx = it::mlx_exclusive();
    let (maker, consumer) = load();
    let host = runtime::object_of(mlx_sys::mlx_array_eval as *const c_void).expect("host symbol");
    assert!(host.ends_with("/libmlxc.so"), "host resolves mlx-c in {host}");
    for lib in [&maker, &consumer] {
        let f: Symbol<SymbolOf> = unsafe { lib.get(b"proof_mlx_symbol").unwrap() };
        let plugin = runtime::object_of(unsafe { f() }).expect("plugin symbol");
        assert_eq!(plugin, host, "a plugin reached mlx-c somewhere else than the shared libmlxc");
    }
    assert_eq!(runtime::mapped_objects("libmlx.so").len(), 1, "{:?}", runtime::mapped_objects("libmlx.so"));
    assert_eq!(runtime::mapped_objects("libmlxc.so").len(), 1, "{:?}", runtime::mapped_objects("libmlxc.so"));
}

#[test]
fn mlx_errors_keep_their_message_in_host_and_plugins_after_plugins_loaded() {
    let _mlx = it::mlx_exclusive();
    let (_maker, consumer) = load();
    // The plugin's own mlx-rs copy registers its handler on its first op.
    let fail: Symbol<Fail> = unsafe { consumer.get(b"proof_fail").unwrap() };
    let mut buf = vec![0 as c_char; 1024];
    let n = unsafe { fail(buf.as_mut_ptr(), buf.len()) };
    let in_plugin = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
    assert!(n > 0 && in_plugin.contains("matmul"), "plugin lost MLX's message: {in_plugin:?}");

    // And the host, whose handler was registered before or after, still gets it.
    let a = Array::from_slice(&[1.0f32, 2.0, 3.0], &[1, 3]);
    let b = Array::from_slice(&[1.0f32, 2.0], &[2, 1]);
    let err = a.matmul(&b).unwrap_err();
    assert!(
        err.what().contains("matmul") && !err.what().contains("failed with status"),
        "host lost MLX's message: {:?}",
        err.what()
    );
}

#[test]
fn host_version_prints_the_mlx_version_and_device() {
    let out = std::process::Command::new(host_bin()).arg("--version").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("mlx 0.32.4"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("device cpu") || l.starts_with("device gpu")), "{text}");
    assert!(text.contains("libmlx.so"), "{text}");
}

/// libmlx's `cblas_sgemm` calls bind to libmlx_stable_gemm's (xtask makes
/// it libmlx's first needed library), in this process as in the host and
/// the oracle. A product against a weight stored [N, K] (a linear layer's)
/// sums each output in one order whatever the rows beside it: every row of
/// a 1-, 3-, 9- and 70-row product has the bits of that row alone. Every
/// product, that layout or the other (OpenBLAS's), equals the one taken in
/// double precision here.
#[test]
fn float32_products_sum_a_row_alike_whatever_rows_come_with_it() {
    let _mlx = it::mlx_exclusive();
    extern "C" {
        fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    }
    // SAFETY: a NUL-terminated name; RTLD_DEFAULT (null) searches the global scope.
    let sgemm = unsafe { dlsym(std::ptr::null_mut(), c"cblas_sgemm".as_ptr()) };
    let owner = runtime::object_of(sgemm).expect("cblas_sgemm is defined somewhere");
    assert!(owner.ends_with("/libmlx_stable_gemm.so"), "cblas_sgemm binds in {owner}");

    // K past a multiple of 8 (the lanes' tail), N past 64 (two threads) and
    // not a multiple of 3 (the tiles' edge).
    let (k, n) = (77, 131);
    let w: Vec<f32> = (0..n * k).map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0).collect();
    let wt: Vec<f32> = (0..k * n).map(|i| w[(i % n) * k + i / n]).collect();
    let x: Vec<f32> = (0..70 * k).map(|i| ((i * 31) % 17) as f32 / 8.0 - 1.0).collect();
    let product = |rows: usize, first: usize, stored: bool| -> Vec<f32> {
        let xa = Array::from_slice(&x[first * k..(first + rows) * k], &[rows as i32, k as i32]);
        let b = if stored {
            Array::from_slice(&w, &[n as i32, k as i32]).t()
        } else {
            Array::from_slice(&wt, &[k as i32, n as i32])
        };
        xa.matmul(&b).unwrap().as_slice::<f32>().to_vec()
    };
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let alone: Vec<Vec<u32>> = (0..70).map(|r| bits(&product(1, r, true))).collect();
    for rows in [1, 3, 9, 70] {
        for stored in [true, false] {
            let got = product(rows, 0, stored);
            for (r, c) in (0..rows).flat_map(|r| (0..n).map(move |c| (r, c))) {
                let want: f64 = (0..k).map(|i| x[r * k + i] as f64 * w[c * k + i] as f64).sum();
                let diff = (got[r * n + c] as f64 - want).abs();
                assert!(
                    diff <= 1e-5 * (1.0 + want.abs()),
                    "{rows} rows, stored {stored}: [{r}, {c}] {} vs {want}",
                    got[r * n + c]
                );
            }
            if stored {
                for (r, alone) in alone.iter().enumerate().take(rows) {
                    assert_eq!(&bits(&got[r * n..(r + 1) * n]), alone, "row {r} of {rows} against itself alone");
                }
            }
        }
    }
}
