//! The plugin ABI from a third party's side: plugins built OUTSIDE this
//! workspace (tests/out-of-tree/toy-plugins, against plugin-api, plugin-sdk
//! and model-kit only) load into the release `host`, compose with the
//! in-tree `kv-plain` layout by claims, generate exactly the tokens their
//! weights predict, and draft; and every way a plugin can be broken is
//! refused with a one-line reason while the other plugins keep loading.
//!
//! The out-of-tree project is built once per test binary (debug profile,
//! into `target/out-of-tree`), one variant after the other, and each
//! variant's library is kept under `target/out-of-tree/variants/<variant>/`.

use host_loader::Registry;
use it::{host_bin, repo_root};
use mlx_rs::Array;
use plugin_api::abi_stable::sabi_trait::TD_Opaque;
use plugin_api::abi_stable::std_types::{ROption, RSlice, RStr, RString, RVec};
use plugin_api::*;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

// ---------------------------------------------------------------------------
// Building the out-of-tree project

/// The feature variants of toy-family built besides the plain one (`good`).
const VARIANTS: [&str; 6] = ["skew-abi-version", "panic-in-init", "forward-error", "skew-layout", "twin", "faults"];

fn project() -> PathBuf {
    repo_root().join("tests/out-of-tree/toy-plugins")
}

fn cargo_build(target: &Path, extra: &[&str]) -> Result<(), String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(&cargo)
        .current_dir(project())
        .args(["build", "--target-dir"])
        .arg(target)
        .args(extra)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cargo.to_string_lossy()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(40).collect();
        return Err(format!(
            "`cargo build {}` in {} failed:\n{}",
            extra.join(" "),
            project().display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        ));
    }
    Ok(())
}

/// Keeps a copy of a freshly built library (a new file: the next build
/// rewrites the one in `debug/`).
fn keep(from: &Path, to_dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to_dir).map_err(|e| e.to_string())?;
    let to = to_dir.join(from.file_name().unwrap());
    let _ = std::fs::remove_file(&to);
    std::fs::copy(from, &to).map(|_| ()).map_err(|e| format!("copying {}: {e}", from.display()))
}

fn build_all() -> Result<PathBuf, String> {
    let target = repo_root().join("target/out-of-tree");
    let variants = target.join("variants");
    let debug = target.join("debug");
    cargo_build(&target, &[])?;
    keep(&debug.join("libtoy_family.so"), &variants.join("good"))?;
    keep(&debug.join("libtoy_drafter.so"), &variants.join("good"))?;
    for v in VARIANTS {
        cargo_build(&target, &["-p", "toy-family", "--features", v])?;
        keep(&debug.join("libtoy_family.so"), &variants.join(v))?;
    }
    cargo_build(&target, &["-p", "toy-drafter", "--features", "faults"])?;
    keep(&debug.join("libtoy_drafter.so"), &variants.join("faults"))?;
    cargo_build(&target, &["-p", "toy-layout", "--features", "faults"])?;
    keep(&debug.join("libtoy_layout.so"), &variants.join("faults"))?;
    Ok(variants)
}

/// `target/out-of-tree/variants`, built once for all tests (serialised).
fn variants() -> &'static Path {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BUILT.get_or_init(build_all) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// A built library: `variant` is `good` or one of [`VARIANTS`].
fn lib(variant: &str, file: &str) -> PathBuf {
    let p = variants().join(variant).join(file);
    assert!(p.exists(), "{} was not built", p.display());
    p
}

// ---------------------------------------------------------------------------
// Plugin folders

/// A fresh scratch folder under cargo's target tmp dir (`name` may be a path).
fn scratch(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugins-it").join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn plugin_toml(name: &str, kind: &str, abi: u32, library: &str) -> String {
    format!("name = \"{name}\"\nversion = \"0.1.0\"\nkind = \"{kind}\"\nabi_version = {abi}\nlibrary = \"{library}\"\n")
}

/// A hard link where possible (the libraries are ~10 MB), else a copy.
fn place(lib: &Path, folder: &Path) {
    let to = folder.join(lib.file_name().unwrap());
    if std::fs::hard_link(lib, &to).is_err() {
        std::fs::copy(lib, &to).unwrap();
    }
}

struct Plugins(PathBuf);

impl Plugins {
    fn new(test: &str) -> Self {
        Plugins(scratch(&format!("{test}/plugins")))
    }

