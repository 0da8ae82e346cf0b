//! Instances trust each other by the cluster secret, not the database: a forward goes only to a
//! peer that proves it knows the secret (an `advertise_url` rewritten in the database receives a
//! question and nothing else: no token, no body); instances with another secret refuse each other;
//! without a secret, a request carrying the user's credentials is not forwarded at all.

use std::sync::{Arc, Mutex};

use serde_json::json;
use testkit::fake_kernel::FakeKernel;
use testkit::postgres::Cluster;
use testkit::sse::{assert_valid_run, post};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::cluster::{id_of, row, turn, Instance, Workspace};
use crate::support::{body, client, get_as, post_turn, post_turn_as};

const SECRET: &str = "0123456789abcdef0123456789abcdef-test";

/// A listener that keeps every byte it is sent and answers 404.
async fn sink() -> (String, Arc<Mutex<Vec<u8>>>) {
    relay(None).await
}

/// [`sink`], which, given `to`, passes a `GET` on to `to` and answers what it answers (a relay
/// of another instance's proof).
async fn relay(to: Option<String>) -> (String, Arc<Mutex<Vec<u8>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let got = Arc::new(Mutex::new(Vec::new()));
    let g = got.clone();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            let (g, to) = (g.clone(), to.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
                while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, tcp.read(&mut buf)).await {
                    if n == 0 {
                        break;
                    }
                    g.lock().unwrap().extend_from_slice(&buf[..n]);
                    if !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        continue;
                    }
                    let head = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                    let answer = match &to {
                        Some(base) if head.starts_with("GET ") => {
                            let url = format!("{}{}", base.trim_end_matches('/'), path);
                            let r = reqwest::get(url).await.unwrap();
                            let (status, text) = (r.status().as_u16(), r.text().await.unwrap());
                            format!(
                                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                                 content-length: {}\r\n\r\n{text}",
                                text.len()
                            )
                        }
                        _ => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_owned(),
                    };
                    let _ = tcp.write_all(answer.as_bytes()).await;
                }
            });
        }
    });
    (url, got)
}

fn start(db: &str, k: &FakeKernel, ws: &Workspace, secret: Option<&str>) -> Instance {
    let mut env = ws.env();
    if let Some(s) = secret {
        env.push(("IAC_CODE_AGUI_CLUSTER_SECRET".into(), s.into()));
    }
    Instance::start(db, &["--a2a-url", &k.url(), "--lease-ttl", "60"], &env)
}

