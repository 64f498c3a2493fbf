//! Every syntax's grammar compiled by llguidance against a toy tokenizer
//! (one token per byte plus the markers as special tokens, as
//! toktrie_hf_tokenizers builds them), then fed calls token by token: a
//! valid call is accepted whole, an invalid one is refused, and what the
//! grammar accepts parses back into the same call.

use host_tools::{calls_grammar, parse_complete, parse_tools, tool_choice_grammar, Tool, ToolChoice, ToolSyntax};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};
use std::sync::Arc;

/// Bytes are tokens 0..=255; `specials` follow, then an end-of-text token.
struct Toy {
    specials: Vec<String>,
    factory: ParserFactory,
}

impl Toy {
    fn new(specials: &[&str]) -> Self {
        let mut words: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
        for s in specials.iter().copied().chain(["<|end|>"]) {
            let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
            w.extend_from_slice(s.as_bytes());
            words.push(w);
        }
        let info = TokRxInfo::new(words.len() as u32, words.len() as u32 - 1);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(TokTrie::from(&info, &words)));
        let mut factory = ParserFactory::new_simple(&env).unwrap();
        factory.quiet();
        Self { specials: specials.iter().map(|s| s.to_string()).collect(), factory }
    }

    /// What the server passes: `(id, content, special)`.
    fn added_tokens(&self) -> Vec<(u32, String, bool)> {
        self.specials.iter().enumerate().map(|(i, s)| (256 + i as u32, s.clone(), true)).collect()
    }

    fn tokenize(&self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        let mut i = 0;
        'outer: while i < text.len() {
            for (k, s) in self.specials.iter().enumerate() {
                if text[i..].starts_with(s.as_str()) {
                    out.push(256 + k as u32);
                    i += s.len();
                    continue 'outer;
                }
            }
            out.push(u32::from(text.as_bytes()[i]));
            i += 1;
        }
        out
    }

    fn matcher(&self, grammar: &str) -> Matcher {
        let mut m = Matcher::new(self.factory.create_parser(TopLevelGrammar::from_lark(grammar.to_string())));
        assert!(!m.is_error(), "grammar does not compile: {:?}\n{grammar}", m.get_error());
        let warnings = m.grammar_warnings();
        assert!(warnings.is_empty(), "{warnings:?}\n{grammar}");
        m
    }

    fn accepts(&self, grammar: &str, text: &str) -> bool {
        let mut m = self.matcher(grammar);
        for t in self.tokenize(text) {
            if m.consume_token(t).is_err() || m.is_error() {
                return false;
            }
        }
        m.is_accepting().unwrap_or(false)
    }
}

fn tools() -> Vec<Tool> {
    parse_tools(Some(&json!([
        { "type": "function", "function": { "name": "get_weather", "parameters": {
            "type": "object",
            "properties": {
                "city": { "type": "string", "description": "A {braced} \"quoted\" name" },
                "days": { "type": "integer", "minimum": 1 },
                "unit": { "type": "string", "enum": ["c", "f"] },
                "opts": { "type": "object", "properties": { "hourly": { "type": "boolean" } } }
            },
            "required": ["city"]
        }}},
        { "type": "function", "function": { "name": "get_time", "parameters": {
            "type": "object", "properties": {}, "additionalProperties": false } } }
    ])))
    .unwrap()
}

/// Checks acceptance of each valid text (and that it parses back to
/// `calls`) and refusal of each invalid one.
fn check(syntax: ToolSyntax, toy: &Toy, grammar: &str, valid: &[(&str, Vec<(&str, Value)>)], invalid: &[&str]) {
    for (text, calls) in valid {
        assert!(toy.accepts(grammar, text), "{syntax:?} refused {text:?}\n{grammar}");
        let (content, parsed) = parse_complete(syntax, text, &tools());
        assert_eq!(content, "", "{text:?}");
        let got: Vec<(String, Value)> =
            parsed.into_iter().map(|c| (c.name, serde_json::from_str(&c.arguments).unwrap())).collect();
        let want: Vec<(String, Value)> = calls.iter().map(|(n, a)| (n.to_string(), a.clone())).collect();
        assert_eq!(got, want, "{text:?}");
    }
    for text in invalid {
        assert!(!toy.accepts(grammar, text), "{syntax:?} accepted {text:?}\n{grammar}");
    }
}

fn required(syntax: ToolSyntax, toy: &Toy, parallel: bool) -> String {
    tool_choice_grammar(syntax, &tools(), &ToolChoice::Required, parallel, &toy.added_tokens()).unwrap()
}

fn paris() -> Value {
    json!({ "city": "Paris", "days": 3 })
}

