//! The file store: `<root>/threads/<stem>.json` in the reference adapter's layout, 0700
//! directories (when the store creates them), 0600 files, atomic replacement, no-follow reads.
//!
//! Durability comes from the write-ahead journal ([`FileStore::open`], the gateway's store: group
//! commit, files written by checkpoints) or, without one ([`FileStore::new`]), from an fsync of
//! the file and of its directory on every save.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};

use super::fs::{self, DirSync};
use super::journal::Journal;
use super::{BoxFuture, Documents, History, StoreError, ThreadDoc};

/// Largest accepted state file: the bound of a document (a thread document is small; this only
/// guards against garbage).
const MAX_FILE: u64 = super::doc::MAX_DOC_BYTES as u64;

/// The file stem of a thread id: the id itself when it is a safe, lower-case, portable file name
/// of at most 200 characters, else `aguiid~<hex of the id>`, or `aguihash~<sha256>` when that
/// would be longer than 200 characters.
pub fn file_stem(thread_id: &str) -> Option<String> {
    if thread_id.is_empty() {
        return None;
    }
    let verbatim_ok = thread_id.len() <= 200
        && thread_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && thread_id == thread_id.to_ascii_lowercase()
        && thread_id != "."
        && thread_id != ".."
        && !thread_id.ends_with('.')
        && {
            let stripped = thread_id.trim_end_matches('.');
            let stem = stripped
                .split('.')
                .next()
                .unwrap_or("")
                .to_ascii_uppercase();
            !is_reserved_windows_name(&stem)
        };
    if verbatim_ok {
        return Some(thread_id.to_owned());
    }
    let hexed = format!("aguiid~{}", hex::encode(thread_id.as_bytes()));
    if hexed.len() <= 200 {
        return Some(hexed);
    }
    Some(format!(
        "aguihash~{}",
        hex::encode(Sha256::digest(thread_id.as_bytes()))
    ))
}

fn file_name(thread_id: &str) -> std::io::Result<String> {
    file_stem(thread_id)
        .map(|s| format!("{s}.json"))
        .ok_or_else(|| std::io::Error::other("empty thread id"))
}

fn blocking_failed(e: tokio::task::JoinError) -> StoreError {
    StoreError::Io(std::io::Error::other(e.to_string()))
}

/// Thread documents under `<root>/threads/`.
#[derive(Clone)]
pub struct FileStore {
    root: PathBuf,
    dir_sync: Arc<DirSync>,
    journal: Option<Arc<Journal>>,
    transcript_locks: Arc<super::transcript_file::Locks>,
    index: Arc<super::file_index::Index>,
    /// The directory's lock while the store is open (`dir_lock`; none for `new`).
    _lock: Option<Arc<super::dir_lock::DirLock>>,
    /// The seal of documents' owners (`owner_seal`; none for `new`: nothing sealed or checked).
    seal: Option<Arc<super::owner_seal::Seal>>,
    /// The threads refused for a forged owner, logged once each.
    forged: Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl std::fmt::Debug for FileStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileStore")
            .field("root", &self.root)
            .field("journal", &self.journal.is_some())
            .finish()
    }
}

impl FileStore {
    /// A store whose every save fsyncs its file and directory (no journal).
    pub fn new(root: impl Into<PathBuf>) -> FileStore {
        FileStore {
            root: root.into(),
            dir_sync: Arc::default(),
            journal: None,
            transcript_locks: Arc::default(),
            index: Arc::default(),
            _lock: None,
            seal: None,
            forged: Arc::default(),
        }
    }

    /// The gateway's store: locks the directory (one process; `dir_lock`), removes temporary files
    /// of interrupted writes, replays the journal a previous process left (each thread's newest
    /// record, written durably to its file), journals every save from now on, and seals the
    /// documents' owners (`owner_seal`). Nothing but the directory, its lock file and the
    /// owners' key is made until the first save.
    pub fn open(root: impl Into<PathBuf>) -> Result<FileStore, StoreError> {
        Self::open_with(root, true)
    }

