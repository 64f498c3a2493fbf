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
            if cuda {
                "gpu (cuda)".to_owned()
            } else {
                "gpu".to_owned()
            }
        }
    }
}

/// What MLX's allocator takes for an array of `nbytes` on the default
/// device, as its active-memory count sees it: on a GPU (MLX's CUDA
/// allocator) sizes under one 16 KiB page round up to a power of two (8
/// bytes at least) and larger ones to whole pages; on the CPU the size
/// itself. Caches that must count real bytes count this.
pub fn allocation_bytes(nbytes: usize) -> usize {
    static GPU: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    const PAGE: usize = 16 << 10;
    if nbytes == 0 || !*GPU.get_or_init(|| default_device() == DeviceKind::Gpu) {
        return nbytes;
    }
    if nbytes < PAGE {
        nbytes.next_power_of_two().max(8)
    } else {
        nbytes.div_ceil(PAGE) * PAGE
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

/// Starts `peak_memory` over from what is live now.
pub fn reset_peak_memory() {
    unsafe { mlx_sys::mlx_reset_peak_memory() };
}

/// Bytes of freed buffers MLX keeps for reuse (its buffer cache).
pub fn cache_memory() -> usize {
    let mut n = 0usize;
    unsafe { mlx_sys::mlx_get_cache_memory(&mut n) };
    n
}

/// Bounds MLX's buffer cache; returns the previous limit.
pub fn set_cache_limit(bytes: usize) -> usize {
    let mut old = 0usize;
    unsafe { mlx_sys::mlx_set_cache_limit(&mut old, bytes) };
    old
}

/// Returns every cached buffer to the system (or the device), then the
/// process heap's free pages: MLX's CPU buffers come from `malloc`, and the
/// allocator keeps freed ones resident for reuse until told to return them.
/// Buffers stay in the heap between these points, so a step reuses the
/// pages the one before it freed; mapping each large buffer on its own
/// instead (a 1 MiB mmap threshold under glibc) faulted in fresh zeroed
/// pages for every array, 20% of a batched step on the CPU
/// (docs/benchmarks.md, "The server comparison, CPU").
pub fn clear_cache() {
    unsafe { mlx_sys::mlx_clear_cache() };
    trim_heap();
}

/// Every free page of the process heap back to the system. The heap is
/// mimalloc's, which overrides `malloc` for the whole process (the host,
/// libmlx, CUDA's libraries and every plugin; docs/ARCHITECTURE.md, "One
/// allocator"): `mi_collect(true)` also collects other threads' abandoned
/// pages.
pub fn trim_heap() {
    // SAFETY: takes no pointer; mimalloc's collection is thread-safe.
    unsafe { libmimalloc_sys::mi_collect(true) };
}

/// Trims the process heap at most once per `HeapTrim::INTERVAL` while work runs.
/// Rows join and leave every few steps, each time freeing and allocating
/// batch-wide K/V, so between clearings of the buffer cache the heap's
/// free pages would pile up to the largest batch since the last one. A trim
/// costs the step after it the page faults of its buffers; by time rather
/// than by steps, so that cost stays a small share of a CPU's slow steps
/// and a GPU's fast ones alike.
pub struct HeapTrim {
    last: std::time::Instant,
}

impl HeapTrim {
    pub const INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

    pub fn new() -> Self {
        Self { last: std::time::Instant::now() }
    }

    /// Trims if the last trim is `INTERVAL` old.
    pub fn tick(&mut self) {
        if self.last.elapsed() >= Self::INTERVAL {
            let t = std::time::Instant::now();
            trim_heap();
            tracing::trace!(target: "host_engine::batch", ms = t.elapsed().as_secs_f64() * 1e3, "heap trimmed");
            self.last = std::time::Instant::now();
        }
    }
}

impl Default for HeapTrim {
    fn default() -> Self {
        Self::new()
    }
}

/// Waits until every MLX stream has run everything queued on it (work may
/// still be running after the last result was read: a step queued ahead, a
/// buffer freed on the stream thread). A process calls it before `exit`,
/// which tears libmlx's statics down beside any work still running.
pub fn wait_for_streams() {
    // SAFETY: plain mlx-c calls on handles made and freed here.
    unsafe {
        let mut streams = mlx_sys::mlx_vector_stream_new();
        if mlx_sys::mlx_get_streams(&mut streams) == 0 {
            for i in 0..mlx_sys::mlx_vector_stream_size(streams) {
                let mut s = mlx_sys::mlx_stream_new();
                if mlx_sys::mlx_vector_stream_get(&mut s, streams, i) == 0 {
                    mlx_sys::mlx_synchronize(s);
                }
                mlx_sys::mlx_stream_free(s);
            }
        }
        mlx_sys::mlx_vector_stream_free(streams);
    }
}

/// Memory of the default device: a GPU's own memory (MLX's device info,
/// `total_memory`), else the machine's RAM (MemTotal).
pub fn device_memory() -> u64 {
    if default_device() == DeviceKind::Gpu {
        if let Some(total) = gpu_total_memory() {
            return total;
        }
    }
    let total_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .unwrap_or(8 << 20);
    total_kib * 1024
}

fn gpu_total_memory() -> Option<u64> {
    unsafe {
        let mut dev = mlx_sys::mlx_device_new();
        let mut info = mlx_sys::mlx_device_info_new();
        let mut total = 0usize;
        let ok = mlx_sys::mlx_get_default_device(&mut dev) == 0
            && mlx_sys::mlx_device_info_get(&mut info, dev) == 0
            && mlx_sys::mlx_device_info_get_size(&mut total, info, c"total_memory".as_ptr()) == 0;
        mlx_sys::mlx_device_info_free(info);
        mlx_sys::mlx_device_free(dev);
        (ok && total > 0).then_some(total as u64)
    }
}

/// Path of the shared object that defines `addr`, as the dynamic linker sees
/// it; used to prove which libmlx/libmlxc a symbol comes from.
// dladdr only looks the address up among the mapped objects; it never reads
// through it, so any address is safe to pass.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
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

#[cfg(test)]
mod tests {
    use super::wait_for_streams;
    use mlx_rs::{ops, Array};

    fn available(a: &Array) -> bool {
        let mut ready = false;
        // SAFETY: reads the status of a live array.
        assert_eq!(unsafe { mlx_sys::_mlx_array_is_available(&mut ready, a.as_ptr()) }, 0);
        ready
    }

    /// The exit path's wait, checked directly (tests/it `exit_stress` sees
    /// the hang it prevents only in some runs): work queued and not read is
    /// done when `wait_for_streams` returns.
    #[test]
    fn wait_for_streams_returns_once_queued_work_has_run() {
        let w = ops::ones::<f32>(&[512, 512]).unwrap().multiply(Array::from_f32(1.0 / 512.0)).unwrap();
        let mut x = w.clone();
        // About a second of matmuls on a 2-core CPU, queued and never read.
        for _ in 0..200 {
            x = ops::matmul(&x, &w).unwrap();
        }
        mlx_rs::transforms::async_eval([&x]).unwrap();
        assert!(!available(&x), "the chain must still be running when the wait starts");
        wait_for_streams();
        assert!(available(&x), "wait_for_streams returned with work still queued");
    }
}
