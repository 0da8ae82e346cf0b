//! `GET /threads/{id}/connect` (fake kernel): a reloaded page gets the thread (a run of its own:
//! `RUN_STARTED · MESSAGES_SNAPSHOT · RUN_FINISHED`, with the pending interrupts), then the
//! running run from its start, then, following, later runs; a reconnect continues after its
//! `Last-Event-ID`. Scoped like every thread route.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use testkit::fake_kernel::{items, FakeKernel, Item, Reply, Stream};
use testkit::sse::{assert_valid_run, parse};

use crate::support::{
    assert_invalid_input, body, capped_gateway, ctx, detaching_gateway, get_as, permission,
    post_turn, spawn_post, Builder, TestServer,
};

/// A turn that says `text` after `pause` and ends (or stops at a permission).
fn script(k: &FakeKernel, thread: &str, task: &str, text: &str, pause: Duration, interrupt: bool) {
    let c = ctx(thread);
    let end = if interrupt {
        items::status(
            task,
            &c,
            "TASK_STATE_INPUT_REQUIRED",
            json!({"input": permission(thread)}),
        )
    } else {
        items::status(task, &c, "TASK_STATE_COMPLETED", json!({}))
    };
    k.stream(
        Stream::of(task, &c)
            .submitted(json!({"iacCodeSessionId": "s"}))
            .text(text, &format!("m-{task}"))
            .then(Item::Sleep(pause))
            .then(Item::Result(end)),
    );
}

