//! Text log lines stay one line each: a value that carries a line break (a kernel's error
//! message, a client's header echoed in an error) cannot forge a line of its own. The text
//! formatter writes each event whole with one `write_all`, so the writer sees the event and
//! escapes every line break but the last; without colours (a file, a log collector) the other
//! control characters are escaped too (with colours the formatter's own escape sequences must
//! pass).

use std::io::{self, Write};

use tracing_subscriber::fmt::MakeWriter;

/// Wraps a writer maker; see the module documentation.
pub struct OneLine<M> {
    inner: M,
    ansi: bool,
}

impl<M> OneLine<M> {
    pub fn new(inner: M, ansi: bool) -> OneLine<M> {
        OneLine { inner, ansi }
    }
}

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for OneLine<M> {
    type Writer = Escaping<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        Escaping {
            inner: self.inner.make_writer(),
            ansi: self.ansi,
        }
    }

    fn make_writer_for(&'a self, meta: &tracing::Metadata<'_>) -> Self::Writer {
        Escaping {
            inner: self.inner.make_writer_for(meta),
            ansi: self.ansi,
        }
    }
}

/// The writer of one event.
pub struct Escaping<W> {
    inner: W,
    ansi: bool,
}

impl<W: Write> Write for Escaping<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.inner.write_all(&escape(buf, self.ansi))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// `event` with its inner line breaks (and, without colours, its other control characters but
/// tabs) written as escapes; its final line break kept.
fn escape(event: &[u8], ansi: bool) -> std::borrow::Cow<'_, [u8]> {
    let (body, end) = match event.strip_suffix(b"\n") {
        Some(b) => (b, &b"\n"[..]),
        None => (event, &b""[..]),
    };
    let needs =
        |c: u8| c == b'\n' || c == b'\r' || (!ansi && c != b'\t' && (c < 0x20 || c == 0x7f));
    if !body.iter().any(|&c| needs(c)) {
        return event.into();
    }
    let mut out = Vec::with_capacity(event.len() + 16);
    for &c in body {
        match c {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            c if needs(c) => out.extend_from_slice(format!("\\x{c:02x}").as_bytes()),
            c => out.push(c),
        }
    }
    out.extend_from_slice(end);
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::captured::{logged, Captured};

    #[test]
    fn inner_breaks_and_controls_are_escaped_and_the_last_break_kept() {
        assert_eq!(&*escape(b"plain line\n", false), b"plain line\n");
        assert_eq!(
            &*escape(b"error=x\nFAKE LINE\r\n", false),
            b"error=x\\nFAKE LINE\\r\n"
        );
        assert_eq!(
            &*escape(b"a\x1b[2Jb\x00\tc\n", false),
            b"a\\x1b[2Jb\\x00\tc\n"
        );
        // With colours the formatter's escape sequences pass; line breaks never do.
        assert_eq!(
            &*escape(b"\x1b[32mINFO\x1b[0m a\nb\n", true),
            b"\x1b[32mINFO\x1b[0m a\\nb\n"
        );
    }

    /// A kernel error message with a line break in it, logged through the text format, is one
    /// line: no line starts with the forged text.
    #[test]
    fn a_value_with_a_line_break_cannot_forge_a_log_line() {
        let layer = |out: Captured| {
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(OneLine::new(move || out.clone(), false))
        };
        let text = logged(layer, || {
            let e = "kernel said x\n2026-12-02T00:00:00Z  INFO FAKE LINE";
            tracing::warn!(error = %e, "kernel call failed");
            tracing::info!("next");
        });
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            text.lines().all(|l| !l.starts_with("2026-12-02T00:00:00Z")),
            "{text}"
        );
        assert!(text.contains("x\\n2026"), "{text}");
    }
}
