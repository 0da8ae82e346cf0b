//! The execution kernels: an external loopback URL, or a managed `iac-code a2a` child that the
//! gateway starts (`launch`, with the `environment` it may have), watches, restarts and stops
//! (`supervisor`), its output in the gateway's log (`output`). Where a thread's run goes among
//! several kernels is decided in `place` (pure) and applied by the `pool`; `card` keeps the
//! kernel's Agent Card.
//!
//! Runs ask for a [`a2a::Client`] here; there is none while a managed kernel starts or restarts,
//! and a run waits (bounded) for it to be ready.

mod bound;
mod card;
mod child;
pub mod confine;
pub mod environment;
pub mod isolate;
pub mod launch;
mod lifetime;
mod output;
mod owner;
pub mod place;
mod pool;
mod seccomp;
mod supervisor;
pub mod tenant;
mod tenants;
pub mod zygote;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

pub use bound::{Bound, SlotGauges, Unplaced};
pub use card::CardCache;
pub use launch::Launch;
pub use pool::Pool;
pub use supervisor::ChildSpec;
pub use tenants::{ForkCounts, TenantCounts, Tenants};

/// How long an external kernel's `/health` may take to answer a probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an external kernel's `/health` may take to answer a readiness probe: well within a
/// probe's own timeout (Kubernetes' default is 1 s).
const READY_PROBE_TIMEOUT: Duration = Duration::from_millis(800);
/// How long an external kernel's answer to a readiness probe stands for the next ones.
const READY_PROBE_FRESH: Duration = Duration::from_secs(1);
/// Failed probes in a row after which an external kernel counts as dead: one lost probe is not
/// a dead kernel, and a live kernel's threads must never move (another kernel would rewrite its
/// running task as interrupted).
pub const DEAD_AFTER_PROBES: u32 = 3;

/// Kernel state as reported by `/health`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelState {
    /// External kernel: its liveness is its probes' (run in a pool of several, or for the
    /// metrics).
    External,
    Starting,
    Ready,
    /// The child died; restarting after a back-off.
    Restarting,
    /// Could not be started (last error).
    Failed(String),
    Stopped,
}

impl KernelState {
    fn as_str(&self) -> &'static str {
        match self {
            KernelState::External => "external",
            KernelState::Starting => "starting",
            KernelState::Ready => "ready",
            KernelState::Restarting => "restarting",
            KernelState::Failed(_) => "failed",
            KernelState::Stopped => "stopped",
        }
    }
}

struct Inner {
    client: Option<a2a::Client>,
    state: KernelState,
    pid: Option<u32>,
    restarts: u64,
}

/// Handle to the kernel.
pub struct Kernel {
    inner: Mutex<Inner>,
    managed: bool,
    /// An external kernel's URL (a pool keys its threads by a digest of it).
    url: Option<String>,
    stop: AtomicBool,
    /// Notified on state changes (readiness waiters).
    changed: tokio::sync::Notify,
    /// Told of every call of the kernel's clients (metrics, trace context).
    observer: Option<Arc<dyn a2a::Observer>>,
    /// An external kernel answered its last liveness probe ([`Kernel::probe_external`]).
    external_up: AtomicBool,
    /// An external kernel's probes failed this many times in a row.
    probe_failures: AtomicU32,
    /// Restarts of a managed kernel, readable without the lock (metrics).
    restarts: AtomicU64,
    /// An external kernel's last readiness probe: when, and whether it answered. Held while a
    /// probe runs, so that probes of `/ready` coming together ask the kernel once.
    ready_probe: tokio::sync::Mutex<Option<(std::time::Instant, bool)>>,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("managed", &self.managed)
            .finish_non_exhaustive()
    }
}

impl Kernel {
    /// An external kernel at a validated loopback URL.
    pub fn external(
        url: &str,
        token: Option<String>,
        timeouts: a2a::Timeouts,
        observer: Option<Arc<dyn a2a::Observer>>,
    ) -> Arc<Kernel> {
        let mut k = Kernel::new(false, KernelState::External, observer);
        k.url = Some(url.to_owned());
        let client = k.client_for(url, token, timeouts);
        k.inner.lock().expect("kernel lock").client = Some(client);
        Arc::new(k)
    }

    fn new(managed: bool, state: KernelState, observer: Option<Arc<dyn a2a::Observer>>) -> Kernel {
        Kernel {
            inner: Mutex::new(Inner {
                client: None,
                state,
                pid: None,
                restarts: 0,
            }),
            managed,
            url: None,
            stop: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
            observer,
            external_up: AtomicBool::new(false),
            probe_failures: AtomicU32::new(0),
            restarts: AtomicU64::new(0),
            ready_probe: tokio::sync::Mutex::new(None),
        }
    }

