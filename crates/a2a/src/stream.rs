//! Streaming calls: one HTTP/1.1 connection per stream, through hyper's client connection.
//!
//! A stream holds its connection for the whole turn (hours, when the turn waits for an answer),
//! so it costs what the connection costs: hyper's buffers and nothing else. The connection is
//! driven from the reader's own task (no connection task, no hand-off between tasks per chunk);
//! dropping the stream closes the socket, which the kernel sees as a disconnect.

use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::task::Context;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::{Body as _, Incoming};
use serde_json::Value;

use crate::{rpc_result, sse, Error, Timeouts};

/// Size of the connection's read buffer: one read takes at most this much. Small enough that a
/// quiet stream holds little; a response head must fit (the kernel's are a few hundred bytes).
const READ_BUF: usize = 4096;
/// Largest body read where a stream was expected.
const MAX_BODY: usize = 16 * 1024 * 1024;

type ConnFuture = Pin<Box<dyn Future<Output = hyper::Result<()>> + Send>>;

/// The connection, driven by whoever waits on it.
struct Exchange {
    conn: Option<ConnFuture>,
}

impl Exchange {
    /// Polls the connection (reads and writes the socket, feeds the body); its end is noticed.
    fn drive(&mut self, cx: &mut Context<'_>) {
        if let Some(c) = self.conn.as_mut() {
            if c.as_mut().poll(cx).is_ready() {
                // An error reaches the response or the body as well.
                self.conn = None;
            }
        }
    }

    /// Waits for `fut` while driving the connection.
    async fn with<F: Future>(&mut self, fut: F) -> F::Output {
        let mut fut = pin!(fut);
        poll_fn(|cx| {
            self.drive(cx);
            fut.as_mut().poll(cx)
        })
        .await
    }

    /// The next data chunk of `body`; `None` at its end.
    async fn chunk(&mut self, body: &mut Incoming) -> Option<Result<Bytes, Error>> {
        loop {
            let frame = poll_fn(|cx| {
                self.drive(cx);
                Pin::new(&mut *body).poll_frame(cx)
            })
            .await?;
            match frame {
                Ok(f) => match f.into_data() {
                    Ok(data) if data.is_empty() => continue,
                    Ok(data) => return Some(Ok(data)),
                    // Trailers carry nothing for us.
                    Err(_) => continue,
                },
                Err(_) => return Some(Err(Error::transport("body"))),
            }
        }
    }
}

/// The head of a streaming request.
pub(crate) struct Head<'a> {
    pub path: &'a str,
    pub host: &'a str,
    pub bearer: Option<&'a str>,
    /// The observer's headers (trace context).
    pub extra: &'a [(hyper::header::HeaderName, hyper::header::HeaderValue)],
}

/// Sends one streaming request on `io` and reads the response head; the body is read as the
/// stream is.
pub(crate) async fn open<IO>(
    io: IO,
    head: Head<'_>,
    body: Vec<u8>,
    timeouts: &Timeouts,
    limits: sse::Limits,
) -> Result<EventStream, Error>
where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let mut req = hyper::Request::post(head.path)
        .header(hyper::header::HOST, head.host)
        .header("a2a-version", "1.0")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::ACCEPT, "*/*")
        .header(hyper::header::CONNECTION, "close");
    if let Some(b) = head.bearer {
        req = req.header(hyper::header::AUTHORIZATION, b);
    }
    for (k, v) in head.extra {
        req = req.header(k, v);
    }
    // A header value with a line break (a token, say) is refused here, never sent.
    let req = req
        .body(Full::new(Bytes::from(body)))
        .map_err(|_| Error::transport("request"))?;
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .read_buf_exact_size(Some(READ_BUF))
        .handshake::<_, Full<Bytes>>(io)
        .await
        .map_err(|_| Error::transport("request"))?;
    let mut ex = Exchange {
        conn: Some(Box::pin(conn)),
    };
    let response = sender.send_request(req);
    // One request per connection: the connection ends with this response.
    drop(sender);
    let resp = tokio::time::timeout(timeouts.stream_open, ex.with(response))
        .await
        .map_err(|_| Error::transport("timeout"))?
        .map_err(|_| Error::transport("request"))?;
    let status = resp.status().as_u16();
    let is_sse = resp
        .headers()
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        });
    let mut body = resp.into_body();
    let success = (200..300).contains(&status);
    if !success || !is_sse {
        // A JSON body where a stream was expected is an error (or, rarely, one result): never
        // data.
        let bytes = tokio::time::timeout(timeouts.unary, read_all(&mut ex, &mut body))
            .await
            .map_err(|_| Error::transport("timeout"))??;
        let body: Value = serde_json::from_slice(&bytes)
            .map_err(|_| Error::Protocol("response is not JSON".into()))?;
        if !success {
            return Err(Error::Status { status, body });
        }
        return Ok(EventStream::single(rpc_result(body)?));
    }
    Ok(EventStream {
        inner: Inner::Sse(Box::new(SseBody {
            ex,
            body,
            decoder: sse::Decoder::new(limits),
            done: false,
            idle: Idle::new(timeouts.stream_idle),
        })),
    })
}

