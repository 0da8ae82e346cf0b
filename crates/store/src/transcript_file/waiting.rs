//! Transcript lines that wait for the journal's checkpoint to reach their files.
//!
//! With the state journal, a run's end does not touch its transcript file: its lines (entries
//! and the summary that commits them, exactly what would be appended) are queued in the journal,
//! whose group commit makes them durable, and kept here, in memory, per file. The checkpoint
//! appends each file's waiting lines in one write and makes the files durable before it deletes
//! a generation; a start-up after a crash appends them again from the journal. So a turn costs
//! no file open, read or write of its own, and a thread with several turns between two
//! checkpoints gets one write for all of them (a per-run append was most of what a transcript
//! cost a short turn).
//!
//! A reader takes the waiting lines first, then the file, and reads the two as one log: lines
//! stay waiting until their file holds them, so a checkpoint in between leaves lines in both
//! (read once, the later copy winning), never in neither. At most 32 MiB waits in all (past it a
//! write appends at once); the files written are synced by the next checkpoint. Every other write of a file (a summary, a compaction, a removal) first appends or
//! drops its waiting lines under the thread's lock, so the file is whole when it is rewritten.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::super::file_index::Index;
use super::super::fs;
use super::super::listing::{self, ThreadSummary};
use super::super::{StoreError, TranscriptAppend};
use super::{dir, name, open_log, plan, Committed, Durable, Keep, Locks, Written};
use crate::transcript;

/// A file's waiting lines.
#[derive(Debug, Clone)]
pub(super) struct Waiting {
    /// The size of the file the lines go after: what they were made for.
    pub base: u64,
    pub bytes: Vec<u8>,
    /// What the file commits once they are appended, and the summary it then ends with.
    pub committed: Committed,
    pub summary: ThreadSummary,
}

impl Waiting {
    /// The file's size once the lines are appended.
    pub fn size(&self) -> u64 {
        self.base + self.bytes.len() as u64
    }

    /// Appends the lines to `file` (opened for appending; `size` long): a file longer than the
    /// lines were made for holds part of a write that failed, which goes first. On failure the
    /// file is cut back, so that the next try finds it as it was.
    pub fn append_to(&self, file: &mut File, size: u64) -> std::io::Result<()> {
        if size > self.base {
            file.set_len(self.base)?;
        } else if size < self.base {
            // Only if the file was cut or replaced behind the store: its lines follow what is
            // left, and the summary they end with still says what is committed.
            tracing::warn!(
                size,
                base = self.base,
                "a transcript file is shorter than its waiting lines expect"
            );
        }
        file.write_all(&self.bytes).inspect_err(|_| {
            let _ = file.set_len(size.min(self.base));
        })
    }
}

/// At most this much waits in memory in all: past it, a write appends its lines at once (the
/// checkpoint still syncs them), so that failing checkpoints cannot grow the memory.
const MAX_WAITING_BYTES: usize = if cfg!(test) { 4096 } else { 32 * 1024 * 1024 };

#[derive(Debug, Default)]
struct Map {
    files: HashMap<String, Waiting>,
    /// The bytes of every file's waiting lines.
    bytes: usize,
}

/// Each file's waiting lines, by file name, changed only under the thread's lock; and the
/// files written since the last checkpoint, which it syncs.
#[derive(Debug, Default)]
pub(super) struct PendingLines {
    map: Mutex<Map>,
    written: Mutex<HashSet<PathBuf>>,
}

