//! Architecture invariants that are absences (docs/ARCHITECTURE.md).

use it::{host_bin, repo_root, run_ok};

fn rust_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Architecture Invariant: the host never names a model family, a plugin,
/// or a model type a plugin claims. It composes by claims and capabilities,
/// so adding a family is one plugin crate and no host edit. Test modules
/// (from `#[cfg(test)]` to the end of a file) may use such names as data.
#[test]
fn no_host_source_names_a_family_or_a_plugin() {
    let report: serde_json::Value = serde_json::from_str(&run_ok(
        std::process::Command::new(host_bin())
            .args(["plugins", "--json", "--plugins"])
            .arg(repo_root().join("plugins")),
    ))
    .unwrap();
    let mut names: Vec<String> = Vec::new();
    for p in report["plugins"].as_array().unwrap() {
        names.push(p["name"].as_str().unwrap().to_owned());
        for key in ["model_types", "architectures"] {
            names.extend(p["claims"][key].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()));
        }
    }
    assert!(names.len() >= 5, "expected the in-tree plugins' claims: {names:?}");
    let mut files = Vec::new();
    rust_files(&repo_root().join("host"), &mut files);
    assert!(files.len() > 10);
    let mut hits = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap().to_lowercase();
        for n in &names {
            let n = n.to_lowercase();
            // Whole identifiers only: `llama` must not match inside other words.
            let found = code.match_indices(&n).any(|(i, _)| {
                let before = code[..i].chars().next_back();
                let after = code[i + n.len()..].chars().next();
                let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                !ident(before) && !ident(after)
            });
            if found {
                hits.push(format!("{} names `{n}`", f.strip_prefix(repo_root()).unwrap().display()));
            }
        }
    }
    assert!(hits.is_empty(), "host code names families or plugins:\n{}", hits.join("\n"));
}
