//! The family's own model options (`--model-option KEY=VALUE`), taken out
//! of the open arguments before model-kit reads its own:
//! - `delta=kernel|ops`: `kernel` (the default) runs the DeltaNet's q/k
//!   norms, gates and recurrence through `delta_kernel` and its gated norm
//!   through `gated_norm` on a GPU; `ops` keeps the ops route
//!   there too, mlx-lm's on CUDA, for parity checks and A/B runs. The CPU
//!   always runs the ops route.
//! - `rollback=states|replay`: `states` (the default) hands a recurrent
//!   layout that asks for them the states after each position of a
//!   speculative verify, so a rejected draft is rolled back without running
//!   the kept tokens again; `replay` hands none, so the host replays them
//!   (what a graph without position states gets), for parity checks and A/B
//!   runs.
//!
//! A value other than these is refused, naming it; the last one given wins.

use model_kit::{error, Result};

pub const KEYS: [&str; 2] = ["delta", "rollback"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Whether a GPU takes `delta_kernel` and `gated_norm`.
    pub kernel: bool,
    /// Whether a speculative verify hands its position states.
    pub position_states: bool,
}

impl Options {
    /// The options given (taken out with model-kit's `take_options(KEYS)`).
    pub fn parse(given: &[(String, String)]) -> Result<Self> {
        let mut o = Options { kernel: true, position_states: true };
        for (key, value) in given {
            match (key.as_str(), value.as_str()) {
                ("delta", "kernel") => o.kernel = true,
                ("delta", "ops") => o.kernel = false,
                ("rollback", "states") => o.position_states = true,
                ("rollback", "replay") => o.position_states = false,
                ("delta", _) => return Err(refused(key, value, "delta=kernel or delta=ops")),
                _ => return Err(refused(key, value, "rollback=states or rollback=replay")),
            }
        }
        Ok(o)
    }
}

fn refused(key: &str, value: &str, takes: &str) -> model_kit::Exception {
    error(format!("model option `{key}={value}`: the qwen3_5 family takes {takes}"))
}

#[cfg(test)]
mod tests {
    use super::Options;

    fn opts(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn the_options_pick_the_routes_and_refuse_other_values() {
        assert_eq!(Options::parse(&[]).unwrap(), Options { kernel: true, position_states: true });
        let o = Options::parse(&opts(&[("delta", "ops"), ("rollback", "replay")])).unwrap();
        assert_eq!(o, Options { kernel: false, position_states: false });
        assert!(Options::parse(&opts(&[("delta", "ops"), ("delta", "kernel")])).unwrap().kernel);
        let e = Options::parse(&opts(&[("delta", "fast")])).unwrap_err();
        assert!(e.what().contains("`delta=fast`") && e.what().contains("delta=kernel or delta=ops"), "{}", e.what());
        let e = Options::parse(&opts(&[("rollback", "never")])).unwrap_err();
        assert!(e.what().contains("`rollback=never`") && e.what().contains("rollback=states"), "{}", e.what());
    }
}
