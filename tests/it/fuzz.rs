//! A request-body fuzzer: valid seed bodies for every POST endpoint,
//! mutated by a seeded PRNG (keys deleted, values of other JSON types,
//! shapes swapped, duplicate keys, lone surrogates and raw control
//! characters, truncation, random bytes) and sent to one server, for a
//! bounded number of cases and a bounded time. Every answer must come, be
//! a 2xx or a documented 4xx in the API's own error shape, and a stream
//! must end as its API ends one; every 50 cases a known-good request still
//! gets the same greedy answer and the engine goes idle. `FUZZ_SEED`,
//! `FUZZ_CASES` and `FUZZ_VERBOSE` (every case's status and answer) explore
//! beyond the fixed cases.

use it::{model, HttpResponse, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// The PRNG's seed: the same cases on every run.
const SEED: u64 = 0x9e37_79b9_7f4a_7c15;
/// Cases at most, and the wall-clock budget (whichever ends first).
const MAX_CASES: usize = 600;
const BUDGET: Duration = Duration::from_secs(75);
/// Cases between checks that the server still answers as at the start.
const CHECK_EVERY: usize = 50;
/// Longest wait for one answer before the case counts as a hang.
const HANG: Duration = Duration::from_secs(60);
/// The server's body limit (a mutation can exceed it).
const BODY_LIMIT: usize = 65536;

/// xorshift64*: tiny, deterministic, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Chat,
    Completions,
    Messages,
    CountTokens,
    Responses,
    Embeddings,
}

impl Kind {
    fn anthropic(self) -> bool {
        matches!(self, Kind::Messages | Kind::CountTokens)
    }
}

struct Endpoint {
    kind: Kind,
    path: &'static str,
    seeds: Vec<Value>,
}

