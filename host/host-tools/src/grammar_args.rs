//! Argument grammars for the syntaxes that are not JSON: Qwen's XML
//! parameters and Gemma's `key:value` notation. Each top-level property of
//! the tool's schema becomes a rule of its own, in the schema's order, the
//! required ones mandatory; a value's own schema still constrains it through
//! `%json` where the syntax writes that value as JSON (numbers, booleans,
//! and JSON inside XML). Nested Gemma objects and arrays follow the
//! notation but not the schema.

use crate::grammar_pieces::{quoted, standalone};
use crate::request::Tool;
use serde_json::Value;

/// Gemma's string delimiter, and its special-token reference if it is one.
pub(crate) struct Quote<'a> {
    pub text: &'a str,
    pub token: Option<String>,
}

/// The parameters of one XML function (possibly an empty expression).
pub(crate) fn xml_arguments(rules: &mut Vec<String>, prefix: &str, tool: &Tool) -> String {
    let close = quoted("\n</parameter>\n");
    let props = properties(tool);
    if props.is_empty() {
        if !open_ended(tool) {
            return String::new();
        }
        ensure_xml_text(rules);
        add_once(rules, "xml_any", "\"<parameter=\" XML_KEY \">\\n\" xml_text");
        add_once(rules, "XML_KEY", r"/[A-Za-z0-9_.\-]+/");
        return "xml_any*".into();
    }
    let items: Vec<(String, bool)> = props
        .into_iter()
        .map(|(key, schema, required)| {
            let head = quoted(&format!("<parameter={key}>\n"));
            let value = match string_choices(schema) {
                Some(choices) if !choices.is_empty() => format!("({}) {close}", alternatives(&choices)),
                Some(_) => {
                    ensure_xml_text(rules);
                    "xml_text".to_string()
                }
                None => format!("%json {} {close}", standalone(schema, &[&tool.parameters])),
            };
            (format!("{head} {value}"), required)
        })
        .collect();
    chain(rules, prefix, &items, None)
}

/// The `key:value,...` list of one Gemma call (possibly an empty expression).
pub(crate) fn gemma_arguments(rules: &mut Vec<String>, prefix: &str, tool: &Tool, quote: &Quote) -> String {
    let props = properties(tool);
    if props.is_empty() {
        if !open_ended(tool) {
            return String::new();
        }
        ensure_gemma_value(rules, quote);
        return "(gemma_kv (\",\" gemma_kv)*)?".into();
    }
    let items: Vec<(String, bool)> = props
        .into_iter()
        .map(|(key, schema, required)| {
            let head = if is_bare_key(key) {
                quoted(&format!("{key}:"))
            } else {
                format!("{} \":\"", quote_literal(quote, key))
            };
            let value = match string_choices(schema) {
                Some(choices) if !choices.is_empty() => {
                    let q: Vec<String> = choices.iter().map(|c| quote_literal(quote, c)).collect();
                    format!("({})", q.join(" | "))
                }
                Some(_) => {
                    ensure_gemma_string(rules, quote);
                    "gemma_str".to_string()
                }
                None if is_scalar(schema) => format!("%json {}", standalone(schema, &[&tool.parameters])),
                None => {
                    ensure_gemma_value(rules, quote);
                    "gemma_value".to_string()
                }
            };
            (format!("{head} {value}"), required)
        })
        .collect();
    chain(rules, prefix, &items, Some("\",\""))
}

/// `(key, schema, required)` for each declared property, in order.
fn properties(tool: &Tool) -> Vec<(&str, &Value, bool)> {
    let required: Vec<&str> = tool
        .parameters
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    let Some(Value::Object(props)) = tool.parameters.get("properties") else { return Vec::new() };
    props.iter().map(|(k, s)| (k.as_str(), s, required.contains(&k.as_str()))).collect()
}

/// A schema without declared properties still takes any arguments unless
/// it forbids additional ones.
fn open_ended(tool: &Tool) -> bool {
    tool.parameters.get("additionalProperties") != Some(&Value::Bool(false))
}

/// `Some(choices)` for a string-valued schema: its allowed values when it
/// lists them, else empty (any text).
fn string_choices(schema: &Value) -> Option<Vec<String>> {
    let strings =
        |v: &Value| -> Option<Vec<String>> { v.as_array()?.iter().map(|x| x.as_str().map(str::to_string)).collect() };
    if let Some(Value::String(c)) = schema.get("const") {
        return Some(vec![c.clone()]);
    }
    let declared = schema.get("type").and_then(Value::as_str);
    match (declared, schema.get("enum").and_then(strings)) {
        (Some("string") | None, Some(choices)) => Some(choices),
        (Some("string"), None) => Some(Vec::new()),
        _ => None,
    }
}

