//! A minimal HTTP/1.1 client for the kernel's streaming calls.
//!
//! A streaming call holds its connection for the whole turn — or for hours, when the turn waits.
//! Through the general-purpose client each such connection carried two 8 KiB buffers, a request
//! dispatch channel (~9 KiB) and a connection task; here an open stream is a socket and a few
//! words of state, and bytes are read through a stack buffer, so a quiet stream holds no buffer at
//! all. One request per connection (`Connection: close`); unary calls keep the pooled client.
//!
//! Supported responses: chunked, `Content-Length` and close-delimited bodies. Any malformed
//! response head or chunk framing is a transport error, never data.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::chunked::Dechunker;
use crate::Error;

/// Largest response head accepted.
const MAX_HEAD: usize = 64 * 1024;
/// Bytes read per poll (on the stack).
const READ_CHUNK: usize = 32 * 1024;

/// Where streaming requests go: parsed from a plain `http://host[:port]/path` base URL.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// `host:port` to connect to (IPv6 hosts bracketed).
    connect: String,
    /// The `Host` header.
    host_header: String,
    /// Request target (path and query).
    path: String,
}

impl Target {
    /// `None` for anything but a plain `http://` URL without credentials (those use the general
    /// client).
    pub(crate) fn parse(base: &str) -> Option<Target> {
        let rest = base.strip_prefix("http://")?;
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.is_empty() || authority.contains('@') || path.contains('#') {
            return None;
        }
        let path = if path.starts_with('?') {
            format!("/{path}")
        } else {
            path.to_owned()
        };
        let has_port = match authority.rfind(']') {
            Some(end) => authority[end..].contains(':'),
            None => authority.contains(':'),
        };
        let connect = if has_port {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        Some(Target {
            connect,
            host_header: authority.to_owned(),
            path,
        })
    }
}

/// A response head.
pub(crate) struct Head {
    pub status: u16,
    pub event_stream: bool,
    framing: Framing,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Framing {
    Chunked,
    Length(u64),
    Close,
}

/// Sends one request and reads the response head (within the caller's timeout).
pub(crate) async fn send(
    target: &Target,
    headers: &[(&str, &str)],
    body: &[u8],
    connect_timeout: Duration,
) -> Result<(Head, Body), Error> {
    let mut tcp = tokio::time::timeout(connect_timeout, TcpStream::connect(&target.connect))
        .await
        .map_err(|_| Error::Transport("connect".into()))?
        .map_err(|_| Error::Transport("connect".into()))?;
    let _ = tcp.set_nodelay(true);
    let mut req = Vec::with_capacity(256 + body.len());
    req.extend_from_slice(b"POST ");
    req.extend_from_slice(target.path.as_bytes());
    req.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    req.extend_from_slice(target.host_header.as_bytes());
    req.extend_from_slice(b"\r\naccept: */*\r\nconnection: close\r\n");
    for (k, v) in headers {
        if v.bytes().any(|b| b == b'\r' || b == b'\n') {
            return Err(Error::Transport("request".into()));
        }
        req.extend_from_slice(k.as_bytes());
        req.extend_from_slice(b": ");
        req.extend_from_slice(v.as_bytes());
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    req.extend_from_slice(body);
    tcp.write_all(&req)
        .await
        .map_err(|_| Error::Transport("request".into()))?;
    drop(req);

    let mut buf = Vec::with_capacity(1024);
    let (head, used) = loop {
        let mut chunk = [0u8; 4096];
        let n = tcp
            .read(&mut chunk)
            .await
            .map_err(|_| Error::Transport("request".into()))?;
        if n == 0 {
            return Err(Error::Transport("request".into()));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(parsed) = parse_head(&buf)? {
            break parsed;
        }
        if buf.len() > MAX_HEAD {
            return Err(Error::Protocol("response head too large".into()));
        }
    };
    let mut body = Body::new(tcp, head.framing);
    let early = body.feed(&buf[used..])?;
    body.early = early;
    Ok((head, body))
}

/// Parses a complete head: `Ok(None)` while incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<(Head, usize)>, Error> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let used = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(Error::Protocol("malformed response head".into())),
    };
    let status = resp.code.unwrap_or(0);
    let mut event_stream = false;
    let mut chunked = false;
    let mut length: Option<u64> = None;
    for h in resp.headers.iter() {
        let value = std::str::from_utf8(h.value).unwrap_or("").trim();
        if h.name.eq_ignore_ascii_case("content-type") {
            event_stream = value.to_ascii_lowercase().starts_with("text/event-stream");
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value
                .rsplit(',')
                .next()
                .is_some_and(|last| last.trim().eq_ignore_ascii_case("chunked"));
            if !chunked {
                return Err(Error::Protocol("unsupported transfer encoding".into()));
            }
        } else if h.name.eq_ignore_ascii_case("content-length") {
            let n: u64 = value
                .parse()
                .map_err(|_| Error::Protocol("malformed content-length".into()))?;
            if length.is_some_and(|l| l != n) {
                return Err(Error::Protocol("conflicting content-length".into()));
            }
            length = Some(n);
        }
    }
    // 1xx informational heads are not expected from the kernel: treat as malformed.
    if !(200..600).contains(&status) {
        return Err(Error::Protocol("unexpected status".into()));
    }
    let framing = if chunked {
        Framing::Chunked
    } else if let Some(n) = length {
        Framing::Length(n)
    } else if status == 204 || status == 304 {
        Framing::Length(0)
    } else {
        Framing::Close
    };
    Ok(Some((
        Head {
            status,
            event_stream,
            framing,
        },
        used,
    )))
}

/// A response body read from the socket.
pub(crate) struct Body {
    tcp: TcpStream,
    framing: Framing,
    chunks: Dechunker,
    /// Bytes left of a `Content-Length` body.
    left: u64,
    /// Body bytes that arrived with the head.
    early: Option<Bytes>,
    done: bool,
}

impl Body {
    fn new(tcp: TcpStream, framing: Framing) -> Body {
        let left = match framing {
            Framing::Length(n) => n,
            _ => 0,
        };
        Body {
            tcp,
            framing,
            chunks: Dechunker::default(),
            left,
            early: None,
            done: matches!(framing, Framing::Length(0)),
        }
    }

