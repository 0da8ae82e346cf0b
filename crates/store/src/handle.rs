//! The store a gateway opened, by what it can do: documents always, ownership when several
//! instances share it, history when it keeps transcripts and a list. What the absence of each
//! means is said here, once: a store of one instance holds every thread, and a store without
//! history keeps no transcript and lists nothing.

use std::sync::Arc;

use crate::{
    listing, transcript, Admission, BoxFuture, Claim, Decide, Documents, FileStore, History, Lease,
    Ownership, PgStore, StoreError, ThreadDoc, TranscriptAppend,
};

/// The parts of an opened store.
#[derive(Clone)]
pub struct Store {
    documents: Arc<dyn Documents>,
    ownership: Option<Arc<dyn Ownership>>,
    history: Option<Arc<dyn History>>,
}

impl Store {
    /// A store of documents only: this process's alone, without history.
    pub fn documents_only(documents: Arc<dyn Documents>) -> Store {
        Store {
            documents,
            ownership: None,
            history: None,
        }
    }

    /// Any parts, as a wrapper of another store's (timing, faults in tests) puts them together.
    pub fn from_parts(
        documents: Arc<dyn Documents>,
        ownership: Option<Arc<dyn Ownership>>,
        history: Option<Arc<dyn History>>,
    ) -> Store {
        Store {
            documents,
            ownership,
            history,
        }
    }

    /// A state directory: documents and history, this process's alone.
    pub fn file(store: FileStore) -> Store {
        let store = Arc::new(store);
        Store::from_parts(store.clone(), None, Some(store))
    }

    /// A PostgreSQL database several instances share: all three.
    pub fn pg(store: PgStore) -> Store {
        let store = Arc::new(store);
        Store::from_parts(store.clone(), Some(store.clone()), Some(store))
    }

    pub fn documents(&self) -> &Arc<dyn Documents> {
        &self.documents
    }

    pub fn ownership(&self) -> Option<&Arc<dyn Ownership>> {
        self.ownership.as_ref()
    }

    pub fn history(&self) -> Option<&Arc<dyn History>> {
        self.history.as_ref()
    }

    /// Whether other instances share this store (then a thread's document is read from it at
    /// each claim or admission, not kept from an earlier load).
    pub fn shared(&self) -> bool {
        self.ownership.is_some()
    }

    /// This instance's lease (`None`: a store of one instance needs none).
    pub fn lease(&self) -> Option<Arc<Lease>> {
        self.ownership.as_ref().map(|o| o.lease())
    }

    /// This instance's id in a shared store.
    pub fn instance_id(&self) -> Option<String> {
        self.ownership.as_ref().map(|o| o.instance_id())
    }

    /// The cluster's forwarding key (a shared store only).
    pub fn forward_key(&self) -> Option<String> {
        self.ownership.as_ref().map(|o| o.forward_key())
    }

    /// Whether this instance holds the thread now: always, in a store of one instance.
    pub fn holds(&self, thread_id: &str) -> bool {
        self.ownership.as_ref().is_none_or(|o| o.holds(thread_id))
    }

