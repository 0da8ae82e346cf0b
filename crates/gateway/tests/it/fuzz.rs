//! Property-based fuzzing (proptest; cargo-fuzz needs a nightly toolchain, which this project does
//! not use) of the parsers that face untrusted input: the RunAgentInput validators, the kernel SSE
//! stream (HTTP framing and SSE), canonical JSON, the state-file loader, the image path and the
//! HTTP server. None may panic; the kernel stream must not depend on how bytes are split;
//! canonical JSON must agree with serde_json's parse; ids within their bound must be accepted
//! in every field, and one beyond refused naming its field.
//!
//! CI runs 256 cases per target (`PROPTEST_CASES` overrides). The long form runs every target for
//! a wall-clock time and prints how many cases it executed:
//! `FUZZ_SECONDS=600 cargo test -p iac-code-agui --test it -- fuzz:: --test-threads=1 --nocapture`
//! (plain `cargo test`: nextest's slow-test timeout would stop a ten-minute target).

use std::time::{Duration, Instant};

use engine::canonical;
use engine::validate::{content, envelope, props};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{json, Map, Value};
use store::ThreadDoc;

/// Keys of the run input's own, which the fuzzed objects use as often as any other key.
const WIRE_KEYS: &[&str] = &[
    "threadId",
    "runId",
    "role",
    "content",
    "type",
    "schemaVersion",
    "cwd",
    "source",
];

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        any::<f64>().prop_map(|f| if f.is_finite() { json!(f) } else { json!(0.5) }),
        "\\PC{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("threadId"),
            Just("runId"),
            Just("iacCode"),
            Just("user"),
            Just("text"),
            Just("image")
        ]
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    // Any key, or one of the wire's own (each as likely as the any).
                    prop_oneof![
                        1 => "\\PC{0,8}",
                        WIRE_KEYS.len() as u32 => prop::sample::select(WIRE_KEYS).prop_map(str::to_owned),
                    ],
                    inner
                ),
                0..6
            )
            .prop_map(|kv| Value::Object(kv.into_iter().collect::<Map<String, Value>>())),
        ]
    })
}

/// A RunAgentInput-shaped value with random parts (more likely to reach deep validation).
fn run_input() -> impl Strategy<Value = Value> {
    (json_value(), json_value(), json_value(), json_value()).prop_map(|(msg, props, resume, extra)| {
        json!({"threadId": "t", "runId": "r", "state": {}, "messages": [{"id": "m", "role": "user", "content": [msg]}],
               "tools": [], "context": [], "forwardedProps": {"iacCode": props}, "resume": resume, "x": extra})
    })
}

/// Runs `check` on values of `strategy`: `PROPTEST_CASES` cases (default 256), or, with
/// `FUZZ_SECONDS`, batches of fresh random cases until that much time has passed. A failure is
/// shrunk to a minimal input and reported with it.
pub(crate) fn fuzz<S: Strategy>(
    name: &str,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: std::fmt::Debug,
{
    let budget = std::env::var("FUZZ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map(Duration::from_secs);
    let cases = match budget {
        Some(_) => 20_000,
        None => std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(256),
    };
    let start = Instant::now();
    let mut total: u64 = 0;
    loop {
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            max_shrink_iters: 100_000,
            ..Config::default()
        });
        if let Err(e) = runner.run(&strategy, &check) {
            panic!("{name}: {e} (after {total} earlier cases)");
        }
        total += u64::from(cases);
        if budget.is_none_or(|b| start.elapsed() >= b) {
            break;
        }
    }
    eprintln!(
        "fuzz {name}: {total} cases in {:.0?}, no failure",
        start.elapsed()
    );
}

#[test]
fn fuzz_validators_never_panic() {
    fuzz(
        "fuzz_validators_never_panic",
        prop_oneof![json_value(), run_input()],
        |v| {
            if let Some(obj) = v.as_object() {
                let _ = envelope::parse(obj);
                let _ = props::parse(obj.get("forwardedProps"));
                if let Some(m) = obj.get("messages").and_then(Value::as_array) {
                    let _ = content::latest_user_message(m, content::ImageLimits::default());
                }
            }
            let _ = props::parse(Some(&v));
            Ok(())
        },
    );
}

