//! The summary line that ends every write of a transcript file: the thread for the list (what
//! the file index reads at a start) and what of the file is committed. Its format alone, so that
//! the index and the transcripts both read it without reading each other.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::super::fs::{self, Loaded};
use super::super::listing::ThreadSummary;
use super::super::StoreError;
use super::MAX_FILE_BYTES;

/// The end of a file read to find its last summary line (a summary is far below it).
const TAIL_BYTES: u64 = 16 * 1024;

/// A summary line: the thread for the list, and what of the file is committed (absent in the
/// files of the version that wrote the summary as the first line only).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Header {
    pub thread: ThreadSummary,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) last: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) from: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) lines: Option<u64>,
}

impl Header {
    #[cfg(test)]
    pub(crate) fn of(thread: ThreadSummary) -> Header {
        Header {
            thread,
            last: None,
            from: None,
            lines: None,
        }
    }
}

/// What a file's last summary line commits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Committed {
    pub last: u64,
    pub from: u64,
    pub lines: u64,
}

pub(super) fn is_summary(line: &[u8]) -> bool {
    line.starts_with(br#"{"thread":"#)
}

/// The last line of `file` (of `size` bytes), when it is whole and within the tail read.
fn last_line(file: &File, size: u64) -> Option<Vec<u8>> {
    let n = size.min(TAIL_BYTES);
    let mut buf = vec![0; n as usize];
    file.read_exact_at(&mut buf, size - n).ok()?;
    if buf.pop() != Some(b'\n') {
        return None;
    }
    match buf.iter().rposition(|b| *b == b'\n') {
        Some(nl) => Some(buf.split_off(nl + 1)),
        None if n == size => Some(buf),
        None => None,
    }
}

/// The summary a transcript file ends with: its last summary line (the list's, at a restart).
pub(crate) fn last_summary(path: &Path) -> Option<Header> {
    let file = fs::open_private(path).ok()?;
    let size = file.metadata().ok()?.len();
    if let Some(line) = last_line(&file, size).filter(|l| is_summary(l)) {
        if let Ok(h) = serde_json::from_slice(&line) {
            return Some(h);
        }
    }
    // A torn end, or a file of the version that wrote its summary first: the whole file's last
    // readable summary among its whole lines.
    match fs::read_private(path, MAX_FILE_BYTES).ok()? {
        Loaded::Bytes(b) => last_of(&b),
        _ => None,
    }
}

/// What the file's last line commits, when it is a summary line of this format, and that summary.
pub(super) fn committed(file: &File, size: u64) -> Option<(Committed, ThreadSummary)> {
    let line = last_line(file, size).filter(|l| is_summary(l))?;
    let h: Header = serde_json::from_slice(&line).ok()?;
    let c = Committed {
        last: h.last?,
        from: h.from?,
        lines: h.lines?,
    };
    Some((c, h.thread))
}

/// A summary line for `thread` committing `c`, appended to `out`.
pub(super) fn summary_line(
    out: &mut Vec<u8>,
    thread: ThreadSummary,
    c: Committed,
) -> Result<(), StoreError> {
    super::line_of(
        out,
        &Header {
            thread,
            last: Some(c.last),
            from: Some(c.from),
            lines: Some(c.lines),
        },
    )
}

/// The last readable summary line among the whole lines of `bytes` (a last line without its
/// newline is of a write that did not finish).
pub(super) fn last_of(bytes: &[u8]) -> Option<Header> {
    let end = bytes.iter().rposition(|b| *b == b'\n')?;
    bytes[..end]
        .rsplit(|b| *b == b'\n')
        .filter(|l| is_summary(l))
        .find_map(|l| serde_json::from_slice::<Header>(l).ok())
}
