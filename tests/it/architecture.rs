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
/// (from `#[cfg(test)]` to the end of a file) may use such names as data,
/// and comments as explanation (a tool-call syntax's doc says which
/// templates write it); code may not.
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
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap()
            .lines()
            .map(|l| l.split("//").next().unwrap_or_default().to_lowercase() + "\n")
            .collect();
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

/// The string literals of Rust source `code` (normal, raw and byte
/// strings; comments, char literals and lifetimes skipped).
fn string_literals(code: &str) -> Vec<String> {
    let c: Vec<char> = code.chars().collect();
    let (mut out, mut i) = (Vec::new(), 0);
    while i < c.len() {
        match c[i] {
            '/' if c.get(i + 1) == Some(&'/') => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if c.get(i + 1) == Some(&'*') => {
                i += 2;
                while i + 1 < c.len() && !(c[i] == '*' && c[i + 1] == '/') {
                    i += 1;
                }
                i += 2;
            }
            '\'' => {
                // A char literal ('x', '\n', '"'), or a lifetime ('a).
                if c.get(i + 1) == Some(&'\\') {
                    i += 2;
                    while i < c.len() && c[i] != '\'' {
                        i += 1;
                    }
                    i += 1;
                } else if c.get(i + 2) == Some(&'\'') {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            'r' if (c.get(i + 1) == Some(&'"') || c.get(i + 1) == Some(&'#'))
                && (i == 0 || !(c[i - 1].is_alphanumeric() || c[i - 1] == '_')) =>
            {
                let mut j = i + 1;
                let mut hashes = 0;
                while c.get(j) == Some(&'#') {
                    hashes += 1;
                    j += 1;
                }
                if c.get(j) != Some(&'"') {
                    i += 1;
                    continue;
                }
                let start = j + 1;
                let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                let rest: String = c[start..].iter().collect();
                let end = rest.find(&close).map_or(c.len(), |e| start + rest[..e].chars().count());
                out.push(c[start..end.min(c.len())].iter().collect());
                i = end + 1 + hashes;
            }
            '"' => {
                let mut s = String::new();
                i += 1;
                while i < c.len() && c[i] != '"' {
                    if c[i] == '\\' {
                        i += 1;
                    }
                    if i < c.len() {
                        s.push(c[i]);
                    }
                    i += 1;
                }
                out.push(s);
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

#[test]
fn string_literals_are_found_past_comments_chars_and_raw_strings() {
    let code = r####"let a = "one"; // "not" "this"
        let b = r#"two "quoted""#; let q = '"'; fn f<'a>(x: &'a str) {} /* "nor" */ let e = "th\"ree";"####;
    assert_eq!(string_literals(code), ["one", "two \"quoted\"", "th\"ree"]);
}

/// Architecture Invariant, the literal side: no string in the host's code
/// (outside test modules) names a model family, an architecture, a draft
/// kind, or a plugin: not only those the in-tree plugins claim, but any
/// architecture-shaped name (`*ForCausalLM`, `*Model`, ...) and the
/// families and draft kinds the field knows. Behaviour that depends on such
/// a name belongs in the plugin that claims it.
#[test]
fn no_string_in_host_code_names_a_family_an_architecture_or_a_draft_kind() {
    let report: serde_json::Value = serde_json::from_str(&run_ok(
        std::process::Command::new(host_bin())
            .args(["plugins", "--json", "--plugins"])
            .arg(repo_root().join("plugins")),
    ))
    .unwrap();
    let mut names: Vec<String> = [
        "llama",
        "mistral",
        "mixtral",
        "qwen",
        "qwen2",
        "qwen3",
        "qwen3_5",
        "gemma",
        "gemma2",
        "gemma3",
        "gemma4",
        "phi",
        "phi3",
        "deepseek",
        "smollm",
        "smollm3",
        "falcon",
        "gpt2",
        "mamba",
        "olmo",
        "granite",
        "ngram",
        "two-model",
        "mtp",
        "dspark",
        "deepspec",
        "dflash",
        "eagle",
        "medusa",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut kinds: Vec<String> = vec!["assistant".into()];
    for p in report["plugins"].as_array().unwrap() {
        names.push(p["name"].as_str().unwrap().to_owned());
        for key in ["model_types", "architectures"] {
            names.extend(p["claims"][key].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_owned()));
        }
        // Draft kinds may be plain words: a literal that IS a kind names it,
        // except in the HTTP layer and the tool-calling crate, whose wire
        // vocabulary has the chat role "assistant".
        if let Some(list) = p["claims"]["draft_kinds"].as_array() {
            kinds.extend(list.iter().map(|v| v.as_str().unwrap().to_lowercase()));
        }
    }
    // The one allowed mention: `--ngram-max`/`--ngram-min`, kept as aliases
    // of `--draft-option ngram-max=N` for users of the old flags; the host
    // passes them on as options and knows nothing of what they mean.
    let allowed = |file: &str, lit: &str| file.ends_with("host-cli/src/draft_cmd.rs") && lit.starts_with("ngram-m");
    let arch_shaped = |lit: &str| {
        let ident = lit.chars().all(|c| c.is_ascii_alphanumeric()) && lit.starts_with(|c: char| c.is_ascii_uppercase());
        ident
            && ["ForCausalLM", "LMHeadModel", "ForConditionalGeneration", "Model"]
                .iter()
                .any(|suffix| lit.ends_with(suffix) && lit.len() > suffix.len())
    };
    let mut files = Vec::new();
    rust_files(&repo_root().join("host"), &mut files);
    let mut hits = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        let file = f.strip_prefix(repo_root()).unwrap().display().to_string();
        for lit in string_literals(code) {
            let lower = lit.to_lowercase();
            let named = names.iter().map(|n| n.to_lowercase()).find(|n| {
                lower.match_indices(n.as_str()).any(|(i, _)| {
                    let before = lower[..i].chars().next_back();
                    let after = lower[i + n.len()..].chars().next();
                    let ident = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
                    !ident(before) && !ident(after)
                })
            });
            if arch_shaped(&lit) {
                hits.push(format!("{file}: \"{lit}\" is an architecture name"));
            } else if kinds.contains(&lower)
                && !file.starts_with("host/host-server/")
                && !file.starts_with("host/host-tools/")
                && !allowed(&file, &lit)
            {
                hits.push(format!("{file}: \"{lit}\" is a draft kind"));
            } else if let Some(n) = named.filter(|_| !allowed(&file, &lit)) {
                hits.push(format!("{file}: \"{lit}\" names `{n}`"));
            }
        }
    }
    assert!(hits.is_empty(), "host code names families, architectures or draft kinds:\n{}", hits.join("\n"));
}

/// Architecture Invariant: CI runs no GPU, so a crate that makes a CUDA
/// kernel of its own compiles it in a test (`model_kit::kernel_check`,
/// docs/ARCHITECTURE.md "Where new things go: A CUDA kernel").
#[test]
fn every_crate_with_a_cuda_kernel_has_a_compile_test() {
    let mut with_kernels = 0;
    for group in ["plugin-api", "plugins", "host"] {
        for e in std::fs::read_dir(repo_root().join(group)).unwrap() {
            let krate = e.unwrap().path();
            if !krate.join("Cargo.toml").exists() {
                continue;
            }
            let mut files = Vec::new();
            rust_files(&krate.join("src"), &mut files);
            let texts: Vec<String> = files.iter().map(|f| std::fs::read_to_string(f).unwrap()).collect();
            let makes =
                texts.iter().any(|t| t.contains("CudaKernel::new(") || t.contains("CudaKernel::new_contiguous("));
            let compiles = texts.iter().any(|t| t.contains("launches(") && t.contains("assert_compiles("));
            if makes && !krate.ends_with("model-kit") {
                with_kernels += 1;
            }
            assert!(!makes || compiles, "{} makes a CUDA kernel and has no compile test", krate.display());
        }
    }
    assert!(with_kernels >= 3, "the scan found the kernel crates ({with_kernels})");
}
