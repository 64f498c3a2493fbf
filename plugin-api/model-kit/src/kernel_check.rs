//! The compile check of our CUDA kernels, which needs no GPU: each launch
//! recorded by `cuda_capture` is compiled by NVRTC for the H200 (`sm_90a`)
//! with MLX's own device headers and NVRTC options, as MLX compiles it on
//! the device, ptxas included. A kernel edit that does not compile, or a
//! call path that launches a kernel with template values or dtypes its body
//! does not build for, fails here instead of on a device; so does a launch
//! whose blocks need more registers than an SM's register file holds, or
//! whose shape the device refuses (both compile; neither would launch).
//!
//! The toolchain (NVRTC, CUDA's and CCCL's headers, MLX's device headers)
//! is laid out by `cargo xtask cuda-check` at `<repo>/.cuda-check`, or
//! wherever `MLX_ENGINE_CUDA_CHECK` points.

use crate::cuda_capture::Launched;
use libloading::{Library, Symbol};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

/// What ptxas said of one compiled function.
#[derive(Debug)]
pub struct Compiled {
    /// Its `Used N registers` and spill lines.
    pub report: String,
    /// Registers per thread.
    pub registers: i32,
}

/// An H200 SM's register file: a block's threads share it.
const REGISTERS_PER_SM: i32 = 65536;

/// The registers a block of `threads` takes with `per_thread` each: CUDA
/// hands them out per warp, each thread's count rounded up to 8.
fn block_registers(per_thread: i32, threads: i32) -> i32 {
    (per_thread + 7) / 8 * 8 * 32 * ((threads + 31) / 32)
}

fn toolchain() -> Result<PathBuf, String> {
    let dir = std::env::var_os("MLX_ENGINE_CUDA_CHECK")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../.cuda-check")));
    if dir.join("READY").exists() {
        Ok(dir)
    } else {
        Err(format!(
            "no CUDA compile check toolchain at {}: run `cargo xtask cuda-check` (the test command does)",
            dir.display()
        ))
    }
}

/// NVRTC, and the toolchain's folder. NVRTC opens its builtins library by
/// name, which its own folder is not searched for: loaded first by path, it
/// is found already open.
fn nvrtc() -> Result<&'static (Library, PathBuf), String> {
    static NVRTC: OnceLock<Result<(Library, PathBuf), String>> = OnceLock::new();
    NVRTC
        .get_or_init(|| {
            let dir = toolchain()?;
            let load = |path: PathBuf| {
                // SAFETY: NVRTC's libraries have no initialisers with preconditions.
                unsafe { Library::new(&path) }.map_err(|e| format!("loading {}: {e}", path.display()))
            };
            let entries = std::fs::read_dir(dir.join("lib")).map_err(|e| e.to_string())?;
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with("libnvrtc-builtins") {
                    // Kept open for the process's life, as NVRTC expects.
                    std::mem::forget(load(e.path())?);
                }
            }
            Ok((load(dir.join("lib/libnvrtc.so.13"))?, dir))
        })
        .as_ref()
        .map_err(Clone::clone)
}

type Program = *mut c_void;

/// Whether the device takes the launch's shape as MLX hands it over: at
/// most 1024 threads a block (64 on z), at most 65535 blocks on y and z,
/// and on no axis fewer threads in all than a block has (MLX would then
/// launch a smaller block than the kernel was written for).
fn check_shape(launched: &Launched) -> Result<(), String> {
    let (g, t) = (launched.grid, launched.threads);
    if t.iter().any(|&n| n < 1) || launched.block_threads() > 1024 || t[2] > 64 {
        return Err(format!("{t:?} threads a block: the device takes at most 1024 (64 on z)"));
    }
    if let Some(axis) = (0..3).find(|&i| g[i] < t[i]) {
        return Err(format!(
            "{g:?} threads in all, {t:?} a block: axis {axis} has fewer threads than a block, so MLX would launch \
             fewer threads a block than the kernel was written for"
        ));
    }
    let blocks: Vec<i64> = (0..3).map(|i| (g[i] as i64 + t[i] as i64 - 1) / t[i] as i64).collect();
    if blocks[1] > 65535 || blocks[2] > 65535 {
        return Err(format!("{blocks:?} blocks: the device takes at most 65535 on y and z"));
    }
    Ok(())
}

