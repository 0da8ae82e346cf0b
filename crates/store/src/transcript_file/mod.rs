//! The file store's transcripts: `<state-dir>/transcripts/<stem>.jsonl`, next to the thread
//! files the reference adapter shares (it never looks in this directory). Each is a log of two
//! kinds of line: entries (`{"seq","runId","at","message"}`) and the thread's summary for the
//! list (`{"thread": {…}, "last", "from", "lines"}`, read by `file_index`), which ends every
//! write and says what is committed: the newest `seq` (`last`; an entry above it is of a write
//! that did not finish), the oldest kept (`from`; the limit's cut) and the file's line count.
//!
//! A run's end adds its entries and a summary line, appended in one write: no new inode, no
//! rename (a file created and renamed at every run cost more than the rest of the run: ext4
//! scans past its recently deleted inodes). With the store's journal the lines are queued in it
//! (its group commit makes them durable) and wait in memory for the journal's checkpoint, which
//! appends them and syncs the file (`waiting`); without one, they are appended at
//! once and the file's data synced (and the directory, for the write that made the file). Once
//! the file holds half as many lines again as it keeps (64 more for a short thread), it is
//! compacted: replaced atomically and durably (a temporary file, fsynced,
//! renamed; the directory fsynced) by its kept entries and its summary. A file whose last line
//! is not a summary (a torn write, or one written by a version that wrote the summary first) is
//! compacted at its next write. Appends to one thread are serialised (a guidance run may end
//! while its thread's turn ends); a reader needs no lock, since it takes what the last whole
//! summary line commits, after the lines waiting for the checkpoint.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;

use std::sync::Arc;

use tokio::sync::oneshot;

use super::file_index::Index;
use super::fs::{self, DirSync, Loaded};
use super::journal::Journal;
use super::listing::{self, ThreadSummary};
use super::{file_stem, StoreError, TranscriptAppend};
use crate::transcript::{self, Entry, Page};

mod rewrite;
pub(super) mod summary;
mod waiting;

use rewrite::compact;
pub(super) use rewrite::replay;
use summary::Header;
use summary::{committed, is_summary, summary_line, Committed};
pub(super) use waiting::{append_waiting, write_waiting};
use waiting::{write_waiting_locked, PendingLines};

/// The largest transcript file read (the limit and the bound on each message keep a thread's far
/// below it).
pub(super) const MAX_FILE_BYTES: u64 = 256 * 1024 * 1024;

/// A file is compacted before it grows past this, and a compaction keeps no more than this of
/// the newest entries (far more than the limit's messages take at their usual size; small in
/// unit tests, which fill it).
const BUDGET_BYTES: u64 = if cfg!(test) {
    64 * 1024
} else {
    MAX_FILE_BYTES / 2
};

/// Serialises appends per thread (striped: a fixed number of locks, whatever the threads), and
/// the making of files; holds the lines waiting for the journal's checkpoint.
pub(super) struct Locks {
    threads: [Mutex<()>; 64],
    create: Mutex<()>,
    pending: PendingLines,
    /// Turns to read whole transcripts (tens of MiB parsed each): too many at once exhaust memory.
    pub(super) readers: std::sync::Arc<tokio::sync::Semaphore>,
}

/// Transcripts read at once; further readers wait (at most [`READ_WAIT`]).
pub(super) const READERS: usize = 4;
/// The longest wait for a turn to read a transcript before the read fails as unavailable.
pub(super) const READ_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

impl Default for Locks {
    fn default() -> Locks {
        Locks {
            threads: std::array::from_fn(|_| Mutex::new(())),
            create: Mutex::new(()),
            pending: PendingLines::default(),
            readers: std::sync::Arc::new(tokio::sync::Semaphore::new(READERS)),
        }
    }
}