/// A bounded id: printable text (format characters included) cut to at most 256 bytes.
fn bounded_id() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{1,40}",
        "[a-z0-9\u{200d}\u{200e}\u{feff}é漢😀-]{1,90}",
        Just("é".repeat(128)),
    ]
    .prop_map(|s| {
        let mut end = s.len().min(engine::validate::MAX_ID_BYTES);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s[..end].to_owned()
    })
}

/// Each id a request carries, by the field its refusal names, set to `v`.
fn with_id(b: &mut Value, field: usize, v: &str) {
    let iac = &mut b["forwardedProps"]["iacCode"];
    match field {
        0 => b["threadId"] = json!(v),
        1 => b["runId"] = json!(v),
        2 => b["parentRunId"] = json!(v),
        3 => iac["model"] = json!(v),
        4 => iac["userId"] = json!(v),
        5 => iac["channel"] = json!(v),
        6 => iac["pipelineName"] = json!(v),
        7 => iac["rosInvocationId"] = json!(v),
        _ => b["messages"][0]["id"] = json!(v),
    }
}

/// The validators a run's request goes through, in order.
fn validate_all(b: &Value) -> Result<(), String> {
    let obj = b.as_object().unwrap();
    envelope::parse(obj).map_err(|e| e.message.to_string())?;
    props::parse(obj.get("forwardedProps")).map_err(|e| e.message.to_string())?;
    let m = obj["messages"].as_array().unwrap();
    content::latest_user_message(m, content::ImageLimits::default())
        .map_err(|e| e.message.to_string())?;
    Ok(())
}

