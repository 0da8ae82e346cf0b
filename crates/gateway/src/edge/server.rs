//! The accept loop: each connection served by hyper's HTTP/1.1 server, with graceful shutdown.
//!
//! hyper gives keep-alive, pipelining, `Expect: 100-continue` (answered when a route first reads
//! the body), HEAD (GET's length, no body), `Connection: close`, HTTP/1.0, a bounded request
//! head (431 above [`MAX_HEAD`] or [`MAX_HEADERS`] fields) and a header-read timeout. A client
//! that closes its connection while its response streams is noticed at once (hyper watches for
//! end of input mid-message), which drops the response body and so cancels the run. Accepted
//! sockets probe an idle peer (TCP keep-alive), so a connection whose peer vanished without a
//! word (a host powered off, a network gone) is noticed and closed; one whose writes make no
//! progress for the client stall timeout is closed too (see [`WriteDeadline`]).
//!
//! With a [`ConnectionCap`], at most that many connections are open at once: at the cap the loop
//! stops accepting until one closes, so further clients wait in the listening socket's accept
//! queue (and, once it is full, their SYNs are retried by their own stack) instead of costing a
//! task, a buffer and a descriptor each. This is what tokio's and hyper's own answer to "how do I
//! cap connections" is (a semaphore permit taken before `accept`), rather than accepting and
//! answering 503: that still costs an accept, a write and a close per connection at the moment
//! the gateway is loaded most, and gives a flood of idle connections nothing to wait on.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::edge::write_deadline::WriteDeadline;

/// Largest request head: 16 KiB, as uvicorn's default. hyper's read buffer is bounded by it, so
/// a head still arriving holds at most this much memory.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most header fields in a request head.
pub const MAX_HEADERS: usize = 64;
/// A request head must be complete this long after the connection starts waiting for it; an
/// idle kept-alive connection is closed after as long.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// TCP keep-alive of accepted sockets: the first probe after this long without traffic, then one
/// every [`KEEPALIVE_INTERVAL`]; the system's count of unanswered probes closes the connection.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(60);
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(15);

/// The options of an accepted socket (best effort: a socket that refuses one is served as it is).
fn prepare(tcp: &tokio::net::TcpStream) {
    // Events are small writes: disable Nagle so they leave at once (no delayed-ACK stalls).
    let _ = tcp.set_nodelay(true);
    let ka = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL);
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_keepalive(&ka) {
        tracing::debug!(error = %e, "TCP keep-alive could not be set");
    }
}

fn builder(head_timeout: Duration) -> http1::Builder {
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(head_timeout)
        .max_buf_size(MAX_HEAD)
        .max_headers(MAX_HEADERS);
    b
}

/// Serves one connection on any byte stream until it closes (the accept loop's step; also the
/// fuzzing hook, which drives it over an in-memory pipe).
pub async fn serve_connection<IO>(io: IO, app: Router)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let conn =
        builder(HEAD_TIMEOUT).serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    if let Err(e) = conn.await {
        tracing::trace!(error = %e, "connection ended with an error");
    }
}

/// The most connections a listener keeps open at once, and what to do each time the loop has to
/// wait for one to close (count it).
pub struct ConnectionCap {
    pub max: usize,
    pub on_full: Box<dyn Fn() + Send + Sync>,
}

/// Serves `app` on `listener` until `graceful` resolves; then stops accepting, lets every
/// connection finish its current response (idle keep-alive connections close at once) and
/// returns once all are gone. A connection whose writes make no progress for `stall` is closed.
/// With `cap`, no more than `cap.max` connections are open at once (see the module's comment).
/// With `tls`, each connection first completes a TLS handshake within
/// [`tls::HANDSHAKE_TIMEOUT`], on its own task (a slow handshake holds its connection's
/// slot, never the accept loop).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    stall: Duration,
    cap: Option<ConnectionCap>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    graceful: impl Future<Output = ()>,
) {
    serve_timed(listener, app, stall, HEAD_TIMEOUT, cap, tls, graceful).await;
}

