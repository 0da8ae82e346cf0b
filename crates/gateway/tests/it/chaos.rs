//! Kernel chaos: the test kit's proxy sits between the gateway and a fake or real kernel and cuts,
//! stalls, delays, truncates, corrupts, errors or restarts it. Whatever happens, every stream ends
//! with exactly one terminal event and balanced spans within a bound, the thread is released (a
//! next run on it works), no kernel task is left running and no kernel connection is left open.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::chaos::{ChaosProxy, Fault, Match};
use testkit::fake_kernel::{FakeKernel, Item, Reply, Stream};
use testkit::real_kernel::{alive, KernelEnv, KernelProcess};
use testkit::sse::{assert_valid_run, post, RunResult};

use crate::support::{body, ctx, post_turn, spawn_post, Builder, TestServer};

/// The kernel watchdog of these tests (`--kernel-idle-timeout`).
const IDLE: Duration = Duration::from_secs(1);

/// A normal turn of 8 frames: task, six text deltas (paced), input-required.
fn turn(thread: &str) -> Stream {
    let c = ctx(thread);
    let start = Stream::of("task-1", &c).submitted(json!({"iacCodeSessionId": "sess-1"}));
    (0..6)
        .fold(start, |s, i| {
            s.then(Item::Sleep(Duration::from_millis(20)))
                .text(&format!("d{i} "), "m1")
        })
        .input_required(json!({}))
}

struct Rig {
    kernel: FakeKernel,
    proxy: ChaosProxy,
    server: TestServer,
}

async fn rig() -> Rig {
    rig_idle(IDLE).await
}

/// A rig whose kernel watchdog is `idle`.
async fn rig_idle(idle: Duration) -> Rig {
    let kernel = FakeKernel::start().await;
    let proxy = ChaosProxy::start(&kernel.url()).await;
    let server = Builder::new()
        .a2a(&proxy.url(), Some("a2a-secret"))
        .config(move |c| c.kernel_idle_timeout = idle)
        .start()
        .await;
    Rig {
        kernel,
        proxy,
        server,
    }
}

async fn run(s: &TestServer, thread: &str, run_id: &str) -> (RunResult, Duration) {
    let t = Instant::now();
    let res = post_turn(&s.url, thread, run_id, "x", &s.ws("w")).await;
    assert_valid_run(&res, thread, run_id);
    (res, t.elapsed())
}

