//! One HTTP/1.1 client connection: request heads, request bodies, responses, keep-alive.
//!
//! A run's response is an event stream that may stay open for hours while its turn waits, so a
//! connection must cost next to nothing while it streams: no per-connection buffers are kept.
//! The request head is read into a buffer that is released before the response starts; request
//! bodies are read on demand; events are written straight from the run's frames (one vectored
//! write of chunk header, frame and CRLF); a client that goes away is noticed at once by a
//! readiness wait on the socket, which drops the response body and so cancels the run.
//!
//! Supported: `Content-Length` and chunked request bodies, `Expect: 100-continue` (answered when
//! the handler first reads the body), keep-alive and pipelining (HTTP/1.1 by default, HTTP/1.0
//! with `Connection: keep-alive`), `Connection: close`, HEAD. Malformed heads get 400, heads over
//! 16 KiB or with over 64 fields 431, ambiguous framing (both `Content-Length` and
//! `Transfer-Encoding`, a non-chunked transfer coding, conflicting lengths) 400; each closes the
//! connection.

use std::io::{self, IoSlice};
use std::pin::pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, Request, Uri, Version};
use axum::Router;
use futures_util::FutureExt;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tower_service::Service;

use a2a::chunked::Dechunker;

/// Largest request head (request line and fields): 16 KiB, uvicorn's default too. A head still
/// arriving holds at most this much memory.
pub(crate) const MAX_HEAD: usize = 16 * 1024;
/// Most header fields in a request head.
const MAX_HEADERS: usize = 64;
/// A request head must be complete this long after its first byte.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Request body bytes read per socket read.
const BODY_READ: usize = 16 * 1024;
/// After answering without reading the whole request body, unread input is discarded for at
/// most this long before the socket closes, so the client reads the answer instead of a reset
/// (a peer's stack may drop received data on a reset; Linux delivers it first, so the loopback
/// tests cannot tell the difference).
const LINGER: Duration = Duration::from_secs(1);
const LINGER_BYTES: usize = 64 * 1024 * 1024;

/// How a request body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    Empty,
    Length(u64),
    Chunked,
}

/// A parsed request head.
#[derive(Debug)]
pub(crate) struct Head {
    pub parts: Parts,
    pub framing: Framing,
    pub keep_alive: bool,
    pub expect_continue: bool,
}

/// Why a request head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeadError {
    /// 400.
    Bad,
    /// 431.
    TooLarge,
}

impl HeadError {
    fn response(self) -> &'static [u8] {
        match self {
            HeadError::Bad => {
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
            }
            HeadError::TooLarge => b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
        }
    }
}

/// Parses a request head at the start of `buf`: the head and its length, `None` if incomplete.
pub(crate) fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, HeadError> {
    use HeadError::Bad;
    let mut fields = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut fields);
    let used = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return if buf.len() >= MAX_HEAD {
                Err(HeadError::TooLarge)
            } else {
                Ok(None)
            }
        }
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(_) => return Err(Bad),
    };
    if used > MAX_HEAD {
        return Err(HeadError::TooLarge);
    }
    let method = Method::from_bytes(req.method.unwrap_or_default().as_bytes()).map_err(|_| Bad)?;
    let uri: Uri = req.path.unwrap_or_default().parse().map_err(|_| Bad)?;
    let version = match req.version {
        Some(0) => Version::HTTP_10,
        Some(1) => Version::HTTP_11,
        _ => return Err(Bad),
    };
    let mut headers = HeaderMap::with_capacity(req.headers.len());
    let mut length: Option<u64> = None;
    let mut transfer_encoding = false;
    let mut chunked = false;
    let (mut close, mut keep) = (false, false);
    let mut expect_continue = false;
    for f in req.headers.iter() {
        let name = HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| Bad)?;
        let value = HeaderValue::from_bytes(f.value).map_err(|_| Bad)?;
        if name == header::CONTENT_LENGTH {
            let n = parse_length(f.value).ok_or(Bad)?;
            if length.is_some_and(|l| l != n) {
                return Err(Bad);
            }
            length = Some(n);
        } else if name == header::TRANSFER_ENCODING {
            transfer_encoding = true;
            // Only the final coding matters: it must be chunked.
            chunked = f
                .value
                .rsplit(|b| *b == b',')
                .next()
                .map(|c| c.trim_ascii().eq_ignore_ascii_case(b"chunked"))
                .unwrap_or(false);
        } else if name == header::CONNECTION {
            for token in f.value.split(|b| *b == b',') {
                let token = token.trim_ascii();
                close |= token.eq_ignore_ascii_case(b"close");
                keep |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name == header::EXPECT {
            expect_continue = f.value.trim_ascii().eq_ignore_ascii_case(b"100-continue");
        }
        headers.append(name, value);
    }
    let framing = if transfer_encoding {
        if !chunked || length.is_some() || version == Version::HTTP_10 {
            return Err(Bad);
        }
        Framing::Chunked
    } else {
        match length {
            None | Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
        }
    };
    let keep_alive = !close && (version == Version::HTTP_11 || keep);
    let mut parts = Request::new(()).into_parts().0;
    parts.method = method;
    parts.uri = uri;
    parts.version = version;
    parts.headers = headers;
    Ok(Some((
        Head {
            parts,
            framing,
            keep_alive,
            expect_continue: expect_continue && version == Version::HTTP_11,
        },
        used,
    )))
}

