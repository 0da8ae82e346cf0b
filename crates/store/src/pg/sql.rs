//! The statements of the PostgreSQL store (constants with bind parameters, never formatted).

/// The row of a thread as an admission or a claim reads it, locked (made when missing: the
/// conflict clause then locks the existing row, and returns its newest version). The document
/// only within the bound `$2`, and its length.
pub(super) const LOCK_ROW: &str = "INSERT INTO agui_threads AS t (thread_id) VALUES ($1)
    ON CONFLICT (thread_id) DO UPDATE SET thread_id = t.thread_id
    RETURNING CASE WHEN octet_length(t.doc) <= $2 THEN t.doc END, t.owner, t.epoch,
        octet_length(t.doc)";

/// Whether an instance is alive, and where it is. A statement of its own, after the row's lock
/// was taken: its snapshot sees a heartbeat renewed while the lock was waited for, and the clock
/// is the statement's, not the transaction's.
pub(super) const LIVENESS: &str = "SELECT advertise_url,
           heartbeat_at > clock_timestamp() - make_interval(secs => $2)
    FROM agui_instances WHERE id = $1";

/// The holder of a thread, unlocked.
pub(super) const HOLDER: &str = "SELECT t.owner, i.advertise_url,
           COALESCE(i.heartbeat_at > clock_timestamp() - make_interval(secs => $2), false)
    FROM agui_threads t LEFT JOIN agui_instances i ON i.id = t.owner
    WHERE t.thread_id = $1";

/// A save: only by the holder, at its epoch.
pub(super) const SAVE: &str = "UPDATE agui_threads
    SET doc = $3, active_run = $4, pending = $5, owner_user = $7, updated_at = now()
    WHERE thread_id = $1 AND owner = $2 AND epoch = $6";

/// An admission's or a takeover's write: the holder becomes this instance, at a new epoch.
pub(super) const HOLD: &str = "UPDATE agui_threads
    SET doc = $3, active_run = $4, pending = $5, owner = $2, epoch = epoch + 1,
        owner_user = COALESCE($6, owner_user), updated_at = now()
    WHERE thread_id = $1
    RETURNING epoch";

/// A renewal (never after a clean stop gave the instance up: a renewal in flight then loses).
pub(super) const HEARTBEAT: &str = "INSERT INTO agui_instances (id, advertise_url) VALUES ($1, $2)
    ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), advertise_url = EXCLUDED.advertise_url
    WHERE agui_instances.heartbeat_at > '-infinity'";

/// A clean stop: the heartbeat as old as can be, so that the threads are taken over at once.
pub(super) const GONE: &str = "UPDATE agui_instances SET heartbeat_at = '-infinity' WHERE id = $1";

/// Rows of instances dead for a week that hold no thread any more.
pub(super) const FORGET_INSTANCES: &str = "DELETE FROM agui_instances i
    WHERE i.heartbeat_at < now() - interval '7 days'
      AND NOT EXISTS (SELECT 1 FROM agui_threads t WHERE t.owner = i.id)";

/// How many threads of an id were deleted (its tombstone; no row: none).
pub(super) const DELETIONS: &str = "SELECT deletions FROM agui_deleted WHERE thread_id = $1";
