//! AG-UI 1.0 negotiation and CORS, through the real HTTP server in front of the fake kernel: what
//! a client that declares `protocolVersion` gets, what one that does not keeps getting, and the
//! CORS headers of allowed and other origins.

use std::time::Duration;

use serde_json::{json, Value};
use testkit::fake_kernel::{FakeKernel, Item, Reply, Stream};
use testkit::sse::{assert_valid_run, post, RunResult};

use crate::support::{body, client, ctx, http_get, post_json, spawn_post, Builder, TestServer};

async fn setup() -> (TestServer, FakeKernel) {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k).start().await;
    (s, k)
}

/// A turn's body, declaring `version` when given.
fn turn(s: &TestServer, thread: &str, run: &str, version: Option<&str>) -> Value {
    let mut b = body(thread, run, "hello", &s.ws(thread), json!({}));
    if let Some(v) = version {
        b["protocolVersion"] = json!(v);
    }
    b
}

/// A rich turn of the fake kernel on `thread` that ends in `state`.
fn script(thread: &str, state: &str) -> Reply {
    let c = ctx(thread);
    Stream::of("task-1", &c)
        .submitted(json!({"iacCodeSessionId": "sess"}))
        .working(json!({"thinking": {"type": "raw_thinking", "text": "hmm"}}))
        .text("Hello", "m")
        .working(json!({"tool": {"status": "input_complete", "toolUseId": "tu1", "name": "bash", "toolInput": {"c": "ls"}}}))
        .working(json!({"usage": {"inputTokens": 1.0, "outputTokens": 2.0, "totalTokens": 3.0}}))
        .status(state, json!({}))
        .reply()
}

/// The events without their timestamps and generated ids, for comparing two runs.
fn shapes(res: &RunResult) -> Vec<Value> {
    res.events
        .iter()
        .map(|e| {
            let mut e = e.clone();
            let o = e.as_object_mut().unwrap();
            o.remove("timestamp");
            o.remove("runId");
            if let Some(v) = o.get_mut("value").and_then(Value::as_object_mut) {
                v.remove("executionId");
            }
            e
        })
        .collect()
}

#[tokio::test]
async fn a_1_0_client_gets_the_declared_version_and_nothing_else_differs() {
    let (s, k) = setup().await;
    k.on(
        "SendStreamingMessage",
        script("legacy", "TASK_STATE_COMPLETED"),
    );
    let legacy = post(&s.url, &turn(&s, "legacy", "r1", None), &[]).await;
    assert_valid_run(&legacy, "legacy", "r1");
    assert!(
        legacy.events[0].get("protocolVersion").is_none(),
        "{}",
        legacy.raw
    );
    for (i, version) in ["1.0", "1.2"].into_iter().enumerate() {
        let thread = format!("v1-{i}");
        k.on(
            "SendStreamingMessage",
            script(&thread, "TASK_STATE_COMPLETED"),
        );
        let v1 = post(&s.url, &turn(&s, &thread, "r1", Some(version)), &[]).await;
        assert_valid_run(&v1, &thread, "r1");
        assert_eq!(
            v1.events[0]["protocolVersion"], "1.0",
            "{version}: {}",
            v1.raw
        );
        // Every other byte is what a client without a version gets.
        let mut a = shapes(&legacy);
        let mut b = shapes(&v1);
        b[0].as_object_mut().unwrap().remove("protocolVersion");
        for e in a.iter_mut().chain(b.iter_mut()) {
            let o = e.as_object_mut().unwrap();
            o.remove("threadId");
            if let Some(v) = o.get_mut("value").and_then(Value::as_object_mut) {
                v.remove("threadId");
                v.remove("contextId");
            }
        }
        assert_eq!(a, b);
    }
}

