//! The event sink of a run and the SSE body that drains it.
//!
//! The driver encodes each event once (`data: <json>\n\n`) and sends the bytes through a bounded
//! channel; a slow client therefore slows its kernel stream instead of growing memory. The body
//! writes `: heartbeat` after 15 s without an event, and coalesces events that are already queued
//! into one write.

use std::time::Duration;

use agui::Event;
use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;

/// The client went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disconnected;

/// Sending half, owned by the run driver.
pub struct Sink {
    tx: mpsc::Sender<Bytes>,
    clock: std::sync::Arc<dyn super::Clock>,
    buf: Vec<u8>,
    terminal_sent: bool,
    /// The client is known to be gone.
    gone: bool,
}

impl Sink {
    pub fn new(
        capacity: usize,
        clock: std::sync::Arc<dyn super::Clock>,
    ) -> (Sink, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        (
            Sink {
                tx,
                clock,
                buf: Vec::with_capacity(512),
                terminal_sent: false,
                gone: false,
            },
            rx,
        )
    }

    /// Encodes and sends one event (waits while the channel is full).
    pub async fn emit(&mut self, e: &Event) -> Result<(), Disconnected> {
        debug_assert!(!self.terminal_sent, "event after the terminal event: {e:?}");
        if e.is_terminal() {
            self.terminal_sent = true;
        }
        self.buf.clear();
        e.encode_sse(self.clock.now_ms(), &mut self.buf);
        self.send().await
    }

    /// Sends the encoded event in `buf`.
    async fn send(&mut self) -> Result<(), Disconnected> {
        let bytes = Bytes::copy_from_slice(&self.buf);
        let sent = self.tx.send(bytes).await.map_err(|_| Disconnected);
        if sent.is_err() {
            self.gone = true;
        }
        sent
    }

    /// Encodes and sends `TEXT_MESSAGE_CONTENT {message_id, delta}` without building the event.
    pub async fn emit_text_content(
        &mut self,
        message_id: &str,
        delta: &str,
    ) -> Result<(), Disconnected> {
        debug_assert!(!self.terminal_sent, "text after the terminal event");
        self.buf.clear();
        Event::encode_text_content_sse(self.clock.now_ms(), message_id, delta, &mut self.buf);
        self.send().await
    }

    pub fn terminal_sent(&self) -> bool {
        self.terminal_sent
    }

    /// A handle whose `closed()` resolves when the client has gone away (for a wait armed once
    /// across many events).
    pub fn sender(&self) -> mpsc::Sender<Bytes> {
        self.tx.clone()
    }

    /// Resolves when the client has gone away.
    pub async fn closed(&self) {
        self.tx.closed().await
    }

    /// Whether the client has gone away (noticed or not).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Records that the client is gone.
    pub fn mark_gone(&mut self) {
        self.gone = true;
    }

    /// Whether the client is known to be gone: nothing more is sent.
    pub fn is_gone(&self) -> bool {
        self.gone
    }
}

/// The SSE body stream: events as they come, heartbeats after `heartbeat` of silence.
pub fn body_stream(
    rx: mpsc::Receiver<Bytes>,
    heartbeat: Duration,
) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> + Send {
    // One timer per quiet period, not one per event: an event only records the time; when the
    // timer fires early it is moved to `last + heartbeat`.
    let last = tokio::time::Instant::now();
    let timer = Box::pin(tokio::time::sleep_until(last + heartbeat));
    futures_util::stream::unfold(
        (rx, timer, last),
        move |(mut rx, mut timer, mut last)| async move {
            loop {
                tokio::select! {
                    biased;
                    first = rx.recv() => {
                        let first = first?;
                        last = tokio::time::Instant::now();
                        // Coalesce what is already queued into one write.
                        let mut chunk: Option<BytesMut> = None;
                        while let Ok(next) = rx.try_recv() {
                            let c = chunk.get_or_insert_with(|| {
                                let mut b = BytesMut::with_capacity(first.len() * 4);
                                b.extend_from_slice(&first);
                                b
                            });
                            c.extend_from_slice(&next);
                            if c.len() > 64 * 1024 {
                                break;
                            }
                        }
                        let out = match chunk {
                            Some(c) => c.freeze(),
                            None => first,
                        };
                        return Some((Ok(out), (rx, timer, last)));
                    }
                    () = timer.as_mut() => {
                        let now = tokio::time::Instant::now();
                        if last + heartbeat <= now {
                            last = now;
                            timer.as_mut().reset(now + heartbeat);
                            return Some((
                                Ok(Bytes::from_static(agui::HEARTBEAT)),
                                (rx, timer, last),
                            ));
                        }
                        timer.as_mut().reset(last + heartbeat);
                    }
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;
    use tokio::time::Instant;

    /// A heartbeat comes after each quiet period of `heartbeat`, counted from the last event;
    /// none while events flow. (Paused time: the test waits for timers only.)
    #[tokio::test(start_paused = true)]
    async fn heartbeats_fill_quiet_periods_only() {
        let beat = Duration::from_secs(15);
        let (tx, rx) = mpsc::channel(8);
        let mut body = Box::pin(body_stream(rx, beat));
        let event = Bytes::from_static(b"data: {}\n\n");
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(10)).await;
            tx.send(event.clone()).await.unwrap();
            assert_eq!(body.next().await.unwrap().unwrap(), event);
        }
        let quiet = Instant::now();
        let hb = body.next().await.unwrap().unwrap();
        assert_eq!(&hb[..], agui::HEARTBEAT);
        assert_eq!(quiet.elapsed(), beat);
        assert_eq!(&body.next().await.unwrap().unwrap()[..], agui::HEARTBEAT);
        assert_eq!(quiet.elapsed(), beat * 2);
        // Events already queued leave in one write.
        tx.send(event.clone()).await.unwrap();
        tx.send(event.clone()).await.unwrap();
        assert_eq!(body.next().await.unwrap().unwrap().len(), event.len() * 2);
        drop(tx);
        assert!(body.next().await.is_none(), "the body ends with the run");
    }
}
