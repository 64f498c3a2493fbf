//! Structured output as requests ask for it: OpenAI's `response_format`
//! (`json_object`, `json_schema`) and vLLM's extensions (`guided_json`,
//! `guided_regex`, `guided_choice`, `guided_grammar`, and the newer
//! `structured_outputs` object), read into one engine grammar, and compiled
//! against the model's tokenizer so that a bad schema, regex or grammar is a
//! 400 naming its parameter before anything is queued.

use crate::error::ApiError;
use crate::wire::Fields;
use host_engine::constraint::{Constraint, Grammar};
use host_engine::tokenizer::TextSide;
use serde_json::Value;

/// The grammar a request asks for and the parameter that asked for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Requested {
    pub grammar: Grammar,
    pub param: String,
}

/// Reads every structured-output field of a request; at most one may ask
/// for a grammar.
pub fn requested(f: &Fields) -> Result<Option<Requested>, ApiError> {
    let mut found: Vec<Requested> = Vec::new();
    if let Some(rf) = f.value("response_format") {
        if let Some(g) = response_format(rf)? {
            found.push(g);
        }
    }
    for key in ["guided_json", "guided_regex", "guided_choice", "guided_grammar"] {
        if let Some(v) = f.value(key) {
            found.push(Requested { grammar: guided(key, v, key)?, param: key.to_owned() });
        }
    }
    if f.boolean("guided_json_object")? {
        found.push(Requested { grammar: Grammar::JsonObject, param: "guided_json_object".into() });
    }
    if let Some(so) = f.value("structured_outputs") {
        let o = so.as_object().ok_or_else(|| ApiError::param("structured_outputs", "must be an object"))?;
        for (key, v) in o.iter().filter(|(_, v)| !v.is_null()) {
            let param = format!("structured_outputs.{key}");
            let grammar = match key.as_str() {
                "json" => guided("guided_json", v, &param)?,
                "regex" => guided("guided_regex", v, &param)?,
                "choice" => guided("guided_choice", v, &param)?,
                "grammar" => guided("guided_grammar", v, &param)?,
                "json_object" => match v.as_bool() {
                    Some(true) => Grammar::JsonObject,
                    Some(false) => continue,
                    None => return Err(ApiError::param(&param, "must be true or false")),
                },
                "structural_tag" => {
                    return Err(ApiError::unsupported(&param, "structural tags are not supported (use a grammar)"))
                }
                // vLLM's knobs that do not select a grammar.
                "disable_fallback"
                | "disable_any_whitespace"
                | "disable_additional_properties"
                | "whitespace_pattern" => continue,
                other => return Err(ApiError::param(&param, format!("unknown structured output `{other}`"))),
            };
            found.push(Requested { grammar, param });
        }
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|r| r.param.as_str()).collect();
        return Err(ApiError::param(
            &found[1].param,
            format!("only one structured output may be asked for; got {}", names.join(", ")),
        ));
    }
    Ok(found.pop())
}

fn response_format(rf: &Value) -> Result<Option<Requested>, ApiError> {
    let p = "response_format";
    let t = rf.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::param(p, "`response_format` needs a string `type` (text, json_object, json_schema)")
    })?;
    let grammar = match t {
        "text" => return Ok(None),
        "json_object" => Grammar::JsonObject,
        "json_schema" => {
            let js = rf.get("json_schema").filter(|v| v.is_object()).ok_or_else(|| {
                ApiError::param(
                    "response_format.json_schema",
                    "`json_schema` must be an object with `name` and `schema`",
                )
            })?;
            match js.get("name") {
                Some(Value::String(n)) if valid_name(n) => {}
                Some(_) | None => {
                    return Err(ApiError::param(
                        "response_format.json_schema.name",
                        "`name` must be a string of letters, digits, `_` or `-`, at most 64 long",
                    ))
                }
            }
            if js.get("strict").is_some_and(|s| !s.is_null() && !s.is_boolean()) {
                return Err(ApiError::param("response_format.json_schema.strict", "`strict` must be true or false"));
            }
            // Without a schema, any JSON value is what OpenAI's `schema: {}` means.
            match js.get("schema") {
                None | Some(Value::Null) => Grammar::JsonSchema(serde_json::json!({})),
                Some(s @ Value::Object(_)) => Grammar::JsonSchema(s.clone()),
                Some(_) => {
                    return Err(ApiError::param("response_format.json_schema.schema", "`schema` must be a JSON object"))
                }
            }
        }
        other => {
            return Err(ApiError::param(
                "response_format.type",
                format!("unknown response_format type `{other}` (text, json_object, json_schema)"),
            ))
        }
    };
    Ok(Some(Requested { grammar, param: p.to_owned() }))
}

