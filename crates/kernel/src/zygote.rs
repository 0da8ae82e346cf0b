//! The kernel fork server ("zygote"): a Python process, run with the kernel's own interpreter,
//! that imports the kernel once (with what a first turn imports) and forks a user's kernel on
//! the gateway's request in about a tenth of a second, sharing the imported modules' memory
//! with every other kernel. Its source (`zygote/zygote.py`, with the measured list of modules
//! to import, `zygote/preload.txt`) is part of this binary and handed to the interpreter on its
//! standard input: it ships wherever the gateway does, and is always the gateway's version.
//!
//! One channel joins them, a UNIX `SOCK_SEQPACKET` pair made here: the zygote's end is its
//! descriptor 3, the gateway's end is nobody else's. A request carries the kernel's argv,
//! environment and directory, its seccomp filter, and three descriptors (its stdout and stderr
//! pipes, its prepared Landlock ruleset); the answer carries the child's pidfd. The zygote
//! reports each child's exit status. The child confines itself exactly as a spawned kernel
//! does before it executes (`confine::Prepared::enforce`), before it reads anything from the
//! network (see `zygote.py`).
//!
//! The zygote runs as the kernels' uid, confined to the union of what its children may reach
//! (the kernels', persistence, backup and workspace roots; the system read-only; the connect
//! ports), with no capability and the same seccomp filter. A child's Landlock domain is nested
//! in the zygote's, so a child can neither signal nor ptrace it (nor read its `/proc` files but
//! the command line), and it holds no socket of the zygote's.
//!
//! A keeper thread starts it, and restarts it with back-off (0.5 s doubling to 30 s) when it
//! dies; until it is ready, kernels start the plain way (`supervisor`). Its children die with it
//! (a parent-death signal): their supervisors see that and start them again.

use std::collections::HashMap;
use std::io::{IoSlice, IoSliceMut, Write as _};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde_json::{json, Value};

use super::confine::{Confinement, Prepared};
use super::output::{self, Stream};

/// The fork server's source.
const SOURCE: &str = include_str!("../zygote/zygote.py");
/// The modules it imports besides the kernel's entry point: what a kernel's start and first turn
/// import, measured (see `scripts/zygote-preload.sh`).
const PRELOAD: &str = include_str!("../zygote/preload.txt");
/// The largest message either side sends (a request's environment is a few KiB): within what a
/// SEQPACKET socket's default buffer takes in one message (about 208 KiB).
const MAX_MESSAGE: usize = 192 << 10;
/// Forks in a row the zygote did not answer in time after which it is started again.
const UNANSWERED_LIMIT: u32 = 2;
/// How long the imports may take before the zygote counts as failed to start.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a fork may take to be answered (shorter in this crate's tests, which wait for it).
const FORK_TIMEOUT: Duration = if cfg!(test) {
    Duration::from_millis(500)
} else {
    Duration::from_secs(10)
};
/// A zygote ready this long has its back-off started over when it dies.
const STABLE: Duration = Duration::from_secs(60);

/// How the fork server is started.
#[derive(Debug, Clone)]
pub struct ServerSpec {
    /// The kernel's interpreter (its console script's `#!`).
    pub python: PathBuf,
    /// Its environment: the kernels' shared one, with nothing of a user's and no secret.
    pub env: Vec<(String, String)>,
    /// The uid and gid it (and so every kernel it forks) runs as; `None`: the gateway's.
    pub identity: Option<(u32, u32)>,
    /// The union of what its children may reach.
    pub confinement: Confinement,
}

/// What a forked kernel is started with (a spawned one's command, as data).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForkRequest {
    /// `sys.argv`: the kernel command and its arguments.
    pub argv: Vec<String>,
    /// Its whole environment.
    pub env: Vec<(String, String)>,
    /// Its working directory.
    pub cwd: PathBuf,
}