    /// [`FileStore::open`]; without `background`, files are written only by flushes.
    pub(super) fn open_with(
        root: impl Into<PathBuf>,
        background: bool,
    ) -> Result<FileStore, StoreError> {
        let mut store = FileStore::new(root);
        store._lock = Some(super::dir_lock::take(&store.root)?);
        let swept = store.sweep_temp_files();
        if swept > 0 {
            tracing::info!(
                files = swept,
                "removed temporary state files of interrupted writes"
            );
        }
        let (replayer, dir) = (store.clone(), store.threads_dir());
        let transcripts = store.clone();
        // The transcripts' state only: the journal must not hold its store (a cycle).
        let (root, locks) = (store.root.clone(), store.transcript_locks.clone());
        let (j, replayed) = Journal::open(
            &store.root,
            move |id, bytes| replayer.replace_durably(id, bytes),
            move |id, lines| {
                // A record of a run that ended as its thread was deleted brings nothing back.
                if !transcripts.has_doc(id) {
                    return Ok(());
                }
                super::transcript_file::replay(
                    &transcripts.root,
                    &transcripts.transcript_locks,
                    &transcripts.dir_sync,
                    id,
                    lines,
                )
            },
            Box::new(move |id, bytes| fs::overwrite(&dir, &file_name(id)?, bytes)),
            Box::new(move || super::transcript_file::write_waiting(&root, &locks)),
            background,
        )?;
        if replayed > 0 {
            tracing::info!(threads = replayed, "replayed the state journal");
        }
        if background {
            // The list's first read of every transcript's summary, before anyone lists.
            let (index, dir) = (
                store.index.clone(),
                super::transcript_file::dir(&store.root),
            );
            let spawned = std::thread::Builder::new()
                .name("thread-list-read".into())
                .spawn(move || index.scan_once(&dir));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "the thread list is read at the first list instead");
            }
        }
        store.journal = Some(j);
        // After the replay: the files are the documents to seal.
        let (seal, making) = super::owner_seal::open(&store.root, &store.dir_sync)?;
        if making {
            let sealed = store.seal_all(&seal);
            super::owner_seal::adopted(&store.root)?;
            tracing::info!(
                threads = sealed,
                "sealed the owners of the thread documents"
            );
        }
        store.seal = Some(Arc::new(seal));
        Ok(store)
    }

    /// Seals every document that names someone and has no seal (the key is new: blocking).
    /// A file that is not a valid document of the thread it names is left as it is.
    fn seal_all(&self, seal: &super::owner_seal::Seal) -> usize {
        let mut sealed = 0;
        for (id, bytes) in self.thread_files() {
            let Ok((doc, None)) = ThreadDoc::from_json_sealed(&bytes, &id) else {
                continue;
            };
            let Some(mac) = seal.mac(&doc) else {
                continue;
            };
            let written = doc
                .to_stored_sealed(Some(&mac))
                .and_then(|b| self.replace_durably(&id, &b));
            match written {
                Ok(()) => sealed += 1,
                Err(e) => {
                    tracing::warn!(thread_id = %id, error = %e, "a document's owner could not be sealed: it will be refused")
                }
            }
        }
        sealed
    }

    /// The bytes a document is stored as: with its seal, when the store seals.
    fn stored(&self, doc: &ThreadDoc) -> Result<Vec<u8>, StoreError> {
        let mac = self.seal.as_ref().and_then(|s| s.mac(doc));
        doc.to_stored_sealed(mac.as_deref())
    }

    /// A document read from the journal or its file, refused when it names someone without a
    /// valid seal (its owner was changed outside the gateway), logged once per thread.
    fn checked(&self, bytes: &[u8], thread_id: &str) -> Result<ThreadDoc, StoreError> {
        let (doc, mac) = ThreadDoc::from_json_sealed(bytes, thread_id)?;
        match &self.seal {
            Some(seal) if !seal.admits(&doc, mac.as_deref()) => {
                let first = self
                    .forged
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(thread_id.to_owned());
                if first {
                    tracing::warn!(
                        thread_id,
                        "a thread document's owner was changed outside the gateway (its seal does not match): refused"
                    );
                }
                Err(StoreError::Invalid(
                    "the document's owner was changed outside the gateway".into(),
                ))
            }
            _ => Ok(doc),
        }
    }

    /// Journal syncs so far (group commit makes this smaller than the number of saves).
    pub fn journal_syncs(&self) -> u64 {
        self.journal.as_ref().map_or(0, |j| j.batches())
    }

    pub fn threads_dir(&self) -> PathBuf {
        self.root.join("threads")
    }

    /// The path of a thread's file.
    pub fn path_of(&self, thread_id: &str) -> Option<PathBuf> {
        file_stem(thread_id).map(|s| self.threads_dir().join(format!("{s}.json")))
    }

    /// Whether the thread exists: a document in the journal or in its file.
    fn has_doc(&self, thread_id: &str) -> bool {
        self.journal
            .as_ref()
            .is_some_and(|j| j.newest(thread_id).is_some())
            || self.path_of(thread_id).is_some_and(|p| p.exists())
    }

    /// Writes a thread's file durably (temporary file, fsync, rename, directory fsync).
    fn replace_durably(&self, thread_id: &str, bytes: &[u8]) -> Result<(), StoreError> {
        fs::replace(
            &self.threads_dir(),
            &file_name(thread_id)?,
            bytes,
            Some(&self.dir_sync),
        )?;
        Ok(())
    }

    /// Removes the temporary files of writes a crash interrupted (`.<stem>.json.<id>.tmp`;
    /// never a thread file, never a symlink's target). Called once at start-up, before any write.
    pub fn sweep_temp_files(&self) -> usize {
        let Ok(entries) = std::fs::read_dir(self.threads_dir()) else {
            return 0;
        };
        let mut removed = 0;
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let is_tmp = name.starts_with('.') && name.ends_with(".tmp") && name.contains(".json.");
            if is_tmp
                && e.file_type().is_ok_and(|t| t.is_file())
                && std::fs::remove_file(e.path()).is_ok()
            {
                removed += 1;
            }
        }
        removed
    }

    /// Loads a thread (blocking): the journal's newest document, else its file.
    pub fn load_blocking(&self, thread_id: &str) -> Result<Option<ThreadDoc>, StoreError> {
        if let Some(bytes) = self.journal.as_ref().and_then(|j| j.newest(thread_id)) {
            return self.checked(&bytes, thread_id).map(Some);
        }
        let path = self
            .path_of(thread_id)
            .ok_or_else(|| StoreError::Invalid("empty thread id".into()))?;
        match fs::read_private(&path, MAX_FILE)? {
            fs::Loaded::Missing => Ok(None),
            fs::Loaded::Refused(why) => Err(StoreError::Invalid(why.into())),
            fs::Loaded::Bytes(b) => self.checked(&b, thread_id).map(Some),
        }
    }

    /// Saves a thread durably (blocking).
    pub fn save_blocking(&self, doc: &ThreadDoc) -> Result<(), StoreError> {
        let bytes = Arc::new(self.stored(doc)?);
        if let Some(j) = &self.journal {
            if let Some(rx) = j.submit(&doc.thread_id, bytes.clone()) {
                if rx.blocking_recv() == Ok(true) {
                    return Ok(());
                }
            }
            j.settle()?;
        }
        self.replace_durably(&doc.thread_id, &bytes)
    }

    /// The threads whose files hold pending interrupts, and how many (blocking). A file that is
    /// not a valid document of the thread it names is skipped, as a load would refuse it.
    pub fn pending_interrupts_blocking(&self) -> Vec<(String, usize)> {
        let mut out = Vec::new();
        for (id, bytes) in self.thread_files() {
            if let Ok(doc) = self.checked(&bytes, &id) {
                if !doc.execution.pending.is_empty() {
                    out.push((id, doc.execution.pending.len()));
                }
            }
        }
        out
    }

    /// Each thread file's thread id and bytes, read one at a time (blocking): a file whose
    /// `threadId` does not name it is skipped, as a load would refuse it.
    fn thread_files(&self) -> impl Iterator<Item = (String, Vec<u8>)> {
        let entries = std::fs::read_dir(self.threads_dir()).into_iter().flatten();
        entries.flatten().filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !name.ends_with(".json") {
                return None;
            }
            let Ok(fs::Loaded::Bytes(bytes)) = fs::read_private(&e.path(), MAX_FILE) else {
                return None;
            };
            let id = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("threadId")?.as_str().map(str::to_owned));
            let id = id.filter(|id| file_name(id).is_ok_and(|n| n == name))?;
            Some((id, bytes))
        })
    }

    /// [`History::update_thread`] (blocking): a thread listed nowhere yet (it has not been
    /// saved or ended a run since this version runs) gets its summary from its document first.
    fn update_blocking(
        &self,
        thread_id: &str,
        patch: &super::listing::ThreadPatch,
    ) -> Result<Option<super::listing::ThreadSummary>, StoreError> {
        let transcripts = super::transcript_file::dir(&self.root);
        if !self.index.knows(&transcripts, thread_id) {
            let Some(doc) = self.load_blocking(thread_id)? else {
                return Ok(None);
            };
            self.index.saved(&doc, &clock::rfc3339_ms(now_ms()));
        }
        let Some(summary) = self.index.patched(thread_id, patch) else {
            return Ok(None);
        };
        super::transcript_file::write_header(
            &self.root,
            &self.transcript_locks,
            &self.dir_sync,
            thread_id,
            &summary,
            &|| self.has_doc(thread_id),
        )?;
        Ok(Some(summary))
    }

    /// [`History::delete_thread`] (blocking). The journal is written out before, so that no
    /// record of the thread's document is left to bring it back at the next start, and after, so
    /// that neither is the record of a run that ended meanwhile (a guidance run, which does not
    /// hold the thread); a run that ends later finds the thread gone and keeps no transcript.
    fn delete_blocking(&self, thread_id: &str) -> Result<bool, StoreError> {
        self.flush_blocking()?;
        let Some(path) = self.path_of(thread_id) else {
            return Ok(false);
        };
        let existed =
            super::transcript_file::remove(&self.root, &self.transcript_locks, thread_id, || {
                // The tombstone first: the id's next thread gets a kernel context of its own.
                if std::fs::symlink_metadata(&path).is_ok() {
                    super::file_tombstone::bump(&self.root, thread_id, &self.dir_sync)?;
                }
                let existed = match std::fs::remove_file(&path) {
                    Ok(()) => true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
                    Err(e) => return Err(e.into()),
                };
                if existed {
                    fs::sync_dir(&self.threads_dir())?;
                }
                Ok(existed)
            })?;
        self.index.removed(thread_id);
        self.flush_blocking()?;
        Ok(existed)
    }

    /// A document's stored bytes saved: queued in the journal and durable with its group
    /// commit, or (no journal, or it failed) written durably to its file.
    fn save_bytes(
        &self,
        thread_id: String,
        bytes: Arc<Vec<u8>>,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        // Journaled: wait for the group commit on a channel, holding no thread meanwhile.
        let committed = self
            .journal
            .as_ref()
            .and_then(|j| j.submit(&thread_id, bytes.clone()));
        let store = self.clone();
        Box::pin(async move {
            if let Some(rx) = committed {
                if rx.await == Ok(true) {
                    return Ok(());
                }
            }
            // No journal, or it failed (then it is retired first): a direct durable write.
            tokio::task::spawn_blocking(move || {
                if let Some(j) = &store.journal {
                    j.settle()?;
                }
                store.replace_durably(&thread_id, &bytes)
            })
            .await
            .map_err(blocking_failed)?
        })
    }

    /// A run's messages appended to the thread's transcript (when `doc`, the thread's document
    /// queued in the journal with them); whether that document is durable with them.
    async fn append_carrying(
        self,
        id: String,
        add: super::TranscriptAppend,
        doc: Option<Arc<Vec<u8>>>,
    ) -> (Result<(), StoreError>, bool) {
        let store = self;
        // Lines already waiting for the thread's file: added in memory, here.
        let in_memory = {
            let queued = std::cell::Cell::new(false);
            let durable = super::transcript_file::Durable {
                dir_sync: &store.dir_sync,
                journal: store.journal.as_ref(),
                with_doc: doc.as_ref().map(|d| (d, &queued)),
            };
            let journal = store.journal.as_ref();
            let live = || journal.is_some_and(|j| j.newest(&id).is_some());
            let r = super::transcript_file::append_waiting(
                &store.transcript_locks,
                durable,
                &store.index,
                &id,
                add,
                &live,
            );
            r.map(|r| r.map(|w| (w, queued.get())))
        };
        let in_memory = match in_memory {
            Ok(r) => r,
            Err(e) => return (Err(e), false),
        };
        let (written, queued) = match in_memory {
            Ok(done) => done,
            Err(add) => {
                let (s, id) = (store.clone(), id.clone());
                let slow = tokio::task::spawn_blocking(move || {
                    let queued = std::cell::Cell::new(false);
                    let durable = super::transcript_file::Durable {
                        dir_sync: &s.dir_sync,
                        journal: s.journal.as_ref(),
                        with_doc: doc.as_ref().map(|d| (d, &queued)),
                    };
                    let (root, locks, index) = (&s.root, &s.transcript_locks, &s.index);
                    let live = || s.has_doc(&id);
                    super::transcript_file::append(root, locks, durable, index, &id, add, &live)
                        .map(|w| (w, queued.get()))
                })
                .await
                .map_err(blocking_failed);
                match slow {
                    Ok(Ok(done)) => done,
                    Ok(Err(e)) | Err(e) => return (Err(e), false),
                }
            }
        };
        // Journaled: wait for the group commit on a channel, holding no thread meanwhile.
        let Some(rx) = written else {
            return (Ok(()), false);
        };
        if rx.await == Ok(true) {
            return (Ok(()), queued);
        }
        // The journal failed (it is retired first): the file synced directly.
        let synced = tokio::task::spawn_blocking(move || {
            if let Some(j) = &store.journal {
                j.settle()?;
            }
            super::transcript_file::sync(&store.root, &store.transcript_locks, &id)
        })
        .await
        .map_err(blocking_failed);
        (synced.and_then(|r| r), false)
    }

    /// Makes every completed save durable in its thread file (blocking).
    pub fn flush_blocking(&self) -> Result<(), StoreError> {
        if let Some(j) = &self.journal {
            j.checkpoint()?;
        }
        Ok(())
    }
}