/// The id checks have a positive oracle: generated ids within the bound are accepted in every
/// field and kept as sent; one control character or one byte too many in one field is refused
/// naming that field.
#[test]
fn fuzz_bounded_ids_are_accepted_and_others_refused_by_name() {
    let names = [
        "threadId",
        "runId",
        "parentRunId",
        "iacCode.model",
        "iacCode.userId",
        "iacCode.channel",
        "iacCode.pipelineName",
        "iacCode.rosInvocationId",
        "messages[].id",
    ];
    fuzz(
        "fuzz_bounded_ids_are_accepted_and_others_refused_by_name",
        (
            prop::collection::vec(bounded_id(), 9),
            0..9usize,
            prop_oneof!["[\\x00-\\x1f\\x7f-\\x{9f}]".prop_map(Some), Just(None)],
            any::<prop::sample::Index>(),
        ),
        |(ids, field, control, at)| {
            let mut b = json!({"threadId": "t", "runId": "r", "state": {}, "messages": [{"id": "m", "role": "user", "content": "hi"}],
                "tools": [], "context": [], "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "i", "cwd": "/w"}}});
            for (i, id) in ids.iter().enumerate() {
                with_id(&mut b, i, id);
            }
            prop_assert_eq!(validate_all(&b), Ok(()));
            let e = envelope::parse(b.as_object().unwrap()).unwrap();
            prop_assert_eq!((&e.thread_id, &e.run_id), (&ids[0], &ids[1]));
            prop_assert_eq!(e.parent_run_id.as_ref(), Some(&ids[2]));
            // One field spoiled: a control character inserted, else padded past the bound.
            let id = &ids[field];
            let bad = match &control {
                Some(c) => {
                    let cut = id
                        .char_indices()
                        .map(|(i, _)| i)
                        .chain([id.len()])
                        .collect::<Vec<_>>();
                    let i = cut[at.index(cut.len())];
                    format!("{}{c}{}", &id[..i], &id[i..])
                }
                None => format!("{id}{}", "x".repeat(300)),
            };
            with_id(&mut b, field, &bad);
            let expected = match (field, &control) {
                (7, Some(_)) => {
                    "iacCode.rosInvocationId must not contain control characters.".to_owned()
                }
                (7, None) => "Invalid iac-code forwarded properties.".to_owned(),
                _ => format!(
                    "{} must be at most 256 bytes, without control characters.",
                    names[field]
                ),
            };
            prop_assert_eq!(validate_all(&b), Err(expected));
            Ok(())
        },
    );
}

#[test]
fn fuzz_canonical_json_agrees_with_serde() {
    fuzz("fuzz_canonical_json_agrees_with_serde", json_value(), |v| {
        let text = serde_json::to_string(&v).unwrap();
        let canon = canonical::canonical_bytes(text.as_bytes()).unwrap();
        prop_assert_eq!(
            std::str::from_utf8(&canon).unwrap(),
            canonical::canonical_value(&v)
        );
        // Canonical JSON is JSON, and canonicalising it again changes nothing.
        let back: Value = serde_json::from_slice(&canon).unwrap();
        prop_assert_eq!(canonical::canonical_bytes(&canon).unwrap(), canon.clone());
        prop_assert_eq!(
            canonical::canonical_value(&back),
            String::from_utf8(canon).unwrap()
        );
        Ok(())
    });
}

#[test]
fn fuzz_canonical_json_never_panics_on_bytes() {
    fuzz(
        "fuzz_canonical_json_never_panics_on_bytes",
        prop::collection::vec(any::<u8>(), 0..256),
        |b| {
            let parsed = serde_json::from_slice::<Value>(&b).is_ok();
            let canon = canonical::canonical_bytes(&b);
            // Everything serde_json accepts (strict JSON) is canonicalisable.
            if parsed {
                prop_assert!(canon.is_ok());
            }
            Ok(())
        },
    );
}

/// `bytes` cut at the fuzzed points (each an index into `0..=len`, in any order, repeats
/// allowed): the pieces in order, empty ones included.
fn split_at(bytes: &[u8], cuts: &[prop::sample::Index]) -> Vec<Vec<u8>> {
    let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
    points.sort_unstable();
    let mut pieces = vec![];
    let mut last = 0;
    for p in points {
        pieces.push(bytes[last..p].to_vec());
        last = p;
    }
    pieces.push(bytes[last..].to_vec());
    pieces
}

#[test]
fn fuzz_sse_decoder_is_split_independent() {
    fuzz(
        "fuzz_sse_decoder_is_split_independent",
        (
            prop::collection::vec(("[a-z]{0,5}", "\\PC{0,40}"), 0..8),
            any::<bool>(),
            prop::collection::vec(any::<prop::sample::Index>(), 0..6),
            prop::collection::vec(any::<u8>(), 0..64),
        ),
        |(frames, crlf, cuts, noise)| {
            let nl = if crlf { "\r\n" } else { "\n" };
            let mut input = String::new();
            for (event, data) in &frames {
                if !event.is_empty() {
                    input.push_str(&format!("event: {event}{nl}"));
                }
                input.push_str(&format!(
                    ": comment{nl}data: {}{nl}{nl}",
                    data.replace(['\r', '\n'], " ")
                ));
            }
            let decode = |chunks: Vec<&[u8]>| {
                let mut d = a2a::sse::Decoder::default();
                let mut out = vec![];
                for c in chunks {
                    d.push(c);
                    while let Ok(Some(f)) = d.next_frame() {
                        out.push(f);
                    }
                }
                if let Ok(Some(f)) = d.finish() {
                    out.push(f);
                }
                out
            };
            let bytes = input.as_bytes();
            let whole = decode(vec![bytes]);
            prop_assert_eq!(whole.len(), frames.len());
            let chunks = split_at(bytes, &cuts);
            prop_assert_eq!(decode(chunks.iter().map(Vec::as_slice).collect()), whole);
            // Garbage never panics.
            let _ = decode(vec![&noise]);
            Ok(())
        },
    );
}

/// A kernel response as it may arrive: any framing of the body (chunked with any chunk sizes,
/// extensions and trailers; a length; close-delimited), split anywhere into reads. The stream
/// client (hyper's HTTP/1.1 framing, then the SSE decoder) yields exactly the items sent; cut
/// short, it yields a prefix and an error; garbage never panics.
#[test]
fn fuzz_kernel_stream_framing_is_split_independent() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    fuzz(
        "fuzz_kernel_stream_framing_is_split_independent",
        (
            prop::collection::vec("\\PC{0,40}", 0..6),
            0u8..3,
            any::<bool>(),
            prop::collection::vec(1usize..50, 1..8),
            prop::collection::vec(any::<prop::sample::Index>(), 0..6),
            prop::collection::vec(any::<u8>(), 0..64),
        ),
        |(texts, framing, upper, chunk_sizes, cuts, noise)| {
            let items: Vec<Value> = texts.iter().map(|t| json!({"text": t})).collect();
            let mut sse = Vec::new();
            for it in &items {
                let frame = json!({"jsonrpc": "2.0", "id": "1", "result": it});
                sse.extend_from_slice(format!(": ping\r\ndata: {frame}\r\n\r\n").as_bytes());
            }
            let mut wire =
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n".to_vec();
            match framing {
                0 => {
                    wire.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
                    let mut rest = &sse[..];
                    let mut sizes = chunk_sizes.iter().cycle();
                    while !rest.is_empty() {
                        let n = (*sizes.next().unwrap()).min(rest.len());
                        let size = if upper {
                            format!("{n:X}")
                        } else {
                            format!("{n:x}")
                        };
                        wire.extend_from_slice(format!("{size};ext=1\r\n").as_bytes());
                        wire.extend_from_slice(&rest[..n]);
                        wire.extend_from_slice(b"\r\n");
                        rest = &rest[n..];
                    }
                    wire.extend_from_slice(b"0\r\nx-trailer: 1\r\n\r\n");
                }
                1 => {
                    wire.extend_from_slice(
                        format!("content-length: {}\r\n\r\n", sse.len()).as_bytes(),
                    );
                    wire.extend_from_slice(&sse);
                }
                _ => {
                    wire.extend_from_slice(b"connection: close\r\n\r\n");
                    wire.extend_from_slice(&sse);
                }
            }
            let pieces = split_at(&wire, &cuts);
            let (got, err) = rt.block_on(a2a::decode_response_pieces(pieces));
            prop_assert!(err.is_none(), "{:?}", err);
            prop_assert_eq!(&got, &items);
            // Cut short inside the body: a prefix of the items, and an error unless the framing
            // cannot tell (a close-delimited body ends wherever the connection does).
            if !sse.is_empty() {
                let cut = wire.len() - sse.len().min(7);
                let (got, err) =
                    rt.block_on(a2a::decode_response_pieces(vec![wire[..cut].to_vec()]));
                prop_assert!(got.len() <= items.len() && got[..] == items[..got.len()]);
                prop_assert!(err.is_some() || framing == 2);
            }
            // Garbage never panics.
            let _ = rt.block_on(a2a::decode_response_pieces(vec![noise]));
            Ok(())
        },
    );
}

/// A request head: a method, a target and fields of arbitrary (valid) names and values.
fn request_head() -> impl Strategy<Value = (String, String, Vec<(String, String)>)> {
    (
        prop::sample::select(vec!["GET", "HEAD", "POST", "PUT", "OPTIONS", "PATCH"]),
        "/[a-zA-Z0-9/_.%?=&-]{0,40}",
        prop::collection::vec(("[a-zA-Z][a-zA-Z0-9-]{0,15}", "[ -~]{0,40}"), 0..12),
    )
        .prop_map(|(m, p, h)| (m.to_string(), p, h))
}

/// What the HTTP server sends on a connection: zero or more well-formed responses (never a 500)
/// and then the end of the connection.
fn check_server_output(out: &[u8], context: &str) -> Result<(), TestCaseError> {
    if out.is_empty() {
        return Ok(());
    }
    prop_assert!(
        out.starts_with(b"HTTP/1.1 "),
        "{}: {:?}",
        context,
        String::from_utf8_lossy(out)
    );
    let code = std::str::from_utf8(&out[9..12.min(out.len())]).unwrap_or("");
    prop_assert!(
        code.len() == 3 && code != "500",
        "{}: {:?}",
        context,
        String::from_utf8_lossy(out)
    );
    prop_assert!(
        out.windows(4).any(|w| w == b"\r\n\r\n"),
        "{}: head without its end",
        context
    );
    Ok(())
}

/// A gateway (no kernel behind it) whose routes are served over in-memory pipes
/// (`server::serve_connection`), with the runtime that drives it.
pub(crate) fn in_memory_gateway() -> (
    tokio::runtime::Runtime,
    crate::support::TestServer,
    axum::Router,
) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = rt.block_on(crate::support::Builder::new().kernel_unreachable().start());
    let app = iac_code_agui::api::router(server.state.clone());
    (rt, server, app)
}

