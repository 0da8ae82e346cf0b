//! The PostgreSQL store's transcripts: `agui_transcript`, one row an entry, keyed by thread and
//! `seq` (migration 3). An append is one transaction, serialised per thread by an advisory lock:
//! the newest `seq` read, the run's entries inserted after it, the oldest beyond the limit
//! deleted. A thread deleted meanwhile gets none: a run that outlives its thread's `DELETE` (a
//! guidance run does not hold the thread) must not leave rows that a new thread of the same id
//! would show.

use super::{bounded, unavailable, PgStore};
use crate::transcript::{self, Entry, Page};
use crate::{StoreError, TranscriptAppend};

const LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext('agui_transcript:' || $1))";
/// The thread's row, kept from a concurrent `DELETE` until the append commits (the delete then
/// removes what it appended).
const EXISTS: &str = "SELECT 1 FROM agui_threads WHERE thread_id = $1 FOR KEY SHARE";
const LAST: &str = "SELECT COALESCE(max(seq), 0) FROM agui_transcript WHERE thread_id = $1";
const INSERT: &str = "INSERT INTO agui_transcript (thread_id, seq, run_id, at, message)
    SELECT $1, s, $2, $3, m FROM unnest($4::bigint[], $5::text[]) AS x(s, m)";
const TRIM: &str = "DELETE FROM agui_transcript WHERE thread_id = $1 AND seq <= $2";
const PAGE: &str = "SELECT seq, run_id, at, message FROM agui_transcript
    WHERE thread_id = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3";

impl PgStore {
    pub(super) async fn append_transcript_now(
        &self,
        thread_id: String,
        add: TranscriptAppend,
    ) -> Result<(), StoreError> {
        if add.messages.is_empty() {
            return Ok(());
        }
        bounded("transcript", async move {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(unavailable)?;
            // Prepared once a connection: each statement is then one round trip, not two.
            let st = |sql| tx.prepare_cached(sql);
            let lock = st(LOCK).await.map_err(unavailable)?;
            tx.execute(&lock, &[&thread_id])
                .await
                .map_err(unavailable)?;
            let exists = st(EXISTS).await.map_err(unavailable)?;
            let exists = tx.query_opt(&exists, &[&thread_id]).await;
            if exists.map_err(unavailable)?.is_none() {
                tracing::info!(thread_id, "a transcript not kept: its thread was deleted");
                return tx.commit().await.map_err(unavailable);
            }
            let last = st(LAST).await.map_err(unavailable)?;
            let last: i64 = tx
                .query_one(&last, &[&thread_id])
                .await
                .map_err(unavailable)?
                .get(0);
            if let Some(title) = crate::listing::title_of(&add.messages) {
                let set = st(super::listing::TITLE).await.map_err(unavailable)?;
                tx.execute(&set, &[&thread_id, &title])
                    .await
                    .map_err(unavailable)?;
            }
            let entries = transcript::number(last as u64, &add.run_id, &add.at, add.messages);
            let seqs: Vec<i64> = entries.iter().map(|e| e.seq as i64).collect();
            let messages: Vec<String> = entries.iter().map(|e| e.message.to_string()).collect();
            let insert = st(INSERT).await.map_err(unavailable)?;
            tx.execute(
                &insert,
                &[&thread_id, &add.run_id, &add.at, &seqs, &messages],
            )
            .await
            .map_err(unavailable)?;
            let newest = last + seqs.len() as i64;
            let oldest_kept = newest - add.limit as i64;
            if oldest_kept > 0 {
                let trim = st(TRIM).await.map_err(unavailable)?;
                tx.execute(&trim, &[&thread_id, &oldest_kept])
                    .await
                    .map_err(unavailable)?;
            }
            tx.commit().await.map_err(unavailable)
        })
        .await
    }

    pub(super) async fn read_transcript_now(
        &self,
        thread_id: String,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Page, StoreError> {
        bounded("transcript", async move {
            let c = self.client().await?;
            let before = before.map_or(i64::MAX, |b| b.min(i64::MAX as u64) as i64);
            let page = c.prepare_cached(PAGE).await.map_err(unavailable)?;
            let rows = c
                .query(&page, &[&thread_id, &before, &(limit as i64 + 1)])
                .await
                .map_err(unavailable)?;
            let mut entries = Vec::with_capacity(rows.len());
            for r in rows.iter().rev() {
                let message: String = r.get(3);
                let message = serde_json::from_str(&message)
                    .map_err(|e| StoreError::Invalid(format!("transcript: {e}")))?;
                entries.push(Entry {
                    seq: r.get::<_, i64>(0) as u64,
                    run_id: r.get(1),
                    at: r.get(2),
                    message,
                });
            }
            Ok(transcript::page_of(entries.into_iter(), None, limit))
        })
        .await
    }
}