/// No response is left open in the proxy (the gateway closed every kernel stream).
async fn assert_no_open_kernel_stream(p: &ChaosProxy) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while p.open_responses() > 0 {
        assert!(Instant::now() < deadline, "a kernel stream was left open");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn every_fault_ends_the_run_once_and_releases_the_thread() {
    let garbage = b"data: \xff\xfe{\"jsonrpc\r\n\r\n".to_vec();
    let stream_fault = |f: Fault| (Match::method("SendStreamingMessage"), f);
    // (fault, expected terminal code or "success", task reached the kernel and must be cancelled)
    let cases: Vec<(&str, (Match, Fault), &str, bool)> = vec![
        (
            "cut",
            stream_fault(Fault::Cut { after: 3 }),
            "A2A_UNAVAILABLE",
            true,
        ),
        (
            "cut before any event",
            stream_fault(Fault::Cut { after: 0 }),
            "A2A_UNAVAILABLE",
            false,
        ),
        (
            "stall",
            stream_fault(Fault::Stall { after: 3 }),
            "A2A_UNAVAILABLE",
            true,
        ),
        (
            "stall before any event",
            stream_fault(Fault::Stall { after: 0 }),
            "A2A_UNAVAILABLE",
            false,
        ),
        (
            "delay",
            stream_fault(Fault::Delay(Duration::from_millis(40))),
            "success",
            false,
        ),
        (
            "truncated frame",
            stream_fault(Fault::Truncate { after: 3 }),
            "A2A_UNAVAILABLE",
            true,
        ),
        (
            "clean end mid-task",
            stream_fault(Fault::End { after: 3 }),
            "A2A_EXECUTION_FAILED",
            true,
        ),
        (
            "garbage frame",
            stream_fault(Fault::Garbage {
                after: 3,
                bytes: garbage,
            }),
            "A2A_UNAVAILABLE",
            true,
        ),
        (
            "JSON-RPC error in the stream",
            stream_fault(Fault::StreamRpcError {
                after: 3,
                code: -32603,
                message: "boom".into(),
            }),
            "A2A_UNAVAILABLE",
            true,
        ),
        (
            "JSON-RPC error instead of the stream",
            stream_fault(Fault::RpcError {
                code: -32603,
                message: "boom".into(),
            }),
            "A2A_UNAVAILABLE",
            false,
        ),
        (
            "HTTP 503",
            stream_fault(Fault::Status(503)),
            "A2A_UNAVAILABLE",
            false,
        ),
    ];
    for (what, (m, fault), expect, cancels) in cases {
        let rig = rig().await;
        let forwarded = !matches!(fault, Fault::RpcError { .. } | Fault::Status(_));
        if forwarded {
            rig.kernel.on("SendStreamingMessage", turn("t1"));
        }
        rig.proxy.inject(m, fault, 1);
        let (res, took) = run(&rig.server, "t1", "r1").await;
        let got = if res.last()["type"] == "RUN_FINISHED" {
            res.last()["outcome"]["type"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        } else {
            res.last()["code"].as_str().unwrap_or("").to_owned()
        };
        assert_eq!(got, expect, "{what}: {}", res.raw);
        assert!(
            took < IDLE + Duration::from_secs(4),
            "{what}: took {took:?}"
        );
        let cancelled = rig
            .kernel
            .wait_calls(
                "CancelTask",
                1,
                Duration::from_secs(if cancels { 5 } else { 0 }),
            )
            .await;
        if cancels {
            assert_eq!(cancelled.len(), 1, "{what}: the task is cancelled");
            assert_eq!(cancelled[0].body["params"]["id"], "task-1", "{what}");
        } else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(
                rig.kernel.calls("CancelTask").is_empty(),
                "{what}: nothing to cancel"
            );
        }
        assert_no_open_kernel_stream(&rig.proxy).await;
        // The thread is released: the next run on it goes through.
        rig.kernel.on("SendStreamingMessage", turn("t1"));
        let (next, _) = run(&rig.server, "t1", "r2").await;
        assert_eq!(
            next.last()["outcome"]["type"],
            "success",
            "{what}: {}",
            next.raw
        );
        assert_eq!(next.of("TEXT_MESSAGE_CONTENT").len(), 6, "{what}");
    }
}

#[tokio::test]
async fn a_kernel_restart_mid_run_ends_it_and_the_new_kernel_serves_the_next_turn() {
    // A watchdog far beyond the test: the restart, not a silence, ends the run (with the 1 s one a
    // busy machine could let the watchdog cancel the task at the old kernel first).
    let rig = rig_idle(Duration::from_secs(60)).await;
    let c = ctx("t1");
    rig.kernel.stream(
        Stream::of("task-1", &c)
            .submitted(json!({"iacCodeSessionId": "sess-1"}))
            .text("partial ", "m1")
            .then(Item::Stall),
    );
    let url = rig.server.url.clone();
    let ws = rig.server.ws("w");
    let pending = tokio::spawn(async move { post_turn(&url, "t1", "r1", "x", &ws).await });
    while rig.kernel.items_written() < 2 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The gateway has learnt the task (made durable before anything is announced): a restart
    // that cut the stream before the gateway read its first item would leave it no task to
    // cancel.
    let learnt = Instant::now();
    while rig.server.thread_doc("t1")["execution"]["taskId"] != "task-1" {
        assert!(
            learnt.elapsed() < Duration::from_secs(10),
            "task never learnt"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The kernel "restarts" on a new address: open streams are cut, requests go to the new one.
    let fresh = FakeKernel::start().await;
    let t = Instant::now();
    rig.proxy.restart(&fresh.url());
    let res = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("run ends")
        .unwrap();
    assert_valid_run(&res, "t1", "r1");
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE", "{}", res.raw);
    assert!(t.elapsed() < Duration::from_secs(3));
    // The gateway tries to cancel the task where the kernel now is (nothing is left running).
    let cancels = fresh
        .wait_calls("CancelTask", 1, Duration::from_secs(5))
        .await;
    assert_eq!(cancels.len(), 1, "{cancels:?}");
    assert_eq!(cancels[0].body["params"]["id"], "task-1");
    assert!(rig.kernel.calls("CancelTask").is_empty());
    assert_no_open_kernel_stream(&rig.proxy).await;
    fresh.on("SendStreamingMessage", turn("t1"));
    let (next, _) = run(&rig.server, "t1", "r2").await;
    assert_eq!(next.last()["outcome"]["type"], "success", "{}", next.raw);
}

#[tokio::test]
async fn a_kernel_that_is_down_fails_runs_fast_and_they_work_again_once_it_is_up() {
    let rig = rig().await;
    rig.proxy.down();
    for i in 0..3 {
        let (res, took) = run(&rig.server, "t1", &format!("r{i}")).await;
        assert_eq!(res.last()["code"], "A2A_UNAVAILABLE", "{}", res.raw);
        assert!(took < Duration::from_secs(3), "{took:?}");
    }
    rig.proxy.up(&rig.kernel.url());
    rig.kernel.on("SendStreamingMessage", turn("t1"));
    let (res, _) = run(&rig.server, "t1", "r9").await;
    assert_eq!(res.last()["outcome"]["type"], "success", "{}", res.raw);
}

// ------------------------------------------------------------------ the real kernel

/// The task id a run's session events reported.
fn task_of(res: &RunResult) -> String {
    res.sessions()
        .iter()
        .rev()
        .find_map(|s| s["taskId"].as_str())
        .unwrap_or_else(|| panic!("no task id: {}", res.raw))
        .to_owned()
}

/// Polls the kernel (directly, not through the proxy) until `task` is in a terminal state.
async fn wait_terminal(kernel: &a2a::Client, task: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let state = kernel
            .get_task(task, 0)
            .await
            .map(|t| {
                t.as_value()["status"]["state"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .unwrap_or_default();
        if matches!(
            state.as_str(),
            "TASK_STATE_CANCELED" | "TASK_STATE_COMPLETED" | "TASK_STATE_FAILED"
        ) {
            return state;
        }
        assert!(Instant::now() < deadline, "task {task} still {state}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_kernel_cut_stall_and_restart() {
    let env = KernelEnv::new().await;
    let mut kp = KernelProcess::start(&env).await;
    let proxy = ChaosProxy::start(&kp.url()).await;
    // Above the kernel's 15 s ping interval: a slow first turn on a loaded machine is silent
    // until its first ping.
    let idle = Duration::from_secs(20);
    let s = Builder::in_env(&env)
        .a2a(&proxy.url(), Some(&kp.token))
        .config(move |c| c.kernel_idle_timeout = idle)
        .start()
        .await;
    let w = env.ws().join("w");
    std::fs::create_dir_all(&w).unwrap();
    let w = w.display().to_string();
    let direct = |kp: &KernelProcess| {
        a2a::Client::new(&kp.url(), Some(kp.token.clone()), a2a::Timeouts::default())
    };
    let turn = |run: &str, text: &str| body("k1", run, text, &w, json!({}));

    // A first, clean turn.
    let res = post(&s.url, &turn("r0", "Hi. scenario:text"), &[]).await;
    assert_valid_run(&res, "k1", "r0");
    assert_eq!(res.last()["outcome"]["type"], "success", "{}", res.raw);

    // Cut: the stream breaks after a few events of a long answer.
    proxy.inject(
        Match::method("SendStreamingMessage"),
        Fault::Cut { after: 4 },
        1,
    );
    let t = Instant::now();
    let res = post(&s.url, &turn("r1", "Slow. scenario:slow"), &[]).await;
    assert_valid_run(&res, "k1", "r1");
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE", "{}", res.raw);
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    let task = task_of(&res);
    assert_eq!(
        wait_terminal(&direct(&kp), &task).await,
        "TASK_STATE_CANCELED"
    );
    assert_no_open_kernel_stream(&proxy).await;

    // Stall: the kernel stream goes silent (no events, no pings); the watchdog ends the run.
    proxy.inject(
        Match::method("SendStreamingMessage"),
        Fault::Stall { after: 4 },
        1,
    );
    let t = Instant::now();
    let res = post(&s.url, &turn("r2", "Slow. scenario:slow"), &[]).await;
    assert_valid_run(&res, "k1", "r2");
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE", "{}", res.raw);
    assert!(
        t.elapsed() < idle + Duration::from_secs(15),
        "{:?}",
        t.elapsed()
    );
    let task = task_of(&res);
    assert_eq!(
        wait_terminal(&direct(&kp), &task).await,
        "TASK_STATE_CANCELED"
    );
    assert_no_open_kernel_stream(&proxy).await;

    // The thread still works.
    let res = post(&s.url, &turn("r3", "Again. scenario:text"), &[]).await;
    assert_valid_run(&res, "k1", "r3");
    assert_eq!(res.last()["outcome"]["type"], "success", "{}", res.raw);

    // Kernel restart (SIGKILL) mid-run: the run ends, and the new kernel serves the thread.
    let pending = spawn_post(&s.url, turn("r4", "Slow. scenario:slow"));
    proxy
        .wait_calls("SendStreamingMessage", 4, Duration::from_secs(20))
        .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let old = kp.pid();
    proxy.down();
    kp.restart(&env).await;
    assert!(!alive(old), "the killed kernel is gone");
    proxy.up(&kp.url());
    let res = tokio::time::timeout(Duration::from_secs(30), pending)
        .await
        .expect("the run ends")
        .unwrap();
    assert_valid_run(&res, "k1", "r4");
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE", "{}", res.raw);
    assert_no_open_kernel_stream(&proxy).await;
    let res = post(&s.url, &turn("r5", "After restart. scenario:text"), &[]).await;
    assert_valid_run(&res, "k1", "r5");
    assert_eq!(res.last()["outcome"]["type"], "success", "{}", res.raw);
}

// ------------------------------------------------ answers delivered twice (crash recovery)

fn perm_input(thread: &str) -> Value {
    json!({"schemaVersion": 1.0, "kind": "permission", "requestTaskId": "task-1", "contextId": ctx(thread),
        "inputId": "perm-1", "toolUseId": "tu1", "toolName": "bash", "prompt": "Run bash?", "required": true})
}

/// A first run that ends in the permission interrupt `perm-1`.
async fn interrupted(rig: &Rig, thread: &str) {
    let c = ctx(thread);
    rig.kernel.stream(
        Stream::of("task-1", &c)
            .submitted(json!({"iacCodeSessionId": "sess-1"}))
            .input_required(json!({"input": perm_input(thread)})),
    );
    let (res, _) = run(&rig.server, thread, "r1").await;
    assert_eq!(res.last()["outcome"]["type"], "interrupt", "{}", res.raw);
}

fn task_reply(thread: &str, state: &str, meta: Value) -> Reply {
    Reply::task("task-1", &ctx(thread), state, meta)
}

async fn resume(rig: &Rig, thread: &str, run_id: &str) -> RunResult {
    let b = crate::support::resume_body(
        thread,
        run_id,
        &rig.server.ws("w"),
        "inv-1",
        json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]),
    );
    let res = post(&rig.server.url, &b, &[]).await;
    assert_valid_run(&res, thread, run_id);
    res
}

#[tokio::test]
async fn an_answer_the_kernel_already_had_is_settled_from_the_task() {
    let rig = rig().await;
    // The kernel acknowledges the answer as a duplicate (a crashed run delivered it) and closes
    // the stream; the task had finished its turn: the run succeeds, the tool is not re-run.
    interrupted(&rig, "t1").await;
    let c = ctx("t1");
    rig.kernel.on(
        "GetTask",
        task_reply(
            "t1",
            "TASK_STATE_INPUT_REQUIRED",
            json!({"input": perm_input("t1")}),
        ),
    );
    rig.kernel.stream(
        Stream::of("task-1", &c)
            .working(json!({"inputReceived": {"kind": "permission", "inputId": "perm-1", "toolUseId": "tu1", "decision": "allow_once", "recovered": true, "duplicate": true}})),
    );
    // The stale projection still shows the answered permission: it is not raised again.
    rig.kernel.on(
        "GetTask",
        task_reply(
            "t1",
            "TASK_STATE_INPUT_REQUIRED",
            json!({"input": perm_input("t1")}),
        ),
    );
    let res = resume(&rig, "t1", "r2").await;
    assert_eq!(res.last()["outcome"]["type"], "success", "{}", res.raw);
    assert!(rig.server.thread_doc("t1")["execution"]["pending"]
        .as_object()
        .is_none_or(|p| p.is_empty()));
    assert!(rig.kernel.calls("SubscribeToTask").is_empty());

    // The task stays "working" (the kernel can leave that state behind a duplicate): the run
    // ends, bounded, with RESUME_ALREADY_APPLIED; the answer stays applied; a new turn works.
    interrupted(&rig, "t2").await;
    let c2 = ctx("t2");
    rig.kernel.on(
        "GetTask",
        task_reply(
            "t2",
            "TASK_STATE_INPUT_REQUIRED",
            json!({"input": perm_input("t2")}),
        ),
    );
    rig.kernel.stream(
        Stream::of("task-1", &c2)
            .working(json!({"permissionAck": {"schemaVersion": 1, "kind": "permission_ack", "inputId": "perm-1", "toolUseId": "tu1", "decision": "allow_once", "accepted": true}})),
    );
    for _ in 0..40 {
        rig.kernel
            .on("GetTask", task_reply("t2", "TASK_STATE_WORKING", json!({})));
    }
    let t = Instant::now();
    let res = resume(&rig, "t2", "r2").await;
    assert_eq!(res.last()["code"], "RESUME_ALREADY_APPLIED", "{}", res.raw);
    assert!(t.elapsed() < Duration::from_secs(9), "{:?}", t.elapsed());
    assert!(rig.server.thread_doc("t2")["execution"]["pending"]
        .as_object()
        .is_none_or(|p| p.is_empty()));
    let res = resume(&rig, "t2", "r3").await;
    assert_eq!(
        res.last()["code"],
        "RESUME_ALREADY_APPLIED",
        "a replay is refused: {}",
        res.raw
    );
    rig.kernel.on("SendStreamingMessage", turn("t2"));
    let (next, _) = run(&rig.server, "t2", "r4").await;
    assert_eq!(next.last()["outcome"]["type"], "success", "{}", next.raw);
}

#[tokio::test]
async fn a_stream_that_closes_while_its_task_works_is_followed() {
    let rig = rig().await;
    interrupted(&rig, "t1").await;
    let c = ctx("t1");
    rig.kernel.on(
        "GetTask",
        task_reply(
            "t1",
            "TASK_STATE_INPUT_REQUIRED",
            json!({"input": perm_input("t1")}),
        ),
    );
    rig.kernel.stream(
        Stream::of("task-1", &c)
            .working(json!({"inputReceived": {"kind": "permission", "inputId": "perm-1", "toolUseId": "tu1", "decision": "allow_once"}}))
            .text("Running ", "m2"),
    );
    rig.kernel
        .on("GetTask", task_reply("t1", "TASK_STATE_WORKING", json!({})));
    rig.kernel.on(
        "SubscribeToTask",
        Stream::of("task-1", &c)
            .text("done.", "m2")
            .input_required(json!({})),
    );
    let res = resume(&rig, "t1", "r2").await;
    assert_eq!(res.last()["outcome"]["type"], "success", "{}", res.raw);
    let text: String = res
        .of("TEXT_MESSAGE_CONTENT")
        .iter()
        .map(|e| e["delta"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(text, "Running done.");
    assert_eq!(rig.kernel.calls("SubscribeToTask").len(), 1);
    assert!(rig.kernel.calls("CancelTask").is_empty());
}

#[tokio::test]
async fn an_answer_refused_while_its_earlier_delivery_runs_is_settled() {
    let rig = rig().await;
    // (thread, how the kernel refuses the repeated answer)
    let refusals = [
        ("t1", Reply::Sse(vec![])),
        (
            "t2",
            Reply::Json(
                200,
                json!({"error": {"code": -32602, "message": "permission_resume_invalid: pending permission is not active."}}),
            ),
        ),
    ];
    for (thread, refusal) in refusals {
        interrupted(&rig, thread).await;
        cut_delivery(&rig, thread, "r1b").await;
        rig.kernel.on(
            "GetTask",
            task_reply(
                thread,
                "TASK_STATE_INPUT_REQUIRED",
                json!({"input": perm_input(thread)}),
            ),
        );
        rig.kernel.on("SendStreamingMessage", refusal);
        // The task works on the earlier delivery, then finishes its turn.
        rig.kernel.on(
            "GetTask",
            task_reply(thread, "TASK_STATE_WORKING", json!({})),
        );
        rig.kernel.on(
            "GetTask",
            task_reply(thread, "TASK_STATE_WORKING", json!({})),
        );
        rig.kernel.on(
            "GetTask",
            task_reply(
                thread,
                "TASK_STATE_INPUT_REQUIRED",
                json!({"input": perm_input(thread)}),
            ),
        );
        let res = resume(&rig, thread, "r2").await;
        assert_eq!(
            res.last()["outcome"]["type"],
            "success",
            "{thread}: {}",
            res.raw
        );
        assert!(rig.server.thread_doc(thread)["execution"]["pending"]
            .as_object()
            .is_none_or(|p| p.is_empty()));
        let res = resume(&rig, thread, "r3").await;
        assert_eq!(
            res.last()["code"],
            "RESUME_ALREADY_APPLIED",
            "{thread}: {}",
            res.raw
        );
    }
    // Refused while the task waits for input: really not accepted, the interrupt stays pending.
    interrupted(&rig, "t3").await;
    rig.kernel.on(
        "GetTask",
        task_reply(
            "t3",
            "TASK_STATE_INPUT_REQUIRED",
            json!({"input": perm_input("t3")}),
        ),
    );
    rig.kernel.on("SendStreamingMessage", Reply::Sse(vec![]));
    rig.kernel.on(
        "GetTask",
        task_reply(
            "t3",
            "TASK_STATE_INPUT_REQUIRED",
            json!({"input": perm_input("t3")}),
        ),
    );
    let res = resume(&rig, "t3", "r2").await;
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE", "{}", res.raw);
    assert!(rig.server.thread_doc("t3")["execution"]["pending"]["perm-1"].is_object());
}

/// The task waits for the permission; the kernel refuses the next answer to it (an empty
/// stream).
fn refuse_next_answer(rig: &Rig, thread: &str) {
    rig.kernel.on("GetTask", waiting_for_permission(thread));
    rig.kernel.on("SendStreamingMessage", Reply::Sse(vec![]));
}

/// A task snapshot waiting for the thread's permission.
fn waiting_for_permission(thread: &str) -> Reply {
    task_reply(
        thread,
        "TASK_STATE_INPUT_REQUIRED",
        json!({"input": perm_input(thread)}),
    )
}

/// A resume whose delivery is cut before the kernel answers: its answer stays marked as on its
/// way (a crashed run leaves the same mark).
async fn cut_delivery(rig: &Rig, thread: &str, run_id: &str) {
    rig.kernel.on("GetTask", waiting_for_permission(thread));
    rig.kernel
        .on("SendStreamingMessage", Reply::Sse(vec![Item::Cut]));
    let res = resume(rig, thread, run_id).await;
    assert!(res.last()["type"] == "RUN_ERROR", "{}", res.raw);
    let doc = rig.server.thread_doc(thread);
    assert_eq!(
        doc["deliveringAnswers"][0]["interruptId"], "perm-1",
        "{doc}"
    );
}

/// An answer an earlier run sent and lost track of (its stream broke before its first event):
/// the kernel carried it out and the task completed before the answer was sent again. The
/// repeated answer is refused, the task has moved past the interrupt: the kernel had the
/// answer, which is settled as applied (the tool is not run again). The same refusal for an
/// answer nobody sent before is a real refusal: the interrupt stays pending. An answer sent
/// before whose task goes on listing the interrupt: the kernel took the earlier delivery and
/// shows nothing of it; the answer is recorded as applied and never sent again, the run says so
/// (`RESUME_ALREADY_APPLIED`, its own message) and leaves the task as it is.
#[tokio::test]
async fn an_answer_refused_after_its_earlier_delivery_completed_is_settled() {
    let rig = rig().await;
    for (thread, sent_before, moved_past) in
        [("t1", true, true), ("t2", false, true), ("t4", true, false)]
    {
        interrupted(&rig, thread).await;
        if sent_before {
            // The first delivery is lost on the way (no answer from the kernel): it stays
            // marked as on its way.
            cut_delivery(&rig, thread, "r2").await;
        }
        refuse_next_answer(&rig, thread);
        if moved_past {
            // Looked at once after the refusal, and once more to end the run from it (never
            // for an answer nobody sent before: its refusal stands at once).
            for _ in 0..if sent_before { 2 } else { 0 } {
                rig.kernel.on(
                    "GetTask",
                    task_reply(thread, "TASK_STATE_COMPLETED", json!({})),
                );
            }
        } else {
            // The task goes on listing the interrupt (the kernel took the earlier delivery and
            // shows nothing of it): looked at until the wait ends.
            for _ in 0..30 {
                rig.kernel.on("GetTask", waiting_for_permission(thread));
            }
        }
        let res = resume(&rig, thread, "r3").await;
        let doc = rig.server.thread_doc(thread);
        if !moved_past {
            assert_eq!(res.last()["code"], "RESUME_ALREADY_APPLIED", "{}", res.raw);
            assert!(res.raw.contains("An earlier delivery"), "{}", res.raw);
            assert_eq!(doc["appliedResumeDigests"][0]["interruptId"], "perm-1");
            assert!(doc.get("deliveringAnswers").is_none(), "{doc}");
            assert!(
                rig.kernel.calls("CancelTask").is_empty(),
                "the task is left as it is"
            );
            // The same answer again: already applied, nothing sent.
            let sent = rig.kernel.calls("SendStreamingMessage").len();
            let again = resume(&rig, thread, "r4").await;
            assert_eq!(
                again.last()["code"],
                "RESUME_ALREADY_APPLIED",
                "{}",
                again.raw
            );
            assert_eq!(rig.kernel.calls("SendStreamingMessage").len(), sent);
        } else if sent_before {
            assert_eq!(
                res.last()["outcome"]["type"],
                "success",
                "{thread}: {}",
                res.raw
            );
            assert_eq!(doc["appliedResumeDigests"][0]["interruptId"], "perm-1");
            assert!(doc.get("deliveringAnswers").is_none(), "{doc}");
            assert!(doc["execution"]["pending"]
                .as_object()
                .is_none_or(|p| p.is_empty()));
        } else {
            assert_eq!(res.last()["code"], "A2A_UNAVAILABLE", "{}", res.raw);
            assert!(doc["execution"]["pending"]["perm-1"].is_object(), "{doc}");
            assert_eq!(doc["appliedResumeDigests"], json!([]), "{doc}");
        }
    }
    // Sent before, and the task lists nothing (a restarted kernel's summary): nothing can be
    // told either way. The run ends unavailable; the answer stays pending and stays marked.
    // (A rig of its own: the kernel above has replies left.)
    let rig = self::rig().await;
    interrupted(&rig, "t5").await;
    cut_delivery(&rig, "t5", "r2").await;
    refuse_next_answer(&rig, "t5");
    for _ in 0..30 {
        rig.kernel.on(
            "GetTask",
            task_reply("t5", "TASK_STATE_INPUT_REQUIRED", json!({})),
        );
    }
    let res = resume(&rig, "t5", "r3").await;
    assert_eq!(res.last()["code"], "A2A_UNAVAILABLE", "{}", res.raw);
    let doc = rig.server.thread_doc("t5");
    assert!(doc["execution"]["pending"]["perm-1"].is_object(), "{doc}");
    assert_eq!(
        doc["deliveringAnswers"][0]["interruptId"], "perm-1",
        "{doc}"
    );
    assert_eq!(doc["appliedResumeDigests"], json!([]), "{doc}");
}

/// Another answer than the one an earlier run sent: refused while the task carries the earlier
/// one out, it is a conflict (`RESUME_ALREADY_APPLIED`), not recorded as applied, and the
/// earlier answer's mark stays for the resume that settles it.
#[tokio::test]
async fn a_different_answer_refused_while_the_earlier_one_runs_is_a_conflict() {
    let rig = rig().await;
    interrupted(&rig, "t1").await;
    cut_delivery(&rig, "t1", "r2").await;
    refuse_next_answer(&rig, "t1");
    rig.kernel
        .on("GetTask", task_reply("t1", "TASK_STATE_WORKING", json!({})));
    let deny = crate::support::resume_body(
        "t1",
        "r3",
        &rig.server.ws("w"),
        "inv-1",
        json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "deny"}}]),
    );
    let res = post(&rig.server.url, &deny, &[]).await;
    assert_valid_run(&res, "t1", "r3");
    assert_eq!(res.last()["code"], "RESUME_ALREADY_APPLIED", "{}", res.raw);
    let doc = rig.server.thread_doc("t1");
    assert_eq!(doc["appliedResumeDigests"], json!([]), "{doc}");
    let marks = doc["deliveringAnswers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(marks.len(), 1, "only the earlier answer's mark: {doc}");
    assert!(rig.kernel.calls("CancelTask").is_empty());
}