/// The whole stream of a connect that ends: its status, events and ids.
async fn connect(
    s: &TestServer,
    thread: &str,
    query: &str,
    last: Option<&str>,
) -> (u16, Vec<Value>, Vec<Option<String>>) {
    let mut rb = reqwest::Client::new().get(format!("{}threads/{thread}/connect{query}", s.url));
    if let Some(l) = last {
        rb = rb.header("last-event-id", l);
    }
    let r = rb.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    if status != 200 {
        return (
            status,
            vec![serde_json::from_str(&text).unwrap_or(Value::Null)],
            vec![],
        );
    }
    let ids = text
        .split("\n\n")
        .filter(|b| b.lines().any(|l| l.starts_with("data:")))
        .map(|b| {
            b.lines()
                .find_map(|l| l.strip_prefix("id: "))
                .map(str::to_owned)
        })
        .collect();
    (status, parse(&text).0, ids)
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn a_reloaded_page_gets_the_thread_then_its_running_and_later_runs() {
    let k = FakeKernel::start().await;
    let s = detaching_gateway(&k, Duration::from_secs(30)).await;
    let ws = s.ws("t1");
    // An ended turn that stopped at a permission: the snapshot and the interrupt.
    script(&k, "t1", "task-1", "Checking.", Duration::ZERO, true);
    let r = post_turn(&s.url, "t1", "r1", "Create a VPC", &ws).await;
    assert_eq!(r.last()["outcome"]["type"], "interrupt");
    let (status, ev, ids) = connect(&s, "t1", "", None).await;
    assert_eq!(status, 200);
    assert_eq!(
        types(&ev),
        ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    );
    assert!(ev[0]["runId"].as_str().unwrap().starts_with("connect-"));
    assert_eq!(ev[0]["threadId"], "t1");
    assert!(
        ev[0].get("protocolVersion").is_none(),
        "the protocol before 1.0"
    );
    assert_eq!(ev[2]["runId"], ev[0]["runId"]);
    let messages = ev[1]["messages"].as_array().unwrap();
    assert_eq!(
        messages[0],
        json!({"id": "msg-r1", "role": "user", "content": "Create a VPC"})
    );
    assert_eq!(messages[1]["content"], "Checking.");
    assert_eq!(ev[2]["outcome"]["type"], "interrupt");
    assert_eq!(ev[2]["outcome"]["interrupts"][0]["id"], "perm-1");
    assert_eq!(ids, [None, None, None]);
    let (_, ev, _) = connect(&s, "t1", "?protocolVersion=1.0", None).await;
    assert_eq!(ev[0]["protocolVersion"], "1.0");

    // A running turn (t2): the snapshot, then the run from its start, ids `<run>:<n>`.
    script(
        &k,
        "t2",
        "task-2",
        "Working.",
        Duration::from_millis(800),
        false,
    );
    script(
        &k,
        "t2",
        "task-3",
        "Again.",
        Duration::from_millis(300),
        false,
    );
    let running = spawn_post(&s.url, body("t2", "r2", "go", &s.ws("t2"), json!({})));
    k.wait_calls("SendStreamingMessage", 2, Duration::from_secs(5))
        .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let follower = {
        let url = format!("{}threads/t2/connect?follow=true", s.url);
        tokio::spawn(async move {
            let r = reqwest::Client::new().get(url).send().await.unwrap();
            let mut body = r.bytes_stream();
            let mut text = String::new();
            // Until the second run's end.
            while text.matches("RUN_FINISHED").count() < 3 {
                let chunk = tokio::time::timeout(Duration::from_secs(10), body.next())
                    .await
                    .expect("the stream goes on")
                    .expect("more")
                    .unwrap();
                text.push_str(std::str::from_utf8(&chunk).unwrap());
            }
            text
        })
    };
    let (status, ev, ids) = connect(&s, "t2", "", None).await;
    assert_eq!(status, 200);
    let first = running.await.unwrap();
    assert_valid_run(&first, "t2", "r2");
    let t = types(&ev);
    assert_eq!(
        &t[..3],
        ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"]
    );
    assert_eq!(ev[1]["messages"], json!([]), "nothing ended yet");
    assert_eq!(ev[2]["outcome"]["type"], "success");
    // The run itself, whole, exactly as its own client got it (ids relabelled).
    assert_eq!(ev[3..].len(), first.events.len());
    for (a, b) in ev[3..].iter().zip(&first.events) {
        assert_eq!(a, b);
    }
    let want: Vec<Option<String>> = (1..=first.events.len())
        .map(|n| Some(format!("r2:{n}")))
        .collect();
    assert_eq!(&ids[3..], &want[..]);

    // A reconnect after `r2:2` while r2 is buffered: the rest of r2, no snapshot.
    let (_, ev, ids) = connect(&s, "t2", "", Some("r2:2")).await;
    assert_eq!(ev.len(), first.events.len() - 2);
    assert_eq!(ids[0].as_deref(), Some("r2:3"));
    assert_eq!(ev.last().unwrap()["type"], "RUN_FINISHED");

    // The follower sees the next run as it starts.
    let r = post_turn(&s.url, "t2", "r3", "more", &s.ws("t2")).await;
    assert_valid_run(&r, "t2", "r3");
    let text = follower.await.unwrap();
    let (ev, _) = parse(&text);
    let starts: Vec<&str> = ev
        .iter()
        .filter(|e| e["type"] == "RUN_STARTED")
        .map(|e| e["runId"].as_str().unwrap())
        .collect();
    assert_eq!(&starts[1..], ["r2", "r3"]);
    assert!(text.contains("id: r3:1\n"));
}

#[tokio::test]
async fn connect_refuses_strangers_and_bad_requests() {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k).auth("tok").start().await;
    let tok = [("authorization", "Bearer tok")];
    let (status, e) = get_as(&format!("{}threads/none/connect", s.url), &tok).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (404, Some("THREAD_NOT_FOUND"))
    );
    let (status, _) = get_as(&format!("{}threads/none/connect", s.url), &[]).await;
    assert_eq!(status, 401);
    for q in [
        "?follow=1",
        "?protocolVersion=9",
        "?follow=true&follow=false",
    ] {
        assert_invalid_input(
            get_as(&format!("{}threads/none/connect{q}", s.url), &tok).await,
            q,
        );
    }
    let r = reqwest::Client::new()
        .get(format!("{}threads/none/connect", s.url))
        .header("authorization", "Bearer tok")
        .header("last-event-id", "7")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

