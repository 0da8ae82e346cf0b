//! The tokens an upstream answer reports, read as the answer passes through (never held back):
//! an event stream's `data:` lines, or a JSON body's `usage`. OpenAI's shape
//! (`prompt_tokens`, `completion_tokens`, in the last chunk with `include_usage`) and Anthropic's
//! (`message_start`'s input, `message_delta`'s running output count, cache reads and writes
//! counted as input) are read; an answer that reports none counts no tokens.

/// Tokens of one answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
}

/// The most bytes of one event line, or of a JSON body, looked at (longer ones are passed on
/// unread: a usage line is small).
const MAX_LINE: usize = 64 * 1024;
const MAX_JSON: usize = 4 * 1024 * 1024;

/// Reads an answer's usage as its bytes pass.
pub struct Scan {
    stream: bool,
    buf: Vec<u8>,
    /// The current line (or body) outgrew its bound: skipped to its end.
    skipping: bool,
    tokens: Option<Tokens>,
}

impl Scan {
    /// For an answer of `content_type`: an event stream, else a JSON body.
    pub fn new(content_type: Option<&str>) -> Scan {
        let stream = content_type.is_some_and(|c| {
            c.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        });
        Scan {
            stream,
            buf: Vec::new(),
            skipping: false,
            tokens: None,
        }
    }

    /// The answer's next bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        if !self.stream {
            if self.buf.len() + bytes.len() > MAX_JSON {
                self.skipping = true;
                self.buf = Vec::new();
            }
            if !self.skipping {
                self.buf.extend_from_slice(bytes);
            }
            return;
        }
        let mut rest = bytes;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            self.take_line_part(&rest[..i]);
            if !self.skipping {
                let line = std::mem::take(&mut self.buf);
                self.line(&line);
            }
            self.buf.clear();
            self.skipping = false;
            rest = &rest[i + 1..];
        }
        self.take_line_part(rest);
    }

    fn take_line_part(&mut self, part: &[u8]) {
        if self.skipping {
            return;
        }
        if self.buf.len() + part.len() > MAX_LINE {
            self.skipping = true;
            self.buf.clear();
        } else {
            self.buf.extend_from_slice(part);
        }
    }

    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            return;
        };
        if !contains(data, b"usage") {
            return;
        }
        if let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) {
            self.event(&v);
        }
    }

    fn event(&mut self, v: &serde_json::Value) {
        // Anthropic: the input at the start, the output's running count in deltas.
        let usage = match v.get("type").and_then(|t| t.as_str()) {
            Some("message_start") => v.pointer("/message/usage"),
            _ => v.get("usage"),
        };
        if let Some(u) = usage.filter(|u| u.is_object()) {
            self.usage(u);
        }
    }

    fn usage(&mut self, u: &serde_json::Value) {
        let n = |k: &str| u.get(k).and_then(serde_json::Value::as_u64);
        let t = self.tokens.get_or_insert_with(Tokens::default);
        if let Some(p) = n("prompt_tokens") {
            t.input = p;
        }
        if let Some(c) = n("completion_tokens") {
            t.output = c;
        }
        let anthropic_in = [
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
        ]
        .iter()
        .filter_map(|k| n(k))
        .reduce(|a, b| a.saturating_add(b));
        if let Some(i) = anthropic_in {
            t.input = i;
        }
        if let Some(o) = n("output_tokens") {
            t.output = o;
        }
    }

    /// The answer has ended (or was left): the tokens it reported, if any.
    pub fn finish(mut self) -> Option<Tokens> {
        if self.stream {
            if !self.skipping && !self.buf.is_empty() {
                let line = std::mem::take(&mut self.buf);
                self.line(&line);
            }
        } else if !self.skipping {
            if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&self.buf) {
                if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
                    self.usage(u);
                }
            }
        }
        self.tokens
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(content_type: &str, chunks: &[&str]) -> Option<Tokens> {
        let mut s = Scan::new(Some(content_type));
        for c in chunks {
            s.feed(c.as_bytes());
        }
        s.finish()
    }

    #[test]
    fn openai_streams_report_usage_in_their_last_chunk_split_anywhere() {
        let body = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
                    data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":10,\"total_tokens\":110}}\r\n\r\n\
                    data: [DONE]\n\n";
        let want = Some(Tokens {
            input: 100,
            output: 10,
        });
        assert_eq!(scan("text/event-stream; charset=utf-8", &[body]), want);
        for cut in 1..body.len() {
            let (a, b) = body.split_at(cut);
            assert_eq!(scan("text/event-stream", &[a, b]), want, "cut at {cut}");
        }
        // A chunk with `"usage": null` (before the last) counts nothing.
        let null = "data: {\"choices\":[],\"usage\":null}\n\n";
        assert_eq!(scan("text/event-stream", &[null]), None);
    }

    #[test]
    fn anthropic_streams_count_input_at_the_start_and_the_last_output_count() {
        let body = "event: message_start\n\
                    data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":30,\"cache_read_input_tokens\":70,\"output_tokens\":1}}}\n\n\
                    event: message_delta\n\
                    data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n\
                    event: message_delta\n\
                    data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":42}}\n\n";
        assert_eq!(
            scan("text/event-stream", &[body]),
            Some(Tokens {
                input: 100,
                output: 42
            })
        );
    }

    #[test]
    fn json_bodies_of_either_shape_and_answers_without_usage() {
        let openai = r#"{"id":"x","usage":{"prompt_tokens":7,"completion_tokens":3}}"#;
        let (a, b) = openai.split_at(20);
        assert_eq!(
            scan("application/json", &[a, b]),
            Some(Tokens {
                input: 7,
                output: 3
            })
        );
        let anthropic = r#"{"type":"message","usage":{"input_tokens":5,"output_tokens":9}}"#;
        assert_eq!(
            scan("application/json", &[anthropic]),
            Some(Tokens {
                input: 5,
                output: 9
            })
        );
        assert_eq!(scan("application/json", &[r#"{"error":{}}"#]), None);
        assert_eq!(scan("text/event-stream", &["data: [DONE]\n\n"]), None);
        assert_eq!(scan("application/json", &["not json"]), None);
    }

    #[test]
    fn oversized_lines_and_bodies_are_passed_over_not_held() {
        let long = format!("data: {{\"pad\":\"{}\"}}\n", "x".repeat(MAX_LINE));
        let usage = "data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n";
        let mut s = Scan::new(Some("text/event-stream"));
        for part in long.as_bytes().chunks(1000) {
            s.feed(part);
            assert!(s.buf.len() <= MAX_LINE);
        }
        s.feed(usage.as_bytes());
        assert_eq!(
            s.finish(),
            Some(Tokens {
                input: 1,
                output: 2
            })
        );
        let mut s = Scan::new(Some("application/json"));
        for _ in 0..5 {
            s.feed(&vec![b' '; MAX_JSON / 4]);
        }
        assert!(s.buf.is_empty());
        assert_eq!(s.finish(), None);
    }
}
