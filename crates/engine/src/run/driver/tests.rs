//! The driver's paths through its parts, without HTTP: a runtime on a file store in a temporary
//! directory and the test kit's scripted fake kernel; each run admitted as `POST /` would.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use testkit::fake_kernel::{items, FakeKernel, Item, Reply};
use tokio::sync::mpsc;

use super::*;
use crate::i18n::Lang;
use crate::limits::Caps;
use crate::run::admit::{admit, RunRequest};
use crate::settings::Settings;
use crate::telemetry::testing::Counts;
use crate::validate::cwd::Roots;
use crate::validate::{content, envelope, props};
use clock::SystemClock;
use kernel::{Kernel, Pool};
use store::FileStore;
use store::RunOutcome;

struct Harness {
    rt: Arc<Runtime>,
    kernel: FakeKernel,
    /// The pool's other kernels (none in a pool of one).
    more: Vec<FakeKernel>,
    dir: tempfile::TempDir,
}

async fn harness() -> Harness {
    harness_of(1).await
}

/// A runtime whose pool has `kernels` fake kernels (`kernel` the first).
async fn harness_of(kernels: usize) -> Harness {
    let kernel = FakeKernel::start().await;
    let mut more = Vec::new();
    for _ in 1..kernels {
        more.push(FakeKernel::start().await);
    }
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        caps: Caps::default(),
        client_stall_timeout: Duration::from_secs(60),
        detach_grace: Duration::ZERO,
        interrupt_ttl_secs: 86400,
        replay_buffer_bytes: 1 << 20,
        max_image_decodes: 2,
        channel_capacity: 64,
        workspaces: Roots::Default(dir.path().join("state/workspaces")),
    };
    let store = store::Store::file(FileStore::open(dir.path().join("state")).unwrap());
    let slots = std::iter::once(&kernel)
        .chain(&more)
        .map(|k| Kernel::external(&k.url(), None, Default::default(), None))
        .collect();
    let rt = Arc::new(Runtime::new(
        settings,
        store,
        Pool::new(slots).unwrap(),
        Arc::new(SystemClock),
        Arc::new(Counts::default()),
    ));
    Harness {
        rt,
        kernel,
        more,
        dir,
    }
}

impl Harness {
    /// A validated request of a new turn on `thread` (or a resume with `resume`).
    fn request(&self, thread: &str, run: &str, resume: Option<Value>) -> RunRequest {
        let mut body = json!({
            "threadId": thread, "runId": run, "state": {}, "tools": [], "context": [],
            "messages": [{"id": format!("m-{run}"), "role": "user", "content": "hello"}],
            "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "inv-1",
                "cwd": self.dir.path().to_string_lossy()}},
        });
        if let Some(r) = resume {
            body["resume"] = r;
        }
        let obj = body.as_object().unwrap();
        let envelope = envelope::parse(obj).unwrap();
        let iac = props::parse(obj.get("forwardedProps")).unwrap();
        let user_message = (envelope.resume.is_none())
            .then(|| {
                content::latest_user_message(&envelope.messages, content::ImageLimits::default())
            })
            .transpose()
            .unwrap();
        RunRequest {
            budget_refused: None,
            envelope,
            iac,
            cwd: self.dir.path().to_path_buf(),
            create_cwd: false,
            digest: format!("digest-{run}"),
            user_message,
            lang: Lang::En,
            caller: crate::caller::Caller::OPEN,
        }
    }

    /// Admits and drives a run; its receiving end.
    async fn run(&self, req: RunRequest) -> mpsc::Receiver<Bytes> {
        let adm = admit(&self.rt, req).await.expect("admitted");
        let slot = self.rt.limits().run(None).expect("a run slot");
        spawn_run(
            self.rt.clone(),
            adm,
            slot,
            tracing::Span::none(),
            Vec::new(),
        )
    }

    fn ctx(&self, thread: &str) -> String {
        crate::run::context_id(thread)
    }
}

