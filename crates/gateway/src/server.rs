//! The accept loop: one hyper HTTP/1.1 connection per client, with graceful shutdown.
//!
//! Served directly rather than through `axum::serve` so the connection can be configured: its
//! read buffer is capped at hyper's minimum (8 KiB), which is most of what a parked stream costs,
//! and HTTP/1 is spoken without the version-sniffing wrapper (the gateway has no HTTP/2).

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Serves `app` on `listener` until `graceful` resolves; then stops accepting, lets every
/// connection finish its current response (idle keep-alive connections close) and returns once
/// all are gone.
pub async fn serve(listener: TcpListener, app: Router, graceful: impl Future<Output = ()>) {
    // Dropping `signal_tx` asks the connections to shut down; each holds a `done_rx` clone.
    let (signal_tx, signal_rx) = watch::channel(());
    let (done_tx, done_rx) = watch::channel(());
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
        let (app, mut signal, done) = (app.clone(), signal_rx.clone(), done_rx.clone());
        tokio::spawn(async move {
            let service = TowerToHyperService::new(app);
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder.max_buf_size(8 * 1024);
            let mut conn = pin!(builder.serve_connection(TokioIo::new(tcp), service));
            let mut shutting_down = false;
            loop {
                tokio::select! {
                    _ = conn.as_mut() => break,
                    _ = signal.changed(), if !shutting_down => {
                        shutting_down = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(done);
        });
    }
    drop(listener);
    drop(signal_tx);
    drop(signal_rx);
    drop(done_rx);
    done_tx.closed().await;
}

/// Errors of one connection, not of the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset | Interrupted
    )
}
