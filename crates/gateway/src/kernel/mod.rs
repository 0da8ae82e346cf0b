//! The execution kernel: an external loopback URL, or a managed `iac-code a2a` child that the
//! gateway starts, watches, restarts and stops (`supervisor`).
//!
//! Runs ask for a [`a2a::Client`] here; there is none while a managed kernel starts or restarts,
//! and a run waits (bounded) for it to be ready.

mod supervisor;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

pub use supervisor::ChildSpec;

/// Kernel state as reported by `/health`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelState {
    /// External kernel (not probed).
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
    generation: u64,
    restarts: u64,
}

/// Handle to the kernel.
pub struct Kernel {
    inner: Mutex<Inner>,
    managed: bool,
    stop: AtomicBool,
    /// Notified on state changes (readiness waiters).
    changed: tokio::sync::Notify,
}

impl Kernel {
    /// An external kernel at a validated loopback URL.
    pub fn external(url: &str, token: Option<String>, timeouts: a2a::Timeouts) -> Arc<Kernel> {
        Arc::new(Kernel {
            inner: Mutex::new(Inner {
                client: Some(a2a::Client::new(url, token, timeouts)),
                state: KernelState::External,
                pid: None,
                generation: 0,
                restarts: 0,
            }),
            managed: false,
            stop: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
        })
    }

    /// A client for the kernel; `None` while no kernel can be reached.
    pub fn client(&self) -> Option<a2a::Client> {
        let g = self.inner.lock().expect("kernel lock");
        match g.state {
            KernelState::External | KernelState::Ready => g.client.clone(),
            _ => None,
        }
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

    pub fn state(&self) -> KernelState {
        self.inner.lock().expect("kernel lock").state.clone()
    }

    /// Waits until the managed kernel is ready or failed (or `timeout`).
    pub async fn wait_ready(&self, timeout: Duration) -> KernelState {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let notified = self.changed.notified();
            let s = self.state();
            if !matches!(s, KernelState::Starting | KernelState::Restarting) {
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
    pub fn managed(spec: ChildSpec) -> Arc<Kernel> {
        let k = Arc::new(Kernel {
            inner: Mutex::new(Inner {
                client: None,
                state: KernelState::Starting,
                pid: None,
                generation: 0,
                restarts: 0,
            }),
            managed: true,
            stop: AtomicBool::new(false),
            changed: tokio::sync::Notify::new(),
        });
        supervisor::start(k.clone(), spec);
        k
    }

    /// Stops the managed child (SIGTERM, SIGKILL after 5 s) and waits for it to exit.
    pub async fn stop(&self) {
        if !self.managed {
            return;
        }
        self.stop.store(true, Ordering::SeqCst);
        // The supervisor thread reacts within 50 ms; wait for it to report Stopped.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(12);
        while self.state() != KernelState::Stopped && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