    /// A client of the kernel at `url`, observed.
    fn client_for(&self, url: &str, token: Option<String>, t: a2a::Timeouts) -> a2a::Client {
        let c = a2a::Client::new(url, token, t);
        match &self.observer {
            Some(o) => c.with_observer(o.clone()),
            None => c,
        }
    }

    /// Probes an external kernel's `/health` every `every` for as long as the gateway runs, so
    /// that `agui_kernel_up` tells whether it answers and a pool knows when it is dead (a managed
    /// kernel's supervisor knows both).
    pub fn probe_external(self: &Arc<Self>, every: Duration) {
        if self.managed {
            return;
        }
        let k = Arc::downgrade(self);
        tokio::spawn(async move {
            while let Some(k) = k.upgrade() {
                let client = k.inner.lock().expect("kernel lock").client.clone();
                let up = match client {
                    Some(c) => c.health(PROBE_TIMEOUT).await.is_ok(),
                    None => false,
                };
                k.probed(up);
                if k.stop.load(Ordering::SeqCst) {
                    return;
                }
                drop(k);
                tokio::time::sleep(every).await;
            }
        });
    }

    /// Counts a probe's answer; placement waiters hear of a kernel found dead or back.
    fn probed(&self, up: bool) {
        let was = self.lost();
        self.external_up.store(up, Ordering::Relaxed);
        if up {
            self.probe_failures.store(0, Ordering::Relaxed);
        } else {
            let _ = self
                .probe_failures
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                    Some(n.saturating_add(1))
                });
        }
        if self.lost() != was {
            if up {
                tracing::info!("an external kernel answers again");
            } else {
                tracing::warn!("an external kernel failed {DEAD_AFTER_PROBES} probes in a row");
            }
            self.changed.notify_waiters();
        }
    }

    /// A client for the kernel; `None` while no kernel can be reached.
    pub fn client(&self) -> Option<a2a::Client> {
        let g = self.inner.lock().expect("kernel lock");
        match g.state {
            KernelState::External | KernelState::Ready => g.client.clone(),
            _ => None,
        }
    }

    /// Whether the kernel would take a run now (`/ready`): a managed one is ready (started and
    /// answering, not restarting); an external one answered a probe of its `/health` within the
    /// last second (asked now otherwise, within [`READY_PROBE_TIMEOUT`]).
    pub async fn ready(&self) -> bool {
        let client = {
            let g = self.inner.lock().expect("kernel lock");
            match g.state {
                KernelState::Ready => return true,
                KernelState::External => g.client.clone(),
                _ => return false,
            }
        };
        let Some(client) = client else { return false };
        let mut last = self.ready_probe.lock().await;
        if let Some((at, up)) = *last {
            if at.elapsed() < READY_PROBE_FRESH {
                return up;
            }
        }
        let up = client.health(READY_PROBE_TIMEOUT).await.is_ok();
        *last = Some((std::time::Instant::now(), up));
        up
    }

    /// The additive `kernel` field of `/health`.
    pub fn health(&self) -> Value {
        let g = self.inner.lock().expect("kernel lock");
        let mut v = json!({
            "mode": if self.managed { "managed" } else { "external" },
            "state": g.state.as_str(),
        });
        if self.managed {
            v["restarts"] = json!(g.restarts);
            if let Some(p) = g.pid {
                v["pid"] = json!(p);
            }
        }
        if let KernelState::Failed(e) = &g.state {
            v["error"] = json!(e);
        }
        v
    }

    /// The process that served this kernel's threads is gone and no new one is ready: it
    /// exited (restarting, or starting again after a restart) or failed to start; an external
    /// one failed [`DEAD_AFTER_PROBES`] probes in a row. What it held in memory is lost, so its
    /// threads may go to another kernel of a pool.
    pub fn lost(&self) -> bool {
        match self.state() {
            KernelState::External => {
                self.probe_failures.load(Ordering::Relaxed) >= DEAD_AFTER_PROBES
            }
            KernelState::Restarting | KernelState::Failed(_) => true,
            KernelState::Starting => self.restarts.load(Ordering::Relaxed) > 0,
            _ => false,
        }
    }

    pub fn state(&self) -> KernelState {
        self.inner.lock().expect("kernel lock").state.clone()
    }

    /// Waits until the managed kernel is ready or failed (or `timeout`).
    pub async fn wait_ready(&self, timeout: Duration) -> KernelState {
        self.wait_for(timeout, |s| {
            !matches!(s, KernelState::Starting | KernelState::Restarting)
        })
        .await
    }

    /// Waits until the state is one `done` accepts (or `timeout`); the state then.
    async fn wait_for(
        &self,
        timeout: Duration,
        done: impl Fn(&KernelState) -> bool,
    ) -> KernelState {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Registered before the state is read: a change in between still wakes it.
            let notified = self.changed.notified();
            let s = self.state();
            if done(&s) {
                return s;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return self.state();
            }
        }
    }

    fn set_state(&self, state: KernelState) {
        self.inner.lock().expect("kernel lock").state = state;
        self.changed.notify_waiters();
    }

    /// Starts a managed kernel: a supervisor thread spawns, probes and restarts the child.
    pub fn managed(spec: ChildSpec, observer: Option<Arc<dyn a2a::Observer>>) -> Arc<Kernel> {
        let k = Arc::new(Kernel::new(true, KernelState::Starting, observer));
        supervisor::start(k.clone(), spec);
        k
    }

    /// Stops the managed child (SIGTERM, SIGKILL after 5 s) and waits for it to exit.
    pub async fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        if self.managed {
            // The supervisor thread notices within 50 ms, stops the child and reports Stopped.
            self.wait_for(Duration::from_secs(12), |s| *s == KernelState::Stopped)
                .await;
        }
    }
}

