//! PostgreSQL over TLS (a cluster with `ssl=on` and a CA made by the test): `sslmode` as libpq
//! reads it. `verify-full` checks the chain and the host name, `verify-ca` the chain, `require`
//! encrypts; a wrong CA, a wrong name and a server without TLS are refused with clear messages;
//! `disable` (and no `sslmode`) still connect in plain.

use std::time::Duration;

use store::PgStore;
use testkit::postgres::Cluster;
use testkit::tls::Ca;

async fn open(url: &str, ca: Option<&std::path::Path>) -> Result<PgStore, String> {
    PgStore::open(url, ca, "http://127.0.0.1:1/", Duration::from_secs(15)).await
}

/// A new CA, and its certificate written to `ca.pem` in a new directory: (CA, directory, file).
fn ca_in_dir() -> (Ca, tempfile::TempDir, std::path::PathBuf) {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    (ca, dir, ca_file)
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
    let (ca, dir, ca_file) = ca_in_dir();
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

/// What the user runs: the binary started with `sslmode=verify-full` by its flag, `verify-ca` by
/// its variable and `verify-full` by YAML, each serving a turn over an encrypted connection; and
/// `verify-ca` without a CA refused at start, saying what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_opens_verified_tls_from_its_flag_variable_and_yaml() {
    use crate::cluster::{turn, Instance, Workspace};
    use testkit::fake_kernel::FakeKernel;
    use testkit::sse::{assert_valid_run, post};

    let (ca, dir, ca_file) = ca_in_dir();
    let (cert, key) = ca.issue(&["localhost", "127.0.0.1"]);
    let pg = Cluster::start_tls(&cert, &key);
    let url = pg.create_db("bin");
    let kernel = FakeKernel::start().await;
    let ws = Workspace::new();
    let ca_path = ca_file.display().to_string();

    let full = format!("{url}?sslmode=verify-full");
    let verify_ca = format!("{url}?sslmode=verify-ca");
    let yaml = dir.path().join("agui.yaml");
    std::fs::write(
        &yaml,
        format!("state_url: \"{full}\"\nstate_ca_file: \"{ca_path}\"\n"),
    )
    .unwrap();
    // The instance's own --state-url is replaced by each way of giving it.
    type Way = (&'static str, Vec<String>, Vec<(String, String)>);
    let ways: [Way; 3] = [
        (
            "flag",
            vec!["--state-ca-file".into(), ca_path.clone()],
            vec![],
        ),
        (
            "variable",
            vec![],
            vec![
                ("IAC_CODE_AGUI_STATE_URL".into(), verify_ca.clone()),
                ("IAC_CODE_AGUI_STATE_CA_FILE".into(), ca_path.clone()),
            ],
        ),
        (
            "yaml",
            vec!["--config".into(), yaml.display().to_string()],
            vec![],
        ),
    ];
    for (i, (way, args, env)) in ways.into_iter().enumerate() {
        let mut args = args;
        args.extend(["--a2a-url".into(), kernel.url()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut env = env;
        env.extend(ws.env());
        // "": no --state-url, the variable or the file names the database.
        let state_url = if way == "flag" { full.as_str() } else { "" };
        let gw = Instance::start(state_url, &args, &env);
        let thread = format!("tls-{way}");
        turn(&kernel, &thread, &format!("task-{i}"), "over TLS", vec![]);
        let r = post(
            &gw.url(),
            &crate::support::body(&thread, "r1", "hi", &ws.cwd(way), serde_json::json!({})),
            &[],
        )
        .await;
        assert_valid_run(&r, &thread, "r1");
        assert!(r.raw.contains("over TLS"), "{way}: {}", gw.log());
        assert!(encrypted(&pg, "bin") >= 1, "{way}: no encrypted connection");
        // The thread is in the database, its ended execution's task kept as the last (what the
        // kernel's session handoff reads, in PostgreSQL as in files).
        let sql = format!(
            "SELECT doc::json->'execution'->>'lastTaskId' FROM agui_threads \
             WHERE thread_id = '{thread}'"
        );
        assert_eq!(pg.psql("bin", &sql), format!("task-{i}"), "{way}");
    }

    // verify-ca without its CA: status 1 and the reason, before anything is opened.
    let out = std::process::Command::new(crate::support::bin())
        .args(["--state-url", &verify_ca, "--a2a-url", &kernel.url()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sslmode=verify-ca needs --state-ca-file"),
        "{err}"
    );
}
