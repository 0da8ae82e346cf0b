//! The binary as a process: configuration errors, start-up speed, signals.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_iac-code-agui")
}

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(bin())
        .args(args)
        .envs(env.iter().copied())
        .env_remove("IAC_CODE_AGUI_A2A_URL")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn configuration_errors_exit_1_with_a_message() {
    let (code, err) = run(&["--a2a-url", "http://10.0.0.1:41242/"], &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("The AG-UI adapter may connect only to a loopback A2A HTTP(S) URL."),
        "{err}"
    );
    let (code, err) = run(&["--port", "70000"], &[]);
    assert_eq!(
        (code, err.trim()),
        (1, "--port must be between 1 and 65535.")
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, "[1, 2]\n").unwrap();
    let (code, err) = run(&["--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(
        (code, err.trim()),
        (1, "AG-UI config file must contain a YAML mapping.")
    );
    let (code, err) = run(&["--idle-shutdown", "x"], &[]);
    assert_eq!(
        (code, err.trim()),
        (1, "--idle-shutdown must be a non-negative number.")
    );
}

#[test]
fn help_documents_every_option() {
    let out = Command::new(bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--config",
        "--host",
        "--port",
        "--a2a-url",
        "--debug",
        "--log-stdout",
        "--state-dir",
        "--idle-shutdown",
        "--interrupt-ttl",
        "--a2a-command",
        "--shutdown-timeout",
        "IAC_CODE_AGUI_A2A_TOKEN",
    ] {
        assert!(help.contains(opt), "{opt} missing from --help");
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_health(port: u16, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut buf = String::new();
            let _ = s.read_to_string(&mut buf);
            if buf.starts_with("HTTP/1.1 200") {
                return Some(start.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

#[test]
fn external_kernel_ready_fast_idle_shutdown_and_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = Command::new(bin())
        .args([
            "--port",
            &port.to_string(),
            "--a2a-url",
            "http://127.0.0.1:9/",
            "--state-dir",
        ])
        .arg(dir.path().join("state"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = wait_health(port, Duration::from_secs(10)).expect("health");
    eprintln!("ready after {ready:?}");
    assert!(ready < Duration::from_secs(2));
    #[allow(unsafe_code)]
    // SAFETY: plain kill syscall.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    // Idle shutdown.
    let port = free_port();
    let mut child = Command::new(bin())
        .args([
            "--port",
            &port.to_string(),
            "--a2a-url",
            "http://127.0.0.1:9/",
            "--idle-shutdown",
            "1",
            "--state-dir",
        ])
        .arg(dir.path().join("state"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_health(port, Duration::from_secs(10)).expect("health");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "idle shutdown did not happen"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    assert!(start.elapsed() >= Duration::from_millis(900));
}
