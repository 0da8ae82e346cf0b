//! The accept loop: one HTTP/1.1 connection task per client (`h1`), with graceful shutdown.
//!
//! The gateway speaks HTTP/1.1 itself rather than through a general-purpose server: a run's
//! event stream may stay open for hours, and a general server keeps two 8 KiB buffers per
//! connection for its whole life — most of what a parked stream would cost.

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::watch;

mod h1;

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
        let (app, signal, done) = (app.clone(), signal_rx.clone(), done_rx.clone());
        tokio::spawn(async move {
            h1::serve(tcp, app, signal).await;
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

/// Parses a request head (fuzzing hook): method, target and head length, `None` while the head
/// is incomplete, or the status it is refused with (400, 431).
#[doc(hidden)]
pub fn parse_request_head(buf: &[u8]) -> Result<Option<(String, String, usize)>, u16> {
    match h1::parse_head(buf) {
        Ok(Some((head, used))) => Ok(Some((
            head.parts.method.to_string(),
            head.parts.uri.to_string(),
            used,
        ))),
        Ok(None) => Ok(None),
        Err(h1::HeadError::Bad) => Err(400),
        Err(h1::HeadError::TooLarge) => Err(431),
    }
}
