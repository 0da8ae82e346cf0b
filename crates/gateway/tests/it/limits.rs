//! The bounds on concurrent work, each driven past its cap: a flood of idle connections, one run
//! more than `--max-runs`, a client leaving when `--max-detached-runs` are detached, one reader
//! more than `--max-readers-per-run`, one guidance run more than `--max-guidance-per-thread`.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{json, Value};
use testkit::fake_kernel::{FakeKernel, Item, Reply, Stream};
use testkit::sse::{assert_valid_run, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::{
    body, capped_gateway, ctx, http_get, metric, png_base64, post_json, post_turn, Builder,
    TestServer,
};

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// `GET /health` on a fresh connection to `url`'s address: the status line, or `None` when no
/// answer came within `limit`.
async fn health(url: &str, limit: Duration) -> Option<String> {
    let addr = url.trim_start_matches("http://").trim_end_matches('/');
    let ask = async {
        let mut c = tokio::net::TcpStream::connect(addr).await.ok()?;
        c.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.ok()?;
        let text = String::from_utf8_lossy(&out).into_owned();
        text.lines().next().map(str::to_owned)
    };
    tokio::time::timeout(limit, ask).await.ok().flatten()
}

/// Queues `thread`'s next kernel turn: it starts its task and then stays open until the
/// gateway goes.
fn hold(k: &FakeKernel, thread: &str, task: &str) {
    let held = Stream::of(task, &ctx(thread))
        .task("TASK_STATE_WORKING", json!({"iacCodeSessionId": "s"}))
        .then(Item::Stall);
    k.on_context("SendStreamingMessage", &ctx(thread), held);
}

/// A kernel turn for `thread` that completes at once.
fn quick(thread: &str, task: &str) -> Reply {
    let c = ctx(thread);
    Stream::of(task, &c)
        .task("TASK_STATE_WORKING", json!({}))
        .completed()
        .reply()
}

/// Starts a run and reads its stream until its first event: the run is being served. The stream
/// is returned (dropping it is the client leaving).
async fn start(
    s: &TestServer,
    b: &Value,
) -> impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> {
    start_with(s, b, &[]).await
}

/// [`start`], with the request's `headers`.
async fn start_with(
    s: &TestServer,
    b: &Value,
    headers: &[(&str, &str)],
) -> impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> {
    let resp = post_json(&s.url, b, headers).await;
    assert_eq!(resp.status(), 200, "admitted");
    let mut stream = Box::pin(resp.bytes_stream());
    stream.next().await.expect("a first event").unwrap();
    stream
}

/// Retries `f` every 50 ms for up to 5 s until it is true.
async fn eventually(mut f: impl AsyncFnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Idle connections over `--max-connections` wait in the accept queue: the gateway holds no task
/// for them, the admin listener's `/health` answers throughout, and the public one answers as
/// soon as the flood goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_connections_over_the_cap_waits_and_health_still_answers() {
    const CAP: usize = 4;
    const FLOOD: usize = 200;
    let s = Builder::new()
        .caps(|c| c.max_connections = CAP)
        .admin()
        .start()
        .await;
    let admin = s.admin_url.clone().unwrap();
    assert!(health(&s.url, Duration::from_secs(5)).await.is_some());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let tasks0 = alive_tasks();

    let addr = s.url.trim_start_matches("http://").trim_end_matches('/');
    let mut flood = Vec::with_capacity(FLOOD);
    for _ in 0..FLOOD {
        // Once the accept queue is full too, a connect waits in its SYN retries: the flood is
        // as large as it gets.
        let connect = tokio::net::TcpStream::connect(addr);
        match tokio::time::timeout(Duration::from_millis(500), connect).await {
            Ok(c) => flood.push(c.unwrap()),
            Err(_) => break,
        }
    }
    assert!(flood.len() > 25 * CAP, "{} connections", flood.len());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let tasks1 = alive_tasks();
    assert!(
        tasks1 <= tasks0 + CAP + 2,
        "{} idle connections cost {} tasks (cap {CAP})",
        flood.len(),
        tasks1 - tasks0
    );
    assert!(metric(&s, "agui_limit_reached_total{limit=\"connections\"}") >= 1.0);
    // The operator's probe answers while the public listener is full; the public one does not.
    let t = Instant::now();
    assert_eq!(
        health(&admin, Duration::from_secs(2)).await.as_deref(),
        Some("HTTP/1.1 200 OK")
    );
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(health(&s.url, Duration::from_millis(500)).await, None);
    // The flood goes: the public listener serves again.
    drop(flood);
    assert_eq!(
        health(&s.url, Duration::from_secs(10)).await.as_deref(),
        Some("HTTP/1.1 200 OK")
    );
    assert!(
        eventually(async || alive_tasks() <= tasks0 + 2).await,
        "the flood's connections are gone"
    );
}

/// `--max-runs 2`: with two runs held open, a third is refused 503 `TOO_MANY_RUNS` with
/// `Retry-After`, before its workspace, the store or the kernel is touched; once one ends, a new
/// run is admitted.
#[tokio::test]
async fn the_run_over_the_cap_is_refused_before_anything_is_touched() {
    let (s, k) = capped_gateway(Duration::ZERO, |c| c.max_runs = 2).await;
    for t in ["t1", "t2"] {
        hold(&k, t, &format!("task-{t}"));
    }
    let first = start(&s, &body("t1", "r1", "x", &s.ws("w1"), json!({}))).await;
    let _second = start(&s, &body("t2", "r2", "x", &s.ws("w2"), json!({}))).await;

    let third = body("t3", "r3", "x", &s.ws("w3"), json!({}));
    let res = post(&s.url, &third, &[]).await;
    assert_eq!(res.status, 503, "{}", res.raw);
    assert_eq!(res.error_code(), Some("TOO_MANY_RUNS"));
    assert!(res.content_type.starts_with("application/json"));
    let retry = res.headers.iter().find(|(k, _)| k == "retry-after");
    assert_eq!(retry.map(|(_, v)| v.as_str()), Some("5"));
    // Nothing is left behind: no workspace, no thread state, no kernel call.
    assert!(
        !std::path::Path::new(&s.ws("w3")).exists(),
        "workspace created"
    );
    assert!(!s.thread_file("t3").exists(), "thread state written");
    assert_eq!(k.calls("SendStreamingMessage").len(), 2);
    assert_eq!(metric(&s, "agui_limit_reached_total{limit=\"runs\"}"), 1.0);

    // One run ends (its client leaves): the next run is admitted.
    drop(first);
    k.wait_calls("CancelTask", 1, Duration::from_secs(5)).await;
    k.on_context("SendStreamingMessage", &ctx("t3"), quick("t3", "task-t3"));
    let admitted = eventually(async || {
        let res = post(&s.url, &third, &[]).await;
        if res.status == 200 {
            assert_valid_run(&res, "t3", "r3");
            assert_eq!(res.last()["type"], "RUN_FINISHED");
        }
        res.status == 200
    })
    .await;
    assert!(admitted, "a slot came back when a run ended");
}

/// `--max-runs-per-user 1`: with alice's run held open, her second is refused 429
/// `TOO_MANY_USER_RUNS` with `Retry-After`, before anything is touched, while bob's run and a run
/// of the service token acting for nobody are admitted; once hers ends, she runs again.
#[tokio::test]
async fn a_users_run_over_their_cap_is_refused_and_others_still_run() {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k)
        .auth("svc")
        .caps(|c| c.max_runs_per_user = 1)
        .start()
        .await;
    let as_user = |user: &'static str| [("authorization", "Bearer svc"), ("x-iac-code-user", user)];
    for t in ["t1", "t2", "t3"] {
        hold(&k, t, &format!("task-{t}"));
    }
    let hers = start_with(
        &s,
        &body("t1", "r1", "x", &s.ws("w1"), json!({})),
        &as_user("alice"),
    )
    .await;

    let again = body("t4", "r4", "x", &s.ws("w4"), json!({}));
    let res = post(&s.url, &again, &as_user("alice")).await;
    assert_eq!(res.status, 429, "{}", res.raw);
    assert_eq!(res.error_code(), Some("TOO_MANY_USER_RUNS"));
    let retry = res.headers.iter().find(|(k, _)| k == "retry-after");
    assert_eq!(retry.map(|(_, v)| v.as_str()), Some("5"));
    assert!(
        !std::path::Path::new(&s.ws("w4")).exists(),
        "workspace created"
    );
    assert!(!s.thread_file("t4").exists(), "thread state written");
    assert_eq!(
        metric(&s, "agui_limit_reached_total{limit=\"user_runs\"}"),
        1.0
    );

    // Another user, and the service token acting for nobody, have their own room.
    let _his = start_with(
        &s,
        &body("t2", "r2", "x", &s.ws("w2"), json!({})),
        &as_user("bob"),
    )
    .await;
    let nobody = [("authorization", "Bearer svc")];
    let resp = post_json(
        &s.url,
        &body("t3", "r3", "x", &s.ws("w3"), json!({})),
        &nobody,
    )
    .await;
    assert_eq!(
        resp.status(),
        200,
        "a caller without a user is bounded by --max-runs alone"
    );
    drop(resp);

    // Her run ends (she leaves): she is admitted again.
    drop(hers);
    k.on_context("SendStreamingMessage", &ctx("t4"), quick("t4", "task-t4"));
    let admitted = eventually(async || {
        let res = post(&s.url, &again, &as_user("alice")).await;
        if res.status == 200 {
            assert_valid_run(&res, "t4", "r4");
        }
        res.status == 200
    })
    .await;
    assert!(admitted, "her slot came back when her run ended");
}