/// The Responses API's `text.format`, whose `json_schema` is flat:
/// `{"type": "json_schema", "name", "schema", "strict", "description"}`.
/// `text` is the request's `text` object.
pub fn text_format(text: Option<&Value>) -> Result<Option<Requested>, ApiError> {
    let format = match text {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(t)) => match t.get("format") {
            None | Some(Value::Null) => return Ok(None),
            Some(f @ Value::Object(_)) => f,
            Some(_) => return Err(ApiError::param("text.format", "`text.format` must be an object")),
        },
        Some(_) => return Err(ApiError::param("text", "`text` must be an object")),
    };
    let p = "text.format";
    let grammar = match format.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => Grammar::JsonObject,
        Some("json_schema") => {
            match format.get("name") {
                Some(Value::String(n)) if valid_name(n) => {}
                _ => {
                    return Err(ApiError::param(
                        "text.format.name",
                        "`name` must be a string of letters, digits, `_` or `-`, at most 64 long",
                    ))
                }
            }
            if format.get("strict").is_some_and(|s| !s.is_null() && !s.is_boolean()) {
                return Err(ApiError::param("text.format.strict", "`strict` must be true or false"));
            }
            match format.get("schema") {
                Some(s @ Value::Object(_)) => Grammar::JsonSchema(s.clone()),
                _ => return Err(ApiError::param("text.format.schema", "`schema` must be a JSON Schema object")),
            }
        }
        Some(other) => {
            return Err(ApiError::param(
                "text.format.type",
                format!("unknown text.format type `{other}` (text, json_object, json_schema)"),
            ))
        }
        None => return Err(ApiError::param("text.format.type", "`text.format` needs a string `type`")),
    };
    Ok(Some(Requested { grammar, param: p.to_owned() }))
}