fn endpoints() -> Vec<Endpoint> {
    let user = |text: &str| json!([{"role": "user", "content": text}]);
    let weather = json!({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}});
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array",
        "items": {"type": "string"}}}, "required": ["a"]});
    let chat = vec![
        json!({"messages": user("Hello"), "max_tokens": 3, "temperature": 0}),
        json!({"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
            "max_tokens": 4, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}, "stop": ["\n", "."]}),
        json!({"messages": user("Weather?"), "max_tokens": 4, "temperature": 0, "tools": [weather], "tool_choice": "required"}),
        json!({"messages": user("Weather?"), "max_tokens": 3, "temperature": 0, "stream": true, "tools": [weather],
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
        json!({"messages": user("JSON please"), "max_tokens": 4, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}}),
        json!({"messages": user("Pick"), "max_tokens": 2, "n": 2, "seed": 7, "logit_bias": {"100": 5, "200": -100},
            "logprobs": true, "top_logprobs": 2, "top_k": 5, "top_p": 0.9, "min_p": 0.05}),
        json!({"messages": [{"role": "user", "content": "Weather in Paris?"}, {"role": "assistant", "content": "",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}], "tools": [weather], "tool_choice": "none", "max_tokens": 3, "temperature": 0}),
    ];
    let completions = vec![
        json!({"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0}),
        json!({"prompt": [[1, 2, 3, 4]], "max_tokens": 2, "temperature": 0, "stream": true, "stop": "x"}),
        json!({"prompt": ["Hello"], "max_tokens": 3, "n": 2, "logprobs": 2, "seed": 3, "logit_bias": {"50": 10}}),
        json!({"prompt": "A", "max_tokens": 4, "temperature": 0, "stream": true, "stream_options": {"include_usage": true},
            "response_format": {"type": "json_object"}}),
        json!({"prompt": "Choose", "max_tokens": 4, "temperature": 0, "guided_choice": ["yes", "no"], "repetition_penalty": 1.1}),
    ];
    let ant_tool = json!({"name": "get_weather", "description": "Weather", "input_schema": {"type": "object",
        "properties": {"city": {"type": "string"}}}});
    let ant_history = json!([{"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]);
    let messages = vec![
        json!({"model": "m", "max_tokens": 3, "messages": user("Hi"), "temperature": 0}),
        json!({"model": "m", "max_tokens": 4, "messages": user("Hi"), "temperature": 0, "stream": true,
            "system": [{"type": "text", "text": "Be brief."}], "stop_sequences": ["END"]}),
        json!({"model": "m", "max_tokens": 4, "messages": ant_history, "tools": [ant_tool], "tool_choice": {"type": "none"}, "temperature": 0}),
        json!({"model": "m", "max_tokens": 3, "messages": user("Weather?"), "tools": [ant_tool], "stream": true,
            "tool_choice": {"type": "any"}, "thinking": {"type": "disabled"}, "temperature": 0}),
        json!({"model": "m", "max_tokens": 4, "messages": user("JSON"), "temperature": 0,
            "output_config": {"format": {"type": "json_schema", "schema": schema}}, "metadata": {"user_id": "u"}}),
    ];
    let count_tokens = vec![
        json!({"model": "m", "messages": user("Hello")}),
        json!({"model": "m", "messages": ant_history, "tools": [ant_tool], "system": "Be brief."}),
        json!({"model": "m", "messages": user("Hi"), "tool_choice": {"type": "tool", "name": "get_weather"}, "tools": [ant_tool]}),
    ];
    let flat_tool = json!({"type": "function", "name": "get_weather", "parameters": {"type": "object",
        "properties": {"city": {"type": "string"}}, "required": ["city"]}});
    let responses = vec![
        json!({"model": "m", "input": "Hello", "max_output_tokens": 3, "temperature": 0}),
        json!({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}],
            "instructions": "Be brief.", "max_output_tokens": 3, "temperature": 0, "stream": true, "store": false}),
        json!({"model": "m", "input": "Weather?", "tools": [flat_tool], "tool_choice": "required",
            "max_output_tokens": 4, "temperature": 0, "metadata": {"k": "v"}}),
        json!({"model": "m", "input": [{"type": "message", "role": "user", "content": "Weather in Paris?"},
            {"type": "message", "role": "assistant", "content": "Checking."},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}],
            "tools": [flat_tool], "tool_choice": "none", "max_output_tokens": 3, "temperature": 0, "stream": true}),
        json!({"model": "m", "input": "JSON", "max_output_tokens": 4, "temperature": 0,
            "text": {"format": {"type": "json_schema", "name": "x", "schema": schema, "strict": true}}}),
    ];
    // The chat model declares no pooling: every embeddings body is a 400,
    // which still runs the body's parser before the model's refusal.
    let embeddings = vec![
        json!({"input": "a cat"}),
        json!({"input": ["a cat", "a dog"], "encoding_format": "base64", "dimensions": 8}),
        json!({"input": [[1, 2, 3], [4, 5]], "model": "m"}),
    ];
    vec![
        Endpoint { kind: Kind::Chat, path: "/v1/chat/completions", seeds: chat },
        Endpoint { kind: Kind::Completions, path: "/v1/completions", seeds: completions },
        Endpoint { kind: Kind::Messages, path: "/v1/messages", seeds: messages },
        Endpoint { kind: Kind::CountTokens, path: "/v1/messages/count_tokens", seeds: count_tokens },
        Endpoint { kind: Kind::Responses, path: "/v1/responses", seeds: responses },
        Endpoint { kind: Kind::Embeddings, path: "/v1/embeddings", seeds: embeddings },
    ]
}

/// Text spliced in after serialisation, where a `Value` cannot say it: a
/// string value `"\u0001RAW<i>"` becomes `values[i]` verbatim (numbers serde
/// cannot hold, lone surrogates, raw control characters, nesting past the
/// parser's limit), and a key `"\u0001DUP<i>"` becomes the name `keys[i]`
/// (a key twice in one object).
#[derive(Default)]
struct Raws {
    values: Vec<String>,
    keys: Vec<String>,
}

impl Raws {
    fn value(&mut self, text: &str) -> Value {
        self.values.push(text.to_owned());
        Value::String(format!("\u{1}RAW{}", self.values.len() - 1))
    }

    fn key(&mut self, name: &str) -> String {
        self.keys.push(name.to_owned());
        format!("\u{1}DUP{}", self.keys.len() - 1)
    }

    fn splice(&self, mut text: String) -> String {
        // Each marker is matched with its quotes: RAW1 never matches RAW10.
        for (i, raw) in self.values.iter().enumerate().rev() {
            text = text.replace(&format!("\"\\u0001RAW{i}\""), raw);
        }
        for (i, name) in self.keys.iter().enumerate().rev() {
            text = text.replace(&format!("\"\\u0001DUP{i}\""), &Value::from(name.as_str()).to_string());
        }
        text
    }
}

/// A value of some other JSON type or an awkward one of the same type.
fn weird(rng: &mut Rng, raws: &mut Raws) -> Value {
    let words = [
        "user",
        "assistant",
        "system",
        "developer",
        "tool",
        "function",
        "text",
        "json_schema",
        "json_object",
        "auto",
        "none",
        "required",
        "any",
        "tool_use",
        "tool_result",
        "function_call",
        "function_call_output",
        "input_text",
        "object",
        "string",
        "enabled",
    ];
    match rng.below(12) {
        0 => Value::Null,
        1 => json!(rng.below(2) == 1),
        2 => json!(*rng.pick(&[0i64, -1, 1, 2, 4, 100, -100, 101, 128, 129, i64::MIN, i64::MAX])),
        3 => json!(*rng.pick(&[1.5f64, -0.5, 1e308, -1e308, 1e-300, 0.1, 3.0])),
        4 => raws.value(rng.pick::<&str>(&[
            "18446744073709551616",
            "18446744073709551615",
            "4294967296",
            "-9223372036854775809",
            "1e400",
            "-0",
        ])),
        5 => json!(*rng.pick(&[
            "",
            " ",
            "\u{0}",
            "a\u{0}b\u{7}",
            "\u{202e}rtl\u{200b}",
            "🦀👍🏽",
            "\u{ffff}\u{10ffff}",
            "<|im_start|>system\nx<|im_end|>",
            "</s><s>",
            "{{ raise_exception('x') }}{% for x in y %}",
            "\n\n\t",
            "NaN",
        ])),
        6 => json!(*rng.pick(&words)),
        7 => raws.value(rng.pick::<&str>(&[
            "\"\\ud800\"",
            "\"a\\udfffb\"",
            "\"\\udc00\\ud800\"",
            "\"\u{1}\n\t\"",
            "NaN",
            "Infinity",
            "\"\\x41\"",
        ])),
        8 => match rng.below(4) {
            0 => json!([]),
            1 => json!([null]),
            2 => json!([1, "a", {}]),
            _ => json!(["a", "b", "c", "d", "e"]),
        },
        9 => match rng.below(4) {
            0 => json!({}),
            1 => json!({"": ""}),
            2 => json!({"type": null}),
            _ => json!({"role": "user", "content": "x"}),
        },
        10 => json!(rng.pick(&["é", "x", "ab "]).repeat(*rng.pick(&[300, 5000]))),
        _ => match rng.below(3) {
            0 => nested(40),
            1 => raws.value(&format!("{}{}", "[".repeat(300), "]".repeat(300))),
            _ => json!("x".repeat(BODY_LIMIT + 10)),
        },
    }
}

/// Arrays nested `depth` deep (within serde's limit).
fn nested(depth: usize) -> Value {
    (0..depth).fold(json!([]), |v, _| json!([v]))
}

/// One step into a JSON value.
#[derive(Clone, Debug)]
enum Step {
    Key(String),
    Index(usize),
}

fn paths(v: &Value, at: &mut Vec<Step>, out: &mut Vec<Vec<Step>>) {
    out.push(at.clone());
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                at.push(Step::Key(k.clone()));
                paths(x, at, out);
                at.pop();
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                at.push(Step::Index(i));
                paths(x, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn at<'a>(v: &'a Value, path: &[Step]) -> &'a Value {
    path.iter().fold(v, |v, s| match s {
        Step::Key(k) => &v[k.as_str()],
        Step::Index(i) => &v[*i],
    })
}

fn at_mut<'a>(v: &'a mut Value, path: &[Step]) -> &'a mut Value {
    path.iter().fold(v, |v, s| match s {
        Step::Key(k) => &mut v[k.as_str()],
        Step::Index(i) => &mut v[*i],
    })
}

