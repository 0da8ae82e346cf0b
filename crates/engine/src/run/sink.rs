//! The event sink of a run and the SSE body that drains it.
//!
//! The driver encodes each event once (`id: <n>\ndata: <json>\n\n`, ids 1, 2, 3, … within the
//! run) and sends the bytes through a bounded channel; a slow client therefore slows its kernel
//! stream instead of growing memory. The body writes `: heartbeat` after 15 s without an event,
//! and coalesces events that are already queued into one write.
//!
//! No wait on a client is unbounded: a send that finds the channel full waits for room at most
//! the stall timeout (a client that reads nothing for that long is gone, as if it had
//! disconnected), and never past the run being stopped (its cancellation, the drain, its lease
//! lapsing): from then on the run's frames go to a small backlog it never waits on, handed to the
//! client after the run ended, under the same stall timeout.
//!
//! With a detach grace the frames also go to the run's replay buffer ([`RunEvents`]), and a
//! client that goes away does not end the run: it goes on, buffered, until no client has been
//! attached for the grace period.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use agui::Event;
use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;

use super::replay::{Attached, RunEvents};
use crate::telemetry::Telemetry;
use tokio_util::sync::CancellationToken;

/// Bytes of frames a stopping run keeps for its client beyond the channel (the spans it closes
/// and its terminal event fit many times); a client further behind than this is cut off.
const BACKLOG_BYTES: usize = 256 * 1024;

/// The client went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Disconnected;

/// The replay side of a sink: the buffer, and the attachment of the client that started the run.
struct Replay {
    events: Arc<RunEvents>,
    client: Arc<Attached>,
}

/// What ends a blocked send at once, besides the stall deadline: the run is being stopped (its
/// cancellation, the drain, its lease lapsing). The run's own checks then end it for that reason.
pub trait Stop: Send + Sync {
    /// Resolves once the run is being stopped (at once when it already is).
    fn wait(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

impl Stop for CancellationToken {
    fn wait(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.cancelled())
    }
}

/// How a send to a client ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    Sent,
    /// The client went away.
    Closed,
    /// The client read nothing for the whole stall timeout: it is gone as well.
    Stalled,
    /// The run is being stopped (see [`Stop`]); the frame was not sent.
    Stopped,
}

/// Sends `frame` to a client: at once when its channel has room, else as soon as it has, waiting
/// at most `stall` and never past `stop`.
pub async fn deliver(
    tx: &mpsc::Sender<Bytes>,
    frame: Bytes,
    stall: Duration,
    stop: Option<&dyn Stop>,
) -> Delivery {
    match try_deliver(tx, frame, stall, stop).await {
        Ok(()) => Delivery::Sent,
        Err((how, _)) => how,
    }
}

/// [`deliver`], giving the frame back when it was not sent.
async fn try_deliver(
    tx: &mpsc::Sender<Bytes>,
    frame: Bytes,
    stall: Duration,
    stop: Option<&dyn Stop>,
) -> Result<(), (Delivery, Bytes)> {
    // The common case costs no timer: the client keeps up.
    match tx.try_reserve() {
        Ok(permit) => {
            permit.send(frame);
            return Ok(());
        }
        Err(mpsc::error::TrySendError::Closed(())) => return Err((Delivery::Closed, frame)),
        Err(mpsc::error::TrySendError::Full(())) => {}
    }
    let stopped = async {
        match stop {
            Some(s) => s.wait().await,
            None => std::future::pending().await,
        }
    };
    let how = tokio::select! {
        biased;
        permit = tx.reserve() => match permit {
            Ok(permit) => {
                permit.send(frame);
                return Ok(());
            }
            Err(_) => Delivery::Closed,
        },
        () = stopped => Delivery::Stopped,
        () = tokio::time::sleep(stall) => Delivery::Stalled,
    };
    Err((how, frame))
}

/// Where a run's frames go; a sink moves through these in this order only (a state may be
/// skipped; a sink is never both buffering and stopping).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// To the client (and to the replay buffer, when there is one).
    Attached,
    /// With a detach grace: the client that started the run went away or stalled; frames are
    /// only buffered, and the run goes on until it is abandoned.
    Buffering,
    /// The run is being stopped while its client was behind: frames go to the backlog (and to
    /// the replay buffer), never waited on; the run ends for the reason it stops.
    Stopping,
    /// The run is without a client for good: nothing more is sent.
    Gone,
    /// The terminal event was sent: nothing more may be.
    Ended,
}

