//! The managed kernel's supervisor: a thread that starts `iac-code a2a` ([`Launch`]), probes it
//! until ready (once the listener on its port is its own: `owner`), restarts it with back-off
//! when it dies, and stops it with SIGTERM, then SIGKILL after 5 s. Its output is logged
//! (`output`).
//!
//! The child never outlives the gateway: it runs in its own process group (signalled as a whole)
//! and gets SIGKILL when the gateway dies (a parent-death signal). On Linux that signal follows
//! the *thread* that spawned the child, so the spawning thread is this dedicated one, which lives
//! as long as the gateway (a runtime's blocking-pool thread exits when idle and would take the
//! kernel with it). The thread has a small runtime of its own for the readiness probe.

use std::convert::Infallible;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;

use super::child::Proc;
use super::launch::{self, Launch};
use super::output::{self, Stream};
use super::owner;
use super::{Kernel, KernelState};

/// How to start a managed kernel.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    pub launch: Launch,
    pub ready_timeout: Duration,
    /// Timeouts of the client talking to it.
    pub timeouts: a2a::Timeouts,
}

/// How long one readiness probe may take (connecting and the answer's head).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// A port free now, and not one the kernel's confinement lets kernels connect to. Released
/// before the kernel binds it, so another process may take it first: the probe makes sure whose
/// listener it is before it sends the token (`owner`).
fn free_port(launch: &Launch) -> std::io::Result<u16> {
    for _ in 0..16 {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        let port = l.local_addr()?.port();
        if !launch.avoids(port) {
            return Ok(port);
        }
    }
    Err(std::io::Error::other(
        "only ports kernels may connect to were free",
    ))
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

fn kill_group(pid: u32, sig: i32) {
    // A negative pid signals the whole process group (the child is its group leader).
    #[allow(unsafe_code)]
    // SAFETY: plain syscall with integer arguments.
    unsafe {
        libc::kill(-(pid as i32), sig);
    }
}

/// Kills what is left of an exited child's process group. A forked child's group was killed by
/// the zygote before it reaped the child (its id could be another group's by now).
fn kill_leftovers(child: &Proc) {
    if !child.forked() {
        kill_group(child.id(), libc::SIGKILL);
    }
}

fn stop_child(child: &mut Proc) {
    let pid = child.id();
    if matches!(child.try_wait(), Ok(Some(_))) {
        kill_leftovers(child);
        return;
    }
    kill_group(pid, libc::SIGTERM);
    if exits_within(child, Duration::from_secs(5)) {
        // Reap stragglers of the group too.
        kill_leftovers(child);
        return;
    }
    kill_group(pid, libc::SIGKILL);
    let _ = child.wait();
}

/// Whether `child` exits within `d`.
fn exits_within(child: &mut Proc, d: Duration) -> bool {
    let deadline = Instant::now() + d;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The pause before the next start: 0.5 s, doubled after each start that failed or died, up to
/// 30 s; back to 0.5 s once a kernel was ready.
struct Backoff(Duration);

impl Backoff {
    const FIRST: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(30);

    fn new() -> Backoff {
        Backoff(Backoff::FIRST)
    }

    fn reset(&mut self) {
        self.0 = Backoff::FIRST;
    }

    /// The pause now, without counting it.
    fn current(&self) -> Duration {
        self.0
    }

    /// The pause now; the next one is twice as long.
    fn next(&mut self) -> Duration {
        let now = self.0;
        self.0 = (now * 2).min(Backoff::MAX);
        now
    }
}

/// How watching the child ended.
enum Watched<T> {
    /// A stop was asked for.
    Stop,
    Exited(ExitStatus),
    /// What the check of each look said.
    Done(T),
}

/// Looks at the child every `every` until a stop is asked for, the child exits, or `check` has
/// an answer.
fn watch<T>(
    k: &Kernel,
    child: &mut Proc,
    every: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> Watched<T> {
    loop {
        if k.stop.load(Ordering::SeqCst) {
            return Watched::Stop;
        }
        if let Ok(Some(status)) = child.try_wait() {
            return Watched::Exited(status);
        }
        if let Some(answer) = check() {
            return Watched::Done(answer);
        }
        std::thread::sleep(every);
    }
}

/// How one life of the child ended.
enum Life {
    /// A stop was asked for: the child is stopped.
    Stop,
    /// It died, failed to start or never became ready: start another after the back-off.
    Over,
}

fn supervise(k: Arc<Kernel>, spec: ChildSpec) {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            k.set_state(KernelState::Failed(format!(
                "no runtime for the readiness probe: {e}"
            )));
            return;
        }
    };
    let mut backoff = Backoff::new();
    while !k.stop.load(Ordering::SeqCst) {
        let port = match free_port(&spec.launch) {
            Ok(p) => p,
            Err(e) => {
                k.set_state(KernelState::Failed(format!("no free port: {e}")));
                std::thread::sleep(backoff.current());
                continue;
            }
        };
        let over = output::Over::default();
        let (mut child, port, token) = match begin(&spec.launch, port, random_token(), &over) {
            Ok(started) => started,
            Err(e) => {
                k.set_state(KernelState::Failed(e.clone()));
                tracing::error!(error = %e, "managed kernel failed to start");
                if sleep_or_stop(&k, backoff.next()) {
                    break;
                }
                continue;
            }
        };
        {
            let mut g = k.inner.lock().expect("kernel lock");
            g.pid = Some(child.id());
            g.client = Some(k.client_for(&launch::url(port), Some(token.clone()), spec.timeouts));
        }
        tracing::info!(
            pid = child.id(),
            port,
            forked = child.forked(),
            "managed kernel started"
        );
        let life = live(&k, &spec, &rt, &mut child, port, &token, &mut backoff);
        if let Life::Stop = life {
            stop_child(&mut child);
        }
        over.end();
        if let Life::Stop = life {
            break;
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
        if sleep_or_stop(&k, backoff.next()) {
            break;
        }
        if !k.stop.load(Ordering::SeqCst) {
            let mut g = k.inner.lock().expect("kernel lock");
            // A failure keeps being reported while retrying.
            if !matches!(g.state, KernelState::Failed(_)) {
                g.state = KernelState::Starting;
            }
        }
    }
    k.set_state(KernelState::Stopped);
}

/// One life of a started child: probed until ready, then served until it dies.
fn live(
    k: &Kernel,
    spec: &ChildSpec,
    rt: &tokio::runtime::Runtime,
    child: &mut Proc,
    port: u16,
    token: &str,
    backoff: &mut Backoff,
) -> Life {
    let started = Instant::now();
    let pid = child.id();
    let ready = watch(k, child, Duration::from_millis(100), || {
        // The token goes to the child's own listener only: not to a process that took the port
        // between its choice and the child's bind (the child is its process group's leader).
        if owner::kernel_listens(port, pid)
            && rt.block_on(launch::ready(port, token, PROBE_TIMEOUT))
        {
            Some(true)
        } else if started.elapsed() > spec.ready_timeout {
            Some(false)
        } else {
            None
        }
    });
    match ready {
        Watched::Stop => return Life::Stop,
        Watched::Exited(status) => {
            let msg = format!(
                "The local A2A process exited during startup (exit code {}).",
                status.code().unwrap_or(-1)
            );
            tracing::error!("{msg}");
            kill_leftovers(child);
            k.set_state(KernelState::Failed(msg));
            return Life::Over;
        }
        Watched::Done(false) => {
            let msg = "The local A2A process did not become ready in time.".to_owned();
            tracing::error!("{msg}");
            stop_child(child);
            k.set_state(KernelState::Failed(msg));
            return Life::Over;
        }
        Watched::Done(true) => {}
    }
    tracing::info!(
        elapsed_ms = started.elapsed().as_millis() as u64,
        "managed kernel ready"
    );
    k.set_state(KernelState::Ready);
    backoff.reset();
    // Serve until it dies or a stop is asked for.
    match watch(k, child, Duration::from_millis(50), || None::<Infallible>) {
        Watched::Stop => Life::Stop,
        Watched::Exited(status) => {
            tracing::error!(
                code = status.code().unwrap_or(-1),
                "managed kernel exited; restarting"
            );
            kill_leftovers(child);
            Life::Over
        }
        Watched::Done(never) => match never {},
    }
}

/// Starts a life of the kernel on `port` with `token`: forked by the launch's fork server when
/// it has one that is ready, else spawned (and said so when a fork was meant), on another port
/// with another token then (a fork that timed out may yet have a child that took them). Its
/// output is forwarded to the log until `over`. The process, its port and its token.
fn begin(
    launch: &Launch,
    port: u16,
    token: String,
    over: &output::Over,
) -> Result<(Proc, u16, String), String> {
    let (port, token) = match launch.fork_request(port, &token) {
        Some(Ok((server, req, prepared))) => match server.fork(&req, &prepared) {
            Ok(mut f) => {
                if let Some(out) = f.stdout.take() {
                    output::forward(f.id(), Stream::Stdout, out, over.clone());
                }
                if let Some(err) = f.stderr.take() {
                    output::forward(f.id(), Stream::Stderr, err, over.clone());
                }
                return Ok((Proc::Forked(f), port, token));
            }
            Err(e) => {
                tracing::warn!(reason = %e, "a user's kernel is spawned, not forked");
                let port = free_port(launch).map_err(|e| format!("no free port: {e}"))?;
                (port, random_token())
            }
        },
        Some(Err(e)) => return Err(format!("managed kernel cannot be confined: {e}")),
        None => (port, token),
    };
    let mut cmd = launch
        .spawnable(port, &token)
        .map_err(|e| format!("managed kernel cannot be confined: {e}"))?;
    // Its output goes through the gateway's log, line by line (`output`).
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let program = launch.program();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    if let Some(out) = child.stdout.take() {
        output::forward(child.id(), Stream::Stdout, out, over.clone());
    }
    if let Some(err) = child.stderr.take() {
        output::forward(child.id(), Stream::Stderr, err, over.clone());
    }
    Ok((Proc::Spawned(child), port, token))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_back_off_doubles_up_to_30_s_and_starts_over_once_ready() {
        let mut b = Backoff::new();
        assert_eq!(b.current(), Duration::from_millis(500));
        let pauses: Vec<u64> = (0..9).map(|_| b.next().as_millis() as u64).collect();
        assert_eq!(
            pauses,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        b.reset();
        assert_eq!(b.next(), Duration::from_millis(500));
    }
}
