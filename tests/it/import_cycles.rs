//! Architecture Invariant: no source file imports in a circle, in any crate
//! of the workspace (docs/ARCHITECTURE.md). A file's imports are the
//! modules its `crate::`, `super::` and `self::` paths name, an item a
//! `mod.rs` re-exports counted as the file that defines it; a `mod x;`
//! declaration is not an import. Test modules (from `#[cfg(test)] mod
//! tests` to the end of a file) and comments do not count.

use it::repo_root;
use regex::Regex;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn crates(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if !p.is_dir() || name.starts_with('.') || ["target", "node_modules"].contains(&name.as_str()) {
            continue;
        }
        if p.join("Cargo.toml").is_file() && p.join("src").is_dir() {
            out.push(p.join("src"));
        }
        crates(&p, out);
    }
}

/// Every file of one crate's `src`, by module path (`lib.rs` and `main.rs`
/// the root, `x/mod.rs` the module `x`), its code without tests or comments.
fn modules(src: &Path) -> BTreeMap<Module, String> {
    let mut files = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    files
        .into_iter()
        .map(|p| {
            let rel = p.strip_prefix(src).unwrap().with_extension("");
            let mut m: Module = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
            if ["mod", "lib", "main"].contains(&m.last().unwrap().as_str()) {
                m.pop();
            }
            (m, code_only(&std::fs::read_to_string(&p).unwrap()))
        })
        .collect()
}

/// A file's text without its test module and comments.
fn code_only(text: &str) -> String {
    let tests = Regex::new(r"(?s)#\[cfg\(test\)\]\s*mod tests\s*\{.*").unwrap();
    let comments = Regex::new(r"//[^\n]*").unwrap();
    comments.replace_all(&tests.replace(text, ""), "").into_owned()
}

/// Each module's imports of other modules of its crate.
fn imports(files: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let reexport = Regex::new(r"pub(?:\([^)]*\))?\s+use\s+(?:self::)?(\w+)::(\{[^}]*\}|\w+|\*)\s*;").unwrap();
    let item = Regex::new(r"pub(?:\([^)]*\))?\s+(?:struct|enum|union|trait|type|fn|const|static)\s+(\w+)").unwrap();
    let path = Regex::new(r"\b(crate|super|self)((?:::\w+)+)(::\{[^}]*\})?").unwrap();
    let group = Regex::new(r"\b(crate|super|self)::(\{[^}]*\}|\*)").unwrap();
    // A path that starts at a child module (`child::item` in its parent).
    let bare = Regex::new(r"(?:^|[^:\w])(\w+)::(\w+|\{[^}]*\}|\*)").unwrap();
    let word = Regex::new(r"\w+").unwrap();
    // A module's re-exported names -> the child module that defines them
    // (`pub use child::*` re-exports every public item the child defines).
    let mut reexported: BTreeMap<Module, BTreeMap<String, Module>> = BTreeMap::new();
    for (m, code) in files {
        for c in reexport.captures_iter(code) {
            let child: Module = m.iter().cloned().chain([c[1].to_owned()]).collect();
            let Some(child_code) = files.get(&child) else { continue };
            let names: Vec<String> = if &c[2] == "*" {
                item.captures_iter(child_code).map(|i| i[1].to_owned()).collect()
            } else {
                word.find_iter(&c[2]).map(|n| n.as_str().to_owned()).collect()
            };
            for n in names {
                reexported.entry(m.clone()).or_default().insert(n, child.clone());
            }
        }
    }
    // The file a path names: its longest prefix that is a file, or the
    // child that defines the item it names when that file re-exports it.
    let resolve = |p: &[String]| -> Option<Module> {
        (0..=p.len()).rev().find_map(|n| {
            let m = p[..n].to_vec();
            files
                .contains_key(&m)
                .then(|| p.get(n).and_then(|next| reexported.get(&m).and_then(|r| r.get(next))).cloned().unwrap_or(m))
        })
    };
    let mut edges = BTreeMap::new();
    for (m, code) in files {
        let parent: Module = m[..m.len().saturating_sub(1)].to_vec();
        let base = |head: &str| -> Module {
            match head {
                "crate" => vec![],
                "self" => m.clone(),
                _ => parent.clone(),
            }
        };
        let mut to: BTreeSet<Module> = BTreeSet::new();
        let mut add = |mut b: Module, rest: Vec<String>| {
            let mut rest = rest.as_slice();
            while rest.first().is_some_and(|s| s == "super") {
                b.pop();
                rest = &rest[1..];
            }
            b.extend(rest.iter().cloned());
            if let Some(t) = resolve(&b).filter(|t| t != m) {
                to.insert(t);
            }
        };
        for c in path.captures_iter(code) {
            let rest: Vec<String> = c[2].split("::").filter(|s| !s.is_empty()).map(str::to_owned).collect();
            add(base(&c[1]), rest.clone());
            if let Some(items) = c.get(3) {
                for n in word.find_iter(items.as_str()) {
                    add(base(&c[1]), rest.iter().cloned().chain([n.as_str().to_owned()]).collect());
                }
            }
        }
        for c in group.captures_iter(code) {
            if &c[2] == "*" {
                add(base(&c[1]), vec![]);
            }
            for n in word.find_iter(&c[2]) {
                add(base(&c[1]), vec![n.as_str().to_owned()]);
            }
        }
        for c in bare.captures_iter(code) {
            let child: Module = m.iter().cloned().chain([c[1].to_owned()]).collect();
            if files.contains_key(&child) {
                add(m.clone(), vec![c[1].to_owned()]);
                for n in word.find_iter(&c[2]) {
                    add(m.clone(), vec![c[1].to_owned(), n.as_str().to_owned()]);
                }
            }
        }
        edges.insert(m.clone(), to);
    }
    edges
}