/// Every event of a run, to its end.
async fn events(mut rx: mpsc::Receiver<Bytes>) -> Vec<Value> {
    let mut out = Vec::new();
    while let Some(frame) = rx.recv().await {
        for line in std::str::from_utf8(&frame).unwrap().lines() {
            if let Some(data) = line.strip_prefix("data: ") {
                out.push(serde_json::from_str(data).unwrap());
            }
        }
    }
    out
}

fn terminals(events: &[Value]) -> Vec<&str> {
    events
        .iter()
        .filter_map(|e| e["type"].as_str())
        .filter(|t| *t == "RUN_FINISHED" || *t == "RUN_ERROR")
        .collect()
}

fn r(v: Value) -> Item {
    Item::Result(v)
}

#[tokio::test]
async fn a_turn_makes_its_ids_durable_and_finishes_once() {
    let h = harness().await;
    let c = h.ctx("t1");
    h.kernel.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task(
                "task-1",
                &c,
                "TASK_STATE_SUBMITTED",
                json!({"iacCodeSessionId": "s1"}),
            )),
            r(items::text("task-1", &c, "hi", "m1", json!({}))),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_COMPLETED",
                json!({}),
            )),
        ]),
    );
    let ev = events(h.run(h.request("t1", "r1", None)).await).await;
    assert_eq!(terminals(&ev), ["RUN_FINISHED"]);
    assert_eq!(ev.last().unwrap()["outcome"]["type"], "success");
    let doc =
        h.rt.threads()
            .store()
            .documents()
            .load("t1")
            .await
            .unwrap()
            .unwrap();
    assert_eq!(doc.session_id.as_deref(), Some("s1"));
    let last = doc.last_run.clone().unwrap();
    assert_eq!(
        (last.run_id.as_str(), &last.outcome),
        ("r1", &RunOutcome::Success.into())
    );
    assert!(
        doc.is_terminal(&doc.execution.execution_id),
        "a completed turn ends its execution"
    );
    assert!(h.kernel.calls("CancelTask").is_empty());
}

#[tokio::test]
async fn a_task_that_changes_identity_fails_the_run_and_is_cancelled() {
    let h = harness().await;
    let c = h.ctx("t1");
    h.kernel.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task("task-1", &c, "TASK_STATE_WORKING", json!({}))),
            r(items::status("task-2", &c, "TASK_STATE_WORKING", json!({}))),
        ]),
    );
    let ev = events(h.run(h.request("t1", "r1", None)).await).await;
    assert_eq!(terminals(&ev), ["RUN_ERROR"]);
    assert_eq!(ev.last().unwrap()["code"], "A2A_PROTOCOL_ERROR");
    let cancels = h.kernel.calls("CancelTask");
    assert_eq!(cancels.len(), 1, "cancelled once");
    assert_eq!(cancels[0].body["params"]["id"], "task-1");
}

#[tokio::test]
async fn an_interrupt_is_durable_before_the_run_ends_with_it() {
    let h = harness().await;
    let c = h.ctx("t1");
    interrupt(&h, &c).await;
    let doc =
        h.rt.threads()
            .store()
            .documents()
            .load("t1")
            .await
            .unwrap()
            .unwrap();
    assert_eq!(doc.execution.pending.len(), 1);
    assert_eq!(doc.last_run.unwrap().outcome, RunOutcome::Interrupt.into());
    assert!(
        h.kernel.calls("CancelTask").is_empty(),
        "the task waits for its answer"
    );
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_task_once_known() {
    let h = harness().await;
    let c = h.ctx("t1");
    h.kernel.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task("task-1", &c, "TASK_STATE_WORKING", json!({}))),
            Item::Stall,
        ]),
    );
    let mut rx = h.run(h.request("t1", "r1", None)).await;
    // RUN_STARTED, then the session events: the task is known once the second one is sent.
    let mut seen = 0;
    while seen < 3 {
        rx.recv().await.expect("the run streams");
        seen += 1;
    }
    drop(rx);
    let cancels = h
        .kernel
        .wait_calls("CancelTask", 1, std::time::Duration::from_secs(10))
        .await;
    assert_eq!(cancels.len(), 1);
    // The thread is free again, its last run recorded as disconnected.
    let slot = h.rt.threads().slot("t1");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if slot.lock().await.active().is_none() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the thread stays held"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let doc =
        h.rt.threads()
            .store()
            .documents()
            .load("t1")
            .await
            .unwrap()
            .unwrap();
    assert_eq!(
        doc.last_run.unwrap().outcome,
        RunOutcome::Disconnected.into()
    );
}

