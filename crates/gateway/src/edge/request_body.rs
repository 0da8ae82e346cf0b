//! The request body's bounds: a deadline on reading it, and what becomes of a body left unread.
//!
//! Every request's body is wrapped ([`layer`], around `http::router`):
//! - **Deadline.** The whole body must arrive within `--body-timeout` of its head; past it, a
//!   read fails with [`BodyTimeout`] (the routes answer 408 `BODY_TIMEOUT` and close). hyper's
//!   own timeout covers the head only: without this, a head announcing a megabyte followed by a
//!   byte a minute would hold its connection and its task for ever.
//! - **Lingering drain.** A route that answers before reading the whole body (401, 415, 413 from
//!   `Content-Length` or past the limit, 421…) drops it. hyper then reads what already arrived
//!   and otherwise stops reading and closes the connection once the answer is written; the bytes
//!   the client still sends find a closed socket, whose kernel answers them with a reset, and a
//!   client that writes its whole body before it reads (Python's `http.client`, Node's `fetch`)
//!   gets EPIPE or ECONNRESET instead of the answer, which the reset may even discard from its
//!   receive buffer. So a dropped body is read on and discarded by a task of its own, while hyper
//!   writes the answer, as nginx's lingering close does: at most [`LINGER_BYTES`] and
//!   `--linger-timeout`. Once the body ends, the connection stays open for the next request
//!   (unless the answer said `Connection: close`); past either bound the task drops the body and
//!   hyper closes the connection. Not drained: a body announcing more than the byte bound (it
//!   could not be read to its end), and a body of a request with `Expect: 100-continue` never
//!   read (its client waits for the `100 Continue` that reading would send, and sends nothing
//!   without it), nor one that failed or ran out of time.

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::header;
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::time::{Instant, Sleep};

/// The most bytes read and discarded of a body a route left unread. A body that announces more
/// is not drained at all.
pub const LINGER_BYTES: u64 = 32 * 1024 * 1024;

/// The bounds of request bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// How long after its head a body must have arrived whole.
    pub deadline: Duration,
    /// How long a body a route left unread is read on and discarded; zero: not at all.
    pub linger: Duration,
    /// How many bytes of it at most.
    pub linger_bytes: u64,
}

/// A body that did not arrive within the deadline.
#[derive(Debug)]
pub struct BodyTimeout;

impl fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the request body did not arrive within the body timeout")
    }
}

impl StdError for BodyTimeout {}

/// Whether `e`, or an error it wraps, is a [`BodyTimeout`].
pub fn is_timeout(e: &(dyn StdError + 'static)) -> bool {
    let mut e = Some(e);
    while let Some(cur) = e {
        if cur.is::<BodyTimeout>() {
            return true;
        }
        e = cur.source();
    }
    false
}

/// `router` with every request's body under `bounds`: its outermost layer, so that whichever
/// answer a request gets, its body is bounded.
pub fn layer(router: axum::Router, bounds: Bounds) -> axum::Router {
    router.layer(axum::middleware::map_request(
        move |req: Request| async move { bound(req, bounds) },
    ))
}

/// Why a body was not read.
#[derive(Debug, PartialEq, Eq)]
pub enum Unread {
    /// Over `limit` (from `Content-Length` or while reading).
    TooLarge,
    /// Not whole within the body timeout.
    Late,
    /// Broken on the way (malformed chunks, the connection reset): what arrived is not the body.
    Broken,
}

/// Reads the body of `req` within `limit` bytes (`Content-Length` first, then while reading)
/// and its deadline.
pub async fn read(req: Request, limit: usize) -> Result<Bytes, Unread> {
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if announced.is_some_and(|len| len > limit as u64) {
        return Err(Unread::TooLarge);
    }
    let body = http_body_util::Limited::new(req.into_body(), limit);
    match body.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if is_timeout(&*e) => Err(Unread::Late),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Unread::TooLarge),
        Err(_) => Err(Unread::Broken),
    }
}

/// `req` with its body under `bounds`, from now.
pub fn bound(req: Request, bounds: Bounds) -> Request {
    let expect_continue = req
        .headers()
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let (parts, body) = req.into_parts();
    if body.is_end_stream() {
        return Request::from_parts(parts, body);
    }
    let bounded = Bounded {
        inner: Some(body),
        deadline: Instant::now() + bounds.deadline,
        timer: None,
        bounds,
        expect_continue,
        polled: false,
        over: false,
    };
    Request::from_parts(parts, Body::new(bounded))
}