impl Locks {
    fn of(&self, stem: &str) -> &Mutex<()> {
        let h = stem
            .bytes()
            .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        &self.threads[(h % self.threads.len() as u64) as usize]
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

/// A file's committed entries, oldest first, and its last summary line.
fn parse(thread_id: &str, bytes: &[u8]) -> (Vec<Entry>, Option<Header>) {
    let mut entries = Vec::new();
    let mut header: Option<Header> = None;
    // A last line without its newline is of a write that did not finish.
    let whole = match bytes.iter().rposition(|b| *b == b'\n') {
        Some(end) => &bytes[..end],
        None => &[][..],
    };
    for line in whole.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let read = if is_summary(line) {
            serde_json::from_slice::<Header>(line).map(|h| header = Some(h))
        } else {
            serde_json::from_slice::<Entry>(line).map(|e| entries.push(e))
        };
        if let Err(e) = read {
            tracing::warn!(thread_id, error = %e, "skipped an unreadable transcript line");
        }
    }
    // A line read twice (waiting, and in the file by the time it was read): the later copy.
    let mut below = u64::MAX;
    entries.reverse();
    entries.retain(|e| {
        let new = e.seq < below;
        below = below.min(e.seq);
        new
    });
    entries.reverse();
    if let Some(Header {
        last: Some(last),
        from,
        ..
    }) = &header
    {
        let from = from.unwrap_or(1);
        entries.retain(|e| e.seq >= from && e.seq <= *last);
    }
    (entries, header)
}

/// The file and the lines waiting for it, read as one log.
fn read_file(
    root: &Path,
    locks: &Locks,
    thread_id: &str,
) -> Result<(Vec<Entry>, Option<Header>), StoreError> {
    let name = name(thread_id)?;
    // The waiting lines first: a checkpoint that writes them meanwhile leaves them in both.
    let waiting = locks.pending.bytes_of(&name);
    let mut bytes = match fs::read_private(&dir(root).join(&name), MAX_FILE_BYTES)? {
        Loaded::Missing => Vec::new(),
        Loaded::Refused(why) => return Err(StoreError::Invalid(format!("transcript: {why}"))),
        Loaded::Bytes(b) => b,
    };
    if let Some(waiting) = waiting {
        // After a line cut short (a write in progress), not glued to it.
        if bytes.last().is_some_and(|b| *b != b'\n') {
            bytes.push(b'\n');
        }
        bytes.extend_from_slice(&waiting);
    }
    Ok(parse(thread_id, &bytes))
}

/// The thread's entries, oldest first (none when it has no transcript).
pub(super) fn read_all(
    root: &Path,
    locks: &Locks,
    thread_id: &str,
) -> Result<Vec<Entry>, StoreError> {
    Ok(read_file(root, locks, thread_id)?.0)
}

pub(super) fn read_page(
    root: &Path,
    locks: &Locks,
    thread_id: &str,
    before: Option<u64>,
    limit: usize,
) -> Result<Page, StoreError> {
    Ok(transcript::page_of(
        read_all(root, locks, thread_id)?.into_iter(),
        before,
        limit,
    ))
}

/// A thread's transcript, open for appending (and reading its tail), and its size; `None` when
/// there is none and `create` is `None`. An existing file is opened without `O_CREAT`: an open
/// that may create takes the directory's lock exclusively (concurrent appends to different
/// threads spun on it); files are created one at a time, under `create`.
fn open_log(path: &Path, create: Option<&Mutex<()>>) -> Result<Option<(File, u64)>, StoreError> {
    let open = |create: bool| {
        OpenOptions::new()
            .read(true)
            .append(true)
            .create(create)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
    };
    let file = match (open(false), create) {
        (Err(e), None) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        (Err(e), Some(create)) if e.kind() == std::io::ErrorKind::NotFound => {
            let _one = create.lock().unwrap_or_else(|p| p.into_inner());
            open(true)
        }
        (other, _) => other,
    }
    .map_err(|e| match e.raw_os_error() {
        Some(libc::ELOOP) => StoreError::Invalid("transcript: a symlink".into()),
        _ => StoreError::from(e),
    })?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(StoreError::Invalid("transcript: not a regular file".into()));
    }
    if meta.permissions().mode() & 0o777 != 0o600 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(Some((file, meta.len())))
}

/// Lines a file keeping `kept` entries may hold before it is compacted.
fn cap(kept: u64) -> u64 {
    kept + kept / 2 + 64
}

