//! A diagnostic: the lazy graph of each serial plain step and each
//! speculative verify written as DOT (MLX's `export_to_dot`) just before
//! MLX evaluates it, when `MLX_ENGINE_DUMP_GRAPHS` names a folder. MLX's
//! eval costs the host time per node, views included, so the node count
//! of a step is what bounds a step the device finishes first
//! (`tests/bench/graph_census.py` counts them by primitive;
//! docs/benchmarks.md, "The hybrid's layers in fewer kernels"). Unset, a
//! dump point costs one read of a flag set once.

use mlx_rs::Array;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// The folder named by `MLX_ENGINE_DUMP_GRAPHS`, read once.
fn folder() -> Option<&'static PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| std::env::var_os("MLX_ENGINE_DUMP_GRAPHS").map(PathBuf::from)).as_ref()
}

/// Writes `a`'s graph as `NNNNN_KIND.dot` (numbered in the order dumped)
/// when dumping is on; a file it cannot write is logged, never fatal.
pub(crate) fn dump(kind: &str, a: &Array) {
    let Some(dir) = folder() else { return };
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = dir.join(format!("{:05}_{kind}.dot", N.fetch_add(1, Ordering::Relaxed)));
    if let Err(why) = write(&path, a) {
        tracing::warn!("MLX_ENGINE_DUMP_GRAPHS: {}: {why}", path.display());
    }
}

fn write(path: &std::path::Path, a: &Array) -> Result<(), String> {
    let name = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| "a NUL byte in the path".to_string())?;
    // SAFETY: `file` is checked open before use and closed once; the
    // vector and namer are MLX objects freed after the call.
    unsafe {
        let file = libc::fopen(name.as_ptr(), c"w".as_ptr());
        if file.is_null() {
            return Err(std::io::Error::last_os_error().to_string());
        }
        let arrays = mlx_sys::mlx_vector_array_new_value(a.as_ptr());
        let namer = mlx_sys::mlx_node_namer_new();
        let status = mlx_sys::mlx_export_to_dot(file as *mut _, namer, arrays);
        mlx_sys::mlx_node_namer_free(namer);
        mlx_sys::mlx_vector_array_free(arrays);
        libc::fclose(file);
        if status != 0 {
            return Err("MLX could not export the graph".into());
        }
    }
    Ok(())
}
