//! The journal's checkpoint: the documents held in memory and the transcripts' waiting lines
//! written to their files and made durable, then the older generations deleted; and, after a
//! failure, the journal's retirement (the same writing-out, then direct saves).

use std::collections::HashSet;
use std::fs;
use std::sync::{MutexGuard, Weak};
use std::time::Instant;

use super::super::fs::{make_durable, sync_dir};
use super::super::StoreError;
use super::record::generations;
use super::{Held, Journal, Mode, State, ROTATE_AGE, ROTATE_BYTES, TICK};

impl Journal {
    /// The documents held in memory, newest per thread.
    pub(super) fn snapshot(st: &State) -> Vec<(String, Held)> {
        st.held
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// Writes `snapshot` to the thread files and the waiting transcript lines to theirs, makes
    /// them durable, then deletes the journal generations older than `below` (all of them with
    /// `u64::MAX`). Every transcript line queued before is waiting or in its file by then.
    fn write_out_and_drop_generations(
        &self,
        snapshot: &[(String, Held)],
        below: u64,
    ) -> std::io::Result<()> {
        let mut files = HashSet::new();
        let mut failed = None;
        for (id, held) in snapshot {
            match (self.write_file)(id, &held.doc) {
                Ok(path) => {
                    files.insert(path);
                }
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        // Also when a document failed, so that the transcripts' waiting lines do not pile up.
        let (transcripts, all_written) = (self.write_transcripts)();
        // Those written are synced even when another failed: their lines wait nowhere else now.
        make_durable(&[(&self.threads, &files), (&self.transcripts, &transcripts)])?;
        if let Some(e) = failed {
            return Err(e);
        }
        all_written?;
        let mut removed = false;
        for (g, path) in generations(&self.dir)? {
            if g < below {
                fs::remove_file(path)?;
                removed = true;
            }
        }
        if removed {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    /// Drops from memory the documents written out, unless a newer save replaced them.
    fn forget(st: &mut State, snapshot: Vec<(String, Held)>) {
        for (id, written) in snapshot {
            if st.held.get(&id).is_some_and(|h| h.seq == written.seq) {
                st.held.remove(&id);
            }
        }
    }

    /// After a journal failure: once no batch is in flight, writes the documents held in memory
    /// to their files durably and deletes the journal; then saves are direct. On failure the
    /// journal stays broken and the caller's save fails.
    pub(super) fn retire<'a>(
        &'a self,
        mut st: MutexGuard<'a, State>,
    ) -> Result<MutexGuard<'a, State>, StoreError> {
        if st.busy.retiring || st.busy.checkpointing || st.busy.writing {
            return Ok(self.wait(st));
        }
        let msg = match &st.mode {
            Mode::Broken(m) => m.clone(),
            _ => return Ok(st),
        };
        st.busy.retiring = true;
        let snapshot = Self::snapshot(&st);
        drop(st);
        let result = self.write_out_and_drop_generations(&snapshot, u64::MAX);
        let mut st = self.lock();
        st.busy.retiring = false;
        self.cv.notify_all();
        match result {
            Ok(()) => {
                tracing::warn!("state journal retired; saves are now direct durable writes");
                st.mode = Mode::Direct;
                st.held.clear();
                Ok(st)
            }
            Err(e) => Err(StoreError::Io(std::io::Error::other(format!(
                "state journal failed ({msg}) and could not be retired: {e}"
            )))),
        }
    }

    /// Moves to a new generation, writes every document held in memory to its file, makes the
    /// files durable and deletes the older generations. Returns whether anything was done.
    pub(crate) fn checkpoint(&self) -> std::io::Result<bool> {
        let mut st = self.lock();
        while st.busy.checkpointing || st.busy.retiring {
            st = self.wait(st);
        }
        if st.mode != Mode::Journal {
            return Ok(false);
        }
        if st.held.is_empty()
            && st.generation.is_empty()
            && st.queue.saves.is_empty()
            && !st.transcripts
        {
            return Ok(false);
        }
        st.busy.checkpointing = true;
        // Rotate now when no batch is in flight, else let the next batch do it.
        st.generation.rotate_requested = true;
        let before = st.generation.number;
        while st.generation.number == before && st.generation.rotate_requested {
            if !st.busy.writing && st.queue.saves.is_empty() {
                st.generation.rotate();
                break;
            }
            st = self.wait(st);
        }
        // No batch of an older generation is in flight now, and each one's documents are held
        // (the writer records them before it lets go).
        let current = st.generation.number;
        let snapshot = Self::snapshot(&st);
        st.transcripts = false;
        drop(st);
        let result = self.write_out_and_drop_generations(&snapshot, current);
        let mut st = self.lock();
        st.busy.checkpointing = false;
        if result.is_ok() {
            Self::forget(&mut st, snapshot);
        } else {
            st.transcripts = true;
            // What is still held is due again after `ROTATE_AGE`, saves or not.
            st.generation.since.get_or_insert_with(Instant::now);
        }
        self.cv.notify_all();
        result.map(|()| true)
    }

    /// Whether the current generation is due for a checkpoint.
    pub(super) fn due(&self) -> bool {
        let st = self.lock();
        st.mode == Mode::Journal
            && (st.generation.bytes >= ROTATE_BYTES
                || st
                    .generation
                    .since
                    .is_some_and(|t| t.elapsed() >= ROTATE_AGE))
    }
}

pub(super) fn checkpoint_loop(weak: Weak<Journal>) {
    loop {
        std::thread::sleep(TICK);
        let Some(j) = weak.upgrade() else {
            return;
        };
        if j.due() {
            if let Err(e) = j.checkpoint() {
                tracing::warn!(error = %e, "state journal checkpoint failed; retrying");
            }
        }
    }
}