#[tokio::test]
async fn a_cancellation_is_the_cancelled_outcome_for_1_0_and_run_error_before() {
    let (s, k) = setup().await;
    // The kernel reports the task cancelled.
    for (thread, version) in [("k-legacy", None), ("k-v1", Some("1.0"))] {
        k.on(
            "SendStreamingMessage",
            script(thread, "TASK_STATE_CANCELED"),
        );
        let res = post(&s.url, &turn(&s, thread, "r1", version), &[]).await;
        assert_valid_run(&res, thread, "r1");
        let last = res.last();
        if version.is_some() {
            assert_eq!(last["type"], "RUN_FINISHED", "{}", res.raw);
            assert_eq!(last["outcome"], json!({"type": "cancelled"}));
            assert_eq!(last["threadId"], thread);
            assert_eq!(
                last["usage"][0]["totalTokens"], 3,
                "usage is kept: {}",
                res.raw
            );
            assert!(last.get("code").is_none() && last.get("message").is_none());
        } else {
            assert_eq!(
                (&last["type"], &last["code"]),
                (&json!("RUN_ERROR"), &json!("CANCELLED"))
            );
        }
        // Spans are balanced before the terminal event either way.
        let t = res.types();
        assert_eq!(t[t.len() - 2], "TEXT_MESSAGE_END", "{t:?}");
        // The next run is an ordinary turn, not a resume.
        k.on(
            "SendStreamingMessage",
            script(thread, "TASK_STATE_COMPLETED"),
        );
        let next = post(&s.url, &turn(&s, thread, "r2", version), &[]).await;
        assert_eq!(next.last()["outcome"]["type"], "success", "{}", next.raw);
    }
    // A failure stays a failure for a 1.0 client.
    k.on("SendStreamingMessage", script("f-v1", "TASK_STATE_FAILED"));
    let res = post(&s.url, &turn(&s, "f-v1", "r1", Some("1.0")), &[]).await;
    assert_eq!(
        (&res.last()["type"], &res.last()["code"]),
        (&json!("RUN_ERROR"), &json!("A2A_EXECUTION_FAILED"))
    );
}

#[tokio::test]
async fn the_cancellation_extension_ends_a_1_0_run_with_the_cancelled_outcome() {
    let (s, k) = setup().await;
    let c = ctx("x1");
    k.stream(
        Stream::of("task-1", &c)
            .task("TASK_STATE_WORKING", json!({"iacCodeSessionId": "s"}))
            .text("tick", "m")
            .then(Item::Sleep(Duration::from_millis(800)))
            // The kernel goes on without reporting the cancellation: the request decides.
            .completed(),
    );
    let run = spawn_post(&s.url, turn(&s, "x1", "r1", Some("1.0")));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let exec = s.execution_id("x1");
    let c = s.cancel(&exec, "x1", "inv-1").await;
    assert_eq!(c.json.unwrap()["status"], "cancelled");
    let res = run.await.unwrap();
    assert_valid_run(&res, "x1", "r1");
    assert_eq!(
        res.last()["outcome"],
        json!({"type": "cancelled"}),
        "{}",
        res.raw
    );
    assert_eq!(res.types()[res.types().len() - 2], "TEXT_MESSAGE_END");
}

/// A CORS preflight of a POST to `url` from `origin` (to send, or to add headers to first).
fn preflight(url: &str, origin: &str) -> reqwest::RequestBuilder {
    client()
        .request(reqwest::Method::OPTIONS, url)
        .header("origin", origin)
        .header("access-control-request-method", "POST")
}

/// The CORS headers of an answer, by name.
fn cors_headers(r: &reqwest::Response) -> Vec<(String, String)> {
    let mut h: Vec<(String, String)> = r
        .headers()
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("access-control-") || k.as_str() == "vary")
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
        .collect();
    h.sort();
    h
}

