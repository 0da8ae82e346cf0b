//! Runs: from a validated request to exactly one terminal AG-UI event.
//!
//! - `decide/`: pure decisions (admission, expiry, resume plans, answers), unit- and
//!   property-tested without a server.
//! - `threads`: the per-thread registry and its durable-first edits.
//! - `admit`: admission's I/O (lock, load, decide, save) before the SSE response starts.
//! - `prepare`: a request's costly part (images decoded under a gate, the workspace created),
//!   once a trial of the decision says its thread would admit it.
//! - `driver/`: a run's life after admission: the kernel calls, the stream, the events.
//! - `hold`: a run's hold on its thread, the one way it reads or changes its document.
//! - `cancel`: the cancellation extension.
//! - `request`: the kernel messages of a run; `sink`: its event channel and SSE body.

pub mod admit;
pub mod cancel;
pub mod decide;
mod driver;
pub mod hold;
pub mod prepare;
pub mod record;
pub mod replay;
mod request;
pub mod sink;
pub mod terminal;
mod threads;

use std::sync::Arc;

use crate::caller::Caller;
use crate::limits::Limits;
use crate::settings::Settings;
use crate::shutdown::{Activity, Shutdown};
use crate::telemetry::Telemetry;
use clock::Clock;
use kernel::Pool;
use store::Store;

pub use decide::admission::{context_id, incarnation_context_id};
pub use driver::spawn_run;
pub use threads::{ActiveRun, Holder, Locked, RunControl, Slot, ThreadState, Threads};

/// Everything runs share.
pub struct Runtime {
    settings: Settings,
    threads: Arc<Threads>,
    kernels: Arc<Pool>,
    clock: Arc<dyn Clock>,
    activity: Activity,
    shutdown: Shutdown,
    /// The replay buffers of runs that may outlive their client (with a detach grace): live runs,
    /// and ended ones for the grace period after their end.
    replays: Replays,
    metrics: Arc<dyn Telemetry>,
    /// The bounds on runs, detached runs, readers and guidance runs.
    limits: Arc<Limits>,
    /// Bounds the image decodes running at once (`--max-image-decodes`).
    decode_gate: Arc<prepare::DecodeGate>,
}

/// `(threadId, runId)` → the run's replay buffer; and the news of each buffered run's start, for
/// the streams that follow a thread (`connect`).
pub struct Replays {
    map: std::sync::Mutex<std::collections::HashMap<(String, String), Buffered>>,
    started: tokio::sync::broadcast::Sender<(String, String)>,
}

/// A run's buffered events and whom they belong to (the thread's owner when the run was
/// admitted).
#[derive(Clone)]
struct Buffered {
    owner: Option<String>,
    events: Arc<replay::RunEvents>,
}

impl Default for Replays {
    fn default() -> Replays {
        Replays {
            map: Default::default(),
            // A follower that falls this far behind looks the thread's runs up again.
            started: tokio::sync::broadcast::channel(1024).0,
        }
    }
}