pub(super) fn line_of<T: Serialize>(out: &mut Vec<u8>, v: &T) -> Result<(), StoreError> {
    serde_json::to_writer(&mut *out, v).map_err(|e| StoreError::Invalid(e.to_string()))?;
    out.push(b'\n');
    Ok(())
}

/// Where a write is made durable: by the journal's group commit, or here.
#[derive(Clone, Copy)]
pub(super) struct Durable<'a> {
    pub dir_sync: &'a DirSync,
    pub journal: Option<&'a Arc<Journal>>,
    /// A run's end: the thread's document, queued in the journal with the lines (one batch);
    /// the cell says whether it was (not when nothing was queued: no lines, the thread gone, a
    /// compaction, no journal in use).
    pub with_doc: Option<(&'a Arc<Vec<u8>>, &'a std::cell::Cell<bool>)>,
}

impl Durable<'_> {
    /// Queues a write's lines (and the document it carries) in the journal.
    fn submit(&self, thread_id: &str, lines: &[u8]) -> Written {
        let journal = self.journal?;
        match self.with_doc {
            None => journal.submit_transcript(thread_id, lines),
            Some((doc, queued)) => {
                let rx = journal.submit_ending(thread_id, lines, doc.clone())?;
                queued.set(true);
                Some(rx)
            }
        }
    }
}

/// A write done: durable already, or once the journal says so (`true`; on `false`, the journal
/// failed: [`sync`] the file).
pub(super) type Written = Option<oneshot::Receiver<bool>>;

/// Which entries a write keeps.
#[derive(Clone, Copy, Debug)]
enum Keep {
    /// The newest this many (the limit).
    Newest(usize),
    /// Those from this `seq` on (what an earlier write kept, replayed).
    From(u64),
    All,
}

/// What a write adds, given the newest committed `seq` and the summary the file ends with: the
/// entries after that `seq` and the summary to end with, or nothing (the thread is gone).
type Make<'a> =
    Box<dyn FnOnce(u64, Option<&ThreadSummary>) -> Option<(Vec<Entry>, ThreadSummary)> + 'a>;

/// The lines a write of `entries` after what `c` commits appends to a file of `size` bytes
/// (its first summary for a new file, the entries, the summary that commits them) and what the
/// file then commits; `None` when the file is due for a compaction instead.
fn plan(
    c: Committed,
    size: u64,
    entries: &[Entry],
    keep: Keep,
    summary: &ThreadSummary,
) -> Result<Option<(Vec<u8>, Committed)>, StoreError> {
    let last = entries.last().map_or(c.last, |e| e.seq);
    let from = match keep {
        Keep::Newest(l) => c.from.max((last + 1).saturating_sub(l as u64)),
        Keep::From(f) => c.from.max(f),
        Keep::All => c.from,
    };
    let mut bytes = Vec::new();
    let mut lines = c.lines + entries.len() as u64 + 1;
    if size == 0 {
        // A new file starts with a summary, so that a first write cut short is not read as
        // a file of the layout without one.
        lines += 1;
        let start = Committed {
            last: c.last,
            from: c.from,
            lines: 1,
        };
        summary_line(&mut bytes, summary.clone(), start)?;
    }
    for e in entries {
        line_of(&mut bytes, e)?;
    }
    let next = Committed { last, from, lines };
    summary_line(&mut bytes, summary.clone(), next)?;
    let kept = (last + 1).saturating_sub(from);
    Ok((lines <= cap(kept) && size + bytes.len() as u64 <= BUDGET_BYTES).then_some((bytes, next)))
}

