//! A run's hold on its thread: the one way an admitted run reads or changes its thread's
//! document.
//!
//! A run was admitted in one hold of this instance on the thread (`ThreadState::hold`). When
//! that hold ends (another instance took the thread, or this one took it over anew), the run's
//! writes are refused here, whatever it remembers; and with a shared store, a run asks the kernel
//! to act only while this instance's lease holds ([`ThreadHold::still_held`]). Changes are
//! durable first (`Threads::edit`): a failed save changes nothing, except the facts that are true
//! whether or not the disk records them (`record`: a task cancelled, an execution ended).
//!
//! The threads API and the cancellation extension read and change threads through the same
//! registry calls: [`read_thread`] for the reads, [`ThreadHold`] for the cancellation's end of
//! the execution.

use std::sync::Arc;

use crate::caller::Caller;
use crate::error::{msg, ApiError, Code};
use store::{Lapse, LastRun, StoreError, ThreadDoc, TranscriptAppend};

use super::threads::{Slot, ThreadState, Threads};

/// Why a change of the thread's document was not saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsaved {
    /// The hold ended, or a shared store refused the write: the thread is not this instance's
    /// (any more).
    NotHeld,
    /// This instance's lease lapsed; `late`: noticed after the whole TTL.
    Lapsed { late: bool },
    /// The save failed, or the execution is not the thread's current one any more.
    Failed,
}

/// A run's hold on its thread.
pub struct ThreadHold {
    threads: Arc<Threads>,
    slot: Arc<Slot>,
    /// The hold the run was admitted in.
    hold: u64,
    /// The execution the run belongs to: only its document may be changed.
    execution_id: String,
    /// With a shared store: the lapse of this instance's lease as of the run's start, which
    /// ends the hold.
    lapse: Option<Arc<Lapse>>,
}

impl ThreadHold {
    pub fn new(
        threads: Arc<Threads>,
        slot: Arc<Slot>,
        hold: u64,
        execution_id: String,
        lapse: Option<Arc<Lapse>>,
    ) -> Self {
        ThreadHold {
            threads,
            slot,
            hold,
            execution_id,
            lapse,
        }
    }

    /// The lapse of this instance's lease that ends the hold (a store of one instance: none).
    pub fn lapse(&self) -> Option<&Arc<Lapse>> {
        self.lapse.as_ref()
    }

    pub fn execution_id(&self) -> &str {
        &self.execution_id
    }

    /// The thread's document (in memory: the run holds the thread).
    pub async fn doc(&self) -> Option<ThreadDoc> {
        self.slot.lock().await.doc().cloned()
    }

    /// Whether the run's execution waits for answers.
    pub async fn waiting(&self) -> bool {
        self.doc()
            .await
            .is_some_and(|d| d.is_current(&self.execution_id) && d.is_waiting())
    }