fn show(path: &[Step]) -> String {
    path.iter()
        .map(|s| match s {
            Step::Key(k) => format!(".{k}"),
            Step::Index(i) => format!("[{i}]"),
        })
        .collect()
}

/// Fields some endpoint reads, for keys the fuzzer adds.
const FIELDS: &[&str] = &[
    "stream",
    "n",
    "tools",
    "tool_choice",
    "stop",
    "stop_sequences",
    "logit_bias",
    "response_format",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "messages",
    "input",
    "prompt",
    "seed",
    "top_k",
    "logprobs",
    "top_logprobs",
    "previous_response_id",
    "thinking",
    "system",
    "suffix",
    "echo",
    "best_of",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "text",
    "reasoning",
    "reasoning_effort",
    "chat_template_kwargs",
    "instructions",
    "include",
    "parallel_tool_calls",
    "dimensions",
    "encoding_format",
    "stream_options",
    "output_config",
    "tool_call_id",
    "content",
    "role",
    "name",
    "arguments",
    "parameters",
    "input_schema",
    "type",
];

/// Mutates `v` in place once; says what it did.
fn mutate(rng: &mut Rng, v: &mut Value, raws: &mut Raws) -> String {
    let mut all = Vec::new();
    paths(v, &mut Vec::new(), &mut all);
    let objects: Vec<Vec<Step>> = all.iter().filter(|p| at(v, p).is_object()).cloned().collect();
    if objects.is_empty() {
        return "no object left to mutate".into();
    }
    // Values below the root (the root itself once nothing is left below it).
    let below_root = if all.len() > 1 { &all[1..] } else { &all[..] };
    match rng.below(6) {
        // Delete a key.
        0 => {
            let p = rng.pick(&objects).clone();
            let m = at_mut(v, &p).as_object_mut().unwrap();
            if m.is_empty() {
                return "nothing to delete".into();
            }
            let k = m.keys().nth(rng.below(m.len())).unwrap().clone();
            m.shift_remove(&k);
            format!("delete {}.{k}", show(&p))
        }
        // Replace a value.
        1 | 2 => {
            let p = rng.pick(below_root).clone();
            *at_mut(v, &p) = weird(rng, raws);
            format!("replace {}", show(&p))
        }
        // An array for an object or an object for an array (a scalar
        // becomes a one-element array).
        3 => {
            let p = rng.pick(below_root).clone();
            let x = at_mut(v, &p);
            *x = match x.take() {
                Value::Array(a) => Value::Object(a.into_iter().enumerate().map(|(i, e)| (i.to_string(), e)).collect()),
                Value::Object(m) => Value::Array(m.into_iter().map(|(_, e)| e).collect()),
                other => json!([other]),
            };
            format!("swap shape {}", show(&p))
        }
        // Add a field some endpoint reads, with an awkward value.
        4 => {
            let p = rng.pick(&objects).clone();
            let k = rng.pick(FIELDS).to_string();
            let w = weird(rng, raws);
            at_mut(v, &p).as_object_mut().unwrap().insert(k.clone(), w);
            format!("add {}.{k}", show(&p))
        }
        // A key twice in the text, the awkward copy before the real one
        // (the last one wins in serde) or after it.
        _ => {
            let p = rng.pick(&objects).clone();
            let Some(k) = at(v, &p).as_object().and_then(|m| m.keys().nth(rng.below(m.len())).cloned()) else {
                return "nothing to duplicate".into();
            };
            let first = rng.below(2) == 0;
            let (marker, w) = (raws.key(&k), weird(rng, raws));
            let m = at_mut(v, &p).as_object_mut().unwrap();
            let rest = std::mem::take(m);
            if first {
                m.insert(marker, w);
                m.extend(rest);
            } else {
                m.extend(rest);
                m.insert(marker, w);
            }
            format!("duplicate {}.{k} ({})", show(&p), if first { "first" } else { "last" })
        }
    }
}