/// Whether this process may make files in `dir` (blocking).
fn writable_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())?;
    #[allow(unsafe_code)]
    // SAFETY: access(2) reads a NUL-terminated path that lives across the call.
    let r = unsafe { libc::access(path.as_ptr(), libc::W_OK | libc::X_OK) };
    match r {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

impl Documents for FileStore {
    fn load(&self, thread_id: &str) -> BoxFuture<'static, Result<Option<ThreadDoc>, StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || store.load_blocking(&id))
                .await
                .map_err(blocking_failed)?
        })
    }

    fn save(&self, doc: &ThreadDoc) -> BoxFuture<'static, Result<(), StoreError>> {
        let bytes = match self.stored(doc) {
            Ok(b) => Arc::new(b),
            Err(e) => return Box::pin(std::future::ready(Err(e))),
        };
        self.index.saved(doc, &clock::rfc3339_ms(now_ms()));
        self.save_bytes(doc.thread_id.clone(), bytes)
    }

    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        let store = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || store.flush_blocking())
                .await
                .map_err(blocking_failed)?
        })
    }

    fn reachable(&self) -> BoxFuture<'static, Result<(), String>> {
        let root = self.root.clone();
        Box::pin(async move {
            // access(2) answers EROFS for a file system remounted read-only, which a stat would
            // not tell; a disk that hangs is as good as gone.
            let asked = tokio::task::spawn_blocking(move || writable_dir(&root));
            match tokio::time::timeout(std::time::Duration::from_secs(2), asked).await {
                Ok(Ok(r)) => r.map_err(|e| format!("the state directory cannot be written: {e}")),
                Ok(Err(_)) | Err(_) => Err("the state directory did not answer".to_owned()),
            }
        })
    }

    fn pending_interrupts(&self) -> BoxFuture<'static, Vec<(String, usize)>> {
        let store = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || store.pending_interrupts_blocking())
                .await
                .unwrap_or_default()
        })
    }
}

