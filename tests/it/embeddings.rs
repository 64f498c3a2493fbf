//! `POST /v1/embeddings` on sentence-transformers folders: vectors equal to
//! a reference computed with mlx-lm's model and sentence-transformers'
//! pooling (models/scripts/embed_oracle.py) for each pooling mode, through
//! the engine's worker queue; the request forms OpenAI allows; and the
//! 400s for folders and requests that cannot be served.

use it::{model, python, run_ok, Scratch, Server};
use serde_json::{json, Value};

/// A copy of a tiny folder with sentence-transformers pooling files.
fn embedding_folder(scratch: &Scratch, from: &str, pooling: &str, normalize: bool) -> std::path::PathBuf {
    let dst = scratch.0.join(format!("embed-{pooling}"));
    let mut cmd = python();
    cmd.arg(it::repo_root().join("models/scripts/make_embedding.py"))
        .arg(model(from))
        .arg(&dst)
        .args(["--pooling", pooling]);
    if !normalize {
        cmd.arg("--no-normalize");
    }
    run_ok(&mut cmd);
    dst
}

/// The reference vectors (and token ids) for `inputs`.
fn oracle(scratch: &Scratch, folder: &std::path::Path, inputs: &Value) -> Value {
    let inp = scratch.0.join("inputs.json");
    let out = scratch.0.join("ref.json");
    std::fs::write(&inp, inputs.to_string()).unwrap();
    run_ok(
        python()
            .arg(it::repo_root().join("models/scripts/embed_oracle.py"))
            .arg("--model")
            .arg(folder)
            .arg("--inputs")
            .arg(&inp)
            .arg("--out")
            .arg(&out),
    );
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let ours = std::fs::canonicalize(it::repo_root().join(".mlx/lib/libmlx.so")).unwrap();
    let libs: Vec<_> =
        v["libmlx"].as_array().unwrap().iter().map(|p| std::fs::canonicalize(p.as_str().unwrap()).unwrap()).collect();
    assert_eq!(libs, vec![ours], "the oracle did not run on the engine's libmlx");
    v
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().expect("array of numbers").iter().map(|x| x.as_f64().unwrap()).collect()
}

fn norm(a: &[f64]) -> f64 {
    a.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>() / (norm(a) * norm(b))
}

/// Inputs of very different lengths, as text and as token ids: the short
/// ones share one right-padded batch, the long one runs alone in two
/// prefill chunks.
fn inputs() -> Value {
    let long: Vec<u32> = (0..2500).map(|i| 100 + (i * 37) % 5000).collect();
    json!([
        "Hello world",
        "The quick brown fox jumps over the lazy dog, and then it sleeps for a while.",
        long,
        "x",
        [17, 4000, 29, 301],
    ])
}

fn vectors(resp: &Value) -> Vec<Vec<f64>> {
    let data = resp["data"].as_array().unwrap_or_else(|| panic!("no data: {resp}"));
    data.iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["index"], i);
            assert_eq!(d["object"], "embedding");
            floats(&d["embedding"])
        })
        .collect()
}

fn check_parity(pooling: &str, normalize: bool, serve: &[&str]) {
    let scratch = Scratch::new(&format!("embed-{pooling}"));
    let folder = embedding_folder(&scratch, "tiny/tiny-qwen3-f32", pooling, normalize);
    let inputs = inputs();
    let want = oracle(&scratch, &folder, &inputs);
    let s = Server::start(&folder, serve);
    let theirs: Vec<Vec<f64>> = want["embeddings"].as_array().unwrap().iter().map(floats).collect();
    let compare = |ours: &[Vec<f64>], theirs: &[&Vec<f64>]| {
        assert_eq!(ours.len(), theirs.len());
        for (i, (a, b)) in ours.iter().zip(theirs).enumerate() {
            let c = cosine(a, b);
            assert!(c >= 0.9999, "{pooling}: input {i}: cosine {c}");
            // Same length too: normalised to 1, or the raw pooled state.
            let (na, nb) = (norm(a), norm(b));
            assert!((na - nb).abs() <= 1e-3 * nb, "{pooling}: input {i}: norm {na} vs {nb}");
        }
    };
    // Every input as token ids, in one request (one padded batch and the
    // long input alone).
    let r = s.post("/v1/embeddings", &json!({ "model": "m", "input": want["ids"] }));
    assert_eq!(r.status, 200, "{}", r.text());
    let got = r.json();
    assert_eq!(got["object"], "list");
    let ids_total: usize = want["ids"].as_array().unwrap().iter().map(|x| x.as_array().unwrap().len()).sum();
    assert_eq!(got["usage"]["prompt_tokens"], ids_total);
    assert_eq!(got["usage"]["total_tokens"], ids_total);
    let ours = vectors(&got);
    compare(&ours, &theirs.iter().collect::<Vec<_>>());
    // The texts as strings: tokenized as sentence-transformers does.
    let texts: Vec<usize> = (0..theirs.len()).filter(|&i| inputs[i].is_string()).collect();
    let r = s.post("/v1/embeddings", &json!({ "input": texts.iter().map(|&i| inputs[i].clone()).collect::<Vec<_>>() }));
    assert_eq!(r.status, 200, "{}", r.text());
    let text_tokens: usize = texts.iter().map(|&i| want["ids"][i].as_array().unwrap().len()).sum();
    assert_eq!(r.json()["usage"]["prompt_tokens"], text_tokens, "the text was tokenized differently");
    compare(&vectors(&r.json()), &texts.iter().map(|&i| &theirs[i]).collect::<Vec<_>>());
    // base64 carries the same floats, little-endian f32 (the same input
    // alone both times: a batch's padding may move the last bits).
    let alone = vectors(&s.post("/v1/embeddings", &json!({ "input": inputs[0].clone() })).json()).remove(0);
    let r = s.post("/v1/embeddings", &json!({ "input": inputs[0].clone(), "encoding_format": "base64" }));
    assert_eq!(r.status, 200, "{}", r.text());
    let b64 = r.json()["data"][0]["embedding"].as_str().expect("a base64 string").to_owned();
    let bytes = decode_base64(&b64);
    let from_b64: Vec<f32> = bytes.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    // (As f32: serde_json's float parsing may miss the last f64 digit.)
    assert_eq!(from_b64, alone.iter().map(|&x| x as f32).collect::<Vec<_>>(), "base64 and float differ");
    // Matryoshka: the first 16 components, renormalised when the model normalises.
    let r = s.post("/v1/embeddings", &json!({ "input": [inputs[1].clone()], "dimensions": 16 }));
    assert_eq!(r.status, 200, "{}", r.text());
    let short = vectors(&r.json()).remove(0);
    assert_eq!(short.len(), 16);
    let prefix: Vec<f64> = theirs[1][..16].to_vec();
    assert!(cosine(&short, &prefix) >= 0.9999);
    let want_norm = if normalize { 1.0 } else { norm(&prefix) };
    assert!((norm(&short) - want_norm).abs() <= 1e-3 * want_norm, "{pooling}: truncated norm {}", norm(&short));
}

