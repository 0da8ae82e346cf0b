//! Canonical JSON, byte-identical to Python's
//! `json.dumps(v, ensure_ascii=False, sort_keys=True, separators=(",", ":"))`, so that digests in
//! state files agree with the reference adapter's, both ways.
//!
//! Request digests are computed from the raw body with a parser of our own that keeps every number
//! literal, so integers of any size and floats format exactly as Python's `int`/`float` would
//! (`1.0`, `1e-05`, `1e+16`). Keys are sorted by code point (Python sorts `str` by code point,
//! which differs from UTF-16 order); duplicate keys keep the last value, as Python does.

use std::collections::BTreeMap;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The body could not be canonicalised.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("JSON cannot be canonicalised at byte {0}")]
pub struct CanonError(pub usize);

enum Node {
    Null,
    Bool(bool),
    /// The number's canonical text.
    Num(String),
    Str(String),
    Arr(Vec<Node>),
    /// Keys sorted by code point (`String` ordering is byte order, which for UTF-8 is code point order).
    Obj(BTreeMap<String, Node>),
}

/// Lower-case hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Canonical JSON of a raw JSON document.
pub fn canonical_bytes(input: &[u8]) -> Result<Vec<u8>, CanonError> {
    let input = input.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(input);
    let mut p = Parser { s: input, i: 0 };
    p.ws();
    let node = p.value(0)?;
    p.ws();
    if p.i != input.len() {
        return Err(CanonError(p.i));
    }
    let mut out = Vec::with_capacity(input.len());
    write_node(&node, &mut out);
    Ok(out)
}

/// SHA-256 of the canonical JSON of a raw document (a request's digest: a run id reused with the
/// same request is a duplicate, with another one a conflict).
pub fn digest_bytes(input: &[u8]) -> Result<String, CanonError> {
    Ok(sha256_hex(&canonical_bytes(input)?))
}

/// Canonical JSON of a `serde_json::Value` (tool arguments, resume answers).
pub fn canonical_value(v: &Value) -> String {
    let mut out = Vec::new();
    write_node(&node_of(v), &mut out);
    String::from_utf8(out).expect("canonical JSON is UTF-8")
}

/// SHA-256 of the canonical JSON of a value.
pub fn digest_value(v: &Value) -> String {
    sha256_hex(canonical_value(v).as_bytes())
}

/// A value as the one writer takes it: numbers in their canonical text, keys sorted.
fn node_of(v: &Value) -> Node {
    match v {
        Value::Null => Node::Null,
        Value::Bool(b) => Node::Bool(*b),
        Value::Number(n) => Node::Num(match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => i.to_string(),
            (None, Some(u)) => u.to_string(),
            (None, None) => python_float_repr(n.as_f64().unwrap_or(f64::NAN)),
        }),
        Value::String(s) => Node::Str(s.clone()),
        Value::Array(a) => Node::Arr(a.iter().map(node_of).collect()),
        Value::Object(m) => Node::Obj(m.iter().map(|(k, v)| (k.clone(), node_of(v))).collect()),
    }
}

fn write_node(n: &Node, out: &mut Vec<u8>) {
    match n {
        Node::Null => out.extend_from_slice(b"null"),
        Node::Bool(true) => out.extend_from_slice(b"true"),
        Node::Bool(false) => out.extend_from_slice(b"false"),
        Node::Num(s) => out.extend_from_slice(s.as_bytes()),
        Node::Str(s) => write_str(s, out),
        Node::Arr(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_node(x, out);
            }
            out.push(b']');
        }
        Node::Obj(m) => {
            out.push(b'{');
            for (i, (k, v)) in m.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_str(k, out);
                out.push(b':');
                write_node(v, out);
            }
            out.push(b'}');
        }
    }
}

/// Python's `json` string escaping with `ensure_ascii=False`.
fn write_str(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    for ch in s.chars() {
        match ch {
            '"' => out.extend_from_slice(b"\\\""),
            '\\' => out.extend_from_slice(b"\\\\"),
            '\n' => out.extend_from_slice(b"\\n"),
            '\r' => out.extend_from_slice(b"\\r"),
            '\t' => out.extend_from_slice(b"\\t"),
            '\u{8}' => out.extend_from_slice(b"\\b"),
            '\u{c}' => out.extend_from_slice(b"\\f"),
            c if (c as u32) < 0x20 => {
                out.extend_from_slice(format!("\\u{:04x}", c as u32).as_bytes());
            }
            c => {
                let mut b = [0u8; 4];
                out.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
            }
        }
    }
    out.push(b'"');
}