/// Sends to the holder `a` (its id `a_id`) forwards signed with the cluster secret as another
/// instance would: the first counts, the same one again does not (401); one whose body is not
/// the body it signed does not either.
async fn signed_forwards_count_once_and_only_with_their_body(a: &Instance, a_id: &str) {
    use axum::http::Method;
    use iac_code_agui::auth::Caller;
    use iac_code_agui::forward::{signed_mark, At, FORWARDED};
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let at = At {
        from: "instance-x",
        to: a_id,
        time: now,
    };
    let client = client();
    let send = |method: Method, path: &str, signed_body: &[u8], body: &[u8]| {
        let mut rb = client
            .request(
                method.clone(),
                format!("{}{}", a.url(), path.trim_start_matches('/')),
            )
            .header(FORWARDED, "instance-x")
            .header("content-type", "application/json")
            .body(body.to_vec());
        for (k, v) in signed_mark(
            SECRET.as_bytes(),
            &method,
            path,
            signed_body,
            at,
            &Caller::OPEN,
        ) {
            rb = rb.header(k, v);
        }
        rb.send()
    };
    let first = send(Method::GET, "/threads/t1", b"", b"").await.unwrap();
    assert_eq!(first.status(), 200);
    let again = send(Method::GET, "/threads/t1", b"", b"").await.unwrap();
    assert_eq!(again.status(), 401, "a signed forward counted twice");
    let cancel = json!({"threadId": "t1", "rosInvocationId": "inv-1"}).to_string();
    let path = "/extensions/iac-code/v1/executions/e-1/cancel";
    let swapped = send(Method::POST, path, b"{}", cancel.as_bytes())
        .await
        .unwrap();
    assert_eq!(
        swapped.status(),
        401,
        "a body the signature does not name was taken"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forward_goes_only_to_a_peer_that_proves_the_secret() {
    let pg = Cluster::start();
    let db = pg.create_db("trust");
    let ws = Workspace::new();
    let (ka, kb) = (FakeKernel::start().await, FakeKernel::start().await);
    let (a, b) = (
        start(&db, &ka, &ws, Some(SECRET)),
        start(&db, &kb, &ws, Some(SECRET)),
    );
    turn(&ka, "t1", "task-1", "from A", vec![]);
    let r = post_turn(&a.url(), "t1", "r1", "hi", &ws.cwd("t1")).await;
    assert_valid_run(&r, "t1", "r1");
    // Signed forwards work: B relays A's answers, and a second turn with a key reaches A.
    assert_eq!(get_as(&format!("{}threads/t1", b.url()), &[]).await.0, 200);
    turn(&ka, "t1", "task-1", "again", vec![]);
    let props = json!({"llmApiKey": "sk-user-secret"});
    let r2 = post(
        &b.url(),
        &body("t1", "r2", "hi", &ws.cwd("t1"), props.clone()),
        &[],
    )
    .await;
    assert_valid_run(&r2, "t1", "r2");
    assert_eq!(ka.calls("SendStreamingMessage").len(), 2);

    // A signed forward counts once, and only with the body it names.
    let a_id = id_of(&pg, "trust", &a);
    signed_forwards_count_once_and_only_with_their_body(&a, &a_id).await;

    // A's advertised URL rewritten in the database: the sink gets a question, no token, no body.
    let (sink_url, got) = sink().await;
    pg.psql(
        "trust",
        &format!("UPDATE agui_instances SET advertise_url = '{sink_url}' WHERE id = '{a_id}'"),
    );
    let r3 = post(
        &b.url(),
        &body("t1", "r3", "hi", &ws.cwd("t1"), props),
        &[("authorization", "Bearer client-token")],
    )
    .await;
    assert_eq!(r3.status, 503, "{:?}", r3.json);
    assert_eq!(r3.error_code(), Some("STATE_UNAVAILABLE"));
    let seen = String::from_utf8_lossy(&got.lock().unwrap()).into_owned();
    assert!(seen.starts_with("GET /cluster/v1/hello?nonce="), "{seen}");
    for leaked in [
        "sk-user-secret",
        "client-token",
        "POST",
        "x-iac-code-agui-caller",
    ] {
        assert!(!seen.contains(leaked), "the sink received {leaked}: {seen}");
    }
    assert_eq!(ka.calls("SendStreamingMessage").len(), 2);

    // A relay that passes the question on to the real instance A and its proof back: the proof
    // names A's own URL, not the relay's, so it proves nothing and nothing else is sent.
    let (relay_url, got) = relay(Some(a.url())).await;
    pg.psql(
        "trust",
        &format!("UPDATE agui_instances SET advertise_url = '{relay_url}' WHERE id = '{a_id}'"),
    );
    let props = json!({"llmApiKey": "sk-user-secret"});
    let r4 = post(&b.url(), &body("t1", "r4", "hi", &ws.cwd("t1"), props), &[]).await;
    assert_eq!(r4.status, 503, "{:?}", r4.json);
    let seen = String::from_utf8_lossy(&got.lock().unwrap()).into_owned();
    assert!(seen.starts_with("GET /cluster/v1/hello?nonce="), "{seen}");
    assert!(
        !seen.contains("sk-user-secret") && !seen.contains("POST"),
        "{seen}"
    );
    assert_eq!(ka.calls("SendStreamingMessage").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_secret_or_none_forwards_nothing_of_the_users() {
    let pg = Cluster::start();
    let db = pg.create_db("secrets");
    let ws = Workspace::new();
    let (ka, kb) = (FakeKernel::start().await, FakeKernel::start().await);
    let other = "another-secret-another-secret-another-secret";
    let (a, b) = (
        start(&db, &ka, &ws, Some(SECRET)),
        start(&db, &kb, &ws, Some(other)),
    );
    turn(&ka, "t1", "task-1", "from A", vec![]);
    let r = post_turn(&a.url(), "t1", "r1", "hi", &ws.cwd("t1")).await;
    assert_valid_run(&r, "t1", "r1");
    // A cannot prove itself to B (another secret): B sends it nothing and answers 503.
    let (status, v) = get_as(&format!("{}threads/t1", b.url()), &[]).await;
    assert_eq!(status, 503, "{v}");
    drop((a, b));

    // Without a secret: a request with the user's credentials is not forwarded; one without is.
    let db = pg.create_db("nosecret");
    let (a, b) = (start(&db, &ka, &ws, None), start(&db, &kb, &ws, None));
    turn(&ka, "t2", "task-2", "from A", vec![]);
    let r = post_turn(&a.url(), "t2", "r1", "hi", &ws.cwd("t2")).await;
    assert_valid_run(&r, "t2", "r1");
    let sent = ka.calls("SendStreamingMessage").len();
    let props = json!({"alibabaCloud": {"accessKeyId": "ak", "accessKeySecret": "sk-cloud"}});
    let refused = post(&b.url(), &body("t2", "r2", "hi", &ws.cwd("t2"), props), &[]).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.error_code(), Some("STATE_UNAVAILABLE"));
    assert!(refused.error_message().unwrap().contains("cluster secret"));
    assert_eq!(ka.calls("SendStreamingMessage").len(), sent);
    assert!(b.log().contains("not forwarded without a cluster secret"));
    turn(&ka, "t2", "task-2", "again", vec![]);
    let plain = post_turn(&b.url(), "t2", "r3", "hi", &ws.cwd("t2")).await;
    assert_valid_run(&plain, "t2", "r3");
    assert_eq!(ka.calls("SendStreamingMessage").len(), sent + 1);
}

/// Instances serving TLS advertise `https://` and forward to each other over TLS, trusting the
/// cluster's CA (`--cluster-ca`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_serving_tls_forward_over_tls() {
    let pg = Cluster::start();
    let db = pg.create_db("tls");
    let ws = Workspace::new();
    let ca = testkit::tls::Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = ca.issue(&["localhost", "127.0.0.1"]);
    let paths = ["cert.pem", "key.pem", "ca.pem"].map(|n| dir.path().join(n));
    for (p, text) in paths.iter().zip([cert, key, ca.pem()]) {
        std::fs::write(p, text).unwrap();
    }
    let [cert, key, ca_file] = paths.map(|p| p.display().to_string());
    let (ka, kb) = (FakeKernel::start().await, FakeKernel::start().await);
    let mut env = ws.env();
    env.push(("IAC_CODE_AGUI_CLUSTER_SECRET".into(), SECRET.into()));
    let start = |k: &FakeKernel| {
        let args = [
            "--a2a-url",
            &k.url(),
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--cluster-ca",
            &ca_file,
        ];
        Instance::spawn(&db, &args, &env)
    };
    let (a, b) = (start(&ka), start(&kb));
    let client = crate::support::https_client(&ca);
    let https = |i: &Instance| i.url().replacen("http://", "https://", 1);
    for i in [&a, &b] {
        let t0 = std::time::Instant::now();
        while client
            .get(format!("{}health", https(i)))
            .send()
            .await
            .is_err()
        {
            assert!(
                t0.elapsed() < std::time::Duration::from_secs(30),
                "{}",
                i.log()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let advertised = pg.psql("tls", "SELECT advertise_url FROM agui_instances ORDER BY 1");
    assert!(
        advertised.lines().all(|u| u.starts_with("https://")),
        "{advertised}"
    );
    turn(&ka, "t1", "task-1", "from A", vec![]);
    let run = client
        .post(https(&a))
        .header("content-type", "application/json")
        .body(body("t1", "r1", "hi", &ws.cwd("t1"), json!({})).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(run.status(), 200);
    assert!(run.text().await.unwrap().contains("RUN_FINISHED"));
    // Asked at B, answered by A over TLS.
    let state = client
        .get(format!("{}threads/t1", https(&b)))
        .send()
        .await
        .unwrap();
    assert_eq!(state.status(), 200, "{}", b.log());
    let v: serde_json::Value = serde_json::from_slice(&state.bytes().await.unwrap()).unwrap();
    assert_eq!(v["threadId"], "t1");
}

/// A proof is the instance's, not its URL's: an instance started again at its URL (a new id)
/// that takes a thread over is proven again before a forward is signed for it, within the minute
/// a proof is kept. (Signed for the instance before it, the forward was no forward there, and
/// without the client's token it was refused: 401.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_started_again_at_its_url_is_proven_again() {
    let pg = Cluster::start();
    let db = pg.create_db("again");
    let ws = Workspace::new();
    let (ka, kb) = (FakeKernel::start().await, FakeKernel::start().await);
    let mut env = ws.env();
    env.push(("IAC_CODE_AGUI_CLUSTER_SECRET".into(), SECRET.into()));
    env.push(("IAC_CODE_AGUI_AUTH_TOKEN".into(), "svc".into()));
    let svc = [("authorization", "Bearer svc")];
    let start_at = |port: Option<u16>, k: &FakeKernel| {
        let url = k.url();
        let args = ["--a2a-url", url.as_str(), "--lease-ttl", "60"];
        match port {
            Some(p) => Instance::start_on(p, &db, &args, &env),
            None => Instance::start(&db, &args, &env),
        }
    };
    let (a, mut b) = (start_at(None, &ka), start_at(None, &kb));
    // t1 held by B; A forwards to B (and keeps B's proof).
    turn(&kb, "t1", "task-1", "from B", vec![]);
    let r = post_turn_as(&b.url(), "t1", "r1", "hi", &ws.cwd("t1"), &svc).await;
    assert_valid_run(&r, "t1", "r1");
    let first = row(&pg, "again", "t1").0;
    let (status, v) = get_as(&format!("{}threads/t1", a.url()), &svc).await;
    assert_eq!(status, 200, "{v}");
    // B stops cleanly and starts again at its URL: another instance, which takes t1 over.
    let port = b.port;
    b.signal(libc::SIGTERM);
    assert_eq!(b.child.wait().unwrap().code(), Some(0));
    let b2 = start_at(Some(port), &kb);
    turn(&kb, "t1", "task-2", "from B again", vec![]);
    let r = post_turn_as(&b2.url(), "t1", "r2", "hi", &ws.cwd("t1"), &svc).await;
    assert_valid_run(&r, "t1", "r2");
    let second = row(&pg, "again", "t1").0;
    assert_ne!(first, second);
    // At A, within the minute: forwarded to the new holder, and served there.
    let (status, v) = get_as(&format!("{}threads/t1", a.url()), &svc).await;
    assert_eq!(status, 200, "{v}");
    turn(&kb, "t1", "task-3", "via A", vec![]);
    let r = post_turn_as(&a.url(), "t1", "r3", "hi", &ws.cwd("t1"), &svc).await;
    assert_valid_run(&r, "t1", "r3");
    assert!(ka.calls("SendStreamingMessage").is_empty());
}
