//! A thread's transcript (fake kernel): what each run showed its client is kept, durable before
//! the run's terminal event, bounded by `--transcript-limit`, paged by
//! `GET /threads/{id}/messages`, without a secret, across a restart of the gateway.

use std::time::Duration;

use serde_json::{json, Value};
use testkit::fake_kernel::{items, FakeKernel, Item, Stream};
use testkit::sse::{assert_valid_run, post};

use crate::support::{
    assert_invalid_input, bearer_for, body, capped_gateway, ctx, get_as, jwks_file, permission,
    post_resume, post_turn, post_turn_as, resume_body, Builder, TestServer,
};

/// A turn that says something, calls a tool, gets its result and stops at a permission.
fn script_tool_then_interrupt(k: &FakeKernel, thread: &str) {
    let c = ctx(thread);
    let tool = |status: &str, extra: Value| {
        let mut t = json!({"toolUseId": "tu0", "name": "ls", "status": status});
        for (k, v) in extra.as_object().unwrap() {
            t[k] = v.clone();
        }
        Item::Result(items::status(
            "task-1",
            &c,
            "TASK_STATE_WORKING",
            json!({"tool": t}),
        ))
    };
    k.stream(
        Stream::of("task-1", &c)
            .submitted(json!({"iacCodeSessionId": "sess-1"}))
            .text("Looking.", "m1")
            .then(tool(
                "input_complete",
                json!({"toolInput": {"path": "/tmp"}}),
            ))
            .then(tool("completed", json!({"result": "a.tf"})))
            .input_required(json!({"input": permission(thread)})),
    );
}

fn script_done(k: &FakeKernel, thread: &str, task: &str, text: &str) {
    script_done_in(k, &ctx(thread), task, text);
}

/// [`script_done`] in the context `c`.
fn script_done_in(k: &FakeKernel, c: &str, task: &str, text: &str) {
    k.stream(
        Stream::of(task, c)
            .submitted(json!({"iacCodeSessionId": "sess-1"}))
            .text(text, &format!("m-{task}"))
            .completed(),
    );
}

/// The kernel's side of the answer: the task as it waits, the acknowledgement, a text, the end.
fn script_resume(k: &FakeKernel, thread: &str) {
    let c = ctx(thread);
    k.task_awaits_input("task-1", &c, json!({"input": permission(thread)}));
    k.stream(
        Stream::of("task-1", &c)
            .working(json!({"inputReceived": {"kind": "permission", "inputId": "perm-1"}}))
            .text("Listed.", "m2")
            .completed(),
    );
}

/// A key set of the test's own (its directory, and the file that holds it).
fn key_set() -> (tempfile::TempDir, std::path::PathBuf) {
    let keys = tempfile::tempdir().unwrap();
    let jwks = jwks_file(keys.path(), &[testkit::jwt::ec()]);
    (keys, jwks)
}

/// A gateway that takes the JWTs of `jwks`, on a state directory of its own or `dir`.
async fn jwt_gateway(
    k: &FakeKernel,
    jwks: &std::path::Path,
    dir: Option<std::path::PathBuf>,
) -> TestServer {
    let mut b = Builder::for_fake(k).jwks(jwks, Duration::from_secs(300));
    if let Some(d) = dir {
        b = b.dir(d);
    }
    b.start().await
}

async fn page(s: &TestServer, thread: &str, query: &str) -> (u16, Value) {
    get_as(&format!("{}threads/{thread}/messages{query}", s.url), &[]).await
}

fn messages(page: &Value) -> Vec<Value> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].clone())
        .collect()
}

fn seqs(page: &Value) -> Vec<u64> {
    page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect()
}

