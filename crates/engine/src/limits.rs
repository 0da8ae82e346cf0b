//! The bounds on concurrent work, at run time (their values: [`Caps`]).
//!
//! A bound is a count with a slot per unit of work: a slot is taken before the work starts and
//! given back when the guard that holds it drops, so no path can forget to give it back. Taking
//! one never waits: beyond a bound the work is refused (or, for a detached run, not granted its
//! grace), counted in `agui_limit_reached_total{limit}` and logged (info). The connection bound lives
//! in the accept loop (`server`), which waits for a slot instead.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{msg, ApiError, Code};
use crate::telemetry::{Limit, Telemetry};

/// The bounds (see the book's "Bounds").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// Open client connections on the main listener; beyond, new ones wait in the accept queue.
    pub max_connections: usize,
    /// Runs being served at once (attached, detached and guidance runs alike).
    pub max_runs: usize,
    /// Runs of one user at once, within `max_runs` (a caller without a user: `max_runs` only).
    pub max_runs_per_user: usize,
    /// Runs going on without a client at once; beyond, a client that leaves cancels its run.
    pub max_detached_runs: usize,
    /// Readers of one run's events route at once.
    pub max_readers_per_run: usize,
    /// Guidance runs of one thread at once.
    pub max_guidance_per_thread: usize,
    /// Messages one thread's transcript keeps (the oldest go first).
    pub transcript_limit: usize,
}

impl Default for Caps {
    fn default() -> Caps {
        Caps {
            // Every run is a connection, and so is every re-attached reader and every idle
            // keep-alive connection: four times the runs, within the accept queue's depth and
            // well within a service's usual descriptor limit (65,536).
            max_connections: 4096,
            // A run costs the gateway about 40 KiB (BENCHMARKS.md) and the kernel a task: 1,024
            // are 40 MiB here, more than one kernel serves with an LLM behind it.
            max_runs: 1024,
            // One user cannot hold every run slot: a person runs a few at once, a busy
            // service for one user a few dozen.
            max_runs_per_user: 64,
            // A detached run keeps its replay buffer (1 MiB by default) with nobody reading it:
            // 256 of them are at most 256 MiB.
            max_detached_runs: 256,
            // A page, its reloads and a few tabs.
            max_readers_per_run: 8,
            // Guidance is a person steering a running pipeline: one or two at a time.
            max_guidance_per_thread: 4,
            // A long conversation with its tool calls (each message within 64 KiB of text).
            transcript_limit: 1000,
        }
    }
}

/// The runtime's bounds.
pub struct Limits {
    runs: Arc<Semaphore>,
    max_runs: usize,
    detached: Arc<Semaphore>,
    readers_per_run: usize,
    guidance: Arc<PerKey>,
    per_user: Arc<PerKey>,
    metrics: Arc<dyn Telemetry>,
}

/// A run's slot among `--max-runs` (and its user's among `--max-runs-per-user`), held for the
/// run's whole life (detached included).
#[derive(Debug)]
pub struct RunSlot {
    _run: OwnedSemaphorePermit,
    _user: Option<KeySlot>,
    /// What else lasts as long as the run (its LLM egress capability).
    held: Vec<Box<dyn std::any::Any + Send + Sync>>,
}

impl RunSlot {
    /// Keeps `guard` until the run ends (dropped with the slot).
    pub fn hold(&mut self, guard: impl std::any::Any + Send + Sync) {
        self.held.push(Box::new(guard));
    }
}

/// A detached run's slot among `--max-detached-runs`, held while no client is attached.
#[derive(Debug)]
pub struct DetachedSlot(#[allow(dead_code)] OwnedSemaphorePermit);

/// A guidance run's slot among its thread's `--max-guidance-per-thread`.
#[derive(Debug)]
pub struct GuidanceSlot(#[allow(dead_code)] KeySlot);

/// One of a key's slots in a [`PerKey`], given back when dropped.
#[derive(Debug)]
struct KeySlot {
    counts: Arc<PerKey>,
    key: String,
}

impl Drop for KeySlot {
    fn drop(&mut self) {
        self.counts.put_back(&self.key);
    }
}

/// Counts per key (a thread), each at most `max`; a key whose count is zero takes no memory.
#[derive(Debug)]
struct PerKey {
    max: usize,
    counts: Mutex<HashMap<String, usize>>,
}

impl PerKey {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn take(&self, key: &str) -> bool {
        let mut m = self.map();
        let n = m.entry(key.to_owned()).or_insert(0);
        if *n >= self.max {
            return false;
        }
        *n += 1;
        true
    }

    fn put_back(&self, key: &str) {
        let mut m = self.map();
        if let Some(n) = m.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                m.remove(key);
            }
        }
    }

    fn len(&self) -> usize {
        self.map().len()
    }
}