/// The fork server's state, as `/health` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Importing the kernel (kernels are spawned meanwhile).
    Starting,
    Ready,
    /// Dead or failed to start; started again after a back-off.
    Down,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Starting => "starting",
            State::Ready => "ready",
            State::Down => "down",
        }
    }
}

/// A handle on the fork server; clones share it.
#[derive(Clone)]
pub struct ForkServer(Arc<Shared>);

impl std::fmt::Debug for ForkServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForkServer")
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

struct Shared {
    spec: ServerSpec,
    /// The running zygote's channel, once it is ready.
    life: Mutex<Option<Arc<Life>>>,
    state: Mutex<State>,
    changed: Condvar,
    /// Exit statuses the zygote reported, by pid, until their supervisor takes them.
    exits: Mutex<HashMap<u32, i32>>,
    stop: AtomicBool,
    /// Kernels forked, and zygotes started after the first.
    forked: AtomicU64,
    restarts: AtomicU64,
}

/// One zygote's channel.
struct Life {
    chan: OwnedFd,
    /// The forks waiting for their answer, by request id: an answer nobody waits for any more
    /// (its fork timed out) is a child nobody supervises, killed at once.
    waiting: Mutex<HashMap<u64, mpsc::Sender<Reply>>>,
    next_id: AtomicU64,
    /// Forks in a row it did not answer in time.
    unanswered: std::sync::atomic::AtomicU32,
    /// Children killed because nobody waited for them: their exits are nobody's.
    orphans: Mutex<std::collections::HashSet<u32>>,
    /// Its channel ended: the zygote is gone.
    gone: AtomicBool,
}

enum Reply {
    Forked(u32, OwnedFd),
    Refused(String),
}

impl ForkServer {
    /// Starts the keeper thread, which starts the zygote (imports take seconds: [`State`]).
    pub fn start(spec: ServerSpec) -> ForkServer {
        let shared = Arc::new(Shared {
            spec,
            life: Mutex::new(None),
            state: Mutex::new(State::Starting),
            changed: Condvar::new(),
            exits: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            forked: AtomicU64::new(0),
            restarts: AtomicU64::new(0),
        });
        let keeper = shared.clone();
        std::thread::Builder::new()
            .name("kernel-fork-server".into())
            .spawn(move || keep(keeper))
            .expect("spawn the fork server's keeper");
        ForkServer(shared)
    }

    pub fn state(&self) -> State {
        *self.0.state.lock().expect("fork server state")
    }

    /// Waits up to `within` for the zygote to be ready.
    pub fn wait_ready(&self, within: Duration) -> bool {
        let end = Instant::now() + within;
        let mut state = self.0.state.lock().expect("fork server state");
        while *state != State::Ready {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = self.0.changed.wait_timeout(state, left).expect("state").0;
        }
        true
    }

