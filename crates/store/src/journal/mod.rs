//! Write-ahead journal in front of the thread files: group commit of durable writes.
//!
//! A save queues the whole new document for `<root>/journal/<generation>.log` and completes once
//! an `fdatasync` of the journal that started after it was queued has completed: one writer thread
//! writes and syncs everything queued at once (group commit), so concurrent saves share a sync and
//! an async caller waits on a channel instead of holding a blocking thread. The document is then
//! served from memory until a checkpoint writes it to its thread file: creating and renaming files
//! in one directory serialises on the directory's lock, so doing it per save (three per run) was
//! what bounded the admission rate, not the syncs.
//!
//! A background checkpoint (every 2 s, or after 8 MiB) moves to a new generation, writes each
//! thread's newest document to its file (in place: an existing file is overwritten and cut to
//! length, a new one created), makes the files durable (fsync of each, or one `syncfs` for many)
//! and only then deletes the older generations, so a file that a crash cut short mid-checkpoint
//! still has its document in the journal. Start-up replays what is left — the newest record of
//! each thread, written durably to its file (temporary file + rename) — and
//! deletes the journal; a clean stop checkpoints everything. So after a stop or a restart the state
//! directory holds only thread files in the reference layout.
//!
//! A transcript append rides the same group commit: its lines are queued here and wait in memory
//! for their file (`transcript_file::waiting`); the append is durable once the batch is. The
//! checkpoint appends the waiting lines to their files (`WriteTranscripts`) and makes those
//! durable with the thread files before it deletes a generation, and start-up appends again
//! what a transcript lacks of its records.
//!
//! The file format (records, generations) is in `record`.
//!
//! If the journal itself fails (write or sync error), it is retired: the documents held in memory
//! are written to their files, made durable, and the journal files deleted; from then on every
//! save — the failed batch's included — is a direct durable write (fsync of file and directory).
//! Until the retirement succeeds, saves fail (fail closed).

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

mod checkpoint;
mod record;

use super::fs::{ensure_dir, sync_dir};
use super::{StoreError, ThreadDoc};
pub(super) use record::{encode, encode_kind, Kind};
use record::{generations, read_left};

/// A generation is checkpointed once it holds this much…
const ROTATE_BYTES: u64 = 8 * 1024 * 1024;
/// …or once its first record is this old.
const ROTATE_AGE: Duration = Duration::from_millis(2000);
/// How often the checkpoint thread looks.
const TICK: Duration = Duration::from_millis(200);

#[derive(Debug, PartialEq)]
enum Mode {
    Journal,
    /// A journal write failed: saves fail until the journal is retired.
    Broken(String),
    /// Retired after a failure: direct durable writes.
    Direct,
}

/// Writes a thread's document to its file (no fsync) and returns the file's path.
pub(super) type WriteFile = Box<dyn Fn(&str, &[u8]) -> std::io::Result<PathBuf> + Send + Sync>;

/// Appends the transcript lines waiting for their files (no fsync); returns the files written
/// (also when another failed) and whether all were.
pub(super) type WriteTranscripts =
    Box<dyn Fn() -> (HashSet<PathBuf>, std::io::Result<()>) + Send + Sync>;

/// A document durable in the journal, not yet known durable in its thread file.
#[derive(Debug, Clone)]
struct Held {
    /// Sequence number of the save (a newer save of the thread replaces it).
    seq: u64,
    doc: Arc<Vec<u8>>,
}

/// What a queued record is of.
enum Payload {
    Doc(Arc<Vec<u8>>),
    /// Lines of a transcript (they wait for their file in the transcripts' memory).
    Transcript,
    /// Lines of a transcript, then the thread's document (a run's end: one batch for both).
    Ending(Arc<Vec<u8>>),
}

/// A save waiting for the next group commit.
struct Queued {
    seq: u64,
    thread_id: String,
    payload: Payload,
    /// Told `true` once the record is durable, `false` when the journal failed.
    done: oneshot::Sender<bool>,
}

/// Saves waiting for the next group commit: their records, concatenated, and themselves.
#[derive(Default)]
struct Queue {
    records: Vec<u8>,
    saves: Vec<Queued>,
    /// Sequence number of the last save queued.
    last_seq: u64,
}

