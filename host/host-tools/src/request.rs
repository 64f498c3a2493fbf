//! The tool part of a chat-completions request: `tools`, `tool_choice` and
//! `parallel_tool_calls`, checked the way OpenAI checks them.

use crate::error::ToolError;
use serde_json::{json, Map, Value};
use std::collections::HashSet;

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: Option<String>,
    /// A JSON Schema object describing the arguments.
    pub parameters: Value,
    pub strict: bool,
}

impl Tool {
    /// The schema of one top-level argument, if the tool declares it.
    pub fn property(&self, key: &str) -> Option<&Value> {
        self.parameters.get("properties")?.get(key)
    }
}

/// What the client asked of the model regarding tools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model decides between text and calls.
    Auto,
    /// The model must not call a tool.
    None,
    /// The model must call at least one tool.
    Required,
    /// The model must call this function.
    Named(String),
}

/// `tools`, `tool_choice` and `parallel_tool_calls` of one request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl ToolRequest {
    /// Reads the three fields from a chat-completions body (absent fields
    /// take OpenAI's defaults).
    pub fn from_body(body: &Value) -> Result<Self, ToolError> {
        let tools = parse_tools(body.get("tools"))?;
        let choice = parse_tool_choice(body.get("tool_choice"), &tools)?;
        let parallel = parse_parallel_tool_calls(body.get("parallel_tool_calls"))?;
        Ok(Self { tools, choice, parallel })
    }

    /// Whether calls may appear in the output at all.
    pub fn calls_possible(&self) -> bool {
        !self.tools.is_empty() && self.choice != ToolChoice::None
    }
}

/// Parses `tools`. Absent, null and `[]` all mean no tools.
pub fn parse_tools(value: Option<&Value>) -> Result<Vec<Tool>, ToolError> {
    let items = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ToolError::new("tools", "expected an array of tools")),
    };
    let mut seen = HashSet::new();
    let mut tools = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let tool = parse_tool(item, &format!("tools[{i}]"))?;
        if !seen.insert(tool.name.clone()) {
            return Err(ToolError::new(
                format!("tools[{i}].function.name"),
                format!("duplicate function name '{}'", tool.name),
            ));
        }
        tools.push(tool);
    }
    Ok(tools)
}

fn parse_tool(item: &Value, at: &str) -> Result<Tool, ToolError> {
    let obj = item.as_object().ok_or_else(|| ToolError::new(at, "expected an object"))?;
    match obj.get("type") {
        // A missing type is read as "function", the only kind there is.
        None => {}
        Some(Value::String(t)) if t == "function" => {}
        Some(other) => {
            return Err(ToolError::new(
                format!("{at}.type"),
                format!("unsupported tool type {other}; only \"function\" is supported"),
            ))
        }
    }
    let at = format!("{at}.function");
    let function = match obj.get("function") {
        Some(Value::Object(f)) => f,
        Some(_) => return Err(ToolError::new(at, "expected an object")),
        None => return Err(ToolError::new(at, "missing required parameter")),
    };
    let name = match function.get("name") {
        Some(Value::String(name)) => name.clone(),
        Some(_) => return Err(ToolError::new(format!("{at}.name"), "expected a string")),
        None => return Err(ToolError::new(format!("{at}.name"), "missing required parameter")),
    };
    check_function_name(&name, &format!("{at}.name"))?;
    let description = match function.get("description") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(_) => return Err(ToolError::new(format!("{at}.description"), "expected a string")),
    };
    let parameters = parse_parameters(function.get("parameters"), &format!("{at}.parameters"))?;
    let strict = match function.get("strict") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ToolError::new(format!("{at}.strict"), "expected a boolean")),
    };
    Ok(Tool { name, description, parameters, strict })
}

/// OpenAI's rule for function names: `^[a-zA-Z0-9_-]{1,64}$`. Chat templates
/// and call syntaxes embed the name verbatim, so nothing else is safe.
fn check_function_name(name: &str, at: &str) -> Result<(), ToolError> {
    if name.is_empty() {
        return Err(ToolError::new(at, "the function name is empty"));
    }
    if name.len() > 64 {
        return Err(ToolError::new(at, "the function name is longer than 64 characters"));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(ToolError::new(
            at,
            format!("'{name}' is not a valid function name (letters, digits, '_' and '-' only)"),
        ));
    }
    Ok(())
}