/// A turn with text, a tool call and a permission, then its answer and the next turn: each run's
/// messages as its client saw them, in order, numbered, paged back from the newest; a secret of
/// the request is nowhere in the transcript; a restart keeps it.
#[tokio::test]
async fn each_run_leaves_its_messages_in_the_thread_transcript() {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k).start().await;
    let ws = s.ws("t1");
    // Nothing before the first run: the thread does not exist.
    let (status, none) = page(&s, "t1", "").await;
    assert_eq!(status, 404);
    assert_eq!(none["error"]["code"], "THREAD_NOT_FOUND");

    script_tool_then_interrupt(&k, "t1");
    let secret = "sk-transcript-secret-0042";
    let props = json!({"llmApiKey": secret, "llmHeaders": {"x-secret": secret}});
    let first = post(&s.url, &body("t1", "r1", "list my files", &ws, props), &[]).await;
    assert_valid_run(&first, "t1", "r1");
    assert_eq!(first.last()["outcome"]["type"], "interrupt");
    let (status, p) = page(&s, "t1", "").await;
    assert_eq!(status, 200, "{p}");
    assert_eq!(p["threadId"], "t1");
    assert!(p.get("nextBefore").is_none(), "{p}");
    let m = messages(&p);
    assert_eq!(
        m[0],
        json!({"id": "msg-r1", "role": "user", "content": "list my files"})
    );
    assert_eq!(m[1]["role"], "assistant");
    assert_eq!(m[1]["content"], "Looking.");
    let calls: Vec<&Value> = m
        .iter()
        .filter_map(|x| x.get("toolCalls"))
        .flat_map(|c| c.as_array().unwrap())
        .collect();
    assert_eq!(calls.len(), 1, "{m:?}");
    assert_eq!(calls[0]["id"], "tu0");
    assert_eq!(calls[0]["function"]["name"], "ls");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"path": "/tmp"}));
    let result = m
        .iter()
        .find(|x| x["role"] == "tool")
        .expect("a tool message");
    assert_eq!(
        (&result["toolCallId"], &result["content"]),
        (&json!("tu0"), &json!("a.tf"))
    );
    let last = m.last().unwrap();
    assert_eq!(last["role"], "activity");
    assert_eq!(last["activityType"], "iac-code.interrupt");
    assert_eq!(last["content"]["interrupt"]["id"], "perm-1");
    let entries = p["entries"].as_array().unwrap();
    assert!(entries
        .iter()
        .all(|e| e["runId"] == "r1" && e["at"].is_string()));
    assert_eq!(seqs(&p), (1..=m.len() as u64).collect::<Vec<_>>());

    // The answer and the turn it lets finish.
    script_resume(&k, "t1");
    let answer = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let resumed = post_resume(&s.url, "t1", "r2", &ws, "inv-1", answer).await;
    assert_valid_run(&resumed, "t1", "r2");
    assert_eq!(resumed.last()["type"], "RUN_FINISHED");
    let (_, p) = page(&s, "t1", "?limit=200").await;
    let m = messages(&p);
    let n = m.len();
    assert_eq!(m[n - 2]["activityType"], "iac-code.interrupt-response");
    assert_eq!(
        m[n - 2]["content"],
        json!({"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}})
    );
    assert_eq!(
        (&m[n - 1]["role"], &m[n - 1]["content"]),
        (&json!("assistant"), &json!("Listed."))
    );
    assert_eq!(p["entries"][n - 1]["runId"], "r2");

    // Paged back from the newest: two at a time, each page in order, `nextBefore` to the next.
    let mut pages = Vec::new();
    let mut before = String::new();
    loop {
        let (status, p) = page(&s, "t1", &format!("?limit=2{before}")).await;
        assert_eq!(status, 200);
        pages.push(seqs(&p));
        match p.get("nextBefore") {
            Some(b) => before = format!("&before={b}"),
            None => break,
        }
    }
    let joined: Vec<u64> = pages.iter().rev().flatten().copied().collect();
    assert_eq!(joined, (1..=n as u64).collect::<Vec<_>>());
    assert!(pages.iter().all(|p| p.len() <= 2 && !p.is_empty()));

    // The secret is in no transcript; the transcript survives a restart.
    let dir = s.stop().await;
    let transcripts = dir.join("state").join("transcripts");
    let mut found = 0;
    for f in std::fs::read_dir(&transcripts).unwrap() {
        let text = std::fs::read_to_string(f.unwrap().path()).unwrap();
        assert!(!text.contains(secret));
        // One line an entry, and the thread's summary after each run's entries.
        let last = text.lines().last().unwrap_or_default();
        assert!(last.starts_with(r#"{"thread":{"threadId":"t1""#), "{text}");
        found += text.lines().filter(|l| l.starts_with(r#"{"seq":"#)).count();
    }
    assert_eq!(found, n);
    let s = Builder::for_fake(&k).dir(dir).start().await;
    let (status, again) = page(&s, "t1", "?limit=200").await;
    assert_eq!(status, 200);
    assert_eq!(messages(&again), m);
}

/// `--transcript-limit` keeps the newest messages; the page parameters are checked.
#[tokio::test]
async fn the_transcript_keeps_the_newest_messages_and_pages_are_checked() {
    let (s, k) = capped_gateway(Duration::ZERO, |c| c.transcript_limit = 3).await;
    let ws = s.ws("t2");
    for i in 1..=3 {
        script_done(&k, "t2", &format!("task-{i}"), &format!("answer {i}"));
        let r = post_turn(&s.url, "t2", &format!("r{i}"), &format!("q{i}"), &ws).await;
        assert_valid_run(&r, "t2", &format!("r{i}"));
    }
    // Six messages were written (a question and an answer each): the newest three are kept,
    // still numbered as they were written.
    let (_, p) = page(&s, "t2", "").await;
    assert_eq!(seqs(&p), [4, 5, 6]);
    let texts: Vec<Value> = messages(&p).iter().map(|m| m["content"].clone()).collect();
    assert_eq!(texts, [json!("answer 2"), json!("q3"), json!("answer 3")]);
    assert!(p.get("nextBefore").is_none());
    let (_, older) = page(&s, "t2", "?before=5&limit=1").await;
    assert_eq!(seqs(&older), [4]);
    assert!(older.get("nextBefore").is_none());
    for bad in [
        "?limit=0",
        "?limit=201",
        "?before=0",
        "?before=x",
        "?limit=1&limit=2",
        "?before=",
    ] {
        let (status, e) = page(&s, "t2", bad).await;
        assert_eq!(status, 400, "{bad}");
        assert_eq!(e["error"]["code"], "INVALID_INPUT", "{bad}");
    }
    let r = reqwest::Client::new()
        .post(format!("{}threads/t2/messages", s.url))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
}

/// `--transcript-limit 0` keeps no history: a run leaves no transcript file and the thread's
/// pages are empty; the thread itself is listed (without a title) and runs as before.
#[tokio::test]
async fn a_limit_of_zero_keeps_no_transcript() {
    let (s, k) = capped_gateway(Duration::ZERO, |c| c.transcript_limit = 0).await;
    script_done(&k, "t0", "task-1", "an answer");
    let r = post_turn(&s.url, "t0", "r1", "a question", &s.ws("t0")).await;
    assert_valid_run(&r, "t0", "r1");
    let (status, p) = page(&s, "t0", "").await;
    assert_eq!(status, 200);
    assert!(messages(&p).is_empty(), "{p}");
    assert!(!s.state_dir().join("transcripts").exists());
    let r = reqwest::Client::new()
        .get(format!("{}threads", s.url))
        .send()
        .await
        .unwrap();
    let list: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(list["threads"][0]["threadId"], "t0", "{list}");
    assert!(list["threads"][0]["title"].is_null(), "{list}");
}

/// A transcript that cannot be written fails nothing of the run: it ends as it would, the
/// failure is counted, and reading the transcript is a clear 503.
#[tokio::test]
async fn a_transcript_that_cannot_be_written_fails_nothing_of_the_run() {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k).start().await;
    // A file where the transcripts' directory would be.
    let at = s.state_dir().join("transcripts");
    std::fs::create_dir_all(s.state_dir()).unwrap();
    std::fs::write(&at, b"not a directory").unwrap_or_else(|e| panic!("{}: {e}", at.display()));
    script_done(&k, "t3", "task-1", "fine");
    let r = post_turn(&s.url, "t3", "r1", "q", &s.ws("t3")).await;
    assert_valid_run(&r, "t3", "r1");
    assert_eq!(r.last()["type"], "RUN_FINISHED", "{}", r.raw);
    assert_eq!(
        crate::support::metric(&s, "agui_transcript_write_failures_total"),
        1.0
    );
    let (status, e) = page(&s, "t3", "").await;
    assert_eq!(status, 503, "{e}");
    assert_eq!(e["error"]["code"], "STATE_UNAVAILABLE");
}

/// Walks `GET /threads` as `who`, `limit` at a time: the thread ids in order, and each page's.
async fn walk(s: &TestServer, who: &[(&str, &str)], limit: usize) -> (Vec<Value>, usize) {
    let (mut all, mut pages, mut cursor) = (Vec::new(), 0, String::new());
    loop {
        let (status, p) = get_as(&format!("{}threads?limit={limit}{cursor}", s.url), who).await;
        assert_eq!(status, 200, "{p}");
        let threads = p["threads"].as_array().unwrap();
        assert!(
            threads.len() <= limit && (!threads.is_empty() || pages == 0),
            "{p}"
        );
        all.extend(threads.iter().cloned());
        pages += 1;
        match p.get("nextCursor") {
            Some(c) => cursor = format!("&cursor={}", c.as_str().unwrap()),
            None => return (all, pages),
        }
    }
}

fn ids(threads: &[Value]) -> Vec<&str> {
    threads
        .iter()
        .map(|t| t["threadId"].as_str().unwrap())
        .collect()
}

/// Each user lists their own threads, newest activity first, a page at a time, with a title
/// from the first message, the pending interrupts and no active run once they ended; a
/// restarted gateway lists them again; bad parameters are 400.
#[tokio::test]
async fn each_user_lists_their_own_threads_newest_first() {
    let k = FakeKernel::start().await;
    let (_keys, jwks) = key_set();
    let s = jwt_gateway(&k, &jwks, None).await;
    let (alice, bob) = (bearer_for("alice"), bearer_for("bob"));
    let a = [("authorization", alice.as_str())];
    let b = [("authorization", bob.as_str())];
    // alice: t-a1 (interrupted), t-a2, then t-a1 again (its activity is the newest).
    script_tool_then_interrupt(&k, "t-a1");
    let msg = "  Create a\n VPC  ";
    let r = post_turn_as(&s.url, "t-a1", "r1", msg, &s.ws("t-a1"), &a).await;
    assert_eq!(r.last()["outcome"]["type"], "interrupt", "{}", r.raw);
    script_done(&k, "t-a2", "task-2", "ok");
    let r = post_turn_as(&s.url, "t-a2", "r2", "Second", &s.ws("t-a2"), &a).await;
    assert_valid_run(&r, "t-a2", "r2");
    script_done(&k, "t-b1", "task-3", "ok");
    let r = post_turn_as(&s.url, "t-b1", "r3", "Bob's", &s.ws("t-b1"), &b).await;
    assert_valid_run(&r, "t-b1", "r3");
    let (all, pages) = walk(&s, &a, 1).await;
    assert_eq!((ids(&all), pages), (vec!["t-a2", "t-a1"], 2));
    let a1 = &all[1];
    assert_eq!(a1["title"], "Create a VPC");
    assert_eq!(a1["pendingInterrupts"], 1);
    assert_eq!(a1["activeRun"], Value::Null);
    assert_eq!(a1["archived"], false);
    assert!(a1["createdAt"].as_str().unwrap() <= a1["lastActivityAt"].as_str().unwrap());
    assert_eq!(all[0]["title"], "Second");
    let (theirs, _) = walk(&s, &b, 10).await;
    assert_eq!(ids(&theirs), ["t-b1"]);
    // Answering t-a1 makes it the newest.
    script_resume(&k, "t-a1");
    let answer = json!([{"interruptId": "perm-1", "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let r = post(
        &s.url,
        &resume_body("t-a1", "r4", &s.ws("t-a1"), "inv-1", answer),
        &a,
    )
    .await;
    assert_valid_run(&r, "t-a1", "r4");
    let (all, _) = walk(&s, &a, 10).await;
    assert_eq!(ids(&all), ["t-a1", "t-a2"]);
    assert_eq!(all[0]["pendingInterrupts"], 0);
    assert_eq!(all[0]["title"], "Create a VPC");
    // Archived threads are listed apart (none yet); bad parameters are refused.
    let (status, p) = get_as(&format!("{}threads?archived=true", s.url), &a).await;
    assert_eq!((status, p["threads"].as_array().unwrap().len()), (200, 0));
    for bad in [
        "limit=0",
        "limit=101",
        "cursor=xyz",
        "archived=1",
        "limit=1&limit=2",
    ] {
        assert_invalid_input(get_as(&format!("{}threads?{bad}", s.url), &a).await, bad);
    }
    let (status, _) = get_as(&format!("{}threads", s.url), &[]).await;
    assert_eq!(status, 401);
    // A restarted gateway lists the same threads, from what it wrote.
    let dir = s.stop().await;
    let s = jwt_gateway(&k, &jwks, Some(dir)).await;
    // (Activity as of each run's end: its last save may have come a moment later.)
    let (again, _) = walk(&s, &a, 10).await;
    let without_activity = |ts: &[Value]| -> Vec<Value> {
        ts.iter()
            .map(|t| {
                let mut t = t.clone();
                t.as_object_mut().unwrap().remove("lastActivityAt");
                t
            })
            .collect()
    };
    assert_eq!(without_activity(&again), without_activity(&all));
}

async fn send(
    method: reqwest::Method,
    url: &str,
    who: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Value) {
    let mut rb = reqwest::Client::new().request(method, url);
    for (k, v) in who {
        rb = rb.header(*k, *v);
    }
    if let Some(b) = body {
        rb = rb
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let r = rb.send().await.unwrap();
    let status = r.status().as_u16();
    let bytes = r.bytes().await.unwrap();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// PATCH changes a thread's title and archived flag (kept across a restart); DELETE removes
/// its document, transcript and summary for good (a restart brings nothing back, the id starts
/// afresh), and is refused while a run holds the thread or its kernel task is open. A stranger
/// can do neither, and learns nothing.
#[tokio::test]
async fn threads_are_renamed_archived_and_deleted_by_their_owner_only() {
    use reqwest::Method;
    let k = FakeKernel::start().await;
    let (_keys, jwks) = key_set();
    let s = jwt_gateway(&k, &jwks, None).await;
    let (alice, bob) = (bearer_for("alice"), bearer_for("bob"));
    let a = [("authorization", alice.as_str())];
    let b = [("authorization", bob.as_str())];
    script_done(&k, "t-e1", "task-1", "ok");
    let r = post_turn_as(&s.url, "t-e1", "r1", "First thread", &s.ws("t-e1"), &a).await;
    assert_valid_run(&r, "t-e1", "r1");
    script_tool_then_interrupt(&k, "t-e2");
    let r = post_turn_as(&s.url, "t-e2", "r2", "Second thread", &s.ws("t-e2"), &a).await;
    assert_eq!(r.last()["outcome"]["type"], "interrupt");
    let url = |t: &str| format!("{}threads/{t}", s.url);

    // A stranger: exactly a missing thread, by both methods; nothing changes.
    for (m, body) in [
        (Method::PATCH, Some(json!({"title": "mine"}))),
        (Method::DELETE, None),
    ] {
        let theirs = send(m.clone(), &url("t-e1"), &b, body.clone()).await;
        let ghost = send(m.clone(), &url("ghost"), &b, body).await;
        assert_eq!(theirs, ghost, "{m}");
        assert_eq!(theirs.0, 404);
        assert_eq!(theirs.1["error"]["code"], "THREAD_NOT_FOUND");
    }
    // Renamed and archived.
    let (status, t) = send(
        Method::PATCH,
        &url("t-e1"),
        &a,
        Some(json!({"title": " Renamed "})),
    )
    .await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(
        (&t["threadId"], &t["title"], &t["archived"]),
        (&json!("t-e1"), &json!("Renamed"), &json!(false))
    );
    let (status, t) = send(
        Method::PATCH,
        &url("t-e2"),
        &a,
        Some(json!({"archived": true})),
    )
    .await;
    assert_eq!(
        (status, &t["archived"], &t["title"]),
        (200, &json!(true), &json!("Second thread"))
    );
    let (listed, _) = walk(&s, &a, 10).await;
    assert_eq!(ids(&listed), ["t-e1"]);
    assert_eq!(listed[0]["title"], "Renamed");
    let (_, archived) = get_as(&format!("{}threads?archived=true", s.url), &a).await;
    assert_eq!(ids(archived["threads"].as_array().unwrap()), ["t-e2"]);
    for bad in [
        json!({}),
        json!({"title": ""}),
        json!({"archived": 1}),
        json!({"title": "x", "owner": "bob"}),
        json!([1]),
    ] {
        assert_invalid_input(
            send(Method::PATCH, &url("t-e1"), &a, Some(bad.clone())).await,
            &bad,
        );
    }
    let r = reqwest::Client::new()
        .put(url("t-e1"))
        .header("authorization", &alice)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(r.headers()["allow"], "GET, HEAD, PATCH, DELETE");

    // Deleting: refused while the kernel task waits for answers, and while a run holds it.
    let (status, e) = send(Method::DELETE, &url("t-e2"), &a, None).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (409, Some("THREAD_EXECUTION_OPEN")),
        "{e}"
    );
    let c = ctx("t-e1");
    k.stream(
        Stream::of("task-9", &c)
            .submitted(json!({"iacCodeSessionId": "sess-1"}))
            .then(Item::Sleep(Duration::from_millis(1500)))
            .completed(),
    );
    let running = {
        let (u, b, h) = (
            s.url.clone(),
            body("t-e1", "r9", "more", &s.ws("t-e1"), json!({})),
            alice.clone(),
        );
        tokio::spawn(async move { post(&u, &b, &[("authorization", h.as_str())]).await })
    };
    k.wait_calls("SendStreamingMessage", 3, Duration::from_secs(5))
        .await;
    let (status, e) = send(Method::DELETE, &url("t-e1"), &a, None).await;
    assert_eq!(
        (status, e["error"]["code"].as_str()),
        (409, Some("THREAD_BUSY")),
        "{e}"
    );
    let r = running.await.unwrap();
    assert_eq!(r.last()["type"], "RUN_FINISHED", "{}", r.raw);

    // Deleted: gone by every route, from disk, and after a restart.
    let (status, d) = send(Method::DELETE, &url("t-e1"), &a, None).await;
    assert_eq!(
        (status, &d),
        (200, &json!({"threadId": "t-e1", "deleted": true}))
    );
    for path in ["", "/messages"] {
        let (status, e) = get_as(&format!("{}{path}", url("t-e1")), &a).await;
        assert_eq!(
            (status, e["error"]["code"].as_str()),
            (404, Some("THREAD_NOT_FOUND")),
            "{path}"
        );
    }
    let (status, _) = send(Method::DELETE, &url("t-e1"), &a, None).await;
    assert_eq!(status, 404);
    assert!(!s.thread_file("t-e1").exists());
    let dir = s.stop().await;
    assert!(!dir.join("state/transcripts/t-e1.jsonl").exists());
    let s = jwt_gateway(&k, &jwks, Some(dir)).await;
    let url = |t: &str| format!("{}threads/{t}", s.url);
    let (status, _) = get_as(&url("t-e1"), &a).await;
    assert_eq!(status, 404);
    let (_, archived) = get_as(&format!("{}threads?archived=true", s.url), &a).await;
    assert_eq!(ids(archived["threads"].as_array().unwrap()), ["t-e2"]);
    assert_eq!(archived["threads"][0]["archived"], true);
    // The id starts afresh, for anyone (a kernel context of its own: see
    // `a_thread_made_again_under_a_deleted_id_has_a_kernel_context_of_its_own`).
    let again = engine::run::incarnation_context_id("t-e1", 1);
    script_done_in(&k, &again, "task-10", "new");
    let r = post_turn_as(&s.url, "t-e1", "r1", "Anew", &s.ws("t-e1"), &b).await;
    assert_valid_run(&r, "t-e1", "r1");
    let (_, p) = get_as(&format!("{}/messages", url("t-e1")), &b).await;
    assert_eq!(seqs(&p), [1, 2]);
    let (_, listed) = get_as(&format!("{}threads", s.url), &b).await;
    assert_eq!(listed["threads"][0]["title"], "Anew");
}

/// The context id of the `n`th `SendStreamingMessage` the kernel got.
fn sent_context(k: &FakeKernel, n: usize) -> Value {
    k.calls("SendStreamingMessage")[n].body["params"]["message"]["contextId"].clone()
}

/// A thread made again under a deleted thread's id, by another user, never continues the
/// deleted one's kernel conversation: the kernel is sent another context than the first
/// incarnation's (the reference's formula), which the thread keeps after a restart.
#[tokio::test]
async fn a_thread_made_again_under_a_deleted_id_has_a_kernel_context_of_its_own() {
    let k = FakeKernel::start().await;
    let (_keys, jwks) = key_set();
    let s = jwt_gateway(&k, &jwks, None).await;
    let (alice, bob) = (bearer_for("alice"), bearer_for("bob"));
    let a = [("authorization", alice.as_str())];
    let b = [("authorization", bob.as_str())];
    script_done(&k, "t-re", "task-1", "first");
    let r = post_turn_as(&s.url, "t-re", "r1", "One", &s.ws("t-re"), &a).await;
    assert_valid_run(&r, "t-re", "r1");
    assert_eq!(sent_context(&k, 0), json!(ctx("t-re")));
    let url = format!("{}threads/t-re", s.url);
    let (status, _) = send(reqwest::Method::DELETE, &url, &a, None).await;
    assert_eq!(status, 200);

    let again = engine::run::incarnation_context_id("t-re", 1);
    assert_ne!(again, ctx("t-re"));
    script_done_in(&k, &again, "task-2", "second");
    let r = post_turn_as(&s.url, "t-re", "r1", "Two", &s.ws("t-re"), &b).await;
    assert_valid_run(&r, "t-re", "r1");
    assert_eq!(sent_context(&k, 1), json!(again));
    assert_eq!(s.thread_doc("t-re")["contextId"], json!(again));

    // Restarted: the thread's later turns stay in its own context.
    let dir = s.stop().await;
    let s = jwt_gateway(&k, &jwks, Some(dir)).await;
    script_done_in(&k, &again, "task-3", "third");
    let r = post_turn_as(&s.url, "t-re", "r2", "Three", &s.ws("t-re"), &b).await;
    assert_valid_run(&r, "t-re", "r2");
    assert_eq!(sent_context(&k, 2), json!(again));
}

/// `POST /agents/state` (ADK's convention): the thread's messages as AG-UI messages, oldest
/// first, across more than one page of the store; a missing thread and another user's are the
/// same `threadExists: false`; the body is checked.
#[tokio::test]
async fn agents_state_answers_in_adks_shape() {
    let k = FakeKernel::start().await;
    let (_keys, jwks) = key_set();
    let s = jwt_gateway(&k, &jwks, None).await;
    let (alice, bob) = (bearer_for("alice"), bearer_for("bob"));
    let a = [("authorization", alice.as_str())];
    // 101 runs: 202 messages, more than one page (200) of the store.
    for i in 0..101 {
        script_done(&k, "t-s", &format!("task-{i}"), &format!("answer {i}"));
        let r = post_turn_as(
            &s.url,
            "t-s",
            &format!("r{i}"),
            &format!("q{i}"),
            &s.ws("t-s"),
            &a,
        )
        .await;
        assert_valid_run(&r, "t-s", &format!("r{i}"));
    }
    let state = |who: &'static str, thread: &str| {
        let h = if who == "alice" {
            alice.clone()
        } else {
            bob.clone()
        };
        let b = json!({"threadId": thread, "appName": "ignored", "userId": "alice"});
        let url = format!("{}agents/state", s.url);
        async move {
            send(
                reqwest::Method::POST,
                &url,
                &[("authorization", h.as_str())],
                Some(b),
            )
            .await
        }
    };
    let (status, v) = state("alice", "t-s").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (&v["threadId"], &v["threadExists"], &v["state"]),
        (&json!("t-s"), &json!(true), &json!({}))
    );
    let m = v["messages"].as_array().unwrap();
    assert_eq!(m.len(), 202);
    assert_eq!(
        (&m[0]["content"], &m[201]["content"]),
        (&json!("q0"), &json!("answer 100"))
    );
    assert!(
        m.windows(2).all(|w| w[0]["role"] != w[1]["role"]),
        "in order, question then answer"
    );
    // Bob (naming alice in the body changes nothing) and a missing thread: the same answer.
    let theirs = state("bob", "t-s").await;
    let missing = state("bob", "nope").await;
    assert_eq!(theirs.0, 200);
    assert_eq!(
        theirs.1,
        json!({"threadId": "t-s", "threadExists": false, "state": {}, "messages": []})
    );
    assert_eq!(missing.1["threadExists"], false);
    let url = format!("{}agents/state", s.url);
    for bad in [
        json!({}),
        json!({"threadId": 7}),
        json!({"threadId": ""}),
        json!([]),
    ] {
        assert_invalid_input(
            send(reqwest::Method::POST, &url, &a, Some(bad.clone())).await,
            &bad,
        );
    }
    let (status, _) = send(
        reqwest::Method::POST,
        &url,
        &[],
        Some(json!({"threadId": "t-s"})),
    )
    .await;
    assert_eq!(status, 401);
    let (status, _) = get_as(&url, &a).await;
    assert_eq!(status, 405);
}