impl History for FileStore {
    fn append_transcript(
        &self,
        thread_id: &str,
        add: super::TranscriptAppend,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(async move { store.append_carrying(id, add, None).await.0 })
    }
    fn save_ending(
        &self,
        doc: &ThreadDoc,
        transcript: Option<super::TranscriptAppend>,
    ) -> BoxFuture<'static, (Result<(), StoreError>, Result<(), StoreError>)> {
        let Some(add) = transcript else {
            let saved = Documents::save(self, doc);
            return Box::pin(async move { (saved.await, Ok(())) });
        };
        if self.journal.is_none() {
            // Each written and synced on its own.
            let appended = self.append_transcript(&doc.thread_id, add);
            let saved = Documents::save(self, doc);
            return Box::pin(async move { (saved.await, appended.await) });
        }
        let bytes = match self.stored(doc) {
            Ok(b) => Arc::new(b),
            Err(e) => return Box::pin(std::future::ready((Err(e), Ok(())))),
        };
        let (store, id, doc) = (self.clone(), doc.thread_id.clone(), doc.clone());
        Box::pin(async move {
            let (appended, durable) = store
                .clone()
                .append_carrying(id.clone(), add, Some(bytes.clone()))
                .await;
            // After the append's (its time is the run's end, this one's later).
            store.index.saved(&doc, &clock::rfc3339_ms(now_ms()));
            // Not queued with the lines (none were), or the journal failed: saved on its own.
            let saved = match durable {
                true => Ok(()),
                false => store.save_bytes(id, bytes).await,
            };
            (saved, appended)
        })
    }
    fn read_transcript(
        &self,
        thread_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> BoxFuture<'static, Result<crate::transcript::Page, StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(async move {
            use super::transcript_file::{READERS, READ_WAIT};
            let readers = store.transcript_locks.readers.clone();
            let turn = tokio::time::timeout(READ_WAIT, readers.acquire_owned())
                .await
                .ok()
                .and_then(Result::ok)
                .ok_or_else(|| {
                    StoreError::Unavailable(format!("{READERS} transcripts being read"))
                })?;
            tokio::task::spawn_blocking(move || {
                let _turn = turn;
                let (root, locks) = (&store.root, &store.transcript_locks);
                super::transcript_file::read_page(root, locks, &id, before, limit)
            })
            .await
            .map_err(blocking_failed)?
        })
    }
    fn list_threads(
        &self,
        query: super::listing::ListQuery,
    ) -> BoxFuture<'static, Result<super::listing::ListPage, StoreError>> {
        let store = self.clone();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let dir = super::transcript_file::dir(&store.root);
                Ok(store.index.list(&dir, &query))
            })
            .await
            .map_err(blocking_failed)?
        })
    }
    fn update_thread(
        &self,
        thread_id: &str,
        patch: super::listing::ThreadPatch,
    ) -> BoxFuture<'static, Result<Option<super::listing::ThreadSummary>, StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || store.update_blocking(&id, &patch))
                .await
                .map_err(blocking_failed)?
        })
    }
    fn delete_thread(&self, thread_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        let (store, id) = (self.clone(), thread_id.to_owned());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || store.delete_blocking(&id))
                .await
                .map_err(blocking_failed)?
        })
    }
    fn incarnation(&self, thread_id: &str) -> BoxFuture<'static, Result<u64, StoreError>> {
        let (root, id) = (self.root.clone(), thread_id.to_owned());
        Box::pin(async move {
            tokio::task::spawn_blocking(move || super::file_tombstone::read(&root, &id))
                .await
                .map_err(blocking_failed)?
        })
    }
}

/// Milliseconds since the epoch, for the list's activity times.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// A name Windows reserves whatever its extension (CON, PRN, AUX, NUL, COM1–9, LPT1–9; `upper`:
/// the stem, upper-cased): a thread file never takes one, nor does a file a user sends.
pub fn is_reserved_windows_name(upper: &str) -> bool {
    if matches!(upper, "CON" | "PRN" | "AUX" | "NUL") {
        return true;
    }
    let b = upper.as_bytes();
    b.len() == 4
        && (upper.starts_with("COM") || upper.starts_with("LPT"))
        && (b'1'..=b'9').contains(&b[3])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Execution, ThreadDoc};
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    #[test]
    fn stems() {
        for (id, stem) in [
            ("thread-1", "thread-1"),
            ("a.b", "a.b"),
            (".hidden", ".hidden"),
            ("com0", "com0"),
            ("Thread-1", "aguiid~5468726561642d31"),
            ("con", "aguiid~636f6e"),
            ("a.", "aguiid~612e"),
            ("中文", "aguiid~e4b8ade69687"),
        ] {
            assert_eq!(file_stem(id).unwrap(), stem, "{id}");
        }
        assert_eq!(
            file_stem(&"A".repeat(96)).unwrap(),
            format!("aguiid~{}", "41".repeat(96))
        );
        assert!(file_stem(&"A".repeat(97)).unwrap().starts_with("aguihash~"));
        // Long verbatim ids use the hex/hash form too.
        assert!(file_stem(&"a".repeat(201))
            .unwrap()
            .starts_with("aguihash~"));
        assert_eq!(file_stem(&"a".repeat(200)).unwrap(), "a".repeat(200));
        assert!(file_stem("").is_none());
    }

    /// A small document of `thread` with an optional task id.
    pub(super) fn doc_with(thread: &str, task: Option<&str>) -> ThreadDoc {
        let mut execution = Execution::new("e", "r");
        execution.task_id = task.map(str::to_owned);
        ThreadDoc::new(thread, "agui-x", "/w", None, execution)
    }

    fn doc(thread: &str) -> ThreadDoc {
        doc_with(thread, None)
    }

    fn owned(thread: &str, owner: &str) -> ThreadDoc {
        let mut d = doc(thread);
        d.owner = Some(owner.to_owned());
        d
    }

    /// A document whose owner was changed on disk is refused, and so is one written without a
    /// seal once the directory has its key; the documents of a directory that had no key are
    /// sealed as it is made, and a document naming nobody needs no seal.
    #[test]
    fn a_document_whose_owner_changed_on_disk_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        // Written before seals (a store without a key): sealed at the key's making.
        let legacy = owned("old", "alice");
        FileStore::new(&root).save_blocking(&legacy).unwrap();
        FileStore::new(&root)
            .save_blocking(&doc("nobodys"))
            .unwrap();
        let s = FileStore::open_with(&root, false).unwrap();
        assert!(root.join("owner.key").exists() && !root.join("owner.key.pending").exists());
        assert_eq!(s.load_blocking("old").unwrap().unwrap(), legacy);
        let mine = owned("t", "alice");
        s.save_blocking(&mine).unwrap();
        s.flush_blocking().unwrap();
        assert_eq!(s.load_blocking("t").unwrap().unwrap(), mine);
        drop(s);
        let path = root.join("threads/t.json");
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("\"ownerMac\""), "{text}");
        fs::write(&path, text.replace("\"alice\"", "\"mallory\"")).unwrap();
        // Unsealed after the key exists: the owner is not the gateway's record.
        FileStore::new(&root)
            .save_blocking(&owned("late", "mallory"))
            .unwrap();
        let s = FileStore::open_with(&root, false).unwrap();
        for forged in ["t", "late"] {
            assert!(
                matches!(s.load_blocking(forged), Err(StoreError::Invalid(_))),
                "{forged}"
            );
        }
        assert_eq!(s.load_blocking("old").unwrap().unwrap(), legacy);
        assert_eq!(s.load_blocking("nobodys").unwrap().unwrap(), doc("nobodys"));
    }

    /// Concurrent direct saves all land (that they share directory syncs is shown in
    /// `fs::tests::concurrent_requests_share_one_sync`).
    #[test]
    fn concurrent_direct_saves_all_land() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::new(dir.path());
        s.save_blocking(&doc("warm")).unwrap();
        let n = 64;
        let barrier = std::sync::Barrier::new(n);
        std::thread::scope(|scope| {
            for i in 0..n {
                let (s, barrier) = (&s, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    s.save_blocking(&doc(&format!("t{i}"))).unwrap();
                });
            }
        });
        for i in 0..n {
            assert!(s.load_blocking(&format!("t{i}")).unwrap().is_some());
        }
        let (syncs, requests) = s.dir_sync.counts();
        eprintln!("{requests} durable writes, {syncs} directory syncs");
        assert_eq!(requests, n as u64 + 1);
    }

    #[test]
    fn sweep_removes_only_interrupted_temp_files() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::new(dir.path());
        assert_eq!(s.sweep_temp_files(), 0, "no threads dir yet");
        s.save_blocking(&doc("t1")).unwrap();
        let t = s.threads_dir();
        fs::write(t.join(".t1.json.0123abcd.tmp"), b"{partial").unwrap();
        fs::write(t.join(".t2.json.ffff.tmp"), b"").unwrap();
        fs::write(t.join("notes.tmp"), b"x").unwrap();
        std::os::unix::fs::symlink(t.join("t1.json"), t.join(".t3.json.link.tmp")).unwrap();
        assert_eq!(s.sweep_temp_files(), 2);
        let mut left: Vec<String> = fs::read_dir(&t)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".t3.json.link.tmp", "notes.tmp", "t1.json"]);
        assert!(s.load_blocking("t1").unwrap().is_some());
    }

    #[test]
    fn save_load_modes_and_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        let s = FileStore::new(&root);
        assert!(s.load_blocking("t1").unwrap().is_none());
        s.save_blocking(&doc("t1")).unwrap();
        assert_eq!(s.load_blocking("t1").unwrap().unwrap(), doc("t1"));
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&root), 0o700);
        assert_eq!(mode(&root.join("threads")), 0o700);
        assert_eq!(mode(&root.join("threads/t1.json")), 0o600);
        // No temp files left.
        assert_eq!(fs::read_dir(root.join("threads")).unwrap().count(), 1);
        // Symlinked file refused.
        let other = dir.path().join("copy.json");
        fs::copy(root.join("threads/t1.json"), &other).unwrap();
        fs::remove_file(root.join("threads/t1.json")).unwrap();
        std::os::unix::fs::symlink(&other, root.join("threads/t1.json")).unwrap();
        assert!(matches!(s.load_blocking("t1"), Err(StoreError::Invalid(_))));
        // Foreign thread's document refused.
        fs::remove_file(root.join("threads/t1.json")).unwrap();
        let mut foreign = doc("t2").to_json();
        fs::write(root.join("threads/t1.json"), &mut foreign).unwrap();
        assert!(matches!(s.load_blocking("t1"), Err(StoreError::Invalid(_))));
        // A directory in place of the file.
        fs::create_dir(root.join("threads/t3.json")).unwrap();
        assert!(s.load_blocking("t3").is_err());
        // A pre-existing root keeps its mode.
        let pre = dir.path().join("pre");
        fs::create_dir(&pre).unwrap();
        fs::set_permissions(&pre, fs::Permissions::from_mode(0o755)).unwrap();
        FileStore::new(&pre).save_blocking(&doc("t1")).unwrap();
        assert_eq!(mode(&pre), 0o755);
    }
}