#[test]
fn last_token_pooling_matches_the_reference() {
    check_parity("last", true, &[]);
}

#[test]
fn mean_pooling_without_normalisation_matches_the_reference() {
    check_parity("mean", false, &[]);
}

#[test]
fn cls_pooling_matches_the_reference_on_the_serial_worker() {
    check_parity("cls", true, &["--batch", "1"]);
}

#[test]
fn embedding_jobs_wait_for_the_engine_and_bad_requests_get_400s() {
    let scratch = Scratch::new("embed-errors");
    let folder = embedding_folder(&scratch, "tiny/tiny-qwen3-f32", "last", true);
    let s = Server::start(&folder, &["--debug-endpoints"]);
    let alone = s.post("/v1/embeddings", &json!({ "input": ["a", "b"] })).json();
    // The job goes through the engine's queue: held, it waits there. Taken
    // between the decode steps of a running row, it leaves the row alone.
    let gen = json!({ "prompt": [1, 2, 3], "max_tokens": 40, "temperature": 0 });
    let gen_alone = s.post("/v1/completions", &gen).json();
    s.hold();
    std::thread::scope(|sc| {
        let g = sc.spawn(|| s.post("/v1/completions", &gen));
        s.wait_for("the generation to be queued", |st| st["queued"] == 1);
        s.request("POST", "/debug/release?steps=5", &[], b"");
        s.wait_for("the row to be decoding, held", |st| st["active"] == 1 && st["hold"]["parked"] == true);
        let h = sc.spawn(|| s.post("/v1/embeddings", &json!({ "input": ["a", "b"] })));
        s.wait_for("the embedding job to be queued", |st| st["queued"] == 1);
        s.release();
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(vectors(&r.json()), vectors(&alone));
        let r = g.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["choices"][0]["text"], gen_alone["choices"][0]["text"]);
    });
    let too_long: Vec<u32> = vec![100; 4097];
    for (body, param, needle) in [
        (json!({}), "input", "required"),
        (json!({ "input": [] }), "input", "empty"),
        (json!({ "input": ["a", ""] }), "input", "empty"),
        (json!({ "input": [1, 99999999] }), "input", "vocabulary"),
        (json!({ "input": too_long }), "input", "maximum context length"),
        (json!({ "input": "a", "dimensions": 65 }), "dimensions", "at most 64"),
        (json!({ "input": "a", "encoding_format": "hex" }), "encoding_format", "base64"),
        (json!({ "input": 5 }), "input", "must be a string"),
        (json!({ "input": { "a": 1 } }), "input", "must be a string"),
        (json!({ "input": ["a", [1, 2]] }), "input", "must be a string"),
        (json!({ "input": [null] }), "input", "must be a string"),
        (json!({ "input": [[1.5]] }), "input", "non-negative integers"),
        (json!({ "input": [-1] }), "input", "non-negative integers"),
        (json!({ "input": [[]] }), "input", "empty"),
        (json!({ "input": "a", "dimensions": 0 }), "dimensions", "at least 1"),
        (json!({ "input": "a", "dimensions": -3 }), "dimensions", "at least 1"),
        (json!({ "input": "a", "dimensions": "x" }), "dimensions", "integer"),
        (json!({ "input": "a", "encoding_format": 3 }), "encoding_format", "base64"),
    ] {
        let r = s.post("/v1/embeddings", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        let e = &r.json()["error"];
        assert_eq!(e["param"], param, "{body}: {e}");
        assert!(e["message"].as_str().unwrap().contains(needle), "{body}: {e}");
    }
    // A body that is not an object, then a good request: the server served on.
    let r = s.request("POST", "/v1/embeddings", &[("Content-Type", "application/json")], b"[1, 2]");
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(vectors(&s.post("/v1/embeddings", &json!({ "input": ["a", "b"] })).json()), vectors(&alone));
    // A chat folder declares no pooling.
    let chat = Server::start(&model("tiny/tiny-qwen3-f32"), &[]);
    let r = chat.post("/v1/embeddings", &json!({ "input": "hello" }));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["message"], "embeddings need a folder that declares pooling (1_Pooling/config.json)");
}

fn decode_base64(s: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes().filter(|&c| c != b'=') {
        acc = (acc << 6) | ALPHABET.iter().position(|&a| a == c).expect("base64 alphabet") as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}