fn parse_parameters(value: Option<&Value>, at: &str) -> Result<Value, ToolError> {
    let schema = match value {
        None | Some(Value::Null) => return Ok(json!({ "type": "object", "properties": {} })),
        Some(Value::Object(schema)) => schema,
        Some(_) => return Err(ToolError::new(at, "expected a JSON Schema object")),
    };
    match schema.get("type") {
        None => {}
        Some(Value::String(t)) if t == "object" => {}
        Some(other) => {
            return Err(ToolError::new(at, format!("the parameters schema must have type \"object\", not {other}")))
        }
    }
    if let Some(props) = schema.get("properties") {
        if !props.is_object() {
            return Err(ToolError::new(at, "the parameters schema's properties must be an object"));
        }
    }
    Ok(Value::Object(schema.clone()))
}

/// Parses `tool_choice`. Absent or null: `auto` when there are tools, `none`
/// otherwise.
pub fn parse_tool_choice(value: Option<&Value>, tools: &[Tool]) -> Result<ToolChoice, ToolError> {
    let at = "tool_choice";
    let choice = match value {
        None | Some(Value::Null) => return Ok(if tools.is_empty() { ToolChoice::None } else { ToolChoice::Auto }),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(ToolError::new(
                    at,
                    format!("unknown value '{other}'; expected \"auto\", \"none\", \"required\" or a function"),
                ))
            }
        },
        Some(Value::Object(obj)) => named_choice(obj)?,
        Some(_) => return Err(ToolError::new(at, "expected a string or an object")),
    };
    match &choice {
        ToolChoice::Auto if tools.is_empty() => Ok(ToolChoice::None),
        ToolChoice::Required if tools.is_empty() => Err(ToolError::new(at, "\"required\" needs at least one tool")),
        ToolChoice::Named(name) if tools.is_empty() => {
            Err(ToolError::new(at, format!("names function '{name}' but the request has no tools")))
        }
        ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => {
            Err(ToolError::new(at, format!("names function '{name}', which is not in tools")))
        }
        _ => Ok(choice),
    }
}

fn named_choice(obj: &Map<String, Value>) -> Result<ToolChoice, ToolError> {
    match obj.get("type") {
        Some(Value::String(t)) if t == "function" => {}
        _ => return Err(ToolError::new("tool_choice.type", "expected \"function\"")),
    }
    match obj.get("function").and_then(|f| f.get("name")) {
        Some(Value::String(name)) => Ok(ToolChoice::Named(name.clone())),
        Some(_) => Err(ToolError::new("tool_choice.function.name", "expected a string")),
        None => Err(ToolError::new("tool_choice.function.name", "missing required parameter")),
    }
}