#[test]
fn hermes_with_special_markers() {
    let toy = Toy::new(&["<tool_call>", "</tool_call>"]);
    let one =
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
    let two = format!("{one}\n<tool_call>\n{{\"name\": \"get_time\", \"arguments\": {{}}}}\n</tool_call>");
    let single = required(ToolSyntax::Hermes, &toy, false);
    assert!(single.contains("<tool_call> \"\\n\""), "{single}");
    let invalid = [
        "<tool_call>\n{\"name\": \"get_wether\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": \"3\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 3}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"x\": 1}}\n</tool_call>",
        "Sure! <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        two.as_str(),
    ];
    check(ToolSyntax::Hermes, &toy, &single, &[(one, vec![("get_weather", paris())])], &invalid);
    let parallel = required(ToolSyntax::Hermes, &toy, true);
    check(
        ToolSyntax::Hermes,
        &toy,
        &parallel,
        &[(&two, vec![("get_weather", paris()), ("get_time", json!({}))]), (one, vec![("get_weather", paris())])],
        &[],
    );
}

#[test]
fn hermes_with_text_markers() {
    // No added tokens: the markers are plain text to the tokenizer.
    let toy = Toy::new(&[]);
    let g = required(ToolSyntax::Hermes, &toy, false);
    assert!(g.contains("\"<tool_call>\""), "{g}");
    let one = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    check(ToolSyntax::Hermes, &toy, &g, &[(one, vec![("get_time", json!({}))])], &["<tool_call>\n{}\n</tool_call>"]);
}

#[test]
fn named_function_only() {
    let toy = Toy::new(&["<tool_call>", "</tool_call>"]);
    let named = ToolChoice::Named("get_time".into());
    let g = tool_choice_grammar(ToolSyntax::Hermes, &tools(), &named, true, &toy.added_tokens()).unwrap();
    let time = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    let weather = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    check(
        ToolSyntax::Hermes,
        &toy,
        &g,
        &[(time, vec![("get_time", json!({}))])],
        &[weather, &format!("{time}\n{time}")],
    );
    for choice in [ToolChoice::Auto, ToolChoice::None] {
        assert_eq!(tool_choice_grammar(ToolSyntax::Hermes, &tools(), &choice, true, &[]), None);
    }
}

#[test]
fn llama_json() {
    let toy = Toy::new(&["<|python_tag|>", "<|eom_id|>"]);
    let g = required(ToolSyntax::PythonTagJson, &toy, true);
    let one = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 3}}";
    let two = format!("{one}; {{\"name\": \"get_time\", \"parameters\": {{}}}}");
    check(
        ToolSyntax::PythonTagJson,
        &toy,
        &g,
        &[(one, vec![("get_weather", paris())]), (&two, vec![("get_weather", paris()), ("get_time", json!({}))])],
        &["{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", "I will call it."],
    );
}

#[test]
fn mistral_json_list() {
    let toy = Toy::new(&["[TOOL_CALLS]", "[ARGS]"]);
    let g = required(ToolSyntax::ToolCallsList, &toy, false);
    // [TOOL_CALLS] cannot be named inside <...>, so it is referenced by id.
    assert!(g.starts_with("start: <[256]> %json"), "{g}");
    let one = "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}]";
    let two = "[TOOL_CALLS][{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_time\", \"arguments\": {}}]";
    check(ToolSyntax::ToolCallsList, &toy, &g, &[(one, vec![("get_weather", paris())])], &[two, "[TOOL_CALLS][]"]);
    let parallel = required(ToolSyntax::ToolCallsList, &toy, true);
    check(
        ToolSyntax::ToolCallsList,
        &toy,
        &parallel,
        &[(two, vec![("get_time", json!({})), ("get_time", json!({}))])],
        &[],
    );
}

#[test]
fn mistral_args() {
    let toy = Toy::new(&["[TOOL_CALLS]", "[ARGS]"]);
    let g = required(ToolSyntax::ToolCallsArgs, &toy, true);
    let one = "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": 3}";
    let two = format!("{one}[TOOL_CALLS]get_time[ARGS]{{}}");
    check(
        ToolSyntax::ToolCallsArgs,
        &toy,
        &g,
        &[(one, vec![("get_weather", paris())]), (&two, vec![("get_weather", paris()), ("get_time", json!({}))])],
        &["[TOOL_CALLS]get_weather[ARGS]{\"days\": 3}", "[TOOL_CALLS]nope[ARGS]{}"],
    );
}