async fn read_all(ex: &mut Exchange, body: &mut Incoming) -> Result<Vec<u8>, Error> {
    let mut all = Vec::new();
    while let Some(chunk) = ex.chunk(body).await {
        all.extend_from_slice(&chunk?);
        if all.len() > MAX_BODY {
            return Err(Error::Protocol("response body too large".into()));
        }
    }
    Ok(all)
}

enum Inner {
    Single(Option<Value>),
    Sse(Box<SseBody>),
}

struct SseBody {
    ex: Exchange,
    body: Incoming,
    decoder: sse::Decoder,
    done: bool,
    idle: Idle,
}

/// The silence watchdog of a stream. One timer per idle period, not one per chunk: a chunk only
/// records the time; when the timer fires early it is moved to `last + limit`.
struct Idle {
    limit: Duration,
    last: tokio::time::Instant,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Idle {
    fn new(limit: Duration) -> Idle {
        Idle {
            limit,
            last: tokio::time::Instant::now(),
            timer: None,
        }
    }

    /// Waits for `next`, or fails after `limit` without a chunk.
    async fn guard<T>(&mut self, next: impl Future<Output = T>) -> Result<T, Error> {
        if self.limit.is_zero() {
            return Ok(next.await);
        }
        let (limit, last) = (self.limit, self.last);
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(last + limit)));
        let mut next = pin!(next);
        loop {
            tokio::select! {
                biased;
                v = next.as_mut() => {
                    self.last = tokio::time::Instant::now();
                    return Ok(v);
                }
                () = timer.as_mut() => {
                    let due = self.last + limit;
                    if due <= tokio::time::Instant::now() {
                        return Err(Error::transport("idle stream"));
                    }
                    timer.as_mut().reset(due);
                }
            }
        }
    }
}

/// The items of a kernel stream: each is the JSON-RPC `result` object of one SSE event.
pub struct EventStream {
    inner: Inner,
}

impl std::fmt::Debug for EventStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventStream")
    }
}

/// One item of [`EventStream::next_with`].
#[derive(Debug)]
pub enum Next<T> {
    /// The caller's fast parser understood the frame.
    Fast(T),
    /// The frame's JSON-RPC `result` object.
    Item(Value),
}

impl EventStream {
    fn single(v: Value) -> EventStream {
        EventStream {
            inner: Inner::Single(Some(v)),
        }
    }

    /// The next `result` object; `Ok(None)` at the end of the stream. A JSON-RPC error item is
    /// returned as [`Error::Rpc`] (never mistaken for data), malformed frames as
    /// [`Error::Protocol`].
    pub async fn next(&mut self) -> Result<Option<Value>, Error> {
        Ok(self
            .next_with(|_| None::<std::convert::Infallible>)
            .await?
            .map(|n| match n {
                Next::Item(v) => v,
                Next::Fast(never) => match never {},
            }))
    }

