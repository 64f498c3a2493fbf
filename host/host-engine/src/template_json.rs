//! The `tojson` filter as Hugging Face's chat templates get it from
//! transformers: Python's `json.dumps(value, ensure_ascii=False,
//! indent=indent)`, i.e. `", "` and `": "` between items and keys in the
//! order given. minijinja's own filter writes compact JSON, which would put
//! other tokens into every prompt that shows a tool schema or a tool call's
//! arguments.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Error, ErrorKind, Value};

pub fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let _: Option<Value> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    write(&value, indent, sort_keys.unwrap_or(false), 0, &mut out)?;
    // Safe in templates: JSON text, marked so autoescaping leaves it alone.
    Ok(Value::from_safe_string(out))
}

fn newline(indent: Option<usize>, depth: usize, out: &mut String) {
    if let Some(n) = indent {
        out.push('\n');
        out.extend(std::iter::repeat_n(' ', n * depth));
    }
}

fn write(v: &Value, indent: Option<usize>, sort: bool, depth: usize, out: &mut String) -> Result<(), Error> {
    let item_sep = if indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number(v)),
        ValueKind::String => out.push_str(&serde_json::to_string(v.as_str().unwrap_or_default()).unwrap_or_default()),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(indent, depth + 1, out);
                write(item, indent, sort, depth + 1, out)?;
            }
            newline(indent, depth, out);
            out.push(']');
        }
        ValueKind::Map => {
            let mut keys: Vec<Value> = v.try_iter()?.collect();
            if sort {
                keys.sort_by_key(|k| k.to_string());
            }
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(indent, depth + 1, out);
                let key = match k.as_str() {
                    Some(s) => s.to_owned(),
                    None => k.to_string(),
                };
                out.push_str(&serde_json::to_string(&key).unwrap_or_default());
                out.push_str(": ");
                write(&v.get_item(k)?, indent, sort, depth + 1, out)?;
            }
            newline(indent, depth, out);
            out.push('}');
        }
        _ => return Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: cannot serialise {}", v.kind()))),
    }
    Ok(())
}

/// A number as Python prints it: integers bare, floats with a fraction.
fn number(v: &Value) -> String {
    if v.is_integer() {
        return v.to_string();
    }
    match f64::try_from(v.clone()) {
        Ok(f) if f.is_finite() && f == f.trunc() && f.abs() < 1e16 => format!("{f:.1}"),
        Ok(f) if f.is_finite() => format!("{f}"),
        Ok(f) if f.is_nan() => "NaN".to_owned(),
        Ok(f) if f > 0.0 => "Infinity".to_owned(),
        Ok(_) => "-Infinity".to_owned(),
        Err(_) => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, ctx: serde_json::Value) -> String {
        let mut env = minijinja::Environment::new();
        env.add_filter("tojson", tojson);
        env.render_str(src, Value::from_serialize(ctx)).unwrap()
    }

    #[test]
    fn writes_what_python_json_dumps_writes() {
        // Expected strings are Python's json.dumps(v, ensure_ascii=False[, indent=2]).
        let v = serde_json::json!({"name": "get_weather", "parameters": {"type": "object", "z": [1, 2.5, 3.0], "a": null, "ok": true, "s": "é\"\n"}});
        assert_eq!(
            render("{{ v | tojson }}", serde_json::json!({ "v": v })),
            r#"{"name": "get_weather", "parameters": {"type": "object", "z": [1, 2.5, 3.0], "a": null, "ok": true, "s": "é\"\n"}}"#
        );
        assert_eq!(
            render("{{ v | tojson(indent=2) }}", serde_json::json!({ "v": {"a": [1, {}], "b": []} })),
            "{\n  \"a\": [\n    1,\n    {}\n  ],\n  \"b\": []\n}"
        );
        assert_eq!(render("{{ v | tojson }}", serde_json::json!({ "v": "x<y" })), "\"x<y\"");
    }
}
