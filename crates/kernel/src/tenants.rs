//! The seats of a pool whose users each have a kernel of their own (isolation `user`): at most
//! `--kernels` kernels alive, each one tenant's, started on that tenant's first run (`tenant`
//! decides the seat), stopped after `--kernel-idle-stop` without runs, or when a new tenant needs
//! the seat of the kernel idle the longest.
//!
//! Each kernel started has a key of its own (`tenant:` and random digits), which a thread records
//! as its kernel: a run of a thread that recorded another (an earlier kernel of its user, stopped
//! for idleness) restores the thread's session first, through the kernel's session restore.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::{json, Value};

use super::bound::{now_ms, Bound, Load, SlotGauges, Unplaced};
use super::isolate::Isolation;
use super::tenant::{self, Seat, SeatView};
use super::{Kernel, KernelState};

/// A tenant's kernel in a seat.
#[derive(Debug)]
struct Occupant {
    tenant: String,
    kernel: Arc<Kernel>,
    /// What a thread records of this kernel.
    key: String,
    load: Arc<Load>,
}

/// What the metrics read of the tenants' kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TenantCounts {
    /// Kernels alive now (starting, ready or restarting).
    pub alive: u64,
    pub started: u64,
    pub stopped: u64,
    /// Started for a tenant that had a kernel before, whose sessions it restores.
    pub restored: u64,
    /// The fork server (`--kernel-start fork`): kernels it forked, its restarts, whether it is
    /// ready now.
    pub fork: Option<ForkCounts>,
}

/// The fork server's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ForkCounts {
    pub forked: u64,
    pub restarts: u64,
    pub up: bool,
}

/// The seats, and how a tenant's kernel is made.
pub struct Tenants {
    seats: Mutex<Vec<Option<Occupant>>>,
    isolation: Isolation,
    observer: Option<Arc<dyn a2a::Observer>>,
    idle_stop: Duration,
    started: AtomicU64,
    stopped: AtomicU64,
    restored: AtomicU64,
    /// Restarts of kernels no longer in a seat (the metric only grows).
    retired_restarts: AtomicU64,
}

impl std::fmt::Debug for Tenants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenants")
            .field("idle_stop", &self.idle_stop)
            .finish_non_exhaustive()
    }
}

fn random_key() -> String {
    let mut b = [0u8; 8];
    rand::Rng::fill(&mut rand::thread_rng(), &mut b);
    format!("tenant:{}", hex::encode(b))
}

impl Tenants {
    /// `seats` seats, none occupied. Its idle sweep runs for as long as the value lives (call
    /// within a Tokio runtime).
    pub fn new(
        seats: usize,
        isolation: Isolation,
        idle_stop: Duration,
        observer: Option<Arc<dyn a2a::Observer>>,
    ) -> Arc<Tenants> {
        let t = Arc::new(Tenants {
            seats: Mutex::new((0..seats.max(1)).map(|_| None).collect()),
            isolation,
            observer,
            idle_stop,
            started: AtomicU64::new(0),
            stopped: AtomicU64::new(0),
            restored: AtomicU64::new(0),
            retired_restarts: AtomicU64::new(0),
        });
        sweep_idle(Arc::downgrade(&t));
        t
    }

    pub fn isolation(&self) -> &Isolation {
        &self.isolation
    }