    /// A plugin folder with the given plugin.toml text and library.
    fn add(self, folder: &str, toml: &str, lib: Option<&Path>) -> Self {
        let d = self.0.join(folder);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("plugin.toml"), toml).unwrap();
        if let Some(l) = lib {
            place(l, &d);
        }
        self
    }

    /// The in-tree `kv-plain` folder as `cargo xtask build` left it.
    fn kv_plain(self) -> Self {
        let src = repo_root().join("plugins/kv-plain");
        let so = src.join("libkv_plain.so");
        assert!(so.exists(), "{} is missing: run `cargo xtask build`", so.display());
        let toml = std::fs::read_to_string(src.join("plugin.toml")).unwrap();
        self.add("kv-plain", &toml, Some(&so))
    }

    /// toy-family built with `variant`, in folder `folder`, named as that variant names itself.
    fn family(self, folder: &str, variant: &str) -> Self {
        let name = if variant == "twin" { "toy-family-twin" } else { "toy-family" };
        let abi = if variant == "skew-abi-version" { ABI_VERSION + 1 } else { ABI_VERSION };
        let toml = plugin_toml(name, "model-family", abi, "libtoy_family.so");
        self.add(folder, &toml, Some(&lib(variant, "libtoy_family.so")))
    }

    fn drafter(self) -> Self {
        self.drafter_variant("good")
    }

    /// toy-layout (the out-of-tree cache layout) built with `variant`: `faults`.
    fn layout_variant(self, variant: &str) -> Self {
        let toml = plugin_toml("toy-layout", "cache-layout", ABI_VERSION, "libtoy_layout.so");
        self.add("toy-layout", &toml, Some(&lib(variant, "libtoy_layout.so")))
    }

    /// toy-drafter built with `variant` (`good` or `faults`).
    fn drafter_variant(self, variant: &str) -> Self {
        let toml = plugin_toml("toy-drafter", "drafter", ABI_VERSION, "libtoy_drafter.so");
        self.add("toy-drafter", &toml, Some(&lib(variant, "libtoy_drafter.so")))
    }
}

// ---------------------------------------------------------------------------
// The toy model: a bigram chain t -> (5t + 3) mod 32

const V: usize = 32;
const H: usize = 16;

fn next(t: u32) -> u32 {
    (5 * t + 3) % V as u32
}

/// The greedy continuation of `prompt` for `n` tokens.
fn chain(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut t = *prompt.last().unwrap();
    (0..n)
        .map(|_| {
            t = next(t);
            t
        })
        .collect()
}

/// Row `t` of the embedding: the 32 rows are the 16 rows of a Sylvester
/// Hadamard matrix and their negatives, scaled to unit length, so
/// `e_t . e_s` is exactly 1 (s = t), -1 (s = -t) or 0: no near ties.
fn embedding_row(t: usize) -> Vec<f32> {
    let sign = if t < H { 1.0 } else { -1.0 };
    (0..H).map(|j| sign * if ((t % H) & j).count_ones().is_multiple_of(2) { 0.25 } else { -0.25 }).collect()
}

/// safetensors by hand: u64 header length, JSON header, little-endian data.
fn write_safetensors(path: &Path, tensors: &[(&str, [usize; 2], Vec<f32>)]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, shape, values) in tensors {
        assert_eq!(values.len(), shape[0] * shape[1]);
        let start = data.len();
        data.extend(values.iter().flat_map(|v| v.to_le_bytes()));
        header.insert(name.to_string(), json!({ "dtype": "F32", "shape": shape, "data_offsets": [start, data.len()] }));
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend(h);
    bytes.extend(data);
    std::fs::write(path, bytes).unwrap();
}

