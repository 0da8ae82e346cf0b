//! A bounded, chunk-boundary-safe SSE decoder for the kernel's streams.
//!
//! Accepts LF, CRLF and lone CR line endings (sse-starlette uses CRLF), ignores comment lines
//! (`: ping - …`), joins several `data:` lines of one event with `\n`, remembers an `event:` name,
//! and enforces a maximum line length and a maximum frame size so a misbehaving kernel cannot grow
//! memory without bound.

use bytes::{Buf, BytesMut};

/// Limits of the decoder.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Longest accepted line (bytes, without its terminator).
    pub max_line: usize,
    /// Largest accepted frame (sum of its data lines).
    pub max_frame: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // Pipeline batches are capped at 1 MiB by the kernel; task snapshots with 100 history
        // messages can be larger. 16 MiB leaves room without letting memory run away.
        Limits {
            max_line: 16 * 1024 * 1024,
            max_frame: 16 * 1024 * 1024,
        }
    }
}

/// One decoded SSE event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The `event:` field, when the event named one (the kernel uses `event: error`).
    pub event: Option<String>,
    /// The joined `data:` lines.
    pub data: Vec<u8>,
}

/// Why the decoder gave up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("an SSE line exceeds {0} bytes")]
    LineTooLong(usize),
    #[error("an SSE frame exceeds {0} bytes")]
    FrameTooLarge(usize),
}

/// Incremental decoder: feed bytes with [`Decoder::push`], take frames with [`Decoder::next_frame`].
#[derive(Debug)]
pub struct Decoder {
    limits: Limits,
    buf: BytesMut,
    /// Scan position inside `buf` (bytes before it contain no line terminator).
    scanned: usize,
    /// The previous chunk ended with `\r`: a leading `\n` of the next chunk belongs to it.
    skip_lf: bool,
    data: Vec<u8>,
    has_data: bool,
    event: Option<String>,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder::new(Limits::default())
    }
}

impl Decoder {
    pub fn new(limits: Limits) -> Self {
        Decoder {
            limits,
            buf: BytesMut::new(),
            scanned: 0,
            skip_lf: false,
            data: Vec::new(),
            has_data: false,
            event: None,
        }
    }

    /// Appends received bytes.
    pub fn push(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// Returns the next complete frame, `Ok(None)` when more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, SseError> {
        // Lines are read in place (`pos`) and the consumed prefix is dropped once per call.
        let mut pos = 0;
        let result = loop {
            if self.skip_lf && pos < self.buf.len() {
                if self.buf[pos] == b'\n' {
                    pos += 1;
                }
                self.skip_lf = false;
            }
            let from = (pos + self.scanned).min(self.buf.len());
            let Some(rel) = memchr::memchr2(b'\n', b'\r', &self.buf[from..]) else {
                self.scanned = self.buf.len() - pos;
                if self.buf.len() - pos > self.limits.max_line {
                    break Err(SseError::LineTooLong(self.limits.max_line));
                }
                break Ok(None);
            };
            let end = from + rel;
            if end - pos > self.limits.max_line {
                break Err(SseError::LineTooLong(self.limits.max_line));
            }
            let term = self.buf[end];
            let line_start = pos;
            // Drop the terminator; a CR may be followed by an LF (possibly in the next chunk).
            pos = end + 1;
            if term == b'\r' {
                if pos == self.buf.len() {
                    self.skip_lf = true;
                } else if self.buf[pos] == b'\n' {
                    pos += 1;
                }
            }
            self.scanned = 0;
            let mut line = Line {
                limits: &self.limits,
                data: &mut self.data,
                has_data: &mut self.has_data,
                event: &mut self.event,
            };
            match line.feed(&self.buf[line_start..end]) {
                Ok(Some(frame)) => break Ok(Some(frame)),
                Ok(None) => {}
                Err(e) => break Err(e),
            }
        };
        self.buf.advance(pos);
        result
    }