/// `--max-detached-runs 1`: the first client that leaves leaves its run detached (it goes on,
/// and still counts among `--max-runs`); the second one's run is cancelled at once, as without a
/// grace.
#[tokio::test]
async fn beyond_the_detached_cap_a_client_that_leaves_cancels_its_run() {
    let (s, k) = capped_gateway(Duration::from_secs(60), |c| {
        c.max_detached_runs = 1;
        c.max_runs = 2;
    })
    .await;
    for t in ["t1", "t2", "t3"] {
        hold(&k, t, &format!("task-{t}"));
    }
    let first = start(&s, &body("t1", "r1", "x", &s.ws("w"), json!({}))).await;
    let second = start(&s, &body("t2", "r2", "x", &s.ws("w"), json!({}))).await;

    drop(first);
    let state = |t: &'static str| {
        let url = format!("{}threads/{t}", s.url);
        async move {
            let text = http_get(url).await.text().await.unwrap();
            let v: Value = serde_json::from_str(&text).unwrap();
            v["activeRun"]["state"].as_str().map(str::to_owned)
        }
    };
    assert!(
        eventually(async || state("t1").await.as_deref() == Some("detached")).await,
        "the first run goes on detached"
    );
    drop(second);
    let cancels = k.wait_calls("CancelTask", 1, Duration::from_secs(5)).await;
    assert_eq!(cancels.len(), 1, "the second run is cancelled at once");
    assert_eq!(cancels[0].body["params"]["id"], "task-t2");
    assert!(
        eventually(async || state("t2").await.is_none()).await,
        "its thread is free"
    );
    assert_eq!(
        metric(&s, "agui_limit_reached_total{limit=\"detached_runs\"}"),
        1.0
    );
    // The detached run goes on, and holds its place among the runs.
    assert_eq!(state("t1").await.as_deref(), Some("detached"));
    let _third = start(&s, &body("t3", "r3", "x", &s.ws("w"), json!({}))).await;
    let res = post_turn(&s.url, "t4", "r4", "x", &s.ws("w")).await;
    assert_eq!(res.error_code(), Some("TOO_MANY_RUNS"), "{}", res.raw);
    assert_eq!(
        k.calls("CancelTask").len(),
        1,
        "the detached run was never cancelled"
    );
}

