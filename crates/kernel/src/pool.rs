//! The kernels of a gateway, each a slot with its own supervisor (or an external URL). One is
//! the default and behaves exactly as a gateway with a single kernel: the same `/health`, the same
//! metrics, nothing recorded with a thread. With several, a run is bound to the slot `place`
//! decides (counted while it runs, so that a burst of new threads spreads), and every call about
//! its task goes there.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::bound::{Bound, Load, SlotGauges, Unplaced};
use super::place::{self, Ask, Placement, SlotView};
use super::tenants::Tenants;
use super::{Kernel, KernelState};

/// How often each of several external kernels is probed: one is dead after
/// [`super::DEAD_AFTER_PROBES`] failures in a row: 4 to 6 s after it stopped accepting
/// connections, up to 21 s when it accepts them and never answers (5 s a probe).
pub const PROBE_EVERY: Duration = Duration::from_secs(2);

/// The gateway's kernels: fixed slots shared by every user (never none), or seats of users'
/// own kernels started on demand (isolation `user`: `tenants`, and no slot).
#[derive(Debug)]
pub struct Pool {
    slots: Vec<Arc<Kernel>>,
    tenants: Option<Arc<Tenants>>,
    /// What a thread records of its slot: `managed:<n>`, or `url:` and a digest of the URL (a
    /// URL may carry credentials; it is never written).
    keys: Vec<String>,
    load: Vec<Arc<Load>>,
    /// Held while a placement reads and counts, so that concurrent placements see each other.
    placing: Mutex<()>,
}

impl Pool {
    /// A pool of `slots`, in the order of their keys; `None` when there is none.
    pub fn new(slots: Vec<Arc<Kernel>>) -> Option<Arc<Pool>> {
        if slots.is_empty() {
            return None;
        }
        let keys = slots
            .iter()
            .enumerate()
            .map(|(i, k)| key_of(i, k))
            .collect();
        let load = slots.iter().map(|_| Arc::default()).collect();
        Some(Arc::new(Pool {
            slots,
            tenants: None,
            keys,
            load,
            placing: Mutex::new(()),
        }))
    }

    /// A pool of users' own kernels, in `tenants`' seats.
    pub fn isolated(tenants: Arc<Tenants>) -> Arc<Pool> {
        Arc::new(Pool {
            slots: Vec::new(),
            tenants: Some(tenants),
            keys: Vec::new(),
            load: Vec::new(),
            placing: Mutex::new(()),
        })
    }

    /// The users' own kernels, with isolation `user`.
    pub fn tenants(&self) -> Option<&Arc<Tenants>> {
        self.tenants.as_ref()
    }

    /// A pool of one kernel.
    pub fn one(kernel: Arc<Kernel>) -> Arc<Pool> {
        Pool::new(vec![kernel]).expect("one kernel")
    }

    pub fn slots(&self) -> &[Arc<Kernel>] {
        &self.slots
    }

    /// The first kernel (the only one of a pool of one); none with users' own kernels (a run
    /// is bound to its user's).
    pub fn first(&self) -> Option<&Arc<Kernel>> {
        self.slots.first()
    }

    /// The kernel a thread that recorded `key` is on: the first for a thread that recorded
    /// none (or one of a kernel no longer configured: its task is nowhere else to ask). With
    /// users' own kernels: the one it recorded, while that one is alive.
    pub fn of_thread(&self, key: Option<&str>) -> Option<Arc<Kernel>> {
        if let Some(t) = &self.tenants {
            return t.of_thread(key);
        }
        let at = key.and_then(|k| self.keys.iter().position(|x| x == k));
        Some(at.map_or(&self.slots[0], |i| &self.slots[i]).clone())
    }