/// Request heads with any method, target and fields, followed by garbage, arriving in any
/// pieces: hyper's HTTP/1.1 server with the gateway's routes answers each connection with
/// well-formed responses or closes it, and a valid head alone always gets its answer.
#[test]
fn fuzz_http_server_answers_any_request() {
    let (rt, server, app) = in_memory_gateway();
    // Sends `input`; with `answer`, reads until a whole response head is in (the connection stays
    // open), else closes the sending side and reads to the end. (hyper drops a request whose
    // client closes its side before the answer: a client gone mid-message is noticed at once.)
    let exchange = |input: Vec<Vec<u8>>, answer: bool| -> Vec<u8> {
        let app = app.clone();
        rt.block_on(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut client, conn) = tokio::io::duplex(1 << 20);
            let served = tokio::spawn(iac_code_agui::edge::server::serve_connection(conn, app));
            for piece in input {
                if client.write_all(&piece).await.is_err() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            let mut out = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(10), async {
                if !answer {
                    let _ = client.shutdown().await;
                    let _ = client.read_to_end(&mut out).await;
                    return;
                }
                let mut buf = [0u8; 4096];
                while !out.windows(4).any(|w| w == b"\r\n\r\n") {
                    match client.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => out.extend_from_slice(&buf[..n]),
                    }
                }
            })
            .await;
            assert!(
                read.is_ok(),
                "neither an answer nor the end of the connection"
            );
            served.abort();
            out
        })
    };
    fuzz(
        "fuzz_http_server_answers_any_request",
        (
            request_head(),
            prop::collection::vec(any::<u8>(), 0..200),
            prop::collection::vec(any::<prop::sample::Index>(), 0..5),
        ),
        |((method, path, fields), noise, cuts)| {
            let mut wire = format!("{method} {path} HTTP/1.1\r\n");
            for (n, v) in &fields {
                // Framing fields are checked on their own; keep these heads body-less.
                if ["content-length", "transfer-encoding"]
                    .contains(&n.to_ascii_lowercase().as_str())
                {
                    continue;
                }
                wire.push_str(&format!("{n}: {}\r\n", v.trim()));
            }
            wire.push_str("\r\n");
            // The head alone: exactly one answer, not a server error.
            let out = exchange(vec![wire.clone().into_bytes()], true);
            check_server_output(&out, &wire)?;
            prop_assert!(!out.is_empty(), "no answer to {:?}", wire);
            // The head and garbage after it, in pieces.
            let mut bytes = wire.clone().into_bytes();
            bytes.extend_from_slice(&noise);
            check_server_output(&exchange(split_at(&bytes, &cuts), false), &wire)?;
            // Garbage alone.
            check_server_output(&exchange(vec![noise], false), "noise")?;
            Ok(())
        },
    );
    drop(server);
}