    /// Decodes raw bytes into body bytes (`None`: nothing of the body in them).
    fn feed(&mut self, raw: &[u8]) -> Result<Option<Bytes>, Error> {
        if raw.is_empty() || self.done {
            return Ok(None);
        }
        let out = match self.framing {
            Framing::Close => raw.to_vec(),
            Framing::Length(_) => {
                let take = (self.left.min(raw.len() as u64)) as usize;
                self.left -= take as u64;
                if self.left == 0 {
                    self.done = true;
                }
                raw[..take].to_vec()
            }
            Framing::Chunked => {
                let mut out = Vec::new();
                self.chunks
                    .feed(raw, &mut out)
                    .map_err(|e| Error::Protocol(e.to_string()))?;
                self.done = self.chunks.is_done();
                out
            }
        };
        Ok((!out.is_empty()).then(|| Bytes::from(out)))
    }
}

impl futures_util::Stream for Body {
    type Item = Result<Bytes, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(early) = this.early.take() {
            return Poll::Ready(Some(Ok(early)));
        }
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            // Not zeroed: only the bytes the socket filled are read back.
            let mut stack = [std::mem::MaybeUninit::<u8>::uninit(); READ_CHUNK];
            let mut rb = ReadBuf::uninit(&mut stack);
            match Pin::new(&mut this.tcp).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => {
                    this.done = true;
                    return Poll::Ready(Some(Err(Error::Transport("body".into()))));
                }
                Poll::Ready(Ok(())) => {
                    let filled = rb.filled();
                    let n = filled.len();
                    if n == 0 {
                        this.done = true;
                        // Only a close-delimited body may end at EOF.
                        if this.framing == Framing::Close {
                            return Poll::Ready(None);
                        }
                        return Poll::Ready(Some(Err(Error::Transport("body".into()))));
                    }
                    match this.feed(filled) {
                        Ok(Some(bytes)) => return Poll::Ready(Some(Ok(bytes))),
                        Ok(None) => continue,
                        Err(e) => {
                            this.done = true;
                            return Poll::Ready(Some(Err(e)));
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets() {
        let t = Target::parse("http://127.0.0.1:8080/").unwrap();
        assert_eq!(
            (t.connect.as_str(), t.path.as_str()),
            ("127.0.0.1:8080", "/")
        );
        let t = Target::parse("http://localhost/a2a/").unwrap();
        assert_eq!(
            (t.connect.as_str(), t.host_header.as_str()),
            ("localhost:80", "localhost")
        );
        assert_eq!(t.path, "/a2a/");
        let t = Target::parse("http://[::1]:9/").unwrap();
        assert_eq!(t.connect, "[::1]:9");
        assert_eq!(Target::parse("http://[::1]/").unwrap().connect, "[::1]:80");
        assert!(Target::parse("https://127.0.0.1/").is_none());
        assert!(Target::parse("http://u:p@127.0.0.1/").is_none());
    }

    #[test]
    fn heads() {
        let wire: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\ntransfer-encoding: chunked\r\n\r\nrest";
        let (h, used) = parse_head(wire).unwrap().unwrap();
        assert!(h.event_stream && h.status == 200 && h.framing == Framing::Chunked);
        assert_eq!(&wire[used..], b"rest");
        let (h, _) = parse_head(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 12\r\ncontent-type: application/json\r\n\r\n")
            .unwrap()
            .unwrap();
        assert!(!h.event_stream && h.status == 401 && h.framing == Framing::Length(12));
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ncontent-le")
            .unwrap()
            .is_none());
        assert!(parse_head(b"garbage\r\n\r\n").is_err());
        assert!(parse_head(b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n").is_err());
        assert!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n")
                .is_err()
        );
        let (h, _) = parse_head(b"HTTP/1.0 200 OK\r\n\r\n").unwrap().unwrap();
        assert_eq!(h.framing, Framing::Close);
    }

    /// Serves one connection: reads the request, then writes `parts` with a pause between them.
    async fn serve_once(parts: Vec<&'static [u8]>) -> Target {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut req = vec![0u8; 4096];
            let _ = s.read(&mut req).await.unwrap();
            for p in parts {
                s.write_all(p).await.unwrap();
                s.flush().await.unwrap();
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        Target::parse(&format!("http://{addr}/")).unwrap()
    }

    async fn fetch(parts: Vec<&'static [u8]>) -> Result<(u16, bool, Vec<u8>), Error> {
        use futures_util::StreamExt;
        let t = serve_once(parts).await;
        let (head, mut body) =
            send(&t, &[("a2a-version", "1.0")], b"{}", Duration::from_secs(5)).await?;
        let mut all = Vec::new();
        while let Some(part) = body.next().await {
            all.extend_from_slice(&part?);
        }
        Ok((head.status, head.event_stream, all))
    }

    #[tokio::test]
    async fn bodies_over_a_socket() {
        // Chunked, split anywhere, with body bytes arriving together with the head.
        let (status, sse, body) = fetch(vec![
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n6\r\ndata: ",
            b"\r\n3\r\nx\n\n\r",
            b"\n0\r\n\r\n",
        ])
        .await
        .unwrap();
        assert_eq!(
            (status, sse, body.as_slice()),
            (200, true, &b"data: x\n\n"[..])
        );
        // Content-Length (a JSON-RPC error where a stream was expected).
        let (status, sse, body) = fetch(vec![
            b"HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\ncontent-length: 9\r\n\r\n{\"a\":",
            b"\"b\"}",
        ])
        .await
        .unwrap();
        assert_eq!(
            (status, sse, body.as_slice()),
            (401, false, &b"{\"a\":\"b\"}"[..])
        );
        // Close-delimited.
        let (_, _, body) = fetch(vec![b"HTTP/1.0 200 OK\r\n\r\nall ", b"of it"])
            .await
            .unwrap();
        assert_eq!(body, b"all of it");
        // Cut inside a chunk, or before the last chunk: a transport error, never a clean end.
        for cut in [
            &b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n10\r\nshort"[..],
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n1\r\nx\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort",
        ] {
            let leaked: &'static [u8] = Box::leak(cut.to_vec().into_boxed_slice());
            assert!(matches!(
                fetch(vec![leaked]).await,
                Err(Error::Transport(_))
            ));
        }
        // No response at all; a garbage head.
        assert!(matches!(fetch(vec![]).await, Err(Error::Transport(_))));
        assert!(matches!(
            fetch(vec![b"SMTP ready\r\n\r\n"]).await,
            Err(Error::Protocol(_))
        ));
    }

    #[tokio::test]
    async fn a_refused_connection_is_a_transport_error() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        drop(l);
        let t = Target::parse(&format!("http://{addr}/")).unwrap();
        assert!(matches!(
            send(&t, &[], b"{}", Duration::from_secs(5)).await,
            Err(Error::Transport(_))
        ));
        // Header values that would split the request are refused before anything is sent.
        let t = serve_once(vec![]).await;
        assert!(send(
            &t,
            &[("authorization", "Bearer x\r\nevil: 1")],
            b"{}",
            Duration::from_secs(5)
        )
        .await
        .is_err());
    }
}