/// Mutations of the serialised text.
fn mutate_text(rng: &mut Rng, mut b: Vec<u8>) -> (Vec<u8>, String) {
    match rng.below(3) {
        0 => {
            let at = rng.below(b.len());
            b.truncate(at);
            (b, format!("truncate at {at}"))
        }
        1 => {
            let at = rng.below(b.len() + 1);
            let n = 1 + rng.below(6);
            let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
            b.splice(at..at, bytes);
            (b, format!("insert {n} bytes at {at}"))
        }
        _ => {
            let at = rng.below(b.len());
            let byte = *rng.pick(b"{}[],:\"\\0-e.");
            b[at] = byte;
            (b, format!("byte {at} = {:?}", byte as char))
        }
    }
}

/// A mutated body from one of `seeds`, and what was done to it.
fn case(rng: &mut Rng, seeds: &[Value]) -> (Vec<u8>, String) {
    let s = rng.below(seeds.len());
    let mut v = seeds[s].clone();
    let mut raws = Raws::default();
    let mut did = vec![format!("seed {s}")];
    let n = *rng.pick(&[1, 1, 1, 1, 1, 1, 2, 2, 2, 3]);
    for _ in 0..n {
        did.push(mutate(rng, &mut v, &mut raws));
    }
    let mut body = raws.splice(v.to_string()).into_bytes();
    if rng.below(10) == 0 {
        let (b, what) = mutate_text(rng, body);
        body = b;
        did.push(what);
    }
    (body, did.join("; "))
}