    /// Like [`EventStream::next`], but each SSE frame's data is first offered to `fast`; when it
    /// returns `Some`, that is the item and the generic JSON tree is never built.
    pub async fn next_with<T>(
        &mut self,
        fast: impl FnOnce(&[u8]) -> Option<T>,
    ) -> Result<Option<Next<T>>, Error> {
        let data = match &mut self.inner {
            Inner::Single(v) => return Ok(v.take().map(Next::Item)),
            Inner::Sse(s) => loop {
                match s.decoder.next_frame() {
                    Ok(Some(frame)) => break frame.data,
                    Ok(None) => {}
                    Err(e) => return Err(Error::Protocol(e.to_string())),
                }
                if s.done {
                    match s.decoder.finish() {
                        Ok(Some(frame)) => break frame.data,
                        Ok(None) => return Ok(None),
                        Err(e) => return Err(Error::Protocol(e.to_string())),
                    }
                }
                let SseBody { ex, body, idle, .. } = &mut **s;
                match idle.guard(ex.chunk(body)).await? {
                    Some(Ok(chunk)) => s.decoder.push(&chunk),
                    Some(Err(e)) => return Err(e),
                    None => s.done = true,
                }
            },
        };
        if let Some(t) = fast(&data) {
            return Ok(Some(Next::Fast(t)));
        }
        Ok(parse_frame(&data)?.map(Next::Item))
    }
}

fn parse_frame(data: &[u8]) -> Result<Option<Value>, Error> {
    let v: Value = serde_json::from_slice(data)
        .map_err(|_| Error::Protocol("a stream frame is not JSON".into()))?;
    if !v.is_object() {
        return Err(Error::Protocol("a stream frame is not an object".into()));
    }
    if v.get("result").is_some_and(Value::is_object) {
        return rpc_result(v).map(Some);
    }
    if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
        return Err(Error::Rpc(crate::RpcError::from_value(err)));
    }
    // A bare object (no JSON-RPC envelope) is used as the item itself.
    Ok(Some(v))
}

