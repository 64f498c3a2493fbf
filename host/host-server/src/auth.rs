//! The API key check (`--api-key`).

use axum::extract::Request;

/// Whether the request carries `key`, as OpenAI's clients send it
/// (`Authorization: Bearer`) or as Anthropic's do (`x-api-key`).
pub(crate) fn has_key(req: &Request, key: &str) -> bool {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let bearer = header("authorization").and_then(|v| v.strip_prefix("Bearer ")).is_some_and(|k| same(k.trim(), key));
    // Both headers are checked, whatever the first says: the time taken
    // does not depend on which one matched.
    let x_api_key = header("x-api-key").is_some_and(|k| same(k.trim(), key));
    bearer | x_api_key
}

/// `a == b` in a time that depends on their lengths only, not on where
/// they first differ (a key guessed byte by byte learns nothing from the
/// answer's timing).
fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(std::hint::black_box(x ^ y));
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::same;

    #[test]
    fn equal_only_when_every_byte_and_the_length_agree() {
        assert!(same("sk-secret", "sk-secret"));
        assert!(same("", ""));
        for other in ["sk-secreT", "sk-secre", "sk-secret\0", "", "Sk-secret", "sk-secret-longer"] {
            assert!(!same(other, "sk-secret"), "{other:?}");
            assert!(!same("sk-secret", other), "{other:?}");
        }
    }
}