/// Checks the launch's shape, then compiles its source; why it fails: the
/// shape's fault, the compiler's log, or a register count past the SM's.
pub fn compile(launched: &Launched) -> Result<Compiled, String> {
    check_shape(launched)?;
    let (lib, dir) = nvrtc()?;
    let include = |sub: &str| format!("--include-path={}", dir.join(sub).display());
    let options = [
        "--device-as-default-execution-space".to_string(),
        "--gpu-architecture=sm_90a".to_string(),
        include("mlx-device"),
        include("cccl"),
        include("cuda/include"),
        "--ptxas-options=-v".to_string(),
    ];
    let options: Vec<CString> = options.iter().map(|o| CString::new(o.as_str()).expect("no NUL")).collect();
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    let source = CString::new(launched.source.as_str()).map_err(|_| "the source has a NUL byte".to_string())?;
    let name = CString::new(format!("{}.cu", launched.kernel)).map_err(|_| "the name has a NUL byte".to_string())?;
    // SAFETY: the signatures are NVRTC's (nvrtc.h); every pointer passed
    // lives until the call returns, and the program is destroyed once.
    unsafe {
        let create: Symbol<
            unsafe extern "C" fn(
                *mut Program,
                *const c_char,
                *const c_char,
                c_int,
                *const *const c_char,
                *const *const c_char,
            ) -> c_int,
        > = lib.get(b"nvrtcCreateProgram\0").map_err(|e| e.to_string())?;
        let compile: Symbol<unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int> =
            lib.get(b"nvrtcCompileProgram\0").map_err(|e| e.to_string())?;
        let log_size: Symbol<unsafe extern "C" fn(Program, *mut usize) -> c_int> =
            lib.get(b"nvrtcGetProgramLogSize\0").map_err(|e| e.to_string())?;
        let get_log: Symbol<unsafe extern "C" fn(Program, *mut c_char) -> c_int> =
            lib.get(b"nvrtcGetProgramLog\0").map_err(|e| e.to_string())?;
        let destroy: Symbol<unsafe extern "C" fn(*mut Program) -> c_int> =
            lib.get(b"nvrtcDestroyProgram\0").map_err(|e| e.to_string())?;
        let mut program: Program = std::ptr::null_mut();
        let made = create(&mut program, source.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null());
        if made != 0 {
            return Err(format!("nvrtcCreateProgram failed ({made})"));
        }
        let result = compile(program, option_ptrs.len() as c_int, option_ptrs.as_ptr());
        let mut size = 0usize;
        log_size(program, &mut size);
        let mut log = vec![0 as c_char; size + 1];
        get_log(program, log.as_mut_ptr());
        destroy(&mut program);
        let log = CStr::from_ptr(log.as_ptr()).to_string_lossy().into_owned();
        if result != 0 {
            return Err(log);
        }
        let report = log
            .lines()
            .filter(|l| l.contains("registers") || l.contains("spill"))
            .map(|l| {
                let l = l.strip_prefix("ptxas").unwrap_or(l).trim_start();
                l.trim_start_matches("info").trim_start_matches([' ', '.', ':']).trim()
            })
            .collect::<Vec<_>>()
            .join("; ");
        let registers = log
            .split("Used ")
            .nth(1)
            .and_then(|rest| rest.split(' ').next())
            .and_then(|n| n.parse::<i32>().ok())
            .ok_or_else(|| format!("ptxas reported no register count for {}:\n{log}", launched.function))?;
        let needed = block_registers(registers, launched.block_threads());
        if needed > REGISTERS_PER_SM {
            return Err(format!(
                "{registers} registers a thread x {} threads a block need {needed} registers, past an SM's \
                 {REGISTERS_PER_SM}: the launch would fail",
                launched.block_threads()
            ));
        }
        Ok(Compiled { report, registers })
    }
}

/// Compiles every distinct launch (one thread per core), printing ptxas's report
/// of each, and panics naming each that fails with its compiler log.
pub fn assert_compiles(launched: &[Launched]) {
    assert!(!launched.is_empty(), "no kernel launch was recorded");
    let mut distinct: Vec<&Launched> = Vec::new();
    for l in launched {
        if !distinct.iter().any(|d| d.source == l.source && d.grid == l.grid && d.threads == l.threads) {
            distinct.push(l);
        }
    }
    let results: Vec<(String, Result<Compiled, String>)> = std::thread::scope(|s| {
        let workers = std::thread::available_parallelism().map_or(2, |n| n.get()).min(distinct.len());
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let mine: Vec<&Launched> = distinct.iter().skip(w).step_by(workers).copied().collect();
                s.spawn(move || {
                    mine.into_iter()
                        .map(|l| (format!("{}({})", l.function, l.input_types), compile(l)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().expect("a compile thread panicked")).collect()
    });
    let mut failed = Vec::new();
    for (function, result) in results {
        match result {
            Ok(c) => println!("{function}: {}", c.report),
            Err(log) => failed.push(format!("{function}:\n{log}")),
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {} kernels did not compile:\n{}",
        failed.len(),
        distinct.len(),
        failed.join("\n")
    );
}

/// The kernels `launched` went through, each once, in order of first use.
pub fn kernels(launched: &[Launched]) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for l in launched {
        if !names.contains(&l.kernel.as_str()) {
            names.push(&l.kernel);
        }
    }
    names
}