    /// Kernels forked so far, and restarts of the zygote.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.0.forked.load(Ordering::Relaxed),
            self.0.restarts.load(Ordering::Relaxed),
        )
    }

    /// Its part of `/health`: state, kernels forked, restarts.
    pub fn health(&self) -> Value {
        let (forked, restarts) = self.counts();
        json!({"state": self.state().as_str(), "forked": forked, "restarts": restarts})
    }

    /// Stops the zygote (and every kernel it forked) and its keeper.
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
        if let Some(life) = self.0.life.lock().expect("life").take() {
            let _ = rustix::net::shutdown(&life.chan, rustix::net::Shutdown::Both);
        }
    }

    /// Forks a kernel: `req` its command, `ruleset` its confinement. `Err` when the zygote is
    /// not ready or the fork failed (the caller spawns the kernel instead).
    pub fn fork(&self, req: &ForkRequest, ruleset: &Prepared) -> Result<Forked, String> {
        let life = self
            .0
            .life
            .lock()
            .expect("life")
            .clone()
            .ok_or("the kernel fork server is not ready")?;
        let (out_r, out_w) = pipe()?;
        let (err_r, err_w) = pipe()?;
        let message = serde_json::to_vec(&json!({
            "argv": req.argv,
            "env": req.env,
            "cwd": req.cwd,
            "seccomp": hex::encode(ruleset.filter_bytes()),
        }))
        .map_err(|e| e.to_string())?;
        if message.len() > MAX_MESSAGE {
            return Err("the kernel's request is too large to fork".into());
        }
        let id = life.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel();
        life.waiting.lock().expect("waiting").insert(id, tx);
        let fds = [out_w.as_fd(), err_w.as_fd(), ruleset.as_fd()];
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(3))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        control.push(SendAncillaryMessage::ScmRights(&fds));
        // Never blocks: a zygote that does not read its channel makes the kernel spawned.
        let sent = rustix::net::sendmsg(
            &life.chan,
            &[IoSlice::new(&id.to_le_bytes()), IoSlice::new(&message)],
            &mut control,
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        );
        drop((out_w, err_w));
        if let Err(e) = sent {
            life.waiting.lock().expect("waiting").remove(&id);
            return Err(format!("the kernel fork server cannot be asked: {e}"));
        }
        let answer = rx.recv_timeout(FORK_TIMEOUT);
        // From here on, an answer finds nobody waiting (and its child is killed).
        life.waiting.lock().expect("waiting").remove(&id);
        if answer.is_err() {
            let unanswered = life.unanswered.fetch_add(1, Ordering::SeqCst) + 1;
            if unanswered >= UNANSWERED_LIMIT && !life.gone.load(Ordering::SeqCst) {
                tracing::error!(
                    unanswered,
                    "the kernel fork server does not answer: it is started again"
                );
                let _ = rustix::net::shutdown(&life.chan, rustix::net::Shutdown::Both);
            }
        } else {
            life.unanswered.store(0, Ordering::SeqCst);
        }
        match answer {
            Ok(Reply::Forked(pid, pidfd)) => {
                self.0.forked.fetch_add(1, Ordering::Relaxed);
                // Under memory pressure a kernel goes before the fork server, whose death takes
                // every forked kernel with it (and which holds more memory than any one). Set
                // here: the child's /proc is read-only to it.
                if let Err(e) = std::fs::write(format!("/proc/{pid}/oom_score_adj"), "300") {
                    tracing::debug!(pid, error = %e, "a forked kernel's oom_score_adj is not set");
                }
                Ok(Forked {
                    pid,
                    pidfd,
                    stdout: Some(out_r.into()),
                    stderr: Some(err_r.into()),
                    shared: self.0.clone(),
                    life: life.clone(),
                    dead_since: None,
                })
            }
            Ok(Reply::Refused(why)) => Err(format!("the kernel fork server refused: {why}")),
            Err(_) => Err("the kernel fork server did not answer".into()),
        }
    }
}

/// A pipe whose ends are closed on exec: (read, write).
fn pipe() -> Result<(OwnedFd, OwnedFd), String> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| format!("no pipe for a kernel's output: {e}"))
}

/// A kernel the zygote forked: its pid, its pidfd (a handle on this process, whatever pid is
/// later reused), its output pipes.
pub struct Forked {
    pid: u32,
    pidfd: OwnedFd,
    pub stdout: Option<std::fs::File>,
    pub stderr: Option<std::fs::File>,
    shared: Arc<Shared>,
    life: Arc<Life>,
    /// When it was first seen exited without a report.
    dead_since: Option<Instant>,
}