    /// [`Ownership::claim`]; a store of one instance: here, what is in memory current.
    pub fn claim(&self, thread_id: &str) -> BoxFuture<'static, Result<Claim, StoreError>> {
        match &self.ownership {
            Some(o) => o.claim(thread_id),
            None => Box::pin(std::future::ready(Ok(Claim::Here {
                current: None,
                took_over: false,
            }))),
        }
    }

    /// [`Ownership::holder`]; a store of one instance: here.
    pub fn holder(&self, thread_id: &str) -> BoxFuture<'static, Result<Claim, StoreError>> {
        match &self.ownership {
            Some(o) => o.holder(thread_id),
            None => self.claim(thread_id),
        }
    }

    /// [`Ownership::held_by`]; a store of one instance: nobody else.
    pub fn held_by(
        &self,
        thread_id: &str,
    ) -> BoxFuture<'static, Result<Option<String>, StoreError>> {
        match &self.ownership {
            Some(o) => o.held_by(thread_id),
            None => Box::pin(std::future::ready(Ok(None))),
        }
    }

    /// An admission: [`Ownership::admit`] in a shared store; in a store of one instance,
    /// `decide` on `cached` (what this process has in memory; without it, the id's incarnation
    /// read first) and its document saved.
    pub fn admit<'a>(
        &'a self,
        thread_id: &'a str,
        cached: Option<ThreadDoc>,
        held: bool,
        decide: Decide<'a>,
    ) -> BoxFuture<'a, Result<Admission, StoreError>> {
        if let Some(o) = &self.ownership {
            return o.admit(thread_id, held, decide);
        }
        Box::pin(async move {
            let incarnation = match &cached {
                Some(_) => 0,
                None => self.incarnation(thread_id).await?,
            };
            let current = match decide(cached.as_ref(), held, incarnation) {
                Some(next) => {
                    self.documents.save(&next).await?;
                    Some(next)
                }
                None => cached,
            };
            Ok(Admission::Here {
                read: None,
                current,
                took_over: false,
            })
        })
    }

    /// [`Ownership::forget`], where there is ownership to forget.
    pub fn forget(&self, thread_id: &str) {
        if let Some(o) = &self.ownership {
            o.forget(thread_id);
        }
    }

    /// [`Ownership::release`], where there is ownership to give up.
    pub fn release(&self) -> BoxFuture<'static, ()> {
        match &self.ownership {
            Some(o) => o.release(),
            None => Box::pin(std::future::ready(())),
        }
    }

    /// [`History::append_transcript`]; without history nothing is kept.
    pub fn append_transcript(
        &self,
        thread_id: &str,
        entries: TranscriptAppend,
    ) -> BoxFuture<'static, Result<(), StoreError>> {
        match &self.history {
            Some(h) => h.append_transcript(thread_id, entries),
            None => Box::pin(std::future::ready(Ok(()))),
        }
    }

    /// [`History::save_ending`]; without history, the document's save alone.
    pub fn save_ending(
        &self,
        doc: &ThreadDoc,
        transcript: Option<TranscriptAppend>,
    ) -> BoxFuture<'static, (Result<(), StoreError>, Result<(), StoreError>)> {
        match &self.history {
            Some(h) => h.save_ending(doc, transcript),
            None => {
                let saved = self.documents.save(doc);
                Box::pin(async move { (saved.await, Ok(())) })
            }
        }
    }

    /// [`History::read_transcript`]; without history, an empty page.
    pub fn read_transcript(
        &self,
        thread_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> BoxFuture<'static, Result<transcript::Page, StoreError>> {
        match &self.history {
            Some(h) => h.read_transcript(thread_id, before, limit),
            None => Box::pin(std::future::ready(Ok(transcript::Page::default()))),
        }
    }

    /// [`History::list_threads`]; without history, an empty list.
    pub fn list_threads(
        &self,
        query: listing::ListQuery,
    ) -> BoxFuture<'static, Result<listing::ListPage, StoreError>> {
        match &self.history {
            Some(h) => h.list_threads(query),
            None => Box::pin(std::future::ready(Ok(listing::ListPage::default()))),
        }
    }

    /// [`History::update_thread`]; without history, no such thread.
    pub fn update_thread(
        &self,
        thread_id: &str,
        patch: listing::ThreadPatch,
    ) -> BoxFuture<'static, Result<Option<listing::ThreadSummary>, StoreError>> {
        match &self.history {
            Some(h) => h.update_thread(thread_id, patch),
            None => Box::pin(std::future::ready(Ok(None))),
        }
    }

    /// [`History::delete_thread`]; without history, nothing to delete.
    pub fn delete_thread(&self, thread_id: &str) -> BoxFuture<'static, Result<bool, StoreError>> {
        match &self.history {
            Some(h) => h.delete_thread(thread_id),
            None => Box::pin(std::future::ready(Ok(false))),
        }
    }

    /// [`History::incarnation`]; without history nothing is deleted: always the first.
    pub fn incarnation(&self, thread_id: &str) -> BoxFuture<'static, Result<u64, StoreError>> {
        match &self.history {
            Some(h) => h.incarnation(thread_id),
            None => Box::pin(std::future::ready(Ok(0))),
        }
    }
}
