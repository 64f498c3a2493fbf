//! Hugging Face chat templates (Jinja) rendered with minijinja, with the
//! helpers those templates use: `raise_exception`, `tojson`,
//! `strftime_now`, loop controls and Python string methods.

use minijinja::{context, Environment, Error, ErrorKind, Value};

pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos: Option<String>,
    eos: Option<String>,
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

fn strftime_now(fmt: String) -> String {
    // Only the formats templates use in practice, in UTC, without a date crate.
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    fmt.replace("%Y", &y.to_string())
        .replace("%m", &format!("{m:02}"))
        .replace("%d", &format!("{d:02}"))
        .replace("%B", MONTHS[(m - 1) as usize])
        .replace("%b", &MONTHS[(m - 1) as usize][..3])
}

/// Days since 1970-01-01 to (year, month, day) (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Why a chat template could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template does not parse: {0}")]
    Parse(String),
    #[error("chat template: {0}")]
    Render(String),
}

impl ChatTemplate {
    pub fn new(source: &str, bos: Option<String>, eos: Option<String>) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", crate::template_json::tojson);
        env.add_template_owned("chat", source.to_owned()).map_err(|e| TemplateError::Parse(e.to_string()))?;
        Ok(Self { env, source: source.to_owned(), bos, eos })
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` (OpenAI-shaped JSON values). `extra` holds
    /// `chat_template_kwargs` (e.g. enable_thinking) and `tools`.
    pub fn render(
        &self,
        messages: &serde_json::Value,
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let tmpl = self.env.get_template("chat").map_err(|e| TemplateError::Render(e.to_string()))?;
        let base = context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos.clone().unwrap_or_default(),
            eos_token => self.eos.clone().unwrap_or_default(),
        };
        let ctx = minijinja::context! { ..Value::from_serialize(extra), ..base };
        tmpl.render(ctx).map_err(|e| {
            let mut msg = e.to_string();
            if let Some(d) = e.detail() {
                msg = format!("{msg}: {d}");
            }
            TemplateError::Render(msg)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_generation_prompt() {
        let t = ChatTemplate::new(CHATML, None, None).unwrap();
        let msgs = serde_json::json!([{"role": "user", "content": "Hi"}]);
        let out = t.render(&msgs, true, &Default::default()).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn supports_the_helpers_hf_templates_use() {
        let src = "{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('no bad roles') }}{% endif %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content.strip() | tojson }}{% endfor %}{{ strftime_now('%Y') | length }}{% if enable_thinking %}T{% endif %}";
        let t = ChatTemplate::new(src, None, None).unwrap();
        let mut extra = serde_json::Map::new();
        extra.insert("enable_thinking".into(), true.into());
        let out = t
            .render(&serde_json::json!([{"role":"user","content":" a "},{"role":"user","content":"b"}]), false, &extra)
            .unwrap();
        assert_eq!(out, "\"a\"4T");
        let err = t.render(&serde_json::json!([{"role":"bad","content":"x"}]), false, &Default::default()).unwrap_err();
        assert!(err.to_string().contains("no bad roles"), "{err}");
    }

    #[test]
    fn civil_dates_are_right() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_422), (2025, 11, 30));
    }
}
