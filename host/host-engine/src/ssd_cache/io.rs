//! Writing an entry file atomically, and reading one back into 1-row
//! `CacheState`s (the format is `format`'s).

use super::format::{self, Header, LayerHeader, Reject, TensorHeader};
use plugin_api::abi_stable::std_types::{RString, RVec};
use plugin_api::{CacheState, Tensor};
use std::io::{Read, Write};
use std::path::Path;

/// The bytes, dtype and shape of an evaluated, row-contiguous tensor (as
/// `owned_state::own` leaves every tensor of a stored entry).
fn view(t: &Tensor) -> Result<(&[u8], &'static str, Vec<i64>), String> {
    let raw = t.as_raw();
    let dtype = format::dtype_name(unsafe { mlx_sys::mlx_array_dtype(raw) }).ok_or("a tensor of an unknown dtype")?;
    let ndim = unsafe { mlx_sys::mlx_array_ndim(raw) };
    let shape: Vec<i64> = if ndim == 0 {
        Vec::new()
    } else {
        let p = unsafe { mlx_sys::mlx_array_shape(raw) };
        unsafe { std::slice::from_raw_parts(p, ndim) }.iter().map(|&d| d as i64).collect()
    };
    let n = unsafe { mlx_sys::mlx_array_nbytes(raw) };
    if n == 0 {
        return Ok((&[], dtype, shape));
    }
    let p = unsafe { mlx_sys::mlx_array_data_uint8(raw) };
    if p.is_null() {
        return Err("a tensor without host-readable data".into());
    }
    // The tensor is kept alive by `t` and never written (MLX arrays are immutable).
    Ok((unsafe { std::slice::from_raw_parts(p, n) }, dtype, shape))
}

fn align(n: u64) -> u64 {
    n.div_ceil(format::ALIGN) * format::ALIGN
}

/// Writes the entry to `<dir>/<name>.tmp`, syncs it, renames it to
/// `<dir>/<name>.mlxkv` and syncs the directory; returns the file's size.
/// A crash before the rename leaves only the temp file.
pub fn write_entry(
    dir: &Path,
    name: &str,
    ns: &str,
    tokens: &[u32],
    trimmable: bool,
    states: &[CacheState],
) -> Result<u64, String> {
    let mut layers = Vec::with_capacity(states.len());
    let mut views = Vec::new();
    let mut at = 0u64;
    let mut hash = format::FNV_OFFSET;
    for s in states {
        let mut tensors = Vec::with_capacity(s.tensors.len());
        for t in s.tensors.iter() {
            let (bytes, dtype, shape) = view(t)?;
            let start = align(at);
            hash = format::fnv1a(hash, &vec![0u8; (start - at) as usize]);
            hash = format::fnv1a(hash, bytes);
            at = start + bytes.len() as u64;
            tensors.push(TensorHeader { dtype: dtype.to_owned(), shape, start, end: at });
            views.push((start, bytes));
        }
        layers.push(LayerHeader {
            signature: s.signature.to_string(),
            offset: s.offset,
            meta: s.meta.iter().copied().collect(),
            tensors,
        });
    }
    let header = Header {
        namespace: ns.to_owned(),
        tokens: tokens.to_vec(),
        trimmable,
        data_bytes: at,
        content_hash: format!("{hash:016x}"),
        layers,
    };
    let text = serde_json::to_vec(&header).map_err(|e| e.to_string())?;
    let tmp = dir.join(format!("{name}.{}", format::TMP_EXT));
    let done = dir.join(format!("{name}.{}", format::EXT));
    let io = |e: std::io::Error| format!("{}: {e}", tmp.display());
    // A fresh file, never an existing one: `create_new` does not follow a
    // link planted under the temp name, so nothing is written outside DIR.
    let _ = std::fs::remove_file(&tmp);
    let file = std::fs::File::options().write(true).create_new(true).open(&tmp).map_err(io)?;
    let mut f = std::io::BufWriter::with_capacity(1 << 20, file);
    f.write_all(&format::preamble(&text)).map_err(io)?;
    f.write_all(&text).map_err(io)?;
    let mut pos = 0u64;
    for (start, bytes) in views {
        f.write_all(&vec![0u8; (start - pos) as usize]).map_err(io)?;
        f.write_all(bytes).map_err(io)?;
        pos = start + bytes.len() as u64;
    }
    let f = f.into_inner().map_err(|e| io(e.into_error()))?;
    f.sync_all().map_err(io)?;
    drop(f);
    std::fs::rename(&tmp, &done).map_err(io)?;
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok((format::PREAMBLE + text.len()) as u64 + at)
}

/// A loaded entry: its header and one 1-row state per layer.
pub struct Loaded {
    pub header: Header,
    pub states: Vec<CacheState>,
}

/// Reads `<dir>/<name>.mlxkv`, checks its header and sizes (and its
/// content hash when `verify`), and makes MLX arrays of its tensors.
pub fn read_entry(dir: &Path, name: &str, verify: bool) -> Result<Loaded, Reject> {
    let path = dir.join(format!("{name}.{}", format::EXT));
    let mut f = std::fs::File::open(&path)?;
    let len = f.metadata()?.len();
    let header = format::read_header(&mut f, len, name)?;
    // u64 words: every tensor start (a multiple of 64) is aligned for its dtype.
    let mut words = vec![0u64; header.data_bytes.div_ceil(8) as usize];
    let data = unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr() as *mut u8, header.data_bytes as usize) };
    f.read_exact(data).map_err(|_| Reject::Bad("truncated data".into()))?;
    if verify && format!("{:016x}", format::fnv1a(format::FNV_OFFSET, data)) != header.content_hash {
        return Err(Reject::Bad("content hash mismatch".into()));
    }
    let mut states = Vec::with_capacity(header.layers.len());
    for l in &header.layers {
        let mut tensors = RVec::with_capacity(l.tensors.len());
        for t in &l.tensors {
            let (dtype, _) = format::dtype_of(&t.dtype).ok_or_else(|| Reject::Bad("unknown dtype".into()))?;
            let shape: Vec<i32> = t.shape.iter().map(|&d| d as i32).collect();
            let bytes = &data[t.start as usize..t.end as usize];
            let raw = unsafe {
                mlx_sys::mlx_array_new_data(bytes.as_ptr().cast(), shape.as_ptr(), shape.len() as i32, dtype)
            };
            if raw.ctx.is_null() {
                return Err(Reject::Bad("MLX refused a tensor".into()));
            }
            tensors.push(unsafe { Tensor::from_raw(raw) });
        }
        states.push(CacheState {
            signature: RString::from(l.signature.as_str()),
            offset: l.offset,
            tensors,
            meta: l.meta.iter().copied().collect(),
        });
    }
    Ok(Loaded { header, states })
}
