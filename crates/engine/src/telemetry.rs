//! What the engine reports as it runs, for the metrics of whoever runs it: a trait the gateway
//! implements with its Prometheus families, so the engine never sees an exporter.

use std::time::Duration;

use agui::Code;
use store::RunOutcome;

/// The engine's reports. Each is a count or a duration, called on the hot path: an
/// implementation must not block.
pub trait Telemetry: Send + Sync {
    /// A run was admitted and starts.
    fn run_started(&self);
    /// A run ended with `outcome` (and its error's code) after `took`.
    fn run_finished(&self, outcome: RunOutcome, code: Option<Code>, took: Duration);
    /// One event of type `index` ([`agui::Event::type_index`]) was sent.
    fn event_sent(&self, index: usize);
    /// `n` interrupts had `event` happen to them.
    fn interrupts(&self, event: InterruptEvent, n: usize);
    /// The number of pending interrupts changed by `delta`.
    fn pending_changed(&self, delta: i64);
    /// `n` images are about to be decoded.
    fn images_decoded(&self, n: usize);
    /// An admission (lock, load, decision, save) took `took`.
    fn admission(&self, took: Duration);
    /// A run's transcript could not be written.
    fn transcript_write_failed(&self);
    /// A bound on concurrent work was reached.
    fn limit_reached(&self, limit: Limit);
    /// A request was refused access, for `reason` (a fixed set of labels).
    fn auth_refused(&self, reason: &'static str);
}

/// What happened to an interrupt (`agui_interrupts_total{event}`: its name in snake case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum InterruptEvent {
    /// Announced to a client, pending.
    Created = 0,
    /// Answered (allowed, denied or cancelled by its answer) and accepted by the kernel.
    Resolved = 1,
    /// Cleared because it expired.
    Expired = 2,
    /// Cleared by the cancellation extension.
    Cancelled = 3,
}

/// A bound on concurrent work that was reached (`agui_limit_reached_total{limit}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Limit {
    /// The accept loop waited for a connection to close (`--max-connections`).
    Connections = 0,
    /// A run was refused (`--max-runs`).
    Runs = 1,
    /// A client left a run that could not be detached: the run was cancelled
    /// (`--max-detached-runs`).
    DetachedRuns = 2,
    /// A reader of a run's events was refused (`--max-readers-per-run`).
    Readers = 3,
    /// A guidance run was refused (`--max-guidance-per-thread`).
    Guidance = 4,
    /// A run was refused for its user (`--max-runs-per-user`).
    UserRuns = 5,
}

impl Limit {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Counts what it is told, for the engine's own tests.
    #[derive(Default)]
    pub(crate) struct Counts {
        pub(crate) limits: [AtomicUsize; 6],
        pub(crate) pending: std::sync::atomic::AtomicI64,
        pub(crate) transcript_failures: AtomicUsize,
    }

    impl Telemetry for Counts {
        fn run_started(&self) {}
        fn run_finished(&self, _: RunOutcome, _: Option<Code>, _: Duration) {}
        fn event_sent(&self, _: usize) {}
        fn interrupts(&self, _: InterruptEvent, _: usize) {}
        fn pending_changed(&self, delta: i64) {
            self.pending.fetch_add(delta, Ordering::Relaxed);
        }
        fn images_decoded(&self, _: usize) {}
        fn admission(&self, _: Duration) {}
        fn transcript_write_failed(&self) {
            self.transcript_failures.fetch_add(1, Ordering::Relaxed);
        }
        fn limit_reached(&self, limit: Limit) {
            self.limits[limit as usize].fetch_add(1, Ordering::Relaxed);
        }
        fn auth_refused(&self, _: &'static str) {}
    }
}
