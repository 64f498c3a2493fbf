//! The on-disk form of one prefix-cache entry (docs/ARCHITECTURE.md,
//! "SSD prefix tier").
//!
//! ```text
//! 0..8    magic  b"MLXKVSSD"
//! 8..12   u32 LE format version (1)
//! 12..16  u32 LE 0 (reserved)
//! 16..24  u64 LE H: header length in bytes
//! 24..32  u64 LE FNV-1a 64 of the header bytes (always checked)
//! 32..    header: H bytes of UTF-8 JSON (`Header`)
//! then    data: `Header::data_bytes` bytes; each tensor's bytes sit at
//!         `start..end` of it (row-major, starts aligned to 64 bytes)
//! ```
//! The file is exactly `32 + H + data_bytes` long. `Header::content_hash`
//! is the FNV-1a 64 of the data section, checked on load with
//! `--ssd-cache-verify`. FNV-1a is written here by hand: no cryptographic
//! hash is in the workspace's dependencies, and the hashes guard against
//! torn or flipped bytes, not against an adversary (a file in the cache
//! directory is trusted to the extent its owner's directory is).

use serde::{Deserialize, Serialize};

pub const MAGIC: &[u8; 8] = b"MLXKVSSD";
pub const VERSION: u32 = 1;
pub const PREAMBLE: usize = 32;
/// A header larger than this is not ours (a 1M-token prompt's ids take ~8 MiB as JSON).
pub const MAX_HEADER: u64 = 64 << 20;
/// Tensor starts in the data section are multiples of this.
pub const ALIGN: u64 = 64;
/// Entry files are `<32 hex digits>.mlxkv`; writes go to `<name>.tmp` first.
pub const EXT: &str = "mlxkv";
pub const TMP_EXT: &str = "tmp";

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// The engine's prefix-cache namespace (model, dtype, layouts, ...).
    pub namespace: String,
    /// The token ids the state holds, in order.
    pub tokens: Vec<u32>,
    /// Whether every layout could trim the state when it was stored.
    pub trimmable: bool,
    pub data_bytes: u64,
    /// FNV-1a 64 of the data section, 16 hex digits.
    pub content_hash: String,
    /// One per layer, in layer order.
    pub layers: Vec<LayerHeader>,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct LayerHeader {
    pub signature: String,
    pub offset: u64,
    pub meta: Vec<u64>,
    pub tensors: Vec<TensorHeader>,
}

#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct TensorHeader {
    pub dtype: String,
    pub shape: Vec<i64>,
    pub start: u64,
    pub end: u64,
}