/// A model folder of the toy family (config.json + model.safetensors).
fn toy_model(test: &str) -> PathBuf {
    let d = scratch(&format!("{test}/toy-model"));
    let config = json!({
        "model_type": "toy-bigram",
        "architectures": ["ToyBigramForCausalLM"],
        "vocab_size": V,
        "hidden_size": H,
        "torch_dtype": "float32",
    });
    std::fs::write(d.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let embed: Vec<f32> = (0..V).flat_map(embedding_row).collect();
    // head[next(t)] = e_t, so logits(t)[j] = e_t . head[j] peaks (at 1) at j = next(t).
    let mut head = vec![0.0f32; V * H];
    for t in 0..V {
        let j = next(t as u32) as usize;
        head[j * H..(j + 1) * H].copy_from_slice(&embedding_row(t));
    }
    write_safetensors(&d.join("model.safetensors"), &[("embed.weight", [V, H], embed), ("head.weight", [V, H], head)]);
    d
}

// ---------------------------------------------------------------------------
// Running the host

fn host(args: &[&str]) -> Output {
    Command::new(host_bin()).args(args).output().expect("run host")
}

/// `host plugins --plugins DIR --json`: the whole report whatever it refuses,
/// with exit status 0 when nothing was refused and 2 when something was.
fn list(p: &Plugins) -> Value {
    let out = host(&["plugins", "--plugins", p.0.to_str().unwrap(), "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("host plugins --json prints JSON ({e}; {}): {stderr}", out.status));
    let refused = !report["refused"].as_array().unwrap().is_empty();
    assert_eq!(out.status.code(), Some(if refused { 2 } else { 0 }), "{}: {report:#}\n{stderr}", out.status);
    report
}

fn loaded_names(report: &Value) -> Vec<String> {
    report["plugins"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap().to_owned()).collect()
}

fn plugin<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("`{name}` is not loaded: {report:#}"))
}

/// The one refusal of folder `folder`; its reason must be one line.
fn refusal(report: &Value, folder: &str) -> (Option<String>, String) {
    let refused = report["refused"].as_array().unwrap();
    let r = refused
        .iter()
        .find(|r| Path::new(r["dir"].as_str().unwrap()).file_name().unwrap() == folder)
        .unwrap_or_else(|| panic!("folder `{folder}` was not refused: {report:#}"));
    let reason = r["reason"].as_str().unwrap().to_owned();
    assert!(!reason.contains('\n') && !reason.is_empty(), "a refusal reason is one line: {reason:?}");
    (r["name"].as_str().map(str::to_owned), reason)
}

fn generate(p: &Plugins, model: &Path, prompt: &[u32], n: usize, dtype: &str) -> Output {
    let ids = prompt.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
    host(&[
        "generate",
        "--plugins",
        p.0.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        &ids,
        "--max-tokens",
        &n.to_string(),
        "--json",
        "--ignore-eos",
        "--dtype",
        dtype,
    ])
}

fn generated(out: &Output) -> Value {
    assert!(out.status.success(), "host generate failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("host generate --json prints JSON")
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect()
}

fn host_info() -> HostInfo {
    HostInfo { abi_version: ABI_VERSION, host_version: "it".into(), mlx_version: "test".into() }
}

// ---------------------------------------------------------------------------
// The third-party plugins work

#[test]
fn out_of_tree_plugins_are_listed_with_kind_version_abi_claims_and_capabilities() {
    let p = Plugins::new("listed").kv_plain().family("toy-family", "good").drafter();
    let r = list(&p);
    assert_eq!(r["refused"], json!([]), "{r:#}");
    let mut names = loaded_names(&r);
    names.sort();
    assert_eq!(names, ["kv-plain", "toy-drafter", "toy-family"]);

    let f = plugin(&r, "toy-family");
    assert_eq!(f["kind"], "model-family");
    assert_eq!(f["version"], "0.1.0");
    assert_eq!(f["abi_version"], ABI_VERSION);
    assert_eq!(strings(&f["claims"]["model_types"]), ["toy-bigram"]);
    assert_eq!(strings(&f["claims"]["architectures"]), ["ToyBigramForCausalLM"]);
    assert_eq!(strings(&f["claims"]["draft_kinds"]), Vec::<&str>::new());
    assert_eq!(strings(&f["capabilities"]), [caps::SHARED_EMBEDDINGS, caps::HIDDEN_TAPS]);

    let d = plugin(&r, "toy-drafter");
    assert_eq!(d["kind"], "drafter");
    assert_eq!(d["version"], "0.1.0");
    assert_eq!(d["abi_version"], ABI_VERSION);
    assert_eq!(strings(&d["claims"]["draft_kinds"]), ["toy-repeat"]);
    assert_eq!(strings(&d["claims"]["model_types"]), Vec::<&str>::new());
    assert_eq!(strings(&d["capabilities"]), [caps::NEEDS_DRAFT_MODEL]);
}

#[test]
fn out_of_tree_family_composed_with_kv_plain_generates_the_predicted_chain() {
    let p = Plugins::new("generate").kv_plain().family("toy-family", "good").drafter();
    let model = toy_model("generate");

    let prompt = [1, 2, 3];
    let out = generated(&generate(&p, &model, &prompt, 8, "native"));
    assert_eq!(out["family_plugin"], "toy-family");
    assert_eq!(out["cache_layouts"], json!(["kv-plain"]));
    assert_eq!(out["compute_dtype"], "float32");
    assert_eq!(out["finish_reason"], "length");
    assert_eq!(out["tokens"], json!(chain(&prompt, 8)));

    // A prompt longer than one cache growth step (256): prefill of L > 1
    // (causal mask), growth of the layout's storage, then decode steps; the
    // hidden state the graph projects is read back from the cache each time.
    let long: Vec<u32> = (0..300u32).map(|i| (i * 7 + 1) % V as u32).collect();
    let out = generated(&generate(&p, &model, &long, 20, "native"));
    assert_eq!(out["tokens"], json!(chain(&long, 20)));

    // A compute dtype other than the checkpoint's (the weights are exact in bf16).
    let out = generated(&generate(&p, &model, &prompt, 5, "bfloat16"));
    assert_eq!(out["compute_dtype"], "bfloat16");
    assert_eq!(out["tokens"], json!(chain(&prompt, 5)));
}

fn tensor_ref(a: &Array) -> TensorRef<'_> {
    unsafe { TensorRef::from_raw(a.as_ptr()) }
}

fn owned(t: Tensor) -> Array {
    unsafe { Array::from_ptr(t.into_raw()) }
}

fn argmax_rows(logits: &Array) -> Vec<u32> {
    let v = *logits.shape().last().unwrap();
    let flat = logits.reshape(&[-1, v]).unwrap().as_dtype(mlx_rs::Dtype::Float32).unwrap();
    flat.eval().unwrap();
    let rows = flat
        .as_slice::<f32>()
        .chunks(v as usize)
        .map(|r| r.iter().enumerate().fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b }).0 as u32);
    rows.collect()
}

