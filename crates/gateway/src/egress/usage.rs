//! The tokens an upstream answer reports, read as the answer passes through (never held back):
//! an event stream's `data:` lines, or a JSON body's `usage`. OpenAI's shape
//! (`prompt_tokens`, `completion_tokens`, in the last chunk with `include_usage`) and Anthropic's
//! (`message_start`'s input, `message_delta`'s running output count, cache reads and writes
//! counted as input) are read. Whether the final report was seen is said too (Anthropic's
//! output count is final only in its last `message_delta`): the caller estimates otherwise.

/// Tokens of one answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
}

/// What an answer reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    pub tokens: Tokens,
    /// The final report was seen (the answer's whole spending).
    pub complete: bool,
}

/// The most bytes of one event line looked at (longer ones are passed on unread: a usage line
/// is small), and of a JSON body's end (where both APIs put `usage`).
const MAX_LINE: usize = 64 * 1024;
const JSON_TAIL: usize = 64 * 1024;

/// Reads an answer's usage as its bytes pass.
pub struct Scan {
    stream: bool,
    buf: Vec<u8>,
    /// The current line outgrew its bound: skipped to its end.
    skipping: bool,
    tokens: Option<Tokens>,
    complete: bool,
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
            complete: false,
        }
    }

    /// The answer's next bytes.
    pub fn feed(&mut self, bytes: &[u8]) {
        if !self.stream {
            // Only the body's end is kept.
            let keep = bytes.len().min(JSON_TAIL);
            self.buf.extend_from_slice(&bytes[bytes.len() - keep..]);
            if self.buf.len() > JSON_TAIL {
                let cut = self.buf.len() - JSON_TAIL;
                self.buf.drain(..cut);
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
        // Anthropic: the input at the start, the output's count in the last delta.
        let kind = v.get("type").and_then(|t| t.as_str());
        let usage = match kind {
            Some("message_start") => v.pointer("/message/usage"),
            _ => v.get("usage"),
        };
        if let Some(u) = usage.filter(|u| u.is_object()) {
            self.usage(u);
            self.complete = kind == Some("message_delta") || u.get("completion_tokens").is_some();
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

    /// The answer has ended (or was left): what it reported, if anything.
    pub fn finish(mut self) -> Option<Reported> {
        if self.stream {
            if !self.skipping && !self.buf.is_empty() {
                let line = std::mem::take(&mut self.buf);
                self.line(&line);
            }
        } else if let Some(u) = last_usage(&self.buf) {
            self.usage(&u);
            self.complete = true;
        }
        self.tokens.map(|tokens| Reported {
            tokens,
            complete: self.complete,
        })
    }
}

/// The object after the last `"usage":` of a JSON body's end.
fn last_usage(tail: &[u8]) -> Option<serde_json::Value> {
    let at = tail.windows(7).rposition(|w| w == b"\"usage\"")?;
    let rest = tail[at + 7..].trim_ascii_start().strip_prefix(b":")?;
    let v = serde_json::Deserializer::from_slice(rest)
        .into_iter::<serde_json::Value>()
        .next()?
        .ok()?;
    v.is_object().then_some(v)
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan(content_type: &str, chunks: &[&str]) -> Option<Reported> {
        let mut s = Scan::new(Some(content_type));
        for c in chunks {
            s.feed(c.as_bytes());
        }
        s.finish()
    }

    fn whole(input: u64, output: u64) -> Option<Reported> {
        Some(Reported {
            tokens: Tokens { input, output },
            complete: true,
        })
    }

    #[test]
    fn openai_streams_report_usage_in_their_last_chunk_split_anywhere() {
        let body = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
                    data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":10,\"total_tokens\":110}}\r\n\r\n\
                    data: [DONE]\n\n";
        let want = whole(100, 10);
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
        let start = "event: message_start\n\
                    data: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":30,\"cache_read_input_tokens\":70,\"output_tokens\":1}}}\n\n";
        let deltas = "event: message_delta\n\
                    data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":15}}\n\n\
                    event: message_delta\n\
                    data: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":42}}\n\n";
        assert_eq!(scan("text/event-stream", &[start, deltas]), whole(100, 42));
        // Left before its last delta: what it said so far is no final count.
        let partial = scan("text/event-stream", &[start]).unwrap();
        assert_eq!(
            partial.tokens,
            Tokens {
                input: 100,
                output: 1
            }
        );
        assert!(!partial.complete);
    }

    #[test]
    fn json_bodies_of_either_shape_and_answers_without_usage() {
        let openai = r#"{"id":"x","usage":{"prompt_tokens":7,"completion_tokens":3}}"#;
        let (a, b) = openai.split_at(20);
        assert_eq!(scan("application/json", &[a, b]), whole(7, 3));
        let anthropic = r#"{"type":"message","content":[{"text":"\"usage\" is a word"}],"usage":{"input_tokens":5,"output_tokens":9}}"#;
        assert_eq!(scan("application/json", &[anthropic]), whole(5, 9));
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
        assert_eq!(s.finish(), whole(1, 2));
        // A large JSON body: only its end is kept, where its usage is.
        let mut s = Scan::new(Some("application/json"));
        s.feed(b"{\"content\":\"");
        for _ in 0..100 {
            s.feed(&vec![b'x'; 64 * 1024]);
            assert!(s.buf.len() <= JSON_TAIL);
        }
        s.feed(br#"","usage":{"prompt_tokens":9,"completion_tokens":4}}"#);
        assert_eq!(s.finish(), whole(9, 4));
    }
}
