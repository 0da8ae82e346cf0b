//! The probes a process manager uses, on the binary: `/live` answers while the process does;
//! `/ready` is 503 while no kernel is ready (a managed one restarting, an external one not
//! answering), while the gateway shuts down and while its state database cannot be reached,
//! naming why, and 200 otherwise; both on the main and the admin listener, `GET` and `HEAD`
//! only, whatever the Host; `/health` stays 200 throughout.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::fake_kernel::FakeKernel;
use testkit::postgres::{Cluster, Stop};

use crate::support::{free_port, gateway_command, spawn_healthy};

/// `method path` on `port`, with `host`: the status and the body.
fn ask(port: u16, method: &str, path: &str, host: &str) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connects");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    let _ = s.read_to_string(&mut raw);
    let (head, body) = raw.split_once("\r\n\r\n").unwrap_or((&raw, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

fn ready(port: u16) -> (u16, Value) {
    let (status, _, body) = ask(port, "GET", "/ready", "127.0.0.1");
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Polls `/ready` until it answers `status` (within `limit`); its body then.
fn wait_ready(port: u16, status: u16, limit: Duration) -> Value {
    let start = Instant::now();
    loop {
        let (s, body) = ready(port);
        if s == status {
            return body;
        }
        assert!(
            start.elapsed() < limit,
            "/ready never answered {status}: {s} {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn unready(reasons: &[&str]) -> Value {
    serde_json::json!({"status": "unready", "reasons": reasons})
}

struct Gateway {
    child: Child,
    port: u16,
    admin: u16,
    _dir: tempfile::TempDir,
}

impl Gateway {
    fn start(args: &[&str]) -> Gateway {
        let dir = tempfile::tempdir().unwrap();
        let (port, admin) = (free_port(), free_port());
        let child = spawn_healthy(
            gateway_command(port, &dir.path().join("state"))
                .args(["--metrics-listen", &format!("127.0.0.1:{admin}")])
                .args(args)
                .env_remove("IAC_CODE_AGUI_A2A_URL")
                .env_remove("IAC_CODE_AGUI_STATE_URL")
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            port,
            Duration::from_secs(30),
        );
        Gateway {
            child,
            port,
            admin,
            _dir: dir,
        }
    }

    fn signal(&self, sig: i32) {
        #[allow(unsafe_code)]
        // SAFETY: plain kill syscall.
        unsafe {
            libc::kill(self.child.id() as i32, sig);
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A managed kernel that serves `/health`, writes its pid and ignores SIGTERM (so that the
/// gateway's stop waits the 5 s before its SIGKILL: a drain long enough to probe).
fn stub_kernel(dir: &std::path::Path) -> std::path::PathBuf {
    let script = dir.join("kernel.py");
    std::fs::write(
        &script,
        format!(
            "#!/usr/bin/env python3\n\
             import http.server, os, signal, sys\n\
             signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
             port = int(sys.argv[sys.argv.index('--port') + 1])\n\
             open('{pid}', 'w').write(str(os.getpid()))\n\
             class H(http.server.BaseHTTPRequestHandler):\n\
             \x20   def do_GET(self):\n\
             \x20       self.send_response(200)\n\
             \x20       self.send_header('Content-Length', '2')\n\
             \x20       self.end_headers()\n\
             \x20       self.wfile.write(b'{{}}')\n\
             \x20   def log_message(self, *a):\n\
             \x20       pass\n\
             http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()\n",
            pid = dir.join("kernel.pid").display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[test]
fn ready_follows_a_managed_kernel_and_the_drain_and_live_answers_throughout() {
    let dir = tempfile::tempdir().unwrap();
    let script = stub_kernel(dir.path());
    let gw = Gateway::start(&["--a2a-command", script.to_str().unwrap()]);
    for port in [gw.port, gw.admin] {
        assert_eq!(
            wait_ready(port, 200, Duration::from_secs(30)),
            serde_json::json!({"status": "ready"})
        );
        let (status, head, body) = ask(port, "GET", "/live", "127.0.0.1");
        assert_eq!(
            (status, body.as_str()),
            (200, r#"{"status":"ok"}"#),
            "{head}"
        );
        // HEAD: the head GET would have, no body.
        let (status, head, body) = ask(port, "HEAD", "/ready", "127.0.0.1");
        assert_eq!((status, body.as_str()), (200, ""));
        assert!(
            head.to_ascii_lowercase().contains("content-length: 18"),
            "{head}"
        );
    }
    // A probe sends the Host of a service or a pod: no 421, as with /health.
    assert_eq!(ask(gw.port, "GET", "/ready", "pod-7.svc").0, 200);
    assert_eq!(ask(gw.port, "GET", "/live", "pod-7.svc").0, 200);
    // GET and HEAD only.
    for path in ["/live", "/ready"] {
        let (status, head, _) = ask(gw.port, "POST", path, "127.0.0.1");
        assert_eq!(status, 405, "{path}");
        assert!(
            head.contains("allow: GET, HEAD") || head.contains("Allow: GET, HEAD"),
            "{head}"
        );
    }

    // The kernel dies: unready until its restart is ready, live all the while.
    let pid: i32 = std::fs::read_to_string(dir.path().join("kernel.pid"))
        .unwrap()
        .parse()
        .unwrap();
    let _ = std::fs::remove_file(dir.path().join("kernel.pid"));
    #[allow(unsafe_code)]
    // SAFETY: plain kill syscall.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
    }
    assert_eq!(
        wait_ready(gw.port, 503, Duration::from_secs(10)),
        unready(&["kernel"])
    );
    assert_eq!(ask(gw.port, "GET", "/live", "127.0.0.1").0, 200);
    assert_eq!(ask(gw.port, "GET", "/health", "127.0.0.1").0, 200);
    wait_ready(gw.port, 200, Duration::from_secs(30));

    // A stop: the admin listener answers until the kernel is down (5 s, as it ignores SIGTERM),
    // and the gateway is unready from the signal on.
    let started = Instant::now();
    gw.signal(libc::SIGTERM);
    let body = wait_ready(gw.admin, 503, Duration::from_secs(4));
    assert_eq!(body["reasons"][0], "shutting_down", "{body}");
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_eq!(ask(gw.admin, "GET", "/live", "127.0.0.1").0, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_an_external_kernel_and_the_state_database() {
    let k = FakeKernel::start().await;
    let pg = Cluster::start();
    let db = pg.create_db("probes");
    let url = k.url();
    let gw = tokio::task::spawn_blocking(move || {
        Gateway::start(&["--a2a-url", &url, "--state-url", &db, "--lease-ttl", "3"])
    })
    .await
    .unwrap();
    let (port, admin) = (gw.port, gw.admin);
    let wait = move |port: u16, status: u16, limit: u64| {
        tokio::task::spawn_blocking(move || wait_ready(port, status, Duration::from_secs(limit)))
    };
    assert_eq!(wait(port, 200, 10).await.unwrap()["status"], "ready");

    // The kernel stops answering its /health: unready (a probe's answer stands for a second).
    k.set_healthy(false);
    assert_eq!(wait(port, 503, 5).await.unwrap(), unready(&["kernel"]));
    assert_eq!(wait(admin, 503, 5).await.unwrap(), unready(&["kernel"]));
    k.set_healthy(true);
    wait(port, 200, 5).await.unwrap();

    // The database goes away: unready once a heartbeat fails (every second with a 3 s lease),
    // ready again once one succeeds.
    pg.stop(Stop::Immediate);
    assert_eq!(wait(port, 503, 15).await.unwrap(), unready(&["state"]));
    assert_eq!(ask(port, "GET", "/live", "127.0.0.1").0, 200);
    pg.start_again();
    wait(port, 200, 30).await.unwrap();
    drop(gw);
}