#[test]
fn out_of_tree_family_honours_logits_modes_hidden_and_its_cache_in_process() {
    let _mlx = it::mlx_exclusive();
    let p = Plugins::new("modes").kv_plain().family("toy-family", "good");
    let model = toy_model("modes");
    let reg = Registry::discover(&p.0, &host_info()).unwrap();
    assert!(reg.refused.is_empty(), "{:?}", reg.refused);
    let m = reg.open_model(&model, None, "plain", &[]).unwrap();
    assert_eq!((m.family_plugin.as_str(), m.layouts.as_slice()), ("toy-family", ["kv-plain".to_owned()].as_slice()));
    assert_eq!((m.plan.vocab_size, m.plan.hidden_size, m.plan.layers.len()), (V as u32, H as u32, 1));
    let need = &m.plan.layers[0];
    assert_eq!((need.kind, need.kv_heads, need.k_head_dim, need.v_head_dim), (NeedKind::FULL, 1, H as u32, H as u32));
    let mut caches = m.new_caches(1).unwrap();

    let run = |ids: &[i32], logits: LogitsMode, want_hidden: bool, taps: &[u32], caches: &mut Vec<CacheBox>| {
        let tokens = Array::from_slice(ids, &[1, ids.len() as i32]);
        let args = ForwardArgs { tokens: tensor_ref(&tokens), logits, want_hidden, taps: RSlice::from_slice(taps) };
        m.graph.forward(args, caches.as_mut_slice().into()).into_result()
    };

    // Prefill as the host does it: no logits, the hidden state.
    let out = run(&[4, 9, 30], LogitsMode::NONE, true, &[], &mut caches).unwrap();
    assert!(out.logits.is_none() && out.taps.is_empty());
    let h = owned(out.hidden.unwrap());
    assert_eq!(h.shape(), [1, 3, H as i32]);
    let e4 = Array::from_slice(&embedding_row(4), &[H as i32]);
    let first = {
        use mlx_rs::ops::indexing::IndexOp;
        h.index((0, 0))
    };
    assert!(
        first.all_close(&e4, None, None, None).unwrap(),
        "the hidden state read back from the cache is the embedding"
    );
    assert_eq!(caches[0].offset(), 3);

    // Every position's logits (speculative verification), no hidden.
    let out = run(&[10, 11], LogitsMode::ALL, false, &[], &mut caches).unwrap();
    assert!(out.hidden.is_none());
    let l = owned(out.logits.unwrap());
    assert_eq!(l.shape(), [1, 2, V as i32]);
    assert_eq!(argmax_rows(&l), [next(10), next(11)]);

    // The last position only (decode).
    let out = run(&[12, 13, 14], LogitsMode::LAST, false, &[], &mut caches).unwrap();
    let l = owned(out.logits.unwrap());
    assert_eq!(l.shape(), [1, 1, V as i32]);
    assert_eq!(argmax_rows(&l), [next(14)]);
    assert_eq!(caches[0].offset(), 8, "every forward appended through the layout");

    // Its one layer can be tapped (the hidden state itself); past it, refused.
    let out = run(&[20, 21], LogitsMode::NONE, true, &[0, 0], &mut caches).unwrap();
    let h = owned(out.hidden.unwrap());
    let taps: Vec<Array> = out.taps.into_iter().map(owned).collect();
    assert_eq!(taps.len(), 2);
    for t in &taps {
        assert_eq!(t.shape(), h.shape());
        assert!(t.all_close(&h, 0.0, 0.0, None).unwrap(), "tap 0 is the hidden state");
    }
    let err = run(&[1], LogitsMode::LAST, false, &[1], &mut caches).err().expect("a tap past the layers is refused");
    assert_eq!(err.code, ErrorCode::INVALID_INPUT, "{err}");
    assert!(err.message.contains("tap at layer 1, the model has 1 layer"), "{err}");
    let err = run(&[1], LogitsMode(7), false, &[], &mut caches).err().expect("an unknown mode is refused");
    assert_eq!(err.code, ErrorCode::UNSUPPORTED, "{err}");
    assert!(err.message.contains("logits mode 7"), "{err}");
    // A wrong number of caches is an error value, not a crash.
    let mut none: Vec<CacheBox> = Vec::new();
    let err = run(&[1], LogitsMode::LAST, false, &[], &mut none).err().expect("no caches is refused");
    assert_eq!(err.code, ErrorCode::INVALID_INPUT, "{err}");
    assert!(err.message.contains("0 caches given for 1 layer"), "{err}");
    assert_eq!(caches[0].offset(), 10, "the tapped forward appended 2, refused calls nothing");

    // embed and lm_head (shared-embeddings) agree with forward.
    let ids = Array::from_slice(&[0i32, 17, 31], &[1, 3]);
    let e = owned(m.graph.embed(tensor_ref(&ids)).into_result().unwrap());
    assert_eq!(e.shape(), [1, 3, H as i32]);
    let l = owned(m.graph.lm_head(tensor_ref(&e)).into_result().unwrap());
    assert_eq!(argmax_rows(&l), [next(0), next(17), next(31)]);
}

/// The target services a drafter is lent; toy-repeat needs none of them.
struct NoTarget;

impl HostServices for NoTarget {
    fn open_model(&self, _dir: RStr<'_>) -> PResult<ModelInstance> {
        PResult::RErr(PluginError::unsupported("not lent in this test"))
    }
    fn target_embed(&self, _tokens: TensorRef<'_>) -> PResult<Tensor> {
        PResult::RErr(PluginError::unsupported("not lent in this test"))
    }
    fn target_lm_head(&self, _hidden: TensorRef<'_>) -> PResult<Tensor> {
        PResult::RErr(PluginError::unsupported("not lent in this test"))
    }
}

fn open_args(kind: &str, config: Option<&str>, max_depth: u32) -> DrafterOpenArgs {
    DrafterOpenArgs {
        kind: kind.into(),
        dir: ROption::RNone,
        config_json: match config {
            Some(c) => ROption::RSome(RString::from(c)),
            None => ROption::RNone,
        },
        max_depth,
        options: RVec::new(),
    }
}

