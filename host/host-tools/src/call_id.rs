//! Tool-call ids: `call_` and 24 letters or digits, never repeated within a
//! process. Clients match `tool` messages to calls by id, so uniqueness is
//! what matters; unpredictability is not, hence no random-number crate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// A new id, distinct from every other this process has made.
pub fn new_call_id() -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // mix() is a bijection, so distinct counters give distinct first words;
    // the per-process seed keeps ids from two runs of the server apart.
    let first = mix(seed().wrapping_add(n.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    let second = mix(first ^ seed().rotate_left(29));
    let mut id = String::with_capacity(29);
    id.push_str("call_");
    // 62^11 > 2^64: the first eleven characters carry `first` whole.
    push_base62(&mut id, first, 11);
    push_base62(&mut id, second, 13);
    id
}

fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    *SEED.get_or_init(|| {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        mix(nanos ^ (u64::from(std::process::id()) << 32))
    })
}

/// SplitMix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn push_base62(out: &mut String, mut v: u64, digits: usize) {
    for _ in 0..digits {
        out.push(ALPHABET[(v % 62) as usize] as char);
        v /= 62;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn shape_and_uniqueness() {
        let ids: Vec<String> = (0..10_000).map(|_| new_call_id()).collect();
        for id in &ids {
            assert_eq!(id.len(), 29, "{id}");
            assert!(id.starts_with("call_"));
            assert!(id[5..].bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
        }
        assert_eq!(ids.iter().collect::<HashSet<_>>().len(), ids.len());
    }
}