/// A `Content-Length` value: decimal digits only.
fn parse_length(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Serves requests on `tcp` until the client closes, an error or `shutdown` ends the connection.
pub(crate) async fn serve(mut tcp: TcpStream, app: Router, mut shutdown: watch::Receiver<()>) {
    let mut buf: Vec<u8> = Vec::new();
    let mut linger = false;
    loop {
        let head = match read_head(&mut tcp, &mut buf, &mut shutdown, HEAD_TIMEOUT).await {
            Ok(Some(h)) => h,
            Ok(None) => break,
            Err(e) => {
                let _ = tcp.write_all(e.response()).await;
                linger = true;
                break;
            }
        };
        match serve_one(&mut tcp, &mut buf, &app, head, &shutdown).await {
            Outcome::KeepAlive => continue,
            Outcome::Close => break,
            Outcome::CloseUnread => {
                linger = true;
                break;
            }
            Outcome::Gone => return,
        }
    }
    let _ = tcp.shutdown().await;
    if linger {
        discard_input(&mut tcp).await;
    }
}

/// Reads until a whole request head is buffered. `None`: the connection is to close quietly
/// (the client closed, the server is shutting down while idle, or the head took too long).
async fn read_head(
    tcp: &mut TcpStream,
    buf: &mut Vec<u8>,
    shutdown: &mut watch::Receiver<()>,
    head_timeout: Duration,
) -> Result<Option<Head>, HeadError> {
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        if buf.is_empty() {
            // A quiet kept-alive connection holds no buffer: the first bytes are read through the
            // stack once the socket is readable (readiness may be spurious: then wait again).
            tokio::select! {
                r = tcp.readable() => if r.is_err() { return Ok(None) },
                _ = shutdown.changed() => return Ok(None),
            }
            let mut first = [0u8; 1024];
            match tcp.try_read(&mut first) {
                Ok(0) => return Ok(None),
                Ok(n) => buf.extend_from_slice(&first[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => return Ok(None),
            }
            continue;
        }
        if let Some((head, used)) = parse_head(buf)? {
            buf.drain(..used);
            return Ok(Some(head));
        }
        let deadline = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + head_timeout);
        if buf.capacity() - buf.len() < 256 {
            buf.reserve(buf.len().clamp(1024, MAX_HEAD));
        }
        let read = tokio::select! {
            r = tcp.read_buf(buf) => r,
            () = tokio::time::sleep_until(deadline) => return Ok(None),
        };
        match read {
            Ok(0) | Err(_) => return Ok(None),
            Ok(_) => {}
        }
    }
}

/// How a connection goes on after a response.
enum Outcome {
    KeepAlive,
    Close,
    /// Close, and the request body was not read to its end.
    CloseUnread,
    /// The client went away (or the response failed): drop the socket.
    Gone,
}

/// Serves one request whose head has been read.
async fn serve_one(
    tcp: &mut TcpStream,
    buf: &mut Vec<u8>,
    app: &Router,
    head: Head,
    shutdown: &watch::Receiver<()>,
) -> Outcome {
    let Head {
        parts,
        framing,
        mut keep_alive,
        expect_continue,
    } = head;
    let is_head = parts.method == Method::HEAD;
    let version = parts.version;
    let mut svc = app.clone();
    let mut body_read = true;
    let response = if framing == Framing::Empty {
        let r = svc.call(Request::from_parts(parts, Body::empty())).await;
        unwrap_infallible(r)
    } else {
        let (tx, rx) = mpsc::channel(1);
        let (demand_tx, demand_rx) = oneshot::channel();
        let body = Body::from_stream(RequestBody {
            rx,
            demand: Some(demand_tx),
        });
        let demanded = AtomicBool::new(false);
        let (r, pumped) = {
            let mut call = pin!(svc.call(Request::from_parts(parts, body)));
            let pump = pump_body(tcp, buf, framing, tx, demand_rx, expect_continue, &demanded);
            let mut pump = pin!(pump);
            let mut pumped = None;
            let r = loop {
                tokio::select! {
                    r = call.as_mut() => break r,
                    done = pump.as_mut(), if pumped.is_none() => pumped = Some(done),
                }
            };
            (r, pumped)
        };
        body_read = match pumped {
            Some(done) => done,
            // Answered before the body was asked for: skip it if all of it is here already.
            None => !demanded.load(Ordering::Relaxed) && skip_buffered(buf, framing),
        };
        unwrap_infallible(r)
    };
    if !body_read || closing(shutdown) {
        keep_alive = false;
    }
    // Nothing is buffered between requests of a quiet connection.
    if buf.is_empty() {
        *buf = Vec::new();
    }
    let (parts, mut body) = response.into_parts();
    let status = parts.status;
    let bodyless = is_head || status.is_informational() || status.as_u16() == 204 || status == 304;
    let length = body.size_hint().exact();
    let chunked = !bodyless && length.is_none() && version == Version::HTTP_11;
    if !bodyless && length.is_none() && !chunked {
        // HTTP/1.0 without a length: the body ends when the connection does.
        keep_alive = false;
    }
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\ndate: ");
    out.extend_from_slice(httpdate::fmt_http_date(std::time::SystemTime::now()).as_bytes());
    out.extend_from_slice(b"\r\n");
    // The handler's `Connection` field is not copied: the server writes its own, from what it
    // will do. A handler asking to close is obeyed.
    let mut announced_keep_alive = false;
    let mut has_length = false;
    for value in parts.headers.get_all(header::CONNECTION) {
        let close = value
            .as_bytes()
            .split(|b| *b == b',')
            .any(|t| t.trim_ascii().eq_ignore_ascii_case(b"close"));
        if close {
            keep_alive = false;
        } else {
            announced_keep_alive = true;
        }
    }
    for (name, value) in parts.headers.iter() {
        if name == header::CONNECTION {
            continue;
        }
        // The length is the body's, except for HEAD: the router keeps GET's length there.
        let length_of_get = is_head && name == header::CONTENT_LENGTH;
        if (name == header::CONTENT_LENGTH && !is_head)
            || name == header::TRANSFER_ENCODING
            || name == header::DATE
        {
            continue;
        }
        has_length |= length_of_get;
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    let no_length = status == 304 || status.as_u16() == 204 || has_length;
    if let Some(n) = length.filter(|_| !no_length) {
        out.extend_from_slice(b"content-length: ");
        out.extend_from_slice(n.to_string().as_bytes());
        out.extend_from_slice(b"\r\n");
    } else if chunked {
        out.extend_from_slice(b"transfer-encoding: chunked\r\n");
    }
    if !keep_alive {
        out.extend_from_slice(b"connection: close\r\n");
    } else if announced_keep_alive || version == Version::HTTP_10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
    if bodyless {
        drop(body);
        if tcp.write_all(&out).await.is_err() {
            return Outcome::Gone;
        }
        return after(keep_alive, body_read);
    }
    // A body that is ready at once (every fixed one) leaves in one write with the head.
    let mut head_out = Some(out);
    let mut first = body.frame().now_or_never();
    loop {
        let frame = match first.take() {
            Some(f) => f,
            None => {
                if let Some(h) = head_out.take() {
                    if tcp.write_all(&h).await.is_err() {
                        return Outcome::Gone;
                    }
                }
                tokio::select! {
                    f = body.frame() => f,
                    () = client_gone(tcp, buf) => return Outcome::Gone,
                }
            }
        };
        let data = match frame {
            None => break,
            // The body failed: the response is cut short, never completed.
            Some(Err(_)) => return Outcome::Gone,
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) if !d.is_empty() => d,
                _ => continue,
            },
        };
        let written = match head_out.take() {
            Some(mut h) => {
                if chunked {
                    push_chunk_size(&mut h, data.len());
                }
                h.extend_from_slice(&data);
                if chunked {
                    h.extend_from_slice(b"\r\n");
                }
                tcp.write_all(&h).await
            }
            None => write_data(tcp, &data, chunked).await,
        };
        if written.is_err() {
            return Outcome::Gone;
        }
    }
    let mut end = head_out.unwrap_or_default();
    if chunked {
        end.extend_from_slice(b"0\r\n\r\n");
    }
    if !end.is_empty() && tcp.write_all(&end).await.is_err() {
        return Outcome::Gone;
    }
    after(keep_alive, body_read)
}

