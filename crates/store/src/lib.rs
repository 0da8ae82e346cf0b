//! Durable thread state.
//!
//! One small JSON document per thread (schemaVersion 1), interchangeable with the reference
//! adapter's files in both directions: a state directory written by one works with the other.
//!
//! - `doc`: the document, its serialisation and its validation on load.
//! - `file`: the file store (thread files in the reference layout).
//! - `journal`: the write-ahead journal in front of the thread files (group commit).
//! - `fs`: filesystem primitives both build on.
//! - `pg`: the PostgreSQL store several instances share (`--state-url`): held threads, fenced
//!   writes, heartbeats.
//! - `listing`: a user's threads, listed; `file_index` is the file store's list, and
//!   `transcript_file` its transcripts (`transcript_file::waiting`: their lines waiting for the
//!   journal's checkpoint).

mod dir_lock;
mod doc;
mod file;
mod file_index;
mod fs;
mod journal;
mod list_order;
pub mod listing;
mod pg;
pub mod transcript;
mod transcript_file;

use std::future::Future;
use std::pin::Pin;

pub use doc::{
    project_input as doc_project_input, AppliedDigest, Execution, LastRun, PendingEntry, RunMark,
    RunOutcome, ThreadDoc, MAX_DOC_BYTES, MAX_EXECUTION_MARKS, MAX_RUN_DIGESTS, PENDING_ALLOW_LIST,
};
pub use file::{file_stem, is_reserved_windows_name, FileStore};
pub use pg::tls as pg_tls;
pub use pg::{Lapse, Lease, PgStore};

/// What a run adds to its thread's transcript.
#[derive(Debug, Clone)]
pub struct TranscriptAppend {
    pub run_id: String,
    /// RFC 3339, when it is written.
    pub at: String,
    pub messages: Vec<serde_json::Value>,
    /// The most messages the thread keeps (`--transcript-limit`).
    pub limit: usize,
}

/// A boxed future of a store operation.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Store failures.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The file exists but is not a valid document for this thread (corrupt, truncated, symlinked,
    /// foreign thread, not a regular file…).
    #[error("thread state is invalid: {0}")]
    Invalid(String),
    #[error("thread state I/O failed: {0}")]
    Io(#[from] std::io::Error),
    /// A shared store refused the write: the thread is not this instance's any more (another
    /// took it over), or this instance's lease lapsed. Nothing was written.
    #[error("thread {0} is not held by this instance")]
    NotHeld(String),
    /// This instance's lease on the shared store lapsed: it writes nothing until it is renewed.
    /// `late`: noticed after the whole TTL (another instance may hold the thread by now).
    #[error("this instance's lease on the shared state lapsed")]
    LeaseLapsed { late: bool },
    /// The shared store cannot be reached (or did not answer in time).
    #[error("the state database is unavailable: {0}")]
    Unavailable(String),
}

/// Who holds a thread (a store shared by several instances; the file store is always `Here`).
// Returned once per request and moved into the thread's slot at once: boxing the document would
// only add an allocation.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// This instance holds it and may write. `current` is its document as the store has it,
    /// read under the claim (`None`: the store is this process's alone, what it has in memory
    /// is current); `took_over` when it was another's (dead) instance's, or nobody's, until now.
    Here {
        current: Option<Option<ThreadDoc>>,
        took_over: bool,
    },
    /// Another live instance holds it: requests for it go there.
    Elsewhere(Peer),
}

/// Another live instance: where its requests go, and its id (what it must prove to be before a
/// forward is sent to it; an instance started again at the same URL is another instance).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Peer {
    pub url: String,
    pub id: String,
}

/// The decision of an admission: given the thread's current document and whether this
/// instance's own runs hold it, the document to save (`None`: nothing changes).
pub type Decide<'a> = Box<dyn FnOnce(Option<&ThreadDoc>, bool) -> Option<ThreadDoc> + Send + 'a>;