/// `--max-readers-per-run 2`: a third reader of one run's events is refused 429
/// `TOO_MANY_READERS`; once a reader leaves, another may follow.
#[tokio::test]
async fn the_reader_over_the_cap_is_refused() {
    let (s, k) = capped_gateway(Duration::from_secs(60), |c| c.max_readers_per_run = 2).await;
    hold(&k, "t1", "task-1");
    let _run = start(&s, &body("t1", "r1", "x", &s.ws("w"), json!({}))).await;
    let events = format!("{}threads/t1/runs/r1/events?after=0", s.url);
    let read = || async {
        let resp = http_get(&events).await;
        let status = resp.status().as_u16();
        (status, resp)
    };
    let (a, first) = read().await;
    let (b, _second) = read().await;
    assert_eq!((a, b), (200, 200));
    let (c, third) = read().await;
    assert_eq!(c, 429);
    assert_eq!(
        third
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("5")
    );
    let v: Value = serde_json::from_str(&third.text().await.unwrap()).unwrap();
    assert_eq!(v["error"]["code"], "TOO_MANY_READERS");
    assert_eq!(
        metric(&s, "agui_limit_reached_total{limit=\"readers\"}"),
        1.0
    );

    drop(first);
    assert!(
        eventually(async || read().await.0 == 200).await,
        "a reader's place comes back when it leaves"
    );
}

