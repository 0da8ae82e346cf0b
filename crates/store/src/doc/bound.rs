//! The bounds of a thread document. Its records of past runs and executions would otherwise
//! only grow, and a document past what a store loads (64 MiB) makes its thread unusable after a
//! restart. A document within the bounds is never touched: it stays byte for byte what the
//! reference adapter writes.
//!
//! - `runDigests` keeps the newest [`MAX_RUN_DIGESTS`] runs. An idempotent retry of an older run
//!   is no longer recognised: it is admitted as a new run (a client retries a run within
//!   seconds, not a thousand runs later).
//! - `terminalExecutionIds`, `appliedResumeDigests` and `expiredInterrupts` keep at most
//!   [`MAX_EXECUTION_MARKS`] entries each. The current execution's are never dropped (its
//!   applied answers make resumes exactly-once); which past executions' go first is not their
//!   age, which the document does not record. A late cancel of a dropped execution is then
//!   `EXECUTION_NOT_FOUND`, a late answer to its interrupts `EXECUTION_LOST`.
//! - The document as written has at most [`MAX_DOC_BYTES`]: a save over it fails (a state save
//!   failure) rather than write what could not be loaded again.

use std::collections::{BTreeSet, HashSet};

use super::ThreadDoc;
use crate::StoreError;

/// The largest document a store writes or reads.
pub const MAX_DOC_BYTES: usize = 64 * 1024 * 1024;

/// The runs a thread remembers for idempotency.
pub const MAX_RUN_DIGESTS: usize = 1000;

/// From this many runs on, their order is recorded (`runOrder`).
const ORDER_RUNS_FROM: usize = MAX_RUN_DIGESTS / 2;

/// The entries of each record of past executions.
pub const MAX_EXECUTION_MARKS: usize = 1000;

impl ThreadDoc {
    /// Records an admitted run (for idempotency), then keeps the document within its bounds.
    pub fn record_run(&mut self, run_id: &str, digest: &str) {
        self.run_digests
            .insert(run_id.to_owned(), digest.to_owned());
        if self.run_digests.len() > ORDER_RUNS_FROM {
            self.run_order.push(run_id.to_owned());
        }
        self.prune();
    }

    /// Drops the oldest records beyond the bounds; a document within them is left as it is.
    pub fn prune(&mut self) {
        self.prune_runs();
        let current = self.execution.execution_id.clone();
        prune_set(&mut self.terminal_execution_ids, |e| *e == current);
        prune_set(&mut self.applied_resume_digests, |a| {
            a.execution_id == current
        });
        prune_set(&mut self.expired_interrupts, |(e, _)| *e == current);
    }

    fn prune_runs(&mut self) {
        let excess = self.run_digests.len().saturating_sub(MAX_RUN_DIGESTS);
        if excess == 0 {
            return;
        }
        // Runs recorded before their order was are older than every run in it: they go first,
        // in id order (the only order known of them).
        let ordered: HashSet<&str> = self.run_order.iter().map(String::as_str).collect();
        let mut gone: Vec<String> = self
            .run_digests
            .keys()
            .filter(|k| !ordered.contains(k.as_str()))
            .take(excess)
            .cloned()
            .collect();
        let rest = (excess - gone.len()).min(self.run_order.len());
        gone.extend(self.run_order.drain(..rest));
        for run in &gone {
            self.run_digests.remove(run);
        }
    }

    /// The document as a store writes it ([`ThreadDoc::to_json`]), refused over
    /// [`MAX_DOC_BYTES`].
    pub fn to_stored(&self) -> Result<Vec<u8>, StoreError> {
        self.to_stored_sealed(None)
    }

    /// [`ThreadDoc::to_stored`] with the file store's `ownerMac`.
    pub(crate) fn to_stored_sealed(&self, mac: Option<&str>) -> Result<Vec<u8>, StoreError> {
        let bytes = self.to_json_sealed(mac);
        if bytes.len() > MAX_DOC_BYTES {
            return Err(StoreError::Invalid(format!(
                "the document would have {} bytes, over the {MAX_DOC_BYTES} a thread may hold",
                bytes.len()
            )));
        }
        Ok(bytes)
    }
}