#[test]
fn fuzz_state_loader_never_panics() {
    fuzz(
        "fuzz_state_loader_never_panics",
        (json_value(), prop::collection::vec(any::<u8>(), 0..128)),
        |(v, b)| {
            let _ = ThreadDoc::from_json(&b, "t");
            let text = serde_json::to_vec(&v).unwrap();
            let _ = ThreadDoc::from_json(&text, "t");
            // A mutated valid document either loads or is refused; never a panic.
            let mut doc: Value = serde_json::from_str(include_str!(
                "../data/reference-state/S03_after_interrupt.thread-s3.json"
            ))
            .unwrap();
            if let (Some(o), Some(m)) = (doc.as_object_mut(), v.as_object()) {
                for (k, x) in m {
                    o.insert(k.clone(), x.clone());
                }
            }
            let _ = ThreadDoc::from_json(&serde_json::to_vec(&doc).unwrap(), "thread-s3");
            Ok(())
        },
    );
}

#[test]
fn fuzz_image_path_never_panics() {
    fuzz(
        "fuzz_image_path_never_panics",
        (prop::collection::vec(any::<u8>(), 0..512), 0usize..4),
        |(b, prefix)| {
            // Valid magic numbers in front of garbage reach the decoders.
            let magic: [&[u8]; 4] = [
                b"\x89PNG\r\n\x1a\n",
                b"\xff\xd8\xff",
                b"GIF89a",
                b"RIFF\0\0\0\0WEBP",
            ];
            let mut bytes = magic[prefix].to_vec();
            bytes.extend_from_slice(&b);
            let _ = content::normalise_image(&bytes);
            let _ = content::decode_base64(&String::from_utf8_lossy(&b));
            Ok(())
        },
    );
}

