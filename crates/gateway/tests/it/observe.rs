//! The observer extension, `POST /extensions/iac-code/v1/executions/{id}/subscribe`, against the
//! fake kernel: the stream (the task's state, then its live updates to one terminal event), its
//! refusals before the stream (each with its status and code; another user's execution exactly
//! an unknown one), and what it leaves alone (no lock, no write, no cancellation).

use std::time::Duration;

use serde_json::{json, Value};
use testkit::fake_kernel::{FakeKernel, Item, Reply, Stream};
use testkit::sse::{assert_valid_run, post, RunResult};

use crate::support::{
    body, client, ctx, permission, post_resume, post_turn, spawn_post, Builder, TestServer,
};

const SVC: &str = "Bearer svc-token";

fn url(s: &TestServer, exec: &str) -> String {
    format!(
        "{}extensions/iac-code/v1/executions/{exec}/subscribe",
        s.url
    )
}

fn as_user(user: &str) -> [(&'static str, String); 2] {
    [
        ("authorization", SVC.to_owned()),
        ("x-iac-code-user", user.to_owned()),
    ]
}

async fn observe(s: &TestServer, exec: &str, b: Value, user: &str) -> RunResult {
    let h = as_user(user);
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    post(&url(s, exec), &b, &h).await
}

fn sub(thread: &str, run: &str, ros: &str) -> Value {
    json!({"threadId": thread, "runId": run, "rosInvocationId": ros})
}

/// A gateway with the service token, and alice's thread `t1` whose run `r1` is live: its task
/// `task-1` streams a text, then nothing (until its client leaves). The run's execution id.
async fn live_run() -> (
    TestServer,
    FakeKernel,
    tokio::task::JoinHandle<RunResult>,
    String,
) {
    live_run_capped(64).await
}

/// [`live_run`] with `--max-runs-per-user per_user`.
async fn live_run_capped(
    per_user: usize,
) -> (
    TestServer,
    FakeKernel,
    tokio::task::JoinHandle<RunResult>,
    String,
) {
    let k = FakeKernel::start().await;
    let s = Builder::new()
        .auth("svc-token")
        .a2a(&k.url(), None)
        .caps(move |c| c.max_runs_per_user = per_user)
        .start()
        .await;
    let c = ctx("t1");
    k.stream(
        Stream::of("task-1", &c)
            .task("TASK_STATE_WORKING", json!({"iacCodeSessionId": "sess-1"}))
            .text("Working on it", "task-1-message")
            .then(Item::Stall),
    );
    let (u, b) = (s.url.clone(), body("t1", "r1", "go", &s.ws("w"), json!({})));
    let run = tokio::spawn(async move {
        let h = as_user("alice");
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        post(&u, &b, &h).await
    });
    // The task is known once it is durable.
    let start = std::time::Instant::now();
    let exec = loop {
        let doc = std::fs::read(s.thread_file("t1"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        if let Some(d) = doc.filter(|d| d["execution"]["taskId"] == "task-1") {
            break d["execution"]["executionId"].as_str().unwrap().to_owned();
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the task never became known"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    (s, k, run, exec)
}

/// An observer of a live run: the run's start under the observer's run id, the session event,
/// the task's state, its live updates, and the interrupt it stops at; its leaving and the run's
/// go on, nothing cancelled, nothing of the thread changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_follows_a_live_execution_to_its_interrupt_and_changes_nothing() {
    let (s, k, run, exec) = live_run().await;
    let c = ctx("t1");
    let before = std::fs::read(s.thread_file("t1")).unwrap();
    k.task_is_working("task-1", &c, json!({"iacCodeSessionId": "sess-1"}));
    k.on(
        "SubscribeToTask",
        Stream::of("task-1", &c)
            .text("Let me run", "task-1-message")
            .working(json!({"tool": {"status": "started", "toolUseId": "tu-1", "name": "bash"}}))
            .input_required(json!({"input": permission("t1")})),
    );
    let b =
        json!({"threadId": "t1", "runId": "r1", "rosInvocationId": "inv-1", "afterSequence": 0});
    let r = observe(&s, &exec, b, "alice").await;
    assert_valid_run(&r, "t1", "r1");
    assert_eq!(
        r.types(),
        [
            "RUN_STARTED",
            "CUSTOM(iac-code.session.v1)",
            "TEXT_MESSAGE_START",
            "TEXT_MESSAGE_CONTENT",
            "TOOL_CALL_START",
            "TOOL_CALL_END",
            "TEXT_MESSAGE_END",
            "RUN_FINISHED"
        ]
    );
    let session = r.sessions()[0];
    assert_eq!(
        (
            &session["executionId"],
            &session["taskId"],
            &session["sessionId"]
        ),
        (&json!(exec), &json!("task-1"), &json!("sess-1"))
    );
    assert_eq!(session["aguiRunId"], "r1");
    let outcome = &r.last()["outcome"];
    assert_eq!(outcome["type"], "interrupt", "{}", r.raw);
    assert_eq!(outcome["interrupts"][0]["id"], permission("t1")["inputId"]);
    // The kernel was asked for the task, then followed it; it was asked nothing else.
    assert_eq!(
        k.calls("GetTask")[0].body["params"],
        json!({"id": "task-1", "historyLength": 100})
    );
    assert_eq!(
        k.calls("SubscribeToTask")[0].body["params"],
        json!({"id": "task-1"})
    );
    assert!(k.calls("CancelTask").is_empty());
    // Nothing of the thread changed, and the run goes on.
    assert_eq!(std::fs::read(s.thread_file("t1")).unwrap(), before);
    assert!(!run.is_finished());
    // An observer that leaves at once cancels nothing either.
    k.task_is_working("task-1", &c, json!({}));
    k.on("SubscribeToTask", Reply::Sse(vec![Item::Stall]));
    let client = client();
    let mut resp = client
        .post(url(&s, &exec))
        .header("authorization", SVC)
        .header("x-iac-code-user", "alice")
        .header("content-type", "application/json")
        .body(sub("t1", "r1", "inv-1").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let first = resp.chunk().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("RUN_STARTED"));
    k.wait_calls("SubscribeToTask", 2, Duration::from_secs(5))
        .await;
    drop(resp);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(k.calls("CancelTask").is_empty());
    assert!(!run.is_finished());
    run.abort();
}

/// The refusals before the stream: the body (400), the caller (401), an unknown or another
/// user's execution (404, byte for byte the same), one without a task (404), another identity
/// (409); a task the kernel does not know (404) and a kernel that does not answer (503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observations_are_refused_before_the_stream_each_with_its_code() {
    let (s, k, run, exec) = live_run().await;
    let code = |r: &RunResult| (r.status, r.error_code().map(str::to_owned));
    for bad in [
        json!({"threadId": "t1", "runId": "r1"}),
        json!({"threadId": "t1", "runId": "r1", "rosInvocationId": "inv-1", "extra": true}),
        json!({"threadId": "t1", "runId": "r1", "rosInvocationId": "inv-1", "afterSequence": "x"}),
        json!(["t1"]),
    ] {
        let r = observe(&s, &exec, bad.clone(), "alice").await;
        assert_eq!(code(&r), (400, Some("INVALID_INPUT".into())), "{bad}");
    }
    let r = post(&url(&s, &exec), &sub("t1", "r1", "inv-1"), &[]).await;
    assert_eq!(code(&r), (401, Some("UNAUTHORIZED".into())));
    // Another user's execution is an unknown one, to the byte.
    let theirs = observe(&s, &exec, sub("t1", "r1", "inv-1"), "bob").await;
    let unknown = observe(&s, &exec, sub("nope", "r1", "inv-1"), "bob").await;
    assert_eq!(code(&theirs), (404, Some("EXECUTION_NOT_FOUND".into())));
    assert_eq!((theirs.status, &theirs.raw), (unknown.status, &unknown.raw));
    // Another execution, invocation, or a run the thread never had.
    for (e, b) in [
        ("exec-other", sub("t1", "r1", "inv-1")),
        (exec.as_str(), sub("t1", "r1", "inv-2")),
        (exec.as_str(), sub("t1", "r9", "inv-1")),
    ] {
        let r = observe(&s, e, b.clone(), "alice").await;
        assert_eq!(
            code(&r),
            (409, Some("EXECUTION_IDENTITY_CHANGED".into())),
            "{e} {b}"
        );
    }
    // The kernel does not know the task; then does not answer.
    k.on(
        "GetTask",
        Reply::Json(
            200,
            json!({"error": {"code": -32001, "message": "Task not found"}}),
        ),
    );
    let r = observe(&s, &exec, sub("t1", "r1", "inv-1"), "alice").await;
    assert_eq!(code(&r), (404, Some("EXECUTION_NOT_FOUND".into())));
    k.on("GetTask", Reply::Json(500, json!({})));
    let r = observe(&s, &exec, sub("t1", "r1", "inv-1"), "alice").await;
    assert_eq!(code(&r), (503, Some("A2A_UNAVAILABLE".into())));
    // None of it touched the task.
    assert!(k.calls("SubscribeToTask").is_empty());
    assert!(k.calls("CancelTask").is_empty());
    run.abort();
    // An execution whose task is not known: not found.
    let k2 = FakeKernel::start().await;
    let s2 = Builder::for_fake(&k2).start().await;
    k2.stream(Stream::of("task-9", &ctx("t2")).completed());
    let done = post_turn(&s2.url, "t2", "r1", "go", &s2.ws("w")).await;
    assert_valid_run(&done, "t2", "r1");
    let exec2 = done.execution_id();
    let r = post(&url(&s2, &exec2), &sub("t2", "r1", "inv-1"), &[]).await;
    assert_eq!(
        code(&r),
        (404, Some("EXECUTION_NOT_FOUND".into())),
        "{}",
        r.raw
    );
}

/// An observer holds a place of its user's runs: with `--max-runs-per-user 1` and alice's run
/// live, her observer is 429 `TOO_MANY_USER_RUNS` with `Retry-After` before the kernel is asked;
/// the service token acting for nobody (bounded by `--max-runs` alone) observes the same run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_over_its_users_run_bound_is_refused() {
    let (s, k, run, exec) = live_run_capped(1).await;
    let r = observe(&s, &exec, sub("t1", "r1", "inv-1"), "alice").await;
    assert_eq!(r.status, 429, "{}", r.raw);
    assert_eq!(r.error_code(), Some("TOO_MANY_USER_RUNS"));
    let retry = r.headers.iter().find(|(k, _)| k == "retry-after");
    assert_eq!(retry.map(|(_, v)| v.as_str()), Some("5"));
    assert!(k.calls("GetTask").is_empty(), "the kernel was asked");
    let nobody = [("authorization", SVC)];
    let (u, b) = (url(&s, &exec), sub("t1", "r1", "inv-1"));
    let watch = tokio::spawn(async move { post(&u, &b, &nobody).await });
    let start = std::time::Instant::now();
    while k.calls("GetTask").is_empty() {
        assert!(start.elapsed() < Duration::from_secs(10), "not observed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    watch.abort();
    run.abort();
}

/// A task that fails while observed ends the stream with one `RUN_ERROR EXECUTION_FAILED` (no
/// `RUN_FINISHED` after it); one that completes, with `RUN_FINISHED` success; a subscription the
/// kernel ends while the task runs, with `RUN_ERROR A2A_UNAVAILABLE`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observation_ends_with_exactly_one_terminal_event() {
    let (s, k, run, exec) = live_run().await;
    let c = ctx("t1");
    let working = || Reply::task("task-1", &c, "TASK_STATE_WORKING", json!({}));
    for (last, terminal, code) in [
        ("TASK_STATE_FAILED", "RUN_ERROR", Some("EXECUTION_FAILED")),
        ("TASK_STATE_COMPLETED", "RUN_FINISHED", None),
        ("TASK_STATE_CANCELED", "RUN_FINISHED", None),
    ] {
        k.on("GetTask", working());
        k.on(
            "SubscribeToTask",
            Stream::of("task-1", &c)
                .text("text", "task-1-message")
                .status(last, json!({})),
        );
        let r = observe(&s, &exec, sub("t1", "r1", "inv-1"), "alice").await;
        assert_valid_run(&r, "t1", "r1");
        assert_eq!(r.last()["type"], terminal, "{last}: {}", r.raw);
        assert_eq!(r.last()["code"].as_str(), code, "{last}");
        let terminals = r
            .events
            .iter()
            .filter(|e| e["type"] == "RUN_ERROR" || e["type"] == "RUN_FINISHED")
            .count();
        assert_eq!(terminals, 1, "{}", r.raw);
    }
    // The subscription ends early and the task is still working: the kernel broke off.
    k.on("GetTask", working());
    k.on("SubscribeToTask", Reply::Sse(vec![]));
    k.on("GetTask", working());
    let r = observe(&s, &exec, sub("t1", "r1", "inv-1"), "alice").await;
    assert_valid_run(&r, "t1", "r1");
    assert_eq!(r.last()["code"], "A2A_UNAVAILABLE", "{}", r.raw);
    // A task already at its end: the snapshot ends it, nothing is followed.
    let subscribed = k.calls("SubscribeToTask").len();
    k.on(
        "GetTask",
        Reply::task("task-1", &c, "TASK_STATE_COMPLETED", json!({})),
    );
    let r = observe(&s, &exec, sub("t1", "r1", "inv-1"), "alice").await;
    assert_valid_run(&r, "t1", "r1");
    assert_eq!(r.last()["outcome"]["type"], "success");
    assert_eq!(k.calls("SubscribeToTask").len(), subscribed);
    assert!(k.calls("CancelTask").is_empty());
    run.abort();
}

/// Against the real kernel (0.16.0, which serves `GetTask` and `SubscribeToTask` as this needs):
/// an observer joins a live turn (carrying a later iac-code's fields, which 0.16.0 ignores) and
/// follows it to its end; one of a turn stopped at a permission gets that interrupt; once the
/// answer ended the execution, there is nothing to observe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_kernels_execution_is_observed_live_and_at_its_interrupt() {
    use crate::real_kernel::{answer, ws};
    use crate::support::{managed, server};
    use testkit::real_kernel::KernelEnv;

    let env = KernelEnv::new().await;
    let s = server(&env, managed(&env).await).await;
    let anon = |u: String, b: Value| async move { post(&u, &b, &[]).await };
    let later = json!({"executionFence": {"version": "session-handoff-v1",
        "owner": {"sandboxId": "sb", "runId": "r", "identityKind": "legacy", "quotaLeaseId": "q"}},
        "guidanceId": "g-1", "inputDigest": "d-1"});
    let w = ws(&env, "o1");
    let run = spawn_post(
        &s.url,
        body("o1", "r1", "Steady. scenario:steady", &w, later),
    );
    let start = std::time::Instant::now();
    let exec = loop {
        let doc = std::fs::read(s.thread_file("o1"))
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok());
        if let Some(d) = doc.filter(|d| d["execution"]["taskId"].is_string()) {
            break d["execution"]["executionId"].as_str().unwrap().to_owned();
        }
        assert!(start.elapsed() < Duration::from_secs(60), "no task");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let seen = anon(url(&s, &exec), sub("o1", "r1", "inv-1")).await;
    assert_valid_run(&seen, "o1", "r1");
    assert_eq!(seen.last()["outcome"]["type"], "success", "{}", seen.raw);
    let text = seen.text();
    assert!(text.contains("step23"), "{text}");
    let r = run.await.unwrap();
    assert_valid_run(&r, "o1", "r1");
    assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
    // The run ended the execution: nothing left to observe.
    let gone = anon(url(&s, &exec), sub("o1", "r1", "inv-1")).await;
    assert_eq!(
        (gone.status, gone.error_code()),
        (404, Some("EXECUTION_NOT_FOUND"))
    );

    // A turn stopped at a permission: the observer ends with the same interrupt.
    let w2 = ws(&env, "o2");
    let r = post_turn(&s.url, "o2", "r1", "Run it. scenario:bash", &w2).await;
    assert_eq!(r.last()["outcome"]["type"], "interrupt", "{}", r.raw);
    let exec2 = r.execution_id();
    let seen = anon(url(&s, &exec2), sub("o2", "r1", "inv-1")).await;
    assert_valid_run(&seen, "o2", "r1");
    assert_eq!(seen.last()["outcome"]["type"], "interrupt", "{}", seen.raw);
    assert_eq!(
        seen.last()["outcome"]["interrupts"][0]["id"],
        r.last()["outcome"]["interrupts"][0]["id"]
    );
    // Answered: the tool ran once (the observer cancelled and delivered nothing).
    let done = post_resume(&s.url, "o2", "r2", &w2, "inv-1", answer(&r, "allow_once")).await;
    assert_eq!(done.last()["outcome"]["type"], "success", "{}", done.raw);
    let out = std::fs::read_to_string(std::path::Path::new(&w2).join("out.txt")).unwrap();
    assert_eq!(out, "agui-test\n");
}