/// One write of a thread's transcript, under its lock (`make` is called under it); `keep` says
/// which of the oldest go. Lines waiting for the checkpoint are written first, so that the file
/// is whole; with a journal the write's own lines then wait in their turn.
fn write(
    root: &Path,
    locks: &Locks,
    durable: Durable<'_>,
    thread_id: &str,
    keep: Keep,
    make: Make<'_>,
) -> Result<Written, StoreError> {
    let dir_sync = durable.dir_sync;
    let name = name(thread_id)?;
    let _one = locks.of(&name).lock().unwrap_or_else(|p| p.into_inner());
    let dir = dir(root);
    fs::ensure_dir(&dir)?;
    let path = dir.join(&name);
    write_waiting_locked(locks, &path, &name)?;
    // No file is made before `make` says what to write: a thread gone meanwhile leaves none.
    let existing = open_log(&path, None)?;
    let empty = Committed {
        last: 0,
        from: 1,
        lines: 0,
    };
    let start = match &existing {
        None | Some((_, 0)) => Some((empty, None)),
        Some((file, size)) => committed(file, *size).map(|(c, s)| (c, Some(s))),
    };
    if let Some((c, on_disk)) = start {
        let Some((entries, summary)) = make(c.last, on_disk.as_ref()) else {
            return Ok(None);
        };
        let size = existing.as_ref().map_or(0, |(_, size)| *size);
        let last = entries.last().map_or(c.last, |e| e.seq);
        let Some((bytes, next)) = plan(c, size, &entries, keep, &summary)? else {
            // Compacted with what was committed and what this write adds.
            drop(existing);
            let (mut all, _) = read_file(root, locks, thread_id)?;
            all.extend(entries);
            compact(&dir, &name, dir_sync, all, c.last.max(last), keep, summary)?;
            return Ok(None);
        };
        if durable.journal.is_some() {
            drop(existing);
            locks.pending.add(&name, size, &bytes, next, summary);
            // Queued while the thread's lock is held, so its records are in the order of its lines.
            if let Some(rx) = durable.submit(thread_id, &bytes) {
                if locks.pending.full() {
                    // Too much waits (failing checkpoints): appended now, synced by the next.
                    write_waiting_locked(locks, &path, &name)?;
                }
                return Ok(Some(rx));
            }
            // The journal is not in use (it failed): written and synced here.
            write_waiting_locked(locks, &path, &name)?;
            sync_file(&path, &dir, dir_sync, size == 0)?;
            return Ok(None);
        }
        let (mut file, _) = match existing {
            Some(opened) => opened,
            None => open_log(&path, Some(&locks.create))?
                .ok_or_else(|| StoreError::Invalid("transcript: not created".into()))?,
        };
        file.write_all(&bytes)?;
        file.sync_data()?;
        if size == 0 {
            dir_sync.sync(&dir)?;
        }
        return Ok(None);
    }
    drop(existing);
    let (mut all, header) = read_file(root, locks, thread_id)?;
    let committed_last = header.as_ref().and_then(|h| h.last).unwrap_or(0);
    let last = all.last().map_or(0, |e| e.seq).max(committed_last);
    let Some((entries, summary)) = make(last, header.as_ref().map(|h| &h.thread)) else {
        return Ok(None);
    };
    let last = entries.last().map_or(last, |e| e.seq);
    all.extend(entries);
    compact(&dir, &name, dir_sync, all, last, keep, summary)?;
    Ok(None)
}

/// A file's data synced, and its directory when the write made the file.
fn sync_file(path: &Path, dir: &Path, dir_sync: &DirSync, made: bool) -> Result<(), StoreError> {
    fs::open_private(path)?.sync_data()?;
    if made {
        dir_sync.sync(dir)?;
    }
    Ok(())
}

/// Makes a thread's transcript durable (after the journal failed to): its waiting lines
/// written, the file and its directory synced.
pub(super) fn sync(root: &Path, locks: &Locks, thread_id: &str) -> Result<(), StoreError> {
    let dir = dir(root);
    let name = name(thread_id)?;
    let _one = locks.of(&name).lock().unwrap_or_else(|p| p.into_inner());
    let path = dir.join(&name);
    write_waiting_locked(locks, &path, &name)?;
    match fs::open_private(&path) {
        Ok(f) => f.sync_data()?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    fs::sync_dir(&dir)?;
    Ok(())
}

/// Appends a run's messages, when `live` says (under the thread's lock) that the thread still
/// exists: a run that outlives its thread's deletion (guidance does not hold the thread) writes
/// nothing.
pub(super) fn append(
    root: &Path,
    locks: &Locks,
    durable: Durable<'_>,
    index: &Index,
    thread_id: &str,
    add: TranscriptAppend,
    live: &dyn Fn() -> bool,
) -> Result<Written, StoreError> {
    if add.messages.is_empty() {
        return Ok(None);
    }
    let title = listing::title_of(&add.messages);
    let limit = add.limit;
    let make: Make<'_> = Box::new(|last, on_disk| {
        if !live() {
            tracing::info!(thread_id, "a transcript not kept: its thread was deleted");
            return None;
        }
        let entries = transcript::number(last, &add.run_id, &add.at, add.messages);
        let summary = index.appended(thread_id, title, &add.at, on_disk);
        Some((entries, summary))
    });
    write(root, locks, durable, thread_id, Keep::Newest(limit), make)
}

