//! Which tool-call syntax a model speaks, read from what its folder shows:
//! the chat template's source and the tokenizer's added tokens. A model
//! family's name says nothing reliable (fine-tunes change templates), so it
//! is never consulted.

/// How a model writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolSyntax {
    /// No syntax of its own: `{"name": ..., "arguments": {...}}`, or an array
    /// of those. What a grammar forces when the template has no tool syntax.
    Json,
    /// Hermes / Qwen2.5 / Qwen3: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`.
    Hermes,
    /// Qwen3-Coder / Qwen3.5: `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>`.
    XmlFunction,
    /// Llama 3.x: `{"name": ..., "parameters": {...}}`, optionally after `<|python_tag|>`.
    PythonTagJson,
    /// Older Mistral templates: `[TOOL_CALLS][{"name": ..., "arguments": {...}}]`.
    ToolCallsList,
    /// Newer Mistral templates: `[TOOL_CALLS]NAME[ARGS]{...}`.
    ToolCallsArgs,
    /// Gemma 4: `<|tool_call>call:NAME{key:<|"|>text<|"|>,n:1}<tool_call|>`.
    PipeToolCall,
    /// FunctionGemma: `<start_function_call>call:NAME{key:<escape>text<escape>}<end_function_call>`.
    FunctionCallTags,
}

impl ToolSyntax {
    /// Detects the syntax from the chat template's source and the added
    /// tokens (`(content, special)`). The template decides when it names a
    /// syntax, since it is what renders past calls for the model; the added
    /// tokens are read only when it names none (some conversions keep the
    /// markers in the vocabulary but not in the template).
    /// [`ToolSyntax::Json`] when neither shows one.
    pub fn detect(template: &str, added_tokens: &[(String, bool)]) -> ToolSyntax {
        from_template(template).or_else(|| from_tokens(added_tokens)).unwrap_or(ToolSyntax::Json)
    }

    /// Whether the model has a syntax of its own (it was trained to call tools).
    pub fn is_native(self) -> bool {
        self != ToolSyntax::Json
    }

    /// The markers that can open a call. `{` and `[` (Json, PythonTagJson) open
    /// one only where the answer, or the text after a previous call, begins.
    pub fn start_markers(self) -> &'static [&'static str] {
        match self {
            ToolSyntax::Json => &["{", "["],
            ToolSyntax::Hermes => &["<tool_call>"],
            ToolSyntax::XmlFunction => &["<tool_call>", "<function="],
            ToolSyntax::PythonTagJson => &["<|python_tag|>", "{"],
            ToolSyntax::ToolCallsList | ToolSyntax::ToolCallsArgs => &["[TOOL_CALLS]"],
            ToolSyntax::PipeToolCall => &["<|tool_call>"],
            ToolSyntax::FunctionCallTags => &["<start_function_call>"],
        }
    }

    /// The marker that closes a call, or `None` where the call ends with its
    /// JSON value.
    pub fn end_marker(self) -> Option<&'static str> {
        match self {
            ToolSyntax::Hermes | ToolSyntax::XmlFunction => Some("</tool_call>"),
            ToolSyntax::PipeToolCall => Some("<tool_call|>"),
            ToolSyntax::FunctionCallTags => Some("<end_function_call>"),
            ToolSyntax::Json | ToolSyntax::PythonTagJson | ToolSyntax::ToolCallsList | ToolSyntax::ToolCallsArgs => {
                None
            }
        }
    }

    /// A short name for logs and `/debug` output.
    pub fn name(self) -> &'static str {
        match self {
            ToolSyntax::Json => "json",
            ToolSyntax::Hermes => "hermes",
            ToolSyntax::XmlFunction => "xml-function",
            ToolSyntax::PythonTagJson => "python-tag-json",
            ToolSyntax::ToolCallsList => "tool-calls-list",
            ToolSyntax::ToolCallsArgs => "tool-calls-args",
            ToolSyntax::PipeToolCall => "pipe-tool-call",
            ToolSyntax::FunctionCallTags => "function-call-tags",
        }
    }
}

/// Checked most specific first: Gemma 4's `<|tool_call>` and Qwen's XML both
/// sit next to strings that a looser check would take for another syntax.
fn from_template(t: &str) -> Option<ToolSyntax> {
    let has = |s: &str| t.contains(s);
    if has("<|tool_call>") && has("<tool_call|>") {
        Some(ToolSyntax::PipeToolCall)
    } else if has("<start_function_call>") {
        Some(ToolSyntax::FunctionCallTags)
    } else if has("<function=") && (has("<parameter=") || has("<tool_call>")) {
        Some(ToolSyntax::XmlFunction)
    } else if has("<tool_call>") {
        Some(ToolSyntax::Hermes)
    } else if has("[TOOL_CALLS]") {
        Some(if has("[ARGS]") { ToolSyntax::ToolCallsArgs } else { ToolSyntax::ToolCallsList })
    } else if has("<|python_tag|>") || has("dictionary of argument name and its value") {
        // The second is the instruction Llama 3.1-3.3 templates give for JSON calls.
        Some(ToolSyntax::PythonTagJson)
    } else {
        None
    }
}