/// The kernel's permission request `p1` for tool `tool-1` of `task-1`.
fn permission(c: &str) -> Value {
    json!({"input": {"schemaVersion": 1, "kind": "permission", "requestTaskId": "task-1",
        "contextId": c, "inputId": "p1", "toolUseId": "tool-1", "toolName": "bash",
        "prompt": "Run bash?", "options": [{"id": "allow_once", "label": "Allow once"},
        {"id": "deny", "label": "Deny"}], "required": true}})
}

/// Runs `r1` on `t1` to the permission interrupt `p1`.
async fn interrupt(h: &Harness, c: &str) {
    interrupt_on(h, &h.kernel, c).await
}

/// [`interrupt`], the turn answered by the kernel `k`.
async fn interrupt_on(h: &Harness, k: &FakeKernel, c: &str) {
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task(
                "task-1",
                c,
                "TASK_STATE_SUBMITTED",
                json!({"iacCodeSessionId": "s1"}),
            )),
            r(items::status(
                "task-1",
                c,
                "TASK_STATE_INPUT_REQUIRED",
                permission(c),
            )),
        ]),
    );
    let ev = events(h.run(h.request("t1", "r1", None)).await).await;
    assert_eq!(terminals(&ev), ["RUN_FINISHED"]);
    assert_eq!(
        ev.last().unwrap()["outcome"]["type"],
        "interrupt",
        "{:?}",
        ev.last()
    );
}

/// Answers `p1` of `t1` with `allow_once` in run `r2`, which succeeds.
async fn allowed(h: &Harness) {
    let resume = json!([{"interruptId": "p1", "status": "resolved",
        "payload": {"decision": "allow_once"}}]);
    let ev = events(h.run(h.request("t1", "r2", Some(resume))).await).await;
    assert_eq!(terminals(&ev), ["RUN_FINISHED"], "{ev:?}");
    assert_eq!(ev.last().unwrap()["outcome"]["type"], "success");
}

/// `k` answers a lookup of `task-1` with the task waiting for the permission.
fn waiting_task(k: &FakeKernel, c: &str) {
    k.on(
        "GetTask",
        Reply::Json(
            200,
            items::bare_task("task-1", c, "TASK_STATE_INPUT_REQUIRED", permission(c)),
        ),
    );
}

#[tokio::test]
async fn an_answer_is_delivered_once_and_recorded_before_the_run_goes_on() {
    let h = harness().await;
    let c = h.ctx("t1");
    interrupt(&h, &c).await;
    waiting_task(&h.kernel, &c);
    h.kernel.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::status("task-1", &c, "TASK_STATE_WORKING", json!({}))),
            r(items::status(
                "task-1",
                &c,
                "TASK_STATE_COMPLETED",
                json!({}),
            )),
        ]),
    );
    allowed(&h).await;
    let sent = h.kernel.calls("SendStreamingMessage");
    assert_eq!(sent.len(), 2, "the turn, then the answer once");
    let answer = sent[1].body.to_string();
    assert!(
        answer.contains("allow_once") && answer.contains("tool-1"),
        "{answer}"
    );
    let doc =
        h.rt.threads()
            .store()
            .documents()
            .load("t1")
            .await
            .unwrap()
            .unwrap();
    assert!(doc.execution.pending.is_empty());
    assert!(
        doc.delivering.is_empty(),
        "the mark is cleared with the acceptance"
    );
    assert_eq!(doc.applied_resume_digests.len(), 1);
    assert_eq!(doc.last_run.unwrap().outcome, RunOutcome::Success.into());
}