/// A kernel text-delta frame with random parts: sometimes exact, often mutated.
fn kernel_frame() -> impl Strategy<Value = Value> {
    (
        "\\PC{0,16}",
        prop_oneof![Just("m1".to_owned()), "\\PC{0,4}"],
        prop_oneof![Just("task-1".to_owned()), "\\PC{0,6}"],
        prop_oneof![Just("TASK_STATE_WORKING".to_owned()), Just("TASK_STATE_INPUT_REQUIRED".to_owned()), "\\PC{0,6}"],
        prop_oneof![Just(None), Just(Some(json!("sess-1"))), json_value().prop_map(Some)],
        prop::option::of(("\\PC{0,8}", json_value())),
    )
        .prop_map(|(text, mid, task, state, session, extra)| {
            let mut v = json!({"result": {"statusUpdate": {"taskId": task, "contextId": "C",
                "status": {"state": state, "message": {"messageId": mid, "role": "ROLE_AGENT", "parts": [{"text": text}]}},
                "metadata": {"iac_code": {}}}}, "id": "r", "jsonrpc": "2.0"});
            if let Some(s) = session {
                v["result"]["statusUpdate"]["metadata"]["iac_code"]["iacCodeSessionId"] = s;
            }
            if let Some((k, x)) = extra {
                v["result"]["statusUpdate"][k] = x;
            }
            v
        })
}

#[test]
fn fuzz_fast_text_path_agrees_with_the_generic_path() {
    use engine::mapping::fast::{text_delta, Known};
    let known = Known {
        task_id: "task-1",
        context_id: "C",
        session_id: Some("sess-1"),
    };
    fuzz(
        "fuzz_fast_text_path_agrees_with_the_generic_path",
        (kernel_frame(), prop::collection::vec(any::<u8>(), 0..128)),
        |(v, noise)| {
            // Garbage never panics and is never a fast frame.
            let _ = text_delta(&noise, known);
            let bytes = serde_json::to_vec(&v).unwrap();
            if let Some(d) = text_delta(&bytes, known) {
                // Whatever the fast parser accepts is exactly what the generic path sees.
                let item = &v["result"]["statusUpdate"];
                prop_assert_eq!(item["taskId"].as_str(), Some("task-1"));
                prop_assert_eq!(item["status"]["state"].as_str(), Some("TASK_STATE_WORKING"));
                prop_assert_eq!(
                    item["status"]["message"]["messageId"].as_str(),
                    Some(d.message_id.as_str())
                );
                prop_assert_eq!(
                    item["status"]["message"]["parts"][0]["text"].as_str(),
                    Some(d.text.as_str())
                );
                let meta = item["metadata"]["iac_code"].as_object().unwrap();
                prop_assert!(meta.keys().all(|k| k == "iacCodeSessionId"));
                prop_assert!(
                    matches!(meta.get("iacCodeSessionId"), None | Some(Value::Null))
                        || meta["iacCodeSessionId"] == "sess-1"
                        || meta["iacCodeSessionId"] == ""
                );
                prop_assert_eq!(item.as_object().unwrap().len(), 4);
            }
            Ok(())
        },
    );
}