/// The generation being appended to.
#[derive(Default)]
struct Generation {
    number: u64,
    /// Opened on its first batch.
    file: Option<Arc<File>>,
    bytes: u64,
    /// When its first record was queued (checkpoint age).
    since: Option<Instant>,
    /// A checkpoint asked the writer to move to a new generation before its next batch.
    rotate_requested: bool,
}

impl Generation {
    fn is_empty(&self) -> bool {
        self.bytes == 0 && self.file.is_none()
    }

    /// Moves to the next generation (no batch in flight).
    fn rotate(&mut self) {
        self.rotate_requested = false;
        if self.is_empty() {
            return;
        }
        *self = Generation {
            number: self.number + 1,
            ..Generation::default()
        };
    }
}

/// What the background work is doing; each excludes some of the others.
#[derive(Default)]
struct Busy {
    /// The writer thread is writing and syncing a batch.
    writing: bool,
    checkpointing: bool,
    retiring: bool,
}

/// Which background threads run (started on the first save).
#[derive(Default)]
struct Workers {
    writer: bool,
    checkpointer: bool,
}

struct State {
    mode: Mode,
    busy: Busy,
    generation: Generation,
    queue: Queue,
    /// The newest held document of each thread.
    held: HashMap<String, Held>,
    /// Transcript lines were journaled since the last checkpoint that wrote them all: they may
    /// wait for their files.
    transcripts: bool,
    workers: Workers,
    /// Batches written so far.
    batches: u64,
}

pub(super) struct Journal {
    dir: PathBuf,
    threads: PathBuf,
    transcripts: PathBuf,
    write_file: WriteFile,
    write_transcripts: WriteTranscripts,
    st: Mutex<State>,
    cv: Condvar,
}

impl Journal {
    /// Replays what a previous process left (newest record per thread, written with `durable`;
    /// then each transcript record, in order, with `transcript`), deletes the journal files and
    /// returns the journal and the number of threads replayed.
    pub(super) fn open(
        root: &Path,
        durable: impl Fn(&str, &[u8]) -> Result<(), StoreError>,
        transcript: impl Fn(&str, &[u8]) -> Result<(), StoreError>,
        write_file: WriteFile,
        write_transcripts: WriteTranscripts,
        background: bool,
    ) -> Result<(Arc<Journal>, usize), StoreError> {
        let dir = root.join("journal");
        let gens = generations(&dir)?;
        let (newest, appends) = read_left(&gens)?;
        for (id, doc) in &newest {
            ThreadDoc::from_json(doc, id).map_err(|e| {
                StoreError::Invalid(format!("journal record of thread {id:?}: {e}"))
            })?;
            durable(id, doc)?;
        }
        // After the documents, so that `transcript` sees which threads exist; in order.
        for r in appends {
            // History, not state: a transcript that cannot be mended does not stop the start.
            if let Err(e) = transcript(&r.thread_id, &r.bytes) {
                tracing::warn!(thread_id = %r.thread_id, error = %e,
                    "a transcript could not be completed from the journal");
            }
        }
        for (_, path) in &gens {
            fs::remove_file(path)?;
        }
        if !gens.is_empty() {
            sync_dir(&dir)?;
        }
        let j = Arc::new(Journal {
            dir,
            threads: root.join("threads"),
            transcripts: root.join("transcripts"),
            write_file,
            write_transcripts,
            st: Mutex::new(State {
                mode: Mode::Journal,
                busy: Busy::default(),
                generation: Generation {
                    number: gens.last().map_or(1, |(g, _)| g + 1),
                    ..Generation::default()
                },
                queue: Queue::default(),
                held: HashMap::new(),
                transcripts: false,
                workers: Workers {
                    writer: false,
                    // Without the background thread, only `checkpoint` calls write files (tests).
                    checkpointer: !background,
                },
                batches: 0,
            }),
            cv: Condvar::new(),
        });
        Ok((j, newest.len()))
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.cv.wait(g).unwrap_or_else(|e| e.into_inner())
    }

    /// Journal syncs run so far.
    pub(super) fn batches(&self) -> u64 {
        self.lock().batches
    }