impl PendingLines {
    fn with<T>(&self, f: impl FnOnce(&mut Map) -> T) -> T {
        f(&mut self.map.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// What the file will commit, its size and summary, when it has lines waiting.
    pub fn state(&self, name: &str) -> Option<(Committed, u64, ThreadSummary)> {
        self.with(|m| {
            m.files
                .get(name)
                .map(|w| (w.committed, w.size(), w.summary.clone()))
        })
    }

    /// Whether more than the bound waits.
    pub fn full(&self) -> bool {
        self.with(|m| m.bytes > MAX_WAITING_BYTES)
    }

    /// Adds lines after those waiting (or after a file of `base` bytes when none wait).
    pub fn add(
        &self,
        name: &str,
        base: u64,
        bytes: &[u8],
        committed: Committed,
        summary: ThreadSummary,
    ) {
        self.with(|m| {
            m.bytes += bytes.len();
            match m.files.get_mut(name) {
                Some(w) => {
                    w.bytes.extend_from_slice(bytes);
                    w.committed = committed;
                    w.summary = summary;
                }
                None => {
                    let w = Waiting {
                        base,
                        bytes: bytes.to_vec(),
                        committed,
                        summary,
                    };
                    m.files.insert(name.to_owned(), w);
                }
            }
        })
    }

    /// Drops a file's waiting lines (written, or gone with the file).
    pub fn take(&self, name: &str) -> Option<Waiting> {
        self.with(|m| {
            let w = m.files.remove(name)?;
            m.bytes -= w.bytes.len();
            Some(w)
        })
    }

    /// A copy of a file's waiting lines, to write them: they stay waiting until written, so that
    /// a reader meanwhile finds them (the file may hold part of them).
    pub fn copy(&self, name: &str) -> Option<Waiting> {
        self.with(|m| m.files.get(name).cloned())
    }

    /// A copy of a file's waiting lines, for a reader.
    pub fn bytes_of(&self, name: &str) -> Option<Vec<u8>> {
        self.with(|m| m.files.get(name).map(|w| w.bytes.clone()))
    }

    /// The files with lines waiting.
    pub fn names(&self) -> Vec<String> {
        self.with(|m| m.files.keys().cloned().collect())
    }

    /// A file written its waiting lines (not synced).
    fn wrote(&self, path: &Path) {
        let mut w = self.written.lock().unwrap_or_else(|p| p.into_inner());
        w.insert(path.to_owned());
    }

    /// The files written since the last call, to be synced.
    fn drain_written(&self) -> HashSet<PathBuf> {
        std::mem::take(&mut *self.written.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// Whether a failed write of a file may succeed later (the disk's state), or the file itself
/// stands in the way (a directory, a symlink, its permissions) and never will.
fn transient(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ENOSPC
                | libc::EDQUOT
                | libc::EIO
                | libc::EINTR
                | libc::EAGAIN
                | libc::ENOMEM
                | libc::EMFILE
                | libc::ENFILE
        )
    )
}

/// Appends a file's waiting lines to it (under the thread's lock); whether there were any.
pub(super) fn write_waiting_locked(
    locks: &Locks,
    path: &Path,
    name: &str,
) -> Result<bool, StoreError> {
    let Some(waiting) = locks.pending.copy(name) else {
        return Ok(false);
    };
    let written = open_log(path, Some(&locks.create)).and_then(|opened| {
        let (mut file, size) =
            opened.ok_or_else(|| StoreError::Invalid("transcript: not created".into()))?;
        Ok(waiting.append_to(&mut file, size)?)
    });
    match written {
        Ok(()) => {
            locks.pending.take(name);
            locks.pending.wrote(path);
            Ok(true)
        }
        // The disk's failure: they wait for the next try (the journal keeps them too).
        Err(StoreError::Io(e)) if transient(&e) => Err(StoreError::Io(e)),
        // A file that cannot be a transcript (a symlink or a directory in its place, a file the
        // gateway may not write): its lines are lost, as a write at the run's end would have
        // been, rather than stop every checkpoint.
        Err(e) => {
            tracing::warn!(file = name, error = %e, "waiting transcript lines dropped");
            locks.pending.take(name);
            Ok(false)
        }
    }
}

/// Appends every file's waiting lines (the journal's checkpoint, before it deletes a
/// generation); the files written, to be made durable even when another failed, and whether
/// every one was written. A file that fails is tried again at the next checkpoint.
pub(crate) fn write_waiting(root: &Path, locks: &Locks) -> (HashSet<PathBuf>, std::io::Result<()>) {
    let names = locks.pending.names();
    let mut failed = None;
    if !names.is_empty() {
        let dir = dir(root);
        match fs::ensure_dir(&dir) {
            Ok(()) => {
                for name in names {
                    let _one = locks.of(&name).lock().unwrap_or_else(|p| p.into_inner());
                    if let Err(e) = write_waiting_locked(locks, &dir.join(&name), &name) {
                        failed.get_or_insert(e);
                    }
                }
            }
            Err(e) => failed = Some(StoreError::Io(e)),
        }
    }
    // Every file written since the last checkpoint, also by a write that failed after it.
    let written = locks.pending.drain_written();
    let result = match failed {
        None => Ok(()),
        Some(StoreError::Io(e)) => Err(e),
        Some(e) => Err(std::io::Error::other(e.to_string())),
    };
    (written, result)
}

/// A run's messages added to the lines already waiting for the thread's file, in memory only
/// (their journal record queued): no file is opened, read or written. `Err(add)` when that is
/// not how this append goes ([`append`] then does it): no lines wait, the thread's lock is
/// taken (never waited for here: the caller is an async task), `live` does not say the thread
/// exists, the file is due for a compaction, too much waits already, or the journal is not in
/// use.
pub(crate) fn append_waiting(
    locks: &Locks,
    durable: Durable<'_>,
    index: &Index,
    thread_id: &str,
    add: TranscriptAppend,
    live: &dyn Fn() -> bool,
) -> Result<Result<Written, TranscriptAppend>, StoreError> {
    let (Some(_), Ok(name)) = (durable.journal, name(thread_id)) else {
        return Ok(Err(add));
    };
    let Ok(_one) = locks.of(&name).try_lock() else {
        return Ok(Err(add));
    };
    let Some((c, size, on_disk)) = locks.pending.state(&name) else {
        return Ok(Err(add));
    };
    if add.messages.is_empty() || locks.pending.full() || !live() {
        return Ok(Err(add));
    }
    let title = listing::title_of(&add.messages);
    let TranscriptAppend {
        run_id,
        at,
        messages,
        limit,
    } = add;
    let entries = transcript::number(c.last, &run_id, &at, messages);
    let summary = index.appended(thread_id, title, &at, Some(&on_disk));
    let back = |entries: Vec<transcript::Entry>| TranscriptAppend {
        messages: entries.into_iter().map(|e| e.message).collect(),
        run_id: run_id.clone(),
        at: at.clone(),
        limit,
    };
    let Some((bytes, next)) = plan(c, size, &entries, Keep::Newest(limit), &summary)? else {
        return Ok(Err(back(entries)));
    };
    // Queued before the lines are added, under the thread's lock: a checkpoint between the two
    // waits for this lock before it writes the file's lines, these among them.
    let Some(rx) = durable.submit(thread_id, &bytes) else {
        // The journal is not in use (it failed): the blocking path writes and syncs the file.
        return Ok(Err(back(entries)));
    };
    locks.pending.add(&name, size, &bytes, next, summary);
    Ok(Ok(Some(rx)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;

    fn waiting(base: u64, bytes: &[u8]) -> Waiting {
        Waiting {
            base,
            bytes: bytes.to_vec(),
            committed: Committed {
                last: 1,
                from: 1,
                lines: 2,
            },
            summary: ThreadSummary::new("t", "2026-12-04T00:00:00.000Z"),
        }
    }

    fn append_file(path: &std::path::Path) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .open(path)
            .unwrap()
    }

    #[test]
    fn lines_go_after_what_they_were_made_for_and_a_failed_writes_part_goes_first() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.jsonl");
        std::fs::write(&path, b"old\npart of a failed wri").unwrap();
        let w = waiting(4, b"new\n");
        let mut f = append_file(&path);
        w.append_to(&mut f, 24).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"old\nnew\n");
        assert_eq!(w.size(), 8);
        let mut buf = [0u8; 4];
        f.read_exact_at(&mut buf, 4).unwrap();
        assert_eq!(&buf, b"new\n");
    }

    #[test]
    fn lines_added_join_those_waiting_and_are_taken_whole() {
        let p = PendingLines::default();
        assert!(p.state("t").is_none());
        let c = |last| Committed {
            last,
            from: 1,
            lines: last + 1,
        };
        let s = ThreadSummary::new("t", "2026-12-04T00:00:00.000Z");
        p.add("t", 10, b"a\n", c(1), s.clone());
        p.add("t", 99, b"b\n", c(2), s.clone());
        let (committed, size, _) = p.state("t").unwrap();
        assert_eq!((committed.last, size), (2, 14), "the first base stays");
        assert_eq!(p.bytes_of("t").unwrap(), b"a\nb\n");
        assert_eq!(p.names(), ["t"]);
        assert_eq!(p.copy("t").unwrap().bytes, b"a\nb\n");
        assert_eq!(
            p.bytes_of("t").unwrap(),
            b"a\nb\n",
            "a copy leaves them waiting"
        );
        assert!(!p.full());
        p.add("u", 0, &[b'x'; MAX_WAITING_BYTES], c(1), s.clone());
        assert!(p.full());
        let w = p.take("u").unwrap();
        assert_eq!(w.bytes.len(), MAX_WAITING_BYTES);
        assert!(!p.full(), "counted off when taken");
        assert!(p.take("u").is_none());
    }

    /// A checkpoint writes every file's lines and names the files to sync; a file that can never
    /// be a transcript (a directory in its place) loses its lines rather than stop every
    /// checkpoint; the disk's failures (no space, I/O) keep them for the next.
    #[test]
    fn a_file_in_the_way_loses_its_lines_and_the_others_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let locks = Locks::default();
        let c = Committed {
            last: 1,
            from: 1,
            lines: 1,
        };
        let s = ThreadSummary::new("t", "2026-12-04T00:00:00.000Z");
        for name in ["a.jsonl", "b.jsonl"] {
            locks.pending.add(name, 0, b"line\n", c, s.clone());
        }
        let files = super::super::dir(dir.path());
        std::fs::create_dir_all(files.join("b.jsonl")).unwrap();
        let (written, all) = write_waiting(dir.path(), &locks);
        all.unwrap();
        assert_eq!(written, HashSet::from([files.join("a.jsonl")]));
        assert_eq!(std::fs::read(files.join("a.jsonl")).unwrap(), b"line\n");
        assert!(locks.pending.names().is_empty());
        assert!(write_waiting(dir.path(), &locks).0.is_empty(), "named once");
        let err = std::io::Error::from_raw_os_error;
        for (code, again) in [
            (libc::ENOSPC, true),
            (libc::EIO, true),
            (libc::EISDIR, false),
            (libc::EACCES, false),
        ] {
            assert_eq!(transient(&err(code)), again, "{code}");
        }
    }
}