#[cfg(test)]
mod journal_tests {
    use super::*;
    use crate::ThreadDoc;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    fn doc(thread: &str, task: Option<&str>) -> ThreadDoc {
        super::tests::doc_with(thread, task)
    }

    fn burst(s: &FileStore, threads: usize, per: usize) -> std::time::Duration {
        let t = std::time::Instant::now();
        std::thread::scope(|scope| {
            for i in 0..threads {
                scope.spawn(move || {
                    for k in 0..per {
                        s.save_blocking(&doc(&format!("t{i}-{k}"), Some("task")))
                            .unwrap();
                    }
                });
            }
        });
        t.elapsed()
    }

    #[test]
    fn journaled_saves_share_syncs_and_land() {
        let dir = tempfile::tempdir().unwrap();
        let s = FileStore::open(dir.path()).unwrap();
        let took = burst(&s, 64, 20);
        let syncs = s.journal_syncs();
        eprintln!("1280 journaled saves in {took:?}, {syncs} journal syncs");
        assert!((1..1280).contains(&syncs), "{syncs}");
        for i in 0..64 {
            for k in 0..20 {
                assert!(s.load_blocking(&format!("t{i}-{k}")).unwrap().is_some());
            }
        }
        let d = FileStore::new(dir.path().join("direct"));
        eprintln!("1280 direct saves in {:?}", burst(&d, 64, 20));
    }