    /// The newest document of a thread when it is not in its file yet.
    pub(super) fn newest(&self, thread_id: &str) -> Option<Arc<Vec<u8>>> {
        self.lock().held.get(thread_id).map(|h| h.doc.clone())
    }

    /// Queues a thread's document for the next group commit. The receiver says `true` once the
    /// record is durable, `false` when the journal failed (then save through [`Journal::settle`]
    /// and a direct durable write). `None`: the journal is not in use (failed or retired).
    pub(super) fn submit(
        self: &Arc<Self>,
        thread_id: &str,
        doc: Arc<Vec<u8>>,
    ) -> Option<oneshot::Receiver<bool>> {
        let record = encode(thread_id, &doc);
        self.queue(thread_id, record, Payload::Doc(doc))
    }

    /// Queues lines of a thread's transcript for the next group commit; as [`Journal::submit`]
    /// (on `false` or `None`, write and sync the file directly).
    pub(super) fn submit_transcript(
        self: &Arc<Self>,
        thread_id: &str,
        lines: &[u8],
    ) -> Option<oneshot::Receiver<bool>> {
        let record = encode_kind(Kind::Transcript, thread_id, lines);
        self.queue(thread_id, record, Payload::Transcript)
    }

    /// Queues lines of a thread's transcript and then its document, in one batch: both are
    /// durable, or neither, when the receiver says; as [`Journal::submit`].
    pub(super) fn submit_ending(
        self: &Arc<Self>,
        thread_id: &str,
        lines: &[u8],
        doc: Arc<Vec<u8>>,
    ) -> Option<oneshot::Receiver<bool>> {
        let mut record = encode_kind(Kind::Transcript, thread_id, lines);
        record.extend_from_slice(&encode(thread_id, &doc));
        self.queue(thread_id, record, Payload::Ending(doc))
    }

    fn queue(
        self: &Arc<Self>,
        thread_id: &str,
        record: Vec<u8>,
        payload: Payload,
    ) -> Option<oneshot::Receiver<bool>> {
        let mut st = self.lock();
        if st.mode != Mode::Journal {
            return None;
        }
        self.start_workers(&mut st);
        if !st.workers.writer {
            // No thread could be started: the save fails (fail closed) instead of waiting forever.
            return None;
        }
        let (done, rx) = oneshot::channel();
        st.transcripts |= !matches!(payload, Payload::Doc(_));
        let q = &mut st.queue;
        q.records.extend_from_slice(&record);
        q.last_seq += 1;
        let seq = q.last_seq;
        q.saves.push(Queued {
            seq,
            thread_id: thread_id.to_owned(),
            payload,
            done,
        });
        st.generation.since.get_or_insert_with(Instant::now);
        self.cv.notify_all();
        Some(rx)
    }

    /// After a journal failure: retires the journal (blocking) and returns once saves are direct.
    pub(super) fn settle(&self) -> Result<(), StoreError> {
        let mut st = self.lock();
        loop {
            match &st.mode {
                Mode::Direct => return Ok(()),
                Mode::Broken(_) => st = self.retire(st)?,
                Mode::Journal => {
                    return Err(StoreError::Io(std::io::Error::other(
                        "state journal write was not confirmed",
                    )))
                }
            }
        }
    }