/// Parses `parallel_tool_calls` (default true).
pub fn parse_parallel_tool_calls(value: Option<&Value>) -> Result<bool, ToolError> {
    match value {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ToolError::new("parallel_tool_calls", "expected a boolean")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(name: &str) -> Value {
        json!({ "type": "function", "function": { "name": name } })
    }

    fn err_param(r: Result<impl std::fmt::Debug, ToolError>) -> String {
        r.expect_err("expected an error").param
    }

    #[test]
    fn reads_a_full_request() {
        let body = json!({
            "tools": [{ "type": "function", "function": {
                "name": "get_weather", "description": "Weather now",
                "parameters": { "type": "object", "properties": { "city": { "type": "string" } } },
                "strict": true
            }}],
            "tool_choice": { "type": "function", "function": { "name": "get_weather" } },
            "parallel_tool_calls": false
        });
        let r = ToolRequest::from_body(&body).unwrap();
        assert_eq!(r.tools.len(), 1);
        let t = &r.tools[0];
        assert_eq!((t.name.as_str(), t.description.as_deref(), t.strict), ("get_weather", Some("Weather now"), true));
        assert_eq!(t.property("city"), Some(&json!({ "type": "string" })));
        assert_eq!(r.choice, ToolChoice::Named("get_weather".into()));
        assert!(!r.parallel);
        assert!(r.calls_possible());
    }

    #[test]
    fn defaults() {
        let r = ToolRequest::from_body(&json!({ "tools": [function("f")] })).unwrap();
        assert_eq!(r.choice, ToolChoice::Auto);
        assert!(r.parallel);
        assert_eq!(r.tools[0].parameters, json!({ "type": "object", "properties": {} }));
        assert_eq!(r.tools[0].description, None);
        assert!(!r.tools[0].strict);
        let none = ToolRequest::from_body(&json!({})).unwrap();
        assert_eq!((none.tools.len(), none.choice.clone()), (0, ToolChoice::None));
        assert!(!none.calls_possible());
        let auto_without_tools = ToolRequest::from_body(&json!({ "tool_choice": "auto", "tools": [] })).unwrap();
        assert_eq!(auto_without_tools.choice, ToolChoice::None);
    }

    #[test]
    fn choice_strings() {
        let tools = parse_tools(Some(&json!([function("f")]))).unwrap();
        for (s, c) in [("auto", ToolChoice::Auto), ("none", ToolChoice::None), ("required", ToolChoice::Required)] {
            assert_eq!(parse_tool_choice(Some(&json!(s)), &tools).unwrap(), c);
        }
        assert_eq!(err_param(parse_tool_choice(Some(&json!("always")), &tools)), "tool_choice");
        assert_eq!(err_param(parse_tool_choice(Some(&json!(3)), &tools)), "tool_choice");
    }

    #[test]
    fn rejects_bad_tools() {
        let cases = [
            (json!({ "type": "function" }), "tools"),
            (json!([{ "type": "retrieval", "function": { "name": "f" } }]), "tools[0].type"),
            (json!([function("f"), { "type": "function" }]), "tools[1].function"),
            (json!([{ "type": "function", "function": {} }]), "tools[0].function.name"),
            (json!([function("")]), "tools[0].function.name"),
            (json!([function("has space")]), "tools[0].function.name"),
            (json!([function(&"x".repeat(65))]), "tools[0].function.name"),
            (json!([function("a"), function("b"), function("a")]), "tools[2].function.name"),
            (
                json!([{ "type": "function", "function": { "name": "f", "parameters": [] } }]),
                "tools[0].function.parameters",
            ),
            (
                json!([{ "type": "function", "function": { "name": "f", "parameters": { "type": "string" } } }]),
                "tools[0].function.parameters",
            ),
            (
                json!([{ "type": "function", "function": { "name": "f", "description": 3 } }]),
                "tools[0].function.description",
            ),
            (json!([3]), "tools[0]"),
        ];
        for (tools, param) in cases {
            assert_eq!(err_param(parse_tools(Some(&tools))), param, "{tools}");
        }
        assert!(parse_tools(Some(&json!([function(&"x".repeat(64))]))).is_ok());
        assert!(parse_tools(Some(&json!([{ "function": { "name": "no-type_ok" } }]))).is_ok());
    }

    #[test]
    fn rejects_choices_that_cannot_be_met() {
        let tools = parse_tools(Some(&json!([function("f")]))).unwrap();
        let named = |n: &str| json!({ "type": "function", "function": { "name": n } });
        assert_eq!(err_param(parse_tool_choice(Some(&named("g")), &tools)), "tool_choice");
        assert_eq!(err_param(parse_tool_choice(Some(&named("f")), &[])), "tool_choice");
        assert_eq!(err_param(parse_tool_choice(Some(&json!("required")), &[])), "tool_choice");
        let no_name = json!({ "type": "function", "function": {} });
        assert_eq!(err_param(parse_tool_choice(Some(&no_name), &tools)), "tool_choice.function.name");
        let bad_type = json!({ "type": "tool", "function": { "name": "f" } });
        assert_eq!(err_param(parse_tool_choice(Some(&bad_type), &tools)), "tool_choice.type");
        assert_eq!(err_param(parse_parallel_tool_calls(Some(&json!("yes")))), "parallel_tool_calls");
    }
}
