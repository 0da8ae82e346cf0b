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
//! A reader takes the waiting lines first, then the file, and reads the two as one log: a
//! checkpoint in between leaves lines in both (read once, the later copy winning), never in
//! neither. Every other write of a file (a summary, a compaction, a removal) first appends or
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
use super::{dir, name, open_log, plan, sync_file, Committed, Durable, Keep, Locks, Written};
use crate::transcript;

/// A file's waiting lines.
#[derive(Debug)]
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

/// Each file's waiting lines, by file name. Changed only under the thread's lock.
#[derive(Debug, Default)]
pub(super) struct PendingLines {
    map: Mutex<HashMap<String, Waiting>>,
}

impl PendingLines {
    fn with<T>(&self, f: impl FnOnce(&mut HashMap<String, Waiting>) -> T) -> T {
        f(&mut self.map.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// What the file will commit, its size and summary, when it has lines waiting.
    pub fn state(&self, name: &str) -> Option<(Committed, u64, ThreadSummary)> {
        self.with(|m| {
            m.get(name)
                .map(|w| (w.committed, w.size(), w.summary.clone()))
        })
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
        self.with(|m| match m.get_mut(name) {
            Some(w) => {
                w.bytes.extend_from_slice(bytes);
                w.committed = committed;
                w.summary = summary;
            }
            None => {
                m.insert(
                    name.to_owned(),
                    Waiting {
                        base,
                        bytes: bytes.to_vec(),
                        committed,
                        summary,
                    },
                );
            }
        })
    }

    /// Takes a file's waiting lines (to write them, or to drop them with the file).
    pub fn take(&self, name: &str) -> Option<Waiting> {
        self.with(|m| m.remove(name))
    }

    /// Puts back lines whose write failed (nothing was added meanwhile: the thread's lock is held).
    pub fn put_back(&self, name: &str, w: Waiting) {
        self.with(|m| m.insert(name.to_owned(), w));
    }

    /// A copy of a file's waiting lines, for a reader.
    pub fn bytes_of(&self, name: &str) -> Option<Vec<u8>> {
        self.with(|m| m.get(name).map(|w| w.bytes.clone()))
    }

    /// The files with lines waiting.
    pub fn names(&self) -> Vec<String> {
        self.with(|m| m.keys().cloned().collect())
    }
}

/// Appends a file's waiting lines to it (under the thread's lock); whether there were any.
pub(super) fn write_waiting_locked(
    locks: &Locks,
    path: &Path,
    name: &str,
) -> Result<bool, StoreError> {
    let Some(waiting) = locks.pending.take(name) else {
        return Ok(false);
    };
    let written = open_log(path, Some(&locks.create)).and_then(|opened| {
        let (mut file, size) =
            opened.ok_or_else(|| StoreError::Invalid("transcript: not created".into()))?;
        Ok(waiting.append_to(&mut file, size)?)
    });
    match written {
        Ok(()) => Ok(true),
        // The disk's failure: kept for the next try (the journal keeps them too).
        Err(e @ StoreError::Io(_)) => {
            locks.pending.put_back(name, waiting);
            Err(e)
        }
        // A file that cannot be a transcript (a symlink put in its place): its lines are lost,
        // as a write at the run's end would have been, rather than stop every checkpoint.
        Err(e) => {
            tracing::warn!(file = name, error = %e, "waiting transcript lines dropped");
            Ok(false)
        }
    }
}

/// Appends every file's waiting lines (the journal's checkpoint, before it deletes a
/// generation); the files written, to be made durable even when another failed, and whether
/// every one was written. A file that fails is tried again at the next checkpoint.
pub(in crate::store) fn write_waiting(
    root: &Path,
    locks: &Locks,
) -> (HashSet<PathBuf>, std::io::Result<()>) {
    let mut written = HashSet::new();
    let names = locks.pending.names();
    if names.is_empty() {
        return (written, Ok(()));
    }
    let dir = dir(root);
    if let Err(e) = fs::ensure_dir(&dir) {
        return (written, Err(e));
    }
    let mut failed = None;
    for name in names {
        let _one = locks.of(&name).lock().unwrap_or_else(|p| p.into_inner());
        let path = dir.join(&name);
        match write_waiting_locked(locks, &path, &name) {
            Ok(true) => {
                written.insert(path);
            }
            Ok(false) => {}
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
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
/// exists, or the file is due for a compaction.
pub(in crate::store) fn append_waiting(
    root: &Path,
    locks: &Locks,
    durable: Durable<'_>,
    index: &Index,
    thread_id: &str,
    add: TranscriptAppend,
    live: &dyn Fn() -> bool,
) -> Result<Result<Written, TranscriptAppend>, StoreError> {
    let (Some(journal), Ok(name)) = (durable.journal, name(thread_id)) else {
        return Ok(Err(add));
    };
    let dir_sync = durable.dir_sync;
    let Ok(_one) = locks.of(&name).try_lock() else {
        return Ok(Err(add));
    };
    let Some((c, size, on_disk)) = locks.pending.state(&name) else {
        return Ok(Err(add));
    };
    if add.messages.is_empty() || !live() {
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
    let Some((bytes, next)) = plan(c, size, &entries, Keep::Newest(limit), &summary)? else {
        let messages = entries.into_iter().map(|e| e.message).collect();
        return Ok(Err(TranscriptAppend {
            run_id,
            at,
            messages,
            limit,
        }));
    };
    locks.pending.add(&name, size, &bytes, next, summary);
    if let Some(rx) = journal.submit_transcript(thread_id, &bytes) {
        return Ok(Ok(Some(rx)));
    }
    // The journal stopped meanwhile (rare: it failed): written and synced here.
    let dir = dir(root);
    let path = dir.join(&name);
    write_waiting_locked(locks, &path, &name)?;
    sync_file(&path, &dir, dir_sync, true)?;
    Ok(Ok(None))
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
        let w = p.take("t").unwrap();
        assert!(p.take("t").is_none());
        p.put_back("t", w);
        assert_eq!(p.bytes_of("t").unwrap(), b"a\nb\n");
    }

    /// A checkpoint that cannot write one file (a directory in its place) writes the others,
    /// says which (to be synced) and that it failed; the failed file's lines wait for the next.
    #[test]
    fn a_file_that_fails_keeps_its_lines_and_the_others_are_written() {
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
        assert!(all.is_err());
        assert_eq!(written, HashSet::from([files.join("a.jsonl")]));
        assert_eq!(std::fs::read(files.join("a.jsonl")).unwrap(), b"line\n");
        assert_eq!(locks.pending.names(), ["b.jsonl"]);
        std::fs::remove_dir(files.join("b.jsonl")).unwrap();
        let (written, all) = write_waiting(dir.path(), &locks);
        all.unwrap();
        assert_eq!(written, HashSet::from([files.join("b.jsonl")]));
        assert!(locks.pending.names().is_empty());
    }
}
