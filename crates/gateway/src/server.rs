//! The accept loop: each connection served by hyper's HTTP/1.1 server, with graceful shutdown.
//!
//! hyper gives keep-alive, pipelining, `Expect: 100-continue` (answered when a route first reads
//! the body), HEAD (GET's length, no body), `Connection: close`, HTTP/1.0, a bounded request
//! head (431 above [`MAX_HEAD`] or [`MAX_HEADERS`] fields) and a header-read timeout. A client
//! that closes its connection while its response streams is noticed at once (hyper watches for
//! end of input mid-message), which drops the response body and so cancels the run.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// Largest request head: 16 KiB, as uvicorn's default. hyper's read buffer is bounded by it, so
/// a head still arriving holds at most this much memory.
pub const MAX_HEAD: usize = 16 * 1024;
/// Most header fields in a request head.
pub const MAX_HEADERS: usize = 64;
/// A request head must be complete this long after the connection starts waiting for it; an
/// idle kept-alive connection is closed after as long.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

fn builder() -> http1::Builder {
    let mut b = http1::Builder::new();
    b.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT)
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
    let conn = builder().serve_connection(TokioIo::new(io), TowerToHyperService::new(app));
    if let Err(e) = conn.await {
        tracing::trace!(error = %e, "connection ended with an error");
    }
}

/// Serves `app` on `listener` until `graceful` resolves; then stops accepting, lets every
/// connection finish its current response (idle keep-alive connections close at once) and
/// returns once all are gone.
pub async fn serve(listener: TcpListener, app: Router, graceful: impl Future<Output = ()>) {
    let builder = builder();
    let shutdown = GracefulShutdown::new();
    let mut graceful = pin!(graceful);
    loop {
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
        // Events are small writes: disable Nagle so they leave at once (no delayed-ACK stalls).
        let _ = tcp.set_nodelay(true);
        let conn =
            builder.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app.clone()));
        let conn = shutdown.watch(conn);
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::trace!(error = %e, "connection ended with an error");
            }
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
