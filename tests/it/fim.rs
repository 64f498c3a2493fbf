//! Fill-in-the-middle on `/v1/completions`: with `suffix`, a tokenizer that
//! has FIM markers gets the prompt `<fim_prefix> prompt <fim_suffix> suffix
//! <fim_middle>` (the same tokens, and so the same greedy answer, as sending
//! that arrangement as token ids); a tokenizer without them gets a 400.

use it::{model, Scratch, Server};
use serde_json::{json, Value};

/// A copy of a tiny folder (weights linked) whose tokenizer calls three of
/// its added tokens `<fim_prefix>`, `<fim_suffix>`, `<fim_middle>`, as
/// StarCoder's does (SmolLM2's tokenizer has none). Returns their ids.
fn fim_folder(scratch: &Scratch, from: &str) -> (std::path::PathBuf, [u32; 3]) {
    let src = model(from);
    let dst = scratch.0.join("fim");
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let p = e.unwrap().path();
        if p.file_name().unwrap() != "tokenizer.json" {
            std::os::unix::fs::symlink(&p, dst.join(p.file_name().unwrap())).unwrap();
        }
    }
    let mut tok: Value = serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer.json")).unwrap()).unwrap();
    let renames = [(3u32, "<fim_prefix>"), (4, "<fim_suffix>"), (5, "<fim_middle>")];
    for (id, name) in renames {
        let added = tok["added_tokens"].as_array_mut().unwrap().iter_mut().find(|t| t["id"] == id).unwrap();
        let old = added["content"].as_str().unwrap().to_owned();
        added["content"] = json!(name);
        let vocab = tok["model"]["vocab"].as_object_mut().unwrap();
        vocab.remove(&old);
        vocab.insert(name.into(), json!(id));
    }
    std::fs::write(dst.join("tokenizer.json"), tok.to_string()).unwrap();
    (dst, renames.map(|(id, _)| id))
}

/// `text`'s ids by Hugging Face's `tokenizers` (Python), without special
/// tokens: the reference the engine's prompt must match.
fn encode(folder: &std::path::Path, text: &str) -> Vec<u32> {
    let script = "import json, sys\nfrom tokenizers import Tokenizer\n\
        t = Tokenizer.from_file(sys.argv[1] + '/tokenizer.json')\n\
        print(json.dumps(t.encode(sys.argv[2], add_special_tokens=False).ids))";
    let out = it::run_ok(it::python().args(["-c", script]).arg(folder).arg(text));
    serde_json::from_str(out.trim()).unwrap()
}

#[test]
fn suffix_arranges_prefix_suffix_middle_with_the_tokenizers_fim_tokens() {
    let scratch = Scratch::new("fim");
    let (folder, [pre, suf, mid]) = fim_folder(&scratch, "tiny/tiny-llama-f32");
    let prefix = "def add(a, b):\n    return ";
    let suffix = "\n\nprint(add(1, 2))\n";
    let mut want = vec![pre];
    want.extend(encode(&folder, prefix));
    want.push(suf);
    want.extend(encode(&folder, suffix));
    want.push(mid);
    let s = Server::start(&folder, &[]);
    let greedy = json!({ "temperature": 0, "max_tokens": 12, "logprobs": 1 });
    let with = |extra: Value| {
        let mut b = greedy.clone();
        b.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        b
    };
    let fim = s.post_ok("/v1/completions", &with(json!({ "prompt": prefix, "suffix": suffix })));
    let by_ids = s.post_ok("/v1/completions", &with(json!({ "prompt": want })));
    assert_eq!(fim["usage"]["prompt_tokens"], want.len(), "{fim}");
    assert_eq!(fim["choices"][0]["text"], by_ids["choices"][0]["text"]);
    assert_eq!(fim["choices"][0]["logprobs"], by_ids["choices"][0]["logprobs"], "not the same prompt tokens");
    // A token-id prompt is the prefix as it is.
    let ids_prefix = encode(&folder, prefix);
    let fim_ids = s.post_ok("/v1/completions", &with(json!({ "prompt": ids_prefix, "suffix": suffix })));
    assert_eq!(fim_ids["choices"][0]["logprobs"], by_ids["choices"][0]["logprobs"]);
    // An empty suffix is no suffix: a plain completion.
    let plain = s.post_ok("/v1/completions", &with(json!({ "prompt": prefix, "suffix": "" })));
    assert_eq!(plain["usage"]["prompt_tokens"], encode(&folder, prefix).len());
}

#[test]
fn suffix_without_fim_tokens_is_a_400() {
    let s = Server::start(&model("tiny/tiny-llama-f32"), &[]);
    let r = s.post("/v1/completions", &json!({ "prompt": "def f(", "suffix": "):\n    pass\n", "max_tokens": 4 }));
    assert_eq!(r.status, 400, "{}", r.text());
    let e = &r.json()["error"];
    assert_eq!(e["param"], "suffix");
    assert_eq!(e["code"], "unsupported_parameter");
    assert!(e["message"].as_str().unwrap().contains("fill-in-the-middle"), "{e}");
    let r = s.post("/v1/completions", &json!({ "prompt": "a", "suffix": 5 }));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["error"]["param"], "suffix");
}
