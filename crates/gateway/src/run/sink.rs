//! The event sink of a run and the SSE body that drains it.
//!
//! The driver encodes each event once (`id: <n>\ndata: <json>\n\n`, ids 1, 2, 3, … within the
//! run) and sends the bytes through a bounded channel; a slow client therefore slows its kernel
//! stream instead of growing memory. The body writes `: heartbeat` after 15 s without an event,
//! and coalesces events that are already queued into one write.
//!
//! With a detach grace the frames also go to the run's replay buffer ([`RunEvents`]), and a
//! client that goes away does not end the run: it goes on, buffered, until no client has been
//! attached for the grace period.

use std::sync::Arc;
use std::time::Duration;

use agui::Event;
use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;

use super::replay::{Attached, RunEvents};
use crate::telemetry::Metrics;

/// The client went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disconnected;

/// The replay side of a sink: the buffer, and the attachment of the client that started the run.
struct Replay {
    events: Arc<RunEvents>,
    client: Arc<Attached>,
}

/// Where a run's frames go; a sink moves through these in this order only (a state may be
/// skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// To the client (and to the replay buffer, when there is one).
    Attached,
    /// With a detach grace: the client that started the run went away; frames are only
    /// buffered, and the run goes on until it is abandoned.
    Buffering,
    /// The run is without a client for good: nothing more is sent.
    Gone,
    /// The terminal event was sent: nothing more may be.
    Ended,
}

/// Sending half, owned by the run's output.
pub struct Sink {
    tx: mpsc::Sender<Bytes>,
    clock: Arc<dyn crate::clock::Clock>,
    buf: Vec<u8>,
    /// The id of the last event sent.
    last_id: u64,
    life: Life,
    replay: Option<Replay>,
    metrics: Arc<Metrics>,
}

impl Sink {
    /// A sink whose frames also go to `replay` when given (a run that may outlive its client).
    pub fn new(
        capacity: usize,
        clock: Arc<dyn crate::clock::Clock>,
        replay: Option<Arc<RunEvents>>,
        metrics: Arc<Metrics>,
    ) -> (Sink, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let replay = replay.map(|events| {
            let client = Arc::new(events.attach());
            // The client's departure starts the grace clock even while no event is sent. The
            // watcher lets go of its sender when the run ends, so that the body can end.
            let (watch_tx, watch_client, watch_events) =
                (tx.clone(), client.clone(), events.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = watch_tx.closed() => watch_client.release(),
                    _ = watch_events.ended() => {}
                }
            });
            Replay { events, client }
        });
        (
            Sink {
                tx,
                clock,
                buf: Vec::with_capacity(512),
                last_id: 0,
                life: Life::Attached,
                replay,
                metrics,
            },
            rx,
        )
    }

    /// Starts the next frame: its `id:` line.
    fn start_frame(&mut self) {
        self.buf.clear();
        self.last_id += 1;
        self.buf.extend_from_slice(b"id: ");
        self.buf
            .extend_from_slice(itoa::Buffer::new().format(self.last_id).as_bytes());
        self.buf.push(b'\n');
    }

    /// Encodes and sends one event (waits while the channel is full).
    pub async fn emit(&mut self, e: &Event) -> Result<(), Disconnected> {
        debug_assert!(
            self.life != Life::Ended,
            "event after the terminal event: {e:?}"
        );
        let terminal = e.is_terminal();
        self.start_frame();
        e.encode_sse(self.clock.now_ms(), &mut self.buf);
        let sent = self.send(terminal).await;
        if terminal {
            self.life = Life::Ended;
        }
        sent?;
        self.metrics.event_sent(e.type_index());
        Ok(())
    }

    /// Sends the encoded event in `buf`.
    async fn send(&mut self, terminal: bool) -> Result<(), Disconnected> {
        let bytes = Bytes::copy_from_slice(&self.buf);
        let Some(replay) = &self.replay else {
            let sent = self.tx.send(bytes).await.map_err(|_| Disconnected);
            if sent.is_err() {
                self.life = Life::Gone;
            }
            return sent;
        };
        replay.events.append(self.last_id, bytes.clone(), terminal);
        if self.life == Life::Attached && self.tx.send(bytes).await.is_err() {
            // Buffered only from now on; the run goes on until it is abandoned.
            self.life = Life::Buffering;
            replay.client.release();
        }
        Ok(())
    }

    /// Encodes and sends `TEXT_MESSAGE_CONTENT {message_id, delta}` without building the event.
    pub async fn emit_text_content(
        &mut self,
        message_id: &str,
        delta: &str,
    ) -> Result<(), Disconnected> {
        debug_assert!(self.life != Life::Ended, "text after the terminal event");
        self.start_frame();
        Event::encode_text_content_sse(self.clock.now_ms(), message_id, delta, &mut self.buf);
        self.send(false).await?;
        self.metrics.event_sent(agui::TEXT_MESSAGE_CONTENT_INDEX);
        Ok(())
    }

    /// How many events the run sent (its last id).
    pub fn events_sent(&self) -> u64 {
        self.last_id
    }

    /// Whether the run's frames are buffered for readers that attach later.
    pub fn has_replay(&self) -> bool {
        self.replay.is_some()
    }

    /// Whether the terminal event was sent.
    pub fn ended(&self) -> bool {
        self.life == Life::Ended
    }

    /// A handle whose `wait()` resolves when the run is without a client for good (for a wait
    /// armed once across many events).
    pub fn gone_signal(&self) -> GoneSignal {
        match &self.replay {
            None => GoneSignal::Client(self.tx.clone()),
            Some(r) => GoneSignal::Abandoned(r.events.clone()),
        }
    }

    /// Resolves when the run is without a client for good: its client went away (or, with a
    /// detach grace, no client has been attached for the grace period).
    pub async fn closed(&self) {
        self.gone_signal().wait().await
    }

    /// Whether the run is without a client (noticed or not; with a detach grace: abandoned).
    pub fn is_closed(&self) -> bool {
        match &self.replay {
            None => self.tx.is_closed(),
            Some(_) => self.life == Life::Gone,
        }
    }

    /// Records that the run is without a client for good (an ended run stays ended).
    pub fn mark_gone(&mut self) {
        if self.life != Life::Ended {
            self.life = Life::Gone;
        }
    }

    /// Whether the run is known to be without a client: nothing more is sent.
    pub fn is_gone(&self) -> bool {
        self.life == Life::Gone
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        if let Some(r) = &self.replay {
            r.events.end();
        }
    }
}

/// See [`Sink::gone_signal`].
pub enum GoneSignal {
    Client(mpsc::Sender<Bytes>),
    Abandoned(Arc<RunEvents>),
}

impl GoneSignal {
    pub async fn wait(&self) {
        match self {
            GoneSignal::Client(tx) => tx.closed().await,
            GoneSignal::Abandoned(events) => events.abandoned().await,
        }
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
