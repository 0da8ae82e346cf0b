//! The file store's transcripts: `<state-dir>/transcripts/<stem>.jsonl`, the thread's summary
//! for the list on the first line (`{"thread": {…}}`, `file_index`), then one entry a line
//! (`{"seq","runId","at","message"}`), next to the thread files the reference adapter shares
//! (it never looks in this directory).
//!
//! An append reads the file, adds the run's entries, drops the oldest beyond the limit and
//! replaces the file atomically and durably (a temporary file, fsynced, renamed; the directory
//! fsynced): a crash leaves the old transcript or the new one, never a torn line. Appends to one
//! thread are serialised (a guidance run may end while its thread's turn ends).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::file_index::{Header, Index};
use super::fs::{self, DirSync, Loaded};
use super::listing::{self, ThreadSummary};
use super::{file_stem, StoreError, TranscriptAppend};
use crate::transcript::{self, Entry, Page};

/// The largest transcript file read (the limit and the bound on each message keep a thread's far
/// below it).
const MAX_FILE_BYTES: u64 = 256 * 1024 * 1024;

/// Serialises appends per thread (striped: a fixed number of locks, whatever the threads).
pub(super) struct Locks([Mutex<()>; 64]);

impl Default for Locks {
    fn default() -> Locks {
        Locks(std::array::from_fn(|_| Mutex::new(())))
    }
}

impl Locks {
    fn of(&self, stem: &str) -> &Mutex<()> {
        let h = stem
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        &self.0[(h % self.0.len() as u64) as usize]
    }
}

pub(super) fn dir(root: &Path) -> PathBuf {
    root.join("transcripts")
}

fn name(thread_id: &str) -> Result<String, StoreError> {
    file_stem(thread_id)
        .map(|s| format!("{s}.jsonl"))
        .ok_or_else(|| StoreError::Invalid("empty thread id".into()))
}

