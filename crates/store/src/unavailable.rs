//! The store of a state directory that could not be opened.

use crate::{BoxFuture, Documents, StoreError, ThreadDoc};

/// The store of a state directory that could not be opened: every load and save fails with the
/// reason (clear 503s instead of a crash).
pub struct Unavailable(pub String);

impl Unavailable {
    fn err(&self) -> StoreError {
        StoreError::Io(std::io::Error::other(self.0.clone()))
    }
}

impl Documents for Unavailable {
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
    fn pending_interrupts(&self) -> BoxFuture<'static, Vec<(String, usize)>> {
        Box::pin(std::future::ready(Vec::new()))
    }
}
