//! A relayed answer whose holder falls silent ends. Every event stream a holder sends has a
//! heartbeat after 15 s without an event, and any other answer comes whole, so a holder that
//! sends nothing for [`RELAY_IDLE`] while the relay waits for it is frozen or cut off (a lost
//! host sends no reset): the relay ends the answer with an error, its client sees the stream
//! cut and reconnects (to whichever instance holds the thread by then), and the connection is
//! freed, instead of waiting for as long as the client does.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// The most a relay waits for the holder's next bytes: four heartbeats.
pub const RELAY_IDLE: Duration = Duration::from_secs(60);

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `inner`, ended with an error once it has been asked for a frame and gave none for `limit`.
/// Only the holder's silence counts: a client that reads nothing does not ask.
pub struct Idle<B> {
    inner: B,
    limit: Duration,
    deadline: Pin<Box<Sleep>>,
    /// The wait for the next frame has begun (the deadline is set from it).
    asked: bool,
}

impl<B> Idle<B> {
    pub fn new(inner: B, limit: Duration) -> Idle<B> {
        Idle {
            inner,
            limit,
            deadline: Box::pin(tokio::time::sleep(limit)),
            asked: false,
        }
    }
}

impl<B> Body for Idle<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if !this.asked {
            this.asked = true;
            this.deadline.as_mut().reset(Instant::now() + this.limit);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                this.asked = false;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err("the thread's holder fell silent".into()))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use http_body_util::{BodyExt, StreamBody};

    type Frames = StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, BoxError>>>>;

    fn frames(parts: &[&'static str]) -> Frames {
        let v: Vec<Result<Frame<Bytes>, BoxError>> = parts
            .iter()
            .map(|p| Ok(Frame::data(Bytes::from_static(p.as_bytes()))))
            .collect();
        StreamBody::new(stream::iter(v))
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_holder_ends_the_answer_after_the_limit() {
        let silent = StreamBody::new(stream::pending::<Result<Frame<Bytes>, BoxError>>());
        let mut body = Idle::new(silent, Duration::from_secs(60));
        let started = Instant::now();
        let end = body.frame().await.expect("an error, not the end");
        assert!(end.is_err());
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn frames_as_they_come_and_the_end_pass_through() {
        let body = Idle::new(frames(&["a", "b"]), Duration::from_secs(60));
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"ab");
    }

    #[tokio::test(start_paused = true)]
    async fn a_client_that_reads_late_is_not_the_holders_silence() {
        // The holder keeps sending within the limit; the client asks after a pause longer than
        // it: the deadline counts from the asking.
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<&'static [u8]>();
        let holder = stream::unfold(rx, |mut rx| async move {
            let part = rx.recv().await?;
            Some((Ok::<_, BoxError>(Frame::data(Bytes::from_static(part))), rx))
        });
        let mut body = Idle::new(StreamBody::new(Box::pin(holder)), Duration::from_secs(60));
        tx.send(b"1").unwrap();
        assert!(body.frame().await.unwrap().is_ok());
        // The client reads nothing for two minutes, then asks; the holder answers 30 s later.
        tokio::time::sleep(Duration::from_secs(120)).await;
        let waiting = tokio::spawn(async move {
            let ok = body.frame().await.map(|f| f.is_ok());
            (ok, body)
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        tx.send(b"2").unwrap();
        let (ok, mut body) = waiting.await.unwrap();
        assert_eq!(ok, Some(true));
        // Silence counts from the asking: 59 s are within the limit.
        let waiting = tokio::spawn(async move { body.frame().await.map(|f| f.is_ok()) });
        tokio::time::sleep(Duration::from_secs(59)).await;
        tx.send(b"3").unwrap();
        assert_eq!(waiting.await.unwrap(), Some(true));
    }
}