/// A send blocked on a client that reads nothing returns as soon as the run is stopped: by its
/// cancellation, by its lease lapsing, by the drain (each alone).
#[tokio::test]
async fn a_run_waiting_on_its_client_is_stopped_by_a_cancel_a_lapse_or_the_drain() {
    async fn stopped(stop: &RunStop) -> bool {
        tokio::time::timeout(std::time::Duration::from_millis(50), stop.wait())
            .await
            .is_ok()
    }
    let h = harness().await;
    let lease = store::Lease::new(std::time::Duration::from_secs(15));
    let stop = RunStop {
        rt: h.rt.clone(),
        control: Arc::new(RunControl::default()),
        lapse: Some(lease.watch()),
    };
    assert!(!stopped(&stop).await);
    stop.control.request_cancel();
    assert!(stopped(&stop).await, "cancelled");

    let stop = RunStop {
        control: Arc::new(RunControl::default()),
        ..stop
    };
    assert!(!stopped(&stop).await);
    assert!(lease.check(), "a lease never renewed lapses");
    assert!(stopped(&stop).await, "lapsed");

    let stop = RunStop {
        lapse: None,
        ..stop
    };
    assert!(!stopped(&stop).await);
    h.rt.shutdown().begin();
    assert!(stopped(&stop).await, "drained");
}

/// A turn that the fake kernel `k` ends at once, on task `task` of session `session`.
fn script_turn(k: &FakeKernel, c: &str, task: &str, session: &str) {
    k.on(
        "SendStreamingMessage",
        Reply::Sse(vec![
            r(items::task(
                task,
                c,
                "TASK_STATE_SUBMITTED",
                json!({"iacCodeSessionId": session}),
            )),
            r(items::status(task, c, "TASK_STATE_COMPLETED", json!({}))),
        ]),
    );
}

/// Runs a new turn on `thread`, which finishes.
async fn finished(h: &Harness, thread: &str, run: &str) {
    let ev = events(h.run(h.request(thread, run, None)).await).await;
    assert_eq!(terminals(&ev), ["RUN_FINISHED"], "{ev:?}");
}

/// The kernel `thread` recorded.
async fn key_of(h: &Harness, thread: &str) -> Option<String> {
    let doc =
        h.rt.threads()
            .store()
            .documents()
            .load(thread)
            .await
            .unwrap();
    doc.unwrap().kernel
}

fn turns(k: &FakeKernel) -> usize {
    k.calls("SendStreamingMessage").len()
}

