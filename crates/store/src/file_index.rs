//! The file store's list of threads: a summary per thread in memory, kept by every save (owner,
//! activity, active run, pending interrupts) and every transcript append (title, creation), and
//! persisted as the last summary line of the thread's transcript file (`{"thread": {…}}`), so a
//! restarted gateway lists again every thread that ever ended a run. It reads those summaries
//! once, in the background from the start (a list that comes first waits for it); a thread saved
//! since the start is in memory already. Memory: one summary per thread and its place in two
//! ordered sets (a few hundred bytes), so a page of one user's threads walks that user's set,
//! not every thread.

use std::collections::HashSet;
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use super::list_order::Ordered;
use super::listing::{ListPage, ListQuery, ThreadPatch, ThreadSummary};
use super::transcript_file::summary::last_summary;
use super::{file_stem, ThreadDoc};

#[derive(Default)]
pub(super) struct Index {
    inner: Mutex<Inner>,
    scan: OnceLock<()>,
}

#[derive(Default)]
struct Inner {
    threads: Ordered,
    scanned: bool,
    /// Threads deleted while the disk was being read: what the read found of them is stale.
    gone: HashSet<String>,
}

impl Index {
    fn with<R>(&self, f: impl FnOnce(&mut Inner) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A save of `doc` at `now`.
    pub fn saved(&self, doc: &ThreadDoc, now: &str) {
        self.with(|i| {
            let id = &doc.thread_id;
            i.threads.upsert(
                id,
                || ThreadSummary::new(id, now),
                |s| {
                    s.owner = doc.owner_or_user().map(str::to_owned);
                    s.last_activity_at = now.to_owned();
                    s.active_run = doc.active_run.as_ref().map(|a| a.run_id.clone());
                    s.pending = doc.execution.pending.len();
                },
            );
        })
    }

    /// A run's messages appended at `now` to a transcript that ends with `on_disk`; the summary
    /// to write in the transcript. Before the disk is read (just after a restart), what the file
    /// says (creation, title, archived) is taken first, so that this write does not lose it.
    pub fn appended(
        &self,
        thread_id: &str,
        title: Option<String>,
        now: &str,
        on_disk: Option<&ThreadSummary>,
    ) -> ThreadSummary {
        self.with(|i| {
            if let Some(read) = on_disk.filter(|_| !i.scanned) {
                if !i.gone.contains(thread_id) {
                    merge(&mut i.threads, read.clone());
                }
            }
            i.threads.upsert(
                thread_id,
                || ThreadSummary::new(thread_id, now),
                |s| {
                    if s.title.is_none() {
                        s.title = title;
                    }
                    s.last_activity_at = now.to_owned();
                },
            )
        })
    }

    /// Whether the thread has a summary here (the disk read first, if it was not yet).
    pub fn knows(&self, transcripts: &Path, thread_id: &str) -> bool {
        self.scan_once(transcripts);
        self.with(|i| i.threads.contains(thread_id))
    }

    /// A patch applied; the summary after.
    pub fn patched(&self, thread_id: &str, patch: &ThreadPatch) -> Option<ThreadSummary> {
        self.with(|i| i.threads.update(thread_id, |s| patch.apply(s)))
    }

    pub fn removed(&self, thread_id: &str) {
        self.with(|i| {
            i.threads.remove(thread_id);
            if !i.scanned {
                i.gone.insert(thread_id.to_owned());
            }
        });
    }

    /// A page of the list, the transcripts' summaries read first if they were not yet.
    pub fn list(&self, transcripts: &Path, q: &ListQuery) -> ListPage {
        self.scan_once(transcripts);
        self.with(|i| i.threads.page(q))
    }

    /// Reads the transcripts' summaries, once: a second caller waits for the first.
    pub fn scan_once(&self, transcripts: &Path) {
        self.scan.get_or_init(|| {
            let found = scan(transcripts);
            self.with(|i| {
                for h in found {
                    if !i.gone.contains(&h.thread_id) {
                        merge(&mut i.threads, h);
                    }
                }
                i.scanned = true;
                i.gone = HashSet::new();
            });
        });
    }
}

/// A summary read from disk joins what this process learnt since it started: what it learnt of
/// the thread's activity stands; creation and title are the file's.
fn merge(threads: &mut Ordered, read: ThreadSummary) {
    let id = read.thread_id.clone();
    if threads.contains(&id) {
        threads.update(&id, |s| {
            s.created_at = read.created_at;
            if s.title.is_none() {
                s.title = read.title;
            }
            s.archived = read.archived;
            if s.owner.is_none() {
                s.owner = read.owner;
            }
        });
    } else {
        // No run of this process holds it: what was active then was lost with its process.
        let s = ThreadSummary {
            active_run: None,
            ..read
        };
        threads.upsert(&id, || s, |_| {});
    }
}

/// The summaries the transcripts end with; a file whose summary names another thread
/// (copied or renamed by hand) is skipped.
fn scan(dir: &Path) -> Vec<ThreadSummary> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".jsonl") else {
            continue;
        };
        match last_summary(&e.path()) {
            Some(h) if file_stem(&h.thread.thread_id).as_deref() == Some(stem) => {
                out.push(h.thread)
            }
            Some(_) => tracing::warn!(file = %name, "a transcript names another thread"),
            None => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::transcript_file::summary::Header;
    use super::*;

    fn q(user: Option<&str>) -> ListQuery {
        ListQuery {
            user: user.map(str::to_owned),
            archived: false,
            after: None,
            limit: 10,
        }
    }

    #[test]
    fn saves_and_appends_keep_the_summary_and_the_disk_fills_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let idx = Index::default();
        let exec = super::super::Execution::new("e1", "inv-1");
        let mut doc = ThreadDoc::new("t1", "ctx", "/w", None, exec);
        doc.owner = Some("alice".into());
        idx.saved(&doc, "2026-01-01T00:00:02.000Z");
        let s = idx.appended("t1", Some("Hello".into()), "2026-01-01T00:00:03.000Z", None);
        assert_eq!(s.owner.as_deref(), Some("alice"));
        assert_eq!(s.created_at, "2026-01-01T00:00:02.000Z");
        // A later title does not replace the first.
        let s = idx.appended("t1", Some("Later".into()), "2026-01-01T00:00:04.000Z", None);
        assert_eq!(s.title.as_deref(), Some("Hello"));
        // What a previous process wrote: an older thread of alice's, one of bob's, a file that
        // names another thread.
        for (file, id, owner, at) in [
            ("t0", "t0", "alice", "2025-12-31T00:00:00.000Z"),
            ("tb", "tb", "bob", "2026-01-02T00:00:00.000Z"),
            ("tx", "other", "alice", "2026-01-02T00:00:00.000Z"),
            ("t1", "t1", "alice", "2025-06-01T00:00:00.000Z"),
        ] {
            let mut s = ThreadSummary::new(id, at);
            s.owner = Some(owner.into());
            s.active_run = Some("lost".into());
            let header = format!("{}\n", serde_json::to_string(&Header::of(s)).unwrap());
            std::fs::write(dir.path().join(format!("{file}.jsonl")), header).unwrap();
        }
        let p = idx.list(dir.path(), &q(Some("alice")));
        let ids: Vec<&str> = p.threads.iter().map(|t| t.thread_id.as_str()).collect();
        assert_eq!(ids, ["t1", "t0"]);
        // Created as the file says; active as this process saw it; nothing lost is active.
        assert_eq!(p.threads[0].created_at, "2025-06-01T00:00:00.000Z");
        assert_eq!(p.threads[1].active_run, None);
        assert_eq!(idx.list(dir.path(), &q(None)).threads.len(), 3);
    }

    #[test]
    fn a_thread_deleted_before_the_disk_is_read_stays_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ThreadSummary::new("t1", "2026-01-01T00:00:00.000Z");
        s.owner = Some("alice".into());
        let line = serde_json::to_string(&Header::of(s)).unwrap();
        std::fs::write(dir.path().join("t1.jsonl"), format!("{line}\n")).unwrap();
        // Deleted while the read had not finished (its file was found before it went).
        let idx = Index::default();
        idx.removed("t1");
        idx.scan_once(dir.path());
        assert!(!idx.knows(dir.path(), "t1"));
        idx.with(|i| assert!(i.scanned && i.gone.is_empty()));
    }
}