/// What a run refused at `limit` (by [`Limits::run`]) is answered: 429 for its user's bound,
/// 503 for the gateway's.
pub fn refused_run(limit: Limit) -> ApiError {
    match limit {
        Limit::UserRuns => ApiError::new(Code::TooManyUserRuns, msg::TOO_MANY_USER_RUNS),
        _ => ApiError::new(Code::TooManyRuns, msg::TOO_MANY_RUNS),
    }
}

impl KeySlot {
    /// One of `key`'s slots, or `None` when it has all it may.
    fn take(counts: &Arc<PerKey>, key: &str) -> Option<KeySlot> {
        counts.take(key).then(|| KeySlot {
            counts: counts.clone(),
            key: key.to_owned(),
        })
    }
}

impl Limits {
    pub fn new(caps: &Caps, metrics: Arc<dyn Telemetry>) -> Limits {
        Limits {
            runs: Arc::new(Semaphore::new(caps.max_runs)),
            max_runs: caps.max_runs,
            detached: Arc::new(Semaphore::new(caps.max_detached_runs)),
            readers_per_run: caps.max_readers_per_run,
            guidance: Arc::new(PerKey {
                max: caps.max_guidance_per_thread,
                counts: Mutex::default(),
            }),
            per_user: Arc::new(PerKey {
                max: caps.max_runs_per_user,
                counts: Mutex::default(),
            }),
            metrics,
        }
    }

    /// Counts and logs a refusal at `limit`.
    pub fn reached(&self, limit: Limit) {
        self.metrics.limit_reached(limit);
        // Info, as every refusal: a flood at a bound must not flood the warnings (the metric and
        // its alert tell an operator).
        tracing::info!(
            limit = limit.as_str(),
            "a bound on concurrent work is reached"
        );
    }

    /// A slot for a new run of `user`, or the bound reached (counted): `--max-runs-per-user` of
    /// that user's runs, or `--max-runs` in all. A caller without a user is bounded by
    /// `--max-runs` alone.
    pub fn run(&self, user: Option<&str>) -> Result<RunSlot, Limit> {
        let user = match user {
            Some(u) => Some(
                KeySlot::take(&self.per_user, u)
                    .ok_or(Limit::UserRuns)
                    .inspect_err(|l| {
                        self.reached(*l);
                    })?,
            ),
            None => None,
        };
        match self.runs.clone().try_acquire_owned() {
            Ok(p) => Ok(RunSlot {
                _run: p,
                _user: user,
                held: Vec::new(),
            }),
            Err(_) => {
                self.reached(Limit::Runs);
                Err(Limit::Runs)
            }
        }
    }

    /// A slot for a run that just lost its last client, or `None` (counted) when
    /// `--max-detached-runs` are detached already.
    pub fn detach(&self) -> Option<DetachedSlot> {
        match self.detached.clone().try_acquire_owned() {
            Ok(p) => Some(DetachedSlot(p)),
            Err(_) => {
                self.reached(Limit::DetachedRuns);
                None
            }
        }
    }

    /// How many readers may follow one run at once.
    pub fn readers_per_run(&self) -> usize {
        self.readers_per_run
    }

    /// A slot for a guidance run of `thread_id`, or `None` (counted) when the thread has
    /// `--max-guidance-per-thread` already.
    pub fn guidance(&self, thread_id: &str) -> Option<GuidanceSlot> {
        match KeySlot::take(&self.guidance, thread_id) {
            Some(slot) => Some(GuidanceSlot(slot)),
            None => {
                self.reached(Limit::Guidance);
                None
            }
        }
    }

    /// Runs being served now.
    pub fn runs_in_use(&self) -> usize {
        self.max_runs - self.runs.available_permits()
    }

    /// Threads with a guidance run now.
    pub fn threads_with_guidance(&self) -> usize {
        self.guidance.len()
    }
}

/// Descriptors the gateway may hold with every bound reached: a socket per connection, a kernel
/// stream per run, and room for the rest (the listeners, the kernel's pooled connections, the
/// store, the journal, the logs).
pub fn descriptors_needed(caps: &Caps) -> u64 {
    (caps.max_connections + caps.max_runs) as u64 + 256
}

