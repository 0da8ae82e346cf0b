//! The listener over TLS (a CA made by the test): runs and reads over https, the official AG-UI
//! clients over https, plain HTTP refused, and a certificate replaced on disk served to the next
//! connection without a restart.

use std::time::{Duration, Instant, SystemTime};

use serde_json::json;
use testkit::fake_kernel::{FakeKernel, Stream};
use testkit::tls::Ca;

use crate::conformance::{plan, runner_with, CLIENTS};
use crate::support::{body, client, ctx, https_client, presented_cert, Builder};

/// Writes a certificate for the loopback names and its key; bumps their times so that a watcher
/// sees the change even within one second.
fn write_pair(
    ca: &Ca,
    dir: &std::path::Path,
    at: SystemTime,
) -> (std::path::PathBuf, std::path::PathBuf) {
    let (cert, key) = ca.issue(&["localhost", "127.0.0.1"]);
    let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
    for (p, text) in [(&c, cert), (&k, key)] {
        std::fs::write(p, text).unwrap();
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(at)
            .unwrap();
    }
    (c, k)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_serves_runs_clients_and_a_new_certificate_without_a_restart() {
    let ca = Ca::new();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = write_pair(&ca, dir.path(), SystemTime::now() - Duration::from_secs(60));
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k).tls(&cert, &key).start().await;
    let https = s.url.replacen("http://", "https://", 1);
    let c = https_client(&ca);

    // A run over https.
    k.stream(
        Stream::of("task-1", &ctx("t1"))
            .submitted(json!({"iacCodeSessionId": "s"}))
            .text("Hello over TLS", "m1")
            .completed(),
    );
    let r = c
        .post(&https)
        .header("content-type", "application/json")
        .body(body("t1", "r1", "hi", &s.ws("t1"), json!({})).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let first_cert = presented_cert(&r);
    let text = r.text().await.unwrap();
    assert!(
        text.contains("Hello over TLS") && text.contains("RUN_FINISHED"),
        "{text}"
    );
    // Plain HTTP to the TLS port gets no HTTP answer.
    let plain = client();
    assert!(plain.get(format!("{}health", s.url)).send().await.is_err());

    // The official clients over https, trusting the test's CA.
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let ca_path = ca_file.display().to_string();
    for client in CLIENTS {
        let thread = format!("tls-{client}");
        let cx = ctx(&thread);
        k.stream(
            Stream::of("task-2", &cx)
                .submitted(json!({"iacCodeSessionId": "s2"}))
                .text("Hi", "m2")
                .completed(),
        );
        let p = plan(
            client,
            &https,
            &thread,
            &s.ws(&thread),
            json!([{"message": "hi", "expect": "success"}]),
        );
        let (ok, report) = runner_with(p, &[("NODE_EXTRA_CA_CERTS", ca_path.as_str())]).await;
        assert!(ok, "client {client} over https: {report:#}");
    }

    // A new certificate on disk: the next connection gets it, no restart.
    write_pair(&ca, dir.path(), SystemTime::now());
    let start = Instant::now();
    loop {
        // A new client each time: a resumed TLS session would show the certificate it began with.
        let r = https_client(&ca)
            .get(format!("{https}health"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        if presented_cert(&r) != first_cert {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "the new certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