/// One circle of imports, as the modules along it, if there is any.
fn a_circle(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    fn visit(
        m: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        done: &mut BTreeSet<Module>,
        path: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        if let Some(i) = path.iter().position(|p| p == m) {
            return Some(path[i..].iter().cloned().chain([m.clone()]).collect());
        }
        if done.contains(m) {
            return None;
        }
        path.push(m.clone());
        for n in &edges[m] {
            if let Some(c) = visit(n, edges, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(m.clone());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|m| visit(m, edges, &mut done, &mut Vec::new()))
}

fn name(m: &Module) -> String {
    if m.is_empty() {
        "(root)".into()
    } else {
        m.join("/")
    }
}

#[test]
fn no_source_file_imports_in_a_circle() {
    let mut srcs = Vec::new();
    crates(&repo_root(), &mut srcs);
    assert!(srcs.len() > 20, "found only {} crates", srcs.len());
    let mut circles = Vec::new();
    for src in &srcs {
        if let Some(c) = a_circle(&imports(&modules(src))) {
            let crate_dir = src.parent().unwrap().strip_prefix(repo_root()).unwrap().display().to_string();
            circles.push(format!("{crate_dir}: {}", c.iter().map(name).collect::<Vec<_>>().join(" -> ")));
        }
    }
    assert!(circles.is_empty(), "files that import in a circle:\n{}", circles.join("\n"));
}

#[test]
fn the_circle_check_finds_a_circle_through_a_reexport() {
    let files: BTreeMap<Module, String> = [
        (vec![], "mod a;\nmod b;\npub use a::Thing;\n".to_owned()),
        (vec!["a".to_owned()], "use crate::b::other;\npub struct Thing;\n".to_owned()),
        (vec!["b".to_owned()], "use crate::Thing;\npub fn other() {}\n".to_owned()),
    ]
    .into();
    let c = a_circle(&imports(&files)).expect("a -> b -> a through the root's re-export");
    assert_eq!(c.iter().map(name).collect::<Vec<_>>(), ["a", "b", "a"]);
    let files: BTreeMap<Module, String> = [
        (vec![], "mod a;\nmod b;\n".to_owned()),
        (vec!["a".to_owned()], "use crate::b::other;\n".to_owned()),
        (
            vec!["b".to_owned()],
            "pub fn other() {}\n// use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n".to_owned(),
        ),
    ]
    .into_iter()
    .map(|(m, text)| (m, code_only(&text)))
    .collect();
    assert_eq!(a_circle(&imports(&files)), None);
}

#[test]
fn the_circle_check_follows_paths_from_a_parent_and_glob_reexports() {
    let m = |p: &[&str]| -> Module { p.iter().map(|s| s.to_string()).collect() };
    // A parent naming its child by a bare path, the child importing the parent.
    let files: BTreeMap<Module, String> = [
        (m(&[]), "mod api;\n".to_owned()),
        (m(&["api"]), "mod reply;\nuse reply::Meta;\npub struct Keep;\n".to_owned()),
        (m(&["api", "reply"]), "use super::Keep;\npub struct Meta;\n".to_owned()),
    ]
    .into();
    let c = a_circle(&imports(&files)).expect("api -> api/reply -> api");
    assert_eq!(c.len(), 3, "{c:?}");
    // A glob re-export at the root, and a glob import of a parent.
    let files: BTreeMap<Module, String> = [
        (m(&[]), "pub mod a;\npub mod b;\npub use a::*;\n".to_owned()),
        (m(&["a"]), "use crate::b::other;\npub struct Thing;\n".to_owned()),
        (m(&["b"]), "use crate::Thing;\npub fn other() {}\n".to_owned()),
    ]
    .into();
    assert!(a_circle(&imports(&files)).is_some(), "a -> b -> a through `pub use a::*`");
    let files: BTreeMap<Module, String> = [
        (m(&["x"]), "mod y;\nuse y::f;\npub struct S;\n".to_owned()),
        (m(&["x", "y"]), "use super::*;\npub fn f() {}\n".to_owned()),
    ]
    .into();
    assert!(a_circle(&imports(&files)).is_some(), "x -> x/y -> x through `use super::*`");
}