/// [`serve`], a request head (and an idle kept-alive connection) given `head_timeout`.
pub async fn serve_timed(
    listener: TcpListener,
    app: Router,
    stall: Duration,
    head_timeout: Duration,
    cap: Option<ConnectionCap>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    graceful: impl Future<Output = ()>,
) {
    let builder = builder(head_timeout);
    let shutdown = GracefulShutdown::new();
    let mut graceful = pin!(graceful);
    let slots = cap.map(|c| (Arc::new(Semaphore::new(c.max)), c.on_full));
    // Under sustained load the cap is reached at every accept: said at most once a minute
    // (`agui_limit_reached_total` counts every time).
    let mut said: Option<tokio::time::Instant> = None;
    loop {
        // A slot first, then the connection: at the cap, nothing more is accepted.
        let slot = match &slots {
            None => None,
            Some((free, on_full)) => match free.clone().try_acquire_owned() {
                Ok(p) => Some(p),
                Err(_) => {
                    on_full();
                    if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                        said = Some(tokio::time::Instant::now());
                        tracing::warn!(
                            "the connection cap is reached: new connections wait until one closes"
                        );
                    }
                    tokio::select! {
                        p = free.clone().acquire_owned() => p.ok(),
                        () = &mut graceful => break,
                    }
                }
            },
        };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut graceful => break,
        };
        let tcp = match accepted {
            Ok((tcp, _)) => tcp,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                // Out of descriptors and the like: wait instead of spinning.
                tracing::error!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        prepare(&tcp);
        let io = WriteDeadline::new(tcp, stall);
        let service = TowerToHyperService::new(app.clone());
        let Some(acceptor) = &tls else {
            let conn = builder.serve_connection(TokioIo::new(io), service);
            let conn = shutdown.watch(conn);
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::trace!(error = %e, "connection ended with an error");
                }
                // The slot is free once the connection is gone.
                drop(slot);
            });
            continue;
        };
        let (acceptor, builder) = (acceptor.clone(), builder.clone());
        let watcher = shutdown.watcher();
        tokio::spawn(async move {
            let handshake = tokio::time::timeout(tls::HANDSHAKE_TIMEOUT, acceptor.accept(io));
            let stream = match handshake.await {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(e) = watcher.watch(conn).await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    shutdown.shutdown().await;
}

/// Errors of one connection, not of the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset | Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn app() -> Router {
        Router::new().route("/health", axum::routing::get(|| async { "ok" }))
    }

    /// Reads until the peer closes; `None` if it stays open past `limit`.
    async fn read_to_close(io: &mut tokio::io::DuplexStream, limit: Duration) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        tokio::time::timeout(limit, io.read_to_end(&mut out))
            .await
            .ok()
            .map(|_| out)
    }

    /// A head still incomplete `HEAD_TIMEOUT` after the connection began waiting for it is
    /// dropped; so is a kept-alive connection that stays quiet as long. (Paused time.)
    #[tokio::test(start_paused = true)]
    async fn slow_heads_and_quiet_connections_are_closed_after_the_head_timeout() {
        let (mut client, conn) = tokio::io::duplex(4096);
        tokio::spawn(serve_connection(conn, app()));
        client
            .write_all(b"GET /health HTTP/1.1\r\nho")
            .await
            .unwrap();
        let start = tokio::time::Instant::now();
        let out = read_to_close(&mut client, HEAD_TIMEOUT * 2).await;
        assert!(out.is_some(), "the connection stayed open");
        assert!(start.elapsed() >= HEAD_TIMEOUT);
        assert!(!out.unwrap().starts_with(b"HTTP/1.1 200"));

        let (mut client, conn) = tokio::io::duplex(4096);
        tokio::spawn(serve_connection(conn, app()));
        client
            .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let start = tokio::time::Instant::now();
        let out = read_to_close(&mut client, HEAD_TIMEOUT * 2).await.unwrap();
        assert!(out.starts_with(b"HTTP/1.1 200"), "answered first");
        assert!(start.elapsed() >= HEAD_TIMEOUT, "then closed when quiet");
    }

    /// Accepted sockets send events at once and probe an idle peer.
    #[tokio::test]
    async fn accepted_sockets_have_keep_alive_and_no_delay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (tcp, _) = listener.accept().await.unwrap();
        assert!(!socket2::SockRef::from(&tcp).keepalive().unwrap());
        prepare(&tcp);
        assert!(socket2::SockRef::from(&tcp).keepalive().unwrap());
        assert!(tcp.nodelay().unwrap());
    }

    /// A head that completes within the timeout is answered, however slowly it trickles in.
    #[tokio::test(start_paused = true)]
    async fn a_head_within_the_timeout_is_answered() {
        let (mut client, conn) = tokio::io::duplex(4096);
        tokio::spawn(serve_connection(conn, app()));
        for piece in [&b"GET /health HTTP/1.1\r\n"[..], b"host: x\r\n", b"\r\n"] {
            tokio::time::sleep(HEAD_TIMEOUT / 4).await;
            client.write_all(piece).await.unwrap();
        }
        let mut buf = [0u8; 64];
        let n = client.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
    }
}