/// Reads every item of a kernel response given as raw bytes, delivered in `pieces` over an
/// in-memory connection (fuzzing hook: hyper's framing and the SSE decoder together). Returns the
/// items up to the first error, and the error.
#[doc(hidden)]
pub async fn decode_response_pieces(pieces: Vec<Vec<u8>>) -> (Vec<Value>, Option<Error>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (client, mut server) = tokio::io::duplex(64 * 1024);
    let writer = tokio::spawn(async move {
        // Read the request head first, as a server would, then answer in pieces.
        let mut buf = vec![0u8; 64 * 1024];
        let mut seen = Vec::new();
        while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
            match server.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
        for p in pieces {
            if server.write_all(&p).await.is_err() {
                return;
            }
            let _ = server.flush().await;
            tokio::task::yield_now().await;
        }
        let _ = server.shutdown().await;
    });
    let head = Head {
        path: "/",
        host: "kernel",
        bearer: None,
        extra: &[],
    };
    let timeouts = Timeouts {
        stream_idle: Duration::ZERO,
        ..Timeouts::default()
    };
    let opened = open(
        hyper_util::rt::TokioIo::new(client),
        head,
        b"{}".to_vec(),
        &timeouts,
        sse::Limits::default(),
    )
    .await;
    let mut items = Vec::new();
    let mut error = None;
    match opened {
        Err(e) => error = Some(e),
        Ok(mut s) => loop {
            match s.next().await {
                Ok(Some(v)) => items.push(v),
                Ok(None) => break,
                Err(e) => {
                    error = Some(e);
                    break;
                }
            }
        },
    }
    writer.abort();
    (items, error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(framing: &str, body: &[u8]) -> Vec<u8> {
        let mut r =
            format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n{framing}\r\n\r\n")
                .into_bytes();
        r.extend_from_slice(body);
        r
    }

    fn chunked(parts: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in parts {
            out.extend_from_slice(format!("{:x}\r\n", p.len()).as_bytes());
            out.extend_from_slice(p);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"0\r\n\r\n");
        out
    }

    const FRAMES: &[u8] =
        b"data: {\"result\":{\"a\":1}}\r\n\r\n: ping\r\n\r\ndata: {\"result\":{\"b\":2}}\r\n\r\n";

    async fn decode(pieces: Vec<Vec<u8>>) -> (Vec<Value>, Option<Error>) {
        decode_response_pieces(pieces).await
    }

    #[tokio::test]
    async fn chunked_length_and_close_delimited_bodies() {
        let (items, err) = decode(vec![response(
            "transfer-encoding: chunked",
            &chunked(&[&FRAMES[..10], &FRAMES[10..]]),
        )])
        .await;
        assert_eq!(items.len(), 2, "{err:?}");
        assert!(err.is_none());
        let (items, err) = decode(vec![response(
            &format!("content-length: {}", FRAMES.len()),
            FRAMES,
        )])
        .await;
        assert_eq!((items.len(), err.is_none()), (2, true));
        let (items, err) = decode(vec![response("connection: close", FRAMES)]).await;
        assert_eq!((items.len(), err.is_none()), (2, true));
    }

    #[tokio::test]
    async fn a_cut_body_is_a_transport_error_after_the_whole_frames() {
        let whole = chunked(&[FRAMES]);
        let (items, err) = decode(vec![response(
            "transfer-encoding: chunked",
            &whole[..whole.len() - 20],
        )])
        .await;
        assert_eq!(items.len(), 1);
        assert!(matches!(err, Some(Error::Transport(_))), "{err:?}");
    }

    #[tokio::test]
    async fn garbage_heads_and_json_errors_are_errors_not_data() {
        let (items, err) = decode(vec![b"NOT HTTP\r\n\r\n".to_vec()]).await;
        assert!(items.is_empty());
        assert!(matches!(err, Some(Error::Transport(_))), "{err:?}");
        let body = br#"{"jsonrpc":"2.0","id":"x","error":{"code":-32001,"message":"no"}}"#;
        let mut r = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(body);
        let (items, err) = decode(vec![r]).await;
        assert!(items.is_empty());
        assert!(err.is_some_and(|e| e.is_task_gone()));
        let mut r = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 2\r\n\r\n{}".to_vec();
        r.truncate(r.len());
        let (_, err) = decode(vec![r]).await;
        assert!(
            matches!(err, Some(Error::Status { status: 503, .. })),
            "{err:?}"
        );
    }

    /// The silence watchdog fails a stream after `limit` without a chunk; each chunk restarts
    /// the period. (Paused time: the test waits for timers only.)
    #[tokio::test(start_paused = true)]
    async fn the_watchdog_counts_silence_from_the_last_chunk() {
        let limit = Duration::from_secs(60);
        let mut idle = Idle::new(limit);
        let start = tokio::time::Instant::now();
        for _ in 0..3 {
            let chunk = tokio::time::sleep(Duration::from_secs(45));
            assert!(idle.guard(chunk).await.is_ok());
        }
        assert_eq!(start.elapsed(), Duration::from_secs(135));
        let silent = std::future::pending::<()>();
        assert!(matches!(idle.guard(silent).await, Err(Error::Transport(_))));
        assert_eq!(start.elapsed(), Duration::from_secs(195));
        // Zero waits forever.
        let mut off = Idle::new(Duration::ZERO);
        let late = tokio::time::sleep(Duration::from_secs(3600));
        assert!(off.guard(late).await.is_ok());
    }

    #[tokio::test]
    async fn a_line_break_in_a_header_value_is_refused_before_sending() {
        let (client, _server) = tokio::io::duplex(1024);
        let head = Head {
            path: "/",
            host: "kernel",
            bearer: Some("Bearer x\r\nx-injected: 1"),
            extra: &[],
        };
        let r = open(
            hyper_util::rt::TokioIo::new(client),
            head,
            vec![],
            &Timeouts::default(),
            sse::Limits::default(),
        )
        .await;
        assert!(matches!(r, Err(Error::Transport(_))));
    }
}