/// What an admission did.
#[allow(clippy::large_enum_variant)] // As `Claim`.
#[derive(Debug, Clone, PartialEq)]
pub enum Admission {
    /// Decided here: the thread's document now (saved when the decision changed it). `read`:
    /// the document the decision was made on, when the store read it itself (a shared store;
    /// what this process had in memory was not used).
    Here {
        read: Option<Option<ThreadDoc>>,
        current: Option<ThreadDoc>,
        took_over: bool,
    },
    /// Another live instance holds the thread: nothing was decided.
    Elsewhere(Peer),
}

/// Where thread documents live. Every operation is asynchronous and holds no runtime thread
/// while the disk works.
pub trait ThreadStore: Send + Sync + 'static {
    /// Loads a thread; `Ok(None)` when it does not exist.
    fn load(&self, thread_id: &str) -> BoxFuture<'static, Result<Option<ThreadDoc>, StoreError>>;
    /// Replaces the thread's document; done when it is durable.
    fn save(&self, doc: &ThreadDoc) -> BoxFuture<'static, Result<(), StoreError>>;
    /// Makes every completed save durable in its final place (clean shutdown).
    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>>;
    /// Whether saves can be made now (`/ready`); why not, plainly. Cheap: a readiness probe may
    /// ask every second.
    fn reachable(&self) -> BoxFuture<'static, Result<(), String>>;
    /// The threads with pending interrupts, and how many each: what the metrics count before
    /// those threads are loaded. A store that cannot tell cheaply knows none.
    fn pending_interrupts(&self) -> BoxFuture<'static, Vec<(String, usize)>> {
        Box::pin(std::future::ready(Vec::new()))
    }
    /// Whether other instances share this store (then a thread's document is read from it at
    /// each claim or admission, not kept from an earlier load).
    fn shared(&self) -> bool {
        false
    }
    /// Claims a thread for this instance before a change that is no admission (a cancellation,
    /// an expiry): taken over when its holder is dead. A store of one instance: always here.
    fn claim(&self, _thread_id: &str) -> BoxFuture<'static, Result<Claim, StoreError>> {
        Box::pin(std::future::ready(Ok(Claim::Here {
            current: None,
            took_over: false,
        })))
    }
    /// Who holds a thread, without claiming it (where a request for it is served).
    fn holder(&self, _thread_id: &str) -> BoxFuture<'static, Result<Claim, StoreError>> {
        self.claim(_thread_id)
    }
    /// An admission in one step: the thread's document (`cached`: what this process has in
    /// memory; a shared store reads its own under a lock other instances wait on), `decide`, and
    /// the document it returns saved, before anything is answered. `held`: this instance's runs
    /// hold the thread (meaningful only where this instance held it already).
    fn admit<'a>(
        &'a self,
        _thread_id: &'a str,
        cached: Option<ThreadDoc>,
        held: bool,
        decide: Decide<'a>,
    ) -> BoxFuture<'a, Result<Admission, StoreError>> {
        Box::pin(async move {
            match decide(cached.as_ref(), held) {
                Some(next) => {
                    self.save(&next).await?;
                    Ok(Admission::Here {
                        read: None,
                        current: Some(next),
                        took_over: false,
                    })
                }
                None => Ok(Admission::Here {
                    read: None,
                    current: cached,
                    took_over: false,
                }),
            }
        })
    }
    /// The id of the live instance that holds a thread in a shared store, as the store says now
    /// (`None`: no live instance does, or the store is this process's alone).
    fn held_by(&self, _thread_id: &str) -> BoxFuture<'static, Result<Option<String>, StoreError>> {
        Box::pin(std::future::ready(Ok(None)))
    }
    /// Whether this instance holds the thread now (what it has in memory is current).
    fn holds(&self, _thread_id: &str) -> bool {
        true
    }
    /// This instance's lease on a shared store (`None`: a store of one instance needs none).
    fn lease(&self) -> Option<std::sync::Arc<Lease>> {
        None
    }
    /// This instance's id in a shared store.
    fn instance_id(&self) -> Option<String> {
        None
    }
    /// The key that makes a request forwarded between instances of a shared store count as
    /// forwarded (`forward`): one per cluster, kept in the store, never sent to a client.
    fn forward_key(&self) -> Option<String> {
        None
    }
    /// This process keeps nothing of the thread any more (its registry evicted it: no run, no
    /// lock, nothing waiting): a store that remembers something per thread it holds (the
    /// PostgreSQL store's epochs) drops it, and learns it again at the thread's next admission.
    fn forget(&self, _thread_id: &str) {}
    /// Appends a run's messages to the thread's transcript, numbered after its newest, and
    /// keeps the newest `limit` (the oldest go first); done when durable. A store that keeps no
    /// transcript keeps nothing.
    fn append_transcript(
        &self,
        _thread_id: &str,
        _entries: TranscriptAppend,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }
    /// A run's end: its messages appended to the thread's transcript and the thread's document
    /// as the run leaves it, both durable when done (a store that can write both at once does:
    /// one sync, not two). The outcomes of the document's save and of the transcript's append.
    fn save_ending(
        &self,
        doc: &ThreadDoc,
        transcript: Option<TranscriptAppend>,
    ) -> BoxFuture<'static, (Result<(), StoreError>, Result<(), StoreError>)> {
        let appended = transcript.map(|t| self.append_transcript(&doc.thread_id, t));
        let saved = self.save(doc);
        Box::pin(async move {
            let appended = match appended {
                Some(a) => a.await,
                None => Ok(()),
            };
            (saved.await, appended)
        })
    }
    /// A page of the thread's transcript: the newest `limit` entries before `before`.
    fn read_transcript(
        &self,
        _thread_id: &str,
        _before: Option<u64>,
        _limit: usize,
    ) -> BoxFuture<'static, Result<crate::transcript::Page, StoreError>> {
        Box::pin(std::future::ready(Ok(crate::transcript::Page::default())))
    }
    /// A page of the list of threads (`GET /threads`), newest activity first. A store that
    /// keeps no list lists nothing.
    fn list_threads(
        &self,
        _query: listing::ListQuery,
    ) -> BoxFuture<'static, Result<listing::ListPage, StoreError>> {
        Box::pin(std::future::ready(Ok(listing::ListPage::default())))
    }
    /// Changes a thread's title or archived flag; its summary after, or `None` when the store
    /// has no such thread.
    fn update_thread(
        &self,
        _thread_id: &str,
        _patch: listing::ThreadPatch,
    ) -> BoxFuture<'static, Result<Option<listing::ThreadSummary>, StoreError>> {
        Box::pin(std::future::ready(Ok(None)))
    }
    /// Deletes a thread: its document, transcript and summary, durably. The caller holds the
    /// thread's lock and has checked that no run and no kernel task is open on it; a shared
    /// store deletes only a row with none either. Whether there was one to delete.
    fn delete_thread(&self, _thread_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        Box::pin(std::future::ready(Ok(false)))
    }
    /// A clean stop: a shared store gives this instance's threads up at once (another instance
    /// takes them over without waiting for the lease to run out); nothing is written after it.
    fn release(&self) -> BoxFuture<'static, ()> {
        Box::pin(std::future::ready(()))
    }
}

/// The store of a state directory that could not be opened: every load and save fails with the
/// reason (clear 503s instead of a crash).
pub struct Unavailable(pub String);

impl Unavailable {
    fn err(&self) -> StoreError {
        StoreError::Io(std::io::Error::other(self.0.clone()))
    }
}

impl ThreadStore for Unavailable {
    fn load(&self, _: &str) -> BoxFuture<'static, Result<Option<ThreadDoc>, StoreError>> {
        Box::pin(std::future::ready(Err(self.err())))
    }
    fn save(&self, _: &ThreadDoc) -> BoxFuture<'static, Result<(), StoreError>> {
        Box::pin(std::future::ready(Err(self.err())))
    }
    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        Box::pin(std::future::ready(Ok(())))
    }
    fn reachable(&self) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(std::future::ready(Err(self.0.clone())))
    }
}