/// The thread's entries, oldest first (none when it has no transcript).
pub(super) fn read_all(root: &Path, thread_id: &str) -> Result<Vec<Entry>, StoreError> {
    let path = dir(root).join(name(thread_id)?);
    let bytes = match fs::read_private(&path, MAX_FILE_BYTES)? {
        Loaded::Missing => return Ok(Vec::new()),
        Loaded::Refused(why) => return Err(StoreError::Invalid(format!("transcript: {why}"))),
        Loaded::Bytes(b) => b,
    };
    let mut entries = Vec::new();
    for (n, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() || (n == 0 && line.starts_with(br#"{"thread":"#)) {
            continue;
        }
        match serde_json::from_slice::<Entry>(line) {
            Ok(e) => entries.push(e),
            // Written whole by a rename, so this is a file someone edited: the rest is kept.
            Err(e) => {
                tracing::warn!(thread_id, error = %e, "skipped an unreadable transcript line")
            }
        }
    }
    Ok(entries)
}

pub(super) fn read_page(
    root: &Path,
    thread_id: &str,
    before: Option<u64>,
    limit: usize,
) -> Result<Page, StoreError> {
    Ok(transcript::page_of(
        read_all(root, thread_id)?.into_iter(),
        before,
        limit,
    ))
}

pub(super) fn append(
    root: &Path,
    locks: &Locks,
    dir_sync: &DirSync,
    index: &Index,
    thread_id: &str,
    add: TranscriptAppend,
) -> Result<(), StoreError> {
    if add.messages.is_empty() {
        return Ok(());
    }
    let name = name(thread_id)?;
    let _one = locks.of(&name).lock().unwrap_or_else(|p| p.into_inner());
    let mut entries = read_all(root, thread_id)?;
    let last = entries.last().map_or(0, |e| e.seq);
    let title = listing::title_of(&add.messages);
    entries.extend(transcript::number(last, &add.run_id, &add.at, add.messages));
    let keep = entries.len().saturating_sub(add.limit);
    let summary = index.appended(thread_id, title, &add.at);
    let bytes = encode(&summary, &entries[keep..])?;
    fs::replace(&dir(root), &name, &bytes, Some(dir_sync))?;
    Ok(())
}

/// Writes the thread's summary as its transcript's first line (the entries as they are; a
/// transcript made when there is none).
pub(super) fn write_header(
    root: &Path,
    locks: &Locks,
    dir_sync: &DirSync,
    thread_id: &str,
    summary: &ThreadSummary,
) -> Result<(), StoreError> {
    let name = name(thread_id)?;
    let _one = locks.of(&name).lock().unwrap_or_else(|p| p.into_inner());
    let entries = read_all(root, thread_id)?;
    fs::replace(
        &dir(root),
        &name,
        &encode(summary, &entries)?,
        Some(dir_sync),
    )?;
    Ok(())
}

/// Removes the thread's transcript, durably.
pub(super) fn remove(root: &Path, locks: &Locks, thread_id: &str) -> Result<(), StoreError> {
    let name = name(thread_id)?;
    let _one = locks.of(&name).lock().unwrap_or_else(|p| p.into_inner());
    match std::fs::remove_file(dir(root).join(&name)) {
        Ok(()) => fs::sync_dir(&dir(root))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    Ok(())
}

fn encode(summary: &ThreadSummary, entries: &[Entry]) -> Result<Vec<u8>, StoreError> {
    let bad = |e: serde_json::Error| StoreError::Invalid(e.to_string());
    let mut bytes = serde_json::to_vec(&Header {
        thread: summary.clone(),
    })
    .map_err(bad)?;
    bytes.push(b'\n');
    for e in entries {
        serde_json::to_writer(&mut bytes, e).map_err(bad)?;
        bytes.push(b'\n');
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn add(run: &str, n: usize, limit: usize) -> TranscriptAppend {
        TranscriptAppend {
            run_id: run.into(),
            at: "2026-12-02T00:00:00.000Z".into(),
            messages: (0..n)
                .map(|i| json!({"id": format!("{run}-{i}"), "role": "assistant", "content": "x"}))
                .collect(),
            limit,
        }
    }

    #[test]
    fn appends_number_on_and_the_oldest_go_first() {
        let dir = tempfile::tempdir().unwrap();
        let (locks, sync) = (Locks::default(), DirSync::default());
        append(
            dir.path(),
            &locks,
            &sync,
            &Index::default(),
            "t-1",
            add("r1", 3, 4),
        )
        .unwrap();
        append(
            dir.path(),
            &locks,
            &sync,
            &Index::default(),
            "t-1",
            add("r2", 2, 4),
        )
        .unwrap();
        let all = read_all(dir.path(), "t-1").unwrap();
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3, 4, 5]);
        assert_eq!(all[0].message["id"], "r1-1");
        assert_eq!(all[3].run_id, "r2");
        let page = read_page(dir.path(), "t-1", Some(4), 10).unwrap();
        assert_eq!(
            page.entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [2, 3]
        );
        assert!(read_all(dir.path(), "other").unwrap().is_empty());
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(super::dir(dir.path()).join("t-1.jsonl"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn concurrent_appends_to_one_thread_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (locks, sync) = (
            std::sync::Arc::new(Locks::default()),
            std::sync::Arc::new(DirSync::default()),
        );
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (root, locks, sync) = (dir.path().to_owned(), locks.clone(), sync.clone());
                std::thread::spawn(move || {
                    append(
                        &root,
                        &locks,
                        &sync,
                        &Index::default(),
                        "t",
                        add(&format!("r{i}"), 5, 1000),
                    )
                    .unwrap()
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let all = read_all(dir.path(), "t").unwrap();
        assert_eq!(all.len(), 40);
        assert_eq!(
            all.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (1..=40).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_symlinked_transcript_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(super::dir(dir.path())).unwrap();
        std::fs::write(dir.path().join("secret"), b"{}\n").unwrap();
        std::os::unix::fs::symlink(
            dir.path().join("secret"),
            super::dir(dir.path()).join("t.jsonl"),
        )
        .unwrap();
        assert!(matches!(
            read_all(dir.path(), "t"),
            Err(StoreError::Invalid(_))
        ));
    }
}