/// Raises the soft open-file limit towards the hard one, as far as `--max-connections` and
/// `--max-runs` need (a system's default soft limit, often 1,024, is below the default bounds):
/// a gateway out of descriptors fails every accept and every kernel call, where one at its bounds
/// only makes clients wait. Says so when even the hard limit is too low. Returns the soft limit.
#[allow(unsafe_code)]
pub fn make_room_for_descriptors(caps: &Caps) -> u64 {
    let needed = descriptors_needed(caps);
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid pointer to an rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 0;
    }
    if r.rlim_cur < needed {
        let raised = libc::rlimit {
            rlim_cur: needed.min(r.rlim_max),
            rlim_max: r.rlim_max,
        };
        // SAFETY: as above.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            r = raised;
        }
    }
    if r.rlim_cur < needed {
        tracing::warn!(
            limit = r.rlim_cur,
            needed,
            "the open-file limit is below what --max-connections and --max-runs need: raise it \
             (LimitNOFILE=, ulimit -n) or lower them"
        );
    }
    r.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::testing::Counts;
    use std::sync::atomic::Ordering;

    #[test]
    fn the_open_file_limit_is_raised_as_far_as_the_bounds_need() {
        let c = Caps::default();
        assert_eq!(descriptors_needed(&c), 4096 + 1024 + 256);
        let soft = make_room_for_descriptors(&c);
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        #[allow(unsafe_code)]
        // SAFETY: getrlimit with a valid pointer to an rlimit.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0;
        assert!(ok);
        assert_eq!(soft, r.rlim_cur);
        assert!(soft >= descriptors_needed(&c).min(r.rlim_max), "{soft}");
    }

    fn caps(runs: usize, detached: usize, guidance: usize) -> Caps {
        Caps {
            max_runs: runs,
            max_detached_runs: detached,
            max_guidance_per_thread: guidance,
            ..Caps::default()
        }
    }

    #[test]
    fn a_slot_comes_back_when_its_holder_drops_it() {
        let c = caps(2, 1, 1);
        let l = Limits::new(&c, Arc::new(Counts::default()));
        let (a, b) = (l.run(None).unwrap(), l.run(None).unwrap());
        assert_eq!(
            l.run(None).unwrap_err(),
            Limit::Runs,
            "a third run over a cap of two"
        );
        assert_eq!(l.runs_in_use(), 2);
        drop(a);
        let c2 = l.run(None).expect("a slot came back");
        drop((b, c2));
        assert_eq!(l.runs_in_use(), 0);

        let d = l.detach().unwrap();
        assert!(l.detach().is_none());
        drop(d);
        assert!(l.detach().is_some());
    }

    /// A user's runs count against their own bound and the global one; a caller without a user
    /// against the global one alone; a refused run takes no slot of either.
    #[test]
    fn a_users_runs_are_bounded_within_the_global_bound() {
        let counts = Arc::new(Counts::default());
        let l = Limits::new(
            &Caps {
                max_runs: 3,
                max_runs_per_user: 2,
                ..Caps::default()
            },
            counts.clone(),
        );
        let a1 = l.run(Some("alice")).unwrap();
        let a2 = l.run(Some("alice")).unwrap();
        assert_eq!(l.run(Some("alice")).unwrap_err(), Limit::UserRuns);
        assert_eq!(l.runs_in_use(), 2, "the refused run holds no global slot");
        let b1 = l
            .run(Some("bob"))
            .expect("another user has their own bound");
        assert_eq!(
            l.run(Some("bob")).unwrap_err(),
            Limit::Runs,
            "the global bound"
        );
        assert_eq!(l.run(None).unwrap_err(), Limit::Runs);
        drop(a1);
        let anyone = l
            .run(None)
            .expect("a caller without a user: the global bound only");
        drop((a2, b1, anyone));
        assert_eq!(l.runs_in_use(), 0);
        let _ = (l.run(Some("alice")).unwrap(), l.run(Some("alice")).unwrap());
        let reached = |l: Limit| counts.limits[l as usize].load(Ordering::Relaxed);
        assert_eq!((reached(Limit::UserRuns), reached(Limit::Runs)), (1, 2));
    }

    #[test]
    fn guidance_is_counted_per_thread_and_forgotten_at_zero() {
        let counts = Arc::new(Counts::default());
        let l = Limits::new(&caps(10, 10, 2), counts.clone());
        let g1 = l.guidance("t1").unwrap();
        let g2 = l.guidance("t1").unwrap();
        assert!(l.guidance("t1").is_none(), "a third on one thread");
        let other = l.guidance("t2").expect("another thread has its own count");
        assert_eq!(l.threads_with_guidance(), 2);
        drop((g1, g2, other));
        assert_eq!(l.threads_with_guidance(), 0, "no memory for idle threads");
        assert!(l.guidance("t1").is_some());
        let reached = |l: Limit| counts.limits[l as usize].load(Ordering::Relaxed);
        assert_eq!(reached(Limit::Runs), 0);
        assert_eq!(reached(Limit::Guidance), 1);
    }
}