impl Kernel {
    /// Whether the kernel answers: a managed one is ready, an external one answered its last
    /// probe.
    pub fn up(&self) -> bool {
        match self.state() {
            KernelState::Ready => true,
            KernelState::External => self.external_up.load(Ordering::Relaxed),
            _ => false,
        }
    }

    /// How often the managed kernel was restarted.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(program: &str) -> ChildSpec {
        ChildSpec {
            launch: Launch::new(program),
            ready_timeout: Duration::from_secs(20),
            timeouts: a2a::Timeouts::default(),
        }
    }

    /// A kernel that never listens, whose port a process outside its group takes: the
    /// readiness probe (which carries the token) never goes there.
    #[tokio::test]
    async fn a_port_someone_else_took_is_never_sent_the_token() {
        let dir = tempfile::tempdir().expect("tempdir");
        let port_file = dir.path().join("port");
        let script = dir.path().join("kernel");
        // Arguments: a2a --host 127.0.0.1 --port <port> …
        let text = format!(
            "#!/bin/sh\necho \"$5\" > '{}.tmp'\nmv '{0}.tmp' '{0}'\nexec sleep 30\n",
            port_file.display()
        );
        std::fs::write(&script, text).expect("script");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mut s = spec(&script.display().to_string());
        s.launch.env("PATH", "/usr/bin:/bin");
        let k = Kernel::managed(s, None);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let port: u16 = loop {
            if let Some(p) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|t| t.trim().parse().ok())
            {
                break p;
            }
            assert!(std::time::Instant::now() < deadline, "{}", k.health());
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let squatter = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .expect("the port is free until the kernel binds it");
        // The supervisor probes every 100 ms: a probe would be here well within 2 s.
        let probed = tokio::time::timeout(Duration::from_secs(2), squatter.accept()).await;
        assert!(probed.is_err(), "a listener not the kernel's was probed");
        assert_eq!(k.state(), KernelState::Starting);
        k.stop().await;
    }

    #[tokio::test]
    async fn a_kernel_that_cannot_start_is_failed_and_stops_at_once() {
        let k = Kernel::managed(spec("/nonexistent/iac-code"), None);
        let state = k.wait_ready(Duration::from_secs(10)).await;
        let KernelState::Failed(e) = state else {
            panic!("{state:?}");
        };
        assert!(e.starts_with("cannot start /nonexistent/iac-code: "), "{e}");
        assert_eq!(k.health()["state"], "failed");
        // Told, not polled: the stop is over as soon as the supervisor says so.
        let started = std::time::Instant::now();
        k.stop().await;
        assert_eq!(k.state(), KernelState::Stopped);
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    #[tokio::test]
    async fn a_kernel_that_exits_during_startup_is_failed_and_restarted() {
        let k = Kernel::managed(spec("false"), None);
        let state = k.wait_ready(Duration::from_secs(10)).await;
        assert_eq!(
            state,
            KernelState::Failed(
                "The local A2A process exited during startup (exit code 1).".into()
            )
        );
        // Started again after the first back-off (0.5 s); every child that ended is counted.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while k.health()["restarts"].as_u64() < Some(2) {
            assert!(std::time::Instant::now() < deadline, "{}", k.health());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        k.stop().await;
        assert_eq!(k.state(), KernelState::Stopped);
    }
}