fn valid_name(n: &str) -> bool {
    !n.is_empty() && n.len() <= 64 && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// One of vLLM's `guided_*` values (`kind`), reported as `param`.
fn guided(kind: &str, v: &Value, param: &str) -> Result<Grammar, ApiError> {
    match kind {
        "guided_json" => match v {
            Value::Object(_) | Value::Bool(_) => Ok(Grammar::JsonSchema(v.clone())),
            // vLLM also takes the schema as a JSON string.
            Value::String(s) => match serde_json::from_str::<Value>(s) {
                Ok(schema @ (Value::Object(_) | Value::Bool(_))) => Ok(Grammar::JsonSchema(schema)),
                _ => Err(ApiError::param(param, "must be a JSON Schema (an object, or a string holding one)")),
            },
            _ => Err(ApiError::param(param, "must be a JSON Schema (an object, or a string holding one)")),
        },
        "guided_regex" => match v.as_str() {
            Some(rx) if !rx.is_empty() => Ok(Grammar::Regex(rx.to_owned())),
            _ => Err(ApiError::param(param, "must be a non-empty regular expression string")),
        },
        "guided_choice" => {
            let options: Option<Vec<String>> =
                v.as_array().map(|a| a.iter().map(|x| x.as_str().map(str::to_owned)).collect()).unwrap_or(None);
            match options {
                Some(o) if !o.is_empty() && o.iter().all(|s| !s.is_empty()) => Ok(Grammar::Choice(o)),
                _ => Err(ApiError::param(param, "must be a non-empty array of non-empty strings")),
            }
        }
        _ => match v.as_str() {
            Some(g) if !g.trim().is_empty() => Ok(Grammar::Lark(g.to_owned())),
            _ => Err(ApiError::param(param, "must be a grammar (llguidance's Lark syntax) as a string")),
        },
    }
}

/// Compiles `r` against the model's tokenizer: a 400 naming the parameter
/// when the grammar is refused.
pub fn compile(text: Option<&TextSide>, r: &Requested) -> Result<Constraint, ApiError> {
    let text = text.ok_or_else(|| {
        ApiError::unsupported(&r.param, "structured output needs the model's tokenizer, and this model has none")
    })?;
    let compiler = text.grammar().map_err(|e| ApiError::unsupported(&r.param, e.to_string()))?;
    compiler.compile(&r.grammar).map_err(|e| ApiError::param(&r.param, format!("the grammar is refused: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ask(body: Value) -> Result<Option<Requested>, ApiError> {
        let o = body.as_object().unwrap().clone();
        requested(&Fields(&o))
    }

    #[test]
    fn each_form_reads_into_its_grammar() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let cases = [
            (json!({"response_format": {"type": "text"}}), None),
            (json!({"response_format": {"type": "json_object"}}), Some(Grammar::JsonObject)),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}),
                Some(Grammar::JsonSchema(schema.clone())),
            ),
            (json!({"guided_json": schema.to_string()}), Some(Grammar::JsonSchema(schema.clone()))),
            (json!({"guided_regex": "[a-z]+"}), Some(Grammar::Regex("[a-z]+".into()))),
            (json!({"guided_choice": ["yes", "no"]}), Some(Grammar::Choice(vec!["yes".into(), "no".into()]))),
            (json!({"guided_grammar": "start: \"a\""}), Some(Grammar::Lark("start: \"a\"".into()))),
            (json!({"structured_outputs": {"choice": ["a"]}}), Some(Grammar::Choice(vec!["a".into()]))),
            (json!({"structured_outputs": {"json_object": true}}), Some(Grammar::JsonObject)),
        ];
        for (body, want) in cases {
            assert_eq!(ask(body.clone()).unwrap().map(|r| r.grammar), want, "{body}");
        }
    }

    #[test]
    fn responses_text_format_reads_flat_schemas() {
        let schema = json!({"type": "object"});
        let ok = [
            (json!({"format": {"type": "text"}}), None),
            (json!({"format": {"type": "json_object"}}), Some(Grammar::JsonObject)),
            (
                json!({"format": {"type": "json_schema", "name": "n", "schema": schema, "strict": true}}),
                Some(Grammar::JsonSchema(schema.clone())),
            ),
            (json!({"verbosity": "low"}), None),
        ];
        for (text, want) in ok {
            assert_eq!(text_format(Some(&text)).unwrap().map(|r| r.grammar), want, "{text}");
        }
        let bad = [
            (json!("json"), "text"),
            (json!({"format": "json"}), "text.format"),
            (json!({"format": {"type": "xml"}}), "text.format.type"),
            (json!({"format": {"type": "json_schema", "schema": {}}}), "text.format.name"),
            (json!({"format": {"type": "json_schema", "name": "n"}}), "text.format.schema"),
            (json!({"format": {"type": "json_schema", "name": "n", "schema": {}, "strict": 1}}), "text.format.strict"),
        ];
        for (text, param) in bad {
            assert_eq!(text_format(Some(&text)).unwrap_err().param.as_deref(), Some(param), "{text}");
        }
    }

    #[test]
    fn bad_forms_name_their_parameter() {
        let cases = [
            (json!({"response_format": {"type": "xml"}}), "response_format.type"),
            (json!({"response_format": {"type": "json_schema"}}), "response_format.json_schema"),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}}),
                "response_format.json_schema.name",
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": [1]}}}),
                "response_format.json_schema.schema",
            ),
            (json!({"guided_choice": []}), "guided_choice"),
            (json!({"guided_regex": 3}), "guided_regex"),
            (json!({"guided_json": "{not json"}), "guided_json"),
            (json!({"structured_outputs": {"regex": ""}}), "structured_outputs.regex"),
            (json!({"guided_regex": "a", "guided_choice": ["a"]}), "guided_choice"),
        ];
        for (body, param) in cases {
            let e = ask(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {}", e.message);
            assert_eq!(e.status, 400);
        }
    }
}