impl Forked {
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// Its exit status once it exited: the zygote's report, or SIGKILL when the zygote died
    /// first (the parent-death signal killed it, and nobody reports its status).
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        if let Some(raw) = self.shared.exits.lock().expect("exits").remove(&self.pid) {
            return Ok(Some(ExitStatus::from_raw(raw)));
        }
        if self.alive()? {
            self.dead_since = None;
            return Ok(None);
        }
        // Exited: the zygote's report follows at once, unless the zygote is gone or stuck.
        let since = *self.dead_since.get_or_insert_with(Instant::now);
        if self.life.gone.load(Ordering::SeqCst) || since.elapsed() > Duration::from_secs(2) {
            return Ok(Some(ExitStatus::from_raw(libc::SIGKILL)));
        }
        Ok(None)
    }

    /// Whether the process still runs: its pidfd is readable once it has exited.
    fn alive(&self) -> std::io::Result<bool> {
        let mut fds = [rustix::event::PollFd::new(
            &self.pidfd,
            rustix::event::PollFlags::IN,
        )];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let ready = rustix::event::poll(&mut fds, Some(&zero))?;
        Ok(ready == 0)
    }

    /// Signals it alone (its group is signalled by pid, as a spawned kernel's is).
    pub fn signal(&self, sig: rustix::process::Signal) {
        let _ = rustix::process::pidfd_send_signal(&self.pidfd, sig);
    }
}

impl Drop for Forked {
    fn drop(&mut self) {
        // Its status, should it come after its supervisor let go, is nobody's.
        self.shared.exits.lock().expect("exits").remove(&self.pid);
    }
}

impl std::fmt::Debug for Forked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forked").field("pid", &self.pid).finish()
    }
}

/// The kernel's interpreter, from the first lines of its console script (`program`): a
/// `#!/path/python` line, or the `/bin/sh` trampoline pip writes for a long path. `None` for a
/// program that is no Python console script (a binary, a shell wrapper).
pub fn interpreter_of(program: &Path) -> Option<PathBuf> {
    let mut head = vec![0u8; 4096];
    let n = std::io::Read::read(&mut std::fs::File::open(program).ok()?, &mut head).ok()?;
    head.truncate(n);
    interpreter_in(&String::from_utf8_lossy(&head))
}

/// [`interpreter_of`] on the script's text.
fn interpreter_in(text: &str) -> Option<PathBuf> {
    let mut lines = text.lines();
    let first = lines.next()?.strip_prefix("#!")?.trim();
    let python = |p: &str| {
        let p = PathBuf::from(p);
        let name = p.file_name()?.to_str()?.to_owned();
        (p.is_absolute() && name.starts_with("python")).then_some(p)
    };
    if first == "/bin/sh" {
        // '''exec' "/long/path/bin/python" "$0" "$@"
        let exec = lines.next()?.strip_prefix("'''exec' ")?;
        let path = exec
            .strip_prefix('"')
            .and_then(|r| r.split('"').next())
            .or_else(|| exec.split_whitespace().next())?;
        return python(path);
    }
    python(first.split_whitespace().next()?)
}

/// The keeper: starts the zygote, waits for its end, starts it again after a back-off.
fn keep(shared: Arc<Shared>) {
    let mut pause = Duration::from_millis(500);
    let mut first = true;
    while !shared.stop.load(Ordering::SeqCst) {
        if !first {
            shared.restarts.fetch_add(1, Ordering::Relaxed);
        }
        first = false;
        set_state(&shared, State::Starting);
        let began = Instant::now();
        match run(&shared) {
            Ok(ready_for) if ready_for >= STABLE => pause = Duration::from_millis(500),
            Ok(_) => {}
            Err(e) => tracing::error!(error = %e, "the kernel fork server cannot start"),
        }
        set_state(&shared, State::Down);
        if shared.stop.load(Ordering::SeqCst) {
            break;
        }
        tracing::warn!(
            after_ms = began.elapsed().as_millis() as u64,
            retry_in_ms = pause.as_millis() as u64,
            "the kernel fork server is down: users' kernels start by spawn until it is back"
        );
        let end = Instant::now() + pause;
        while Instant::now() < end && !shared.stop.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50));
        }
        pause = (pause * 2).min(Duration::from_secs(30));
    }
}

fn set_state(shared: &Shared, state: State) {
    *shared.state.lock().expect("fork server state") = state;
    shared.changed.notify_all();
}

