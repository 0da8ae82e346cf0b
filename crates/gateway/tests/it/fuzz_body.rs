//! Fuzzing of request bodies against their limits: the cancellation route (64 KiB) with bodies
//! of any size around its limit, announced by `Content-Length` or sent chunked in random pieces,
//! with or without a JSON content type, arriving in random cuts, followed by a second request
//! on the same connection. The answer is one well-formed response, never a 500: 413
//! `REQUEST_TOO_LARGE` exactly when the body is over the limit, an answer of its own otherwise;
//! and a connection the answer keeps open serves the next request. (See `fuzz.rs` for how to
//! run it for longer.)

use std::time::Duration;

use iac_code_agui::api::CANCEL_BODY_LIMIT;
use proptest::prelude::*;

use crate::fuzz::fuzz;

/// The responses on a connection: `(status, head, body)` of each, as far as they parse.
fn responses(mut out: &[u8]) -> Vec<(u16, String, Vec<u8>)> {
    let mut all = vec![];
    while let Some(end) = out.windows(4).position(|w| w == b"\r\n\r\n") {
        let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
        let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
        let len = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        let body_end = (end + 4 + len).min(out.len());
        all.push((status, head, out[end + 4..body_end].to_vec()));
        out = &out[body_end..];
    }
    all
}

#[test]
fn fuzz_body_limits_answer_exactly_and_keep_connections_usable() {
    let (rt, server, app) = crate::fuzz::in_memory_gateway();
    // The answers seen (413, 415 and the others): the target must reach each.
    let seen = std::sync::Mutex::new(std::collections::BTreeSet::new());
    let sizes = prop_oneof![
        0..2048usize,
        (CANCEL_BODY_LIMIT - 64)..(CANCEL_BODY_LIMIT + 64),
        0..(3 * CANCEL_BODY_LIMIT),
    ];
    fuzz(
        "fuzz_body_limits_answer_exactly_and_keep_connections_usable",
        (
            sizes,
            any::<bool>(),
            any::<bool>(),
            prop::collection::vec(1..9000usize, 1..8),
            prop::collection::vec(any::<prop::sample::Index>(), 0..4),
        ),
        |(size, chunked, json_type, chunk_sizes, cuts)| {
            // A JSON object of exactly `size` bytes where it fits, else filler.
            const EMPTY: &str = r#"{"threadId":"t","rosInvocationId":"","p":""}"#;
            let body: Vec<u8> = if size >= EMPTY.len() {
                let pad = size - EMPTY.len();
                format!(
                    r#"{{"threadId":"t","rosInvocationId":"","p":"{}"}}"#,
                    "x".repeat(pad)
                )
                .into_bytes()
            } else {
                vec![b'x'; size]
            };
            prop_assert_eq!(body.len(), size);
            let mut wire = String::from(
                "POST /extensions/iac-code/v1/executions/e1/cancel HTTP/1.1\r\nhost: localhost\r\n",
            );
            if json_type {
                wire.push_str("content-type: application/json\r\n");
            }
            let mut bytes = if chunked {
                wire.push_str("transfer-encoding: chunked\r\n\r\n");
                let mut b = wire.into_bytes();
                let (mut at, mut k) = (0, 0);
                while at < body.len() {
                    let n = chunk_sizes[k % chunk_sizes.len()].min(body.len() - at);
                    b.extend_from_slice(format!("{n:x}\r\n").as_bytes());
                    b.extend_from_slice(&body[at..at + n]);
                    b.extend_from_slice(b"\r\n");
                    at += n;
                    k += 1;
                }
                b.extend_from_slice(b"0\r\n\r\n");
                b
            } else {
                wire.push_str(&format!("content-length: {size}\r\n\r\n"));
                let mut b = wire.into_bytes();
                b.extend_from_slice(&body);
                b
            };
            bytes.extend_from_slice(b"GET /health HTTP/1.1\r\nhost: localhost\r\n\r\n");
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
            points.sort_unstable();
            let app = app.clone();
            let out = rt.block_on(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let (mut client, conn) = tokio::io::duplex(1 << 16);
                let served = tokio::spawn(iac_code_agui::edge::server::serve_connection(conn, app));
                // The client never closes its side (hyper drops what a half-closed client
                // asked): it reads until the answers are in, or the server closes.
                let reader = async move {
                    let mut last = 0;
                    let (mut rd, mut wr) = tokio::io::split(&mut client);
                    let write = async {
                        for p in points.into_iter().chain([bytes.len()]) {
                            if wr.write_all(&bytes[last..p]).await.is_err() {
                                // The server closed: what it said is read to its end.
                                break;
                            }
                            last = p;
                            tokio::task::yield_now().await;
                        }
                        std::future::pending::<()>().await;
                    };
                    let read = async {
                        let mut out = Vec::new();
                        let mut buf = vec![0u8; 1 << 16];
                        loop {
                            match rd.read(&mut buf).await {
                                Ok(0) | Err(_) => return out,
                                Ok(n) => out.extend_from_slice(&buf[..n]),
                            }
                            let rs = responses(&out);
                            let whole = |r: &(u16, String, Vec<u8>)| {
                                let want =
                                    r.1.lines()
                                        .find_map(|l| l.strip_prefix("content-length:"))
                                        .and_then(|v| v.trim().parse::<usize>().ok())
                                        .unwrap_or(0);
                                r.2.len() >= want
                            };
                            if rs.len() >= 2 && rs.iter().all(whole) {
                                return out;
                            }
                        }
                    };
                    tokio::select! {
                        out = read => out,
                        () = write => unreachable!(),
                    }
                };
                // A connection kept open without a second answer runs out this time.
                let out = tokio::time::timeout(Duration::from_secs(5), reader).await;
                served.abort();
                out
            });
            let out = out.map_err(|_| TestCaseError::fail("no second answer and no close"))?;
            let rs = responses(&out);
            prop_assert!(
                !rs.is_empty(),
                "no answer: {:?}",
                String::from_utf8_lossy(&out)
            );
            let (status, head, first) = &rs[0];
            prop_assert!(*status != 500 && *status != 0, "{}", head);
            seen.lock().unwrap().insert(*status);
            let too_large = size > CANCEL_BODY_LIMIT;
            if !json_type {
                prop_assert_eq!(*status, 415, "{}", head);
            } else if too_large {
                prop_assert_eq!(*status, 413, "{} bytes: {}", size, head);
                let v: serde_json::Value = serde_json::from_slice(first).unwrap_or_default();
                prop_assert_eq!(&v["error"]["code"], "REQUEST_TOO_LARGE");
            } else {
                prop_assert!(*status != 413, "{} bytes refused: {}", size, head);
            }
            // An answer that keeps the connection serves the next request.
            if !head.contains("connection: close") {
                prop_assert!(rs.len() >= 2, "the next request was lost after {}", head);
                prop_assert_eq!(rs[1].0, 200, "{}", rs[1].1);
            }
            Ok(())
        },
    );
    let seen = seen.into_inner().unwrap();
    assert!(
        seen.contains(&413) && seen.contains(&415) && seen.len() >= 3,
        "{seen:?}"
    );
    drop(server);
}
