//! Fill-in-the-middle for `/v1/completions` with `suffix`: a model trained
//! for it marks the text before and after the hole with special tokens and
//! writes the middle after a third one. Which tokens a model has is read
//! from its tokenizer's added tokens, never from its family.

/// The three markers, in PSM order (prefix, suffix, middle).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FimTokens {
    pub prefix: u32,
    pub suffix: u32,
    pub middle: u32,
}

/// Marker spellings, (prefix, suffix, middle): Qwen2.5-Coder and
/// CodeGemma-style pipes, StarCoder/SantaCoder-style angles, DeepSeek-Coder's
/// begin/hole/end (whose prompt is the same PSM sequence).
const SPELLINGS: [[&str; 3]; 3] = [
    ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"],
    ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"],
    ["<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"],
];

/// What `suffix` needs, for the 400 a tokenizer without it gets.
pub const NEEDS: &str = "`suffix` needs a tokenizer with fill-in-the-middle tokens \
    (<|fim_prefix|> <|fim_suffix|> <|fim_middle|>, or <fim_prefix> <fim_suffix> <fim_middle>), \
    and this model's has none";

impl FimTokens {
    /// The first spelling whose three markers are all among `added`
    /// (id, text, special).
    pub fn find(added: &[(u32, String, bool)]) -> Option<Self> {
        let id = |text: &str| added.iter().find(|(_, t, _)| t == text).map(|(id, _, _)| *id);
        SPELLINGS.iter().find_map(|[p, s, m]| Some(Self { prefix: id(p)?, suffix: id(s)?, middle: id(m)? }))
    }

    /// `[bos] <prefix> prefix <suffix> suffix <middle>`: the model writes
    /// the middle next.
    pub fn arrange(&self, bos: Option<u32>, prefix: &[u32], suffix: &[u32]) -> Vec<u32> {
        let mut out = Vec::with_capacity(prefix.len() + suffix.len() + 4);
        out.extend(bos);
        out.push(self.prefix);
        out.extend_from_slice(prefix);
        out.push(self.suffix);
        out.extend_from_slice(suffix);
        out.push(self.middle);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn added(names: &[&str]) -> Vec<(u32, String, bool)> {
        names.iter().enumerate().map(|(i, n)| (100 + i as u32, n.to_string(), true)).collect()
    }

    #[test]
    fn markers_are_found_by_their_spelling() {
        let qwen = added(&["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>"]);
        assert_eq!(FimTokens::find(&qwen), Some(FimTokens { prefix: 101, suffix: 103, middle: 102 }));
        let starcoder = added(&["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>"]);
        assert_eq!(FimTokens::find(&starcoder), Some(FimTokens { prefix: 100, suffix: 102, middle: 101 }));
    }

    #[test]
    fn an_incomplete_set_is_no_fim() {
        assert_eq!(FimTokens::find(&added(&["<|im_start|>", "<|im_end|>"])), None);
        assert_eq!(FimTokens::find(&added(&["<fim_prefix>", "<fim_suffix>"])), None);
    }

    #[test]
    fn the_prompt_is_prefix_suffix_middle() {
        let t = FimTokens { prefix: 1, suffix: 2, middle: 3 };
        assert_eq!(t.arrange(None, &[10, 11], &[20]), vec![1, 10, 11, 2, 20, 3]);
        assert_eq!(t.arrange(Some(9), &[10], &[]), vec![9, 1, 10, 2, 3]);
    }
}
