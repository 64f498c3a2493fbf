//! Opt-in rewrites of system prompts before the template renders them
//! (`--system-prompt-rule`). Agent harnesses put text that changes on
//! every request at the top of their system prompts (a checksum, a clock
//! time); the prompt then differs from the previous turn's within its
//! first tokens, and the prefix cache serves nothing. A rule removes or
//! replaces that text in every system message (and Responses'
//! `instructions`, Anthropic's `system`), so turns share their prefix.
//! What a rule removes, the model no longer sees: rules are the
//! operator's choice, none is on by default.

use regex::Regex;
use serde_json::Value;

/// Rules known by name.
const BUILT_IN: &[(&str, &str, &str)] = &[(
    // Claude Code's first system block: `x-anthropic-billing-header:
    // cc_version=…; cc_entrypoint=…; cch=…;` with a per-request checksum.
    "claude-billing-header",
    r"x-anthropic-billing-header:(?:[ \t]*[A-Za-z0-9_.-]+=[^;\n]*;)*[ \t]*\n?",
    "",
)];

#[derive(Debug, Clone)]
struct Rule {
    pattern: Regex,
    replacement: String,
}

/// The rules, in the order given.
#[derive(Debug, Clone, Default)]
pub struct SystemRules(Vec<Rule>);

impl SystemRules {
    /// Each spec is a built-in name, `regex:PATTERN` (its matches are
    /// removed) or `regex:PATTERN=>REPLACEMENT` (`$1`… name groups).
    pub fn parse(specs: &[String]) -> Result<Self, String> {
        let mut rules = Vec::with_capacity(specs.len());
        for spec in specs {
            let (pattern, replacement) = if let Some(custom) = spec.strip_prefix("regex:") {
                match custom.split_once("=>") {
                    Some((p, r)) => (p.to_owned(), r.to_owned()),
                    None => (custom.to_owned(), String::new()),
                }
            } else {
                let Some((_, p, r)) = BUILT_IN.iter().find(|(name, _, _)| name == spec) else {
                    let names: Vec<&str> = BUILT_IN.iter().map(|b| b.0).collect();
                    return Err(format!(
                        "unknown system prompt rule `{spec}`: give one of {} or `regex:PATTERN[=>REPLACEMENT]`",
                        names.join(", ")
                    ));
                };
                (p.to_string(), r.to_string())
            };
            let pattern = Regex::new(&pattern).map_err(|e| format!("system prompt rule `{spec}`: {e}"))?;
            rules.push(Rule { pattern, replacement });
        }
        Ok(Self(rules))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `text` with every rule applied, in order.
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for r in &self.0 {
            out = r.pattern.replace_all(&out, r.replacement.as_str()).into_owned();
        }
        out
    }

    /// Applies the rules to the content of every system message of a
    /// conversation as chat templates take it (`host_tools::template_messages`'
    /// output: contents are strings).
    pub fn apply_to_system(&self, messages: &mut [Value]) {
        if self.is_empty() {
            return;
        }
        for m in messages.iter_mut().filter(|m| m["role"] == "system") {
            if let Some(text) = m["content"].as_str() {
                m["content"] = Value::String(self.apply(text));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rules(specs: &[&str]) -> SystemRules {
        SystemRules::parse(&specs.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn the_billing_header_goes_as_a_block_or_a_line() {
        let r = rules(&["claude-billing-header"]);
        let header = "x-anthropic-billing-header: cc_version=2.0.14.a1f; cc_entrypoint=cli; cch=5e1f2;";
        assert_eq!(r.apply(&format!("{header}You are an agent.")), "You are an agent.", "a block joined to the next");
        assert_eq!(r.apply(&format!("{header}\nYou are an agent.")), "You are an agent.");
        assert_eq!(r.apply("You are an agent."), "You are an agent.");
    }

    #[test]
    fn regex_rules_remove_or_replace_in_system_messages_only() {
        let r = rules(&[r"regex:(?m)^Current time: .*\n", r"regex:session (\w+)=>session S"]);
        let mut conv = vec![
            json!({"role": "system", "content": "Current time: 10:04:59\nYou help. session a1b2"}),
            json!({"role": "user", "content": "Current time: 10:05:00\nHi"}),
        ];
        r.apply_to_system(&mut conv);
        assert_eq!(conv[0]["content"], "You help. session S");
        assert_eq!(conv[1]["content"], "Current time: 10:05:00\nHi", "user messages are left alone");
    }

    #[test]
    fn bad_rules_say_why() {
        let bad = |s: &str| SystemRules::parse(&[s.to_string()]).unwrap_err();
        assert!(bad("tidy").contains("claude-billing-header"));
        assert!(bad("regex:(unclosed").contains("regex:(unclosed"));
    }
}
