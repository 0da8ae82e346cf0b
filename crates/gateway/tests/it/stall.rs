//! Clients that stop reading: a raw TCP client with a tiny receive buffer, against a fake kernel
//! that streams 100,000 items. The run ends within the stall timeout (its thread free, its task
//! cancelled, its connection closed), the cancellation extension and the drain end a blocked run
//! at once, and a re-attached reader that stops reading is dropped and no longer holds a
//! detached run.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::fake_kernel::{items, FakeKernel, Item, Stream};
use testkit::sse::assert_valid_run;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{
    assert_cancelled_once, body, ctx, flood, http_get, post_turn, Builder, TestServer,
};

const STALL: Duration = Duration::from_secs(2);
const ITEMS: usize = 100_000;

fn completed(thread: &str) -> Item {
    Item::Result(items::status(
        "task-1",
        &ctx(thread),
        "TASK_STATE_COMPLETED",
        json!({}),
    ))
}

/// A connection to the gateway whose receive buffer is as small as the system allows, so that
/// a client that does not read blocks the server's writes almost at once.
async fn tiny_window(url: &str) -> TcpStream {
    let addr: std::net::SocketAddr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(1024).unwrap();
    socket.connect(&addr.into()).unwrap();
    socket.set_nonblocking(true).unwrap();
    TcpStream::from_std(socket.into()).unwrap()
}

