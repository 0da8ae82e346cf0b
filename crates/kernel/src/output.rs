//! The managed kernel's standard output and error, read line by line into the gateway's log:
//! each line one event marked `source="kernel"` (stdout at info, stderr at warn), so that the
//! kernel's output has the gateway's format (JSON lines stay JSON) and goes where its logs go.
//!
//! A line is kept up to [`MAX_LINE`] bytes; the rest of a longer one is counted and dropped, so a
//! chatty kernel (or one that never writes a newline) cannot make the gateway hold its output.
//! And a stream logs at most [`LINES_PER_SECOND`] lines a second (bursts up to [`BURST`]): a
//! kernel whose user runs what they like could otherwise flood the log until a log collector's
//! own rate limit drops the gateway's lines; what is dropped is counted in one line after.

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a stream is still read once its kernel's life is over (what it wrote last).
const AFTER_END: Duration = Duration::from_secs(2);
/// How often a waiting read looks whether the kernel's life is over.
const LOOK_EVERY: Duration = Duration::from_millis(250);

/// Set when a kernel's life is over: its streams are read [`AFTER_END`] more, then let go,
/// whoever still holds them open (a process that left the kernel's group).
#[derive(Debug, Clone, Default)]
pub struct Over(Arc<AtomicBool>);

impl Over {
    pub fn end(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    fn is_over(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// A pipe read only while it has data or its kernel lives: at the end of the kernel's life, a
/// read that waits returns end of file within [`AFTER_END`].
struct Bounded<R> {
    inner: R,
    fd: RawFd,
    over: Over,
    since: Option<Instant>,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            if self.over.is_over() {
                let since = *self.since.get_or_insert_with(Instant::now);
                if since.elapsed() >= AFTER_END {
                    return Ok(0);
                }
            }
            let mut p = libc::pollfd {
                fd: self.fd,
                events: libc::POLLIN,
                revents: 0,
            };
            let wait = LOOK_EVERY.as_millis() as libc::c_int;
            // SAFETY: one pollfd on this stack, for the call.
            #[allow(unsafe_code)]
            let ready = unsafe { libc::poll(&mut p, 1, wait) };
            if ready > 0 {
                return self.inner.read(buf);
            }
            if ready < 0
                && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
            {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
}

/// The longest part of one line of the kernel's output that is logged.
pub const MAX_LINE: usize = 8 * 1024;

/// Lines a second one stream of a kernel logs, in the long run.
pub const LINES_PER_SECOND: u32 = 200;
/// Lines one stream may log at once after a quiet spell.
pub const BURST: u32 = 2_000;

/// How many lines a stream may log now: a token bucket, and the lines dropped since it last
/// logged.
#[derive(Debug)]
struct Budget {
    tokens: f64,
    at: Instant,
    dropped: u64,
}

/// What to do with a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    /// Log it; `dropped` lines were dropped before it (say so first).
    Log {
        dropped: u64,
    },
    Drop,
}

impl Budget {
    fn new(now: Instant) -> Budget {
        Budget {
            tokens: f64::from(BURST),
            at: now,
            dropped: 0,
        }
    }

    fn take(&mut self, now: Instant) -> Verdict {
        let earned =
            now.saturating_duration_since(self.at).as_secs_f64() * f64::from(LINES_PER_SECOND);
        self.tokens = (self.tokens + earned).min(f64::from(BURST));
        self.at = now;
        if self.tokens < 1.0 {
            self.dropped += 1;
            return Verdict::Drop;
        }
        self.tokens -= 1.0;
        Verdict::Log {
            dropped: std::mem::take(&mut self.dropped),
        }
    }
}

/// Which of the kernel's streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }
}

/// Logs what the kernel `pid` writes to `pipe`, in a thread of its own that ends with the pipe
/// (when the kernel's process group is gone), or [`AFTER_END`] after `over` says its life is.
pub fn forward(pid: u32, stream: Stream, pipe: impl Read + AsRawFd + Send + 'static, over: Over) {
    let fd = pipe.as_raw_fd();
    let pipe = Bounded {
        inner: pipe,
        fd,
        over,
        since: None,
    };
    let spawned = std::thread::Builder::new()
        .name(format!("kernel-{}", stream.name()))
        .spawn(move || {
            let mut budget = Budget::new(Instant::now());
            let _ = read_lines(pipe, MAX_LINE, |line, cut| {
                if let Verdict::Log { dropped } = budget.take(Instant::now()) {
                    if dropped > 0 {
                        tracing::warn!(
                            source = "kernel",
                            stream = stream.name(),
                            pid,
                            dropped,
                            "lines of the kernel's output dropped (over {LINES_PER_SECOND} a second)"
                        );
                    }
                    log(pid, stream, line, cut);
                }
            });
            // What was dropped at the end is said too.
            if budget.dropped > 0 {
                tracing::warn!(
                    source = "kernel",
                    stream = stream.name(),
                    pid,
                    dropped = budget.dropped,
                    "lines of the kernel's output dropped (over {LINES_PER_SECOND} a second)"
                );
            }
        });
    if let Err(e) = spawned {
        tracing::error!(pid, stream = stream.name(), error = %e, "the kernel's output cannot be read");
    }
}

fn log(pid: u32, stream: Stream, line: &[u8], cut: usize) {
    let text = String::from_utf8_lossy(line);
    let name = stream.name();
    // Only a cut line says how much was cut: a `None` field is not recorded.
    let cut_bytes = (cut > 0).then_some(cut);
    match stream {
        Stream::Stdout => {
            tracing::info!(source = "kernel", stream = name, pid, cut_bytes, "{text}")
        }
        Stream::Stderr => {
            tracing::warn!(source = "kernel", stream = name, pid, cut_bytes, "{text}")
        }
    }
}

/// Calls `emit` with each line of `r` (without its `\n` or `\r\n`), at most `max` bytes of it,
/// and how many bytes of it were dropped; a last line without a newline too. Holds at most
/// `max` bytes of a line and one read buffer.
fn read_lines(r: impl Read, max: usize, mut emit: impl FnMut(&[u8], usize)) -> std::io::Result<()> {
    let mut r = BufReader::with_capacity(8 * 1024, r);
    let mut line: Vec<u8> = Vec::new();
    let mut cut = 0usize;
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            if !line.is_empty() || cut > 0 {
                emit(trim_cr(&line), cut);
            }
            return Ok(());
        }
        let newline = buf.iter().position(|b| *b == b'\n');
        let part = &buf[..newline.unwrap_or(buf.len())];
        let take = part.len().min(max - line.len());
        line.extend_from_slice(&part[..take]);
        cut += part.len() - take;
        let used = newline.map_or(buf.len(), |i| i + 1);
        r.consume(used);
        if newline.is_some() {
            emit(trim_cr(&line), cut);
            line.clear();
            cut = 0;
        }
    }
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(input: &[u8], max: usize) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        read_lines(input, max, |line, cut| {
            out.push((String::from_utf8_lossy(line).into_owned(), cut))
        })
        .expect("read");
        out
    }

    fn l(s: &str, cut: usize) -> (String, usize) {
        (s.to_owned(), cut)
    }

    #[test]
    fn one_event_a_line_the_last_one_too() {
        assert_eq!(
            lines(b"one\r\ntwo\n\nlast", 100),
            [l("one", 0), l("two", 0), l("", 0), l("last", 0)]
        );
        assert!(lines(b"", 100).is_empty());
    }

    #[test]
    fn a_long_line_is_cut_and_what_was_dropped_counted() {
        assert_eq!(lines(b"abcdefgh\nxy\n", 3), [l("abc", 5), l("xy", 0)]);
        // Longer than a read buffer, without any newline: bounded all the same.
        let huge = vec![b'x'; 100_000];
        let got = lines(&huge, MAX_LINE);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0.len(), MAX_LINE);
        assert_eq!(got[0].1, 100_000 - MAX_LINE);
    }

    /// A reader that never holds more than one chunk, so that a line spans many reads.
    struct Trickle(Vec<u8>, usize);

    impl Read for Trickle {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(7).min(self.0.len() - self.1);
            buf[..n].copy_from_slice(&self.0[self.1..self.1 + n]);
            self.1 += n;
            Ok(n)
        }
    }

    /// A burst is logged whole, then the long-run rate; what is dropped is told with the next
    /// line logged.
    #[test]
    fn a_stream_logs_a_burst_then_its_rate_and_counts_what_it_drops() {
        let t0 = Instant::now();
        let mut b = Budget::new(t0);
        let logged = (0..BURST + 50)
            .filter(|_| matches!(b.take(t0), Verdict::Log { .. }))
            .count();
        assert_eq!(logged, BURST as usize);
        assert_eq!(b.take(t0), Verdict::Drop);
        // A second later: the rate's worth again, and the 51 dropped told with the first.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(b.take(t1), Verdict::Log { dropped: 51 });
        let more = (1..LINES_PER_SECOND + 10)
            .filter(|_| matches!(b.take(t1), Verdict::Log { .. }))
            .count();
        assert_eq!(more, LINES_PER_SECOND as usize - 1);
        // Quiet for long: a whole burst again, never more.
        let t2 = t1 + Duration::from_secs(3600);
        let again = (0..BURST * 2)
            .filter(|_| matches!(b.take(t2), Verdict::Log { .. }))
            .count();
        assert_eq!(again, BURST as usize);
    }

    /// A process the kernel left behind holds the pipe open: once the kernel's life is over, the
    /// reading ends within [`AFTER_END`] all the same, with what was written.
    #[test]
    fn a_pipe_held_by_a_leftover_is_let_go_when_the_life_is_over() {
        use std::process::{Command, Stdio};
        let mut child = Command::new("sh")
            .args(["-c", "echo hi; sleep 30 & echo $!"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("sh");
        let pipe = child.stdout.take().expect("stdout");
        let over = Over::default();
        let fd = pipe.as_raw_fd();
        let bounded = Bounded {
            inner: pipe,
            fd,
            over: over.clone(),
            since: None,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut got = Vec::new();
            let _ = read_lines(bounded, MAX_LINE, |l, _| {
                got.push(String::from_utf8_lossy(l).into_owned())
            });
            let _ = tx.send(got);
        });
        child.wait().expect("wait");
        // The shell is gone; its sleep holds the pipe: the reading waits...
        assert!(rx.recv_timeout(Duration::from_millis(700)).is_err());
        // ...until the life is over.
        let ended = Instant::now();
        over.end();
        let got = rx.recv_timeout(Duration::from_secs(5)).expect("let go");
        assert!(ended.elapsed() < AFTER_END + Duration::from_secs(1));
        assert_eq!(got[0], "hi");
        if let Some(pid) = got.get(1).and_then(|p| p.trim().parse::<i32>().ok()) {
            // SAFETY: a plain signal to the test's own leftover.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }

    #[test]
    fn lines_split_across_reads_come_out_whole() {
        let mut out = Vec::new();
        let input = b"a line longer than a read\nand another\n".to_vec();
        read_lines(Trickle(input, 0), 10, |line, cut| {
            out.push((String::from_utf8_lossy(line).into_owned(), cut))
        })
        .expect("read");
        assert_eq!(out, [l("a line lon", 15), l("and anothe", 1)]);
    }
}