/// With two kernels: a new thread goes to the less loaded and records it; the thread's later
/// turns go there whatever the load; a thread served before kernels were recorded is on the
/// first and gets its key. With one kernel nothing is recorded.
#[tokio::test]
async fn threads_are_placed_on_a_kernel_and_stay_there() {
    let h = harness_of(2).await;
    let (k0, k1) = (&h.kernel, &h.more[0]);
    let store = h.rt.threads().store().clone();
    script_turn(k0, &h.ctx("t1"), "task-1", "s1");
    finished(&h, "t1", "r1").await;
    script_turn(k1, &h.ctx("t2"), "task-2", "s2");
    finished(&h, "t2", "r2").await;
    assert_eq!((turns(k0), turns(k1)), (1, 1));
    let (key0, key1) = (
        key_of(&h, "t1").await.unwrap(),
        key_of(&h, "t2").await.unwrap(),
    );
    assert!(key0.starts_with("url:") && key1.starts_with("url:") && key0 != key1);
    assert!(
        !key0.contains("127.0.0.1"),
        "the URL is not written: {key0}"
    );

    // t1 again, twice: its kernel each time, though the other has had fewer threads since.
    script_turn(k0, &h.ctx("t1"), "task-3", "s1");
    finished(&h, "t1", "r3").await;
    script_turn(k0, &h.ctx("t1"), "task-4", "s1");
    finished(&h, "t1", "r4").await;
    assert_eq!((turns(k0), turns(k1)), (3, 1));
    assert_eq!(key_of(&h, "t1").await.as_deref(), Some(key0.as_str()));

    // A new thread on a tie goes to the first: it has had more threads since.
    script_turn(k0, &h.ctx("t5"), "task-7", "s5");
    finished(&h, "t5", "r7").await;
    assert_eq!((turns(k0), turns(k1)), (4, 1));
    // A thread with a session and no key (one kernel served it): on the first, though the
    // other has had fewer threads.
    let mut legacy = store.documents().load("t2").await.unwrap().unwrap();
    legacy.thread_id = "t3".into();
    legacy.context_id = h.ctx("t3");
    legacy.kernel = None;
    legacy.last_run = None;
    store.documents().save(&legacy).await.unwrap();
    script_turn(k0, &h.ctx("t3"), "task-5", "s2");
    script_turn(k1, &h.ctx("t3"), "task-6", "s2");
    finished(&h, "t3", "r5").await;
    assert_eq!((turns(k0), turns(k1)), (5, 1));
    assert_eq!(key_of(&h, "t3").await.as_deref(), Some(key0.as_str()));

    let one = harness().await;
    script_turn(&one.kernel, &one.ctx("t1"), "task-1", "s1");
    let ev = events(one.run(one.request("t1", "r1", None)).await).await;
    assert_eq!(terminals(&ev), ["RUN_FINISHED"]);
    let doc = one
        .rt
        .threads()
        .store()
        .documents()
        .load("t1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(doc.kernel, None);
}

/// With two kernels: an answer goes to the kernel that holds the task (its lookup, its session
/// restored there, the answer), though the other has had fewer threads; the other is asked
/// nothing.
#[tokio::test]
async fn an_answer_goes_to_the_kernel_that_holds_the_task() {
    let h = harness_of(2).await;
    let (k0, k1) = (&h.kernel, &h.more[0]);
    let c = h.ctx("t1");
    interrupt(&h, &c).await;
    waiting_task(k0, &c);
    k0.on(
        "SendStreamingMessage",
        Reply::Sse(vec![r(items::status(
            "task-1",
            &c,
            "TASK_STATE_COMPLETED",
            json!({}),
        ))]),
    );
    allowed(&h).await;
    assert_eq!(turns(k0), 2);
    assert_eq!(k0.calls("GetTask").len(), 1);
    for method in [
        "SendStreamingMessage",
        "GetTask",
        "CancelTask",
        "SendMessage",
    ] {
        assert!(k1.calls(method).is_empty(), "{method} on the other kernel");
    }
}

/// New threads that start together spread over the kernels: each placement counts the runs
/// the others bound.
#[tokio::test]
async fn new_threads_started_together_spread_over_the_kernels() {
    let h = harness_of(2).await;
    let (k0, k1) = (&h.kernel, &h.more[0]);
    for k in [k0, k1] {
        // Whichever thread comes: the fake kernel's items name their context, not checked here
        // beyond the first item.
        k.on(
            "SendStreamingMessage",
            Reply::Sse(vec![Item::Sleep(std::time::Duration::from_millis(300))]),
        );
    }
    let a = h.run(h.request("ta", "ra", None)).await;
    let b = h.run(h.request("tb", "rb", None)).await;
    let (_, _) = tokio::join!(events(a), events(b));
    assert_eq!((turns(k0), turns(k1)), (1, 1));
    let (ka, kb) = (key_of(&h, "ta").await, key_of(&h, "tb").await);
    assert!(ka.is_some() && kb.is_some() && ka != kb, "{ka:?} {kb:?}");
}

/// With two kernels, the cancellation endpoint asks the kernel the thread is on.
#[tokio::test]
async fn a_cancellation_goes_to_the_threads_kernel() {
    let h = harness_of(2).await;
    let (k0, k1) = (&h.kernel, &h.more[0]);
    // t0 takes the first kernel, so t1 (the interrupted one) is on the second.
    script_turn(k0, &h.ctx("t0"), "task-0", "s0");
    finished(&h, "t0", "r0").await;
    interrupt_on(&h, k1, &h.ctx("t1")).await;
    let doc =
        h.rt.threads()
            .store()
            .documents()
            .load("t1")
            .await
            .unwrap()
            .unwrap();
    let exec = doc.execution.execution_id.clone();
    let caller = crate::caller::Caller::OPEN;
    crate::run::cancel::cancel(&h.rt, &caller, &exec, "t1", "inv-1")
        .await
        .unwrap();
    assert_eq!(k1.calls("CancelTask").len(), 1);
    assert!(k0.calls("CancelTask").is_empty());
}