fn from_tokens(tokens: &[(String, bool)]) -> Option<ToolSyntax> {
    let has = |s: &str| tokens.iter().any(|(c, _)| c == s);
    if has("<|tool_call>") && has("<tool_call|>") {
        Some(ToolSyntax::PipeToolCall)
    } else if has("<start_function_call>") {
        Some(ToolSyntax::FunctionCallTags)
    } else if has("[TOOL_CALLS]") {
        Some(if has("[ARGS]") { ToolSyntax::ToolCallsArgs } else { ToolSyntax::ToolCallsList })
    } else if has("<tool_call>") && has("</tool_call>") {
        Some(ToolSyntax::Hermes)
    } else if has("<|python_tag|>") {
        Some(ToolSyntax::PythonTagJson)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = r##"{%- if tools %}{{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}{%- endif %}{%- for tool_call in message.tool_calls %}{{- '<tool_call>\n{"name": "' }}{{- tool_call.name }}{%- endfor %}"##;
    const QWEN3_CODER: &str = r#"{{- "\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n</function>\n</tool_call>" }}{{- '<tool_call>\n<function=' + tool_call.name + '>\n' }}"#;
    const LLAMA31: &str = r#"{{- 'Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n' }}{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}{{- "<|python_tag|>" + tool_call.name + ".call(" }}"#;
    const LLAMA_NO_TAG: &str = r#"{{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}"#;
    const MISTRAL_V7: &str = r#"{%- if message.tool_calls %}{{- "[TOOL_CALLS][" }}{%- for tool_call in message.tool_calls %}{{- tool_call.function|tojson }}{%- endfor %}{{- "]" + eos_token }}{%- endif %}"#;
    const MISTRAL_V11: &str = r#"{%- for tool in message.tool_calls %}{{- '[TOOL_CALLS]' + tool.function.name + '[ARGS]' + arguments }}{%- endfor %}"#;
    const GEMMA4: &str = r#"{%- for tool_call in message['tool_calls'] -%}{{- '<|tool_call>call:' + function['name'] + '{' -}}{{- '}<tool_call|>' -}}{%- endfor -%}{{- '<|"|>' -}}"#;
    const FUNCTION_GEMMA: &str = r#"{{- '<start_function_call>call:' + tool_call['function']['name'] + '{' -}}{{- '<escape>' -}}{{- '}<end_function_call>' -}}"#;
    const PLAIN: &str = "{% for message in messages %}{{ message.role }}: {{ message.content }}\n{% endfor %}";

    fn tokens(list: &[&str]) -> Vec<(String, bool)> {
        list.iter().map(|s| (s.to_string(), true)).collect()
    }

    #[test]
    fn templates_decide() {
        let none: Vec<(String, bool)> = Vec::new();
        let cases = [
            (QWEN3, ToolSyntax::Hermes),
            (QWEN3_CODER, ToolSyntax::XmlFunction),
            (LLAMA31, ToolSyntax::PythonTagJson),
            (LLAMA_NO_TAG, ToolSyntax::PythonTagJson),
            (MISTRAL_V7, ToolSyntax::ToolCallsList),
            (MISTRAL_V11, ToolSyntax::ToolCallsArgs),
            (GEMMA4, ToolSyntax::PipeToolCall),
            (FUNCTION_GEMMA, ToolSyntax::FunctionCallTags),
            (PLAIN, ToolSyntax::Json),
            ("", ToolSyntax::Json),
        ];
        for (template, want) in cases {
            assert_eq!(ToolSyntax::detect(template, &none), want, "{template}");
        }
    }

    #[test]
    fn template_wins_over_tokens() {
        // A Qwen-like vocabulary with an XML template is XML, not Hermes.
        let qwen_tokens = tokens(&["<tool_call>", "</tool_call>", "<|im_end|>"]);
        assert_eq!(ToolSyntax::detect(QWEN3_CODER, &qwen_tokens), ToolSyntax::XmlFunction);
        assert_eq!(ToolSyntax::detect(MISTRAL_V7, &tokens(&["[TOOL_CALLS]", "[ARGS]"])), ToolSyntax::ToolCallsList);
    }

    #[test]
    fn tokens_decide_when_the_template_is_silent() {
        let cases = [
            (vec!["<|tool_call>", "<tool_call|>", "<|\"|>"], ToolSyntax::PipeToolCall),
            (vec!["<start_function_call>", "<end_function_call>"], ToolSyntax::FunctionCallTags),
            (vec!["[TOOL_CALLS]"], ToolSyntax::ToolCallsList),
            (vec!["[TOOL_CALLS]", "[ARGS]"], ToolSyntax::ToolCallsArgs),
            (vec!["<tool_call>", "</tool_call>"], ToolSyntax::Hermes),
            (vec!["<|python_tag|>", "<|eom_id|>"], ToolSyntax::PythonTagJson),
            (vec!["<tool_call>"], ToolSyntax::Json),
            (vec!["<|im_start|>", "<|im_end|>"], ToolSyntax::Json),
        ];
        for (list, want) in cases {
            assert_eq!(ToolSyntax::detect(PLAIN, &tokens(&list)), want, "{list:?}");
        }
    }

    #[test]
    fn markers() {
        assert_eq!(ToolSyntax::Hermes.start_markers(), &["<tool_call>"]);
        assert_eq!(ToolSyntax::Hermes.end_marker(), Some("</tool_call>"));
        assert_eq!(ToolSyntax::ToolCallsArgs.end_marker(), None);
        assert!(!ToolSyntax::Json.is_native());
        assert!(ToolSyntax::PipeToolCall.is_native());
    }
}
