//! The hold without a kernel: an in-memory store whose saves can be made to fail.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use super::*;
use crate::run::decide::testing::doc_with_pending;
use crate::run::{ActiveRun, RunControl};
use crate::telemetry::testing::Counts;
use store::RunOutcome;
use store::{BoxFuture, Documents, Store};

/// A store in memory; `fail` makes every save fail, `refuse` makes it answer "not held".
#[derive(Default)]
struct Memory {
    docs: Mutex<HashMap<String, ThreadDoc>>,
    fail: AtomicBool,
    refuse: AtomicBool,
    saves: AtomicUsize,
}

impl Memory {
    fn stored(&self, id: &str) -> Option<ThreadDoc> {
        self.docs.lock().unwrap().get(id).cloned()
    }
}

impl Documents for Memory {
    fn load(&self, id: &str) -> BoxFuture<'static, Result<Option<ThreadDoc>, StoreError>> {
        let doc = self.stored(id);
        Box::pin(async move { Ok(doc) })
    }
    fn save(&self, doc: &ThreadDoc) -> BoxFuture<'static, Result<(), StoreError>> {
        self.saves.fetch_add(1, Ordering::SeqCst);
        let r = if self.refuse.load(Ordering::SeqCst) {
            Err(StoreError::NotHeld(doc.thread_id.clone()))
        } else if self.fail.load(Ordering::SeqCst) {
            Err(StoreError::Io(std::io::Error::other("disk full")))
        } else {
            self.docs
                .lock()
                .unwrap()
                .insert(doc.thread_id.clone(), doc.clone());
            Ok(())
        };
        Box::pin(async move { r })
    }
    fn flush(&self) -> BoxFuture<'static, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }
    fn reachable(&self) -> BoxFuture<'static, Result<(), String>> {
        Box::pin(async { Ok(()) })
    }
    fn pending_interrupts(&self) -> BoxFuture<'static, Vec<(String, usize)>> {
        Box::pin(async { Vec::new() })
    }
}

/// A thread `thread-1` on execution `exec-0` (pending `p1` when `waiting`), loaded, with a run
/// `run-1` active; and the hold of that run.
async fn held(waiting: bool) -> (Arc<Memory>, Arc<Threads>, ThreadHold) {
    let store = Arc::new(Memory::default());
    let doc = doc_with_pending(if waiting { &[("p1", None)] } else { &[] });
    store.docs.lock().unwrap().insert("thread-1".into(), doc);
    let threads = Arc::new(Threads::new(
        Store::documents_only(store.clone()),
        Arc::new(Counts::default()),
    ));
    let slot = threads.slot("thread-1");
    let hold = {
        let mut st = threads.lock(&slot, "thread-1").await.unwrap();
        st.set_active(Some(ActiveRun {
            run_id: "run-1".into(),
            since_ms: 0,
            execution_id: "exec-0".into(),
            control: Arc::new(RunControl::default()),
        }));
        st.hold()
    };
    let h = ThreadHold::new(threads.clone(), slot, hold, "exec-0".into(), None);
    (store, threads, h)
}

/// Ends this instance's hold on the thread, as a takeover by another instance does.
async fn lose_hold(threads: &Threads) {
    let slot = threads.slot("thread-1");
    let mut st = slot.lock().await;
    threads.forget_for_tests(&mut st);
}

fn last(outcome: RunOutcome) -> LastRun {
    LastRun {
        run_id: "run-1".into(),
        outcome: outcome.into(),
        code: None,
        ended_at: "2026-01-01T00:00:00.000Z".into(),
    }
}

#[tokio::test]
async fn an_edit_is_durable_first() {
    let (store, _, h) = held(false).await;
    h.edit(|d| d.session_id = Some("s2".into())).await.unwrap();
    assert_eq!(
        store.stored("thread-1").unwrap().session_id.as_deref(),
        Some("s2")
    );
    assert_eq!(h.doc().await.unwrap().session_id.as_deref(), Some("s2"));

    store.fail.store(true, Ordering::SeqCst);
    assert_eq!(
        h.edit(|d| d.session_id = Some("s3".into())).await,
        Err(Unsaved::Failed)
    );
    assert_eq!(
        h.doc().await.unwrap().session_id.as_deref(),
        Some("s2"),
        "a failed save changes nothing in memory"
    );
}

#[tokio::test]
async fn a_refused_save_is_not_held() {
    let (store, _, h) = held(false).await;
    store.refuse.store(true, Ordering::SeqCst);
    assert_eq!(h.edit(|d| d.session_id = None).await, Err(Unsaved::NotHeld));
}

