//! Runs that survive a dropped connection (`--detach-grace`) and the thread's state for a reloaded
//! page, against the fake kernel: event ids, re-attaching after the last id seen, the grace clock,
//! a full buffer, several readers, the errors and the token of both GET routes, and a restart.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use testkit::fake_kernel::{FakeKernel, Item, Reply, Stream};
use testkit::sse::{assert_valid_run, event_ids, parse, post, RunResult};

use crate::support::{
    assert_cancelled_once, body, client, ctx, detaching_gateway, http_get, post_json, post_turn,
    post_turn_as, spawn_post, Builder, TestServer,
};

const GRACE: Duration = Duration::from_secs(3);

/// A turn of 2 × `n` text deltas and a tool call, `pause` between the deltas, ending completed.
fn script(thread: &str, n: usize, pause: Duration) -> Reply {
    let c = ctx(thread);
    let deltas = |s: Stream, prefix: &str, message: &str| {
        (0..n).fold(s, |s, i| {
            s.text(&format!("{prefix}{i} "), message)
                .then(Item::Sleep(pause))
        })
    };
    let start = Stream::of("task-1", &c).submitted(json!({"iacCodeSessionId": "sess"}));
    let tool = deltas(start, "a", "m1")
        .working(json!({"tool": {"status": "input_complete", "toolUseId": "tu1", "name": "bash", "toolInput": {"c": "ls"}}}))
        .working(json!({"tool": {"status": "completed", "toolUseId": "tu1", "result": "ok"}}));
    deltas(tool, "b", "m2").completed().reply()
}

/// Starts a run and reads its stream until `keep` events arrived, then drops the connection.
/// Returns the raw text read (whole event blocks only).
async fn start_and_drop(s: &TestServer, b: &Value, keep: usize) -> String {
    let resp = post_json(&s.url, b, &[]).await;
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut raw = String::new();
    while parse(&raw).0.len() < keep {
        match stream.next().await {
            Some(Ok(chunk)) => raw.push_str(&String::from_utf8_lossy(&chunk)),
            _ => break,
        }
    }
    drop(stream);
    // Whole blocks only: what a client would have handled.
    let cut = raw
        .match_indices("\n\n")
        .map(|(i, _)| i + 2)
        .filter(|end| parse(&raw[..*end]).0.len() <= keep)
        .last()
        .unwrap_or(0);
    raw[..cut].to_owned()
}

fn events_url(s: &TestServer, thread: &str, run: &str) -> String {
    format!("{}threads/{thread}/runs/{run}/events", s.url)
}