fn after(keep_alive: bool, body_read: bool) -> Outcome {
    match (keep_alive, body_read) {
        (true, _) => Outcome::KeepAlive,
        (false, true) => Outcome::Close,
        (false, false) => Outcome::CloseUnread,
    }
}

fn unwrap_infallible<T>(r: Result<T, std::convert::Infallible>) -> T {
    match r {
        Ok(t) => t,
        Err(e) => match e {},
    }
}

/// Whether the server is shutting down (the sender is dropped to ask for it).
fn closing(shutdown: &watch::Receiver<()>) -> bool {
    shutdown.has_changed().unwrap_or(true)
}

/// `{n:x}\r\n` in `stack`.
fn chunk_size(n: usize, stack: &mut [u8; 18]) -> &[u8] {
    let mut i = 16;
    let mut n = n;
    loop {
        i -= 1;
        stack[i] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    stack[16..].copy_from_slice(b"\r\n");
    &stack[i..]
}

fn push_chunk_size(out: &mut Vec<u8>, n: usize) {
    out.extend_from_slice(chunk_size(n, &mut [0; 18]));
}

/// Writes one body frame (as one chunk when `chunked`) without copying it.
async fn write_data(tcp: &mut TcpStream, data: &[u8], chunked: bool) -> io::Result<()> {
    if !chunked {
        return tcp.write_all(data).await;
    }
    let mut stack = [0u8; 18];
    let size = chunk_size(data.len(), &mut stack);
    let mut slices = [
        IoSlice::new(size),
        IoSlice::new(data),
        IoSlice::new(b"\r\n"),
    ];
    let mut rest: &mut [IoSlice<'_>] = &mut slices;
    while !rest.is_empty() {
        let n = tcp.write_vectored(rest).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut rest, n);
    }
    Ok(())
}

/// Resolves when the client has closed its side or the connection failed. Bytes the client sends
/// meanwhile (a pipelined next request) are kept in `buf`, up to one head's worth.
async fn client_gone(tcp: &TcpStream, buf: &mut Vec<u8>) {
    loop {
        // The socket's own read-waker slot (no waiter list to join and leave per event).
        if std::future::poll_fn(|cx| tcp.poll_read_ready(cx))
            .await
            .is_err()
        {
            return;
        }
        let full = {
            let mut probe = [0u8; 1024];
            match tcp.try_read(&mut probe) {
                Ok(0) => return,
                Ok(n) => {
                    buf.extend_from_slice(&probe[..n]);
                    buf.len() >= MAX_HEAD
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => false,
                Err(_) => return,
            }
        };
        if full {
            // Enough queued: read no further until this response ends.
            std::future::pending::<()>().await;
        }
    }
}

/// The request body handed to the handler: chunks from the connection, read once asked for.
struct RequestBody {
    rx: mpsc::Receiver<io::Result<Bytes>>,
    demand: Option<oneshot::Sender<()>>,
}

impl futures_util::Stream for RequestBody {
    type Item = io::Result<Bytes>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(d) = this.demand.take() {
            let _ = d.send(());
        }
        this.rx.poll_recv(cx)
    }
}

/// Feeds the request body to the handler once it asks for it. Returns whether the body was read
/// to its end (so the connection can carry another request).
async fn pump_body(
    tcp: &mut TcpStream,
    buf: &mut Vec<u8>,
    framing: Framing,
    tx: mpsc::Sender<io::Result<Bytes>>,
    demand: oneshot::Receiver<()>,
    expect_continue: bool,
    demanded: &AtomicBool,
) -> bool {
    let mut left = match framing {
        Framing::Length(n) => n,
        _ => 0,
    };
    let mut chunks = Dechunker::default();
    if demand.await.is_err() {
        // The handler answered without the body: skip it if it has arrived already.
        return skip_buffered(buf, framing);
    }
    demanded.store(true, Ordering::Relaxed);
    if expect_continue
        && buf.is_empty()
        && tcp
            .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            .await
            .is_err()
    {
        return false;
    }
    let cut = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    loop {
        if buf.is_empty() {
            buf.reserve(BODY_READ);
            match tcp.read_buf(buf).await {
                Ok(n) if n > 0 => {}
                _ => {
                    let _ = tx.send(Err(cut("request body cut short"))).await;
                    return false;
                }
            }
        }
        let (data, used, done) = match framing {
            Framing::Chunked => {
                let mut out = Vec::new();
                match chunks.feed(buf, &mut out) {
                    Ok(used) => (Bytes::from(out), used, chunks.is_done()),
                    Err(_) => {
                        let _ = tx.send(Err(cut("malformed chunked request body"))).await;
                        return false;
                    }
                }
            }
            _ => {
                let take = left.min(buf.len() as u64) as usize;
                left -= take as u64;
                (Bytes::copy_from_slice(&buf[..take]), take, left == 0)
            }
        };
        buf.drain(..used);
        if !data.is_empty() && tx.send(Ok(data)).await.is_err() {
            return false;
        }
        if done {
            return true;
        }
    }
}

/// Drops a request body nobody read from `buf`, if all of it is there.
fn skip_buffered(buf: &mut Vec<u8>, framing: Framing) -> bool {
    match framing {
        Framing::Empty => true,
        Framing::Length(length) => {
            if (buf.len() as u64) < length {
                return false;
            }
            buf.drain(..length as usize);
            true
        }
        Framing::Chunked => {
            let mut chunks = Dechunker::default();
            let mut sink = Vec::new();
            match chunks.feed(buf, &mut sink) {
                Ok(used) if chunks.is_done() => {
                    buf.drain(..used);
                    true
                }
                _ => false,
            }
        }
    }
}

/// Reads and drops what the client still sends, for a short while, before the socket closes.
async fn discard_input(tcp: &mut TcpStream) {
    let _ = tokio::time::timeout(LINGER, async {
        let mut seen = 0;
        let mut scratch = vec![0u8; 16 * 1024];
        while seen < LINGER_BYTES {
            match tcp.read(&mut scratch).await {
                Ok(0) | Err(_) => return,
                Ok(n) => seen += n,
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(raw: &str) -> Result<Option<(Head, usize)>, HeadError> {
        parse_head(raw.as_bytes())
    }

    #[test]
    fn heads_and_framing() {
        let raw = "POST /x?y=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello";
        let (h, used) = head(raw).unwrap().unwrap();
        assert_eq!(&raw[used..], "hello");
        assert_eq!(h.parts.method, Method::POST);
        assert_eq!(h.parts.uri.path(), "/x");
        assert_eq!(h.framing, Framing::Length(5));
        assert!(h.keep_alive);
        let (h, _) = head("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, Chunked\r\nExpect: 100-Continue\r\nConnection: close\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Chunked);
        assert!(h.expect_continue);
        assert!(!h.keep_alive);
        let (h, _) = head("GET / HTTP/1.0\r\n\r\n").unwrap().unwrap();
        assert!(!h.keep_alive);
        assert_eq!(h.framing, Framing::Empty);
        let (h, _) = head("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(h.keep_alive);
        assert!(head("GET / HTTP/1.1\r\nHost: a\r\n").unwrap().is_none());
        let (h, _) = head("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(h.framing, Framing::Length(3));
    }

    #[test]
    fn refused_heads() {
        for bad in [
            "GARBAGE\r\n\r\n",
            "GET / HTTP/2.0\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 0x10\r\n\r\n",
            "POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
            "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            "POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            "GET /\x01 HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
        ] {
            assert_eq!(head(bad).unwrap_err(), HeadError::Bad, "{bad:?}");
        }
        let many: String = (0..MAX_HEADERS + 1)
            .map(|i| format!("x-{i}: v\r\n"))
            .collect();
        assert_eq!(
            head(&format!("GET / HTTP/1.1\r\n{many}\r\n")).unwrap_err(),
            HeadError::TooLarge
        );
        let long = format!("GET / HTTP/1.1\r\nx: {}", "a".repeat(MAX_HEAD));
        assert_eq!(head(&long).unwrap_err(), HeadError::TooLarge);
    }

    async fn pair() -> (TcpStream, TcpStream) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        (l.accept().await.unwrap().0, client)
    }

    #[tokio::test]
    async fn a_head_must_complete_in_time_but_a_quiet_connection_may_wait() {
        let limit = Duration::from_millis(200);
        // Started and not finished: dropped once the head's time is up.
        let (mut server, mut client) = pair().await;
        client
            .write_all(b"GET /health HTTP/1.1\r\nhost")
            .await
            .unwrap();
        let (_tx, mut rx) = watch::channel(());
        let mut buf = Vec::new();
        let began = tokio::time::Instant::now();
        let r = read_head(&mut server, &mut buf, &mut rx, limit).await;
        assert!(matches!(r, Ok(None)));
        assert!(began.elapsed() >= limit);
        // Trickling bytes does not extend it.
        let (mut server, mut client) = pair().await;
        let trickle = tokio::spawn(async move {
            for b in b"GET /health HTTP/1.1\r\nx: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" {
                if client.write_all(&[*b]).await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let began = tokio::time::Instant::now();
        let r = read_head(&mut server, &mut Vec::new(), &mut rx, limit).await;
        assert!(matches!(r, Ok(None)));
        assert!(began.elapsed() < limit * 3);
        trickle.abort();
        // Quiet (nothing sent): not timed out; it ends when the server shuts down.
        let (mut server, _client) = pair().await;
        let (tx, mut rx) = watch::channel(());
        let mut buf = Vec::new();
        let r = {
            let mut wait = std::pin::pin!(read_head(&mut server, &mut buf, &mut rx, limit));
            assert!(tokio::time::timeout(limit * 2, wait.as_mut())
                .await
                .is_err());
            drop(tx);
            tokio::time::timeout(limit, wait)
                .await
                .expect("ends at shutdown")
        };
        assert!(matches!(r, Ok(None)));
        assert_eq!(buf.capacity(), 0, "a quiet connection holds no buffer");
    }

    /// Serves `app` on one accepted connection; returns the client side.
    async fn served(app: Router) -> TcpStream {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
        let server = l.accept().await.unwrap().0;
        let (tx, rx) = watch::channel(());
        tokio::spawn(async move {
            serve(server, app, rx).await;
            drop(tx);
        });
        client
    }

    async fn read_all(mut c: TcpStream) -> String {
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out))
            .await
            .expect("closed within 10 s")
            .expect("read without a reset");
        String::from_utf8(out).unwrap()
    }

    #[tokio::test]
    async fn a_handler_asking_to_close_is_obeyed() {
        let app = Router::new().route(
            "/",
            axum::routing::get(|| async { ([(header::CONNECTION, "close")], "bye") }),
        );
        let mut c = served(app).await;
        c.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\nGET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let all = read_all(c).await;
        assert_eq!(all.matches("HTTP/1.1 200").count(), 1, "{all}");
        assert!(all.contains("connection: close\r\n"), "{all}");
        assert!(!all.contains("keep-alive"), "{all}");
        assert!(all.ends_with("\r\n\r\nbye"), "{all}");
    }

    #[test]
    fn chunk_sizes_are_lower_hex() {
        for (n, want) in [
            (0, "0\r\n"),
            (10, "a\r\n"),
            (255, "ff\r\n"),
            (65536, "10000\r\n"),
        ] {
            let mut out = Vec::new();
            push_chunk_size(&mut out, n);
            assert_eq!(out, want.as_bytes());
        }
    }

    #[test]
    fn unread_bodies_are_skipped_only_when_buffered() {
        let mut buf = b"helloGET".to_vec();
        assert!(skip_buffered(&mut buf, Framing::Length(5)));
        assert_eq!(buf, b"GET");
        let mut buf = b"hel".to_vec();
        assert!(!skip_buffered(&mut buf, Framing::Length(5)));
        let mut buf = b"2\r\nok\r\n0\r\n\r\nGET".to_vec();
        assert!(skip_buffered(&mut buf, Framing::Chunked));
        assert_eq!(buf, b"GET");
        let mut buf = b"2\r\nok\r\n".to_vec();
        assert!(!skip_buffered(&mut buf, Framing::Chunked));
    }
}