    fn views<'a>(seats: &'a [Option<Occupant>], now: u64) -> Vec<SeatView<'a>> {
        seats
            .iter()
            .map(|s| match s {
                None => SeatView {
                    tenant: None,
                    active: 0,
                    idle_for: Duration::ZERO,
                },
                Some(o) => SeatView {
                    tenant: Some(&o.tenant),
                    active: o.load.active.load(Ordering::Relaxed),
                    idle_for: Duration::from_millis(
                        now.saturating_sub(o.load.touched.load(Ordering::Relaxed)),
                    ),
                },
            })
            .collect()
    }

    /// Whether a run of `tenant` would find a seat now (its kernel's, an empty one, an idle
    /// kernel's): what a request is refused for before its stream starts.
    pub fn would_seat(&self, tenant: &str) -> bool {
        let seats = self.seats.lock().expect("seats lock");
        tenant::seat_for(tenant, &Self::views(&seats, now_ms())) != Seat::Busy
    }

    /// Binds a run of `tenant`'s thread, which recorded kernel `recorded`, to the tenant's
    /// kernel, started now when it has none (in an empty seat, or in an idle kernel's, which is
    /// stopped). `Busy` when every seat's kernel has running turns.
    pub fn bind(&self, tenant: &str, recorded: Option<&str>) -> Result<Bound, Unplaced> {
        let mut seats = self.seats.lock().expect("seats lock");
        let now = now_ms();
        let decision = tenant::seat_for(tenant, &Self::views(&seats, now));
        let i = match decision {
            Seat::Busy => return Err(Unplaced::Busy),
            Seat::Own(i) => i,
            Seat::Take { seat, evict } => {
                if evict {
                    if let Some(old) = seats[seat].take() {
                        self.retire(old, "another user needs its seat");
                    }
                }
                // Directories and the ruleset: quick, and done under the lock so that two runs
                // of a new tenant start one kernel.
                let made = self.isolation.spec_for(tenant).map_err(|e| {
                    tracing::error!(error = %e, "a user's kernel cannot be made");
                    Unplaced::NoneReady
                })?;
                let kernel = Kernel::managed(made.spec, self.observer.clone());
                self.started.fetch_add(1, Ordering::Relaxed);
                if made.restored {
                    self.restored.fetch_add(1, Ordering::Relaxed);
                }
                tracing::info!(seat, restored = made.restored, "a user's kernel starts");
                let load = Arc::new(Load::default());
                load.touched.store(now, Ordering::Relaxed);
                seats[seat] = Some(Occupant {
                    tenant: tenant.to_owned(),
                    kernel,
                    key: random_key(),
                    load,
                });
                seat
            }
        };
        let o = seats[i].as_ref().expect("the seat is occupied");
        o.load.active.fetch_add(1, Ordering::Relaxed);
        o.load.placed.fetch_add(1, Ordering::Relaxed);
        let moved = recorded != Some(o.key.as_str());
        Ok(Bound::new(
            o.kernel.clone(),
            moved.then(|| o.key.clone()),
            moved,
            o.load.clone(),
        ))
    }

    /// Stops a kernel taken out of its seat, in the background.
    fn retire(&self, o: Occupant, why: &'static str) {
        self.stopped.fetch_add(1, Ordering::Relaxed);
        self.retired_restarts
            .fetch_add(o.kernel.restarts(), Ordering::Relaxed);
        tracing::info!(reason = why, "a user's kernel stops");
        let kernel = o.kernel;
        tokio::spawn(async move { kernel.stop().await });
    }

    /// The kernel a thread that recorded `key` ran on, while it is alive.
    pub fn of_thread(&self, key: Option<&str>) -> Option<Arc<Kernel>> {
        let key = key?;
        let seats = self.seats.lock().expect("seats lock");
        seats
            .iter()
            .flatten()
            .find(|o| o.key == key)
            .map(|o| o.kernel.clone())
    }

    fn kernels(&self) -> Vec<Arc<Kernel>> {
        let seats = self.seats.lock().expect("seats lock");
        seats.iter().flatten().map(|o| o.kernel.clone()).collect()
    }

    /// None: what a kernel tells of itself (its Agent Card, shown to every caller) is not asked
    /// of a user's kernel, whose user runs what they like in it and could make it say anything to
    /// the others.
    pub fn any_client(&self) -> Option<a2a::Client> {
        None
    }

    /// Stops the kernels whose tenants have had no run for the idle time.
    fn stop_idle(&self) {
        let mut seats = self.seats.lock().expect("seats lock");
        for i in tenant::idle(&Self::views(&seats, now_ms()), self.idle_stop) {
            if let Some(o) = seats[i].take() {
                self.retire(o, "idle");
            }
        }
    }

    /// Stops every kernel, all at once.
    pub async fn stop(&self) {
        let all: Vec<Arc<Kernel>> = {
            let mut seats = self.seats.lock().expect("seats lock");
            seats
                .iter_mut()
                .filter_map(Option::take)
                .map(|o| o.kernel)
                .collect()
        };
        futures_util::future::join_all(all.iter().map(|k| k.stop())).await;
        if let Some(server) = &self.isolation.fork {
            server.stop();
        }
    }

    /// The `kernel` field of `/health`: the seats, each empty or its kernel's state (no user is
    /// named).
    pub fn health(&self, strip: bool) -> Value {
        let seats = self.seats.lock().expect("seats lock");
        let each: Vec<Value> = seats
            .iter()
            .map(|s| match s {
                None => json!({"state": "vacant"}),
                Some(o) => {
                    let mut v = o.kernel.health();
                    if strip {
                        if let Some(m) = v.as_object_mut() {
                            m.remove("pid");
                            m.remove("error");
                        }
                    }
                    v
                }
            })
            .collect();
        let alive = seats.iter().flatten().count();
        let restarts = seats
            .iter()
            .flatten()
            .map(|o| o.kernel.restarts())
            .sum::<u64>()
            + self.retired_restarts.load(Ordering::Relaxed);
        let mut health = json!({
            "mode": "managed",
            "isolation": "user",
            "state": summary(seats.iter().flatten().map(|o| o.kernel.state())),
            "size": seats.len(),
            "alive": alive,
            "restarts": restarts,
            "slots": each,
            "start": if self.isolation.fork.is_some() { "fork" } else { "spawn" },
        });
        if let Some(server) = &self.isolation.fork {
            health["forkServer"] = server.health();
        }
        health
    }

    /// No kernel of a seat failed to start (kernels start on demand: none alive is up).
    pub fn up(&self) -> bool {
        !self
            .kernels()
            .iter()
            .any(|k| matches!(k.state(), KernelState::Failed(_)))
    }

    pub fn restarts(&self) -> u64 {
        let alive: u64 = self.kernels().iter().map(|k| k.restarts()).sum();
        alive + self.retired_restarts.load(Ordering::Relaxed)
    }

    /// Each seat's gauges, in seat order (an empty seat: up, no runs).
    pub fn slot_gauges(&self) -> Vec<SlotGauges> {
        let seats = self.seats.lock().expect("seats lock");
        seats
            .iter()
            .map(|s| match s {
                None => SlotGauges {
                    up: true,
                    restarts: 0,
                    active: 0,
                },
                Some(o) => SlotGauges {
                    up: o.kernel.up() || o.kernel.state() == KernelState::Starting,
                    restarts: o.kernel.restarts(),
                    active: o.load.active.load(Ordering::Relaxed) as u64,
                },
            })
            .collect()
    }

    pub fn counts(&self) -> TenantCounts {
        let alive = {
            let seats = self.seats.lock().expect("seats lock");
            seats.iter().flatten().count() as u64
        };
        TenantCounts {
            alive,
            started: self.started.load(Ordering::Relaxed),
            stopped: self.stopped.load(Ordering::Relaxed),
            restored: self.restored.load(Ordering::Relaxed),
            fork: self.isolation.fork.as_ref().map(|f| {
                let (forked, restarts) = f.counts();
                ForkCounts {
                    forked,
                    restarts,
                    up: f.state() == crate::zygote::State::Ready,
                }
            }),
        }
    }
}