    /// Binds a run to the kernel `ask` goes to, waiting up to `wait` for one to be ready when
    /// none is.
    pub async fn bind(&self, ask: &Ask<'_>, wait: Duration) -> Result<Bound, Unplaced> {
        if self.tenants.is_some() {
            // A run of users' own kernels is bound by its user (`bind_user`).
            return Err(Unplaced::NoneReady);
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            // Made before the states are read: a change in between still wakes the wait.
            let changes: Vec<_> = self
                .slots
                .iter()
                .map(|k| Box::pin(k.changed.notified()))
                .collect();
            if let Some(bound) = self.place_now(ask)? {
                return Ok(bound);
            }
            // None ready and none on its way (every one failed or stopped): no use waiting, as
            // with one kernel.
            let coming = self
                .slots
                .iter()
                .any(|k| matches!(k.state(), KernelState::Starting | KernelState::Restarting));
            if !coming {
                return Err(Unplaced::NoneReady);
            }
            let any = futures_util::future::select_all(changes);
            if tokio::time::timeout_at(deadline, any).await.is_err() {
                return self.place_now(ask)?.ok_or(Unplaced::NoneReady);
            }
        }
    }

    /// The placement as the slots are now: `Ok(None)` to wait.
    fn place_now(&self, ask: &Ask<'_>) -> Result<Option<Bound>, Unplaced> {
        let _one = self.placing.lock().unwrap_or_else(|p| p.into_inner());
        let views: Vec<SlotView> = (self.slots.iter().zip(self.load.iter()))
            .map(|(k, l)| SlotView {
                ready: k.client().is_some() && !k.lost(),
                dead: k.lost(),
                active: l.active.load(Ordering::Relaxed),
                placed: l.placed.load(Ordering::Relaxed),
            })
            .collect();
        let keys: Vec<&str> = self.keys.iter().map(String::as_str).collect();
        match place::place(ask, &keys, &views) {
            Placement::Here {
                slot,
                moved,
                record,
            } => {
                let load = &self.load[slot];
                load.active.fetch_add(1, Ordering::Relaxed);
                if record {
                    load.placed.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Some(Bound::new(
                    self.slots[slot].clone(),
                    record.then(|| self.keys[slot].clone()),
                    moved,
                    self.load[slot].clone(),
                )))
            }
            Placement::Wait => Ok(None),
            Placement::Gone => Err(Unplaced::Gone),
        }
    }

    /// A client of a kernel that can be reached now, the first such (what does not concern a
    /// thread, such as the agent card).
    pub fn any_client(&self) -> Option<a2a::Client> {
        if let Some(t) = &self.tenants {
            return t.any_client();
        }
        self.slots.iter().find_map(|k| k.client())
    }

