//! Incremental decoder of HTTP/1.1 chunked framing (RFC 9112 §7.1), shared by the kernel-stream
//! client (response bodies) and the gateway's HTTP server (request bodies).
//!
//! Bytes may arrive split anywhere. Chunk extensions and trailer fields are skipped; sizes are
//! limited to 15 hex digits; anything else malformed is an error, never data.

/// Malformed chunked framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("malformed chunked body")
    }
}

impl std::error::Error for Malformed {}

/// Decoder state.
#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    /// Reading the hex size (`size`, digits so far).
    Size(u64, u8),
    /// Skipping a chunk extension up to the line end.
    Ext(u64),
    /// Expecting the `\n` of the size line.
    SizeLf(u64),
    /// Inside a chunk's data.
    Data(u64),
    /// Expecting the `\r\n` after data (`false`: the `\r`).
    DataEnd(bool),
    /// Trailer section: at the start of a line (`true`) or inside one.
    Trailer(bool),
    /// Expecting the `\n` ending a trailer line (`true`: it was an empty line: the end).
    TrailerLf(bool),
    Done,
}

/// Chunked-framing decoder.
#[derive(Debug)]
pub struct Dechunker {
    state: State,
}

impl Default for Dechunker {
    fn default() -> Self {
        Dechunker {
            state: State::Size(0, 0),
        }
    }
}

impl Dechunker {
    /// Whether the last chunk and the trailer section have ended.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Appends the data bytes of `raw` to `out` and returns how many bytes of `raw` belong to the
    /// body: all of them, unless the body ends inside `raw` (what follows is the next message).
    pub fn feed(&mut self, raw: &[u8], out: &mut Vec<u8>) -> Result<usize, Malformed> {
        let mut i = 0;
        while i < raw.len() {
            let b = raw[i];
            self.state = match self.state {
                State::Size(n, digits) => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        if digits >= 15 {
                            return Err(Malformed);
                        }
                        let d = (b as char).to_digit(16).expect("hex digit") as u64;
                        State::Size(n * 16 + d, digits + 1)
                    }
                    b';' | b' ' | b'\t' if digits > 0 => State::Ext(n),
                    b'\r' if digits > 0 => State::SizeLf(n),
                    _ => return Err(Malformed),
                },
                State::Ext(n) => match b {
                    b'\r' => State::SizeLf(n),
                    b'\n' => return Err(Malformed),
                    _ => State::Ext(n),
                },
                State::SizeLf(n) => match (b, n) {
                    (b'\n', 0) => State::Trailer(true),
                    (b'\n', n) => State::Data(n),
                    _ => return Err(Malformed),
                },
                State::Data(n) => {
                    let take = (n.min((raw.len() - i) as u64)) as usize;
                    out.extend_from_slice(&raw[i..i + take]);
                    i += take;
                    let left = n - take as u64;
                    self.state = if left == 0 {
                        State::DataEnd(false)
                    } else {
                        State::Data(left)
                    };
                    continue;
                }
                State::DataEnd(false) if b == b'\r' => State::DataEnd(true),
                State::DataEnd(true) if b == b'\n' => State::Size(0, 0),
                State::DataEnd(_) => return Err(Malformed),
                State::Trailer(at_start) => match b {
                    b'\r' => State::TrailerLf(at_start),
                    _ => State::Trailer(false),
                },
                State::TrailerLf(empty) => match b {
                    b'\n' if empty => {
                        self.state = State::Done;
                        return Ok(i + 1);
                    }
                    b'\n' => State::Trailer(true),
                    _ => return Err(Malformed),
                },
                State::Done => return Ok(i),
            };
            i += 1;
        }
        Ok(i)
    }
}

/// Decodes a chunked body fed in `parts` (fuzzing hook): the data, whether the last chunk and the
/// trailers were complete, and how many bytes followed the end.
#[doc(hidden)]
pub fn dechunk_parts(parts: &[&[u8]]) -> Result<(Vec<u8>, bool, usize), Malformed> {
    let mut d = Dechunker::default();
    let mut out = Vec::new();
    let mut rest = 0;
    for p in parts {
        let used = d.feed(p, &mut out)?;
        rest += p.len() - used;
    }
    Ok((out, d.is_done(), rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_decode_however_they_are_split() {
        let wire: &[u8] = b"5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\nx-trailer: 1\r\n\r\n";
        for cut in 0..wire.len() {
            let (out, done, rest) = dechunk_parts(&[&wire[..cut], &wire[cut..]]).unwrap();
            assert_eq!(out, b"hello, world", "cut at {cut}");
            assert!(done);
            assert_eq!(rest, 0);
        }
        let (out, done, _) = dechunk_parts(&[b"3\r\nabc\r\n"]).unwrap();
        assert_eq!((out.as_slice(), done), (&b"abc"[..], false));
        for bad in [
            &b"x\r\n"[..],
            b"\r\n",
            b"3\r\nabcX\r\n",
            b"3\nabc",
            b"1234567890123456\r\n",
        ] {
            assert!(
                dechunk_parts(&[bad]).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn bytes_after_the_end_are_left_for_the_next_message() {
        let wire: &[u8] = b"2\r\nok\r\n0\r\n\r\nGET / HTTP/1.1\r\n";
        for cut in 0..wire.len() {
            let mut d = Dechunker::default();
            let mut out = Vec::new();
            let a = d.feed(&wire[..cut], &mut out).unwrap();
            let b = d.feed(&wire[cut..], &mut out).unwrap();
            assert!(d.is_done(), "cut at {cut}");
            assert_eq!(out, b"ok");
            let used = if a < cut { a } else { cut + b };
            assert_eq!(&wire[used..], b"GET / HTTP/1.1\r\n", "cut at {cut}");
        }
    }
}
