//! `host plugins`: every plugin found, with what it claims and can do, and
//! the one-line reason for each refused one. The exit status says whether
//! the folder loaded whole: 0 when nothing was refused, [`REFUSED`] when
//! something was (after the full listing), 1 when it could not be scanned.

use host_loader::Registry;
use serde_json::{json, Value};
use std::process::ExitCode;

/// The exit status of a listing with at least one refusal. Refusal is the
/// default failure, not behind a flag: the command exists to say whether a
/// plugins folder is usable, and a script or deploy check that runs it must
/// not read "some plugins were skipped" as success. A status of its own, so
/// a script tells it from 1 (no listing at all: the folder is unreadable).
pub const REFUSED: u8 = 2;

pub fn exit_code(reg: &Registry) -> ExitCode {
    if reg.refused.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(REFUSED)
    }
}

fn strings(v: &plugin_api::abi_stable::std_types::RVec<plugin_api::abi_stable::std_types::RString>) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

pub fn report(reg: &Registry) -> Value {
    let loaded: Vec<Value> = reg
        .plugins
        .iter()
        .map(|p| {
            let m = &p.manifest;
            let c = &m.claims;
            json!({
                "name": m.name.as_str(),
                "kind": m.kind.as_str(),
                "version": m.version.as_str(),
                "abi_version": m.abi_version,
                "dir": p.dir.display().to_string(),
                "description": m.description.as_str(),
                "claims": {
                    "model_types": strings(&c.model_types),
                    "architectures": strings(&c.architectures),
                    "draft_kinds": strings(&c.draft_kinds),
                    "cache_needs": strings(&c.cache_needs),
                    "cache_schemes": strings(&c.cache_schemes),
                },
                "capabilities": strings(&m.capabilities),
            })
        })
        .collect();
    let refused: Vec<Value> = reg
        .refused
        .iter()
        .map(|r| json!({ "dir": r.dir.display().to_string(), "name": r.name, "reason": r.reason }))
        .collect();
    json!({ "abi_version": plugin_api::ABI_VERSION, "plugin_api": host_loader::registry::plugin_api_version(), "plugins": loaded, "refused": refused })
}

pub fn print_text(reg: &Registry) {
    println!("plugin ABI v{} (plugin-api {})", plugin_api::ABI_VERSION, host_loader::registry::plugin_api_version());
    for p in &reg.plugins {
        let m = &p.manifest;
        let c = &m.claims;
        println!(
            "{:<16} {:<13} v{:<8} abi {}  {}",
            m.name.as_str(),
            m.kind.as_str(),
            m.version.as_str(),
            m.abi_version,
            m.description.as_str()
        );
        for (label, list) in [
            ("model types", &c.model_types),
            ("architectures", &c.architectures),
            ("draft kinds", &c.draft_kinds),
            ("cache needs", &c.cache_needs),
            ("cache schemes", &c.cache_schemes),
            ("capabilities", &m.capabilities),
        ] {
            if !list.is_empty() {
                println!("    {label:<14} {}", strings(list).join(", "));
            }
        }
    }
    for r in &reg.refused {
        println!("REFUSED {} ({}): {}", r.name.as_deref().unwrap_or("?"), r.dir.display(), r.reason);
    }
}
