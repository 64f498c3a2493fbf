//! Drafter `draft-ngram` (kind `ngram`): prompt lookup. The longest
//! trailing k-gram of the history (k from `ngram-max` down to `ngram-min`)
//! that occurred earlier proposes the tokens that followed its most recent
//! earlier occurrence. No artifact, no model, no probabilities: never
//! detected, only asked for (`--draft-kind ngram`), and never combined with a
//! draft model.
//!
//! Drafting ahead, it cannot read the target's lazy `pending` token, so it
//! guesses it: it continues its own copy one token further (the guess)
//! and proposes what follows the guess. A wrong guess only costs
//! acceptance: the host verifies against the real token. Implemented, but
//! `caps::DRAFT_AHEAD` is not advertised: on the H200 pipelined rounds
//! measured no better than rounds one at a time, and worse where rounds
//! get voided (docs/benchmarks.md); `--draft-ahead on` asks for them.

use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::abi_stable::std_types::{ROption, RSlice};
use plugin_api::*;
use plugin_sdk::{guard, rstrings};

plugin_sdk::export_plugin! {
    manifest: manifest,
    detect_draft: detect,
    open_drafter: open,
}

fn manifest() -> PluginManifest {
    plugin_sdk::manifest!(
        PluginKind::DRAFTER,
        "prompt lookup over the request's own tokens",
        Claims { draft_kinds: rstrings(&["ngram"]), ..Default::default() },
        &[caps::HISTORY_ONLY, "default-depth:10"],
    )
}

/// Never claims an artifact: n-gram drafting is only ever asked for.
fn detect(_dir: &str, _config: &str) -> u32 {
    0
}

fn option(args: &DrafterOpenArgs, key: &str, default: usize) -> Result<usize, PluginError> {
    match args.options.iter().find(|kv| kv.0.as_str() == key) {
        None => Ok(default),
        Some(kv) => {
            kv.1.as_str().parse::<usize>().ok().filter(|v| (1..=16).contains(v)).ok_or_else(|| {
                PluginError::invalid_input(format!("{key} must be an integer in 1..=16, got `{}`", kv.1))
            })
        }
    }
}

fn open(args: &DrafterOpenArgs, _host: HostServicesBox) -> Result<DrafterBox, PluginError> {
    if args.dir.is_some() {
        return Err(PluginError::invalid_input("the ngram drafter takes no draft model"));
    }
    let max = option(args, "ngram-max", 3)?;
    let min = option(args, "ngram-min", 1)?;
    if min > max {
        return Err(PluginError::invalid_input(format!("ngram-min {min} exceeds ngram-max {max}")));
    }
    Ok(Drafter_TO::from_value(Ngram { max, min, depth: args.max_depth.max(1) as usize }, TD_Opaque))
}

struct Ngram {
    max: usize,
    min: usize,
    depth: usize,
}

/// The tokens after the most recent earlier occurrence of the longest
/// trailing k-gram of `h`. The copy may run into the tail itself (as in
/// LZ77): a history that cycles with period p keeps proposing the cycle, not
/// just the p tokens before the end.
fn lookup(h: &[u32], max: usize, min: usize, n: usize) -> Vec<u32> {
    for k in (min..=max).rev() {
        if h.len() <= k {
            continue;
        }
        let tail = &h[h.len() - k..];
        // Latest earlier start, excluding the tail itself.
        if let Some(start) = (0..h.len() - k).rev().find(|&s| &h[s..s + k] == tail) {
            let mut out = Vec::with_capacity(n);
            let mut i = start + k;
            while out.len() < n {
                out.push(if i < h.len() { h[i] } else { out[i - h.len()] });
                i += 1;
            }
            return out;
        }
    }
    Vec::new()
}

impl Drafter for Ngram {
    fn prefill(&mut self, _prompt: RSlice<'_, u32>) -> PResult<()> {
        PResult::ROk(())
    }

    fn draft(&mut self, args: DraftArgs<'_>) -> PResult<Draft> {
        guard(|| {
            let n = (args.max_tokens as usize).min(self.depth);
            let tokens = lookup(args.history.as_slice(), self.max, self.min, n);
            Ok(Draft { tokens: tokens.into_iter().collect(), probabilities: ROption::RNone })
        })
    }

    fn commit(&mut self, _accepted: u32) -> PResult<()> {
        PResult::ROk(())
    }
}

#[cfg(test)]
mod tests {
    use super::lookup;

    #[test]
    fn proposes_what_followed_the_latest_earlier_match() {
        // Trailing 3-gram [1, 2, 3] occurred at 0 and 5; the latest is at 5.
        let h = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 4, 1, 2, 3];
        assert_eq!(lookup(&h, 3, 1, 3), vec![7, 8, 4]);
        // Falls back to shorter n-grams; a copy that reaches the end of the
        // history continues with what it copied (a cycle keeps cycling).
        assert_eq!(lookup(&[5, 6, 7, 6], 3, 1, 4), vec![7, 6, 7, 6]);
        assert_eq!(lookup(&[9, 9, 9], 3, 1, 5), vec![9, 9, 9, 9, 9]);
        assert_eq!(lookup(&[1, 2, 3], 3, 1, 4), Vec::<u32>::new());
        assert_eq!(lookup(&[4, 4], 3, 2, 4), Vec::<u32>::new());
    }
}