/// FNV-1a 64, continued from `h` (start from `FNV_OFFSET`).
pub fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The file stem of an entry: 128 bits from two FNV-1a 64 passes (the
/// second with a different start) over the namespace, a 0xff separator
/// and the token ids (LE). A collision only overwrites an entry: the
/// header's namespace and tokens are compared on every load.
pub fn entry_name(ns: &str, tokens: &[u32]) -> String {
    let feed = |start: u64| {
        let mut h = fnv1a(start, ns.as_bytes());
        h = fnv1a(h, &[0xff]);
        for t in tokens {
            h = fnv1a(h, &t.to_le_bytes());
        }
        h
    };
    format!("{:016x}{:016x}", feed(FNV_OFFSET), feed(FNV_OFFSET ^ 0x9e37_79b9_7f4a_7c15))
}

/// Whether `stem` has the shape of an entry name (32 lowercase hex digits).
pub fn is_entry_stem(stem: &str) -> bool {
    stem.len() == 32 && stem.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Dtype names in the header, by MLX dtype, with their element sizes.
const DTYPES: &[(mlx_sys::mlx_dtype, &str, usize)] = &[
    (mlx_sys::mlx_dtype__MLX_BOOL, "bool", 1),
    (mlx_sys::mlx_dtype__MLX_UINT8, "uint8", 1),
    (mlx_sys::mlx_dtype__MLX_UINT16, "uint16", 2),
    (mlx_sys::mlx_dtype__MLX_UINT32, "uint32", 4),
    (mlx_sys::mlx_dtype__MLX_UINT64, "uint64", 8),
    (mlx_sys::mlx_dtype__MLX_INT8, "int8", 1),
    (mlx_sys::mlx_dtype__MLX_INT16, "int16", 2),
    (mlx_sys::mlx_dtype__MLX_INT32, "int32", 4),
    (mlx_sys::mlx_dtype__MLX_INT64, "int64", 8),
    (mlx_sys::mlx_dtype__MLX_FLOAT16, "float16", 2),
    (mlx_sys::mlx_dtype__MLX_FLOAT32, "float32", 4),
    (mlx_sys::mlx_dtype__MLX_FLOAT64, "float64", 8),
    (mlx_sys::mlx_dtype__MLX_BFLOAT16, "bfloat16", 2),
    (mlx_sys::mlx_dtype__MLX_COMPLEX64, "complex64", 8),
];

pub fn dtype_name(d: mlx_sys::mlx_dtype) -> Option<&'static str> {
    DTYPES.iter().find(|(x, _, _)| *x == d).map(|(_, n, _)| *n)
}

/// The MLX dtype and element size of a header dtype name.
pub fn dtype_of(name: &str) -> Option<(mlx_sys::mlx_dtype, usize)> {
    DTYPES.iter().find(|(_, n, _)| *n == name).map(|(d, _, s)| (*d, *s))
}

/// The fixed preamble for a header of `header` bytes.
pub fn preamble(header: &[u8]) -> [u8; PREAMBLE] {
    let mut p = [0u8; PREAMBLE];
    p[..8].copy_from_slice(MAGIC);
    p[8..12].copy_from_slice(&VERSION.to_le_bytes());
    p[16..24].copy_from_slice(&(header.len() as u64).to_le_bytes());
    p[24..32].copy_from_slice(&fnv1a(FNV_OFFSET, header).to_le_bytes());
    p
}

/// Why a file is not a usable entry.
#[derive(Debug, thiserror::Error)]
pub enum Reject {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Bad(String),
}

fn bad(why: impl Into<String>) -> Reject {
    Reject::Bad(why.into())
}

/// Reads and checks the preamble and header of an entry file of
/// `file_len` bytes whose stem is `stem`: magic, version, header hash and
/// JSON, the name (hash of namespace and tokens), and that every size adds
/// up. Leaves `r` at the start of the data section.
pub fn read_header(r: &mut impl std::io::Read, file_len: u64, stem: &str) -> Result<Header, Reject> {
    let mut p = [0u8; PREAMBLE];
    r.read_exact(&mut p).map_err(|_| bad("shorter than the preamble"))?;
    if &p[..8] != MAGIC {
        return Err(bad("wrong magic"));
    }
    let version = u32::from_le_bytes(p[8..12].try_into().unwrap());
    if version != VERSION {
        return Err(bad(format!("format version {version}, expected {VERSION}")));
    }
    let h_len = u64::from_le_bytes(p[16..24].try_into().unwrap());
    if h_len > MAX_HEADER || PREAMBLE as u64 + h_len > file_len {
        return Err(bad("header length past the end of the file"));
    }
    let mut text = vec![0u8; h_len as usize];
    r.read_exact(&mut text).map_err(|_| bad("truncated header"))?;
    if fnv1a(FNV_OFFSET, &text) != u64::from_le_bytes(p[24..32].try_into().unwrap()) {
        return Err(bad("header hash mismatch"));
    }
    let h: Header = serde_json::from_slice(&text).map_err(|e| bad(format!("header JSON: {e}")))?;
    if entry_name(&h.namespace, &h.tokens) != stem {
        return Err(bad("the name is not the hash of the header's namespace and tokens"));
    }
    if PREAMBLE as u64 + h_len + h.data_bytes != file_len {
        return Err(bad(format!("{file_len} bytes, the header says {}", PREAMBLE as u64 + h_len + h.data_bytes)));
    }
    check_layout(&h)?;
    Ok(h)
}

/// Every tensor's range lies inside the data section, fits its dtype and
/// shape exactly, and every layer holds the header's token count.
fn check_layout(h: &Header) -> Result<(), Reject> {
    if h.tokens.is_empty() || h.layers.is_empty() {
        return Err(bad("no tokens or no layers"));
    }
    for l in &h.layers {
        if l.offset != h.tokens.len() as u64 {
            return Err(bad("a layer's offset differs from the token count"));
        }
        for t in &l.tensors {
            let (_, size) = dtype_of(&t.dtype).ok_or_else(|| bad(format!("unknown dtype {}", t.dtype)))?;
            let elems = t.shape.iter().try_fold(1u64, |n, &d| {
                u64::try_from(d).ok().filter(|&d| d <= i32::MAX as u64).and_then(|d| n.checked_mul(d))
            });
            let want = elems.and_then(|n| n.checked_mul(size as u64)).ok_or_else(|| bad("bad shape"))?;
            if t.start % ALIGN != 0 || t.end < t.start || t.end - t.start != want || t.end > h.data_bytes {
                return Err(bad("a tensor's byte range does not fit its shape or the data section"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        let tokens = vec![1, 2, 3];
        Header {
            namespace: "ns".into(),
            tokens,
            trimmable: true,
            data_bytes: 64 + 24,
            content_hash: "0".repeat(16),
            layers: vec![LayerHeader {
                signature: "kv".into(),
                offset: 3,
                meta: vec![],
                tensors: vec![
                    TensorHeader { dtype: "float32".into(), shape: vec![1, 3], start: 0, end: 12 },
                    TensorHeader { dtype: "float32".into(), shape: vec![2, 3], start: 64, end: 88 },
                ],
            }],
        }
    }

    fn file(h: &Header) -> Vec<u8> {
        let text = serde_json::to_vec(h).unwrap();
        let mut f = preamble(&text).to_vec();
        f.extend_from_slice(&text);
        f.extend(std::iter::repeat_n(0u8, h.data_bytes as usize));
        f
    }

    fn read(f: &[u8], stem: &str) -> Result<Header, Reject> {
        read_header(&mut &f[..], f.len() as u64, stem)
    }

    #[test]
    fn fnv1a_matches_the_published_vectors() {
        assert_eq!(fnv1a(FNV_OFFSET, b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a(FNV_OFFSET, b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a(FNV_OFFSET, b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn a_well_formed_header_reads_back() {
        let h = header();
        let stem = entry_name("ns", &h.tokens);
        assert!(is_entry_stem(&stem));
        let got = read(&file(&h), &stem).unwrap();
        assert_eq!(got.tokens, h.tokens);
    }

    #[test]
    fn damaged_headers_are_refused() {
        let h = header();
        let stem = entry_name("ns", &h.tokens);
        let good = file(&h);
        // Truncated anywhere.
        for cut in [0, 10, 40, good.len() - 1] {
            assert!(read(&good[..cut], &stem).is_err(), "cut at {cut}");
        }
        // A flipped byte in the preamble or the header.
        for at in [0, 9, 17, 26, 40] {
            let mut f = good.clone();
            f[at] ^= 0x10;
            assert!(read(&f, &stem).is_err(), "flip at {at}");
        }
        // Another name (another namespace or tokens).
        assert!(read(&good, &entry_name("other", &h.tokens)).is_err());
        // Sizes that do not add up, with a valid header hash.
        let mut h2 = header();
        h2.layers[0].tensors[1].end = 90;
        assert!(read(&file(&h2), &stem).is_err());
        let mut h3 = header();
        h3.layers[0].offset = 2;
        assert!(read(&file(&h3), &stem).is_err());
    }
}
