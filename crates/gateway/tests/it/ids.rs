//! Ids and short free strings of a request are bounded (256 bytes, no control characters): one
//! beyond is a 400 naming its field, before any store is touched (nothing saved, no state-save
//! failure counted, on the file store and on PostgreSQL). A thread document over its bound read
//! from PostgreSQL is refused by its length.

use serde_json::{json, Value};
use testkit::fake_kernel::{FakeKernel, Stream};
use testkit::postgres::Cluster;
use testkit::sse::{assert_valid_run, post};

use crate::cluster::{Instance, Workspace};
use crate::support::{body, client, ctx, http_get, metric, post_turn, Builder};

/// The refusal of an id or short string in `field` (see `validate::is_bounded`).
fn bound_message(field: &str) -> String {
    format!("{field} must be at most 256 bytes, without control characters.")
}

type Set = fn(&mut Value, Value);

/// Every bounded field of a request, how to set it, and how its refusal names it.
fn fields() -> [(&'static str, Set); 9] {
    [
        ("threadId", |b, v| b["threadId"] = v),
        ("runId", |b, v| b["runId"] = v),
        ("parentRunId", |b, v| b["parentRunId"] = v),
        ("resume[].interruptId", |b, v| {
            b["resume"] = json!([{"interruptId": v, "status": "cancelled"}])
        }),
        ("iacCode.model", |b, v| {
            b["forwardedProps"]["iacCode"]["model"] = v
        }),
        ("iacCode.userId", |b, v| {
            b["forwardedProps"]["iacCode"]["userId"] = v
        }),
        ("iacCode.channel", |b, v| {
            b["forwardedProps"]["iacCode"]["channel"] = v
        }),
        ("iacCode.pipelineName", |b, v| {
            b["forwardedProps"]["iacCode"]["pipelineName"] = v
        }),
        ("messages[].id", |b, v| b["messages"][0]["id"] = v),
    ]
}

/// Values each field refuses: one byte too many, and each kind of control character.
fn refused_values() -> Vec<String> {
    vec![
        "a".repeat(257),
        format!("{}é", "a".repeat(255)),
        "a\u{0}b".into(),
        "\u{1}".into(),
        "line\nbreak".into(),
        "a\u{1f}".into(),
        "del\u{7f}".into(),
        "nel\u{85}".into(),
        "c1\u{9f}".into(),
    ]
}

/// Whether any file under `dir` (thread files, the journal) holds a thread document.
fn holds_a_document(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let path = e.path();
            if path.is_dir() {
                holds_a_document(&path)
            } else {
                std::fs::read(&path).is_ok_and(|b| b.windows(10).any(|w| w == b"runDigests"))
            }
        })
}

/// A plain turn the fake kernel answers.
fn done(k: &FakeKernel, thread: &str) {
    let c = ctx(thread);
    k.on_context(
        "SendStreamingMessage",
        &c,
        Stream::of("task-1", &c)
            .submitted(json!({"iacCodeSessionId": "sess-1"}))
            .text("hello", "m1")
            .input_required(json!({})),
    );
}