/// Sends `method path` with `body` and reads the start of the answer (its status line), then
/// reads no more: the stalled client.
async fn stalled_request(url: &str, method: &str, path: &str, body: Option<&Value>) -> TcpStream {
    let mut tcp = tiny_window(url).await;
    let body = body.map(Value::to_string).unwrap_or_default();
    let head = format!(
        "{method} /{path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    tcp.write_all(body.as_bytes()).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), tcp.read(&mut buf))
        .await
        .expect("an answer")
        .unwrap();
    assert!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    tcp
}

async fn thread(s: &TestServer, thread: &str) -> Value {
    let r = http_get(format!("{}threads/{thread}", s.url)).await;
    serde_json::from_slice(&r.bytes().await.unwrap()).unwrap()
}

/// Waits (at most `limit`) until `f` holds of the thread's state; returns it and how long.
async fn until(
    s: &TestServer,
    limit: Duration,
    f: impl Fn(&Value) -> bool,
) -> Option<(Value, Duration)> {
    let start = Instant::now();
    while start.elapsed() < limit {
        let t = thread(s, "t1").await;
        if f(&t) {
            return Some((t, start.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Waits for the run to end, which it must within `within` of `start` (`why`: what it ended
/// by); the thread's state then.
async fn ended_within(s: &TestServer, start: Instant, within: Duration, why: &str) -> Value {
    let (t, _) = until(s, within * 2, |t| t["activeRun"].is_null())
        .await
        .unwrap_or_else(|| panic!("the {why} run never ended"));
    assert!(start.elapsed() < within, "{:?}", start.elapsed());
    t
}

/// Waits until the kernel, after it started, stops being read (the run blocked on its client).
async fn until_blocked(k: &FakeKernel) -> usize {
    let mut last = k.items_written();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = k.items_written();
        if now == last && now > 0 {
            return now;
        }
        last = now;
    }
}

/// A run (`t1`, `r1`) of a [`flood`] that then completes, on a gateway with `stall` as its
/// client stall timeout, whose client stopped reading: returned once the server is blocked on it,
/// with the stalled connection and how many items the kernel had written by then.
async fn a_blocked_run(stall: Duration) -> (FakeKernel, TestServer, TcpStream, usize) {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k)
        .config(move |c| c.client_stall_timeout = stall)
        .start()
        .await;
    k.on("SendStreamingMessage", flood("t1", ITEMS, completed("t1")));
    let b = body("t1", "r1", "x", &s.ws("w"), json!({}));
    let client = stalled_request(&s.url, "POST", "", Some(&b)).await;
    let written = until_blocked(&k).await;
    (k, s, client, written)
}

/// A new turn on the thread is admitted and runs to its end.
async fn next_turn_admitted(s: &TestServer, k: &FakeKernel) {
    let c = ctx("t1");
    k.stream(
        Stream::of("task-1", &c)
            .task("TASK_STATE_WORKING", json!({"iacCodeSessionId": "s"}))
            .then(completed("t1")),
    );
    let res = post_turn(&s.url, "t1", "r2", "x", &s.ws("w")).await;
    assert_eq!(res.status, 200, "{:?}", res.json);
    assert_valid_run(&res, "t1", "r2");
    assert_eq!(res.last()["type"], "RUN_FINISHED", "{:?}", res.last());
}

#[tokio::test]
async fn a_client_that_stops_reading_is_gone_after_the_stall_timeout() {
    let (k, s, mut client, written) = a_blocked_run(STALL).await;
    assert!(written < ITEMS, "the kernel was read to its end: {written}");
    let blocked = Instant::now();
    let (t, _) = until(&s, STALL * 5, |t| t["activeRun"].is_null())
        .await
        .expect("the run of a stalled client never ended");
    assert!(
        blocked.elapsed() <= STALL * 3,
        "ended {:?} after the client stalled",
        blocked.elapsed()
    );
    assert_eq!(t["lastRun"]["outcome"], "disconnected", "{t}");
    let cancels = k.wait_calls("CancelTask", 1, Duration::from_secs(5)).await;
    assert_eq!(cancels.len(), 1, "the kernel task was not cancelled");
    assert_eq!(cancels[0].body["params"]["id"], "task-1");
    next_turn_admitted(&s, &k).await;
    // The connection is not kept for the client either: reading now gets what was written
    // before it was closed, then its end, without the end of the chunked body.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => rest.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "the stalled connection was kept open");
    assert!(!rest.ends_with(b"0\r\n\r\n"), "the response was completed");
}

#[tokio::test]
async fn the_cancellation_extension_ends_a_run_blocked_on_its_client_at_once() {
    // A stall timeout far beyond the test: only the cancellation can end the run in time.
    let (k, s, _client, _) = a_blocked_run(Duration::from_secs(600)).await;
    let exec = s.execution_id("t1");
    let start = Instant::now();
    let answer = s.cancel(&exec, "t1", "inv-1").await;
    assert_eq!(
        answer.json.unwrap(),
        json!({"executionId": exec, "status": "cancelled"})
    );
    let t = ended_within(&s, start, Duration::from_secs(30), "cancelled").await;
    // The answer and the run's end agree.
    assert_eq!(t["lastRun"]["outcome"], "cancelled", "{t}");
    assert!(!k.calls("CancelTask").is_empty());
    next_turn_admitted(&s, &k).await;
}

#[tokio::test]
async fn the_drain_ends_a_run_blocked_on_its_client_at_once() {
    // Only the drain can end the run in time.
    let (k, s, _client, _) = a_blocked_run(Duration::from_secs(600)).await;
    let start = Instant::now();
    s.state.rt.shutdown().begin();
    let t = ended_within(&s, start, Duration::from_secs(10), "drained").await;
    assert_eq!(
        (&t["lastRun"]["outcome"], &t["lastRun"]["code"]),
        (&json!("error"), &json!("A2A_UNAVAILABLE")),
        "{t}"
    );
    assert_cancelled_once(&k).await;
}

#[tokio::test]
async fn a_reattached_reader_that_stops_reading_is_dropped_and_lets_the_run_go() {
    let k = FakeKernel::start().await;
    let grace = Duration::from_secs(5);
    let s = Builder::for_fake(&k)
        .config(move |c| c.detach_grace = grace)
        .config(move |c| c.replay_buffer_bytes = 64 << 20)
        .config(move |c| c.client_stall_timeout = STALL)
        .start()
        .await;
    // The kernel keeps the task open after the flood: only the grace ends the run.
    k.on("SendStreamingMessage", flood("t1", ITEMS, Item::Stall));
    let b = body("t1", "r1", "x", &s.ws("w"), json!({}));
    let client = stalled_request(&s.url, "POST", "", Some(&b)).await;
    drop(client);
    until(&s, Duration::from_secs(10), |t| {
        t["activeRun"]["state"] == "detached"
    })
    .await
    .expect("the run did not detach");
    // A reader re-attaches from the start and stops reading: it holds the run attached only
    // until the stall timeout.
    let _reader = stalled_request(&s.url, "GET", "threads/t1/runs/r1/events", None).await;
    let t = thread(&s, "t1").await;
    assert_eq!(t["activeRun"]["state"], "running", "{t}");
    let (_, after) = until(&s, STALL * 5, |t| t["activeRun"]["state"] == "detached")
        .await
        .expect("a stalled reader holds the run attached");
    assert!(after >= STALL / 2, "dropped too soon: {after:?}");
    // Then the grace runs out, the run is abandoned and its task cancelled.
    let (t, _) = until(&s, grace * 3, |t| t["activeRun"].is_null())
        .await
        .expect("the run was never abandoned");
    assert_eq!(t["lastRun"]["outcome"], "disconnected", "{t}");
    assert_cancelled_once(&k).await;
    next_turn_admitted(&s, &k).await;
}