    /// The additive `kernel` field of `/health`: the kernel's own with one; with several, a
    /// summary (`state` is the best of theirs, `restarts` their sum, `size`) and each one's in
    /// `slots`. `strip` removes what only an authorised caller sees (pids, start errors).
    pub fn health(&self, strip: bool) -> Value {
        if let Some(t) = &self.tenants {
            return t.health(strip);
        }
        let several = self.slots.len() > 1;
        let each = |k: &Arc<Kernel>| {
            let mut v = k.health();
            // Several external kernels are probed: whether each answered its last probe, and
            // whether it failed so many in a row that its threads move (one kernel is not
            // probed unless metrics are served, and its `/health` is as before pools).
            if several && !k.managed {
                v["up"] = json!(k.up());
                v["dead"] = json!(k.lost());
            }
            if strip {
                if let Some(o) = v.as_object_mut() {
                    o.remove("pid");
                    o.remove("error");
                }
            }
            v
        };
        if !several {
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

    /// Probes the external kernels (see [`Kernel::probe_external`]) while the gateway runs:
    /// several, so that a dead one's threads move (every [`PROBE_EVERY`]), or one for the
    /// metrics, when asked (every 5 s). Called once.
    /// Whether some kernel would take a run now (see [`Kernel::ready`]); several are asked at once.
    pub async fn ready(&self) -> bool {
        // Users' kernels start on demand: a run is taken while one can be started.
        if let Some(t) = &self.tenants {
            return t.up();
        }
        let asked = self.slots.iter().map(|k| k.ready());
        futures_util::future::join_all(asked).await.contains(&true)
    }

    pub fn probe_external(&self, for_metrics: bool) {
        let every = match self.slots.len() {
            1 if !for_metrics => return,
            1 => Duration::from_secs(5),
            _ => PROBE_EVERY,
        };
        for k in &self.slots {
            k.probe_external(every);
        }
    }

    /// Stops every kernel, all at once (one after another would add their stops up).
    pub async fn stop(&self) {
        if let Some(t) = &self.tenants {
            return t.stop().await;
        }
        futures_util::future::join_all(self.slots.iter().map(|k| k.stop())).await;
    }
}

/// A slot's key: its place among managed kernels, or a digest of its URL.
fn key_of(slot: usize, k: &Kernel) -> String {
    match &k.url {
        Some(url) if !k.managed => {
            let digest = Sha256::digest(url.as_bytes());
            format!("url:{}", hex::encode(&digest[..8]))
        }
        _ => format!("managed:{slot}"),
    }
}

/// What the metrics read of the pool at each scrape.
impl Pool {
    /// Some kernel takes runs.
    pub fn up(&self) -> bool {
        if let Some(t) = &self.tenants {
            return t.up();
        }
        self.slots.iter().any(|k| k.up())
    }

    /// Restarts of its managed kernels, all told.
    pub fn restarts(&self) -> u64 {
        if let Some(t) = &self.tenants {
            return t.restarts();
        }
        self.slots.iter().map(|k| k.restarts()).sum()
    }

    /// Each kernel of a pool of several, in slot order; none with one kernel (its figures are
    /// the pool's).
    pub fn slot_gauges(&self) -> Vec<SlotGauges> {
        if let Some(t) = &self.tenants {
            return t.slot_gauges();
        }
        if self.slots.len() == 1 {
            return Vec::new();
        }
        (self.slots.iter().zip(self.load.iter()))
            .map(|(k, l)| SlotGauges {
                up: k.up(),
                restarts: k.restarts(),
                active: l.active.load(Ordering::Relaxed) as u64,
            })
            .collect()
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

    /// An external kernel at a port nobody listens on (placement never calls it).
    fn ext(port: u16) -> Arc<Kernel> {
        Kernel::external(
            &format!("http://127.0.0.1:{port}/"),
            None,
            Default::default(),
            None,
        )
    }

    /// How long a test's bind may wait for a kernel.
    const WAIT: Duration = Duration::from_secs(1);

    fn new_thread() -> Ask<'static> {
        Ask {
            recorded: None,
            legacy: false,
            took_over: false,
            may_move: true,
        }
    }

    /// A run counts in its kernel's load while it is bound: new threads go to the kernel with
    /// fewer runs, whatever it was given before.
    #[tokio::test]
    async fn a_run_counts_in_its_kernels_load_until_it_ends() {
        let pool = Pool::new(vec![ext(1), ext(2)]).unwrap();
        let slot = |b: &Bound| pool.slots().iter().position(|k| Arc::ptr_eq(k, &b.kernel));
        let a = pool.bind(&new_thread(), WAIT).await.unwrap();
        let b = pool.bind(&new_thread(), WAIT).await.unwrap();
        let c = pool.bind(&new_thread(), WAIT).await.unwrap();
        assert_eq!((slot(&a), slot(&b), slot(&c)), (Some(0), Some(1), Some(0)));
        let active = |p: &Pool| -> Vec<u64> { p.slot_gauges().iter().map(|g| g.active).collect() };
        assert_eq!(active(&pool), [2, 1]);
        assert!(a.record.as_deref().is_some_and(|k| k.starts_with("url:")));
        assert_ne!(a.record, b.record);
        drop(a);
        drop(c);
        // The first has had more threads but now has fewer runs.
        assert_eq!(active(&pool), [0, 1]);
        let d = pool.bind(&new_thread(), WAIT).await.unwrap();
        assert_eq!(slot(&d), Some(0));
        let recorded = b.record.clone().unwrap();
        let stay = Ask {
            recorded: Some(&recorded),
            ..new_thread()
        };
        let e = pool.bind(&stay, WAIT).await.unwrap();
        assert_eq!((slot(&e), e.record.as_deref()), (Some(1), None));
        let on = |key| pool.of_thread(key).expect("a kernel of a pool of slots");
        assert!(Arc::ptr_eq(&on(Some(&recorded)), &pool.slots()[1]));
        assert!(Arc::ptr_eq(&on(Some("url:gone")), &pool.slots()[0]));
        assert!(Arc::ptr_eq(&on(None), &pool.slots()[0]));
    }

    /// An external kernel is dead after [`DEAD_AFTER_PROBES`] failed probes in a row, not
    /// before: then its threads move in runs that may move them (the others cannot go on), new
    /// threads avoid it, `/health` says so; one answer brings it back, and its threads with it.
    #[tokio::test]
    async fn an_external_kernel_is_dead_after_probes_fail_in_a_row_and_back_after_one_answer() {
        use super::super::DEAD_AFTER_PROBES;
        let pool = Pool::new(vec![ext(1), ext(2)]).unwrap();
        let slot = |b: &Bound| pool.slots().iter().position(|k| Arc::ptr_eq(k, &b.kernel));
        let first = pool.bind(&new_thread(), WAIT).await.unwrap();
        let home = first.record.clone().unwrap();
        drop(first);
        let on = |may_move| Ask {
            recorded: Some(&home),
            may_move,
            ..new_thread()
        };
        let k = pool.slots()[0].clone();
        for _ in 1..DEAD_AFTER_PROBES {
            k.probed(false);
        }
        k.probed(true);
        for _ in 1..DEAD_AFTER_PROBES {
            k.probed(false);
        }
        // Failures not in a row, and fewer than enough in a row: it stays the thread's kernel.
        let b = pool.bind(&on(true), WAIT).await.unwrap();
        assert_eq!((slot(&b), b.moved), (Some(0), false));
        drop(b);
        let slots = |p: &Pool| p.health(true)["slots"].clone();
        assert_eq!(
            (&slots(&pool)[0]["up"], &slots(&pool)[0]["dead"]),
            (&json!(false), &json!(false))
        );
        k.probed(false);
        assert!(k.lost());
        assert_eq!(slots(&pool)[0]["dead"], true);
        assert_eq!(
            (
                slots(&pool)[1]["dead"].clone(),
                pool.health(true)["state"].clone()
            ),
            (json!(false), json!("external"))
        );
        let moved = pool.bind(&on(true), WAIT).await.unwrap();
        assert_eq!((slot(&moved), moved.moved), (Some(1), true));
        assert!(moved.record.as_deref().is_some_and(|r| r != home));
        assert_eq!(
            pool.bind(&on(false), WAIT).await.err(),
            Some(Unplaced::Gone)
        );
        // New threads go to the live kernel, though it has more runs.
        let new = pool.bind(&new_thread(), WAIT).await.unwrap();
        assert_eq!(slot(&new), Some(1));
        k.probed(true);
        assert!(!k.lost());
        let back = pool.bind(&on(true), WAIT).await.unwrap();
        assert_eq!((slot(&back), back.moved), (Some(0), false));
        // None answers: a run is refused at once (no external kernel is on its way).
        for k in pool.slots() {
            for _ in 0..DEAD_AFTER_PROBES {
                k.probed(false);
            }
        }
        let started = std::time::Instant::now();
        let none = pool.bind(&new_thread(), Duration::from_secs(30)).await;
        assert_eq!(none.err(), Some(Unplaced::NoneReady));
        assert!(started.elapsed() < Duration::from_secs(2));
    }

    /// With none ready, a run waits (bounded) for kernels on their way, and not at all when
    /// every one failed.
    #[tokio::test]
    async fn a_run_waits_for_kernels_on_their_way_not_for_failed_ones() {
        let failed = Pool::new(vec![
            Kernel::managed(spec("/nonexistent/a"), None),
            Kernel::managed(spec("/nonexistent/b"), None),
        ])
        .unwrap();
        for k in failed.slots() {
            k.wait_ready(Duration::from_secs(10)).await;
        }
        let started = std::time::Instant::now();
        let e = failed.bind(&new_thread(), Duration::from_secs(30)).await;
        assert_eq!(e.err(), Some(Unplaced::NoneReady));
        assert!(started.elapsed() < Duration::from_secs(2));
        failed.stop().await;

        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("quiet");
        std::fs::write(&script, "#!/bin/sh\nexec sleep 30\n").unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let quiet = script.display().to_string();
        let starting = Pool::new(vec![
            Kernel::managed(spec(&quiet), None),
            Kernel::managed(spec(&quiet), None),
        ])
        .unwrap();
        let started = std::time::Instant::now();
        let e = starting
            .bind(&new_thread(), Duration::from_millis(400))
            .await;
        assert_eq!(e.err(), Some(Unplaced::NoneReady));
        assert!(started.elapsed() >= Duration::from_millis(400));
        starting.stop().await;
    }
}