#[tokio::test]
async fn cors_allows_configured_origins_only_and_leaves_authentication_alone() {
    const PAGE: &str = "http://127.0.0.1:5173";
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k)
        .auth("tok")
        .cors_origin(PAGE)
        .cors_origin("https://app.example.com")
        .start()
        .await;
    let cancel = s.cancel_url("e1");
    // Preflights of the allowed origin, on both POST routes, without a token.
    for url in [s.url.clone(), cancel.clone()] {
        let r = preflight(&url, PAGE)
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "{url}");
        let h = cors_headers(&r);
        let get = |k: &str| h.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("access-control-allow-origin"), Some(PAGE));
        assert_eq!(
            get("access-control-allow-methods"),
            Some("GET, POST, PATCH, DELETE")
        );
        let allowed = get("access-control-allow-headers")
            .unwrap()
            .to_ascii_lowercase();
        for name in ["authorization", "content-type", "accept"] {
            assert!(allowed.contains(name), "{allowed}");
        }
        assert!(get("vary").unwrap().contains("Origin"));
    }
    // Another origin's preflight is judged as any OPTIONS request: no CORS header.
    let r = preflight(&s.url, "http://127.0.0.1:5174")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert_eq!(cors_headers(&r), vary_only(), "{:?}", cors_headers(&r));
    // The actual request: authentication is unchanged, and its answer carries the CORS headers
    // of the allowed origin (the page can read the error).
    let b = body("c1", "r1", "hello", &s.ws("c1"), json!({}));
    let r = post_json(&s.url, &b, &[("origin", PAGE)]).await;
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["access-control-allow-origin"], PAGE);
    assert_eq!(r.headers()["vary"], "Origin");
    let r = post_json(&s.url, &b, &[("origin", "http://evil.test")]).await;
    assert_eq!(r.status(), 401);
    assert_eq!(cors_headers(&r), vary_only());
    // A stream to the allowed origin, and a stream to another origin (judged as before: it
    // runs, without CORS headers, and the browser keeps it from the page).
    for (origin, thread) in [(PAGE, "c1"), ("http://evil.test", "c2")] {
        k.on(
            "SendStreamingMessage",
            script(thread, "TASK_STATE_COMPLETED"),
        );
        let b = body(thread, "r1", "hello", &s.ws(thread), json!({}));
        let r = post_json(
            &s.url,
            &b,
            &[("origin", origin), ("authorization", "Bearer tok")],
        )
        .await;
        assert_eq!(r.status(), 200);
        let h = cors_headers(&r);
        if origin == PAGE {
            assert_eq!(
                h,
                [
                    ("access-control-allow-origin".to_owned(), PAGE.to_owned()),
                    ("vary".to_owned(), "Origin".to_owned())
                ]
            );
        } else {
            assert_eq!(h, vary_only());
        }
        assert!(r.text().await.unwrap().contains("RUN_FINISHED"));
    }
    // Health answers an allowed origin too.
    let r = client()
        .get(format!("{}health", s.url))
        .header("origin", "https://app.example.com")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example.com"
    );
    // An answer to a request without an origin varies by it too: a cache in front of the
    // gateway never hands it to a page.
    let r = http_get(format!("{}health", s.url)).await;
    assert_eq!(cors_headers(&r), vary_only());
}

/// The CORS headers of an answer to an origin that is not allowed (or to no origin).
fn vary_only() -> Vec<(String, String)> {
    vec![("vary".to_owned(), "Origin".to_owned())]
}

/// JSON answers (errors, `/health`, a thread's state, a cancellation) are never cached; event
/// streams keep `no-cache`.
#[tokio::test]
async fn json_answers_are_not_stored_by_caches() {
    let (s, k) = setup().await;
    let no_store = |r: &reqwest::Response| {
        r.headers()
            .get("cache-control")
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let health = http_get(format!("{}health", s.url)).await;
    assert_eq!(no_store(&health).as_deref(), Some("no-store"));
    let missing = http_get(format!("{}threads/nope", s.url)).await;
    assert_eq!(missing.status(), 404);
    assert_eq!(no_store(&missing).as_deref(), Some("no-store"));
    let bad = client()
        .post(&s.url)
        .header("content-type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    assert_eq!(no_store(&bad).as_deref(), Some("no-store"));
    k.on("SendStreamingMessage", script("j1", "TASK_STATE_COMPLETED"));
    let b = body("j1", "r1", "hello", &s.ws("j1"), json!({}));
    let run = post_json(&s.url, &b, &[]).await;
    assert_eq!(no_store(&run).as_deref(), Some("no-cache"));
    assert!(run.text().await.unwrap().contains("RUN_FINISHED"));
    let thread = http_get(format!("{}threads/j1", s.url)).await;
    assert_eq!(thread.status(), 200);
    assert_eq!(no_store(&thread).as_deref(), Some("no-store"));
}

#[tokio::test]
async fn without_configured_origins_no_cors_header_is_sent() {
    let (s, k) = setup().await;
    let r = preflight(&s.url, "http://127.0.0.1:5173")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    assert!(cors_headers(&r).is_empty());
    k.on("SendStreamingMessage", script("n1", "TASK_STATE_COMPLETED"));
    let b = body("n1", "r1", "hello", &s.ws("n1"), json!({}));
    let r = post_json(&s.url, &b, &[("origin", "http://127.0.0.1:5173")]).await;
    assert_eq!(r.status(), 200);
    assert!(cors_headers(&r).is_empty());
}