/// Python's `repr(float)` (and `json.dumps` of a float).
pub fn python_float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{:e}", f.abs());
    let (mant, exp) = sci.split_once('e').expect("LowerExp has an exponent");
    let exp: i32 = exp.parse().expect("exponent is an integer");
    let digits: String = mant.chars().filter(|c| *c != '.').collect();
    let n = digits.len() as i32;
    let decpt = exp + 1;
    let sign = if f.is_sign_negative() { "-" } else { "" };
    let body = if -4 < decpt && decpt <= 16 {
        if decpt <= 0 {
            format!("0.{}{}", "0".repeat((-decpt) as usize), digits)
        } else if decpt >= n {
            format!("{}{}.0", digits, "0".repeat((decpt - n) as usize))
        } else {
            let (a, b) = digits.split_at(decpt as usize);
            format!("{a}.{b}")
        }
    } else {
        let (first, rest) = digits.split_at(1);
        let mantissa = if rest.is_empty() {
            first.to_owned()
        } else {
            format!("{first}.{rest}")
        };
        format!("{mantissa}e{exp:+03}")
    };
    format!("{sign}{body}")
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

const MAX_DEPTH: usize = 512;

impl Parser<'_> {
    fn ws(&mut self) {
        while self.i < self.s.len() && matches!(self.s[self.i], b' ' | b'\t' | b'\n' | b'\r') {
            self.i += 1;
        }
    }

    fn err<T>(&self) -> Result<T, CanonError> {
        Err(CanonError(self.i))
    }

    fn lit(&mut self, word: &[u8]) -> Result<(), CanonError> {
        if self.s[self.i..].starts_with(word) {
            self.i += word.len();
            Ok(())
        } else {
            self.err()
        }
    }

    fn value(&mut self, depth: usize) -> Result<Node, CanonError> {
        if depth > MAX_DEPTH {
            return self.err();
        }
        match self.s.get(self.i) {
            Some(b'n') => self.lit(b"null").map(|_| Node::Null),
            Some(b't') => self.lit(b"true").map(|_| Node::Bool(true)),
            Some(b'f') => self.lit(b"false").map(|_| Node::Bool(false)),
            Some(b'"') => self.string().map(Node::Str),
            Some(b'[') => {
                self.i += 1;
                let mut items = Vec::new();
                self.ws();
                if self.s.get(self.i) == Some(&b']') {
                    self.i += 1;
                    return Ok(Node::Arr(items));
                }
                loop {
                    self.ws();
                    items.push(self.value(depth + 1)?);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b']') => {
                            self.i += 1;
                            return Ok(Node::Arr(items));
                        }
                        _ => return self.err(),
                    }
                }
            }
            Some(b'{') => {
                self.i += 1;
                let mut map = BTreeMap::new();
                self.ws();
                if self.s.get(self.i) == Some(&b'}') {
                    self.i += 1;
                    return Ok(Node::Obj(map));
                }
                loop {
                    self.ws();
                    if self.s.get(self.i) != Some(&b'"') {
                        return self.err();
                    }
                    let k = self.string()?;
                    self.ws();
                    if self.s.get(self.i) != Some(&b':') {
                        return self.err();
                    }
                    self.i += 1;
                    self.ws();
                    let v = self.value(depth + 1)?;
                    map.insert(k, v);
                    self.ws();
                    match self.s.get(self.i) {
                        Some(b',') => self.i += 1,
                        Some(b'}') => {
                            self.i += 1;
                            return Ok(Node::Obj(map));
                        }
                        _ => return self.err(),
                    }
                }
            }
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => self.err(),
        }
    }

    fn number(&mut self) -> Result<Node, CanonError> {
        let start = self.i;
        let s = self.s;
        let mut i = self.i;
        if s.get(i) == Some(&b'-') {
            i += 1;
        }
        match s.get(i) {
            Some(b'0') => i += 1,
            Some(b'1'..=b'9') => {
                while matches!(s.get(i), Some(b'0'..=b'9')) {
                    i += 1;
                }
            }
            _ => {
                self.i = i;
                return self.err();
            }
        }
        let mut float = false;
        if s.get(i) == Some(&b'.') {
            float = true;
            i += 1;
            if !matches!(s.get(i), Some(b'0'..=b'9')) {
                self.i = i;
                return self.err();
            }
            while matches!(s.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
        }
        if matches!(s.get(i), Some(b'e' | b'E')) {
            float = true;
            i += 1;
            if matches!(s.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            if !matches!(s.get(i), Some(b'0'..=b'9')) {
                self.i = i;
                return self.err();
            }
            while matches!(s.get(i), Some(b'0'..=b'9')) {
                i += 1;
            }
        }
        self.i = i;
        let text = std::str::from_utf8(&s[start..i]).expect("ASCII number");
        if float {
            let f: f64 = text.parse().map_err(|_| CanonError(start))?;
            Ok(Node::Num(python_float_repr(f)))
        } else {
            // Python's int(): arbitrary precision; only "-0" changes form.
            let t = if text == "-0" { "0" } else { text };
            Ok(Node::Num(t.to_owned()))
        }
    }

    fn hex4(&mut self) -> Result<u32, CanonError> {
        let h = self.s.get(self.i..self.i + 4).ok_or(CanonError(self.i))?;
        let h = std::str::from_utf8(h).map_err(|_| CanonError(self.i))?;
        let v = u32::from_str_radix(h, 16).map_err(|_| CanonError(self.i))?;
        if !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            return self.err();
        }
        self.i += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, CanonError> {
        self.i += 1; // opening quote
        let mut out = String::new();
        loop {
            let start = self.i;
            while self.i < self.s.len()
                && self.s[self.i] != b'"'
                && self.s[self.i] != b'\\'
                && self.s[self.i] >= 0x20
            {
                self.i += 1;
            }
            let chunk =
                std::str::from_utf8(&self.s[start..self.i]).map_err(|_| CanonError(start))?;
            out.push_str(chunk);
            match self.s.get(self.i) {
                Some(b'"') => {
                    self.i += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.i += 1;
                    let c = *self.s.get(self.i).ok_or(CanonError(self.i))?;
                    self.i += 1;
                    match c {
                        b'"' => out.push('"'),
                        b'\\' => out.push('\\'),
                        b'/' => out.push('/'),
                        b'b' => out.push('\u{8}'),
                        b'f' => out.push('\u{c}'),
                        b'n' => out.push('\n'),
                        b'r' => out.push('\r'),
                        b't' => out.push('\t'),
                        b'u' => {
                            let hi = self.hex4()?;
                            let cp = if (0xD800..0xDC00).contains(&hi) {
                                // A high surrogate must be followed by a low one; a lone surrogate
                                // cannot be encoded as UTF-8 (Python fails too).
                                if self.s.get(self.i..self.i + 2) != Some(b"\\u") {
                                    return self.err();
                                }
                                self.i += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return self.err();
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else if (0xDC00..0xE000).contains(&hi) {
                                return self.err();
                            } else {
                                hi
                            };
                            out.push(char::from_u32(cp).ok_or(CanonError(self.i))?);
                        }
                        _ => return self.err(),
                    }
                }
                _ => return self.err(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python() {
        for (f, s) in [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (1e-05, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789012345680.0, "1.2345678901234568e+17"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (1.5e300, "1.5e+300"),
            (2.5e-7, "2.5e-07"),
            (123.456, "123.456"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(python_float_repr(f), s, "{f:e}");
        }
    }

    #[test]
    fn reference_vectors() {
        // conformance-scenarios P5.
        assert_eq!(
            digest_bytes(r#"{"b":1,"a":[1.0,"é",null,true]}"#.as_bytes()).unwrap(),
            "b4a4b28899c6b2de4fe92394b4b876c7841e9616fc84793c5f899eff26f5aef5"
        );
        assert_eq!(
            digest_value(
                &serde_json::json!({"status":"resolved","payload":{"decision":"allow_once"}})
            ),
            "289281c743b2a91d60f25b59680f04683bd82766f7a9b2eb405975140373868e"
        );
        assert_eq!(
            digest_value(&serde_json::json!({"status":"cancelled","payload":null})),
            "3902805a6bea7234d10c2f7eac2aadf4db6e27f87f95aeb0de62aa73bf902f22"
        );
    }

    #[test]
    fn duplicate_keys_last_wins_and_whitespace_is_irrelevant() {
        let a = canonical_bytes(b" { \"a\" : 1 , \"a\" : 2 } ").unwrap();
        assert_eq!(a, b"{\"a\":2}");
    }

    #[test]
    fn rejects_invalid_json_and_lone_surrogates() {
        for bad in [
            &b"{"[..],
            b"[1,]",
            b"01",
            b"1.",
            b"\"\\ud800\"",
            b"\"\\udc00\"",
            b"nul",
            b"{} x",
            b"\"\x01\"",
        ] {
            assert!(
                canonical_bytes(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}

#[cfg(test)]
mod golden {
    /// Vectors generated by python3 (`scripts/gen-canonical-vectors.py`).
    #[test]
    fn python_generated_vectors() {
        let vectors: serde_json::Value =
            serde_json::from_str(include_str!("../tests/data/canonical-vectors.json")).unwrap();
        let vectors = vectors.as_array().unwrap();
        assert!(vectors.len() >= 8);
        for v in vectors {
            let raw = v["raw"].as_str().unwrap();
            let canon = super::canonical_bytes(raw.as_bytes()).unwrap();
            assert_eq!(
                std::str::from_utf8(&canon).unwrap(),
                v["canonical"].as_str().unwrap(),
                "raw: {raw}"
            );
            assert_eq!(
                super::digest_bytes(raw.as_bytes()).unwrap(),
                v["sha256"].as_str().unwrap()
            );
            // A parsed value is written as its own text would be (one writer; serde's reading
            // of a number, `-0` or a huge integer, is its own).
            if let Ok(parsed) = serde_json::from_str::<serde_json::Value>(raw) {
                let text = serde_json::to_vec(&parsed).unwrap();
                assert_eq!(
                    super::canonical_value(&parsed).as_bytes(),
                    super::canonical_bytes(&text).unwrap(),
                    "value: {raw}"
                );
            }
        }
    }
}
