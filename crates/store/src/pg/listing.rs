//! The PostgreSQL store's list of threads: the thread rows themselves (every row with a
//! document; its `owner_user`, `active_run`, `pending` and `updated_at`, the time of its last
//! save or admission), with the title, creation time and archived flag of migration 4. Ordered
//! by `updated_at` then thread id (bytewise), on an index per user; a page continues after the
//! exact microsecond of its last row.

use super::{bounded, unavailable, PgStore};
use crate::listing::{self, ListPage, ListQuery, ThreadPatch, ThreadSummary};
use crate::StoreError;

const COLUMNS: &str = "thread_id, owner_user, title,
    to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),
    to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
    archived, active_run, pending";

/// `$1` archived, `$2` the limit, `$3` the user (`by_user`), then the cursor's time and thread
/// id (`after`). A statement per shape rather than one with optional parameters: it is prepared
/// once, and a generic plan could not make an index condition of a cursor that may be null.
fn statement(by_user: bool, after: bool) -> String {
    let (user, cursor) = match (by_user, after) {
        (true, true) => ("AND owner_user = $3", "$4::text::timestamptz, $5"),
        (false, true) => ("", "$3::text::timestamptz, $4"),
        (_, false) => (if by_user { "AND owner_user = $3" } else { "" }, ""),
    };
    let cursor = match cursor {
        "" => String::new(),
        c => format!("AND (updated_at, thread_id COLLATE \"C\") < ({c})"),
    };
    format!(
        "SELECT {COLUMNS} FROM agui_threads
        WHERE doc IS NOT NULL AND archived = $1 {user} {cursor}
        ORDER BY updated_at DESC, thread_id COLLATE \"C\" DESC LIMIT $2"
    )
}

/// A patch: `$2` the title or null (kept), `$3` archived or null (kept).
fn update() -> String {
    format!(
        "UPDATE agui_threads SET title = COALESCE($2, title), archived = COALESCE($3, archived)
        WHERE thread_id = $1 AND doc IS NOT NULL RETURNING {COLUMNS}"
    )
}

/// A deletion: only of a row no run and no kernel task holds open.
const DELETE_ROW: &str = "DELETE FROM agui_threads
    WHERE thread_id = $1 AND active_run IS NULL AND pending = 0";
const DELETE_TRANSCRIPT: &str = "DELETE FROM agui_transcript WHERE thread_id = $1";
/// The deleted thread's tombstone: one more deletion of its id.
const TOMBSTONE: &str = "INSERT INTO agui_deleted AS d (thread_id, deletions) VALUES ($1, 1)
    ON CONFLICT (thread_id) DO UPDATE SET deletions = d.deletions + 1";

/// The title of a thread, set by the first run whose messages have one.
pub(super) const TITLE: &str =
    "UPDATE agui_threads SET title = $2 WHERE thread_id = $1 AND title IS NULL";

fn summary(r: &tokio_postgres::Row) -> ThreadSummary {
    ThreadSummary {
        thread_id: r.get(0),
        owner: r.get(1),
        title: r.get(2),
        created_at: r.get(3),
        last_activity_at: r.get(4),
        order_key: Some(r.get(5)),
        archived: r.get(6),
        active_run: r.get(7),
        pending: r.get::<_, i32>(8).max(0) as usize,
    }
}

impl PgStore {
    pub(super) async fn update_thread_now(
        &self,
        thread_id: String,
        patch: ThreadPatch,
    ) -> Result<Option<ThreadSummary>, StoreError> {
        bounded("update", async move {
            let c = self.client().await?;
            let row = c
                .query_opt(&update(), &[&thread_id, &patch.title, &patch.archived])
                .await
                .map_err(unavailable)?;
            Ok(row.as_ref().map(summary))
        })
        .await
    }

    /// The row and its transcript in one transaction, with the id's tombstone; this instance forgets the thread's epoch.
    pub(super) async fn delete_thread_now(&self, thread_id: String) -> Result<bool, StoreError> {
        let deleted = bounded("delete", async {
            let mut c = self.client().await?;
            let tx = c.transaction().await.map_err(unavailable)?;
            let n = tx
                .execute(DELETE_ROW, &[&thread_id])
                .await
                .map_err(unavailable)?;
            if n > 0 {
                tx.execute(DELETE_TRANSCRIPT, &[&thread_id])
                    .await
                    .map_err(unavailable)?;
                tx.execute(TOMBSTONE, &[&thread_id])
                    .await
                    .map_err(unavailable)?;
            }
            tx.commit().await.map_err(unavailable)?;
            Ok(n > 0)
        })
        .await?;
        self.epochs().remove(&thread_id);
        Ok(deleted)
    }

    pub(super) async fn list_threads_now(&self, q: ListQuery) -> Result<ListPage, StoreError> {
        bounded("list", async move {
            let c = self.client().await?;
            let limit = q.limit as i64 + 1;
            let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                vec![&q.archived, &limit];
            if let Some(u) = &q.user {
                params.push(u);
            }
            if let Some(c) = &q.after {
                params.push(&c.at);
                params.push(&c.thread_id);
            }
            // Prepared once a connection: a page is one round trip, its plan made once.
            let st = c
                .prepare_cached(&statement(q.user.is_some(), q.after.is_some()))
                .await
                .map_err(unavailable)?;
            let rows = c.query(&st, &params).await.map_err(unavailable)?;
            let mut threads: Vec<ThreadSummary> = rows.iter().map(summary).collect();
            let more = threads.len() > q.limit;
            threads.truncate(q.limit);
            Ok(listing::ListPage { threads, more })
        })
        .await
    }
}