/// One life of the zygote: started, read until its channel ends, reaped. `Ok`: how long it was
/// ready.
fn run(shared: &Arc<Shared>) -> Result<Duration, String> {
    let (ours, theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| format!("no channel: {e}"))?;
    let mut cmd = command(&shared.spec, theirs.as_raw_fd())?;
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", shared.spec.python.display()))?;
    drop(theirs);
    let pid = child.id();
    let over = output::Over::default();
    if let Some(out) = child.stdout.take() {
        output::forward(pid, Stream::Stdout, out, over.clone());
    }
    if let Some(err) = child.stderr.take() {
        output::forward(pid, Stream::Stderr, err, over.clone());
    }
    // The source on its standard input: Python reads it to the end, then runs it.
    if let Some(mut stdin) = child.stdin.take() {
        let names: Vec<&str> = PRELOAD
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        let program = format!(
            "PRELOAD = {}\n{SOURCE}",
            serde_json::to_string(&names).expect("names serialise")
        );
        if let Err(e) = stdin.write_all(program.as_bytes()) {
            tracing::error!(error = %e, "the kernel fork server's source could not be given");
        }
    }
    let life = Arc::new(Life {
        chan: ours,
        waiting: Mutex::new(HashMap::new()),
        next_id: AtomicU64::new(1),
        unanswered: std::sync::atomic::AtomicU32::new(0),
        orphans: Mutex::new(std::collections::HashSet::new()),
        gone: AtomicBool::new(false),
    });
    let ready_at = read(shared, &life, pid);
    life.gone.store(true, Ordering::SeqCst);
    *shared.life.lock().expect("life") = None;
    let _ = child.kill();
    let status = child.wait().map_err(|e| e.to_string())?;
    over.end();
    tracing::warn!(pid, status = %status, "the kernel fork server exited");
    Ok(ready_at.map_or(Duration::ZERO, |t| t.elapsed()))
}

/// The zygote's command: its interpreter reading the source from standard input, the channel
/// as descriptor 3, its uid, its confinement, a parent-death signal.
#[allow(unsafe_code)]
fn command(spec: &ServerSpec, channel: i32) -> Result<Command, String> {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = Command::new(&spec.python);
    cmd.args(["-s", "-", "iac-code-agui-zygote"])
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    if let Some((uid, gid)) = spec.identity {
        cmd.uid(uid).gid(gid);
    }
    super::lifetime::die_with_parent(&mut cmd);
    // SAFETY: only async-signal-safe calls (dup2, fcntl) between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            if channel == 3 {
                // dup2 onto itself keeps close-on-exec: clear it.
                if libc::fcntl(3, libc::F_SETFD, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::dup2(channel, 3) != 3 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut c = spec.confinement.clone();
    c.bind_any = true;
    c.prepare().map_err(|e| e.to_string())?.apply(&mut cmd);
    Ok(cmd)
}

/// Reads the zygote's messages until its channel ends; `Some` instant it became ready.
fn read(shared: &Shared, life: &Arc<Life>, pid: u32) -> Option<Instant> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut ready_at = None;
    let started = Instant::now();
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return ready_at;
        }
        // Looked at every 200 ms: a stop asked for while it imports ends it too.
        if !wait_readable(&life.chan, Duration::from_millis(200)) {
            if ready_at.is_none() && started.elapsed() > READY_TIMEOUT {
                tracing::error!(pid, "the kernel fork server was not ready in time");
                return None;
            }
            continue;
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let got = rustix::net::recvmsg(
            &life.chan,
            &mut [IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        );
        let n = match got {
            Ok(m) if m.bytes > 0 => m.bytes,
            Ok(_) => return ready_at,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => {
                tracing::error!(error = %e, "the kernel fork server's channel failed");
                return ready_at;
            }
        };
        let mut fds: Vec<OwnedFd> = Vec::new();
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(each) = m {
                fds.extend(each);
            }
        }
        let Ok(message) = serde_json::from_slice::<Value>(&buf[..n.min(buf.len())]) else {
            tracing::error!("the kernel fork server sent what is not JSON");
            return ready_at;
        };
        if let Some(r) = message.get("ready") {
            tracing::info!(
                pid,
                modules = r["modules"].as_u64().unwrap_or(0),
                seconds = r["seconds"].as_f64().unwrap_or(0.0),
                unimportable = r["unimportable"].as_array().map_or(0, Vec::len),
                "the kernel fork server is ready"
            );
            ready_at = Some(Instant::now());
            *shared.life.lock().expect("life") = Some(life.clone());
            set_state(shared, State::Ready);
        } else if let Some(child) = message.get("forked").and_then(Value::as_u64) {
            let child = child as u32;
            shared.exits.lock().expect("exits").remove(&child);
            // The pid the gateway will signal is the one its pidfd names, a child of this
            // zygote's: never a number the zygote merely says.
            let reply = match fds.pop() {
                Some(pidfd) if pid_of(&pidfd) == Some(child) && parent_of(child) == Some(pid) => {
                    Reply::Forked(child, pidfd)
                }
                _ => {
                    tracing::error!(pid, "the kernel fork server named a process not its child");
                    Reply::Refused("not its child".into())
                }
            };
            answer(life, &message, reply);
        } else if let Some(why) = message.get("refused").and_then(Value::as_str) {
            answer(life, &message, Reply::Refused(why.to_owned()));
        } else if let Some(child) = message.get("exited").and_then(Value::as_u64) {
            let status = message["status"].as_i64().unwrap_or(0) as i32;
            if life
                .orphans
                .lock()
                .expect("orphans")
                .remove(&(child as u32))
            {
                continue;
            }
            let mut exits = shared.exits.lock().expect("exits");
            // Bounded: statuses nobody takes (a supervisor gone) are not kept for ever.
            if exits.len() > 4096 {
                exits.clear();
            }
            exits.insert(child as u32, status);
        }
    }
}