/// The seats' state in one word: `ready` when a kernel is, or none is alive (the next one
/// starts on demand); `failed` when every one alive failed to start; else `starting`.
fn summary(states: impl Iterator<Item = KernelState>) -> &'static str {
    let states: Vec<KernelState> = states.collect();
    if states.is_empty() || states.contains(&KernelState::Ready) {
        "ready"
    } else if states.iter().all(|s| matches!(s, KernelState::Failed(_))) {
        "failed"
    } else {
        "starting"
    }
}

/// Looks for idle kernels every quarter of the idle time (at most every 30 s, at least every
/// 100 ms) while the seats live.
fn sweep_idle(t: Weak<Tenants>) {
    tokio::spawn(async move {
        loop {
            let every = match t.upgrade() {
                Some(t) => {
                    (t.idle_stop / 4).clamp(Duration::from_millis(100), Duration::from_secs(30))
                }
                None => return,
            };
            tokio::time::sleep(every).await;
            match t.upgrade() {
                Some(t) => t.stop_idle(),
                None => return,
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::super::confine::Confinement;
    use super::super::{ChildSpec, Launch};
    use super::*;
    use std::path::Path;
    use std::time::Instant;

    /// Seats for kernels that only sleep (never ready: placement does not wait for them).
    fn tenants(dir: &Path, seats: usize, idle_stop: Duration) -> Arc<Tenants> {
        let script = dir.join("quiet");
        std::fs::write(&script, "#!/bin/sh\nexec sleep 30\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut launch = Launch::new(script.display().to_string());
        launch.env("PATH", "/usr/bin:/bin");
        let mut runtime = Confinement::runtime(&script);
        runtime.read_only.push(dir.to_path_buf());
        Tenants::new(
            seats,
            Isolation {
                base: ChildSpec {
                    launch,
                    ready_timeout: Duration::from_secs(20),
                    timeouts: a2a::Timeouts::default(),
                },
                kernels_root: dir.join("kernels"),
                workspace_roots: vec![dir.join("ws")],
                persistence_root: None,
                backup_root: None,
                identity: None,
                runtime,
                fork: None,
                user_env: None,
            },
            idle_stop,
            None,
        )
    }

    /// Each tenant its own kernel, a tenant's runs all on it; a new tenant takes an idle
    /// kernel's seat, never a busy one's; a kernel started again for its tenant is another
    /// (its threads restore their sessions) and counts as restored.
    #[tokio::test]
    async fn each_tenant_has_a_kernel_and_a_busy_one_is_never_taken() {
        let dir = tempfile::tempdir().unwrap();
        let t = tenants(dir.path(), 2, Duration::from_secs(3600));
        let a1 = t.bind("ua", None).unwrap();
        assert!(a1.moved && a1.record.is_some());
        let key_a = a1.record.clone().unwrap();
        let a2 = t.bind("ua", Some(&key_a)).unwrap();
        assert!(Arc::ptr_eq(&a1.kernel, &a2.kernel));
        assert!(!a2.moved && a2.record.is_none());
        let b = t.bind("ub", None).unwrap();
        assert!(!Arc::ptr_eq(&a1.kernel, &b.kernel));
        assert!(Arc::ptr_eq(&t.of_thread(Some(&key_a)).unwrap(), &a1.kernel));
        assert!(t.of_thread(Some("tenant:none")).is_none());
        // A user's kernel is never asked to describe the agent to others.
        assert!(t.any_client().is_none());
        // Both seats run turns: a third tenant is refused, before and at binding.
        assert!(!t.would_seat("uc"));
        assert_eq!(t.bind("uc", None).err(), Some(Unplaced::Busy));
        assert!(t.would_seat("ua"));
        drop(a1);
        drop(a2);
        // The first tenant's kernel is idle now: the third takes its seat, and it stops.
        let old = t.of_thread(Some(&key_a)).unwrap();
        let c = t.bind("uc", None).unwrap();
        assert!(t.of_thread(Some(&key_a)).is_none());
        assert_eq!(
            old.wait_for(Duration::from_secs(15), |s| *s == KernelState::Stopped)
                .await,
            KernelState::Stopped
        );
        drop(c);
        drop(b);
        // The first tenant again: another kernel (in the seat idle the longest), restored.
        let again = t.bind("ua", Some(&key_a)).unwrap();
        assert!(again.moved && again.record.as_deref() != Some(key_a.as_str()));
        let counts = t.counts();
        assert_eq!(
            (
                counts.alive,
                counts.started,
                counts.stopped,
                counts.restored
            ),
            (2, 4, 2, 1)
        );
        assert_eq!(t.health(true)["alive"], 2);
        drop(again);
        t.stop().await;
        assert_eq!(t.counts().alive, 0);
    }

    #[test]
    fn the_seats_state_is_ready_while_one_is_or_none_is_alive() {
        let failed = || KernelState::Failed("x".into());
        assert_eq!(summary(std::iter::empty()), "ready");
        assert_eq!(
            summary([KernelState::Starting, KernelState::Ready].into_iter()),
            "ready"
        );
        assert_eq!(
            summary([failed(), KernelState::Starting].into_iter()),
            "starting"
        );
        assert_eq!(summary([failed(), failed()].into_iter()), "failed");
    }

    #[tokio::test]
    async fn a_kernel_without_runs_for_the_idle_time_is_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let t = tenants(dir.path(), 2, Duration::from_millis(300));
        let a = t.bind("ua", None).unwrap();
        let kernel = a.kernel.clone();
        // Running: never idle.
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(t.counts().alive, 1);
        drop(a);
        let deadline = Instant::now() + Duration::from_secs(5);
        while t.counts().alive > 0 {
            assert!(Instant::now() < deadline, "{:?}", t.counts());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(t.counts().stopped, 1);
        kernel
            .wait_for(Duration::from_secs(15), |s| *s == KernelState::Stopped)
            .await;
        assert_eq!(kernel.state(), KernelState::Stopped);
    }
}