impl Replays {
    fn map(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<(String, String), Buffered>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `(threadId, runId)` of each buffered run from now on, as it starts.
    pub fn starts(&self) -> tokio::sync::broadcast::Receiver<(String, String)> {
        self.started.subscribe()
    }

    /// The buffered runs of a thread that `caller` may read, by run id.
    pub fn of_thread(
        &self,
        caller: &Caller,
        thread_id: &str,
    ) -> Vec<(String, Arc<replay::RunEvents>)> {
        self.map()
            .iter()
            .filter(|((t, _), b)| t == thread_id && caller.may_touch(b.owner.as_deref()))
            .map(|((_, r), b)| (r.clone(), b.events.clone()))
            .collect()
    }

    /// A run's buffered events, when `caller` may read them: a run of a thread's earlier owner
    /// (the thread deleted and made again) is none of the new owner's business, and the other
    /// way round.
    pub fn get(
        &self,
        caller: &Caller,
        thread_id: &str,
        run_id: &str,
    ) -> Option<Arc<replay::RunEvents>> {
        self.map()
            .get(&(thread_id.to_owned(), run_id.to_owned()))
            .filter(|b| caller.may_touch(b.owner.as_deref()))
            .map(|b| b.events.clone())
    }

    fn insert(
        &self,
        thread_id: &str,
        run_id: &str,
        owner: Option<String>,
        events: Arc<replay::RunEvents>,
    ) {
        self.map().insert(
            (thread_id.to_owned(), run_id.to_owned()),
            Buffered { owner, events },
        );
        // Nobody following is no error.
        let _ = self.started.send((thread_id.to_owned(), run_id.to_owned()));
    }

    /// Removes the buffer if it is still `events` (a later run may not reuse the id, but be safe).
    fn remove(&self, thread_id: &str, run_id: &str, events: &Arc<replay::RunEvents>) {
        let mut m = self.map();
        let key = (thread_id.to_owned(), run_id.to_owned());
        if m.get(&key).is_some_and(|b| Arc::ptr_eq(&b.events, events)) {
            m.remove(&key);
        }
    }

    /// A deleted thread's runs are gone with it: nobody replays them any more.
    pub fn forget_thread(&self, thread_id: &str) {
        self.map().retain(|(t, _), _| t != thread_id);
    }
}

impl Runtime {
    pub fn new(
        settings: Settings,
        store: Store,
        kernels: Arc<Pool>,
        clock: Arc<dyn Clock>,
        metrics: Arc<dyn Telemetry>,
    ) -> Runtime {
        let decode_gate = Arc::new(prepare::DecodeGate::new(settings.max_image_decodes));
        let rt = Runtime {
            threads: Arc::new(Threads::new(store, metrics.clone())),
            kernels,
            clock,
            activity: Activity::default(),
            shutdown: Shutdown::default(),
            replays: Replays::default(),
            limits: Arc::new(Limits::new(&settings.caps, metrics.clone())),
            settings,
            metrics,
            decode_gate,
        };
        rt.touch();
        rt
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    pub fn threads(&self) -> &Threads {
        &self.threads
    }

    /// The registry, shared (a run's [`hold::ThreadHold`] keeps it).
    pub fn threads_arc(&self) -> &Arc<Threads> {
        &self.threads
    }

    /// The gateway's kernels.
    pub fn kernels(&self) -> &Arc<Pool> {
        &self.kernels
    }

    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    pub fn activity(&self) -> &Activity {
        &self.activity
    }

    pub fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    pub fn channel_capacity(&self) -> usize {
        self.settings.channel_capacity
    }

    pub fn metrics(&self) -> &Arc<dyn Telemetry> {
        &self.metrics
    }

    pub fn limits(&self) -> &Arc<Limits> {
        &self.limits
    }

    pub fn decode_gate(&self) -> &Arc<prepare::DecodeGate> {
        &self.decode_gate
    }

    pub fn replays(&self) -> &Replays {
        &self.replays
    }

    /// How long a run goes on without a client (zero: a disconnect ends it).
    pub fn detach_grace(&self) -> std::time::Duration {
        self.settings.detach_grace
    }

    /// Records activity now (idle shutdown).
    pub fn touch(&self) {
        self.activity.touch(self.clock.now_ms());
    }

    /// Cancels a kernel task in the background, bounded, on the kernel of the thread that
    /// recorded `kernel`; nobody waits for the answer.
    pub fn cancel_task_later(&self, kernel: Option<&str>, task: Option<String>) {
        let Some(task) = task else {
            return;
        };
        if let Some(client) = self.kernels.of_thread(kernel).and_then(|k| k.client()) {
            tokio::spawn(async move {
                let _ = tokio::time::timeout(driver::CANCEL_WAIT, client.cancel_task(&task)).await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn user(name: &str) -> Caller {
        Caller::jwt_user(name)
    }

    #[test]
    fn a_runs_buffer_is_read_by_its_threads_owner_only_and_goes_with_the_thread() {
        let r = Replays::default();
        let events = || replay::RunEvents::new(1 << 16, Duration::from_secs(30));
        r.insert("t", "r1", Some("alice".into()), events());
        r.insert("t", "r2", Some("bob".into()), events());
        r.insert("u", "r1", Some("alice".into()), events());
        assert!(r.get(&user("alice"), "t", "r1").is_some());
        assert!(r.get(&user("bob"), "t", "r1").is_none());
        assert!(r.get(&user("bob"), "t", "r2").is_some());
        // No user (no authentication, or the service token for nobody): every run.
        assert!(r.get(&Caller::OPEN, "t", "r1").is_some());
        let runs = |c: &Caller, t: &str| {
            let mut v: Vec<String> = r.of_thread(c, t).into_iter().map(|(id, _)| id).collect();
            v.sort();
            v
        };
        assert_eq!(runs(&user("alice"), "t"), ["r1"]);
        assert_eq!(runs(&user("bob"), "t"), ["r2"]);
        assert_eq!(runs(&Caller::OPEN, "t"), ["r1", "r2"]);
        r.forget_thread("t");
        assert!(runs(&Caller::OPEN, "t").is_empty());
        assert!(
            r.get(&user("alice"), "u", "r1").is_some(),
            "another thread's stay"
        );
    }
}
