//! A latch: a flag set once, with waiters woken when it is.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

#[derive(Debug, Default)]
pub struct Latch {
    set: AtomicBool,
    notify: Notify,
}

impl Latch {
    /// Sets the latch; every waiter wakes.
    pub fn set(&self) {
        self.set.store(true, Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    pub fn is_set(&self) -> bool {
        self.set.load(Ordering::SeqCst)
    }

    /// Resolves once the latch is set. The waiter registers when the future is first polled
    /// (before the flag is read, so no setting is missed), so a loop can arm it once for many
    /// iterations.
    pub async fn wait(&self) {
        let notified = self.notify.notified();
        if self.is_set() {
            return;
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_waiter_armed_before_the_latch_is_set_wakes_and_a_late_one_returns_at_once() {
        let l = std::sync::Arc::new(Latch::default());
        let early = tokio::spawn({
            let l = l.clone();
            async move { l.wait().await }
        });
        tokio::task::yield_now().await;
        assert!(!l.is_set());
        l.set();
        tokio::time::timeout(std::time::Duration::from_secs(5), early)
            .await
            .expect("woken")
            .unwrap();
        l.wait().await;
    }
}