/// Sending half, owned by the run's output.
pub struct Sink {
    tx: mpsc::Sender<Bytes>,
    /// How long a send waits for a client that reads nothing.
    stall: Duration,
    stop: Arc<dyn Stop>,
    /// Frames of a stopping run not yet in the channel, and their bytes; `None` once the client
    /// was cut off (it fell further behind than [`BACKLOG_BYTES`]).
    backlog: Option<(VecDeque<Bytes>, usize)>,
    clock: Arc<dyn clock::Clock>,
    buf: Vec<u8>,
    /// The id of the last event sent.
    last_id: u64,
    life: Life,
    replay: Option<Replay>,
    metrics: Arc<dyn Telemetry>,
}

impl Sink {
    /// A sink whose frames also go to `replay` when given (a run that may outlive its client).
    /// A send waits at most `stall` for a client that reads nothing, and never past `stop`.
    pub fn new(
        capacity: usize,
        stall: Duration,
        stop: Arc<dyn Stop>,
        clock: Arc<dyn clock::Clock>,
        replay: Option<Arc<RunEvents>>,
        metrics: Arc<dyn Telemetry>,
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
                stall,
                stop,
                backlog: Some((VecDeque::new(), 0)),
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
        if let Some(replay) = &self.replay {
            replay.events.append(self.last_id, bytes.clone(), terminal);
        }
        match self.life {
            Life::Attached => {}
            Life::Stopping => {
                self.queue(bytes);
                return Ok(());
            }
            // Without a buffer, a client that is gone gets nothing and the run learns it.
            Life::Gone if self.replay.is_none() => return Err(Disconnected),
            _ => return Ok(()),
        }
        match try_deliver(&self.tx, bytes, self.stall, Some(&*self.stop)).await {
            Ok(()) => Ok(()),
            Err((Delivery::Stopped, bytes)) => {
                // The run ends for its own reason, without waiting on the client: what is left
                // for it follows the frames it has, once the run ended.
                self.life = Life::Stopping;
                self.queue(bytes);
                Ok(())
            }
            Err((gone, _)) => {
                if gone == Delivery::Stalled {
                    tracing::info!(
                        stall_secs = self.stall.as_secs_f64(),
                        "the client read nothing for the stall timeout; treated as gone"
                    );
                }
                match &self.replay {
                    None => {
                        self.life = Life::Gone;
                        Err(Disconnected)
                    }
                    Some(replay) => {
                        // Buffered only from now on; the run goes on until it is abandoned.
                        self.life = Life::Buffering;
                        replay.client.release();
                        Ok(())
                    }
                }
            }
        }
    }