    fn journal_logs(root: &Path) -> Vec<String> {
        match fs::read_dir(root.join("journal")) {
            Ok(e) => e
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".log"))
                .collect(),
            Err(_) => vec![],
        }
    }

    #[test]
    fn saves_are_read_back_at_once_and_flush_leaves_only_thread_files() {
        let (dir, root, s) = journaled();
        let made: Vec<_> = std::fs::read_dir(&root).unwrap().flatten().collect();
        assert_eq!(
            made.len(),
            2,
            "opening makes the lock file and the owners' key only"
        );
        assert!(root.join(".lock").is_file() && root.join("owner.key").is_file());
        s.save_blocking(&doc("t", Some("task-1"))).unwrap();
        assert_eq!(
            s.load_blocking("t").unwrap().unwrap(),
            doc("t", Some("task-1"))
        );
        assert_eq!(journal_logs(&root).len(), 1);
        assert!(
            !root.join("threads/t.json").exists(),
            "not written before a checkpoint"
        );
        s.flush_blocking().unwrap();
        assert!(journal_logs(&root).is_empty());
        assert_eq!(
            fs::read(root.join("threads/t.json")).unwrap(),
            doc("t", Some("task-1")).to_json()
        );
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&root.join("journal")), 0o700);
        assert_eq!(mode(&root.join("threads/t.json")), 0o600);
        // A later save is served at once, and a copy of the directory taken now (a crash before
        // the checkpoint) comes back with it.
        s.save_blocking(&doc("t", Some("task-2"))).unwrap();
        s.save_blocking(&doc("u", None)).unwrap();
        assert_eq!(
            s.load_blocking("t").unwrap().unwrap(),
            doc("t", Some("task-2"))
        );
        let copy = dir.path().join("copy");
        copy_state(&root, &copy);
        assert_eq!(
            fs::read(copy.join("threads/t.json")).unwrap(),
            doc("t", Some("task-1")).to_json(),
            "the file lags; the journal has the newer document"
        );
        assert!(!copy.join("threads/u.json").exists());
        let c = FileStore::open(&copy).unwrap();
        assert!(journal_logs(&copy).is_empty(), "replayed and deleted");
        assert_eq!(
            fs::read(copy.join("threads/t.json")).unwrap(),
            doc("t", Some("task-2")).to_json()
        );
        assert_eq!(c.load_blocking("u").unwrap().unwrap(), doc("u", None));
    }

    /// A copy of a state directory as a crash would leave it.
    fn copy_state(root: &Path, copy: &Path) {
        fs::create_dir(copy).unwrap();
        for sub in ["threads", "journal"] {
            fs::create_dir(copy.join(sub)).unwrap();
            let Ok(entries) = fs::read_dir(root.join(sub)) else {
                continue;
            };
            for e in entries {
                let e = e.unwrap();
                fs::copy(e.path(), copy.join(sub).join(e.file_name())).unwrap();
            }
        }
    }

    #[test]
    fn checkpoints_write_in_place_and_a_cut_file_is_replayed() {
        use std::os::unix::fs::MetadataExt;
        let (dir, root, s) = journaled();
        let file = root.join("threads/t.json");
        s.save_blocking(&doc("t", Some("a-much-longer-task-id")))
            .unwrap();
        s.flush_blocking().unwrap();
        let inode = fs::metadata(&file).unwrap().ino();
        // A shorter document: the same file, cut to its length; its mode put back to 0600.
        fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).unwrap();
        s.save_blocking(&doc("t", Some("b"))).unwrap();
        s.flush_blocking().unwrap();
        assert_eq!(fs::metadata(&file).unwrap().ino(), inode);
        assert_eq!(fs::read(&file).unwrap(), doc("t", Some("b")).to_json());
        assert_eq!(
            fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600
        );
        // A crash in the middle of a checkpoint's write leaves the file cut short while the
        // journal still holds the document: start-up writes it whole again.
        s.save_blocking(&doc("t", Some("c"))).unwrap();
        let copy = dir.path().join("copy");
        copy_state(&root, &copy);
        let cut = doc("t", Some("c")).to_json();
        fs::write(copy.join("threads/t.json"), &cut[..cut.len() / 2]).unwrap();
        let c = FileStore::open(&copy).unwrap();
        assert_eq!(fs::read(copy.join("threads/t.json")).unwrap(), cut);
        assert_eq!(c.load_blocking("t").unwrap().unwrap(), doc("t", Some("c")));
        // A symlink where a thread file belongs is replaced by the file, never written through.
        let outside = dir.path().join("outside.json");
        fs::write(&outside, b"keep").unwrap();
        std::os::unix::fs::symlink(&outside, root.join("threads/v.json")).unwrap();
        s.save_blocking(&doc("v", None)).unwrap();
        s.flush_blocking().unwrap();
        assert_eq!(fs::read(&outside).unwrap(), b"keep");
        let v = root.join("threads/v.json");
        assert!(fs::symlink_metadata(&v).unwrap().is_file());
        assert_eq!(fs::read(&v).unwrap(), doc("v", None).to_json());
    }

    /// Checkpoints rewrite many existing threads in place (each file keeps its inode and ends up
    /// with exactly its newest document). Prints the time of each checkpoint; for a figure:
    /// `CHECKPOINT_THREADS=3000 cargo test --release -p iac-code-agui --lib checkpoint_rewrites
    /// -- --nocapture`.
    #[test]
    fn checkpoint_rewrites_of_many_threads_stay_in_place() {
        use std::os::unix::fs::MetadataExt;
        let n: usize = std::env::var("CHECKPOINT_THREADS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300);
        let (_dir, root, s) = journaled();
        let path = |i: usize| root.join(format!("threads/t{i}.json"));
        for i in 0..n {
            s.save_blocking(&doc(&format!("t{i}"), Some("a-longer-first-task-id")))
                .unwrap();
        }
        s.flush_blocking().unwrap();
        let inodes: Vec<u64> = (0..n)
            .map(|i| fs::metadata(path(i)).unwrap().ino())
            .collect();
        for round in 0..3 {
            for i in 0..n {
                s.save_blocking(&doc(&format!("t{i}"), Some(&format!("r{round}"))))
                    .unwrap();
            }
            let t = std::time::Instant::now();
            s.flush_blocking().unwrap();
            eprintln!("checkpoint rewriting {n} threads: {:?}", t.elapsed());
        }
        for (i, inode) in inodes.iter().enumerate() {
            assert_eq!(fs::metadata(path(i)).unwrap().ino(), *inode);
            assert_eq!(
                fs::read(path(i)).unwrap(),
                doc(&format!("t{i}"), Some("r2")).to_json()
            );
        }
    }

    #[test]
    fn replay_takes_each_threads_newest_whole_record() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        FileStore::new(&root)
            .save_blocking(&doc("a", None))
            .unwrap();
        fs::create_dir(root.join("journal")).unwrap();
        let mut log = vec![];
        for d in [doc("a", Some("1")), doc("b", None), doc("a", Some("2"))] {
            log.extend(crate::journal::encode(&d.thread_id, &d.to_json()));
        }
        // A transcript record that cannot be applied (no summary): logged, the start goes on.
        log.extend(crate::journal::encode_kind(
            crate::journal::Kind::Transcript,
            "a",
            b"{\"seq\":1}\n",
        ));
        let torn = crate::journal::encode("a", &doc("a", Some("3")).to_json());
        log.extend(&torn[..torn.len() / 2]);
        fs::write(root.join("journal/00000000000000000007.log"), &log).unwrap();
        // An older generation, replayed first.
        let old = crate::journal::encode("b", &doc("b", Some("old")).to_json());
        fs::write(root.join("journal/00000000000000000006.log"), old).unwrap();
        let s = FileStore::open(&root).unwrap();
        assert!(journal_logs(&root).is_empty());
        assert_eq!(s.load_blocking("a").unwrap().unwrap(), doc("a", Some("2")));
        assert_eq!(s.load_blocking("b").unwrap().unwrap(), doc("b", None));
        // A record whose document is not the thread's refuses to start (nothing applied blindly).
        let bad = dir.path().join("bad");
        fs::create_dir_all(bad.join("journal")).unwrap();
        fs::write(
            bad.join("journal/00000000000000000001.log"),
            crate::journal::encode("x", &doc("y", None).to_json()),
        )
        .unwrap();
        assert!(matches!(FileStore::open(&bad), Err(StoreError::Invalid(_))));
    }

    #[test]
    fn a_failing_journal_is_retired_and_saves_stay_durable() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        fs::create_dir(&root).unwrap();
        // The journal cannot be created: a file stands where its directory goes.
        fs::write(root.join("journal"), b"in the way").unwrap();
        let s = FileStore::open(&root).unwrap();
        s.save_blocking(&doc("t", Some("1"))).unwrap();
        s.save_blocking(&doc("t", Some("2"))).unwrap();
        assert_eq!(s.load_blocking("t").unwrap().unwrap(), doc("t", Some("2")));
        assert_eq!(
            fs::read(root.join("threads/t.json")).unwrap(),
            doc("t", Some("2")).to_json(),
            "direct saves write the file itself"
        );
        assert!(s.journal_syncs() >= 1, "the journal was tried");
        assert_eq!(fs::read(root.join("journal")).unwrap(), b"in the way");
        // A transcript append too: written and synced directly.
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(s.append_transcript("t", turn("r1", 2)))
            .unwrap();
        assert_eq!(seqs_of(&s, "t").len(), 2);
        assert!(root.join("transcripts/t.jsonl").exists(), "written at once");
    }

    /// A journaled store in a new state directory, `root` (there while the directory is).
    fn journaled() -> (tempfile::TempDir, std::path::PathBuf, FileStore) {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("state");
        let s = FileStore::open_with(&root, false).unwrap();
        (dir, root, s)
    }

    /// [`journaled`], with the thread `t` and its first run's two messages.
    async fn with_a_run() -> (tempfile::TempDir, std::path::PathBuf, FileStore) {
        let (dir, root, s) = journaled();
        s.save(&doc("t", None)).await.unwrap();
        s.append_transcript("t", turn("r1", 2)).await.unwrap();
        (dir, root, s)
    }

    fn turn(run: &str, n: usize) -> crate::TranscriptAppend {
        crate::TranscriptAppend {
            run_id: run.into(),
            at: "2026-12-03T00:00:00.000Z".into(),
            messages: (0..n)
                .map(|i| serde_json::json!({"id": format!("{run}-{i}"), "role": "user", "content": "x"}))
                .collect(),
            limit: 1000,
        }
    }

    fn seqs_of(s: &FileStore, thread: &str) -> Vec<u64> {
        crate::transcript_file::read_all(&s.root, &s.transcript_locks, thread)
            .unwrap()
            .iter()
            .map(|e| e.seq)
            .collect()
    }

    /// Transcript appends ride the journal's group commit (far fewer syncs than appends) and
    /// wait in memory for the checkpoint, read meanwhile with their files; a crash that loses
    /// them, or the file's newest lines, gets them back from the journal at start-up, once; a
    /// checkpoint writes and syncs the files and leaves no journal.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn transcript_appends_share_the_journals_syncs_and_are_replayed() {
        let (dir, root, s) = journaled();
        // Transcripts are kept for threads that exist.
        let saves: Vec<_> = (0..256)
            .map(|i| s.save(&doc(&format!("t{i}"), None)))
            .collect();
        for r in futures_util::future::join_all(saves).await {
            r.unwrap();
        }
        let before = s.journal_syncs();
        // t0's lines first: within the bound of waiting lines whatever the order of the others
        // (past the bound an append writes its file at once).
        s.append_transcript("t0", turn("r1", 2)).await.unwrap();
        let appends: Vec<_> = (1..256)
            .map(|i| s.append_transcript(&format!("t{i}"), turn("r1", 2)))
            .collect();
        for r in futures_util::future::join_all(appends).await {
            r.unwrap();
        }
        let syncs = s.journal_syncs() - before;
        assert!((1..256).contains(&syncs), "{syncs} syncs for 256 appends");
        s.append_transcript("t0", turn("r2", 1)).await.unwrap();
        assert_eq!(seqs_of(&s, "t0"), [1, 2, 3]);
        let page = s.read_transcript("t0", None, 10).await.unwrap();
        assert_eq!(page.entries.len(), 3, "read with the lines waiting");
        assert!(
            !root.join("transcripts/t0.jsonl").exists(),
            "no file written by a run's end"
        );
        // A process killed now (the lines in the journal only): the start-up writes them.
        let lost = dir.path().join("lost");
        copy_state(&root, &lost);
        let l = FileStore::open_with(&lost, false).unwrap();
        assert!(journal_logs(&lost).is_empty(), "replayed and deleted");
        assert_eq!(seqs_of(&l, "t0"), [1, 2, 3]);
        assert_eq!(seqs_of(&l, "t7"), [1, 2]);
        // Replayed once: a later append numbers on.
        l.append_transcript("t0", turn("r3", 1)).await.unwrap();
        assert_eq!(seqs_of(&l, "t0"), [1, 2, 3, 4]);
        // A checkpoint that wrote the files and stopped before it deleted the journal: the
        // replay of each record changes nothing, and cuts none of the older entries.
        let (written, all) = crate::transcript_file::write_waiting(&root, &s.transcript_locks);
        all.unwrap();
        assert_eq!(written.len(), 256);
        assert_eq!(seqs_of(&s, "t0"), [1, 2, 3], "read from the file alone");
        let whole = dir.path().join("whole");
        copy_state(&root, &whole);
        fs::create_dir(whole.join("transcripts")).unwrap();
        for t in ["t0", "t7"] {
            let name = format!("transcripts/{t}.jsonl");
            fs::copy(root.join(&name), whole.join(&name)).unwrap();
        }
        let before = fs::read(whole.join("transcripts/t0.jsonl")).unwrap();
        let w = FileStore::open_with(&whole, false).unwrap();
        assert_eq!(seqs_of(&w, "t0"), [1, 2, 3]);
        assert_eq!(
            fs::read(whole.join("transcripts/t0.jsonl")).unwrap(),
            before
        );
        // A crash that lost the file's newest lines (and another thread's whole file).
        let copy = dir.path().join("copy");
        copy_state(&root, &copy);
        fs::create_dir(copy.join("transcripts")).unwrap();
        let first_run = {
            let bytes = fs::read(root.join("transcripts/t0.jsonl")).unwrap();
            let cut = bytes
                .iter()
                .enumerate()
                .filter(|(_, b)| **b == b'\n')
                // The file's first summary, the first run's two entries and their summary.
                .nth(3)
                .unwrap()
                .0;
            bytes[..=cut].to_vec()
        };
        fs::write(copy.join("transcripts/t0.jsonl"), first_run).unwrap();
        let c = FileStore::open_with(&copy, false).unwrap();
        assert_eq!(seqs_of(&c, "t0"), [1, 2, 3]);
        assert_eq!(seqs_of(&c, "t7"), [1, 2]);
        // The original: a checkpoint leaves the transcripts and no journal.
        s.flush_blocking().unwrap();
        assert!(journal_logs(&root).is_empty());
        assert_eq!(seqs_of(&s, "t255"), [1, 2]);
        assert!(root.join("transcripts/t255.jsonl").exists());
    }

    /// A rename while a thread's lines wait: they reach the file first and the new title ends
    /// it; the runs' lines that wait after a checkpoint go on numbering from the file.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_rename_writes_the_waiting_lines_first() {
        let (_dir, root, s) = with_a_run().await;
        s.append_transcript("t", turn("r2", 1)).await.unwrap();
        let file = root.join("transcripts/t.jsonl");
        assert!(!file.exists());
        let patch = crate::listing::ThreadPatch {
            title: Some("Renamed".into()),
            archived: None,
        };
        s.update_thread("t", patch).await.unwrap().unwrap();
        let on_disk = |s: &FileStore| {
            crate::transcript_file::read_all(
                &s.root,
                &crate::transcript_file::Locks::default(),
                "t",
            )
            .unwrap()
            .len()
        };
        assert_eq!(on_disk(&s), 3, "the waiting lines are in the file");
        let summary = crate::transcript_file::summary::last_summary(&file).unwrap();
        assert_eq!(summary.thread.title.as_deref(), Some("Renamed"));
        s.flush_blocking().unwrap();
        // As a run's release saves its thread before the next run ends.
        s.save(&doc("t", None)).await.unwrap();
        s.append_transcript("t", turn("r3", 1)).await.unwrap();
        s.append_transcript("t", turn("r4", 1)).await.unwrap();
        assert_eq!(seqs_of(&s, "t"), [1, 2, 3, 4, 5]);
        assert_eq!(on_disk(&s), 3, "the new lines wait");
        s.flush_blocking().unwrap();
        assert_eq!(on_disk(&s), 5);
        let summary = crate::transcript_file::summary::last_summary(&file).unwrap();
        assert_eq!(summary.thread.title.as_deref(), Some("Renamed"));
    }

    /// Past the bound of what waits in memory (small in tests), a run's lines are appended to
    /// their file at once: nothing is lost, and the checkpoint syncs them all the same.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn past_the_bound_lines_are_written_at_once() {
        let (_dir, root, s) = journaled();
        for i in 0..32 {
            let t = format!("t{i}");
            s.save(&doc(&t, None)).await.unwrap();
            s.append_transcript(&t, turn("r1", 2)).await.unwrap();
            s.append_transcript(&t, turn("r2", 2)).await.unwrap();
        }
        let files = (0..32)
            .filter(|i| root.join(format!("transcripts/t{i}.jsonl")).exists())
            .count();
        assert!(
            (1..32).contains(&files),
            "{files} files written before a checkpoint"
        );
        for i in 0..32 {
            assert_eq!(seqs_of(&s, &format!("t{i}")), [1, 2, 3, 4]);
        }
        s.flush_blocking().unwrap();
        assert!(journal_logs(&root).is_empty());
        for i in 0..32 {
            assert_eq!(seqs_of(&s, &format!("t{i}")), [1, 2, 3, 4]);
        }
    }

    /// A run's end writes the thread's document and the run's messages in one sync (the slow
    /// path, which reads the file, and the one in memory alike); a crash after it brings both
    /// back; an end without messages is a plain save.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_runs_end_writes_its_document_and_messages_in_one_sync() {
        let (dir, root, s) = journaled();
        s.save(&doc("t", None)).await.unwrap();
        for (task, run, seqs) in [("2", "r1", vec![1, 2]), ("3", "r2", vec![1, 2, 3, 4])] {
            let before = s.journal_syncs();
            let (saved, appended) = s
                .save_ending(&doc("t", Some(task)), Some(turn(run, 2)))
                .await;
            saved.unwrap();
            appended.unwrap();
            assert_eq!(s.journal_syncs() - before, 1, "one sync for both");
            assert_eq!(seqs_of(&s, "t"), seqs);
            assert_eq!(s.load_blocking("t").unwrap().unwrap(), doc("t", Some(task)));
        }
        let copy = dir.path().join("copy");
        copy_state(&root, &copy);
        let c = FileStore::open_with(&copy, false).unwrap();
        assert_eq!(seqs_of(&c, "t"), [1, 2, 3, 4]);
        assert_eq!(c.load_blocking("t").unwrap().unwrap(), doc("t", Some("3")));
        let (saved, appended) = s.save_ending(&doc("t", Some("4")), None).await;
        saved.unwrap();
        appended.unwrap();
        assert_eq!(s.load_blocking("t").unwrap().unwrap(), doc("t", Some("4")));
        assert_eq!(seqs_of(&s, "t"), [1, 2, 3, 4]);
    }

    /// A run that ends after its thread's `DELETE` (guidance does not hold the thread) keeps no
    /// transcript and does not list the thread again; a crash after a delete removed the thread
    /// but before its journal was written out does not bring the transcript back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_deleted_thread_stays_deleted() {
        let (dir, root, s) = with_a_run().await;
        assert_eq!(s.incarnation("t").await.unwrap(), 0);
        assert!(s.delete_thread("t").await.unwrap());
        // Its tombstone: the id's next thread is its second incarnation; deleting no thread
        // counts nothing.
        assert_eq!(s.incarnation("t").await.unwrap(), 1);
        assert!(!s.delete_thread("t").await.unwrap());
        assert_eq!(s.incarnation("t").await.unwrap(), 1);
        assert!(
            journal_logs(&root).is_empty(),
            "written out after the delete"
        );
        s.append_transcript("t", turn("late", 1)).await.unwrap();
        assert!(!root.join("transcripts/t.jsonl").exists());
        let q = crate::listing::ListQuery {
            user: None,
            archived: false,
            after: None,
            limit: 10,
        };
        assert!(s.list_threads(q).await.unwrap().threads.is_empty());
        // A run's record journaled, then a crash between the removal of the thread's files and
        // the delete's last checkpoint: the replay skips the record of a thread that is gone…
        s.save(&doc("u", None)).await.unwrap();
        s.flush_blocking().unwrap();
        s.append_transcript("u", turn("r1", 2)).await.unwrap();
        let copy = |name: &str, keep_thread: bool| {
            let c = dir.path().join(name);
            copy_state(&root, &c);
            if !keep_thread {
                fs::remove_file(c.join("threads/u.json")).unwrap();
            }
            let c_store = FileStore::open_with(&c, false).unwrap();
            (c.join("transcripts/u.jsonl").exists(), c_store)
        };
        let (brought_back, gone) = copy("gone", false);
        assert!(!brought_back);
        assert!(gone.load_blocking("u").unwrap().is_none());
        // …and replays it for a thread that is there.
        let (replayed, kept) = copy("kept", true);
        assert!(replayed);
        assert_eq!(seqs_of(&kept, "u"), [1, 2]);
    }

    /// A delete removes the history before the thread: one that fails in between leaves the
    /// thread (whole, deletable again), never a history without its thread, which a thread made
    /// again with the id would continue.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delete_that_fails_leaves_the_thread_not_an_orphan_history() {
        let (_dir, root, s) = with_a_run().await;
        s.flush_blocking().unwrap();
        // The transcript cannot be removed (a directory where the file was; even for root).
        let file = root.join("transcripts/t.jsonl");
        fs::remove_file(&file).unwrap();
        fs::create_dir_all(file.join("inside")).unwrap();
        assert!(s.delete_thread("t").await.is_err());
        assert!(s.load_blocking("t").unwrap().is_some(), "the thread stays");
        // Mended, the delete goes through and takes both.
        fs::remove_dir_all(&file).unwrap();
        assert!(s.delete_thread("t").await.unwrap());
        assert!(s.load_blocking("t").unwrap().is_none());
        assert!(!file.exists());
    }

    /// At most a few transcripts are read at once (each read parses its whole file); a reader
    /// past them waits its turn, and fails as unavailable after a bounded wait.
    #[tokio::test]
    async fn transcript_reads_at_once_are_bounded() {
        use crate::transcript_file::{READERS, READ_WAIT};
        let (_dir, _, s) = with_a_run().await;
        let readers = s.transcript_locks.readers.clone();
        let held: Vec<_> = (0..READERS)
            .map(|_| readers.clone().try_acquire_owned().unwrap())
            .collect();
        tokio::time::pause();
        let started = tokio::time::Instant::now();
        let r = s.read_transcript("t", None, 10).await;
        assert!(matches!(r, Err(StoreError::Unavailable(_))), "{r:?}");
        assert!(started.elapsed() >= READ_WAIT);
        tokio::time::resume();
        // A reader waits its turn and takes it when one is given back; each read gives its own
        // back.
        let waiting = tokio::spawn(s.read_transcript("t", None, 10));
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished(), "no turn free");
        let mut held = held;
        held.pop();
        let page = tokio::time::timeout(std::time::Duration::from_secs(10), waiting)
            .await
            .expect("woken when a turn is given back")
            .unwrap()
            .unwrap();
        assert_eq!(page.entries.len(), 2);
        assert_eq!(readers.available_permits(), 1, "its turn given back");
        drop(held);
        assert_eq!(readers.available_permits(), READERS);
    }
}