/// A running turn of `deltas` text deltas of 200 bytes each, then `pause`, then its end.
fn long_turn(k: &FakeKernel, thread: &str, task: &str, deltas: usize, pause: Duration) {
    let c = ctx(thread);
    let mut items = vec![Item::Result(items::task(
        task,
        &c,
        "TASK_STATE_SUBMITTED",
        json!({"iacCodeSessionId": "s"}),
    ))];
    for _ in 0..deltas {
        items.push(Item::Result(items::text(
            task,
            &c,
            &"x".repeat(200),
            &format!("m-{task}"),
            json!({}),
        )));
    }
    items.push(Item::Sleep(pause));
    items.push(Item::Result(items::status(
        task,
        &c,
        "TASK_STATE_COMPLETED",
        json!({}),
    )));
    k.on("SendStreamingMessage", Reply::Sse(items));
}

/// A reconnect whose `Last-Event-ID` falls in a part of the run no longer buffered starts over
/// with the snapshot (as when the run is not buffered at all), and a running run whose start is
/// no longer buffered is not followed: never a stream with nothing in it.
#[tokio::test]
async fn a_run_no_longer_buffered_from_the_asked_point_gets_the_snapshot() {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k)
        .config(move |c| c.detach_grace = Duration::from_secs(30))
        .config(move |c| c.replay_buffer_bytes = 4096)
        .start()
        .await;
    long_turn(&k, "t1", "task-1", 60, Duration::from_secs(3));
    let running = spawn_post(&s.url, body("t1", "r1", "go", &s.ws("t1"), json!({})));
    let thread = format!("{}threads/t1", s.url);
    let mut seen = false;
    for _ in 0..100 {
        let (_, v) = get_as(&thread, &[]).await;
        if v["activeRun"]["runId"] == "r1" {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen, "the run did not start");
    // Its 60 deltas are written before the pause: wait for them to be buffered (and the first
    // dropped: 4 KiB hold about 15).
    tokio::time::sleep(Duration::from_millis(500)).await;
    for last in [Some("r1:1"), None] {
        let (status, ev, ids) = connect(&s, "t1", "", last).await;
        assert_eq!(status, 200);
        assert_eq!(
            types(&ev),
            ["RUN_STARTED", "MESSAGES_SNAPSHOT", "RUN_FINISHED"],
            "{last:?}"
        );
        assert_eq!(ids, [None, None, None]);
    }
    assert_valid_run(&running.await.unwrap(), "t1", "r1");
}

/// `--max-readers-per-run 1`: a connect whose first run to follow has all its readers is
/// refused 429 `TOO_MANY_READERS` before its stream starts, not answered with the snapshot and
/// an end.
#[tokio::test]
async fn a_connect_to_a_run_with_all_its_readers_is_refused() {
    let (s, k) = capped_gateway(Duration::from_secs(30), |c| c.max_readers_per_run = 1).await;
    script(
        &k,
        "t1",
        "task-1",
        "Working.",
        Duration::from_secs(3),
        false,
    );
    let running = spawn_post(&s.url, body("t1", "r1", "go", &s.ws("t1"), json!({})));
    k.wait_calls("SendStreamingMessage", 1, Duration::from_secs(5))
        .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The one reader: a connect that follows r1.
    let first = reqwest::Client::new()
        .get(format!("{}threads/t1/connect", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let mut first = first.bytes_stream();
    let mut text = String::new();
    while !text.contains("id: r1:1\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(5), first.next())
            .await
            .expect("r1's events")
            .expect("more")
            .unwrap();
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    for last in [None, Some("r1:1")] {
        let (status, ev, _) = connect(&s, "t1", "", last).await;
        assert_eq!(status, 429, "{last:?}: {ev:?}");
        assert_eq!(ev[0]["error"]["code"], "TOO_MANY_READERS");
    }
    drop(first);
    assert_valid_run(&running.await.unwrap(), "t1", "r1");
}