/// Hands `reply` to the fork waiting for it; a child nobody waits for any more (its fork timed
/// out, and its kernel was started otherwise) is killed through its pidfd.
fn answer(life: &Life, message: &Value, reply: Reply) {
    let id = message["id"].as_u64().unwrap_or(0);
    let waiting = life.waiting.lock().expect("waiting").remove(&id);
    match (waiting, reply) {
        (Some(tx), reply) => {
            let _ = tx.send(reply);
        }
        (None, Reply::Forked(child, pidfd)) => {
            tracing::warn!(
                pid = child,
                "a kernel forked after its fork timed out: killed"
            );
            life.orphans.lock().expect("orphans").insert(child);
            let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
        }
        (None, Reply::Refused(_)) => {}
    }
}

/// The pid a pidfd refers to (its `fdinfo`).
fn pid_of(pidfd: &OwnedFd) -> Option<u32> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("Pid:"))?
        .trim()
        .parse()
        .ok()
}

/// The parent of process `pid`.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Whether `fd` has something to read (or its end) within `within`.
fn wait_readable(fd: &OwnedFd, within: Duration) -> bool {
    let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
    let t = rustix::time::Timespec {
        tv_sec: within.as_secs() as i64,
        tv_nsec: within.subsec_nanos() as i64,
    };
    loop {
        match rustix::event::poll(&mut fds, Some(&t)) {
            Ok(n) => return n > 0,
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return false,
        }
    }
}

