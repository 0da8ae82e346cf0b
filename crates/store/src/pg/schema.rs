//! The PostgreSQL schema and its versioned migrations, applied at start-up.
//!
//! Each migration runs once, in order, inside one transaction that holds an advisory lock, so
//! that instances starting together do not race; `agui_schema_migrations` records what ran. A
//! database migrated by a newer gateway (a version this one does not know) is refused: this one
//! might misread it.

/// Taken for the migration transaction (any constant of our own).
const MIGRATION_LOCK: i64 = 0x6167_7569_5f6d_6967; // "agui_mig"
/// A start waits at most this long for another instance's migration, and a migration's
/// statement runs at most this long.
const MIGRATION_LIMITS: &str =
    "SET LOCAL lock_timeout = '10min'; SET LOCAL statement_timeout = '1h'";

/// `(version, SQL)`, in order. Never edit one that has shipped: add the next.
pub const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        "CREATE TABLE agui_instances (
        id text PRIMARY KEY,
        advertise_url text NOT NULL,
        started_at timestamptz NOT NULL DEFAULT now(),
        heartbeat_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE TABLE agui_threads (
        thread_id text PRIMARY KEY,
        -- The thread document, byte for byte what the file store writes (schemaVersion 1).
        doc text,
        -- The instance that holds the thread, and the fencing epoch of its hold: every write
        -- is conditional on both.
        owner text,
        epoch bigint NOT NULL DEFAULT 0,
        active_run text,
        pending integer NOT NULL DEFAULT 0,
        updated_at timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX agui_threads_owner ON agui_threads (owner);",
    ),
    (
        2,
        // The user a thread belongs to (`ThreadDoc::owner_or_user`), kept beside the document
        // with every write, so that a user's threads are found by the index. Rows written before
        // get it from their document; one whose document is not JSON keeps it empty.
        "ALTER TABLE agui_threads ADD COLUMN owner_user text;
    DO $$
    DECLARE r record;
    BEGIN
        FOR r IN SELECT thread_id, doc FROM agui_threads WHERE doc IS NOT NULL LOOP
            BEGIN
                UPDATE agui_threads
                SET owner_user = COALESCE(r.doc::jsonb->>'owner', r.doc::jsonb->>'userId')
                WHERE thread_id = r.thread_id;
            EXCEPTION WHEN others THEN NULL;
            END;
        END LOOP;
    END $$;
    CREATE INDEX agui_threads_owner_user ON agui_threads (owner_user, thread_id);
    -- The cluster's forward key (one row): what makes a request forwarded between instances
    -- count as forwarded, with the caller the forwarding instance authenticated.
    CREATE TABLE agui_cluster (
        id integer PRIMARY KEY CHECK (id = 1),
        forward_key text NOT NULL
    );",
    ),
    (
        3,
        // A thread's transcript (`transcript`): one row a message, numbered per thread.
        "CREATE TABLE agui_transcript (
        thread_id text NOT NULL,
        seq bigint NOT NULL,
        run_id text NOT NULL,
        at text NOT NULL,
        -- The AG-UI message, compact JSON.
        message text NOT NULL,
        PRIMARY KEY (thread_id, seq)
    );",
    ),
    (
        4,
        // The list of threads: a title (from the first run's user message), when the thread
        // was made (rows older than this migration: when it ran) and whether it is archived.
        "ALTER TABLE agui_threads
        ADD COLUMN title text,
        ADD COLUMN created_at timestamptz NOT NULL DEFAULT now(),
        ADD COLUMN archived boolean NOT NULL DEFAULT false;
    CREATE INDEX agui_threads_listed ON agui_threads
        (owner_user, archived, updated_at DESC, thread_id COLLATE \"C\" DESC);
    CREATE INDEX agui_threads_listed_all ON agui_threads
        (archived, updated_at DESC, thread_id COLLATE \"C\" DESC);",
    ),
    (
        5,
        // Tombstones: how many threads of an id were deleted. A thread made again under the id
        // is that incarnation of it and gets a kernel context of its own. A row per deleted id,
        // kept for good (one that went would give the id's next thread the first's context).
        "CREATE TABLE agui_deleted (
        thread_id text PRIMARY KEY,
        deletions bigint NOT NULL
    );",
    ),
];

/// The cluster's forward key: made by the first instance (256 random bits), read by the others.
pub async fn forward_key(client: &deadpool_postgres::Client) -> Result<String, String> {
    let fresh: String = rand::random::<[u8; 32]>()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    client
        .execute(
            "INSERT INTO agui_cluster (id, forward_key) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
            &[&fresh],
        )
        .await
        .map_err(|e| format!("the cluster's forward key: {e}"))?;
    let row = client
        .query_one("SELECT forward_key FROM agui_cluster WHERE id = 1", &[])
        .await
        .map_err(|e| format!("the cluster's forward key: {e}"))?;
    Ok(row.get(0))
}

/// Applies the migrations this database has not had yet.
pub async fn migrate(client: &mut deadpool_postgres::Client) -> Result<(), String> {
    let tx = client
        .transaction()
        .await
        .map_err(|e| format!("migration: {e}"))?;
    // The connections' limits (`SERVER_LIMITS`) are for requests, not for this: a migration over
    // a large table, or another instance's that this one waits for, takes longer. Bounded still.
    tx.batch_execute(MIGRATION_LIMITS)
        .await
        .map_err(|e| format!("migration: {e}"))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await
        .map_err(|e| format!("migration lock: {e}"))?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS agui_schema_migrations (
            version integer PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT now()
        )",
    )
    .await
    .map_err(|e| format!("migration table: {e}"))?;
    let row = tx
        .query_one(
            "SELECT COALESCE(max(version), 0) FROM agui_schema_migrations",
            &[],
        )
        .await
        .map_err(|e| format!("migration version: {e}"))?;
    let current: i32 = row.get(0);
    let latest = MIGRATIONS.last().map_or(0, |m| m.0);
    if current > latest {
        return Err(format!(
            "the state database has schema version {current}, newer than this gateway knows ({latest})"
        ));
    }
    for (version, sql) in MIGRATIONS.iter().filter(|m| m.0 > current) {
        tx.batch_execute(sql)
            .await
            .map_err(|e| format!("migration {version}: {e}"))?;
        tx.execute(
            "INSERT INTO agui_schema_migrations (version) VALUES ($1)",
            &[version],
        )
        .await
        .map_err(|e| format!("migration {version}: {e}"))?;
    }
    tx.commit().await.map_err(|e| format!("migration: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_from_one_without_gaps() {
        for (i, (v, sql)) in MIGRATIONS.iter().enumerate() {
            assert_eq!(*v as usize, i + 1);
            assert!(!sql.trim().is_empty());
        }
    }
}
