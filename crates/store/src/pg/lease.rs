//! An instance's lease: its heartbeat in `agui_instances`, renewed every third of the TTL.
//!
//! Another instance takes a thread over once the holder's heartbeat is older than the TTL, as the
//! database's clock tells. So the holder must stop writing before that can happen: it counts its
//! lease from the moment it *sent* its last successful renewal (the database stamped it later,
//! never earlier) and gives it up a margin before the TTL. A lapsed lease is regained by the next
//! successful renewal; threads taken over meanwhile are fenced by their epoch anyway.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// The lapse of a lease, as the runs of its time see it.
#[derive(Debug, Default)]
pub struct Lapse {
    token: CancellationToken,
    /// Noticed only after the whole TTL had passed (the process was stopped, say): another
    /// instance may hold its threads by now, so nothing may be done in their name (their kernel
    /// tasks are not cancelled). A lapse noticed in time (the database unreachable) leaves no
    /// instance able to take over yet: the runs cancel their tasks, leaving nothing running.
    late: AtomicBool,
}

impl Lapse {
    pub async fn wait(&self) {
        self.token.cancelled().await
    }

    pub fn is_set(&self) -> bool {
        self.token.is_cancelled()
    }

    pub fn is_late(&self) -> bool {
        self.late.load(Ordering::SeqCst)
    }
}

/// How long before the TTL an instance stops counting on its lease.
pub fn margin(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(500)).min(ttl / 2)
}

/// Whether a lease renewed at `renewed` (the send time of the renewal) still holds at `now`.
pub fn holds(renewed: Option<Instant>, now: Instant, ttl: Duration) -> bool {
    renewed.is_some_and(|r| now.saturating_duration_since(r) + margin(ttl) < ttl)
}

/// The lease of this instance.
#[derive(Debug)]
pub struct Lease {
    ttl: Duration,
    renewed: Mutex<Option<Instant>>,
    /// Set when the lease lapses; replaced by a fresh one when it is regained (runs that started
    /// before a lapse watch the one of their time).
    lapsed: Mutex<Arc<Lapse>>,
    given_up: AtomicBool,
}

impl Lease {
    pub fn new(ttl: Duration) -> Lease {
        Lease {
            ttl,
            renewed: Mutex::new(None),
            lapsed: Mutex::new(Arc::default()),
            given_up: AtomicBool::new(false),
        }
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    fn last_renewal(&self) -> Option<Instant> {
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the lease was given up (a clean stop).
    pub fn given_up(&self) -> bool {
        self.given_up.load(Ordering::SeqCst)
    }

    /// Whether this instance may write now.
    pub fn holds(&self) -> bool {
        holds(self.last_renewal(), Instant::now(), self.ttl)
    }

    /// When the lease lapses unless it is renewed first.
    pub fn lapses_at(&self) -> Option<Instant> {
        self.last_renewal()
            .map(|r| r + self.ttl.saturating_sub(margin(self.ttl)))
    }

    /// Gives the lease up for good (a clean stop): it never holds again.
    pub fn give_up(&self) {
        self.given_up.store(true, Ordering::SeqCst);
        *self.renewed.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// A renewal sent at `sent` succeeded.
    pub fn renewed(&self, sent: Instant) {
        if self.given_up.load(Ordering::SeqCst) {
            return;
        }
        let mut r = self.renewed.lock().unwrap_or_else(|e| e.into_inner());
        if r.is_none_or(|old| sent > old) {
            *r = Some(sent);
        }
        drop(r);
        let mut l = self.lapsed.lock().unwrap_or_else(|e| e.into_inner());
        if l.is_set() && self.holds() {
            *l = Arc::default();
        }
    }

    /// Marks the lease lapsed, once per lapse, if it has: the runs of its time end. Returns
    /// whether this call did.
    pub fn check(&self) -> bool {
        let l = self.lapsed.lock().unwrap_or_else(|e| e.into_inner());
        // Under the lock: a renewal that lands meanwhile replaces the lapse only once it holds.
        if l.is_set() || self.holds() {
            return false;
        }
        l.late.store(self.is_late(), Ordering::SeqCst);
        l.token.cancel();
        true
    }

    /// The whole TTL has passed since the last renewal: another instance may hold this one's
    /// threads by now.
    pub fn is_late(&self) -> bool {
        self.last_renewal().is_none_or(|r| r.elapsed() >= self.ttl)
    }

    /// The lapse a run started now watches: set if the lease lapses while it runs.
    pub fn watch(&self) -> Arc<Lapse> {
        self.lapsed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_holds_until_a_margin_before_the_ttl_from_the_renewals_send_time() {
        let ttl = Duration::from_secs(15);
        let t0 = Instant::now();
        assert!(!holds(None, t0, ttl), "never renewed");
        assert_eq!(margin(ttl), Duration::from_millis(1500));
        assert!(holds(Some(t0), t0 + Duration::from_secs(13), ttl));
        assert!(!holds(Some(t0), t0 + Duration::from_millis(13_500), ttl));
        assert!(!holds(Some(t0), t0 + Duration::from_secs(60), ttl));
        // Short TTLs keep at least half a second of margin, never more than half the TTL.
        assert_eq!(margin(Duration::from_secs(2)), Duration::from_millis(500));
        assert_eq!(
            margin(Duration::from_millis(600)),
            Duration::from_millis(300)
        );
    }

    #[test]
    fn a_lapse_ends_the_runs_of_its_time_and_a_renewal_starts_a_new_time() {
        let lease = Lease::new(Duration::from_secs(15));
        assert!(!lease.holds());
        lease.renewed(Instant::now());
        assert!(lease.holds());
        assert!(!lease.check(), "holding: nothing lapses");
        let before = lease.watch();
        // Renewed 14 s ago: lapsed (margin 1.5 s), noticed in time (under the TTL).
        *lease.renewed.lock().unwrap() = Some(Instant::now() - Duration::from_secs(14));
        assert!(lease.check());
        assert!(!lease.check(), "once per lapse");
        assert!(before.is_set() && !before.is_late());
        lease.renewed(Instant::now());
        let after = lease.watch();
        assert!(
            !after.is_set(),
            "a run after the renewal is not ended by the old lapse"
        );
        assert!(before.is_set());
        // Noticed after the whole TTL: late.
        *lease.renewed.lock().unwrap() = Some(Instant::now() - Duration::from_secs(20));
        assert!(lease.check());
        assert!(after.is_late());
        // A late answer to an older renewal does not move the lease back.
        let now = Instant::now();
        lease.renewed(now);
        lease.renewed(now - Duration::from_secs(100));
        assert!(lease.holds());
        // Given up at a clean stop: no renewal brings it back.
        lease.give_up();
        assert!(!lease.holds());
        lease.renewed(Instant::now());
        assert!(!lease.holds());
    }
}