#[tokio::test]
async fn only_the_current_execution_may_be_changed() {
    let (store, threads, h) = held(false).await;
    let other = ThreadHold::new(
        threads.clone(),
        threads.slot("thread-1"),
        0,
        "exec-9".into(),
        None,
    );
    let saves = store.saves.load(Ordering::SeqCst);
    assert_eq!(
        other.edit(|d| d.session_id = None).await,
        Err(Unsaved::Failed)
    );
    assert_eq!(
        store.saves.load(Ordering::SeqCst),
        saves,
        "nothing was saved"
    );
    assert!(h.edit(|d| d.session_id = None).await.is_ok());
}

#[tokio::test]
async fn a_run_of_an_earlier_hold_writes_nothing_and_is_not_held() {
    let (store, threads, h) = held(true).await;
    assert!(h.still_held().await.is_ok());
    lose_hold(&threads).await;
    let saves = store.saves.load(Ordering::SeqCst);
    assert_eq!(h.still_held().await, Err(Unsaved::NotHeld));
    assert_eq!(h.edit(|d| d.session_id = None).await, Err(Unsaved::NotHeld));
    h.end_execution().await;
    h.release(last(RunOutcome::Success)).await;
    assert_eq!(
        store.saves.load(Ordering::SeqCst),
        saves,
        "nothing was saved"
    );
    assert!(store.stored("thread-1").unwrap().last_run.is_none());
}

#[tokio::test]
async fn ending_the_execution_holds_in_memory_even_when_the_save_fails() {
    let (store, _, h) = held(true).await;
    assert!(h.waiting().await);
    store.fail.store(true, Ordering::SeqCst);
    h.end_execution().await;
    let doc = h.doc().await.unwrap();
    assert!(
        doc.is_terminal("exec-0"),
        "nothing may be answered on a cancelled task"
    );
    assert!(!h.waiting().await);
    assert!(
        !store.stored("thread-1").unwrap().is_terminal("exec-0"),
        "the disk kept the old document"
    );
}

#[tokio::test]
async fn the_cancellation_ends_a_live_execution_once() {
    let (store, _, h) = held(false).await;
    assert_eq!(h.end_execution_durably("thread-1").await, Ok(true));
    assert!(store.stored("thread-1").unwrap().is_terminal("exec-0"));
    let saves = store.saves.load(Ordering::SeqCst);
    assert_eq!(h.end_execution_durably("thread-1").await, Ok(false));
    assert_eq!(store.saves.load(Ordering::SeqCst), saves);
}

#[tokio::test]
async fn release_records_the_run_and_ends_an_execution_that_waits_for_nothing() {
    let (store, threads, h) = held(false).await;
    h.release(last(RunOutcome::Success)).await;
    let doc = store.stored("thread-1").unwrap();
    assert_eq!(
        doc.last_run.as_ref().unwrap().outcome,
        RunOutcome::Success.into()
    );
    assert!(doc.is_terminal("exec-0"));
    let slot = threads.slot("thread-1");
    assert!(slot.lock().await.active().is_none(), "the thread is free");
}

#[tokio::test]
async fn release_keeps_an_execution_that_waits_for_answers() {
    let (store, _, h) = held(true).await;
    h.release(last(RunOutcome::Interrupt)).await;
    let doc = store.stored("thread-1").unwrap();
    assert!(!doc.is_terminal("exec-0"));
    assert_eq!(doc.execution.pending.len(), 1);
    assert_eq!(doc.last_run.unwrap().outcome, RunOutcome::Interrupt.into());
}

#[tokio::test]
async fn reading_a_thread_that_does_not_exist_is_not_found() {
    let (_, threads, _) = held(false).await;
    let id = read_thread(&threads, "thread-1", |_, d| {
        d.execution.execution_id.clone()
    })
    .await
    .unwrap();
    assert_eq!(id, "exec-0");
    let e = read_thread(&threads, "nope", |_, _| ()).await.unwrap_err();
    assert_eq!(e.code, Code::ThreadNotFound);
}

/// A run's end is written before its terminal event while the thread stays the run's: the
/// document says how it ended, and the thread is busy until the run frees it.
#[tokio::test]
async fn a_runs_end_is_written_before_the_thread_is_free() {
    let (store, threads, h) = held(false).await;
    let slot = threads.slot("thread-1");
    let active = || async { slot.lock().await.active().map(|a| a.run_id.clone()) };
    let run_id = active().await.expect("the run holds the thread");
    let mut ended = last(RunOutcome::Success);
    ended.run_id = run_id.clone();
    let ids = Default::default();
    assert!(h.end_run("thread-1", ended, None, &ids).await.is_ok());
    let doc = store.stored("thread-1").unwrap();
    assert_eq!(doc.last_run.as_ref().unwrap().run_id, run_id);
    assert!(doc.active_run.is_none() && doc.is_terminal("exec-0"));
    assert_eq!(active().await, Some(run_id.clone()), "still busy");
    h.free("another-run").await;
    assert_eq!(
        active().await,
        Some(run_id.clone()),
        "only its own run frees it"
    );
    h.free(&run_id).await;
    assert_eq!(active().await, None);
}
