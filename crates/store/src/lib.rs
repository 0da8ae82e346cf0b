//! Durable thread state.
//!
//! One small JSON document per thread (schemaVersion 1), interchangeable with the reference
//! adapter's files in both directions: a state directory written by one works with the other.
//!
//! A store is three traits, each implemented only by a store that does it: [`Documents`]
//! (every store), [`Ownership`] (a store several instances share: who holds a thread) and
//! [`History`] (transcripts and the list of threads). [`Store`] holds what one opened, and says
//! once what the absence of a part means.
//!
//! - `doc`: the document, its serialisation and its validation on load.
//! - `file`: the file store (thread files in the reference layout).
//! - `journal`: the write-ahead journal in front of the thread files (group commit).
//! - `fs`: filesystem primitives both build on.
//! - `pg`: the PostgreSQL store several instances share (`--state-url`): held threads, fenced
//!   writes, heartbeats.
//! - `owner_seal`: the file store's seal of whom a thread belongs to (`ownerMac`).
//! - `file_tombstone`: the file store's count of the deleted threads of an id.
//! - `listing`: a user's threads, listed; `file_index` is the file store's list, and
//!   `transcript_file` its transcripts (`transcript_file::waiting`: their lines waiting for the
//!   journal's checkpoint).

mod dir_lock;
mod doc;
mod file;
mod file_index;
mod file_tombstone;
mod fs;
mod handle;
mod journal;
mod list_order;
pub mod listing;
mod owner_seal;
mod pg;
pub mod transcript;
mod transcript_file;
mod unavailable;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use doc::{
    project_input as doc_project_input, AppliedDigest, Execution, LastRun, PendingEntry, RunMark,
    RunOutcome, ThreadDoc, MAX_DOC_BYTES, MAX_EXECUTION_MARKS, MAX_RUN_DIGESTS, PENDING_ALLOW_LIST,
};
pub use file::{file_stem, is_reserved_windows_name, FileStore};
pub use handle::Store;
pub use pg::tls as pg_tls;
pub use pg::{Lapse, Lease, PgStore};
pub use unavailable::Unavailable;

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

/// The decision of an admission: given the thread's current document, whether this instance's
/// own runs hold it and, when there is no document, the incarnation a thread made now would be
/// ([`History::incarnation`]; 0 when there is a document), the document to save (`None`:
/// nothing changes).
pub type Decide<'a> =
    Box<dyn FnOnce(Option<&ThreadDoc>, bool, u64) -> Option<ThreadDoc> + Send + 'a>;

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

/// Thread documents: what every store keeps. Every operation is asynchronous and holds no
/// runtime thread while the disk works.
pub trait Documents: Send + Sync + 'static {
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
    fn pending_interrupts(&self) -> BoxFuture<'static, Vec<(String, usize)>>;
}

/// Who holds a thread: a store several instances share. A store without it is this process's
/// alone, and this instance holds every thread (see [`Store`]).
pub trait Ownership: Send + Sync + 'static {
    /// Claims a thread for this instance before a change that is no admission (a cancellation,
    /// an expiry): taken over when its holder is dead.
    fn claim(&self, thread_id: &str) -> BoxFuture<'static, Result<Claim, StoreError>>;
    /// Who holds a thread, without claiming it (where a request for it is served).
    fn holder(&self, thread_id: &str) -> BoxFuture<'static, Result<Claim, StoreError>>;
    /// An admission in one step: the thread's document read under a lock other instances wait
    /// on, `decide`, and the document it returns saved, before anything is answered. `held`:
    /// this instance's runs hold the thread (meaningful only where this instance held it
    /// already).
    fn admit<'a>(
        &'a self,
        thread_id: &'a str,
        held: bool,
        decide: Decide<'a>,
    ) -> BoxFuture<'a, Result<Admission, StoreError>>;
    /// The id of the live instance that holds a thread, as the store says now (`None`: no live
    /// instance does).
    fn held_by(&self, thread_id: &str) -> BoxFuture<'static, Result<Option<String>, StoreError>>;
    /// Whether this instance holds the thread now (what it has in memory is current).
    fn holds(&self, thread_id: &str) -> bool;
    /// This instance's lease on the store.
    fn lease(&self) -> Arc<Lease>;
    /// This instance's id in the store.
    fn instance_id(&self) -> String;
    /// The key that makes a request forwarded between instances count as forwarded
    /// (`forward`): one per cluster, kept in the store, never sent to a client.
    fn forward_key(&self) -> String;
    /// This process keeps nothing of the thread any more (its registry evicted it: no run, no
    /// lock, nothing waiting): what the store remembers per thread it holds (epochs) goes, and
    /// is learnt again at the thread's next admission.
    fn forget(&self, thread_id: &str);
    /// A clean stop: this instance's threads are given up at once (another instance takes them
    /// over without waiting for the lease to run out); nothing is written after it.
    fn release(&self) -> BoxFuture<'static, ()>;
}

/// A thread's history: its transcript and its place in the list of a user's threads.
pub trait History: Send + Sync + 'static {
    /// Appends a run's messages to the thread's transcript, numbered after its newest, and
    /// keeps the newest `limit` (the oldest go first); done when durable.
    fn append_transcript(
        &self,
        thread_id: &str,
        entries: TranscriptAppend,
    ) -> BoxFuture<'static, Result<(), StoreError>>;
    /// A run's end: its messages appended to the thread's transcript and the thread's document
    /// as the run leaves it, both durable when done (a store that can write both at once does:
    /// one sync, not two). The outcomes of the document's save and of the transcript's append.
    fn save_ending(
        &self,
        doc: &ThreadDoc,
        transcript: Option<TranscriptAppend>,
    ) -> BoxFuture<'static, (Result<(), StoreError>, Result<(), StoreError>)>;
    /// A page of the thread's transcript: the newest `limit` entries before `before`.
    fn read_transcript(
        &self,
        thread_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> BoxFuture<'static, Result<transcript::Page, StoreError>>;
    /// A page of the list of threads (`GET /threads`), newest activity first.
    fn list_threads(
        &self,
        query: listing::ListQuery,
    ) -> BoxFuture<'static, Result<listing::ListPage, StoreError>>;
    /// Changes a thread's title or archived flag; its summary after, or `None` when the store
    /// has no such thread.
    fn update_thread(
        &self,
        thread_id: &str,
        patch: listing::ThreadPatch,
    ) -> BoxFuture<'static, Result<Option<listing::ThreadSummary>, StoreError>>;
    /// Deletes a thread: its document, transcript and summary, durably. The caller holds the
    /// thread's lock and has checked that no run and no kernel task is open on it; a shared
    /// store deletes only a row with none either. Whether there was one to delete.
    fn delete_thread(&self, thread_id: &str) -> BoxFuture<'static, Result<bool, StoreError>>;
    /// How many threads of this id were deleted (the store's tombstone of the id): a thread
    /// made now under it is that incarnation of the id (0: the first), and gets a kernel context
    /// of its own, never an earlier incarnation's.
    fn incarnation(&self, thread_id: &str) -> BoxFuture<'static, Result<u64, StoreError>>;
}
