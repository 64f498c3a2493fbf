//! Gemma 4 and FunctionCallTags calls: `call:NAME{key:value,...}`, a JSON-like
//! notation with bare keys and strings between a delimiter token (`<|"|>`
//! for Gemma 4, `<escape>` for FunctionCallTags) that needs no escaping inside.

use crate::decoded::{is_name_char, Decoded};
use serde_json::{Map, Value};

/// One or more `call:NAME{...}` in a row.
pub(crate) fn decode(text: &str, quote: &str) -> Option<Vec<Decoded>> {
    let mut r = Reader { rest: text, quote };
    let mut calls = Vec::new();
    loop {
        r.skip_ws();
        if r.rest.is_empty() {
            return Some(calls);
        }
        r.eat("call:").then_some(())?;
        let len = r.rest.find(|c| !is_name_char(c)).unwrap_or(r.rest.len());
        if len == 0 {
            return None;
        }
        let name = r.rest[..len].to_string();
        r.rest = &r.rest[len..];
        r.skip_ws();
        let Value::Object(arguments) = r.object()? else { return None };
        calls.push(Decoded { name, arguments });
    }
}

struct Reader<'a> {
    rest: &'a str,
    quote: &'a str,
}

impl Reader<'_> {
    fn skip_ws(&mut self) {
        self.rest = self.rest.trim_start();
    }

    fn eat(&mut self, s: &str) -> bool {
        match self.rest.strip_prefix(s) {
            Some(after) => {
                self.rest = after;
                true
            }
            None => false,
        }
    }

    fn value(&mut self) -> Option<Value> {
        self.skip_ws();
        if self.rest.starts_with(self.quote) {
            return self.quoted().map(Value::String);
        }
        match self.rest.chars().next()? {
            '{' => self.object(),
            '[' => self.array(),
            '"' => self.json_string().map(Value::String),
            _ => self.bare(),
        }
    }

    /// `{key:value,...}`; the reader stands on `{`.
    fn object(&mut self) -> Option<Value> {
        self.eat("{").then_some(())?;
        let mut map = Map::new();
        self.skip_ws();
        if self.eat("}") {
            return Some(Value::Object(map));
        }
        loop {
            let key = self.key()?;
            self.skip_ws();
            self.eat(":").then_some(())?;
            let value = self.value()?;
            map.insert(key, value);
            self.skip_ws();
            if self.eat("}") {
                return Some(Value::Object(map));
            }
            self.eat(",").then_some(())?;
        }
    }

    fn array(&mut self) -> Option<Value> {
        self.eat("[").then_some(())?;
        let mut items = Vec::new();
        self.skip_ws();
        if self.eat("]") {
            return Some(Value::Array(items));
        }
        loop {
            items.push(self.value()?);
            self.skip_ws();
            if self.eat("]") {
                return Some(Value::Array(items));
            }
            self.eat(",").then_some(())?;
        }
    }

    fn key(&mut self) -> Option<String> {
        self.skip_ws();
        if self.rest.starts_with(self.quote) {
            return self.quoted();
        }
        if self.rest.starts_with('"') {
            return self.json_string();
        }
        let len = self.rest.find(':')?;
        let key = self.rest[..len].trim();
        if key.is_empty() || key.contains(['{', '}', '[', ']', ',']) {
            return None;
        }
        self.rest = &self.rest[len..];
        Some(key.to_string())
    }

    /// Text between two delimiters, taken as it is.
    fn quoted(&mut self) -> Option<String> {
        let after = &self.rest[self.quote.len()..];
        let end = after.find(self.quote)?;
        self.rest = &after[end + self.quote.len()..];
        Some(after[..end].to_string())
    }

    fn json_string(&mut self) -> Option<String> {
        let mut escaped = false;
        for (i, c) in self.rest.char_indices().skip(1) {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    let s = serde_json::from_str::<String>(&self.rest[..=i]).ok()?;
                    self.rest = &self.rest[i + 1..];
                    return Some(s);
                }
                _ => {}
            }
        }
        None
    }

    /// Numbers, true, false and null; anything else up to the next `,`, `}`
    /// or `]` is read as a string, which is how FunctionCallTags writes some.
    fn bare(&mut self) -> Option<Value> {
        let len = self.rest.find([',', '}', ']']).unwrap_or(self.rest.len());
        let raw = self.rest[..len].trim();
        if raw.is_empty() {
            return None;
        }
        self.rest = &self.rest[len..];
        let value =
            serde_json::from_str::<Value>(raw).ok().filter(|v| !v.is_object() && !v.is_array() && !v.is_string());
        Some(value.unwrap_or_else(|| Value::String(raw.to_string())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const Q: &str = "<|\"|>";

    fn args(text: &str, quote: &str) -> Option<Vec<(String, Value)>> {
        let calls = decode(text, quote)?;
        Some(calls.into_iter().map(|c| (c.name, Value::Object(c.arguments))).collect())
    }

    #[test]
    fn gemma4_values() {
        let text = r#"call:search{query:<|"|>a, "b" {c}<|"|>,limit:5,exact:false,w:0.5,none:null,tags:[<|"|>x<|"|>,2],opts:{deep:true,name:<|"|>n<|"|>}}"#;
        assert_eq!(
            args(text, Q),
            Some(vec![(
                "search".into(),
                json!({ "query": "a, \"b\" {c}", "limit": 5, "exact": false, "w": 0.5, "none": null,
                        "tags": ["x", 2], "opts": { "deep": true, "name": "n" } })
            )])
        );
        assert_eq!(args("call:pwd{}", Q), Some(vec![("pwd".into(), json!({}))]));
        let two = args("call:a{x:1} call:b{y:<|\"|>z<|\"|>}", Q).unwrap();
        assert_eq!(two, vec![("a".into(), json!({ "x": 1 })), ("b".into(), json!({ "y": "z" }))]);
    }

    #[test]
    fn function_gemma_values() {
        let text = "call:set_alarm{time:<escape>07:30<escape>,label:wake up,days:[1,2]}";
        assert_eq!(
            args(text, "<escape>"),
            Some(vec![("set_alarm".into(), json!({ "time": "07:30", "label": "wake up", "days": [1, 2] }))])
        );
    }

    #[test]
    fn rejects() {
        for text in ["call:f{a:<|\"|>open}", "call:f{a:1", "f{a:1}", "call:{a:1}", "call:f{:1}", "call:f{a:1,}"] {
            assert_eq!(args(text, Q), None, "{text}");
        }
    }
}