/// Types whose values Gemma writes exactly as JSON does.
fn is_scalar(schema: &Value) -> bool {
    matches!(schema.get("type").and_then(Value::as_str), Some("integer" | "number" | "boolean" | "null"))
}

fn is_bare_key(key: &str) -> bool {
    !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn quote_literal(quote: &Quote, text: &str) -> String {
    match &quote.token {
        Some(tok) => format!("{tok} {} {tok}", quoted(text)),
        None => quoted(&format!("{}{text}{}", quote.text, quote.text)),
    }
}

fn alternatives(choices: &[String]) -> String {
    choices.iter().map(|c| quoted(c)).collect::<Vec<_>>().join(" | ")
}

/// Items in order with optional ones skippable; `sep` goes between the
/// items present. Without a separator that is a plain sequence. With one,
/// rule `{prefix}_a{k}` writes items from k on when none came before and
/// `{prefix}_b{k}` when some did; every such rule matches something, so the
/// empty case is a `?` where it is referenced.
fn chain(rules: &mut Vec<String>, prefix: &str, items: &[(String, bool)], sep: Option<&str>) -> String {
    let Some(sep) = sep else {
        let parts: Vec<String> =
            items.iter().map(|(kv, required)| if *required { kv.clone() } else { format!("({kv})?") }).collect();
        return parts.join(" ");
    };
    let n = items.len();
    let required_from = |k: usize| items[k..].iter().any(|(_, r)| *r);
    let reference = |kind: char, k: usize| match k {
        k if k == n => String::new(),
        k if required_from(k) => format!("{prefix}_{kind}{k}"),
        k => format!("{prefix}_{kind}{k}?"),
    };
    for (k, (kv, required)) in items.iter().enumerate().skip(1) {
        let mut body = format!("{sep} {kv} {}", reference('b', k + 1));
        if !required && k + 1 < n {
            body.push_str(&format!(" | {prefix}_b{}", k + 1));
        }
        rules.push(format!("{prefix}_b{k}: {body}"));
    }
    let mut k = 0;
    loop {
        let (kv, required) = &items[k];
        let mut body = format!("{kv} {}", reference('b', k + 1));
        let skippable = !required && k + 1 < n;
        if skippable {
            body.push_str(&format!(" | {prefix}_a{}", k + 1));
        }
        rules.push(format!("{prefix}_a{k}: {body}"));
        if !skippable {
            break;
        }
        k += 1;
    }
    reference('a', 0)
}

fn add_once(rules: &mut Vec<String>, name: &str, body: &str) {
    let head = format!("{name}:");
    if !rules.iter().any(|r| r.starts_with(&head)) {
        rules.push(format!("{head} {body}"));
    }
}

/// Raw XML text up to and including the parameter's closing line; lazy, so
/// it stops at the first `\n</parameter>\n`.
fn ensure_xml_text(rules: &mut Vec<String>) {
    add_once(rules, "xml_text[lazy]", r"/(?s:.*)\n<\/parameter>\n/");
}

fn ensure_gemma_string(rules: &mut Vec<String>, quote: &Quote) {
    match &quote.token {
        // The delimiter is a token that text never spells, so the string
        // ends exactly where the model emits it.
        Some(tok) => {
            add_once(rules, "gemma_str", &format!("{tok} GEMMA_TEXT {tok} | {tok} {tok}"));
            add_once(rules, "GEMMA_TEXT", "/(?s:.+)/");
        }
        None => {
            add_once(rules, "gemma_str", &format!("{} gemma_str_rest", quoted(quote.text)));
            add_once(rules, "gemma_str_rest[lazy]", &format!("/(?s:.*){}/", regex_escape(quote.text)));
        }
    }
}

fn ensure_gemma_value(rules: &mut Vec<String>, quote: &Quote) {
    ensure_gemma_string(rules, quote);
    add_once(
        rules,
        "gemma_value",
        "gemma_str | GEMMA_NUMBER | \"true\" | \"false\" | \"null\" \
         | \"{\" (gemma_kv (\",\" gemma_kv)*)? \"}\" | \"[\" (gemma_value (\",\" gemma_value)*)? \"]\"",
    );
    add_once(rules, "gemma_kv", "GEMMA_KEY \":\" gemma_value");
    add_once(rules, "GEMMA_KEY", "/[A-Za-z_][A-Za-z0-9_]*/");
    add_once(rules, "GEMMA_NUMBER", r"/-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/");
}

/// Escapes text for a Lark `/.../` regex.
fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
