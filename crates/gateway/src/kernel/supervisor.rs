//! The managed kernel's supervisor: a thread that spawns `iac-code a2a`, probes it until ready,
//! restarts it with back-off when it dies, and stops it with SIGTERM, then SIGKILL after 5 s.
//!
//! The child never outlives the gateway: it runs in its own process group (signalled as a whole)
//! and gets SIGKILL when the gateway dies (a parent-death signal). On Linux that signal follows
//! the *thread* that spawned the child, so the spawning thread is this dedicated one, which lives
//! as long as the gateway (a runtime's blocking-pool thread exits when idle and would take the
//! kernel with it).

use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;

use super::{Kernel, KernelState};

/// How to start a managed kernel.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    pub command: String,
    /// Extra environment for the child (on top of the gateway's).
    pub env: Vec<(String, String)>,
    pub ready_timeout: Duration,
    /// Timeouts of the client talking to it.
    pub timeouts: a2a::Timeouts,
    /// A kernel configuration file to start it with (`--config`: its `persistence_dir`),
    /// removed when the gateway exits.
    pub config_file: Option<std::sync::Arc<tempfile::TempPath>>,
}

fn free_port() -> std::io::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

fn random_token() -> String {
    let mut b = [0u8; 32];
    rand::Rng::fill(&mut rand::thread_rng(), &mut b);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b)
}

/// Starts the supervisor thread of `k`.
pub(super) fn start(k: Arc<Kernel>, spec: ChildSpec) {
    std::thread::Builder::new()
        .name("kernel-supervisor".into())
        .spawn(move || supervise(k, spec))
        .expect("spawn supervisor thread");
}

#[allow(unsafe_code)]
fn spawn_child(spec: &ChildSpec, port: u16, token: &str) -> std::io::Result<Child> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(&spec.command);
    cmd.args([
        "a2a",
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--thinking-exposure",
        "all",
    ])
    .args(
        spec.config_file
            .iter()
            .flat_map(|f| [std::ffi::OsStr::new("--config"), f.as_os_str()]),
    )
    .env("IACCODE_A2A_HTTP_TOKEN", token)
    .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    .stdin(Stdio::null())
    .process_group(0);
    let parent = std::process::id();
    // SAFETY: only async-signal-safe calls (prctl, getppid, _exit) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    cmd.spawn()
}

fn kill_group(pid: u32, sig: i32) {
    // A negative pid signals the whole process group (the child is its group leader).
    #[allow(unsafe_code)]
    // SAFETY: plain syscall with integer arguments.
    unsafe {
        libc::kill(-(pid as i32), sig);
    }
}

fn stop_child(child: &mut Child) {
    let pid = child.id();
    if matches!(child.try_wait(), Ok(Some(_))) {
        kill_group(pid, libc::SIGKILL);
        return;
    }
    kill_group(pid, libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            // Reap stragglers of the group too.
            kill_group(pid, libc::SIGKILL);
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    kill_group(pid, libc::SIGKILL);
    let _ = child.wait();
}

fn probe(url: &str, token: &str) -> bool {
    // Minimal blocking HTTP/1.1 probe (the supervisor thread has no async runtime).
    use std::io::{Read, Write};
    let addr = url
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let Ok(mut s) = std::net::TcpStream::connect_timeout(
        &addr.parse().expect("loopback socket address"),
        Duration::from_millis(500),
    ) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let req = format!(
        "GET /health HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut buf = [0u8; 16];
    matches!(s.read(&mut buf), Ok(n) if n >= 12 && &buf[9..12] == b"200")
}

fn supervise(k: Arc<Kernel>, spec: ChildSpec) {
    let mut backoff = Duration::from_millis(500);
    loop {
        if k.stop.load(Ordering::SeqCst) {
            k.set_state(KernelState::Stopped);
            return;
        }
        let port = match free_port() {
            Ok(p) => p,
            Err(e) => {
                k.set_state(KernelState::Failed(format!("no free port: {e}")));
                std::thread::sleep(backoff);
                continue;
            }
        };
        let token = random_token();
        let url = format!("http://127.0.0.1:{port}/");
        let mut child = match spawn_child(&spec, port, &token) {
            Ok(c) => c,
            Err(e) => {
                k.set_state(KernelState::Failed(format!(
                    "cannot start {}: {e}",
                    spec.command
                )));
                tracing::error!(command = %spec.command, error = %e, "managed kernel failed to start");
                if sleep_or_stop(&k, backoff) {
                    k.set_state(KernelState::Stopped);
                    return;
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
                continue;
            }
        };
        {
            let mut g = k.inner.lock().expect("kernel lock");
            g.pid = Some(child.id());
            g.generation += 1;
            g.client = Some(k.client_for(&url, Some(token.clone()), spec.timeouts));
        }
        tracing::info!(pid = child.id(), port, "managed kernel started");
        // Readiness.
        let started = Instant::now();
        let mut ready = false;
        loop {
            if k.stop.load(Ordering::SeqCst) {
                stop_child(&mut child);
                k.set_state(KernelState::Stopped);
                return;
            }
            if let Ok(Some(status)) = child.try_wait() {
                let msg = format!(
                    "The local A2A process exited during startup (exit code {}).",
                    status.code().unwrap_or(-1)
                );
                tracing::error!("{msg}");
                kill_group(child.id(), libc::SIGKILL);
                k.set_state(KernelState::Failed(msg));
                break;
            }
            if probe(&url, &token) {
                ready = true;
                break;
            }
            if started.elapsed() > spec.ready_timeout {
                let msg = "The local A2A process did not become ready in time.".to_owned();
                tracing::error!("{msg}");
                stop_child(&mut child);
                k.set_state(KernelState::Failed(msg));
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if ready {
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "managed kernel ready"
            );
            k.set_state(KernelState::Ready);
            backoff = Duration::from_millis(500);
            // Serve until it dies or we stop.
            loop {
                if k.stop.load(Ordering::SeqCst) {
                    stop_child(&mut child);
                    k.set_state(KernelState::Stopped);
                    return;
                }
                if let Ok(Some(status)) = child.try_wait() {
                    tracing::error!(
                        code = status.code().unwrap_or(-1),
                        "managed kernel exited; restarting"
                    );
                    kill_group(child.id(), libc::SIGKILL);
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        {
            let mut g = k.inner.lock().expect("kernel lock");
            g.restarts += 1;
            k.restarts.store(g.restarts, Ordering::Relaxed);
            g.pid = None;
            if !matches!(g.state, KernelState::Failed(_)) {
                g.state = KernelState::Restarting;
            }
        }
        k.changed.notify_waiters();
        if sleep_or_stop(&k, backoff) {
            k.set_state(KernelState::Stopped);
            return;
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
        if !k.stop.load(Ordering::SeqCst) {
            let mut g = k.inner.lock().expect("kernel lock");
            if matches!(g.state, KernelState::Failed(_)) {
                // Keep reporting the failure while retrying.
            } else {
                g.state = KernelState::Starting;
            }
        }
    }
}

/// Sleeps up to `d`; returns true when a stop was requested.
fn sleep_or_stop(k: &Kernel, d: Duration) -> bool {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if k.stop.load(Ordering::SeqCst) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    k.stop.load(Ordering::SeqCst)
}