/// Table-driven: every bounded field, over the bound or with a control character, is a 400
/// `INVALID_INPUT` naming it (translated), and the store is never touched; at the bound, with
/// format characters, a run is admitted.
#[tokio::test]
async fn each_id_over_the_bound_or_with_a_control_character_is_refused_naming_it() {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k).start().await;
    let ws = s.ws("w");
    let base = body("t-ok", "r-ok", "hi", &ws, json!({}));
    let mut tried = 0;
    for (field, set) in fields() {
        for bad in refused_values() {
            let mut b = base.clone();
            set(&mut b, json!(bad));
            let r = post(&s.url, &b, &[]).await;
            assert_eq!(r.status, 400, "{field} {bad:?}: {}", r.raw);
            assert_eq!(r.error_code(), Some("INVALID_INPUT"), "{field}");
            assert_eq!(
                r.error_message(),
                Some(bound_message(field).as_str()),
                "{field} {bad:?}"
            );
            tried += 1;
        }
    }
    // In another language, still naming the field.
    let mut b = base.clone();
    b["runId"] = json!("r\u{0}");
    let r = post(&s.url, &b, &[("accept-language", "de")]).await;
    assert_eq!(
        r.error_message(),
        Some("runId darf höchstens 256 Bytes lang sein und keine Steuerzeichen enthalten.")
    );
    // rosInvocationId keeps its bound (1 to 256 characters, `INVALID_PROPS` beyond) and refuses
    // control characters with a message of its own.
    for (bad, message) in [
        (
            "x".repeat(257),
            "Invalid iac-code forwarded properties.".to_owned(),
        ),
        (
            "inv\u{0}".to_owned(),
            "iacCode.rosInvocationId must not contain control characters.".to_owned(),
        ),
    ] {
        let mut b = base.clone();
        b["forwardedProps"]["iacCode"]["rosInvocationId"] = json!(bad);
        let r = post(&s.url, &b, &[]).await;
        assert_eq!((r.status, r.error_message()), (400, Some(message.as_str())));
        tried += 1;
    }
    // The two: an 11 MiB threadId, a NUL in runId.
    for (thread, run) in [
        ("a".repeat(11 << 20), "r1".to_owned()),
        ("t".into(), "r\u{0}".into()),
    ] {
        let r = post_turn(&s.url, &thread, &run, "hi", &ws).await;
        assert_eq!(r.status, 400);
        assert_eq!(r.error_code(), Some("INVALID_INPUT"));
        tried += 1;
    }
    assert_eq!(tried, 9 * 9 + 4);
    // Nothing was saved or attempted, and nothing reached the kernel.
    assert_eq!(metric(&s, "agui_state_save_duration_seconds_count"), 0.0);
    assert_eq!(metric(&s, "agui_state_save_failures_total"), 0.0);
    assert!(k.requests().is_empty());
    assert!(!holds_a_document(&s.state_dir()));

    // At the bound (256 bytes of two-byte characters), with format characters (a zero-width
    // joiner, a direction mark): admitted, and the run goes through.
    let at_bound = "é".repeat(128);
    let mut b = body(&at_bound, "r\u{200d}\u{200e}1", "hi", &ws, json!({}));
    for (field, set) in fields() {
        if !matches!(field, "threadId" | "runId" | "resume[].interruptId") {
            set(&mut b, json!("ü".repeat(128)));
        }
    }
    done(&k, &at_bound);
    let r = post(&s.url, &b, &[]).await;
    assert_valid_run(&r, &at_bound, "r\u{200d}\u{200e}1");
    bad_ids_on_the_other_routes(&s.url).await;
    assert_eq!(metric(&s, "agui_state_save_failures_total"), 0.0);
}

