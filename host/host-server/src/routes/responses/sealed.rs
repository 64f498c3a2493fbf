//! A reasoning item's `encrypted_content`, as clients that keep no state
//! ask for it (`include: ["reasoning.encrypted_content"]`, e.g. Codex,
//! which sends reasoning back only in that form). OpenAI's is encrypted;
//! this one is the reasoning text itself, base64-encoded behind a version
//! tag, so that an item sent back gives the template its reasoning again.
//! Blobs without the tag (another server's) are not read.

const TAG: &str = "mlx-engine.reasoning.v1:";

pub fn seal(reasoning: &str) -> String {
    format!("{TAG}{}", base64::encode(reasoning.as_bytes()))
}

/// The reasoning text of a blob `seal` made; None for any other.
pub fn unseal(blob: &str) -> Option<String> {
    let bytes = base64::decode(blob.strip_prefix(TAG)?).ok()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_text_opens_and_foreign_blobs_do_not() {
        let text = "Look it up: é🦀\n";
        assert_eq!(unseal(&seal(text)).as_deref(), Some(text));
        assert_eq!(unseal("gAAAAABo-opaque"), None);
        assert_eq!(unseal(&format!("{TAG}not base64!")), None);
    }
}
