//! Durable thread state.
//!
//! One small JSON document per thread (schemaVersion 1), interchangeable with the reference
//! adapter's files in both directions: a state directory written by one works with the other.
//!
//! - `doc`: the document, its serialisation and its validation on load.
//! - `file`: the file store (thread files in the reference layout).
//! - `journal`: the write-ahead journal in front of the thread files (group commit).
//! - `fs`: filesystem primitives both build on.
//! - `metered`: the store as the run core sees it: saves timed and counted.

mod doc;
mod file;
mod fs;
mod journal;
mod metered;

use std::future::Future;
use std::pin::Pin;

pub use doc::{
    project_input as doc_project_input, AppliedDigest, Execution, LastRun, PendingEntry, RunMark,
    ThreadDoc, PENDING_ALLOW_LIST,
};
pub use file::{file_stem, FileStore};
pub use metered::Metered;

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
    /// The threads with pending interrupts, and how many each: what the metrics count before
    /// those threads are loaded. A store that cannot tell cheaply knows none.
    fn pending_interrupts(&self) -> BoxFuture<'static, Vec<(String, usize)>> {
        Box::pin(std::future::ready(Vec::new()))
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
}