/// On PostgreSQL: a NUL or an over-long id is a 400, not a 503, and no row is made; a thread
/// document over the bound (valid JSON, otherwise loadable) is refused by its length.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgres_bad_ids_are_400_and_an_oversized_document_is_refused() {
    let pg = Cluster::start();
    let url = pg.create_db("ids");
    let ws = Workspace::new();
    let k = FakeKernel::start().await;
    let i = Instance::start(&url, &["--a2a-url", &k.url()], &ws.env());
    let cwd = ws.cwd("w");
    for (thread, run) in [
        ("a\u{0}b".to_owned(), "r1".to_owned()),
        ("t".to_owned(), "r\u{0}".to_owned()),
        ("x".repeat(4096), "r1".to_owned()),
    ] {
        let r = post_turn(&i.url(), &thread, &run, "hi", &cwd).await;
        assert_eq!(
            (r.status, r.error_code()),
            (400, Some("INVALID_INPUT")),
            "{}",
            r.raw
        );
    }
    assert_eq!(
        pg.psql("ids", "SELECT count(*) FROM agui_threads").trim(),
        "0"
    );
    bad_ids_on_the_other_routes(&i.url()).await;
    assert_eq!(
        pg.psql("ids", "SELECT count(*) FROM agui_threads").trim(),
        "0"
    );
    // A valid document padded past 64 MiB by a member the reader ignores.
    let doc = store::ThreadDoc::new(
        "t-big",
        "agui-0000",
        cwd.as_str(),
        None,
        store::Execution::new("e1", "inv-1"),
    );
    let text = String::from_utf8(doc.to_json()).unwrap();
    let head = text.trim_end().strip_suffix('}').unwrap();
    pg.psql(
        "ids",
        &format!(
            "INSERT INTO agui_threads (thread_id, doc) VALUES ('t-big', '{head}, \"pad\": \"' || repeat('x', {}) || '\"}}')",
            store::MAX_DOC_BYTES
        ),
    );
    let r = http_get(format!("{}threads/t-big", i.url())).await;
    assert_eq!(r.status(), 503);
    let r = post_turn(&i.url(), "t-big", "r1", "hi", &cwd).await;
    assert_eq!(
        (r.status, r.error_code()),
        (503, Some("STATE_UNAVAILABLE")),
        "{}",
        r.raw
    );
    // Cut within the bound, the same document loads: the refusal was its length.
    pg.psql(
        "ids",
        "UPDATE agui_threads SET doc = left(doc, 4096) || '\"}' WHERE thread_id = 't-big'",
    );
    let r = http_get(format!("{}threads/t-big", i.url())).await;
    assert_eq!(r.status(), 200);
    drop(i);
}

/// The thread, events and cancellation routes with ids beyond the bound: a thread, run or
/// execution no one can have is not found; a cancellation's body ids are invalid input naming
/// their field. Nothing reaches a store (a NUL or a long key in a PostgreSQL query was a 503).
async fn bad_ids_on_the_other_routes(base: &str) {
    let c = client();
    let long = "x".repeat(4096);
    for thread in ["a%00b", long.as_str(), "line%0Abreak"] {
        for path in [
            format!("threads/{thread}"),
            format!("threads/{thread}/runs/r1/events"),
        ] {
            let r = c.get(format!("{base}{path}")).send().await.unwrap();
            let status = r.status().as_u16();
            let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or(Value::Null);
            assert_eq!(
                (status, v["error"]["code"].as_str()),
                (404, Some("THREAD_NOT_FOUND")),
                "{path}: {v}"
            );
        }
    }
    let cancel = |exec: &str, body: Value| {
        c.post(format!(
            "{base}extensions/iac-code/v1/executions/{exec}/cancel"
        ))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
    };
    let ok = json!({"threadId": "t", "rosInvocationId": "inv-1"});
    let r = cancel("e%00", ok.clone()).await.unwrap();
    assert_eq!(r.status(), 404);
    let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(v["error"]["code"], "EXECUTION_NOT_FOUND", "{v}");
    let r = cancel(&long, ok).await.unwrap();
    assert_eq!(r.status(), 404);
    for (body, field) in [
        (
            json!({"threadId": "a\u{0}b", "rosInvocationId": "inv-1"}),
            "threadId",
        ),
        (
            json!({"threadId": long, "rosInvocationId": "inv-1"}),
            "threadId",
        ),
        (
            json!({"threadId": "t", "rosInvocationId": "i\nj"}),
            "rosInvocationId",
        ),
        (
            json!({"threadId": "t", "rosInvocationId": "i".repeat(257)}),
            "rosInvocationId",
        ),
    ] {
        let r = cancel("e1", body.clone()).await.unwrap();
        let status = r.status().as_u16();
        let v: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (400, Some("INVALID_INPUT")),
            "{body}: {v}"
        );
        assert_eq!(v["error"]["message"], bound_message(field), "{body}");
    }
}
