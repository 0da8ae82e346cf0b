//! The PostgreSQL store driven directly, for orders of events no request can time: a run's
//! transcript that arrives after its thread was deleted (a guidance run does not hold the
//! thread, so nothing stops it ending after a `DELETE`).

use std::time::Duration;

use serde_json::json;
use store::{History, PgStore, TranscriptAppend};
use testkit::postgres::Cluster;

fn add(run: &str) -> TranscriptAppend {
    TranscriptAppend {
        run_id: run.into(),
        at: "2026-12-04T00:00:00.000Z".into(),
        messages: vec![json!({"id": run, "role": "user", "content": run})],
        limit: 100,
    }
}

fn rows(pg: &Cluster, db: &str) -> String {
    pg.psql(
        db,
        "SELECT string_agg(run_id || ':' || seq, ',' ORDER BY seq) FROM agui_transcript",
    )
}

/// A late append after the thread's `DELETE` keeps nothing, so a new thread of the same id (any
/// user's) starts with an empty transcript, not the deleted one's last run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transcript_arriving_after_its_threads_delete_is_not_kept() {
    let pg = Cluster::start();
    let url = pg.create_db("late");
    let store = PgStore::open(&url, None, "http://127.0.0.1:1/", Duration::from_secs(15))
        .await
        .unwrap();
    let make = "INSERT INTO agui_threads (thread_id, doc) VALUES ('t', '{}')";
    pg.psql("late", make);
    store.append_transcript("t", add("r1")).await.unwrap();
    assert_eq!(rows(&pg, "late"), "r1:1");
    assert!(store.delete_thread("t").await.unwrap());
    assert_eq!(rows(&pg, "late"), "");

    store.append_transcript("t", add("late")).await.unwrap();
    assert_eq!(rows(&pg, "late"), "");
    let page = store.read_transcript("t", None, 10).await.unwrap();
    assert!(page.entries.is_empty());

    // The id made anew: its own runs only, numbered from 1.
    pg.psql("late", make);
    store.append_transcript("t", add("anew")).await.unwrap();
    assert_eq!(rows(&pg, "late"), "anew:1");
}

/// A start waits for another instance's migration longer than a request waits for a lock (the
/// connections' `lock_timeout` is 2 s, `statement_timeout` 2.5 s): instances may start together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_waits_for_another_instances_migration() {
    let pg = Cluster::start();
    let url = pg.create_db("together");
    let first = PgStore::open(&url, None, "http://127.0.0.1:1/", Duration::from_secs(15)).await;
    assert!(first.is_ok(), "the first start");
    // Another instance migrating: the migration lock held for 3.5 s.
    let (other, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    other
        .execute("SELECT pg_advisory_lock(7018707639713229159)", &[])
        .await
        .unwrap();
    let holder = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(3500)).await;
        drop(other);
    });
    let started = std::time::Instant::now();
    let second = PgStore::open(&url, None, "http://127.0.0.1:2/", Duration::from_secs(15)).await;
    assert!(second.is_ok(), "{:?}", second.err());
    assert!(
        started.elapsed() >= Duration::from_millis(2500),
        "the lock was not waited for: {:?}",
        started.elapsed()
    );
    holder.await.unwrap();
}