/// `GET` the events after `last` (as `Last-Event-ID`); the status and the whole body.
async fn reattach(
    s: &TestServer,
    thread: &str,
    run: &str,
    last: Option<u64>,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut req = client().get(events_url(s, thread, run));
    if let Some(l) = last {
        req = req.header("last-event-id", l.to_string());
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

fn run_result(raw: String) -> RunResult {
    let (events, heartbeats) = parse(&raw);
    RunResult {
        status: 200,
        content_type: "text/event-stream; charset=utf-8".into(),
        headers: vec![],
        events,
        heartbeats,
        raw,
        json: None,
    }
}

/// The events without what differs between two runs of the same script.
fn shapes(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .map(|e| {
            let mut e = e.clone();
            let o = e.as_object_mut().unwrap();
            for k in ["timestamp", "threadId", "runId"] {
                o.remove(k);
            }
            if let Some(v) = o.get_mut("value").and_then(Value::as_object_mut) {
                for k in ["threadId", "contextId", "executionId", "aguiRunId"] {
                    v.remove(k);
                }
            }
            e
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_connection_reattaches_and_the_joined_stream_is_the_run() {
    let k = FakeKernel::start().await;
    let s = detaching_gateway(&k, GRACE).await;
    // The run as a client that stays sees it.
    k.on(
        "SendStreamingMessage",
        script("whole", 6, Duration::from_millis(15)),
    );
    let whole = post_turn(&s.url, "whole", "r1", "go", &s.ws("whole")).await;
    assert_valid_run(&whole, "whole", "r1");
    let total = whole.events.len();
    // Drops at points across the run (from right after RUN_STARTED to just before the end),
    // re-attaching after the last id seen.
    let seed: u64 = std::env::var("REATTACH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand_seed);
    println!("REATTACH_SEED={seed}");
    let mut x = seed;
    for round in 0..6 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let keep = 1 + (x >> 33) as usize % (total - 1);
        let thread = format!("cut-{round}");
        k.on(
            "SendStreamingMessage",
            script(&thread, 6, Duration::from_millis(15)),
        );
        let seen = start_and_drop(
            &s,
            &body(&thread, "r1", "go", &s.ws(&thread), json!({})),
            keep,
        )
        .await;
        let last = event_ids(&seen).last().copied().flatten();
        assert_eq!(last, Some(keep as u64), "round {round}: {seen}");
        let (status, rest) = reattach(&s, &thread, "r1", last, &[]).await;
        assert_eq!(status, 200, "{rest}");
        let joined = run_result(format!("{seen}{rest}"));
        assert_valid_run(&joined, &thread, "r1");
        assert_eq!(
            shapes(&joined.events),
            shapes(&whole.events),
            "seed {seed}, round {round}, cut after {keep}"
        );
    }
    // Nothing was cancelled: every run finished.
    assert!(k.calls("CancelTask").is_empty());
}

fn rand_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_client_for_the_grace_period_the_run_is_cancelled() {
    let k = FakeKernel::start().await;
    let s = detaching_gateway(&k, Duration::from_millis(600)).await;
    k.on(
        "SendStreamingMessage",
        script("g1", 200, Duration::from_millis(20)),
    );
    let seen = start_and_drop(&s, &body("g1", "r1", "go", &s.ws("g1"), json!({})), 4).await;
    // Still running, detached: the thread is held and says so.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let t = thread_state(&s, "g1").await;
    assert_eq!(t["activeRun"]["runId"], "r1", "{t}");
    assert_eq!(t["activeRun"]["state"], "detached", "{t}");
    k.on("SendStreamingMessage", script("g1", 1, Duration::ZERO));
    let busy = post_turn(&s.url, "g1", "r2", "again", &s.ws("g1")).await;
    assert_eq!(busy.error_code(), Some("THREAD_BUSY"));
    assert!(
        k.calls("CancelTask").is_empty(),
        "cancelled within the grace"
    );
    // Then the grace runs out: the task is cancelled as on a disconnect.
    let cancels = k.wait_calls("CancelTask", 1, Duration::from_secs(5)).await;
    assert_eq!(cancels[0].body["params"]["id"], "task-1");
    // A late reader still gets a whole run: balanced, one terminal event.
    let last = event_ids(&seen).last().copied().flatten();
    let (status, rest) = reattach(&s, "g1", "r1", last, &[]).await;
    assert_eq!(status, 200);
    let joined = run_result(format!("{seen}{rest}"));
    assert_valid_run(&joined, "g1", "r1");
    assert_eq!(joined.last()["code"], "CANCELLED", "{}", joined.raw);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = thread_state(&s, "g1").await;
    assert!(t["activeRun"].is_null(), "{t}");
    assert_eq!(t["lastRun"]["outcome"], "disconnected", "{t}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_within_the_grace_keeps_the_run_alive() {
    let k = FakeKernel::start().await;
    let s = detaching_gateway(&k, Duration::from_millis(500)).await;
    k.on(
        "SendStreamingMessage",
        script("k1", 40, Duration::from_millis(25)),
    );
    let seen = start_and_drop(&s, &body("k1", "r1", "go", &s.ws("k1"), json!({})), 3).await;
    // Re-attached within the grace and reading for longer than the grace: not cancelled.
    let last = event_ids(&seen).last().copied().flatten();
    let (status, rest) = reattach(&s, "k1", "r1", last, &[]).await;
    assert_eq!(status, 200);
    let joined = run_result(format!("{seen}{rest}"));
    assert_valid_run(&joined, "k1", "r1");
    assert_eq!(joined.last()["outcome"]["type"], "success");
    assert!(k.calls("CancelTask").is_empty());
    // Ended: the buffer stays for the grace period; a reader that saw everything gets 204 (an
    // EventSource then stops reconnecting), one that missed the end gets it.
    let n = joined.events.len() as u64;
    assert_eq!(reattach(&s, "k1", "r1", Some(n), &[]).await.0, 204);
    let (status, tail) = reattach(&s, "k1", "r1", Some(n - 1), &[]).await;
    assert_eq!((status, parse(&tail).0.len()), (200, 1));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (status, gone) = reattach(&s, "k1", "r1", Some(n - 1), &[]).await;
    assert_eq!(status, 410, "{gone}");
    assert_eq!(
        serde_json::from_str::<Value>(&gone).unwrap()["error"]["code"],
        "RUN_EVENTS_GONE"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_kernel_against_a_full_buffer_keeps_memory_bounded_and_gets_410() {
    let k = FakeKernel::start().await;
    // The grace only has to outlast the run (4,000 events without a reader, in a debug build on
    // two shared cores: about 5 s at worst); nothing here waits for it to expire.
    let s = Builder::for_fake(&k)
        .config(move |c| c.detach_grace = Duration::from_secs(60))
        .config(move |c| c.replay_buffer_bytes = 4096)
        .start()
        .await;
    k.on("SendStreamingMessage", script("f1", 2000, Duration::ZERO));
    let seen = start_and_drop(&s, &body("f1", "r1", "go", &s.ws("f1"), json!({})), 2).await;
    // Let the run finish without a client.
    let events = loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = thread_state(&s, "f1").await;
        if t["activeRun"].is_null() {
            break t;
        }
    };
    assert_eq!(events["lastRun"]["outcome"], "success", "{events}");
    let last = event_ids(&seen).last().copied().flatten();
    let (status, body) = reattach(&s, "f1", "r1", last, &[]).await;
    assert_eq!(status, 410, "{body}");
    // What the buffer holds is the tail of the run, within its size.
    let ev = s
        .state
        .rt
        .replays()
        .get(&iac_code_agui::auth::Caller::OPEN, "f1", "r1")
        .expect("buffered");
    let n = ev.last_id();
    assert!(n > 4000, "{n}");
    let tail = ev.read_after(n - 10).unwrap();
    assert_eq!(tail.frames.len(), 10);
    let mut from = n - 10;
    while from > 0 && ev.read_after(from - 1).is_ok() {
        from -= 1;
    }
    let kept: usize = ev
        .read_after(from)
        .unwrap()
        .frames
        .iter()
        .map(|f| f.len())
        .sum();
    assert!(kept <= 4096, "{kept} bytes kept");
    let (status, end) = reattach(&s, "f1", "r1", Some(n - 3), &[]).await;
    assert_eq!((status, parse(&end).0.len()), (200, 3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_readers_follow_one_run() {
    let k = FakeKernel::start().await;
    let s = detaching_gateway(&k, GRACE).await;
    k.on(
        "SendStreamingMessage",
        script("c1", 20, Duration::from_millis(20)),
    );
    let seen = start_and_drop(&s, &body("c1", "r1", "go", &s.ws("c1"), json!({})), 2).await;
    let readers = (0..4).map(|i| {
        let s_url = events_url(&s, "c1", "r1");
        async move {
            // Staggered: each starts at a different point of the run.
            tokio::time::sleep(Duration::from_millis(60 * i)).await;
            let resp = client()
                .get(&s_url)
                .header("last-event-id", "2")
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            resp.text().await.unwrap()
        }
    });
    let outs = futures_util::future::join_all(readers).await;
    for out in &outs {
        let joined = run_result(format!("{seen}{out}"));
        assert_valid_run(&joined, "c1", "r1");
        assert_eq!(
            &joined.events[2..],
            &run_result(format!("{seen}{}", outs[0])).events[2..]
        );
    }
}

#[tokio::test]
async fn both_routes_take_the_token_and_answer_clear_errors() {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k)
        .auth("tok")
        .config(move |c| c.detach_grace = GRACE)
        .start()
        .await;
    let auth = [("authorization", "Bearer tok")];
    let get = |url: String, headers: Vec<(&'static str, String)>| async move {
        let mut req = client().get(url);
        for (k, v) in headers {
            req = req.header(k, v);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (
            status,
            serde_json::from_str::<Value>(&text).unwrap_or(Value::Null),
        )
    };
    let tok = || vec![("authorization", "Bearer tok".to_owned())];
    for (url, allow) in [
        (format!("{}threads/t1", s.url), "GET, HEAD, PATCH, DELETE"),
        (events_url(&s, "t1", "r1"), "GET, HEAD"),
    ] {
        let (status, v) = get(url.clone(), vec![]).await;
        assert_eq!(
            (status, &v["error"]["code"]),
            (401, &json!("UNAUTHORIZED")),
            "{url}"
        );
        let (status, v) = get(url.clone(), vec![("authorization", "Bearer nope".into())]).await;
        assert_eq!(status, 401, "{url}: {v}");
        let (status, v) = get(url.clone(), tok()).await;
        assert_eq!(
            (status, &v["error"]["code"]),
            (404, &json!("THREAD_NOT_FOUND")),
            "{url}"
        );
        let r = client().post(&url).send().await.unwrap();
        assert_eq!(
            (r.status().as_u16(), r.headers()["allow"].to_str().unwrap()),
            (405, allow)
        );
    }
    k.on("SendStreamingMessage", script("t1", 1, Duration::ZERO));
    let done = post_turn_as(&s.url, "t1", "r1", "go", &s.ws("t1"), &auth).await;
    assert_valid_run(&done, "t1", "r1");
    let (status, v) = get(events_url(&s, "t1", "r9"), tok()).await;
    assert_eq!(
        (status, &v["error"]["code"]),
        (404, &json!("RUN_NOT_FOUND"))
    );
    for bad in ["x", "-1", "1.5"] {
        let (status, v) = get(
            events_url(&s, "t1", "r1"),
            [tok(), vec![("last-event-id", bad.into())]].concat(),
        )
        .await;
        assert_eq!(
            (status, &v["error"]["code"]),
            (400, &json!("INVALID_INPUT")),
            "{bad}"
        );
        assert_eq!(
            v["error"]["message"],
            "Last-Event-ID must be the id of an event of this run."
        );
    }
    let (status, v) = get(format!("{}?after=999", events_url(&s, "t1", "r1")), tok()).await;
    assert_eq!(status, 400, "{v}");
    // German error text.
    let (_, v) = get(
        events_url(&s, "t1", "r9"),
        [tok(), vec![("accept-language", "de".into())]].concat(),
    )
    .await;
    assert_eq!(
        v["error"]["message"],
        "Der AG-UI-Lauf wurde nicht gefunden."
    );
    // The whole run from the start, with the token.
    let (status, text) = reattach(&s, "t1", "r1", None, &auth).await;
    assert_eq!(status, 200);
    assert_eq!(parse(&text).0, done.events);
}

#[tokio::test]
async fn without_a_grace_nothing_is_buffered_and_a_disconnect_cancels() {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k).start().await;
    k.on("SendStreamingMessage", script("z1", 1, Duration::ZERO));
    let done = post_turn(&s.url, "z1", "r1", "go", &s.ws("z1")).await;
    assert_valid_run(&done, "z1", "r1");
    let (status, v) = reattach(&s, "z1", "r1", None, &[]).await;
    assert_eq!(status, 410, "{v}");
    k.on(
        "SendStreamingMessage",
        script("z2", 100, Duration::from_millis(20)),
    );
    start_and_drop(&s, &body("z2", "r1", "go", &s.ws("z2"), json!({})), 3).await;
    assert_cancelled_once(&k).await;
}

async fn thread_state(s: &TestServer, thread: &str) -> Value {
    let r = http_get(format!("{}threads/{thread}", s.url)).await;
    assert_eq!(r.status(), 200);
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

#[tokio::test]
async fn the_thread_endpoint_reports_binding_interrupts_and_runs_and_a_restart() {
    let k = FakeKernel::start().await;
    let s = detaching_gateway(&k, GRACE).await;
    let c = ctx("p1");
    k.stream(
        Stream::of("task-1", &c)
            .submitted(json!({"iacCodeSessionId": "sess"}))
            .input_required(json!({"input": {"schemaVersion": 1.0, "kind": "permission",
            "requestTaskId": "task-1", "contextId": c, "inputId": "perm-1", "toolUseId": "tu1", "toolName": "bash",
            "prompt": "Run bash Allow once?", "title": "Run bash", "options": [{"id": "allow_once", "label": "Allow once"}, {"id": "deny", "label": "Deny"}],
            "language": "en", "required": true}})),
    );
    let mut b = body(
        "p1",
        "r1",
        "go",
        &s.ws("p1"),
        json!({"userId": "u-7", "llmApiKey": "sk-secret"}),
    );
    b["forwardedProps"]["iacCode"]["alibabaCloud"] =
        json!({"accessKeyId": "AK", "accessKeySecret": "very-secret"});
    let res = post(&s.url, &b, &[]).await;
    assert_eq!(res.last()["outcome"]["type"], "interrupt", "{}", res.raw);
    let t = thread_state(&s, "p1").await;
    assert_eq!(t["threadId"], "p1");
    assert_eq!(t["binding"], json!({"cwd": s.ws("p1"), "userId": "u-7"}));
    assert!(t["activeRun"].is_null());
    // The same interrupt objects the run ended with, expiresAt included.
    assert_eq!(
        t["pendingInterrupts"],
        res.last()["outcome"]["interrupts"],
        "{t}"
    );
    assert!(t["pendingInterrupts"][0]["expiresAt"].is_string());
    assert_eq!(t["lastRun"]["runId"], "r1");
    assert_eq!(t["lastRun"]["outcome"], "interrupt");
    // A store of one instance: no holder to name.
    assert!(t.get("heldBy").is_none(), "{t}");
    let text = t.to_string();
    for secret in ["sk-secret", "very-secret", "AK"] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    // A running turn, then a restart while it runs: the thread says the run was lost.
    k.on(
        "SendStreamingMessage",
        script("q1", 100, Duration::from_millis(20)),
    );
    let running = spawn_post(&s.url, body("q1", "r1", "go", &s.ws("q1"), json!({})));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = thread_state(&s, "q1").await;
    assert_eq!(
        (&t["activeRun"]["runId"], &t["activeRun"]["state"]),
        (&json!("r1"), &json!("running")),
        "{t}"
    );
    assert!(t["activeRun"]["since"].is_string());
    // A crash now: the state dir as the process left it (the thread file, copied while the run
    // holds the thread), opened by a new gateway.
    let file = s.thread_file("q1");
    let rel = file.strip_prefix(s.state_dir()).unwrap().to_owned();
    let dir2 = tempfile::tempdir().unwrap();
    let d2 = dir2.path().canonicalize().unwrap();
    let copy = d2.join("state").join(&rel);
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    std::fs::copy(&file, &copy).unwrap();
    let s2 = Builder::for_fake(&k)
        .dir(d2)
        .config(move |c| c.detach_grace = GRACE)
        .start()
        .await;
    let t = thread_state(&s2, "q1").await;
    assert!(t["activeRun"].is_null(), "{t}");
    assert_eq!(
        (&t["lastRun"]["runId"], &t["lastRun"]["outcome"]),
        (&json!("r1"), &json!("lost")),
        "{t}"
    );
    let done = running.await.unwrap();
    assert_valid_run(&done, "q1", "r1");
}

/// A restart (graceful) ends detached runs as it ends every run: the kernel task is cancelled, the
/// thread reports how the run ended, and its events are gone with the process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_cancels_detached_runs_and_the_thread_says_so() {
    let k = FakeKernel::start().await;
    let s = detaching_gateway(&k, Duration::from_secs(30)).await;
    k.on(
        "SendStreamingMessage",
        script("h1", 300, Duration::from_millis(20)),
    );
    start_and_drop(&s, &body("h1", "r1", "go", &s.ws("h1"), json!({})), 3).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        thread_state(&s, "h1").await["activeRun"]["state"],
        "detached"
    );
    let dir = s.stop().await;
    let cancels = k.wait_calls("CancelTask", 1, Duration::from_secs(5)).await;
    assert_eq!(cancels[0].body["params"]["id"], "task-1");
    let s2 = Builder::for_fake(&k)
        .dir(dir)
        .config(move |c| c.detach_grace = GRACE)
        .start()
        .await;
    let t = thread_state(&s2, "h1").await;
    assert!(t["activeRun"].is_null(), "{t}");
    assert_eq!(t["lastRun"]["runId"], "r1");
    assert_eq!(t["lastRun"]["outcome"], "error", "{t}");
    assert_eq!(t["lastRun"]["code"], "A2A_UNAVAILABLE", "{t}");
    let (status, v) = reattach(&s2, "h1", "r1", Some(3), &[]).await;
    assert_eq!(status, 410, "{v}");
}