    /// The stream ended: returns a last frame that lacked its blank line, if any.
    pub fn finish(&mut self) -> Result<Option<Frame>, SseError> {
        if !self.buf.is_empty() {
            let rest = self.buf.split();
            let mut line = Line {
                limits: &self.limits,
                data: &mut self.data,
                has_data: &mut self.has_data,
                event: &mut self.event,
            };
            if let Some(frame) = line.feed(&rest)? {
                return Ok(Some(frame));
            }
        }
        Ok(Line {
            limits: &self.limits,
            data: &mut self.data,
            has_data: &mut self.has_data,
            event: &mut self.event,
        }
        .take_frame())
    }
}

/// The frame being assembled, borrowed from the decoder while one of its lines is read.
struct Line<'a> {
    limits: &'a Limits,
    data: &'a mut Vec<u8>,
    has_data: &'a mut bool,
    event: &'a mut Option<String>,
}

impl Line<'_> {
    fn take_frame(&mut self) -> Option<Frame> {
        if !*self.has_data {
            *self.event = None;
            return None;
        }
        *self.has_data = false;
        // The next frame is likely the same size: one allocation instead of a growth series.
        let next = Vec::with_capacity(self.data.len());
        Some(Frame {
            event: self.event.take(),
            data: std::mem::replace(self.data, next),
        })
    }

    fn feed(&mut self, line: &[u8]) -> Result<Option<Frame>, SseError> {
        if line.is_empty() {
            return Ok(self.take_frame());
        }
        if line[0] == b':' {
            return Ok(None);
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" => {
                let add = value.len() + usize::from(*self.has_data);
                if self.data.len() + add > self.limits.max_frame {
                    return Err(SseError::FrameTooLarge(self.limits.max_frame));
                }
                if *self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                *self.has_data = true;
            }
            b"event" => *self.event = Some(String::from_utf8_lossy(value).into_owned()),
            _ => {}
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[&[u8]]) -> Vec<Frame> {
        let mut d = Decoder::default();
        let mut out = Vec::new();
        for c in input {
            d.push(c);
            while let Some(f) = d.next_frame().unwrap() {
                out.push(f);
            }
        }
        if let Some(f) = d.finish().unwrap() {
            out.push(f);
        }
        out
    }

    fn data(f: &Frame) -> &str {
        std::str::from_utf8(&f.data).unwrap()
    }

    #[test]
    fn crlf_framing_with_ping_comments() {
        let frames = all(&[
            b"data: {\"a\":1}\r\n\r\n: ping - 2026-11-29 19:00:00\r\n\r\ndata: {\"b\":2}\r\n\r\n",
        ]);
        assert_eq!(frames.len(), 2);
        assert_eq!(data(&frames[0]), "{\"a\":1}");
        assert_eq!(data(&frames[1]), "{\"b\":2}");
    }

    #[test]
    fn every_split_point_gives_the_same_frames() {
        let input: &[u8] = b"event: error\r\ndata: {\"x\":\"y\"}\r\n\r\ndata:no-space\ndata: second\n\n:c\rdata: cr\r\r";
        let whole = all(&[input]);
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[0].event.as_deref(), Some("error"));
        assert_eq!(data(&whole[1]), "no-space\nsecond");
        assert_eq!(data(&whole[2]), "cr");
        for i in 0..input.len() {
            for j in i..input.len() {
                let got = all(&[&input[..i], &input[i..j], &input[j..]]);
                assert_eq!(got, whole, "split at {i},{j}");
            }
        }
    }

    #[test]
    fn unterminated_last_frame_is_delivered_at_eof() {
        let frames = all(&[b"data: {\"a\":1}"]);
        assert_eq!(frames.len(), 1);
        assert_eq!(data(&frames[0]), "{\"a\":1}");
    }

    #[test]
    fn limits_are_enforced() {
        let mut d = Decoder::new(Limits {
            max_line: 16,
            max_frame: 20,
        });
        d.push(b"data: 0123456789abcdefghij");
        assert_eq!(d.next_frame(), Err(SseError::LineTooLong(16)));

        let mut d = Decoder::new(Limits {
            max_line: 16,
            max_frame: 20,
        });
        d.push(b"data: 0123456789\ndata: 0123456789\n");
        assert_eq!(d.next_frame(), Err(SseError::FrameTooLarge(20)));
    }

    #[test]
    fn blank_lines_without_data_dispatch_nothing() {
        assert!(all(&[b"\n\n\r\n: hi\n\nevent: x\n\n"]).is_empty());
    }
}