/// What is wrong with an answer, if anything.
fn judge(kind: Kind, r: &HttpResponse) -> Result<(), String> {
    let stream = r.header("content-type").is_some_and(|t| t.starts_with("text/event-stream"));
    match r.status {
        200 if stream => judge_stream(kind, &r.text()),
        200 => judge_json(kind, &r.body),
        400 | 413 => judge_error(kind, r.status, &r.body),
        s => Err(format!("status {s} is not one this endpoint documents for a client's body")),
    }
}

fn parse(body: &[u8]) -> Result<Value, String> {
    serde_json::from_slice(body).map_err(|e| format!("the body is not JSON ({e})"))
}

fn judge_error(kind: Kind, status: u16, body: &[u8]) -> Result<(), String> {
    let v = parse(body)?;
    if kind.anthropic() {
        let want = if status == 413 { "request_too_large" } else { "invalid_request_error" };
        let ok = v["type"] == "error"
            && v["error"]["type"] == want
            && v["error"]["message"].as_str().is_some_and(|m| !m.is_empty());
        return if ok { Ok(()) } else { Err(format!("not Anthropic's error shape for {status}")) };
    }
    let e = v["error"].as_object().ok_or("no `error` object")?;
    let ok = e.get("message").and_then(Value::as_str).is_some_and(|m| !m.is_empty())
        && e.get("type") == Some(&json!("invalid_request_error"))
        && e.get("param").is_some_and(|p| p.is_null() || p.is_string())
        && e.get("code").is_some_and(|c| c.is_null() || c.is_string());
    if ok {
        Ok(())
    } else {
        Err("not OpenAI's error shape".into())
    }
}

fn judge_json(kind: Kind, body: &[u8]) -> Result<(), String> {
    let v = parse(body)?;
    let finishes = |v: &Value, key: &str, allowed: &[&str]| {
        v["choices"].as_array().is_some_and(|cs| {
            !cs.is_empty() && cs.iter().all(|c| c[key].as_str().is_some_and(|f| allowed.contains(&f)))
        })
    };
    let ok = match kind {
        Kind::Chat => {
            v["object"] == "chat.completion" && finishes(&v, "finish_reason", &["stop", "length", "tool_calls"])
        }
        Kind::Completions => v["object"] == "text_completion" && finishes(&v, "finish_reason", &["stop", "length"]),
        Kind::Messages => {
            v["type"] == "message"
                && v["content"].is_array()
                && ["end_turn", "max_tokens", "stop_sequence", "tool_use"].iter().any(|s| v["stop_reason"] == *s)
        }
        Kind::CountTokens => v["input_tokens"].as_u64().is_some_and(|n| n > 0),
        Kind::Responses => v["object"] == "response" && (v["status"] == "completed" || v["status"] == "incomplete"),
        Kind::Embeddings => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("a 200 that is not a finished {kind:?} answer"))
    }
}

/// SSE events as (name, data) in order; comments (keep-alives) skipped.
fn events(text: &str) -> Vec<(String, String)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .filter_map(|e| {
            let mut name = String::new();
            let mut data = None;
            for line in e.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_owned();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(d.to_owned());
                }
            }
            data.map(|d| (name, d))
        })
        .collect()
}

fn judge_stream(kind: Kind, text: &str) -> Result<(), String> {
    let evs = events(text);
    let (last_name, last) = evs.last().cloned().ok_or("an empty stream")?;
    let json_of = |d: &str| serde_json::from_str::<Value>(d).map_err(|e| format!("an event that is not JSON ({e})"));
    match kind {
        Kind::Chat | Kind::Completions => {
            if last != "[DONE]" || evs.iter().filter(|(_, d)| d == "[DONE]").count() != 1 {
                return Err("the stream does not end with one `data: [DONE]`".into());
            }
            let mut finished = false;
            for (_, d) in &evs[..evs.len() - 1] {
                let v = json_of(d)?;
                if v.get("error").is_some() {
                    return Err("an error inside the stream".into());
                }
                finished |= v["choices"].as_array().is_some_and(|cs| cs.iter().any(|c| c["finish_reason"].is_string()));
            }
            if !finished {
                return Err("no chunk carries a finish_reason".into());
            }
        }
        Kind::Messages => {
            if evs[0].0 != "message_start" || last_name != "message_stop" {
                return Err("the stream does not run from message_start to message_stop".into());
            }
            if evs.iter().any(|(n, _)| n == "error") {
                return Err("an error event".into());
            }
            for (_, d) in &evs {
                json_of(d)?;
            }
        }
        Kind::Responses => {
            for (i, (_, d)) in evs.iter().enumerate() {
                let v = json_of(d)?;
                if v["sequence_number"] != i {
                    return Err(format!("event {i} has sequence_number {}", v["sequence_number"]));
                }
                if v["type"] == "error" || v["type"] == "response.failed" {
                    return Err("an error event".into());
                }
            }
            let end = json_of(&last)?["type"].clone();
            if end != "response.completed" && end != "response.incomplete" {
                return Err(format!("the stream ends with {end}, not response.completed or response.incomplete"));
            }
        }
        Kind::CountTokens | Kind::Embeddings => return Err("a stream from an endpoint that never streams".into()),
    }
    Ok(())
}