#[test]
fn qwen_xml() {
    let toy = Toy::new(&["<tool_call>", "</tool_call>"]);
    let g = required(ToolSyntax::XmlFunction, &toy, true);
    let one = "<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco, \"CA\" </x>\n</parameter>\n\
               <parameter=days>\n3\n</parameter>\n<parameter=unit>\nf\n</parameter>\n\
               <parameter=opts>\n{\"hourly\": true}\n</parameter>\n</function>\n</tool_call>";
    let args = json!({ "city": "San Francisco, \"CA\" </x>", "days": 3, "unit": "f", "opts": { "hourly": true } });
    let minimal =
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n</tool_call>";
    let time = "<tool_call>\n<function=get_time>\n</function>\n</tool_call>";
    check(
        ToolSyntax::XmlFunction,
        &toy,
        &g,
        &[
            (one, vec![("get_weather", args)]),
            (&format!("{minimal}\n{time}"), vec![("get_weather", json!({ "city": "Oslo" })), ("get_time", json!({}))]),
        ],
        &[
            "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=unit>\nk\n</parameter>\n</function>\n</tool_call>",
            "<tool_call>\n<function=get_time>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
        ],
    );
}

#[test]
fn pipe_tool_call() {
    for specials in [&["<|tool_call>", "<tool_call|>", "<|\"|>"][..], &[][..]] {
        let toy = Toy::new(specials);
        let g = required(ToolSyntax::PipeToolCall, &toy, true);
        let one = "<|tool_call>call:get_weather{city:<|\"|>Paris, \"FR\" {x}<|\"|>,days:3,unit:<|\"|>c<|\"|>,opts:{hourly:true}}<tool_call|>";
        let args = json!({ "city": "Paris, \"FR\" {x}", "days": 3, "unit": "c", "opts": { "hourly": true } });
        let two = "<|tool_call>call:get_weather{city:<|\"|><|\"|>}<tool_call|><|tool_call>call:get_time{}<tool_call|>";
        check(
            ToolSyntax::PipeToolCall,
            &toy,
            &g,
            &[
                (one, vec![("get_weather", args)]),
                (two, vec![("get_weather", json!({ "city": "" })), ("get_time", json!({}))]),
            ],
            &[
                "<|tool_call>call:get_weather{days:3}<tool_call|>",
                "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,days:<|\"|>3<|\"|>}<tool_call|>",
                "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>,,days:3}<tool_call|>",
                "<|tool_call>call:get_time{a:1}<tool_call|>",
            ],
        );
    }
}

#[test]
fn function_gemma() {
    let toy = Toy::new(&["<start_function_call>", "<end_function_call>", "<escape>"]);
    let g = required(ToolSyntax::FunctionCallTags, &toy, false);
    let one = "<start_function_call>call:get_weather{city:<escape>Lima<escape>,days:3}<end_function_call>";
    check(
        ToolSyntax::FunctionCallTags,
        &toy,
        &g,
        &[(one, vec![("get_weather", json!({ "city": "Lima", "days": 3 }))])],
        &["<start_function_call>call:get_weather{city:Lima}<end_function_call>"],
    );
}

#[test]
fn plain_json() {
    let toy = Toy::new(&[]);
    let one = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}";
    let list = "[{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}]";
    let single = required(ToolSyntax::Json, &toy, false);
    check(
        ToolSyntax::Json,
        &toy,
        &single,
        &[(one, vec![("get_weather", paris())])],
        &[list, "{\"name\": \"x\", \"arguments\": {}}"],
    );
    let parallel = required(ToolSyntax::Json, &toy, true);
    check(
        ToolSyntax::Json,
        &toy,
        &parallel,
        &[(list, vec![("get_time", json!({})), ("get_weather", paris())])],
        &[one, "[]"],
    );
}

#[test]
fn refs_to_definitions_still_resolve() {
    let tools = parse_tools(Some(&json!([{ "type": "function", "function": { "name": "book", "parameters": {
        "type": "object",
        "$defs": { "Date": { "type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$" } },
        "properties": { "day": { "$ref": "#/$defs/Date" } },
        "required": ["day"]
    }}}])))
    .unwrap();
    let toy = Toy::new(&["<tool_call>", "</tool_call>"]);
    let refs: Vec<&Tool> = tools.iter().collect();
    for syntax in [ToolSyntax::Hermes, ToolSyntax::Json] {
        let g = calls_grammar(syntax, &refs, false, &toy.added_tokens());
        let call = "{\"name\": \"book\", \"arguments\": {\"day\": \"2024-05-01\"}}";
        let text =
            if syntax == ToolSyntax::Hermes { format!("<tool_call>\n{call}\n</tool_call>") } else { call.into() };
        assert!(toy.accepts(&g, &text), "{g}");
        assert!(!toy.accepts(&g, &text.replace("2024-05-01", "May 1st")), "{g}");
    }
}
