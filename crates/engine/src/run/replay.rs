//! A run's replay buffer, for runs that survive a dropped connection (`--detach-grace`).
//!
//! The sink appends every encoded SSE frame (`id: <n>` included) here as well as to the client
//! that started the run. Readers that attach later (`GET …/runs/{runId}/events`) replay the frames
//! after the id they saw last, then follow the run live. The buffer is bounded in bytes: the
//! oldest frames go first, and a reader that needs one that went gets `RUN_EVENTS_GONE`.
//!
//! Attachment is counted: the client that started the run and every reader. The grace clock runs
//! only while the count is zero; when it runs out the run is abandoned, and ends as a disconnected
//! run always has (its kernel task is cancelled).
//!
//! With [`Limits`], a run whose last client leaves takes a slot among `--max-detached-runs` for as
//! long as nobody is attached; when none is free it is abandoned at once, as without a grace.
//! Readers of the events route are counted apart, at most `--max-readers-per-run` at once.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use crate::limits::{DetachedSlot, Limits};

/// The events a reader asked for were dropped from the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

/// What a reader gets after the id it saw last.
#[derive(Debug, Default, PartialEq)]
pub struct Batch {
    pub frames: Vec<Bytes>,
    /// The id of the last frame of `frames` (or the cursor it was asked with).
    pub cursor: u64,
    /// The run ended and nothing after `cursor` is left: the reader is done.
    pub complete: bool,
}

struct Frames {
    /// `(id, frame)`, ids consecutive.
    frames: VecDeque<(u64, Bytes)>,
    bytes: usize,
    /// The highest id ever appended.
    last: u64,
    ended: bool,
}

/// One run's buffer, shared by its sink, its readers and the runtime's registry.
pub struct RunEvents {
    frames: Mutex<Frames>,
    capacity: usize,
    grace: Duration,
    /// The highest id appended (readers wait on it) and whether the run ended.
    appended: watch::Sender<(u64, bool)>,
    /// How many clients are attached (the one that started the run included).
    readers: watch::Sender<usize>,
    /// Readers of the events route among them.
    route_readers: AtomicUsize,
    /// The bounds on detached runs (none: every run may be detached).
    limits: Option<Arc<Limits>>,
    /// While nobody is attached to the running run: its detached slot, or that none was free.
    detached: Mutex<Detached>,
}

/// Where a run stands towards `--max-detached-runs`.
#[derive(Debug, Default)]
enum Detached {
    /// A client is attached, or the run ended: no slot needed.
    #[default]
    No,
    /// Nobody is attached: the run holds a slot through its grace.
    Holding(#[allow(dead_code)] DetachedSlot),
    /// Nobody is attached and no slot was free: the run is abandoned at once.
    Refused,
}

impl RunEvents {
    /// A buffer of at most `capacity` bytes (the newest frame is kept whatever its size), whose
    /// run is abandoned after `grace` without a reader. The client that starts the run is
    /// attached from the start: see [`RunEvents::attach`].
    pub fn new(capacity: usize, grace: Duration) -> Arc<RunEvents> {
        RunEvents::build(capacity, grace, None)
    }

    /// [`RunEvents::new`], whose run takes a slot of `limits` while it is detached.
    pub fn limited(capacity: usize, grace: Duration, limits: Arc<Limits>) -> Arc<RunEvents> {
        RunEvents::build(capacity, grace, Some(limits))
    }

    fn build(capacity: usize, grace: Duration, limits: Option<Arc<Limits>>) -> Arc<RunEvents> {
        Arc::new(RunEvents {
            frames: Mutex::new(Frames {
                frames: VecDeque::new(),
                bytes: 0,
                last: 0,
                ended: false,
            }),
            capacity,
            grace,
            appended: watch::Sender::new((0, false)),
            readers: watch::Sender::new(0),
            route_readers: AtomicUsize::new(0),
            limits,
            detached: Mutex::new(Detached::No),
        })
    }

