//! The kernels of a gateway, each a slot with its own supervisor (or an external URL). One is
//! the default and behaves exactly as a gateway with a single kernel: the same `/health`, the same
//! metrics. Runs are bound to the first slot until placement (`place`) is wired to several.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{Kernel, KernelState};
use crate::telemetry::KernelGauges;

/// The gateway's kernels (never none).
#[derive(Debug)]
pub struct Pool {
    slots: Vec<Arc<Kernel>>,
}

impl Pool {
    /// A pool of `slots`, in the order of their keys; `None` when there is none.
    pub fn new(slots: Vec<Arc<Kernel>>) -> Option<Arc<Pool>> {
        (!slots.is_empty()).then(|| Arc::new(Pool { slots }))
    }

    /// A pool of one kernel.
    pub fn one(kernel: Arc<Kernel>) -> Arc<Pool> {
        Arc::new(Pool {
            slots: vec![kernel],
        })
    }

    pub fn slots(&self) -> &[Arc<Kernel>] {
        &self.slots
    }

    /// The first kernel: the one every run goes to until runs are placed.
    pub fn first(&self) -> &Arc<Kernel> {
        &self.slots[0]
    }

    /// A client of a kernel that can be reached now, the first such (what does not concern a
    /// thread, such as the agent card).
    pub fn any_client(&self) -> Option<a2a::Client> {
        self.slots.iter().find_map(|k| k.client())
    }

    /// The additive `kernel` field of `/health`: the kernel's own with one; with several, a
    /// summary (`state` is the best of theirs, `restarts` their sum, `size`) and each one's in
    /// `slots`. `strip` removes what only an authorised caller sees (pids, start errors).
    pub fn health(&self, strip: bool) -> Value {
        let each = |k: &Arc<Kernel>| {
            let mut v = k.health();
            if strip {
                if let Some(o) = v.as_object_mut() {
                    o.remove("pid");
                    o.remove("error");
                }
            }
            v
        };
        if self.slots.len() == 1 {
            return each(&self.slots[0]);
        }
        let states: Vec<KernelState> = self.slots.iter().map(|k| k.state()).collect();
        let best = [
            KernelState::External,
            KernelState::Ready,
            KernelState::Starting,
            KernelState::Restarting,
        ]
        .into_iter()
        .find(|s| states.contains(s))
        .map_or_else(|| states[0].as_str(), |s| s.as_str());
        let managed = self.slots[0].managed;
        let mut v = json!({
            "mode": if managed { "managed" } else { "external" },
            "state": best,
            "size": self.slots.len(),
            "slots": self.slots.iter().map(each).collect::<Vec<_>>(),
        });
        if managed {
            v["restarts"] = json!(self.slots.iter().map(|k| k.restarts()).sum::<u64>());
        }
        v
    }

    /// Probes the external kernels (see [`Kernel::probe_external`]).
    pub fn probe_external(&self, every: Duration) {
        for k in &self.slots {
            k.probe_external(every);
        }
    }

    /// Stops every kernel, all at once (one after another would add their stops up).
    pub async fn stop(&self) {
        futures_util::future::join_all(self.slots.iter().map(|k| k.stop())).await;
    }
}

impl crate::telemetry::KernelGauges for Pool {
    /// Some kernel takes runs.
    fn up(&self) -> bool {
        self.slots.iter().any(|k| k.up())
    }

    fn restarts(&self) -> u64 {
        self.slots.iter().map(|k| k.restarts()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{ChildSpec, Launch};
    use super::*;

    fn spec(program: &str) -> ChildSpec {
        let mut launch = Launch::new(program);
        launch.env("PATH", "/usr/bin:/bin");
        ChildSpec {
            launch,
            ready_timeout: Duration::from_secs(20),
            timeouts: a2a::Timeouts::default(),
        }
    }

    /// A kernel that ignores SIGTERM: its stop takes the whole 5 s before the SIGKILL.
    fn stubborn(dir: &std::path::Path) -> String {
        let script = dir.join("stubborn");
        std::fs::write(&script, "#!/bin/sh\ntrap '' TERM\nexec sleep 30\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        script.display().to_string()
    }

    #[test]
    fn a_pool_of_one_answers_as_its_kernel() {
        let k = Kernel::external("http://127.0.0.1:1/", None, Default::default(), None);
        let pool = Pool::one(k.clone());
        assert_eq!(pool.health(false), k.health());
        assert_eq!(pool.health(true), k.health());
        assert!(pool.any_client().is_some());
        assert!(Pool::new(Vec::new()).is_none());
    }

    /// Several: a summary and each kernel's own state (pids and errors only for a caller who
    /// may see them), the restarts summed, and one stop of them all as long as the longest.
    #[tokio::test]
    async fn several_kernels_are_summed_up_each_shown_and_stopped_together() {
        let dir = tempfile::tempdir().unwrap();
        let slow = stubborn(dir.path());
        let failed = Kernel::managed(spec("/nonexistent/iac-code"), None);
        let pool = Pool::new(vec![
            Kernel::managed(spec(&slow), None),
            failed.clone(),
            Kernel::managed(spec(&slow), None),
        ])
        .unwrap();
        failed.wait_ready(Duration::from_secs(10)).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while pool.slots()[0].health()["pid"].is_null() || pool.slots()[2].health()["pid"].is_null()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "{}",
                pool.health(false)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let full = pool.health(false);
        assert_eq!(
            (&full["mode"], &full["state"], &full["size"]),
            (&json!("managed"), &json!("starting"), &json!(3))
        );
        let slots = full["slots"].as_array().unwrap();
        assert_eq!(slots.len(), 3);
        assert_eq!(slots[1]["state"], "failed");
        assert!(slots[1]["error"].as_str().unwrap().contains("/nonexistent"));
        assert!(slots[0]["pid"].is_u64() && slots[2]["pid"].is_u64());
        let sum: u64 = slots.iter().map(|s| s["restarts"].as_u64().unwrap()).sum();
        assert_eq!(full["restarts"], sum);
        assert_eq!(pool.restarts(), sum);
        assert!(!pool.up());
        let stranger = pool.health(true);
        for s in stranger["slots"].as_array().unwrap() {
            assert!(s.get("pid").is_none() && s.get("error").is_none(), "{s}");
        }
        // Each stubborn kernel takes 5 s to stop: together, not 10.
        let started = std::time::Instant::now();
        pool.stop().await;
        assert!(
            started.elapsed() < Duration::from_secs(9),
            "{:?}",
            started.elapsed()
        );
        for k in pool.slots() {
            assert_eq!(k.state(), KernelState::Stopped);
        }
    }
}