/// `--max-guidance-per-thread 1`: with one guidance run in a thread's running pipeline task, a
/// second is refused 429 `TOO_MANY_GUIDANCE_RUNS` before the store or the kernel is touched;
/// once the first ends, another is admitted.
#[tokio::test]
async fn the_guidance_run_over_the_cap_is_refused() {
    let (s, k) = capped_gateway(Duration::ZERO, |c| c.max_guidance_per_thread = 1).await;
    let c1 = ctx("t1");
    let pipeline = json!({"runMode": "pipeline"});
    let guidance = json!({"runMode": "pipeline", "activeGuidance": true});
    hold(&k, "t1", "task-1");
    let _main = start(&s, &body("t1", "r1", "deploy", &s.ws("w"), pipeline)).await;
    // Guidance needs the task the main run is in.
    k.wait_calls("SendStreamingMessage", 1, Duration::from_secs(5))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // The guidance message's own stream stays open: the guidance run goes on.
    let open = Stream::of("task-1", &c1)
        .working(json!({}))
        .then(Item::Stall)
        .reply();
    k.on_context("SendStreamingMessage", &c1, open);
    let g1 = start(&s, &body("t1", "g1", "a", &s.ws("w"), guidance.clone())).await;

    // The refused one carries an image: refused before it is decoded.
    let mut g2 = body("t1", "g2", "b", &s.ws("w"), guidance);
    g2["messages"][0]["content"] = json!([{"type": "text", "text": "see"},
        {"type": "image", "source": {"type": "data", "value": png_base64(8, 8), "mimeType": "image/png"}}]);
    let decoded = metric(&s, "agui_images_decoded_total");
    let res = post(&s.url, &g2, &[]).await;
    assert_eq!(res.status, 429, "{}", res.raw);
    assert_eq!(
        metric(&s, "agui_images_decoded_total"),
        decoded,
        "decoded before the cap"
    );
    assert_eq!(res.error_code(), Some("TOO_MANY_GUIDANCE_RUNS"));
    assert!(res
        .headers
        .iter()
        .any(|(k, v)| k == "retry-after" && v == "5"));
    assert_eq!(
        k.calls("SendStreamingMessage").len(),
        2,
        "the kernel was not asked"
    );
    assert_eq!(
        metric(&s, "agui_limit_reached_total{limit=\"guidance\"}"),
        1.0
    );

    drop(g1);
    let done = Stream::of("task-1", &c1).working(json!({})).reply();
    k.on_context("SendStreamingMessage", &c1, done);
    let admitted = eventually(async || {
        let res = post(&s.url, &g2, &[]).await;
        if res.status == 200 {
            assert_valid_run(&res, "t1", "g2");
        }
        res.status == 200
    })
    .await;
    assert!(admitted, "a guidance place comes back when its run ends");
    assert!(
        k.calls("CancelTask").is_empty(),
        "guidance never cancels the task"
    );
}