    /// A frame of a stopping run: into the channel when it has room and nothing is ahead of it,
    /// else into the backlog; a client further behind than the backlog holds is cut off.
    fn queue(&mut self, frame: Bytes) {
        let Some((frames, bytes)) = &mut self.backlog else {
            return;
        };
        *bytes += frame.len();
        frames.push_back(frame);
        while let Some(permit) = frames.front().and_then(|_| self.tx.try_reserve().ok()) {
            if let Some(f) = frames.pop_front() {
                *bytes -= f.len();
                permit.send(f);
            }
        }
        if *bytes > BACKLOG_BYTES {
            self.backlog = None;
        }
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
            None => self.life == Life::Gone || self.tx.is_closed(),
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
        // What a stopped run had left for its client goes after the frames it has, under the
        // stall timeout (the run, its thread and its task are already free).
        let frames = match self.backlog.take() {
            Some((frames, _)) if !frames.is_empty() => frames,
            _ => return,
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (tx, stall) = (self.tx.clone(), self.stall);
        rt.spawn(async move {
            for f in frames {
                if deliver(&tx, f, stall, None).await != Delivery::Sent {
                    return;
                }
            }
        });
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

    const STALL: Duration = Duration::from_secs(5);

    /// A sink of `capacity` frames with the stall timeout [`STALL`], stopped by the token.
    fn sink(
        capacity: usize,
        replay: Option<Arc<RunEvents>>,
    ) -> (Sink, mpsc::Receiver<Bytes>, Arc<CancellationToken>) {
        let stop = Arc::new(CancellationToken::new());
        let (sink, rx) = Sink::new(
            capacity,
            STALL,
            stop.clone(),
            Arc::new(clock::SystemClock),
            replay,
            Arc::new(crate::telemetry::testing::Counts::default()),
        );
        (sink, rx, stop)
    }

    fn id_of(frame: &Bytes) -> u64 {
        let text = std::str::from_utf8(frame).unwrap();
        let id = text
            .strip_prefix("id: ")
            .unwrap()
            .split('\n')
            .next()
            .unwrap();
        id.parse().unwrap()
    }

    /// A client that reads nothing holds a send for the stall timeout, then is gone as if it had
    /// disconnected; one that reads within the timeout, however slowly, is never dropped.
    /// (Paused time.)
    #[tokio::test(start_paused = true)]
    async fn a_client_that_reads_nothing_is_gone_after_the_stall_timeout() {
        let (mut s, mut rx, _stop) = sink(1, None);
        s.emit_text_content("m", "a").await.unwrap();
        let reader = tokio::spawn(async move {
            for _ in 0..3 {
                tokio::time::sleep(STALL - Duration::from_secs(1)).await;
                rx.recv().await.unwrap();
            }
            rx
        });
        for _ in 0..3 {
            s.emit_text_content("m", "b").await.unwrap();
        }
        assert!(!s.is_gone(), "a slow reader is not a stalled one");
        let rx = reader.await.unwrap();
        let start = Instant::now();
        assert_eq!(s.emit_text_content("m", "c").await, Err(Disconnected));
        assert_eq!(start.elapsed(), STALL);
        assert!(s.is_gone() && s.is_closed(), "{:?}", s.life);
        // Nothing more is waited on.
        assert_eq!(s.emit_text_content("m", "d").await, Err(Disconnected));
        assert_eq!(start.elapsed(), STALL);
        drop(rx);
    }

    /// With a detach grace, a stalled client lets go of the run, which goes on buffered.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_client_of_a_detachable_run_is_released_and_the_run_goes_on() {
        let events = RunEvents::new(1 << 20, Duration::from_secs(30));
        let (mut s, _rx, _stop) = sink(1, Some(events.clone()));
        s.emit_text_content("m", "a").await.unwrap();
        assert!(!events.is_detached());
        let start = Instant::now();
        s.emit_text_content("m", "b").await.unwrap();
        assert_eq!(start.elapsed(), STALL);
        assert!(
            events.is_detached(),
            "the stalled client still holds the run"
        );
        s.emit_text_content("m", "c").await.unwrap();
        assert_eq!(start.elapsed(), STALL, "a detached run waits on nobody");
        assert_eq!(events.last_id(), 3);
        assert!(!s.is_gone());
    }

    /// A send blocked on a full channel returns as soon as the run is stopped, and later ones do
    /// not wait at all; the client still gets every frame, in order, after the run ended.
    #[tokio::test(start_paused = true)]
    async fn a_blocked_send_returns_at_once_when_the_run_is_stopped() {
        let (mut s, mut rx, stop) = sink(1, None);
        s.emit_text_content("m", "a").await.unwrap();
        let start = Instant::now();
        let stopper = stop.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            stopper.cancel();
        });
        s.emit_text_content("m", "b").await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        for _ in 0..10 {
            s.emit_text_content("m", "c").await.unwrap();
        }
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        assert!(
            !s.is_gone() && !s.is_closed(),
            "the run ends for its own reason"
        );
        drop(s);
        let mut ids = Vec::new();
        while let Some(f) = rx.recv().await {
            ids.push(id_of(&f));
        }
        assert_eq!(ids, (1..=12).collect::<Vec<_>>());
    }

    /// A stopping run keeps a bounded backlog for a client that does not read: beyond it, the
    /// client is cut off (no frame after the gap ever reaches it).
    #[tokio::test(start_paused = true)]
    async fn a_client_too_far_behind_a_stopping_run_is_cut_off() {
        let (mut s, mut rx, stop) = sink(1, None);
        stop.cancel();
        let delta = "x".repeat(1024);
        for _ in 0..(BACKLOG_BYTES / 1024 + 8) {
            s.emit_text_content("m", &delta).await.unwrap();
        }
        drop(s);
        assert_eq!(id_of(&rx.recv().await.unwrap()), 1);
        assert!(rx.recv().await.is_none());
    }

    /// What a stopped run left for its client waits for it at most the stall timeout: a client
    /// that reads later gets what was in the channel, then the end of the stream.
    #[tokio::test(start_paused = true)]
    async fn the_backlog_of_a_stopped_run_waits_on_its_client_only_the_stall_timeout() {
        for wait in [
            STALL - Duration::from_secs(1),
            STALL + Duration::from_secs(1),
        ] {
            let (mut s, mut rx, stop) = sink(1, None);
            stop.cancel();
            s.emit_text_content("m", "a").await.unwrap();
            s.emit_text_content("m", "b").await.unwrap();
            drop(s);
            tokio::time::sleep(wait).await;
            let mut ids = Vec::new();
            while let Some(f) = rx.recv().await {
                ids.push(id_of(&f));
            }
            let expected = if wait < STALL { vec![1, 2] } else { vec![1] };
            assert_eq!(ids, expected, "after {wait:?}");
        }
    }

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