#[test]
fn out_of_tree_drafter_detects_opens_and_drafts_through_the_registry() {
    let _mlx = it::mlx_exclusive();
    let p = Plugins::new("drafter").kv_plain().drafter();
    let reg = Registry::discover(&p.0, &host_info()).unwrap();
    assert!(reg.refused.is_empty(), "{:?}", reg.refused);
    assert_eq!(
        reg.claims().get(&("draft kind".to_owned(), "toy-repeat".to_owned())).map(String::as_str),
        Some("toy-drafter")
    );
    let d = reg.by_name("toy-drafter").expect("toy-drafter loaded");
    assert_eq!(d.kind(), PluginKind::DRAFTER);
    assert!(d.root.plan_model().is_none() && d.root.open_model().is_none() && d.root.new_cache().is_none());

    let detect = d.root.detect_draft().expect("detect_draft entry");
    let mine = r#"{"model_type": "toy-repeat-draft"}"#;
    let dir = RStr::from_str("/some/draft");
    assert!(detect(dir, RStr::from_str(mine)) > 0);
    assert_eq!(detect(dir, RStr::from_str(r#"{"model_type": "llama"}"#)), 0);
    assert_eq!(detect(dir, RStr::from_str("not json")), 0);
    assert_eq!(detect(dir, RStr::from_str("")), 0);

    let open = d.root.open_drafter().expect("open_drafter entry");
    let lend = || HostServices_TO::from_value(NoTarget, TD_Opaque);
    let mut drafter = open(&open_args("toy-repeat", Some(mine), 8), lend()).into_result().unwrap();
    drafter.prefill(RSlice::from_slice(&[5, 6, 7])).into_result().unwrap();
    let draft = |drafter: &mut DrafterBox, history: &[u32], max_tokens: u32| {
        let r = drafter
            .draft(DraftArgs { history: RSlice::from_slice(history), max_tokens, sampling: DraftSampling::GREEDY })
            .into_result()
            .unwrap();
        assert!(r.probabilities.is_none(), "toy-repeat has no probability rows");
        r.tokens.into_vec()
    };
    assert_eq!(draft(&mut drafter, &[5, 6, 7], 4), [7, 7, 7, 7]);
    drafter.commit(2).into_result().unwrap();
    // The token the target emitted arrives at the end of the next history.
    assert_eq!(draft(&mut drafter, &[5, 6, 7, 7, 7, 19], 3), [19, 19, 19]);
    assert!(drafter.commit(4).into_result().unwrap_err().message.contains("commit(4) after drafting 3"));
    assert_eq!(draft(&mut drafter, &[5, 6, 7, 7, 7, 19, 2], 50).len(), 8, "max_depth bounds a round");
    assert_eq!(draft(&mut drafter, &[], 4), Vec::<u32>::new(), "nothing to repeat: 0 = a plain step");

    let err = open(&open_args("ngram", None, 8), lend()).into_result().err().expect("another kind is refused");
    assert_eq!(err.code, ErrorCode::UNSUPPORTED);
    let err = open(&open_args("toy-repeat", Some(r#"{"model_type":"llama"}"#), 8), lend())
        .into_result()
        .err()
        .expect("another artifact is refused");
    assert_eq!(err.code, ErrorCode::INVALID_CONFIG);
    let err = open(&open_args("toy-repeat", None, 0), lend()).into_result().err().expect("max_depth 0 is refused");
    assert_eq!(err.code, ErrorCode::INVALID_INPUT);
}

// ---------------------------------------------------------------------------
// Broken plugins are refused; the others keep loading

/// The good plugins every negative folder also holds.
fn with_good(test: &str) -> Plugins {
    Plugins::new(test).kv_plain().drafter()
}

fn assert_good_still_load(r: &Value) {
    let names = loaded_names(r);
    assert!(names.contains(&"kv-plain".to_owned()) && names.contains(&"toy-drafter".to_owned()), "{r:#}");
}

#[test]
fn a_plugin_built_for_another_abi_version_is_refused_naming_both() {
    // Honest plugin.toml (the next ABI version): refused before the library is opened.
    // A plugin.toml that says this host's version over the same library: refused from its manifest.
    let lying = plugin_toml("toy-family", "model-family", ABI_VERSION, "libtoy_family.so");
    let p = with_good("abi-version").family("toy-family", "skew-abi-version").add(
        "toy-family-lying",
        &lying,
        Some(&lib("skew-abi-version", "libtoy_family.so")),
    );
    let r = list(&p);
    assert_good_still_load(&r);
    assert!(!loaded_names(&r).contains(&"toy-family".to_owned()));
    for folder in ["toy-family", "toy-family-lying"] {
        let (name, reason) = refusal(&r, folder);
        assert_eq!(name.as_deref(), Some("toy-family"));
        assert!(
            reason.contains(&format!("v{}", ABI_VERSION + 1)) && reason.contains(&format!("v{ABI_VERSION}")),
            "{folder}: {reason}"
        );
    }
    let (theirs, ours) = (ABI_VERSION + 1, ABI_VERSION);
    assert_eq!(refusal(&r, "toy-family").1, format!("built for plugin ABI v{theirs}; this host speaks v{ours}"));
    assert_eq!(
        refusal(&r, "toy-family-lying").1,
        format!("manifest declares plugin ABI v{theirs}; this host speaks v{ours}")
    );
}

#[test]
fn a_root_module_with_another_layout_is_refused_by_the_abi_layout_check() {
    let p = with_good("skew-layout").family("toy-family", "skew-layout");
    let r = list(&p);
    assert_good_still_load(&r);
    let (name, reason) = refusal(&r, "toy-family");
    // Refused by abi_stable's layout check, before any entry ran (the name
    // is plugin.toml's: the manifest was never read).
    assert_eq!(name.as_deref(), Some("toy-family"));
    assert!(
        // (plugin-api's major version is the ABI version.)
        reason.starts_with(&format!(
            "ABI layout mismatch: the plugin's boundary types differ from this host's plugin-api {ABI_VERSION}."
        )),
        "{reason}"
    );
    assert!(reason.contains("in `PluginRoot`"), "{reason}");
    assert!(reason.contains("unexpected field: expected `manifest`, found `build_flags`"), "{reason}");
}

#[test]
fn a_panic_in_init_is_refused_with_the_panic_message() {
    let p = with_good("panic-in-init").family("toy-family", "panic-in-init");
    let r = list(&p);
    assert_good_still_load(&r);
    let (name, reason) = refusal(&r, "toy-family");
    assert_eq!(name.as_deref(), Some("toy-family"));
    assert!(reason.starts_with("init failed: panic:"), "{reason}");
    assert!(reason.contains("toy-family refuses to start (built with feature panic-in-init)"), "{reason}");
}

#[test]
fn a_forward_error_fails_generate_with_the_plugins_message_without_a_crash() {
    let p = with_good("forward-error").family("toy-family", "forward-error");
    let r = list(&p);
    assert_eq!(r["refused"], json!([]), "{r:#}");
    assert_eq!(plugin(&r, "toy-family")["kind"], "model-family");

    let model = toy_model("forward-error");
    let out = generate(&p, &model, &[1, 2, 3], 4, "native");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // An error exit (status 1), not a signal (abort or segfault).
    assert_eq!(out.status.code(), Some(1), "{}: {stderr}", out.status);
    assert!(stderr.contains("toy-family forward failed on purpose (built with feature forward-error)"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));

    // `host bench` reports the failure instead of timings without it.
    let out = host(&[
        "bench",
        "--plugins",
        p.0.to_str().unwrap(),
        "--model",
        model.to_str().unwrap(),
        "--prompt-len",
        "8",
        "--gen-len",
        "4",
        "--batch",
        "2",
        "--trials",
        "1",
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{}: {stderr}", out.status);
    assert!(stderr.contains("benchmark requests failed") && stderr.contains("failed on purpose"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("tok/s"), "{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn a_corrupt_plugin_toml_is_refused_as_invalid() {
    let p = with_good("corrupt-toml").add(
        "garbage",
        "\u{1f}this is not = = toml [[\n\0",
        Some(&lib("good", "libtoy_family.so")),
    );
    let r = list(&p);
    assert_good_still_load(&r);
    let (name, reason) = refusal(&r, "garbage");
    assert_eq!(name, None, "nothing is known about a plugin whose manifest cannot be read");
    assert!(reason.starts_with("invalid plugin.toml:"), "{reason}");
}

#[test]
fn a_missing_library_is_refused() {
    let toml = plugin_toml("toy-family", "model-family", ABI_VERSION, "libtoy_family.so");
    let p = with_good("missing-lib").add("toy-family", &toml, None);
    let r = list(&p);
    assert_good_still_load(&r);
    let (name, reason) = refusal(&r, "toy-family");
    assert_eq!(name.as_deref(), Some("toy-family"));
    assert!(reason.starts_with("library ") && reason.contains("/toy-family/libtoy_family.so is missing"), "{reason}");
}

#[test]
fn a_second_plugin_claiming_the_same_model_type_is_refused_as_a_duplicate_claim() {
    // Folders load in name order: `a-…` first, so the twin is the second claimant.
    let p = with_good("duplicate-claim").family("a-toy-family", "good").family("b-toy-family-twin", "twin");
    let r = list(&p);
    assert_good_still_load(&r);
    assert!(loaded_names(&r).contains(&"toy-family".to_owned()));
    let (name, reason) = refusal(&r, "b-toy-family-twin");
    assert_eq!(name.as_deref(), Some("toy-family-twin"));
    assert_eq!(reason, "duplicate claim: model_type `toy-bigram` is already claimed by `toy-family`");

    // The first claimant serves the model.
    let model = toy_model("duplicate-claim");
    let out = generated(&generate(&p, &model, &[9], 3, "native"));
    assert_eq!(out["family_plugin"], "toy-family");
    assert_eq!(out["tokens"], json!(chain(&[9], 3)));
}

// ---------------------------------------------------------------------------
// What `host plugins` tells a script, and how long libraries stay

#[test]
fn host_plugins_exits_2_when_anything_was_refused_and_1_when_nothing_could_be_listed() {
    let plugins = |dir: &Path, json: bool| {
        let mut args = vec!["plugins", "--plugins", dir.to_str().unwrap()];
        args.extend(json.then_some("--json"));
        host(&args)
    };
    let all_load = with_good("status-all-load");
    for json in [false, true] {
        let out = plugins(&all_load.0, json);
        assert_eq!(out.status.code(), Some(0), "json {json}: {}", String::from_utf8_lossy(&out.stderr));
    }

    // The whole listing first, then the status.
    let one_refused = with_good("status-one-refused").add("garbage", "not = = toml", None);
    let text = plugins(&one_refused.0, false);
    let stdout = String::from_utf8_lossy(&text.stdout);
    assert_eq!(text.status.code(), Some(2), "{stdout}");
    assert!(stdout.contains("\nkv-plain ") && stdout.contains("\ntoy-drafter "), "{stdout}");
    assert!(stdout.contains("REFUSED ? (") && stdout.contains("invalid plugin.toml"), "{stdout}");
    let json = plugins(&one_refused.0, true);
    assert_eq!(json.status.code(), Some(2));
    let report: Value = serde_json::from_slice(&json.stdout).expect("JSON on stdout");
    assert_eq!((report["plugins"].as_array().unwrap().len(), report["refused"].as_array().unwrap().len()), (2, 1));

    let absent = scratch("status-absent").join("no-such-folder");
    let out = plugins(&absent, false);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read plugins folder"));
}

/// Whether the file `lib` is mapped into this process.
fn mapped(lib: &Path) -> bool {
    let lib = lib.canonicalize().unwrap();
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines().any(|l| l.split_whitespace().nth(5).is_some_and(|p| Path::new(p) == lib))
}

/// Plugin code keeps pointers into its library that outlive any registry:
/// vtables of the strings and objects it made, thread-local destructors, the
/// error handler its mlx-rs copy leaves in libmlxc. So a library stays mapped
/// once opened, whether it was admitted, refused after its code ran, or
/// refused as no plugin at all (abi_stable closes its own handle to that one).
#[test]
fn every_opened_library_stays_mapped_after_its_registry_is_gone() {
    let p = Plugins::new("stays-mapped");
    // Copies, not links: objects of their own that no other test has mapped.
    let copy = |lib: &Path, folder: &str, toml: &str| {
        let d = p.0.join(folder);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("plugin.toml"), toml).unwrap();
        let to = d.join(lib.file_name().unwrap());
        std::fs::copy(lib, &to).unwrap();
        to
    };
    let family = |library| plugin_toml("toy-family", "model-family", ABI_VERSION, library);
    let admitted = copy(&lib("good", "libtoy_family.so"), "a-admitted", &family("libtoy_family.so"));
    let init_panics = copy(&lib("panic-in-init", "libtoy_family.so"), "b-init-panics", &family("libtoy_family.so"));
    let no_plugin = copy(&it::cdylib("proof_maker"), "c-no-plugin", &family("libproof_maker.so"));

    let reg = Registry::discover(&p.0, &host_info()).unwrap();
    assert_eq!(reg.plugins.iter().map(|p| p.name()).collect::<Vec<_>>(), ["toy-family"]);
    let reasons: Vec<&str> = reg.refused.iter().map(|r| r.reason.as_str()).collect();
    assert!(reasons.len() == 2 && reasons[0].starts_with("init failed") && reasons[1].starts_with("not a plugin"));
    drop(reg);
    for lib in [&admitted, &init_panics, &no_plugin] {
        assert!(mapped(lib), "{} was unmapped", lib.display());
    }
}

// ---------------------------------------------------------------------------
// Plugin faults under `host serve --isolate`

/// A word-level tokenizer for the toy vocabulary (`t0` … `t31`), so that the
/// HTTP API can serve the toy model.
fn add_word_tokenizer(model: &Path) {
    let vocab: serde_json::Map<String, Value> = (0..V).map(|t| (format!("t{t}"), json!(t))).collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "t0"},
    });
    std::fs::write(model.join("tokenizer.json"), tokenizer.to_string()).unwrap();
}

/// The completion's tokens, read back from the word-level text.
fn toy_tokens(r: &Value) -> Vec<u32> {
    let text = r["choices"][0]["text"].as_str().unwrap_or_else(|| panic!("{r}"));
    text.split('t').filter(|w| !w.trim().is_empty()).map(|w| w.trim().parse().unwrap()).collect()
}

/// What every fault test runs, on one model and its plugins (`flags`):
/// without `--isolate`, then with it, a healthy request, the panicking
/// request (`after_panic` posts it and checks its answer), a healthy one
/// again; then, isolated only, each `fatal` body (abort, segfault) ends its
/// request with a 500 naming `signal`, a new engine process starts and the
/// next request is healthy.
fn faults_end_only_their_request(
    model: &Path,
    flags: &[&str],
    expect_healthy: impl Fn(&it::Server),
    after_panic: impl Fn(&it::Server),
    fatal: &[(Value, &str)],
) {
    let s = it::Server::start(model, flags);
    expect_healthy(&s);
    after_panic(&s);
    expect_healthy(&s);
    drop(s);

    let s = it::Server::start(model, &[flags, &["--isolate"]].concat());
    expect_healthy(&s);
    after_panic(&s);
    expect_healthy(&s);
    for (body, signal) in fatal {
        let pid = s.request("GET", "/health", &[], b"").json()["engine"]["pid"].as_u64().unwrap();
        let r = s.post("/v1/completions", body);
        assert_eq!(r.status, 500, "{}", r.text());
        assert!(r.json()["error"]["message"].as_str().unwrap().contains(signal), "{}", r.text());
        wait_for_new_engine(&s, pid, signal);
        expect_healthy(&s);
    }
}

/// Waits until /health reports an engine process other than `pid`, whose
/// predecessor ended with `signal`.
fn wait_for_new_engine(s: &it::Server, pid: u64, signal: &str) {
    let t = std::time::Instant::now();
    loop {
        let h = s.request("GET", "/health", &[], b"");
        if h.status == 200 && h.json()["engine"]["pid"].as_u64() != Some(pid) {
            assert!(h.json()["engine"]["last_exit"].as_str().unwrap().contains(signal), "{}", h.text());
            return;
        }
        assert!(t.elapsed().as_secs() < 120, "no new engine process: {}", h.text());
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Posts a greedy completion of `prompt` and checks it is the toy chain's
/// next `n` tokens; returns the answer.
fn expect_chain(s: &it::Server, prompt: &[u32], n: usize) -> Value {
    let r = s.post("/v1/completions", &json!({"prompt": prompt, "max_tokens": n, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(toy_tokens(&r.json()), chain(prompt, n));
    r.json()
}

/// Posts `body`, which makes a plugin panic: a request-level 500 naming the panic.
fn expect_panic_error(s: &it::Server, body: &Value, text: &str) {
    let r = s.post("/v1/completions", body);
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(r.text().contains(text), "{}", r.text());
}

/// A plugin that panics in forward fails only that request (the guard turns
/// the panic into an error), with or without isolation. One that aborts or
/// segfaults takes the engine process down: under `--isolate` the request
/// gets a 5xx naming the signal, and a new engine process serves the next.
#[test]
fn plugin_faults_in_forward_end_the_request_and_the_server_serves_the_next() {
    let p = with_good("faults").family("toy-family", "faults");
    let model = toy_model("faults");
    add_word_tokenizer(&model);
    let poisoned = |t: u32| json!({"prompt": [t], "max_tokens": 2, "temperature": 0});
    faults_end_only_their_request(
        &model,
        &["--plugins", p.0.to_str().unwrap()],
        |s| {
            expect_chain(s, &[0], 5);
        },
        |s| expect_panic_error(s, &poisoned(13), "toy-family panics on token 13"),
        &[(poisoned(14), "signal 6"), (poisoned(15), "signal 11")],
    );
}

/// The same for a cache layout: the toy model's one layer is served by the
/// out-of-tree `toy-layout`, whose faults variant panics, aborts or
/// segfaults in `update_and_fetch` when one update brings 13, 14 or 15
/// tokens (a prompt one longer: the host prefills all but its last token).
/// Healthy requests (short prompts) are served through the same layout
/// before and after each fault, with the tokens the toy model predicts.
#[test]
fn cache_layout_faults_end_the_request_and_the_server_serves_the_next() {
    let p = Plugins::new("layout-faults").family("toy-family", "good").layout_variant("faults");
    let model = toy_model("layout-faults");
    add_word_tokenizer(&model);
    let poisoned = |update: usize| json!({"prompt": vec![1; update + 1], "max_tokens": 2, "temperature": 0});
    faults_end_only_their_request(
        &model,
        &["--plugins", p.0.to_str().unwrap()],
        |s| {
            expect_chain(s, &[0, 7], 5);
        },
        |s| expect_panic_error(s, &poisoned(13), "toy-layout panics on an update of 13 tokens"),
        &[(poisoned(14), "signal 6"), (poisoned(15), "signal 11")],
    );
}

/// The same for a drafter: the faults variant of toy-drafter panics, aborts
/// or segfaults while drafting after a history ending with 21, 20 or 22. A
/// panic is a drafter error like any other, with or without `--isolate`:
/// that request goes on in plain steps (its tokens the model's, its usage
/// naming the panic) and the next one speculates again. An abort or a
/// segfault under `--isolate` ends the request with a 5xx naming the
/// signal, and a new engine process serves the next request, speculating
/// with the same drafter.
#[test]
fn drafter_faults_end_the_request_and_the_server_serves_the_next() {
    let p = Plugins::new("drafter-faults").kv_plain().family("toy-family", "good").drafter_variant("faults");
    let model = toy_model("drafter-faults");
    add_word_tokenizer(&model);
    let draft = scratch("drafter-faults/draft");
    std::fs::write(draft.join("config.json"), json!({"model_type": "toy-repeat-draft"}).to_string()).unwrap();
    std::fs::copy(model.join("tokenizer.json"), draft.join("tokenizer.json")).unwrap();
    let poisoned = |t: u32| json!({"prompt": [t], "max_tokens": 3, "temperature": 0});
    faults_end_only_their_request(
        &model,
        &["--plugins", p.0.to_str().unwrap(), "--draft-model", draft.to_str().unwrap(), "--speculate-always"],
        // 0 -> 3 -> 18 -> 29: the history never ends with 20, 21 or 22.
        |s| {
            let r = expect_chain(s, &[0], 3);
            assert!(r["usage"]["speculation"]["drafted"].as_u64() > Some(0), "{r}");
            // toy-repeat checks every lent tap's position and shape.
            assert!(r["usage"]["speculation"]["disabled"].is_null(), "{r}");
        },
        |s| {
            let r = expect_chain(s, &[21], 3);
            let why = r["usage"]["speculation"]["disabled"].as_str().unwrap_or_default();
            assert!(why.contains("toy-drafter panics on a history ending with 21"), "{r}");
        },
        &[(poisoned(20), "signal 6"), (poisoned(22), "signal 11")],
    );
}