    fn start_workers(self: &Arc<Self>, st: &mut State) {
        let spawn = |name: &str, body: fn(Weak<Journal>)| {
            let weak = Arc::downgrade(self);
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || body(weak))
                .is_ok()
        };
        if !st.workers.writer {
            st.workers.writer = spawn("state-journal", writer_loop);
        }
        if !st.workers.checkpointer {
            st.workers.checkpointer = spawn("state-checkpoint", checkpoint::checkpoint_loop);
        }
    }

    /// Writes and syncs everything queued, once (the writer thread's step). Returns false when
    /// there was nothing to do within `idle`.
    fn commit_once(&self, idle: Duration) -> bool {
        let mut st = self.lock();
        if st.queue.saves.is_empty() {
            st = self
                .cv
                .wait_timeout_while(st, idle, |st| {
                    st.queue.saves.is_empty() && st.mode == Mode::Journal
                })
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if st.queue.saves.is_empty() || st.mode != Mode::Journal || st.busy.retiring {
            return false;
        }
        st.busy.writing = true;
        if st.generation.rotate_requested {
            st.generation.rotate();
        }
        let records = std::mem::take(&mut st.queue.records);
        let saves = std::mem::take(&mut st.queue.saves);
        let (file, number) = (st.generation.file.clone(), st.generation.number);
        drop(st);
        let result = self.write_batch(file, number, &records);
        let mut st = self.lock();
        st.busy.writing = false;
        st.batches += 1;
        let ok = match result {
            Ok(file) => {
                st.generation.file = Some(file);
                st.generation.bytes += records.len() as u64;
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "state journal write failed; retiring the journal");
                st.mode = Mode::Broken(e.to_string());
                st.generation.file = None;
                // Saves queued meanwhile fail too: the journal is not in use any more.
                for q in std::mem::take(&mut st.queue.saves) {
                    let _ = q.done.send(false);
                }
                st.queue.records.clear();
                false
            }
        };
        let mut told = Vec::with_capacity(saves.len());
        for q in saves {
            if let (true, Payload::Doc(doc) | Payload::Ending(doc)) = (ok, q.payload) {
                st.held.insert(q.thread_id, Held { seq: q.seq, doc });
            }
            told.push(q.done);
        }
        self.cv.notify_all();
        drop(st);
        for done in told {
            let _ = done.send(ok);
        }
        true
    }

    /// Writes a batch to the generation's file (created on first use) and syncs it.
    fn write_batch(
        &self,
        file: Option<Arc<File>>,
        number: u64,
        buf: &[u8],
    ) -> std::io::Result<Arc<File>> {
        let file = match file {
            Some(f) => f,
            None => {
                ensure_dir(&self.dir)?;
                let f = OpenOptions::new()
                    .append(true)
                    .create(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(self.dir.join(format!("{number:020}.log")))?;
                sync_dir(&self.dir)?;
                Arc::new(f)
            }
        };
        (&*file).write_all(buf)?;
        file.sync_data()?;
        Ok(file)
    }
}

fn writer_loop(weak: Weak<Journal>) {
    loop {
        let Some(j) = weak.upgrade() else {
            return;
        };
        // Holding the journal at most `TICK` while idle: it is dropped soon after its store.
        j.commit_once(TICK);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_checkpoint_keeps_the_journal_and_is_due_again() {
        let dir = tempfile::tempdir().unwrap();
        let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let threads = dir.path().join("threads");
        let (j, _) = {
            let (fail, threads) = (fail.clone(), threads.clone());
            Journal::open(
                dir.path(),
                |_, _| Ok(()),
                |_, _| Ok(()),
                Box::new(move |id: &str, doc: &[u8]| {
                    if fail.load(std::sync::atomic::Ordering::SeqCst) {
                        return Err(std::io::Error::other("disk full"));
                    }
                    ensure_dir(&threads)?;
                    let path = threads.join(format!("{id}.json"));
                    fs::write(&path, doc)?;
                    Ok(path)
                }),
                Box::new(|| (HashSet::new(), Ok(()))),
                false,
            )
            .unwrap()
        };
        let doc = br#"{"schemaVersion": 1}"#.to_vec();
        let rx = j.submit("t1", Arc::new(doc.clone())).unwrap();
        assert_eq!(rx.blocking_recv(), Ok(true));
        let logs = || generations(&dir.path().join("journal")).unwrap().len();
        assert_eq!(logs(), 1);
        assert!(j.checkpoint().is_err());
        assert_eq!(
            logs(),
            1,
            "the journal is kept while its documents are not in files"
        );
        assert_eq!(
            j.newest("t1").as_deref(),
            Some(&doc),
            "still served from memory"
        );
        assert!(
            j.lock().generation.since.is_some(),
            "due again without a new save"
        );
        fail.store(false, std::sync::atomic::Ordering::SeqCst);
        assert!(j.checkpoint().unwrap());
        assert_eq!(logs(), 0);
        assert_eq!(fs::read(threads.join("t1.json")).unwrap(), doc);
        assert!(j.newest("t1").is_none());
    }
}