/// A request body under its [`Bounds`].
struct Bounded {
    inner: Option<Body>,
    deadline: Instant,
    /// Armed on the first read that has to wait.
    timer: Option<Pin<Box<Sleep>>>,
    bounds: Bounds,
    expect_continue: bool,
    /// Whether a route began reading it (after which a `100 Continue` has been sent).
    polled: bool,
    /// Ended, failed or out of time: nothing more to read, nothing to drain.
    over: bool,
}

impl http_body::Body for Bounded {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut().filter(|_| !this.over) else {
            return Poll::Ready(None);
        };
        this.polled = true;
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => return Poll::Ready(Some(Ok(frame))),
            Poll::Ready(Some(Err(e))) => {
                this.over = true;
                return Poll::Ready(Some(Err(e.into())));
            }
            Poll::Ready(None) => {
                this.over = true;
                return Poll::Ready(None);
            }
            Poll::Pending => {}
        }
        let deadline = this.deadline;
        let timer = this
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => {
                this.over = true;
                Poll::Ready(Some(Err(BodyTimeout.into())))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.over || self.inner.as_ref().is_none_or(|b| b.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Some(b) if !self.over => b.size_hint(),
            _ => SizeHint::with_exact(0),
        }
    }
}

impl Drop for Bounded {
    fn drop(&mut self) {
        let Some(body) = self.inner.take() else {
            return;
        };
        let unread_continue = self.expect_continue && !self.polled;
        if self.over || unread_continue || body.is_end_stream() || self.bounds.linger.is_zero() {
            return;
        }
        // What is left, as far as the framing says (`Content-Length`; a chunked body: unknown).
        if body.size_hint().lower() > self.bounds.linger_bytes {
            return;
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(drain(body, self.bounds));
        }
    }
}

