//! PostgreSQL over TLS (a cluster with `ssl=on` and a CA made by the test): `sslmode` as libpq
//! reads it. `verify-full` checks the chain and the host name, `verify-ca` the chain, `require`
//! encrypts; a wrong CA, a wrong name and a server without TLS are refused with clear messages;
//! `disable` (and no `sslmode`) still connect in plain.

use std::time::Duration;

use iac_code_agui::store::PgStore;
use testkit::postgres::Cluster;
use testkit::tls::Ca;

async fn open(url: &str, ca: Option<&std::path::Path>) -> Result<PgStore, String> {
    PgStore::open(url, ca, "http://127.0.0.1:1/", Duration::from_secs(15)).await
}

/// Connections of the gateway's pool that are encrypted.
fn encrypted(pg: &Cluster, db: &str) -> i64 {
    pg.psql(
        db,
        "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE s.ssl AND a.application_name = 'iac-code-agui'",
    )
    .parse()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_verifies_what_it_says_and_refuses_clearly() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let other_ca = dir.path().join("other-ca.pem");
    std::fs::write(&other_ca, Ca::new().pem()).unwrap();

    let (cert, key) = ca.issue(&["localhost", "127.0.0.1"]);
    let pg = Cluster::start_tls(&cert, &key);
    let url = pg.create_db("tls");
    let full = open(&format!("{url}?sslmode=verify-full"), Some(&ca_file))
        .await
        .unwrap();
    assert!(encrypted(&pg, "tls") >= 1);
    drop(full);
    for mode in ["verify-ca", "require"] {
        let ca = (mode == "verify-ca").then_some(ca_file.as_path());
        open(&format!("{url}?sslmode={mode}"), ca).await.unwrap();
    }
    // Another CA: refused, saying why.
    let e = open(&format!("{url}?sslmode=verify-ca"), Some(&other_ca))
        .await
        .err()
        .unwrap();
    assert!(e.contains("certificate is not trusted"), "{e}");
    // Plain still works against a server that offers TLS.
    open(&format!("{url}?sslmode=disable"), None).await.unwrap();

    // A certificate for another name: verify-full refuses it, verify-ca takes it.
    let (cert, key) = ca.issue(&["db.example"]);
    let named = Cluster::start_tls(&cert, &key);
    let url = named.create_db("named");
    let e = open(&format!("{url}?sslmode=verify-full"), Some(&ca_file))
        .await
        .err()
        .unwrap();
    assert!(e.contains("certificate is not trusted"), "{e}");
    open(&format!("{url}?sslmode=verify-ca"), Some(&ca_file))
        .await
        .unwrap();

    // A server without TLS: refused when the mode asks for it; plain as before without one.
    let plain = Cluster::start();
    let url = plain.create_db("plain");
    let e = open(&format!("{url}?sslmode=require"), None)
        .await
        .err()
        .unwrap();
    assert!(e.contains("does not offer TLS"), "{e}");
    open(&url, None).await.unwrap();
    let e = open(&format!("{url}?sslmode=sometimes"), None)
        .await
        .err()
        .unwrap();
    assert!(e.contains("sslmode"), "{e}");
}