/// Drops the first entries beyond [`MAX_EXECUTION_MARKS`] that `keep` does not protect.
fn prune_set<T: Ord + Clone>(set: &mut BTreeSet<T>, keep: impl Fn(&T) -> bool) {
    let excess = set.len().saturating_sub(MAX_EXECUTION_MARKS);
    if excess == 0 {
        return;
    }
    let gone: Vec<T> = set
        .iter()
        .filter(|x| !keep(x))
        .take(excess)
        .cloned()
        .collect();
    for x in &gone {
        set.remove(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{AppliedDigest, Execution};

    fn doc() -> ThreadDoc {
        ThreadDoc::new("t", "agui-x", "/w", None, Execution::new("exec-now", "inv"))
    }

    /// Below the bound nothing is written that the reference does not write; past it the newest
    /// runs are kept, in the order they came (not their ids'), across a save and a load.
    #[test]
    fn run_digests_keep_the_newest_runs() {
        let mut d = doc();
        for i in 0..ORDER_RUNS_FROM {
            d.record_run(&format!("r{i:05}"), "d");
        }
        assert!(d.run_order.is_empty());
        assert!(!String::from_utf8(d.to_json()).unwrap().contains("runOrder"));
        // Ids that sort before the older ones: their age, not their ids, decides.
        let extra = 300;
        for i in 0..MAX_RUN_DIGESTS - ORDER_RUNS_FROM + extra {
            d.record_run(&format!("a{i:05}"), "d");
            d = ThreadDoc::from_json(&d.to_json(), "t").unwrap();
        }
        assert_eq!(d.run_digests.len(), MAX_RUN_DIGESTS);
        assert_eq!(d.run_order.len(), MAX_RUN_DIGESTS - ORDER_RUNS_FROM + extra);
        // The oldest `extra` runs went: those recorded before the order was.
        assert_eq!(
            d.run_digests.keys().filter(|k| k.starts_with('r')).count(),
            ORDER_RUNS_FROM - extra
        );
        assert!(d.run_digests.contains_key("r00499") && !d.run_digests.contains_key("r00000"));
        // Then the oldest of those in order.
        for i in 0..ORDER_RUNS_FROM {
            d.record_run(&format!("z{i:05}"), "d");
        }
        assert_eq!(d.run_digests.len(), MAX_RUN_DIGESTS);
        assert!(!d.run_digests.keys().any(|k| k.starts_with('r')));
        assert!(!d.run_digests.contains_key("a00299") && d.run_digests.contains_key("a00300"));
        assert!(d.run_digests.contains_key("z00499"));
        assert_eq!(d.run_order.len(), MAX_RUN_DIGESTS);
        assert_eq!(d.run_order.last().map(String::as_str), Some("z00499"));
    }

    /// The current execution's applied answers are never dropped, however many there are.
    #[test]
    fn marks_are_bounded_but_the_current_executions_are_kept() {
        let mut d = doc();
        let mark = |e: &str, i: usize| AppliedDigest {
            execution_id: e.into(),
            interrupt_id: format!("i{i}"),
            digest: "d".into(),
        };
        for i in 0..MAX_EXECUTION_MARKS + 50 {
            // "exec-now" sorts after "e-…": the old ones come first in the set.
            d.applied_resume_digests.insert(mark("e-old", i));
            d.applied_resume_digests.insert(mark("exec-now", i));
            d.terminal_execution_ids.insert(format!("e-{i:05}"));
            d.expired_interrupts
                .insert(("exec-now".into(), format!("i{i}")));
        }
        d.terminal_execution_ids.insert("exec-now".into());
        d.prune();
        assert_eq!(d.applied_resume_digests.len(), MAX_EXECUTION_MARKS + 50);
        assert!((0..MAX_EXECUTION_MARKS + 50)
            .all(|i| d.applied_resume_digests.contains(&mark("exec-now", i))));
        assert_eq!(d.terminal_execution_ids.len(), MAX_EXECUTION_MARKS);
        assert!(d.is_terminal("exec-now"));
        assert_eq!(d.expired_interrupts.len(), MAX_EXECUTION_MARKS + 50);
        // Within the bounds, nothing changes.
        let mut small = doc();
        small.terminal_execution_ids.insert("e1".into());
        let before = small.clone();
        small.prune();
        assert_eq!(small, before);
    }

    /// `runOrder` must be a list; ids it names that the document does not record, or names
    /// twice, are dropped.
    #[test]
    fn run_order_is_read_as_a_hint() {
        let mut d = doc();
        d.record_run("a", "d");
        let mut v: serde_json::Value = serde_json::from_slice(&d.to_json()).unwrap();
        v["runOrder"] = serde_json::json!(["gone", "a", "a", ""]);
        let back = ThreadDoc::from_json(&serde_json::to_vec(&v).unwrap(), "t").unwrap();
        assert_eq!(back.run_order, ["a"]);
        v["runOrder"] = serde_json::json!({});
        match ThreadDoc::from_json(&serde_json::to_vec(&v).unwrap(), "t") {
            Err(StoreError::Invalid(what)) => assert_eq!(what, "runOrder"),
            other => panic!("{other:?}"),
        }
    }

    /// A document over the bound is refused as a save, not written.
    #[test]
    fn a_document_over_the_bound_is_not_stored() {
        let mut d = doc();
        assert!(d.to_stored().is_ok());
        d.cwd = "/".repeat(MAX_DOC_BYTES);
        assert!(matches!(d.to_stored(), Err(StoreError::Invalid(_))));
    }
}