/// Reads `body` to its end and discards it, within the linger bounds; then drops it.
async fn drain(mut body: Body, bounds: Bounds) {
    let mut left = bounds.linger_bytes;
    let read = async {
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                return;
            };
            let n = frame.data_ref().map_or(0, |d| d.len() as u64);
            if n > left {
                return;
            }
            left -= n;
        }
    };
    let _ = tokio::time::timeout(bounds.linger, read).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    use std::sync::Arc;

    const BOUNDS: Bounds = Bounds {
        deadline: Duration::from_secs(60),
        linger: Duration::from_secs(10),
        linger_bytes: 1000,
    };

    /// A body fed through a channel, counting what was read of it and whether it was dropped.
    struct Fed {
        rx: tokio::sync::mpsc::Receiver<Bytes>,
        read: Arc<AtomicU64>,
        dropped: Arc<AtomicU64>,
        length: Option<u64>,
    }

    impl http_body::Body for Fed {
        type Data = Bytes;
        type Error = std::io::Error;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
            self.rx.poll_recv(cx).map(|c| {
                c.map(|c| {
                    self.read.fetch_add(c.len() as u64, SeqCst);
                    if let Some(l) = self.length.as_mut() {
                        *l -= c.len() as u64;
                    }
                    Ok(Frame::data(c))
                })
            })
        }
        fn size_hint(&self) -> SizeHint {
            self.length.map_or_else(SizeHint::new, SizeHint::with_exact)
        }
    }

    impl Drop for Fed {
        fn drop(&mut self) {
            self.dropped.store(1, SeqCst);
        }
    }

    struct Probe {
        tx: tokio::sync::mpsc::Sender<Bytes>,
        read: Arc<AtomicU64>,
        dropped: Arc<AtomicU64>,
    }

    impl Probe {
        fn read(&self) -> u64 {
            self.read.load(SeqCst)
        }
        fn dropped(&self) -> bool {
            self.dropped.load(SeqCst) == 1
        }
    }

    fn request(length: Option<u64>, expect: bool, bounds: Bounds) -> (Request, Probe) {
        let (tx, rx) = tokio::sync::mpsc::channel(1024);
        let read = Arc::new(AtomicU64::new(0));
        let dropped = Arc::new(AtomicU64::new(0));
        let body = Fed {
            rx,
            read: read.clone(),
            dropped: dropped.clone(),
            length,
        };
        let mut req = Request::new(Body::new(body));
        if expect {
            req.headers_mut()
                .insert(header::EXPECT, "100-continue".parse().unwrap());
        }
        (bound(req, bounds), Probe { tx, read, dropped })
    }

    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_does_not_arrive_in_time_fails_with_the_timeout_and_is_not_drained() {
        let (req, probe) = request(Some(100), false, BOUNDS);
        probe.tx.send(Bytes::from_static(b"{")).await.unwrap();
        let start = Instant::now();
        let err = req.into_body().collect().await.unwrap_err();
        assert!(is_timeout(&err), "{err}");
        assert_eq!(start.elapsed(), BOUNDS.deadline);
        settle().await;
        assert!(probe.dropped(), "a timed-out body is dropped, not drained");
        assert!(!is_timeout(&std::io::Error::other("x")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_arrives_in_time_is_read_whole() {
        let (req, probe) = request(None, false, BOUNDS);
        let feed = tokio::spawn(async move {
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(10)).await;
                probe.tx.send(Bytes::from_static(b"ab")).await.unwrap();
            }
        });
        let body = req.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ababababab");
        feed.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn an_unread_body_is_drained_within_its_bytes() {
        let (req, probe) = request(None, false, BOUNDS);
        drop(req);
        for _ in 0..9 {
            probe.tx.send(Bytes::from(vec![0u8; 100])).await.unwrap();
        }
        settle().await;
        assert_eq!(probe.read(), 900);
        assert!(!probe.dropped(), "still draining");
        // Past the byte bound: dropped (hyper then closes the connection).
        probe.tx.send(Bytes::from(vec![0u8; 101])).await.unwrap();
        probe.tx.send(Bytes::from(vec![0u8; 100])).await.unwrap();
        settle().await;
        assert!(probe.dropped());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unread_body_is_drained_within_its_time() {
        let (req, probe) = request(Some(500), false, BOUNDS);
        drop(req);
        probe.tx.send(Bytes::from(vec![0u8; 100])).await.unwrap();
        settle().await;
        assert_eq!(probe.read(), 100);
        tokio::time::sleep(BOUNDS.linger - Duration::from_millis(1)).await;
        assert!(!probe.dropped());
        tokio::time::sleep(Duration::from_millis(2)).await;
        settle().await;
        assert!(probe.dropped());
    }

    #[tokio::test(start_paused = true)]
    async fn a_partly_read_body_is_drained_and_ends() {
        let (req, probe) = request(None, false, BOUNDS);
        probe.tx.send(Bytes::from_static(b"abc")).await.unwrap();
        let mut body = req.into_body();
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "abc"
        );
        drop(body);
        probe.tx.send(Bytes::from_static(b"def")).await.unwrap();
        let Probe {
            tx, read, dropped, ..
        } = probe;
        drop(tx);
        settle().await;
        assert_eq!(read.load(SeqCst), 6);
        assert_eq!(dropped.load(SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn bodies_that_are_not_drained() {
        // Announcing more than the byte bound: dropped at once.
        let (req, probe) = request(Some(1001), false, BOUNDS);
        drop(req);
        settle().await;
        assert!(probe.dropped());
        // Waiting for a 100 Continue never sent.
        let (req, probe) = request(Some(10), true, BOUNDS);
        drop(req);
        settle().await;
        assert!(probe.dropped());
        // Lingering off.
        let off = Bounds {
            linger: Duration::ZERO,
            ..BOUNDS
        };
        let (req, probe) = request(None, false, off);
        drop(req);
        settle().await;
        assert!(probe.dropped());
        // A body read to its end has nothing left.
        let (req, probe) = request(None, false, BOUNDS);
        let Probe { tx, dropped, .. } = probe;
        tx.send(Bytes::from_static(b"x")).await.unwrap();
        drop(tx);
        let mut body = req.into_body();
        while body.frame().await.is_some() {}
        drop(body);
        assert_eq!(dropped.load(SeqCst), 1);
        // Read once with Expect: 100-continue (the 100 went out): drained like any other.
        let (req, probe) = request(None, true, BOUNDS);
        probe.tx.send(Bytes::from_static(b"a")).await.unwrap();
        let mut body = req.into_body();
        body.frame().await.unwrap().unwrap();
        drop(body);
        probe.tx.send(Bytes::from_static(b"b")).await.unwrap();
        settle().await;
        assert_eq!((probe.read(), probe.dropped()), (2, false));
    }
}
