//! MLX's distributed layer, as mlx-c exposes it: one process group per
//! process (the ring backend over TCP between processes on one machine or
//! across hosts, NCCL in the CUDA build) and its collectives.
//!
//! Owns: the safe face of the `mlx_distributed_*` calls the engine uses.
//! Does not own: any transport (MLX's backends are the transport), launching
//! ranks (the host's `tp_launch`), or sharding (model-kit's `shard`).
//!
//! There is exactly one libmlx per process (docs/ARCHITECTURE.md), so the
//! group the host initializes is the group every plugin's collectives run
//! over: MLX keeps it process-wide and hands it back on every later
//! `init` (and to every collective given no group).

use mlx_rs::Array;
use std::ffi::CString;

pub type Result<T> = std::result::Result<T, String>;

fn checked(op: &str, call: impl FnOnce() -> i32) -> Result<()> {
    mlx_sys::checked(op, call)
}

fn array_out(op: &str, f: impl FnOnce(*mut mlx_sys::mlx_array) -> i32) -> Result<Array> {
    Ok(unsafe { Array::from_ptr(mlx_sys::checked_array(op, f)?) })
}

fn stream() -> mlx_rs::Stream {
    mlx_rs::Stream::thread_local_or_default()
}

/// Whether this libmlx was built with `backend` (`ring`, `nccl`, ...).
pub fn is_available(backend: &str) -> bool {
    let Ok(name) = CString::new(backend) else { return false };
    unsafe { mlx_sys::mlx_distributed_is_available(name.as_ptr()) }
}

/// A communication group: this process's rank among `size` ranks.
pub struct Group {
    raw: mlx_sys::mlx_distributed_group,
}

// The handle is MLX's shared_ptr to a process-wide group; MLX's collectives
// may be issued from any thread.
unsafe impl Send for Group {}
unsafe impl Sync for Group {}

impl Group {
    /// Initializes (or returns the already initialized) process group of
    /// `backend` (`ring`, `nccl`, `mpi`, `jaccl`; `any` = MLX's first
    /// available). `strict`: fail instead of falling back to a group of one.
    /// The ring backend reads `MLX_RANK` and `MLX_HOSTFILE` (a JSON list, one
    /// entry per rank, of `"ip:port"` lists) as mlx.launch writes them; NCCL
    /// reads `MLX_RANK`, `MLX_WORLD_SIZE`, `NCCL_HOST_IP` and `NCCL_PORT`
    /// (rank 0's rendezvous address). Both block until every rank has
    /// connected.
    pub fn init(backend: &str, strict: bool) -> Result<Self> {
        let name = CString::new(backend).map_err(|_| "backend name has a NUL byte".to_string())?;
        let mut raw = unsafe { mlx_sys::mlx_distributed_group_new() };
        checked("distributed init", || unsafe { mlx_sys::mlx_distributed_init(&mut raw, strict, name.as_ptr()) })?;
        if raw.ctx.is_null() {
            return Err(format!("MLX's `{backend}` distributed backend is not available"));
        }
        Ok(Self { raw })
    }

    /// The process group as initialized so far (a group of one if nothing
    /// initialized one: MLX's non-strict `any`).
    pub fn current() -> Result<Self> {
        Self::init("any", false)
    }

    pub fn rank(&self) -> usize {
        unsafe { mlx_sys::mlx_distributed_group_rank(self.raw) }.max(0) as usize
    }

    pub fn size(&self) -> usize {
        unsafe { mlx_sys::mlx_distributed_group_size(self.raw) }.max(1) as usize
    }

    /// The element-wise sum of `x` over every rank, the same on each.
    pub fn all_sum(&self, x: &Array) -> Result<Array> {
        let s = stream();
        array_out("all_sum", |res| unsafe { mlx_sys::mlx_distributed_all_sum(res, x.as_ptr(), self.raw, s.as_ptr()) })
    }

    /// Every rank's `x` concatenated along axis 0, in rank order.
    pub fn all_gather(&self, x: &Array) -> Result<Array> {
        let s = stream();
        array_out("all_gather", |res| unsafe {
            mlx_sys::mlx_distributed_all_gather(res, x.as_ptr(), self.raw, s.as_ptr())
        })
    }

    /// Sends `x` to rank `dst` (the result is a token to evaluate).
    pub fn send(&self, x: &Array, dst: usize) -> Result<Array> {
        let s = stream();
        array_out("send", |res| unsafe {
            mlx_sys::mlx_distributed_send(res, x.as_ptr(), dst as i32, self.raw, s.as_ptr())
        })
    }

    /// Receives from rank `src` an array shaped and typed like `like`.
    pub fn recv_like(&self, like: &Array, src: usize) -> Result<Array> {
        let s = stream();
        array_out("recv", |res| unsafe {
            mlx_sys::mlx_distributed_recv_like(res, like.as_ptr(), src as i32, self.raw, s.as_ptr())
        })
    }
}

impl Group {
    /// Rank 0's `bytes` on every rank (the others pass None), through two
    /// `all_sum`s (the length, then the bytes widened to int32: the other
    /// ranks add zeros). Blocks until every rank has called it.
    pub fn broadcast_bytes(&self, bytes: Option<&[u8]>) -> Result<Vec<u8>> {
        let root = self.rank() == 0;
        let mine = if root { bytes.unwrap_or_default() } else { &[] };
        let len = Array::from_slice(&[if root { mine.len() as i32 } else { 0 }], &[1]);
        let len = self.all_sum(&len)?;
        len.eval().map_err(|e| e.what().to_owned())?;
        let n = len.as_slice::<i32>()[0].max(0) as usize;
        if n == 0 {
            return Ok(Vec::new());
        }
        let data: Vec<i32> = if root { mine.iter().map(|b| *b as i32).collect() } else { vec![0; n] };
        let sum = self.all_sum(&Array::from_slice(&data, &[n as i32]))?;
        sum.eval().map_err(|e| e.what().to_owned())?;
        Ok(sum.as_slice::<i32>().iter().map(|v| *v as u8).collect())
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        unsafe { mlx_sys::mlx_distributed_group_free(self.raw) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without MLX_RANK/MLX_HOSTFILE no backend has peers: MLX's non-strict
    /// init is a group of one, whose collectives return their input.
    #[test]
    fn a_process_alone_is_a_group_of_one() {
        let g = Group::current().unwrap();
        assert_eq!((g.rank(), g.size()), (0, 1));
        let x = Array::from_slice(&[1.0f32, -2.5, 3.0], &[3]);
        let s = g.all_sum(&x).unwrap();
        s.eval().unwrap();
        assert_eq!(s.as_slice::<f32>(), [1.0, -2.5, 3.0]);
        let a = g.all_gather(&x).unwrap();
        a.eval().unwrap();
        assert_eq!(a.shape(), [3]);
        assert_eq!(g.broadcast_bytes(Some(b"rank 0 says")).unwrap(), b"rank 0 says");
        assert!(g.broadcast_bytes(None).unwrap().is_empty());
    }

    #[test]
    fn a_strict_ring_without_a_hostfile_is_an_error_not_a_group() {
        if std::env::var_os("MLX_HOSTFILE").is_some() {
            return;
        }
        let e = Group::init("ring", true).err().expect("no hostfile: no ring");
        assert!(!e.is_empty());
    }
}