impl AsFd for Forked {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interpreter_is_the_console_scripts() {
        let pip = "#!/venv/bin/python3.11\n# -*- coding: utf-8 -*-\nimport re\n";
        assert_eq!(interpreter_in(pip), Some("/venv/bin/python3.11".into()));
        let with_flag = "#!/venv/bin/python -E\nimport x\n";
        assert_eq!(interpreter_in(with_flag), Some("/venv/bin/python".into()));
        let long = "#!/bin/sh\n'''exec' \"/a very/long/bin/python3\" \"$0\" \"$@\"\n' '''\n";
        assert_eq!(
            interpreter_in(long),
            Some("/a very/long/bin/python3".into())
        );
        let unquoted = "#!/bin/sh\n'''exec' /long/bin/python \"$0\" \"$@\"\n";
        assert_eq!(interpreter_in(unquoted), Some("/long/bin/python".into()));
        // No Python console script: spawned.
        for text in [
            "#!/bin/sh\nexec python -m iac_code \"$@\"\n",
            "#!/usr/bin/env python3\n",
            "#!python\n",
            "\u{7f}ELF\u{2}\u{1}",
            "",
        ] {
            assert_eq!(interpreter_in(text), None, "{text:?}");
        }
    }

    /// What a pidfd the zygote sends is checked against: the process it names, and whose
    /// child that is.
    #[test]
    fn a_pidfd_names_its_process_and_the_process_its_parent() {
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep");
        let pid = rustix::process::Pid::from_raw(child.id() as i32).expect("a pid");
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())
            .expect("pidfd_open");
        assert_eq!(pid_of(&pidfd), Some(child.id()));
        assert_eq!(parent_of(child.id()), Some(std::process::id()));
        assert_ne!(parent_of(std::process::id()), Some(std::process::id()));
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(parent_of(child.id()), None);
    }

    /// The trace the first-turn test counts: a module imported after it is set is named, one
    /// imported before is not. (The fork server's own source, run by the system's Python.)
    #[test]
    fn the_late_import_trace_names_a_module_imported_after_the_fork() {
        let script = "import sys, json\n\
            g = {'__name__': 'zygote'}\n\
            exec(sys.stdin.read(), g)\n\
            g['report_late_imports']()\n\
            import json\n\
            import wave\n";
        let mut child = Command::new("python3")
            .args(["-c", script])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("python3");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(SOURCE.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("iac-code-agui zygote: late import wave\n"),
            "{err}"
        );
        assert!(!err.contains("late import json"), "{err}");
    }

    /// A fork server that cannot start (here an interpreter that exits at once) is started
    /// again after its back-off, and a fork meanwhile is refused, so the kernel is spawned.
    #[test]
    fn a_fork_server_that_cannot_start_is_retried_and_forks_nothing() {
        let server = ForkServer::start(ServerSpec {
            python: PathBuf::from("/bin/false"),
            env: Vec::new(),
            identity: None,
            confinement: Confinement::runtime(Path::new("/bin/false")),
        });
        let start = Instant::now();
        while server.counts().1 < 2 {
            assert!(start.elapsed() < Duration::from_secs(10), "{server:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_ne!(server.state(), State::Ready);
        assert!(!server.wait_ready(Duration::from_millis(100)));
        let ruleset = Confinement::runtime(Path::new("/bin/false"))
            .prepare()
            .expect("this machine confines");
        let req = ForkRequest {
            argv: vec!["k".into()],
            env: Vec::new(),
            cwd: PathBuf::from("/"),
        };
        let e = server
            .fork(&req, &ruleset)
            .expect_err("nothing to fork from");
        assert!(e.contains("not ready"), "{e}");
        assert_eq!(server.counts().0, 0);
        server.stop();
    }

    /// Run from standard input, Python would import a forked kernel's modules from its working
    /// directory (its user's HOME) first: the fork server takes that entry off the path.
    #[test]
    fn no_module_is_imported_from_the_working_directory() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("wave.py"), "print('HIJACKED')\n").unwrap();
        std::fs::write(dir.path().join("zygote.py"), SOURCE).unwrap();
        let run = |code: &str| {
            Command::new("python3")
                .args(["-s", "-c", code])
                .current_dir(dir.path())
                .output()
                .expect("python3")
        };
        let out = run("import sys\n\
            exec(open('zygote.py').read(), {'__name__': 'zygote'})\n\
            import wave\nprint('imported', wave.__file__)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{out:?}");
        assert!(
            !text.contains("HIJACKED") && text.contains("imported /"),
            "{text}"
        );
        // Without the fork server's source the working directory's module would be taken.
        let out = run("import wave");
        assert!(String::from_utf8_lossy(&out.stdout).contains("HIJACKED"));
    }

    /// An answer goes to the fork waiting for its id; a child whose fork no longer waits (it
    /// timed out, and its kernel was started otherwise) is killed, and its exit is nobody's.
    #[test]
    fn an_answer_goes_to_its_fork_and_a_child_nobody_waits_for_is_killed() {
        let (chan, _other) = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let life = Life {
            chan,
            waiting: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            unanswered: std::sync::atomic::AtomicU32::new(0),
            orphans: Mutex::new(std::collections::HashSet::new()),
            gone: AtomicBool::new(false),
        };
        let sleeper = || {
            let child = Command::new("sleep").arg("30").spawn().expect("sleep");
            let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
            let pidfd =
                rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).unwrap();
            (child, pidfd)
        };
        // Waited for: delivered, alive.
        let (mut wanted, pidfd) = sleeper();
        let (tx, rx) = mpsc::channel();
        life.waiting.lock().unwrap().insert(7, tx);
        answer(
            &life,
            &json!({"id": 7, "forked": wanted.id()}),
            Reply::Forked(wanted.id(), pidfd),
        );
        assert!(matches!(rx.try_recv(), Ok(Reply::Forked(p, _)) if p == wanted.id()));
        assert!(wanted.try_wait().unwrap().is_none());
        // Nobody waits for id 8 any more: killed.
        let (mut orphan, pidfd) = sleeper();
        answer(
            &life,
            &json!({"id": 8, "forked": orphan.id()}),
            Reply::Forked(orphan.id(), pidfd),
        );
        let status = orphan.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(life.orphans.lock().unwrap().contains(&orphan.id()));
        let _ = wanted.kill();
        let _ = wanted.wait();
    }

    /// A fork server that says it is ready and then never answers: each fork is refused after
    /// its timeout (the kernel is spawned instead), and after two in a row it is started again.
    #[test]
    fn a_fork_server_that_stops_answering_is_started_again() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        // It reads its requests (so sends never fill its channel) and answers none.
        let mute = dir.path().join("mute");
        std::fs::write(
            &mute,
            "#!/bin/sh\nexec python3 -c 'import socket\n\
             s = socket.socket(fileno=3)\n\
             s.send(b\"{\\\"ready\\\": {}}\")\n\
             while s.recv(1 << 18): pass'\n",
        )
        .unwrap();
        std::fs::set_permissions(&mute, std::fs::Permissions::from_mode(0o755)).unwrap();
        let python = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .unwrap();
        let python = PathBuf::from(String::from_utf8_lossy(&python.stdout).trim());
        let mut confinement = Confinement::runtime(&python);
        confinement.read_only.push(dir.path().to_path_buf());
        let server = ForkServer::start(ServerSpec {
            python: mute,
            env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
            identity: None,
            confinement: confinement.clone(),
        });
        assert!(server.wait_ready(Duration::from_secs(20)), "{server:?}");
        let ruleset = confinement.prepare().expect("this machine confines");
        let req = ForkRequest {
            argv: vec!["k".into()],
            env: Vec::new(),
            cwd: PathBuf::from("/"),
        };
        for _ in 0..UNANSWERED_LIMIT {
            let e = server.fork(&req, &ruleset).expect_err("never answered");
            assert!(e.contains("did not answer"), "{e}");
        }
        let start = Instant::now();
        while server.counts().1 < 1 {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "not restarted: {server:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(server.counts().0, 0);
        server.stop();
    }

    #[test]
    fn the_preload_list_names_modules_only() {
        let names: Vec<&str> = PRELOAD
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        assert!(names.len() > 10, "{}", names.len());
        for n in names {
            assert!(
                n.split('.')
                    .all(|p| !p.is_empty()
                        && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')),
                "{n}"
            );
        }
    }
}
