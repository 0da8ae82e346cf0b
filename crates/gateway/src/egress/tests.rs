//! The egress on real sockets, in front of a scripted upstream: what goes upstream (key, headers,
//! route, query), what comes back (status, headers, a stream as it comes), and each refusal.

use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use futures_util::StreamExt as _;
use reqwest::Method;

use super::*;
use crate::config::egress::{Budget, Egress as Options};

/// What the upstream saw of each request: method, path and query, headers, body.
#[derive(Clone, Debug)]
struct Seen {
    uri: String,
    headers: http::HeaderMap,
    body: bytes::Bytes,
}

/// An upstream answering every request by `answer` (its path), recording what it saw.
async fn upstream(
    tls: Option<&testkit::tls::Ca>,
    answer: fn(&str) -> Response,
) -> (String, Arc<StdMutex<Vec<Seen>>>) {
    let seen = Arc::new(StdMutex::new(Vec::new()));
    let record = seen.clone();
    let app = axum::Router::new().fallback(move |req: Request| {
        let record = record.clone();
        async move {
            let (parts, body) = req.into_parts();
            let body = axum::body::to_bytes(body, usize::MAX).await.unwrap();
            let path = parts.uri.path().to_owned();
            record.lock().unwrap().push(Seen {
                uri: parts.uri.to_string(),
                headers: parts.headers,
                body,
            });
            answer(&path)
        }
    });
    let addr = match tls {
        None => testkit::serve(app).await,
        Some(ca) => {
            let (cert, key) = ca.issue(&["127.0.0.1"]);
            testkit::serve_tls(app, &cert, &key).await
        }
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    (format!("{scheme}://{addr}/v1"), seen)
}

/// An event stream of three chunks, the last (with usage) half a second after the first.
fn streamed(_: &str) -> Response {
    let chunks = futures_util::stream::iter([0u64, 500, 0]).then(|wait| async move {
        tokio::time::sleep(Duration::from_millis(wait)).await;
        Ok::<_, std::convert::Infallible>(bytes::Bytes::from(if wait == 0 {
            "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"
        } else {
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":2}}\n\n"
        }))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("x-request-id", "up-1")
        .body(Body::from_stream(chunks))
        .unwrap()
}

fn failing(_: &str) -> Response {
    Response::builder()
        .status(500)
        .header("content-type", "application/json")
        .body(Body::from(r#"{"error":{"message":"upstream broke"}}"#))
        .unwrap()
}

fn slow(_: &str) -> Response {
    let later = futures_util::stream::once(async {
        tokio::time::sleep(Duration::from_secs(3)).await;
        Ok::<_, std::convert::Infallible>(bytes::Bytes::from_static(b"{}"))
    });
    Response::new(Body::from_stream(later))
}

fn thinking(_: &str) -> Response {
    std::thread::sleep(Duration::from_millis(1500));
    Response::new(Body::from("{}"))
}

fn options(upstream: &str) -> Options {
    Options {
        upstream: url::Url::parse(upstream).unwrap(),
        ca: None,
        key: Some("sk-operator".into()),
        key_in_file: false,
        max_requests: 4,
        budget: None,
    }
}

fn start(opts: &Options) -> Egress {
    Egress::start(opts, &|_| None, Arc::new(Metrics::new())).unwrap()
}

/// The base URL and capability of a kernel of `account`.
fn kernel(e: &Egress, account: Option<&str>) -> (String, String) {
    let vars = e.kernel_vars(account, &|_| None);
    let get = |k: &str| vars.iter().find(|(n, _)| n == k).unwrap().1.clone();
    (get("IAC_CODE_BASE_URL"), get("IAC_CODE_API_KEY"))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder().no_proxy().build().unwrap()
}

/// `method` `url` with `cap` as the bearer and `body`: the answer.
async fn ask(
    method: reqwest::Method,
    url: &str,
    cap: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    client()
        .request(method, url)
        .bearer_auth(cap)
        .body(body)
        .send()
        .await
        .unwrap()
}

fn iac() -> IacCode {
    serde_json::from_value(serde_json::json!({
        "rosInvocationId": "i", "cwd": "/w",
        "llmApiKey": " sk-run-own ", "llmHeaders": {"X-Org": "org-1", "X-Kept": "run",
            "Host": "attacker.example", "Accept-Encoding": "gzip", "X-Forwarded-Host": "evil"}
    }))
    .unwrap()
}

#[tokio::test]
async fn the_key_goes_upstream_and_the_answer_streams_back_as_it_comes() {
    let (up, seen) = upstream(None, streamed).await;
    let e = start(&options(&up));
    let (base, cap) = kernel(&e, Some("ualice"));
    let started = Instant::now();
    let resp = client()
        .post(format!("{base}/chat/completions?api-version=1"))
        .bearer_auth(&cap)
        .header("x-api-key", "kernel-extra")
        .header("accept-encoding", "gzip")
        .header("anthropic-version", "2023-06-01")
        .header("openai-organization", "org-elsewhere")
        .header("x-forwarded-host", "elsewhere.example")
        .header("cookie", "a=b")
        .body(r#"{"stream":true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-request-id"], "up-1");
    let mut body = resp.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(first.starts_with(b"data: {\"choices\""), "{first:?}");
    assert!(
        started.elapsed() < Duration::from_millis(400),
        "the first chunk waited for the rest: {:?}",
        started.elapsed()
    );
    let rest: Vec<_> = body.collect().await;
    assert!(!rest.is_empty());
    let s = seen.lock().unwrap()[0].clone();
    assert_eq!(s.uri, "/v1/chat/completions?api-version=1");
    assert_eq!(s.headers["authorization"], "Bearer sk-operator");
    assert!(
        s.headers.get("x-api-key").is_none(),
        "the kernel's credentials stay"
    );
    assert_eq!(s.headers["accept-encoding"], "identity");
    assert_eq!(s.headers["anthropic-version"], "2023-06-01");
    for dropped in ["openai-organization", "x-forwarded-host", "cookie"] {
        assert!(s.headers.get(dropped).is_none(), "{dropped} went upstream");
    }
    assert!(s.headers["host"]
        .to_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    // A streamed OpenAI request asks for its usage, whatever the kernel asked.
    let sent: serde_json::Value = serde_json::from_slice(&s.body).unwrap();
    assert_eq!(
        sent,
        serde_json::json!({"stream": true, "stream_options": {"include_usage": true}})
    );
    // Counted to alice once the answer ended.
    let u = e.usage("ualice");
    assert_eq!(
        (&u["requests"], &u["inputTokens"], &u["outputTokens"]),
        (
            &serde_json::json!(1),
            &serde_json::json!(40),
            &serde_json::json!(2)
        ),
        "{u}"
    );
    let m = e.inner.metrics.encode();
    assert!(
        m.contains("agui_llm_requests_total{outcome=\"ok\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("agui_llm_tokens_total{kind=\"input\"} 40"),
        "{m}"
    );
}

#[tokio::test]
async fn a_runs_key_and_headers_go_upstream_as_the_kernel_presented_its_capability() {
    let (up, seen) = upstream(None, streamed).await;
    let e = start(&options(&up));
    let (base, _) = kernel(&e, Some("ualice"));
    let mut props = iac();
    let (grant, _) = e.grant_run("ualice", "t1", &mut props).unwrap();
    let run_cap = props.llm_api_key.clone().unwrap().0;
    assert_eq!(run_cap.len(), 64, "the kernel gets the capability");
    assert!(props.llm_headers.is_none(), "and no header");
    let resp = client()
        .post(format!("{base}/v1/messages"))
        .header("x-api-key", &run_cap)
        .header("x-kept", "kernel")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let _ = resp.bytes().await;
    let s = seen.lock().unwrap()[0].clone();
    assert_eq!(s.uri, "/v1/v1/messages");
    assert_eq!(s.headers["x-api-key"], "sk-run-own");
    assert!(s.headers.get("authorization").is_none());
    assert_eq!(s.headers["x-org"], "org-1");
    assert_eq!(
        s.headers["x-kept"], "run",
        "the run's header replaces the kernel's"
    );
    // Where the request goes, and its encoding, are not a run's to say.
    assert!(s.headers["host"]
        .to_str()
        .unwrap()
        .starts_with("127.0.0.1:"));
    assert_eq!(s.headers["accept-encoding"], "identity");
    assert!(s.headers.get("x-forwarded-host").is_none());
    drop(grant);
    assert_eq!(e.live_runs(), 1, "within the grace");
}

#[tokio::test]
async fn refusals_are_clear_and_in_the_clients_shape() {
    let (up, seen) = upstream(None, slow).await;
    let mut opts = options(&up);
    opts.max_requests = 1;
    let e = start(&opts);
    let (base, cap) = kernel(&e, Some("ualice"));
    let c = client();
    // No capability, a wrong one, an unknown route.
    let r = c.get(format!("{base}/models")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["x-should-retry"], "false");
    let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(v["error"]["type"], "authentication_error", "{v}");
    let r = c
        .post(format!("{base}/v1/messages"))
        .bearer_auth("0".repeat(64))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let v: serde_json::Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(v["type"], "error", "Anthropic's shape: {v}");
    for path in ["files", "chat/completions/x", "../models"] {
        let r = ask(Method::POST, &format!("{base}/{path}"), &cap, "").await;
        assert_eq!(r.status(), 404, "{path}");
    }
    // A body over the bound.
    let big = vec![b'x'; forward::MAX_BODY + 1];
    let r = ask(Method::POST, &format!("{base}/chat/completions"), &cap, big).await;
    assert_eq!(r.status(), 413);
    assert!(seen.lock().unwrap().is_empty(), "nothing went upstream");
    // One request at a time: the second waits its turn, then is refused.
    let first = tokio::spawn({
        let (base, cap) = (base.clone(), cap.clone());
        async move {
            // Its place is held until its answer has been read to the end.
            let r = ask(Method::GET, &format!("{base}/models"), &cap, "").await;
            let status = r.status();
            let _ = r.bytes().await;
            status
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = ask(Method::GET, &format!("{base}/models"), &cap, "").await;
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["x-should-retry"], "true");
    assert_eq!(first.await.unwrap(), 200);
    let m = e.inner.metrics.encode();
    for (outcome, n) in [("denied", 2), ("invalid", 4), ("busy", 1)] {
        let line = format!("agui_llm_requests_total{{outcome=\"{outcome}\"}} {n}");
        assert!(m.contains(&line), "{line}\n{m}");
    }
}

/// A budget: a user past it is refused (with when it frees) at the egress and for a run; with
/// one, a shared kernel's own capability spends nothing (only runs' capabilities do).
#[tokio::test]
async fn a_spent_budget_is_refused_and_shared_kernels_spend_only_through_runs() {
    let (up, _) = upstream(None, streamed).await;
    let mut opts = options(&up);
    opts.budget = Some(Budget {
        tokens: 10,
        window: Duration::from_secs(3600),
    });
    let e = start(&opts);
    let (shared, shared_cap) = kernel(&e, None);
    let r = ask(
        Method::POST,
        &format!("{shared}/chat/completions"),
        &shared_cap,
        "{}",
    )
    .await;
    assert_eq!(r.status(), 403);
    let r = ask(Method::GET, &format!("{shared}/models"), &shared_cap, "").await;
    assert_eq!(r.status(), 200);
    let _ = r.bytes().await;
    let (base, cap) = kernel(&e, Some("ualice"));
    e.inner.settle("ualice", 0, 8, 4);
    let r = ask(Method::GET, &format!("{base}/models"), &cap, "").await;
    assert_eq!(r.status(), 429);
    let after: u64 = r.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((3500..=3600).contains(&after), "{after}");
    let mut props = iac();
    assert!(
        e.grant_run("ualice", "t1", &mut props).is_err(),
        "no run either"
    );
    assert!(
        e.grant_run("ubob", "t1", &mut props).is_ok(),
        "another user's budget"
    );
    let m = e.inner.metrics.encode();
    assert!(
        m.contains("agui_llm_requests_total{outcome=\"budget\"} 2"),
        "{m}"
    );
}

#[tokio::test]
async fn upstream_errors_pass_through_and_an_unverified_upstream_is_never_sent_the_key() {
    let (up, _) = upstream(None, failing).await;
    let e = start(&options(&up));
    let (base, cap) = kernel(&e, None);
    let r = ask(Method::POST, &format!("{base}/chat/completions"), &cap, "").await;
    assert_eq!(r.status(), 500);
    assert_eq!(
        r.text().await.unwrap(),
        r#"{"error":{"message":"upstream broke"}}"#
    );
    // An upstream whose certificate no trusted CA signed.
    let (trusted, other) = (testkit::tls::Ca::new(), testkit::tls::Ca::new());
    let (up, seen) = upstream(Some(&other), streamed).await;
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, trusted.pem()).unwrap();
    let mut opts = options(&up);
    opts.ca = Some(ca);
    let e = start(&opts);
    let (base, cap) = kernel(&e, None);
    let r = ask(Method::POST, &format!("{base}/chat/completions"), &cap, "").await;
    assert_eq!(r.status(), 502);
    assert!(seen.lock().unwrap().is_empty());
    // Nothing listening.
    let e = start(&options("http://127.0.0.1:9/v1"));
    let (base, cap) = kernel(&e, None);
    let r = ask(Method::GET, &format!("{base}/models"), &cap, "").await;
    assert_eq!(r.status(), 502);
    let m = e.inner.metrics.encode();
    assert!(
        m.contains("agui_llm_requests_total{outcome=\"failed\"} 1"),
        "{m}"
    );
    // A CA file that cannot be read stops the start.
    let mut opts = options("https://127.0.0.1:9/v1");
    opts.ca = Some(dir.path().join("missing.pem"));
    let err = Egress::start(&opts, &|_| None, Arc::new(Metrics::new())).unwrap_err();
    assert!(err.contains("--llm-upstream-ca"), "{err}");
}

/// A request's reserve counts against its user's budget while its answer is awaited, and is
/// given back when the kernel leaves before the answer; the model list reserves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserve_is_held_while_the_answer_is_awaited_and_given_back_when_the_kernel_leaves() {
    let (up, _) = upstream(None, thinking).await;
    let mut opts = options(&up);
    opts.budget = Some(Budget {
        tokens: 1000,
        window: Duration::from_secs(3600),
    });
    let e = start(&opts);
    let (base, cap) = kernel(&e, Some("ualice"));
    let asked = client()
        .post(format!("{base}/chat/completions"))
        .bearer_auth(&cap)
        .timeout(Duration::from_millis(600))
        .body(r#"{"max_tokens":1000000}"#)
        .send();
    let watch = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        e.inner.exhausted("ualice")
    };
    let (left, during) = tokio::join!(asked, watch);
    assert!(left.is_err(), "the kernel gave up first");
    assert!(during.is_some(), "a million reserved while awaited");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(e.inner.exhausted("ualice"), None, "given back");
    let u = e.usage("ualice");
    assert_eq!(u["requests"], 1, "{u}");
    assert_eq!(u["outputTokens"], 0, "{u}");
    let m = e.inner.metrics.encode();
    assert!(
        m.contains("agui_llm_requests_total{outcome=\"left\"} 1"),
        "{m}"
    );
}
