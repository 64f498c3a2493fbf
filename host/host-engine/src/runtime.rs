//! Facts about the one MLX runtime this process mapped: its version, the
//! default device, and memory counters.
//!
//! Which libmlx.so is mapped is decided before `main` by the dynamic linker
//! (RUNPATH to `.mlx/lib`, or LD_LIBRARY_PATH first when the CUDA runtime is
//! switched in); everything here only reads what was loaded.

use std::ffi::CStr;

/// The MLX version string reported by the loaded libmlx (through libmlxc).
pub fn mlx_version() -> String {
    unsafe {
        let mut s = mlx_sys::mlx_string_new();
        let version = if mlx_sys::mlx_version(&mut s) == 0 {
            CStr::from_ptr(mlx_sys::mlx_string_data(s)).to_string_lossy().into_owned()
        } else {
            "unknown".to_owned()
        };
        mlx_sys::mlx_string_free(s);
        version
    }
}

/// The kind of device MLX computes on by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    Cpu,
    Gpu,
}

/// The default device of the loaded runtime: `Gpu` with the CUDA (or Metal)
/// build of libmlx, `Cpu` with the CPU wheel.
pub fn default_device() -> DeviceKind {
    unsafe {
        let mut dev = mlx_sys::mlx_device_new();
        let mut kind = mlx_sys::mlx_device_type__MLX_CPU;
        if mlx_sys::mlx_get_default_device(&mut dev) == 0 {
            mlx_sys::mlx_device_get_type(&mut kind, dev);
        }
        mlx_sys::mlx_device_free(dev);
        if kind == mlx_sys::mlx_device_type__MLX_GPU {
            DeviceKind::Gpu
        } else {
            DeviceKind::Cpu
        }
    }
}

/// A human-readable description of the default device ("cpu", or "gpu (cuda)").
pub fn device_description() -> String {
    match default_device() {
        DeviceKind::Cpu => "cpu".to_owned(),
        DeviceKind::Gpu => {
            let mut cuda = false;
            unsafe { mlx_sys::mlx_cuda_is_available(&mut cuda) };
            if cuda { "gpu (cuda)".to_owned() } else { "gpu".to_owned() }
        }
    }
}

/// Bytes MLX currently holds in live arrays (process-wide: one allocator).
pub fn active_memory() -> usize {
    let mut n = 0usize;
    unsafe { mlx_sys::mlx_get_active_memory(&mut n) };
    n
}

/// The highest `active_memory` since the last reset.
pub fn peak_memory() -> usize {
    let mut n = 0usize;
    unsafe { mlx_sys::mlx_get_peak_memory(&mut n) };
    n
}

/// Path of the shared object that defines `addr`, as the dynamic linker sees
/// it; used to prove which libmlx/libmlxc a symbol comes from.
pub fn object_of(addr: *const std::ffi::c_void) -> Option<String> {
    extern "C" {
        fn dladdr(addr: *const std::ffi::c_void, info: *mut DlInfo) -> i32;
    }
    #[repr(C)]
    struct DlInfo {
        dli_fname: *const std::ffi::c_char,
        dli_fbase: *mut std::ffi::c_void,
        dli_sname: *const std::ffi::c_char,
        dli_saddr: *mut std::ffi::c_void,
    }
    let mut info = DlInfo {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let ok = unsafe { dladdr(addr, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    Some(unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned())
}

/// Every distinct file path mapped into this process whose name is `name`
/// (e.g. "libmlx.so"), read from /proc/self/maps.
pub fn mapped_objects(name: &str) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let mut paths: Vec<String> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5).map(str::to_owned))
        .filter(|p| p.rsplit('/').next() == Some(name))
        .map(|p| std::fs::canonicalize(&p).map(|c| c.display().to_string()).unwrap_or(p))
        .collect();
    paths.sort();
    paths.dedup();
    paths
}