/// Writes the thread's summary at the end of its transcript (a transcript made when there is
/// none), when `live` says the thread still exists.
pub(super) fn write_header(
    root: &Path,
    locks: &Locks,
    dir_sync: &DirSync,
    thread_id: &str,
    summary: &ThreadSummary,
    live: &dyn Fn() -> bool,
) -> Result<(), StoreError> {
    let durable = Durable {
        dir_sync,
        journal: None,
        with_doc: None,
    };
    let make: Make<'_> = Box::new(|_, _| live().then(|| (Vec::new(), summary.clone())));
    write(root, locks, durable, thread_id, Keep::All, make)?;
    Ok(())
}

/// Removes the thread's transcript, then the thread (`then`: whether it existed), durably, under
/// the thread's lock (an append comes before and is removed, or finds the thread gone). A failure
/// between leaves a thread without history, never a history that a new thread of the id continues.
pub(super) fn remove(
    root: &Path,
    locks: &Locks,
    thread_id: &str,
    then: impl FnOnce() -> Result<bool, StoreError>,
) -> Result<bool, StoreError> {
    let name = name(thread_id)?;
    let _one = locks.of(&name).lock().unwrap_or_else(|p| p.into_inner());
    match std::fs::remove_file(dir(root).join(&name)) {
        Ok(()) => fs::sync_dir(&dir(root))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e.into()),
    }
    // Lines waiting for the file go with it (their journal record is not replayed for a thread
    // that is gone).
    locks.pending.take(&name);
    then()
}

#[cfg(test)]
mod tests {
    use super::summary::last_summary;
    use super::*;
    use serde_json::json;

    /// A transcripts directory and what its writes share; writes are synced directly.
    #[derive(Default)]
    struct Files {
        dir: Option<tempfile::TempDir>,
        locks: Locks,
        sync: DirSync,
        index: Index,
    }

    impl Files {
        fn new() -> Files {
            Files {
                dir: Some(tempfile::tempdir().unwrap()),
                ..Files::default()
            }
        }

        /// Files holding thread `t`'s first run (two messages): its file, and what it holds.
        fn with_a_run() -> (Files, PathBuf, Vec<u8>) {
            let f = Files::new();
            f.append("t", add("r1", 2, 10));
            let path = file(f.root(), "t");
            let bytes = std::fs::read(&path).unwrap();
            (f, path, bytes)
        }

        fn root(&self) -> &Path {
            self.dir.as_ref().unwrap().path()
        }

        fn try_append(&self, id: &str, a: TranscriptAppend) -> Result<Written, StoreError> {
            let durable = Durable {
                dir_sync: &self.sync,
                journal: None,
                with_doc: None,
            };
            append(
                self.root(),
                &self.locks,
                durable,
                &self.index,
                id,
                a,
                &|| true,
            )
        }

        fn append(&self, id: &str, a: TranscriptAppend) {
            assert!(self.try_append(id, a).unwrap().is_none(), "synced directly");
        }