#[test]
fn fuzzed_request_bodies_get_answers_or_documented_errors_and_the_server_keeps_serving() {
    let limit = BODY_LIMIT.to_string();
    let s = Server::start(&model("tiny/tiny-llama-f32"), &["--body-limit", &limit, "--max-tokens", "8"]);
    let json_header = [("Content-Type", "application/json")];
    let known_good =
        json!({"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 6, "temperature": 0});
    let greedy = || {
        let r = s.post("/v1/chat/completions", &known_good);
        assert_eq!(r.status, 200, "the known-good request: {}", r.text());
        r.json()["choices"][0]["message"]["content"].clone()
    };
    let settle = |when: &str| {
        s.wait_for(&format!("the engine to go idle {when}"), |st| {
            st["engine_idle"] == true && st["active"] == 0 && st["queued"] == 0
        });
    };
    let expected = greedy();
    assert!(expected.as_str().is_some_and(|t| !t.is_empty()), "{expected}");

    let eps = endpoints();
    // Every seed is valid: the mutations start from requests the server serves.
    for ep in &eps {
        for (i, seed) in ep.seeds.iter().enumerate() {
            let r = s.post(ep.path, seed);
            let want = if ep.kind == Kind::Embeddings { 400 } else { 200 };
            assert_eq!(r.status, want, "{} seed {i}: {}", ep.path, r.text());
            if let Err(why) = judge(ep.kind, &r) {
                panic!("{} seed {i}: {why}: {}", ep.path, r.text());
            }
        }
    }

    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let mut rng = Rng(env("FUZZ_SEED").unwrap_or(SEED));
    let max_cases = env("FUZZ_CASES").map_or(MAX_CASES, |n| n as usize);
    let verbose = std::env::var_os("FUZZ_VERBOSE").is_some();
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut statuses = std::collections::BTreeMap::<u16, usize>::new();
    let mut ran = 0;
    while ran < max_cases && started.elapsed() < BUDGET && failures.len() < 10 {
        let ep = &eps[ran % eps.len()];
        let (body, did) = case(&mut rng, &ep.seeds);
        let verdict = match s.request_within("POST", ep.path, &json_header, &body, HANG) {
            Err(e) => Err(format!("no whole answer within {HANG:?} ({e})")),
            Ok(r) => {
                *statuses.entry(r.status).or_default() += 1;
                if verbose {
                    println!(
                        "{ran} {} {} [{did}] {}",
                        ep.path,
                        r.status,
                        r.text().chars().take(200).collect::<String>()
                    );
                }
                judge(ep.kind, &r).map_err(|why| format!("{why}; answer {} {}", r.status, r.text()))
            }
        };
        if let Err(why) = verdict {
            failures.push(format!("case {ran} POST {} [{did}]: {why}\n  body: b\"{}\"", ep.path, body.escape_ascii()));
        }
        ran += 1;
        if ran % CHECK_EVERY == 0 {
            settle(&format!("after case {ran}"));
            assert_eq!(greedy(), expected, "the known-good answer after case {ran}");
        }
    }
    println!("fuzz: {ran} cases in {:.1} s; statuses {statuses:?}", started.elapsed().as_secs_f64());
    assert!(failures.is_empty(), "{} failing cases:\n{}", failures.len(), failures.join("\n"));
    settle("at the end");
    assert_eq!(greedy(), expected, "the known-good answer at the end");
    settle("after the last check");
    let log = std::fs::read_to_string(&s.log).unwrap_or_default();
    assert!(!log.contains("panicked"), "the server panicked:\n{log}");
    assert!(ran >= 100, "only {ran} cases ran in {BUDGET:?}");
}
