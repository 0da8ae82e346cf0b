//! This instance's heartbeat and the watchdog of its lease (see `lease`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::sql::HEARTBEAT;
use super::{bounded, unavailable, PgStore};
use crate::StoreError;

impl PgStore {
    /// Renews this instance's heartbeat once.
    pub async fn heartbeat(&self) -> Result<(), StoreError> {
        let sent = Instant::now();
        let beat = bounded("heartbeat", async {
            let c = self.inner.beats.get().await.map_err(unavailable)?;
            let st = c.prepare_cached(HEARTBEAT).await.map_err(unavailable)?;
            c.execute(&st, &[&self.inner.me, &self.inner.advertise_url])
                .await
                .map_err(unavailable)?;
            Ok(())
        })
        .await;
        let failing = &self.inner.beat_failing;
        failing.store(beat.is_err(), std::sync::atomic::Ordering::Relaxed);
        beat?;
        self.inner.lease.renewed(sent);
        Ok(())
    }

    /// Renews the heartbeat every third of the TTL for as long as the store lives, and watches
    /// the lease: one that lapses (the database unreachable for most of a TTL, or this process
    /// stopped) ends the runs of its time.
    pub fn start_heartbeat(&self) {
        let weak = Arc::downgrade(&self.inner);
        let every = self.inner.lease.ttl() / 3;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = weak.upgrade() else { return };
                if inner.lease.given_up() {
                    return;
                }
                let store = PgStore { inner };
                let held = store.inner.lease.holds();
                match store.heartbeat().await {
                    Ok(()) if !held => tracing::info!("the lease on the shared state is renewed"),
                    Ok(()) => {}
                    Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
                }
            }
        });
        // The watchdog wakes when the lease would lapse, not at the next heartbeat: a lapse is
        // noticed before another instance may take over.
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let lease = inner.lease.clone();
                drop(inner);
                if lease.given_up() {
                    return;
                }
                let wake = lease
                    .lapses_at()
                    .filter(|t| *t > Instant::now())
                    .unwrap_or_else(|| Instant::now() + Duration::from_millis(100));
                tokio::time::sleep_until(wake.into()).await;
                if !lease.given_up() && lease.check() {
                    tracing::error!(
                        late = lease.watch().is_late(),
                        "the lease on the shared state lapsed: nothing is written until it is \
                         renewed, and the runs in flight end"
                    );
                }
            }
        });
    }
}