        fn write_header(&self, id: &str, s: &ThreadSummary) {
            write_header(self.root(), &self.locks, &self.sync, id, s, &|| true).unwrap();
        }
    }

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
        let f = Files::new();
        f.append("t-1", add("r1", 3, 4));
        f.append("t-1", add("r2", 2, 4));
        let all = read_all(f.root(), &f.locks, "t-1").unwrap();
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3, 4, 5]);
        assert_eq!(all[0].message["id"], "r1-1");
        assert_eq!(all[3].run_id, "r2");
        let page = read_page(f.root(), &f.locks, "t-1", Some(4), 10).unwrap();
        assert_eq!(
            page.entries.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [2, 3]
        );
        assert!(read_all(f.root(), &f.locks, "other").unwrap().is_empty());
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(super::dir(f.root()).join("t-1.jsonl"))
                .unwrap()
                .permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn concurrent_appends_to_one_thread_lose_nothing() {
        let f = Files::new();
        std::thread::scope(|scope| {
            for i in 0..8 {
                let f = &f;
                scope.spawn(move || f.append("t", add(&format!("r{i}"), 5, 1000)));
            }
        });
        let all = read_all(f.root(), &f.locks, "t").unwrap();
        assert_eq!(all.len(), 40);
        assert_eq!(
            all.iter().map(|e| e.seq).collect::<Vec<_>>(),
            (1..=40).collect::<Vec<_>>()
        );
    }

    fn summary(id: &str) -> ThreadSummary {
        ThreadSummary {
            owner: Some("alice".into()),
            ..ThreadSummary::new(id, "2026-12-02T00:00:00.000Z")
        }
    }

    fn list_query() -> super::super::listing::ListQuery {
        super::super::listing::ListQuery {
            user: None,
            archived: false,
            after: None,
            limit: 10,
        }
    }

    fn file(root: &Path, id: &str) -> PathBuf {
        super::dir(root).join(format!("{id}.jsonl"))
    }

    fn seqs(root: &Path, id: &str) -> Vec<u64> {
        read_all(root, &Locks::default(), id)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect()
    }

    fn lines_in(path: &Path) -> usize {
        std::fs::read(path)
            .unwrap()
            .iter()
            .filter(|b| **b == b'\n')
            .count()
    }

    fn committed_in(path: &Path) -> Option<Committed> {
        let f = File::open(path).unwrap();
        let size = f.metadata().unwrap().len();
        committed(&f, size).map(|(c, _)| c)
    }

    /// Appends add lines to the file (no file is made again) until it holds half as many lines
    /// again as it keeps; it is compacted then, and its size stays bounded however many runs.
    #[test]
    fn appends_grow_the_file_until_it_is_compacted() {
        let f = Files::new();
        let put = |run: usize| f.append("t", add(&format!("r{run}"), 2, 100));
        let path = file(f.root(), "t");
        put(0);
        let inode = || std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&path).unwrap());
        let first = inode();
        // The summary a new file starts with, two entries, their summary.
        assert_eq!(lines_in(&path), 4);
        for run in 1..50 {
            put(run);
        }
        // 100 entries and 51 summary lines: within the bound (100 + 50 + 64), still appended.
        assert_eq!(inode(), first);
        assert_eq!(lines_in(&path), 151);
        assert_eq!(seqs(f.root(), "t"), (1..=100).collect::<Vec<_>>());
        let mut most = 0;
        for run in 50..500 {
            put(run);
            most = most.max(lines_in(&path));
            assert!(lines_in(&path) <= 100 + 50 + 64, "after run {run}");
        }
        assert!(most > 151);
        // The newest 100 are what a reader gets, however many lines are left behind them.
        assert_eq!(seqs(f.root(), "t"), (901..=1000).collect::<Vec<_>>());
        let page = read_page(f.root(), &f.locks, "t", None, 10).unwrap();
        assert_eq!(page.entries.first().unwrap().seq, 991);
        assert!(page.more);
    }

    /// A write that stopped midway (its entries without the summary line that commits them, or
    /// a line cut short) is not read, and the next write goes on from what was committed.
    #[test]
    fn a_torn_write_is_not_read_and_the_next_write_mends_it() {
        let (f, path, committed) = Files::with_a_run();
        for torn in [
            "{\"seq\":3,\"runId\":\"r2\",\"at\":\"x\",\"message\":{}}\n",
            "{\"seq\":3,\"runId\":\"r2\",\"at\":\"x\",\"message\":{}}\n{\"thread\":{\"threadI",
            "{\"seq\":3,\"runId\":\"r2\",\"at\":\"x\",\"mess",
        ] {
            let mut bytes = committed.clone();
            bytes.extend_from_slice(torn.as_bytes());
            std::fs::write(&path, &bytes).unwrap();
            assert_eq!(seqs(f.root(), "t"), [1, 2], "{torn}");
            assert_eq!(last_summary(&path).unwrap().thread.thread_id, "t");
            assert_eq!(committed_in(&path), None);
        }
        f.append("t", add("r3", 1, 10));
        let all = read_all(f.root(), &f.locks, "t").unwrap();
        assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(all[2].run_id, "r3");
        // Mended: the file ends with a summary line again, and appends go on.
        assert_eq!(committed_in(&path).map(|c| c.last), Some(3));
    }

    /// A transcript of the version that wrote the summary as its first line is read as it is,
    /// listed, and rewritten in this format at its next write.
    #[test]
    fn a_transcript_with_its_summary_first_is_read_and_carried_on() {
        let f = Files::new();
        std::fs::create_dir_all(super::dir(f.root())).unwrap();
        let path = file(f.root(), "old");
        let mut s = summary("old");
        s.title = Some("Old title".into());
        let entry = |seq: u64| {
            format!("{{\"seq\":{seq},\"runId\":\"r\",\"at\":\"x\",\"message\":{{\"id\":\"m{seq}\"}}}}\n")
        };
        let text = format!(
            "{}\n{}{}",
            serde_json::to_string(&Header::of(s)).unwrap(),
            entry(7),
            entry(8)
        );
        std::fs::write(&path, text).unwrap();
        assert_eq!(seqs(f.root(), "old"), [7, 8]);
        assert_eq!(
            last_summary(&path).unwrap().thread.title.as_deref(),
            Some("Old title")
        );
        f.append("old", add("r9", 1, 10));
        assert_eq!(seqs(f.root(), "old"), [7, 8, 9]);
        assert_eq!(
            committed_in(&path),
            Some(Committed {
                last: 9,
                from: 7,
                lines: 4
            })
        );
    }

    /// A patch's summary ends the file and is what a restart lists; a patch of a thread with no
    /// transcript makes one; many patches compact the file too.
    #[test]
    fn a_summary_written_alone_ends_the_file() {
        let f = Files::new();
        let mut s = summary("t");
        s.archived = true;
        f.write_header("t", &s);
        let path = file(f.root(), "t");
        assert!(last_summary(&path).unwrap().thread.archived);
        assert!(read_all(f.root(), &f.locks, "t").unwrap().is_empty());
        f.append("t", add("r1", 2, 10));
        for i in 0..200 {
            s.title = Some(format!("title {i}"));
            f.write_header("t", &s);
        }
        assert_eq!(
            last_summary(&path).unwrap().thread.title.as_deref(),
            Some("title 199")
        );
        assert_eq!(seqs(f.root(), "t"), [1, 2]);
        assert!(lines_in(&path) <= 2 + 1 + 64, "{} lines", lines_in(&path));
    }

    #[test]
    fn a_symlinked_transcript_is_refused_not_followed() {
        let f = Files::new();
        std::fs::create_dir_all(super::dir(f.root())).unwrap();
        std::fs::write(f.root().join("secret"), b"{}\n").unwrap();
        std::os::unix::fs::symlink(
            f.root().join("secret"),
            super::dir(f.root()).join("t.jsonl"),
        )
        .unwrap();
        assert!(matches!(
            read_all(f.root(), &f.locks, "t"),
            Err(StoreError::Invalid(_))
        ));
        assert!(matches!(
            f.try_append("t", add("r", 1, 10)),
            Err(StoreError::Invalid(_))
        ));
        assert_eq!(std::fs::read(f.root().join("secret")).unwrap(), b"{}\n");
    }

    /// Long messages under a limit that keeps them all: the file stays within its byte budget,
    /// the oldest going first, and what is read is the newest run of entries without a gap.
    #[test]
    fn a_transcript_stays_within_its_byte_budget() {
        let f = Files::new();
        let path = file(f.root(), "t");
        let long = "x".repeat(2000);
        for run in 0..100 {
            let mut a = add(&format!("r{run}"), 1, 1000);
            a.messages[0]["content"] = json!(long);
            f.append("t", a);
            let size = std::fs::metadata(&path).unwrap().len();
            assert!(size <= BUDGET_BYTES, "{size} bytes after run {run}");
        }
        let seqs = seqs(f.root(), "t");
        let kept = seqs.len() as u64;
        assert!((20..=32).contains(&kept), "{kept} entries kept");
        assert_eq!(seqs, (101 - kept..=100).collect::<Vec<_>>());
        assert_eq!(
            committed_in(&path).map(|c| (c.last, c.from)),
            Some((100, 101 - kept))
        );
    }

    /// A thread deleted meanwhile (`live` false under the thread's lock) gets no transcript and no
    /// summary written: nothing that would list it again.
    #[test]
    fn a_deleted_thread_gets_nothing_written() {
        let f = Files::new();
        let durable = Durable {
            dir_sync: &f.sync,
            journal: None,
            with_doc: None,
        };
        let gone = || false;
        let a = add("late", 2, 10);
        let w = append(f.root(), &f.locks, durable, &f.index, "t", a, &gone).unwrap();
        assert!(w.is_none());
        write_header(f.root(), &f.locks, &f.sync, "t", &summary("t"), &gone).unwrap();
        assert!(!file(f.root(), "t").exists());
        assert!(f.index.list(f.root(), &list_query()).threads.is_empty());
        // Removed with its thread: what `first` says is what `remove` answers.
        f.append("u", add("r1", 1, 10));
        assert!(remove(f.root(), &f.locks, "u", || Ok(true)).unwrap());
        assert!(!file(f.root(), "u").exists());
        assert!(!remove(f.root(), &f.locks, "u", || Ok(false)).unwrap());
    }

    /// Just after a restart, before the summaries are read: a run's end keeps what the file's
    /// summary says of the thread (creation, title, archived), not a fresh summary.
    #[test]
    fn an_append_before_the_list_is_read_keeps_the_files_summary() {
        let f = Files::new();
        let mut s = summary("t");
        s.title = Some("First question".into());
        s.archived = true;
        s.created_at = "2025-01-01T00:00:00.000Z".into();
        f.write_header("t", &s);
        let restarted = Files {
            dir: f.dir,
            ..Files::default()
        };
        restarted.append("t", add("r1", 1, 10));
        let written = last_summary(&file(restarted.root(), "t")).unwrap().thread;
        assert_eq!(written.created_at, "2025-01-01T00:00:00.000Z");
        assert_eq!(written.title.as_deref(), Some("First question"));
        assert!(written.archived);
        assert_eq!(written.last_activity_at, "2026-12-02T00:00:00.000Z");
    }

    /// A reader while a checkpoint writes a file's waiting lines (the file holding none, part or
    /// all of them) reads every entry once: the lines wait until the file holds them.
    #[test]
    fn a_reader_during_a_checkpoints_write_reads_every_line_once() {
        let (f, path, before) = Files::with_a_run();
        let c = committed_in(&path).unwrap();
        let messages = vec![json!({"id": "a"}), json!({"id": "b"})];
        let entries = transcript::number(c.last, "r2", "x", messages);
        let size = before.len() as u64;
        let (bytes, next) = plan(c, size, &entries, Keep::Newest(10), &summary("t"))
            .unwrap()
            .unwrap();
        f.locks
            .pending
            .add("t.jsonl", size, &bytes, next, summary("t"));
        let read = || -> Vec<u64> {
            let all = read_all(f.root(), &f.locks, "t").unwrap();
            all.iter().map(|e| e.seq).collect()
        };
        for cut in [0, 1, bytes.len() / 2, bytes.len()] {
            let mut partial = before.clone();
            partial.extend_from_slice(&bytes[..cut]);
            std::fs::write(&path, &partial).unwrap();
            assert_eq!(read(), [1, 2, 3, 4], "the file holding {cut} bytes of them");
        }
    }
}
