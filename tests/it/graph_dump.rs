//! The graph dump diagnostic (`MLX_ENGINE_DUMP_GRAPHS`): each serial plain
//! step's lazy graph written as DOT just before MLX evaluates it, and
//! `tests/bench/graph_census.py` counting its nodes by primitive.

use it::{host_bin, model, python, repo_root};
use std::collections::BTreeMap;

/// Node labels of one DOT file, counted.
fn primitives(dot: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for rest in dot.split("[label =\"").skip(1) {
        let label = rest.split('"').next().unwrap();
        if rest[label.len()..].starts_with("\", shape=rectangle]") {
            *counts.entry(label.to_string()).or_insert(0) += 1;
        }
    }
    counts
}

#[test]
fn each_plain_steps_graph_is_written_as_dot_and_counted_by_primitive() {
    let dir = std::env::temp_dir().join(format!("graph-dump-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = std::process::Command::new(host_bin())
        .current_dir(repo_root())
        .env("MLX_ENGINE_DUMP_GRAPHS", &dir)
        .args(["generate", "--model"])
        .arg(model("tiny/tiny-llama-f32"))
        .args(["--prompt-ids", "1,2,3", "--max-tokens", "6", "--ignore-eos", "--json"])
        .output()
        .unwrap();
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let graphs: Vec<_> = files.iter().map(|f| primitives(&std::fs::read_to_string(f).unwrap())).collect();
    let census = python().arg("tests/bench/graph_census.py").args(&files).current_dir(repo_root()).output().unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The prefill leaves the prompt's last token pending: each of the 6
    // tokens is drawn by a plain step.
    let names: Vec<_> = files.iter().map(|f| f.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names, (0..6).map(|n| format!("{n:05}_step.dot")).collect::<Vec<_>>());
    // Every step builds the same graph. On the CPU the layers before the
    // last are evaluated one at a time, so what is left for the step's
    // eval is the last layer's matmuls, the head and the sampler's
    // log-softmax and greedy argmax.
    assert!(graphs.iter().all(|g| g == &graphs[0]), "{graphs:?}");
    for p in ["Matmul", "ArgReduce", "LogSumExp"] {
        assert!(graphs[0].contains_key(p), "{p} missing from {:?}", graphs[0]);
    }
    let nodes: usize = graphs[0].values().sum();
    let said = String::from_utf8_lossy(&census.stdout);
    assert!(census.status.success(), "{}", String::from_utf8_lossy(&census.stderr));
    assert!(said.starts_with(&format!("6 graphs, primitives per graph: median {nodes}")), "{said}");
    assert!(said.contains("ArgReduce"), "{said}");
}