    fn detached(&self) -> std::sync::MutexGuard<'_, Detached> {
        self.detached.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Frames> {
        self.frames.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends frame `id` (ids come in order, from 1), dropping the oldest frames beyond the
    /// capacity. A terminal frame ends the run.
    pub fn append(&self, id: u64, frame: Bytes, terminal: bool) {
        let mut f = self.lock();
        f.bytes += frame.len();
        f.frames.push_back((id, frame));
        f.last = id;
        f.ended |= terminal;
        while f.bytes > self.capacity && f.frames.len() > 1 {
            if let Some((_, old)) = f.frames.pop_front() {
                f.bytes -= old.len();
            }
        }
        let state = (f.last, f.ended);
        drop(f);
        // Only a waiting reader needs the wake-up (the hot path of a run nobody follows yet);
        // readers subscribe before they look at the frames, so none misses one.
        if terminal || self.appended.receiver_count() > 0 {
            self.appended.send_replace(state);
        }
    }

    /// The run ended (also without a terminal event: a run whose client went away for good).
    pub fn end(&self) {
        let mut f = self.lock();
        f.ended = true;
        let state = (f.last, true);
        drop(f);
        // An ended run is no longer a detached one, whoever reads its buffer.
        *self.detached() = Detached::No;
        self.appended.send_replace(state);
    }

    /// The frames after `after`, or [`Gone`] when some of them were dropped.
    pub fn read_after(&self, after: u64) -> Result<Batch, Gone> {
        let f = self.lock();
        let first = f.frames.front().map_or(f.last + 1, |(id, _)| *id);
        if after + 1 < first {
            return Err(Gone);
        }
        let skip = usize::try_from(after + 1 - first).unwrap_or(usize::MAX);
        let frames: Vec<Bytes> = f.frames.iter().skip(skip).map(|(_, b)| b.clone()).collect();
        let cursor = if frames.is_empty() { after } else { f.last };
        Ok(Batch {
            complete: f.ended && cursor >= f.last,
            frames,
            cursor,
        })
    }

    /// Whether every frame after `after` is still buffered (none was dropped from the front).
    pub fn has_after(&self, after: u64) -> bool {
        let f = self.lock();
        after + 1 >= f.frames.front().map_or(f.last + 1, |(id, _)| *id)
    }

    /// The highest id so far.
    pub fn last_id(&self) -> u64 {
        self.lock().last
    }

    pub fn is_ended(&self) -> bool {
        self.lock().ended
    }

    /// Waits for frames after `cursor` (or the end of the run).
    pub async fn changed_after(&self, cursor: u64) {
        // Subscribed first, then the frames looked at: an append after the look sees the
        // subscriber and wakes it.
        let mut rx = self.appended.subscribe();
        {
            let f = self.lock();
            if f.last > cursor || f.ended {
                return;
            }
        }
        let _ = rx.wait_for(|(last, ended)| *last > cursor || *ended).await;
    }

    /// Resolves when the run has ended.
    pub async fn ended(&self) {
        let mut rx = self.appended.subscribe();
        if self.is_ended() {
            return;
        }
        let _ = rx.wait_for(|(_, ended)| *ended).await;
    }

    /// Attaches a client; it stays attached until the guard is released or dropped.
    pub fn attach(self: &Arc<Self>) -> Attached {
        self.readers.send_modify(|n| {
            *n += 1;
            // Attached again: the detached slot goes back.
            *self.detached() = Detached::No;
        });
        Attached {
            events: self.clone(),
            released: AtomicBool::new(false),
            reader: false,
        }
    }

    /// Attaches a reader of the events route, unless `max` readers follow the run already.
    pub fn attach_reader(self: &Arc<Self>, max: usize) -> Option<Attached> {
        self.route_readers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        let mut a = self.attach();
        a.reader = true;
        Some(a)
    }

    /// A client left.
    fn detach_one(&self, reader: bool) {
        if reader {
            self.route_readers.fetch_sub(1, Ordering::AcqRel);
        }
        self.readers.send_modify(|n| {
            *n -= 1;
            // The last client left a running run: it goes on detached if a slot is free
            // (decided before any waiter sees the count, so `abandoned` reads the outcome).
            if *n == 0 {
                if let Some(limits) = &self.limits {
                    // Decided under the lock `end` takes after marking the run ended: a run that
                    // ends meanwhile either is seen ended here, or has its slot dropped by `end`
                    // right after.
                    let mut detached = self.detached();
                    if self.is_ended() {
                        return;
                    }
                    *detached = match limits.detach() {
                        Some(slot) => Detached::Holding(slot),
                        None => {
                            tracing::info!(
                                "the cap of detached runs is reached: the run is cancelled as \
                                 without a detach grace"
                            );
                            Detached::Refused
                        }
                    };
                }
            }
        });
    }

    /// Whether no client is attached.
    pub fn is_detached(&self) -> bool {
        *self.readers.borrow() == 0
    }

    /// Resolves once no client has been attached for the whole grace period.
    pub async fn abandoned(&self) {
        let mut rx = self.readers.subscribe();
        loop {
            let _ = rx.wait_for(|n| *n == 0).await;
            if matches!(*self.detached(), Detached::Refused) {
                return;
            }
            tokio::select! {
                biased;
                _ = rx.wait_for(|n| *n > 0) => {}
                _ = tokio::time::sleep(self.grace) => return,
            }
        }
    }

    /// How long an ended run's buffer is kept for late readers.
    pub fn grace(&self) -> Duration {
        self.grace
    }
}

/// An attached client (released once, by whoever notices first that it left).
pub struct Attached {
    events: Arc<RunEvents>,
    released: AtomicBool,
    /// A reader of the events route (counted against `--max-readers-per-run`).
    reader: bool,
}

impl Attached {
    pub fn release(&self) {
        if !self.released.swap(true, Ordering::AcqRel) {
            self.events.detach_one(self.reader);
        }
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(id: u64) -> Bytes {
        Bytes::from(format!("id: {id}\ndata: {{}}\n\n"))
    }

    #[test]
    fn readers_get_what_follows_their_cursor_until_it_was_dropped() {
        let len = frame(1).len();
        let ev = RunEvents::new(len * 3, Duration::from_secs(1));
        assert_eq!(
            ev.read_after(0).unwrap(),
            Batch {
                frames: vec![],
                cursor: 0,
                complete: false
            }
        );
        for id in 1..=5 {
            ev.append(id, frame(id), false);
        }
        // Frames 3..=5 are kept.
        assert_eq!(ev.read_after(1), Err(Gone));
        assert_eq!(ev.read_after(0), Err(Gone));
        let b = ev.read_after(2).unwrap();
        assert_eq!(
            (b.frames, b.cursor, b.complete),
            (vec![frame(3), frame(4), frame(5)], 5, false)
        );
        let b = ev.read_after(4).unwrap();
        assert_eq!((b.frames, b.cursor), (vec![frame(5)], 5));
        let b = ev.read_after(5).unwrap();
        assert_eq!((b.frames.len(), b.cursor, b.complete), (0, 5, false));
        ev.append(6, frame(6), true);
        let b = ev.read_after(5).unwrap();
        assert_eq!((b.frames, b.cursor, b.complete), (vec![frame(6)], 6, true));
        assert!(ev.read_after(6).unwrap().complete);
    }

    #[test]
    fn the_newest_frame_is_kept_whatever_its_size() {
        let ev = RunEvents::new(4, Duration::from_secs(1));
        ev.append(1, frame(1), false);
        ev.append(2, frame(2), true);
        assert_eq!(ev.read_after(0), Err(Gone));
        assert_eq!(ev.read_after(1).unwrap().frames, vec![frame(2)]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_grace_clock_runs_only_while_nobody_is_attached() {
        let grace = Duration::from_secs(30);
        let ev = RunEvents::new(1024, grace);
        let first = ev.attach();
        let start = tokio::time::Instant::now();
        let abandoned = tokio::spawn({
            let ev = ev.clone();
            async move { ev.abandoned().await }
        });
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert!(!abandoned.is_finished(), "attached: no clock");
        first.release();
        first.release(); // idempotent
        assert!(ev.is_detached());
        tokio::time::sleep(Duration::from_secs(20)).await;
        let second = ev.attach();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            !abandoned.is_finished(),
            "a reader re-attached within the grace"
        );
        drop(second);
        abandoned.await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(100 + 20 + 60 + 30));
    }

    fn limits(detached: usize, readers: usize) -> Arc<Limits> {
        let caps = crate::limits::Caps {
            max_detached_runs: detached,
            max_readers_per_run: readers,
            ..Default::default()
        };
        Arc::new(Limits::new(
            &caps,
            Arc::new(crate::telemetry::testing::Counts::default()),
        ))
    }

    /// Past the cap of detached runs, a run whose last client leaves is abandoned at once; a
    /// detached run that is re-attached, or ends, gives its place back. (Paused time.)
    #[tokio::test(start_paused = true)]
    async fn a_run_beyond_the_detached_cap_is_abandoned_at_once() {
        let grace = Duration::from_secs(30);
        let l = limits(1, 8);
        let (one, two) = (
            RunEvents::limited(1024, grace, l.clone()),
            RunEvents::limited(1024, grace, l.clone()),
        );
        let (a, b) = (one.attach(), two.attach());
        drop(a);
        drop(b);
        let start = tokio::time::Instant::now();
        two.abandoned().await;
        assert_eq!(start.elapsed(), Duration::ZERO, "no place: no grace");
        // The first holds its place through its grace; re-attached, it gives it back.
        let waiting = tokio::spawn({
            let one = one.clone();
            async move { one.abandoned().await }
        });
        tokio::time::sleep(grace / 2).await;
        assert!(!waiting.is_finished());
        let back = one.attach();
        let three = RunEvents::limited(1024, grace, l.clone());
        drop(three.attach());
        assert!(matches!(*three.detached(), Detached::Holding(_)));
        // An ended run takes no place.
        three.end();
        drop(back);
        assert!(matches!(*one.detached(), Detached::Holding(_)));
        one.end();
        assert!(l.detach().is_some(), "every place came back");
        waiting.abort();
    }

    #[test]
    fn readers_beyond_the_cap_are_refused_and_a_leaving_one_makes_room() {
        let ev = RunEvents::limited(1024, Duration::from_secs(1), limits(8, 2));
        let _client = ev.attach(); // the client that started the run is no reader
        let r1 = ev.attach_reader(2).unwrap();
        let _r2 = ev.attach_reader(2).unwrap();
        assert!(ev.attach_reader(2).is_none());
        drop(r1);
        assert!(ev.attach_reader(2).is_some());
        assert_eq!(*ev.readers.borrow(), 2, "the refused reader never counted");
    }

    #[tokio::test]
    async fn readers_wake_on_new_frames_and_on_the_end() {
        let ev = RunEvents::new(1024, Duration::from_secs(1));
        let waiter = tokio::spawn({
            let ev = ev.clone();
            async move { ev.changed_after(0).await }
        });
        tokio::task::yield_now().await;
        ev.append(1, frame(1), false);
        waiter.await.unwrap();
        let waiter = tokio::spawn({
            let ev = ev.clone();
            async move { ev.changed_after(1).await }
        });
        ev.end();
        waiter.await.unwrap();
        assert!(ev.read_after(1).unwrap().complete);
    }
}