    /// Changes the execution's document, durable first. An error when the hold ended, it could
    /// not be saved, or the execution is not the thread's current one any more.
    pub async fn edit(&self, change: impl FnOnce(&mut ThreadDoc)) -> Result<(), Unsaved> {
        let mut st = self.slot.lock().await;
        if st.hold() != self.hold {
            // Admitted in an earlier hold of this instance: the thread moved on without it.
            return Err(Unsaved::NotHeld);
        }
        let current = st.doc().is_some_and(|d| d.is_current(&self.execution_id));
        if !current {
            return Err(Unsaved::Failed);
        }
        match self.threads.edit(&mut st, change).await {
            Some(Ok(())) => Ok(()),
            Some(Err(StoreError::NotHeld(_))) => {
                tracing::warn!("state write refused: the thread is not this instance's any more");
                Err(Unsaved::NotHeld)
            }
            Some(Err(StoreError::LeaseLapsed { late })) => Err(Unsaved::Lapsed { late }),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "state write failed");
                Err(Unsaved::Failed)
            }
            None => Err(Unsaved::Failed),
        }
    }

    /// Before the kernel is asked to do something in the thread's name (a turn, an answer):
    /// this instance must still hold the thread and its lease must hold (a shared store; a
    /// store of one instance always does). A lease that holds now holds for the margin before
    /// its TTL, time enough for the request to reach the kernel before anyone could take over.
    pub async fn still_held(&self) -> Result<(), Unsaved> {
        if self.slot.lock().await.hold() != self.hold {
            return Err(Unsaved::NotHeld);
        }
        match self.threads.store().lease() {
            Some(lease) if !lease.holds() => Err(Unsaved::Lapsed {
                late: lease.is_late(),
            }),
            _ => Ok(()),
        }
    }

    /// Ends the execution after its task was cancelled: in memory whatever the save says
    /// (nothing may be answered on a cancelled task), on disk if it can.
    pub async fn end_execution(&self) {
        let mut st = self.slot.lock().await;
        if !self.is_current(&st) {
            return;
        }
        let recorded = self.threads.record(&mut st, ThreadDoc::end_execution).await;
        if let Some(Err(e)) = recorded {
            tracing::warn!(error = %e, "state write failed; the execution is ended in memory");
        }
    }

    /// Ends the execution durably, when it is the thread's current one and not ended yet (the
    /// cancellation extension, after the kernel cancelled its task): `Ok(false)` when there was
    /// nothing to end. Unlike a run's edits this is no write within a hold: the thread is read
    /// afresh where this instance may not hold it any more (`Threads::lock`), checked and changed
    /// under one lock, and a shared store's fencing decides whether the save lands.
    pub async fn end_execution_durably(&self, thread_id: &str) -> Result<bool, Unsaved> {
        let mut st = self
            .threads
            .lock(&self.slot, thread_id)
            .await
            .map_err(|_| Unsaved::Failed)?;
        let live = st.doc().is_some_and(|d| {
            d.is_current(&self.execution_id) && !d.is_terminal(&self.execution_id)
        });
        if !live {
            return Ok(false);
        }
        match self.threads.edit(&mut st, ThreadDoc::end_execution).await {
            Some(Ok(())) => Ok(true),
            Some(Err(StoreError::NotHeld(_))) => Err(Unsaved::NotHeld),
            Some(Err(StoreError::LeaseLapsed { late })) => Err(Unsaved::Lapsed { late }),
            Some(Err(_)) | None => Err(Unsaved::Failed),
        }
    }

    /// Releases the thread with how the run ended: [`ThreadHold::end_run`], then
    /// [`ThreadHold::free`] (the driver does the two apart, its terminal event between them).
    #[cfg(test)]
    pub async fn release(&self, last: LastRun) {
        let run_id = last.run_id.clone();
        let thread_id = self.slot.lock().await.doc().map(|d| d.thread_id.clone());
        let _ = self
            .end_run(
                &thread_id.unwrap_or_default(),
                last,
                None,
                &Default::default(),
            )
            .await;
        self.free(&run_id).await;
    }

    /// The run's end made durable: the thread's document as the run leaves it (its execution
    /// ended unless it waits for answers, no active run, `lastRun`) and the run's messages, in
    /// one write where the store can. The run still holds the thread until
    /// [`ThreadHold::free`]. A failed save of the document is logged (what a client needs next
    /// is in memory); the transcript append's outcome is returned.
    pub async fn end_run(
        &self,
        thread_id: &str,
        last: LastRun,
        transcript: Option<TranscriptAppend>,
        message_ids: &std::collections::BTreeSet<String>,
    ) -> Result<(), StoreError> {
        let mut st = self.slot.lock().await;
        if st.hold() != self.hold {
            // Not this run's thread any more: its messages are still its history.
            drop(st);
            return match transcript {
                Some(t) => self.threads.store().append_transcript(thread_id, t).await,
                None => Ok(()),
            };
        }
        let ended = st.doc().is_some_and(|d| {
            d.is_current(&self.execution_id)
                && !d.is_waiting()
                && !d.is_terminal(&self.execution_id)
        });
        let recorded = self
            .threads
            .record_ending(
                &mut st,
                |d| {
                    if ended {
                        d.end_execution();
                    } else if d.is_current(&self.execution_id) && !d.is_terminal(&self.execution_id)
                    {
                        // The execution goes on (it waits for answers): its next run starts
                        // none of the messages this one started again.
                        d.execution.message_ids.clone_from(message_ids);
                    }
                    if d.active_run
                        .as_ref()
                        .is_some_and(|a| a.run_id == last.run_id)
                    {
                        d.active_run = None;
                    }
                    d.last_run = Some(last);
                },
                transcript,
            )
            .await;
        match recorded {
            Some((saved, appended)) => {
                if let Err(e) = saved {
                    tracing::warn!(error = %e, "end-of-run state write failed");
                }
                appended
            }
            None => Ok(()),
        }
    }

    /// The thread is free for its next run (in memory: the end was written by
    /// [`ThreadHold::end_run`]).
    pub async fn free(&self, run_id: &str) {
        let mut st = self.slot.lock().await;
        if st.hold() == self.hold && st.active().is_some_and(|a| a.run_id == run_id) {
            st.set_active(None);
        }
    }

    /// Within the run's hold, and the execution is the thread's current one.
    fn is_current(&self, st: &ThreadState) -> bool {
        st.hold() == self.hold && st.doc().is_some_and(|d| d.is_current(&self.execution_id))
    }
}

/// A thread id no thread can have (beyond the bound of ids) names no thread: not found, before
/// the registry or a store sees it.
pub fn check_thread_id(thread_id: &str) -> Result<(), ApiError> {
    if crate::bounded::is_bounded(thread_id) {
        Ok(())
    } else {
        Err(ApiError::new(Code::ThreadNotFound, msg::THREAD_NOT_FOUND))
    }
}

/// Whether `caller` may touch `thread_id` as the store has it now, without changing anything
/// (`Ok(false)`: another user's; a thread that does not exist is `Ok(true)`, there is nothing to
/// hide). A caller without a user touches every thread, and nothing is read for it. A thread's
/// owner never changes once set (a thread without one can only become its bound user's), so a
/// check made before a change holds for it.
pub async fn may_touch(
    threads: &Threads,
    caller: &Caller,
    thread_id: &str,
) -> Result<bool, ApiError> {
    if caller.user.is_none() {
        return Ok(true);
    }
    let read = read_thread(threads, thread_id, |_, doc| {
        caller.may_touch(doc.owner_or_user())
    })
    .await;
    match read {
        Err(e) if e.code == Code::ThreadNotFound => Ok(true),
        other => other,
    }
}

/// Reads a thread that must exist: `read` sees its state and document under the thread's lock.
/// A thread without a document is `THREAD_NOT_FOUND`; a store that cannot be read,
/// `STATE_UNAVAILABLE`.
pub async fn read_thread<R>(
    threads: &Threads,
    thread_id: &str,
    read: impl FnOnce(&ThreadState, &ThreadDoc) -> R,
) -> Result<R, ApiError> {
    check_thread_id(thread_id)?;
    let slot = threads.slot(thread_id);
    let st = threads
        .lock(&slot, thread_id)
        .await
        .map_err(|_| ApiError::new(Code::StateUnavailable, msg::STATE_UNAVAILABLE))?;
    let doc = st
        .doc()
        .ok_or_else(|| ApiError::new(Code::ThreadNotFound, msg::THREAD_NOT_FOUND))?;
    Ok(read(&st, doc))
}

#[cfg(test)]
mod tests;
