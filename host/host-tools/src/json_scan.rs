//! Finds where a JSON object or array ends while its text still streams in.
//! Syntaxes without an end marker (Llama, Mistral, plain JSON) end a call
//! with its JSON value, so the parser must know the moment the value closes.
//! Only brackets and strings are tracked; validity is checked by parsing the
//! finished slice.

/// Incremental scanner over one JSON object or array.
#[derive(Debug, Clone, Default)]
pub(crate) struct JsonEnd {
    started: bool,
    depth: u32,
    in_string: bool,
    escaped: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scan {
    /// The value is still open.
    Open,
    /// The value ends just before this byte offset of the text fed last.
    End(usize),
    /// The text does not start with `{` or `[` (after whitespace).
    NotJson,
}

impl JsonEnd {
    pub(crate) fn feed(&mut self, text: &str) -> Scan {
        for (i, c) in text.char_indices() {
            if !self.started {
                match c {
                    c if c.is_whitespace() => continue,
                    '{' | '[' => {
                        self.started = true;
                        self.depth = 1;
                        continue;
                    }
                    _ => return Scan::NotJson,
                }
            }
            if self.in_string {
                match c {
                    _ if self.escaped => self.escaped = false,
                    '\\' => self.escaped = true,
                    '"' => self.in_string = false,
                    _ => {}
                }
                continue;
            }
            match c {
                '"' => self.in_string = true,
                '{' | '[' => self.depth += 1,
                '}' | ']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        return Scan::End(i + 1);
                    }
                }
                _ => {}
            }
        }
        Scan::Open
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_whole(text: &str) -> Scan {
        JsonEnd::default().feed(text)
    }

    #[test]
    fn finds_the_end() {
        assert_eq!(scan_whole(r#"{"a": "}]", "b": [1, {"c": "\"}"}]} tail"#), Scan::End(35));
        assert_eq!(scan_whole("  [1, 2] ; [3]"), Scan::End(8));
        assert_eq!(scan_whole(r#"{"a": "\\"}x"#), Scan::End(11));
        assert_eq!(scan_whole(r#"{"a": [1, 2"#), Scan::Open);
        assert_eq!(scan_whole("  hello"), Scan::NotJson);
        assert_eq!(scan_whole("   "), Scan::Open);
    }

    #[test]
    fn same_answer_in_pieces() {
        let text = r#"{"k": "v\"}", "n": {"m": [1, "]"]}} after"#;
        let mut s = JsonEnd::default();
        let mut offset = 0;
        for (i, c) in text.char_indices() {
            if let Scan::End(e) = s.feed(&text[i..i + c.len_utf8()]) {
                offset = i + e;
                break;
            }
        }
        assert_eq!(Scan::End(offset), scan_whole(text));
    }
}
