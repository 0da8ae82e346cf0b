//! `--kernel-isolation user` with the real kernel and the scripted fake LLM, through the binary:
//! each user's runs in a kernel of their own (placement), their workspaces under their own root,
//! a kernel stopped for idleness back with its session, and the probes of the tenants' red team
//! run from one user's agent against another's, each denied.
//!
//! As root (CI), kernels run as `nobody` (`--kernel-user 65534`) from a venv that user can read
//! (`IAC_CODE_AGUI_KERNEL_BIN_SHARED`, installed by the test script); otherwise as the test's uid.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::free_port;
use testkit::real_kernel::alive;
use testkit::real_kernel::KernelEnv;
use testkit::sse::{assert_valid_run, post, RunResult};

use crate::support::{client, get_as, post_turn_as, resume_body};

pub(crate) const TOKEN: &str = "tenants-service-token";

/// Makes `p` (and its parents up to the environment's directory) a directory the kernels' uid
/// may enter without listing it.
pub(crate) fn passable(p: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::create_dir_all(p).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o711)).unwrap();
}

/// A gateway process with users' own kernels, in front of the real kernel of `env`, its log in
/// a file.
pub(crate) struct Isolated {
    child: Child,
    pub url: String,
    pub log: PathBuf,
}

impl Isolated {
    /// `seats` kernels at most, its state in `state`, the service token [`TOKEN`], `extra` flags.
    pub(crate) async fn start(
        env: &KernelEnv,
        state: &Path,
        seats: usize,
        extra: &[String],
    ) -> Isolated {
        Isolated::launch(env, state, true, seats, extra, &[]).await
    }

    /// [`Isolated::start`], or with `isolated` false the same gateway in `shared` mode (one
    /// kernel for all, as the gateway's uid): the control that shows a probe would catch a leak.
    pub(crate) async fn launch(
        env: &KernelEnv,
        state: &Path,
        isolated: bool,
        seats: usize,
        extra: &[String],
        vars: &[(&str, &str)],
    ) -> Isolated {
        passable(env.dir.path());
        passable(&env.ws());
        passable(state);
        let port = free_port();
        let log = env.dir.path().join(format!("gateway-{port}.log"));
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_iac-code-agui"));
        cmd.args(["--port", &port.to_string()])
            .args(["--a2a-command", &kernel_command()])
            .args(["--kernels", &seats.to_string()])
            .arg("--state-dir")
            .arg(state)
            .args(extra)
            .envs(env.vars())
            .env("IAC_CODE_AGUI_AUTH_TOKEN", TOKEN)
            .envs(vars.iter().copied())
            .env(
                "IAC_CODE_AGUI_LOG",
                "iac_code_agui=debug,kernel=debug,a2a=info,warn",
            )
            .env_remove("IAC_CODE_AGUI_A2A_URL")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if isolated {
            cmd.args(["--kernel-isolation", "user"]);
            if is_root() {
                cmd.args(["--kernel-user", "65534"]);
            }
        }
        let child = cmd.spawn().unwrap();
        let g = Isolated {
            child,
            url: format!("http://127.0.0.1:{port}/"),
            log,
        };
        let start = Instant::now();
        while client()
            .get(format!("{}health", g.url))
            .send()
            .await
            .is_err()
        {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "never listened: {}",
                g.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if isolated && !extra.windows(2).any(|w| w == ["--kernel-start", "spawn"]) {
            g.forking().await;
        }
        g
    }

    /// Waits for the kernel fork server (users' kernels are spawned until it is ready): the
    /// tier's kernels are forked, as they are by default.
    pub(crate) async fn forking(&self) {
        let start = Instant::now();
        loop {
            let h = self.health().await;
            if h["kernel"]["forkServer"]["state"] == "ready" {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "the fork server is not ready: {h}\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `/health` as the operator sees it (pids included).
    pub(crate) async fn health(&self) -> Value {
        let h = [("authorization", format!("Bearer {TOKEN}"))];
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        get_as(&format!("{}health", self.url), &h).await.1
    }

    /// The seats of `/health` that hold a kernel.
    pub(crate) async fn kernels(&self) -> Vec<Value> {
        let h = self.health().await;
        h["kernel"]["slots"]
            .as_array()
            .unwrap_or_else(|| panic!("no seats: {h}"))
            .iter()
            .filter(|s| s["state"] != "vacant")
            .cloned()
            .collect()
    }

    /// The gateway's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and reaped.
    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Isolated {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The service token acting for `user`.
pub(crate) fn as_user(user: &str) -> Vec<(&'static str, String)> {
    vec![
        ("authorization", format!("Bearer {TOKEN}")),
        ("x-iac-code-user", user.to_owned()),
    ]
}

pub(crate) fn refs<'a>(h: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    h.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// The `iac-code` a kernel of the isolation tier runs: readable by the kernels' user.
pub(crate) fn kernel_command() -> String {
    let dir = std::env::var("IAC_CODE_AGUI_KERNEL_BIN_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|_| testkit::real_kernel::kernel_bin_dir());
    let p = dir.join("iac-code");
    assert!(p.is_file(), "no kernel at {}", p.display());
    p.display().to_string()
}

pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    #[allow(unsafe_code)]
    let uid = unsafe { libc::geteuid() };
    uid == 0
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A gateway with users' own kernels (`seats` of them) in an environment of its own, the
/// service token, an admin listener, and `extra` flags.
pub(crate) struct Tenanted {
    /// First: the gateway is stopped before its environment is removed.
    pub gw: Isolated,
    pub env: KernelEnv,
    pub url: String,
    /// The admin listener (metrics).
    pub admin: u16,
}

impl Tenanted {
    pub(crate) async fn start(seats: usize, extra: &[&str]) -> Tenanted {
        Self::start_with(true, seats, extra).await
    }

    /// [`Tenanted::start`], or with `isolated` false in `shared` mode (see [`Isolated::launch`]).
    pub(crate) async fn start_with(isolated: bool, seats: usize, extra: &[&str]) -> Tenanted {
        Self::start_env(isolated, seats, extra, &[]).await
    }

    /// [`Tenanted::start_with`], the gateway's environment with `vars` besides.
    pub(crate) async fn start_env(
        isolated: bool,
        seats: usize,
        extra: &[&str],
        vars: &[(&str, &str)],
    ) -> Tenanted {
        Self::start_in(KernelEnv::new().await, isolated, seats, extra, vars).await
    }

    /// [`Tenanted::start_env`] in `env`.
    pub(crate) async fn start_in(
        env: KernelEnv,
        isolated: bool,
        seats: usize,
        extra: &[&str],
        vars: &[(&str, &str)],
    ) -> Tenanted {
        let admin = free_port();
        let extra: Vec<String> = ["--metrics-listen".to_owned(), format!("127.0.0.1:{admin}")]
            .into_iter()
            .chain(extra.iter().map(|a| (*a).to_owned()))
            .collect();
        let gw = Isolated::launch(&env, &env.state_dir(), isolated, seats, &extra, vars).await;
        let url = gw.url.clone();
        Tenanted {
            gw,
            env,
            url,
            admin,
        }
    }

    pub(crate) fn headers(user: &str) -> Vec<(&'static str, String)> {
        as_user(user)
    }

    /// `user`'s workspace root.
    pub(crate) fn root_of(&self, user: &str) -> PathBuf {
        self.env.ws().join(kernel::tenant::user_key(Some(user)))
    }

    pub(crate) async fn health(&self) -> Value {
        self.gw.health().await
    }

    /// What the admin listener's `/metrics` says.
    pub(crate) async fn metrics(&self) -> String {
        client()
            .get(format!("http://127.0.0.1:{}/metrics", self.admin))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The pids of the kernels alive, in seat order.
    pub(crate) async fn kernel_pids(&self) -> Vec<u64> {
        let h = self.health().await;
        h["kernel"]["slots"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|s| s["pid"].as_u64())
            .collect()
    }

    /// A text turn of `user` on `thread` (run `run`) in their workspace `p`, which succeeded.
    pub(crate) async fn hello(&self, user: &str, thread: &str, run: &str) -> RunResult {
        let r = self
            .turn(
                user,
                thread,
                run,
                "Hi. scenario:text",
                &self.root_of(user).join("p"),
            )
            .await;
        assert_eq!(r.last()["outcome"]["type"], "success", "{user}: {}", r.raw);
        r
    }

    /// A turn of `user` on `thread` in `cwd`.
    pub(crate) async fn turn(
        &self,
        user: &str,
        thread: &str,
        run: &str,
        msg: &str,
        cwd: &Path,
    ) -> RunResult {
        let h = Self::headers(user);
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        post_turn_as(&self.url, thread, run, msg, &cwd.display().to_string(), &h).await
    }

    /// Runs `command` with `user`'s agent's bash tool (the turn's interrupt allowed): what the
    /// fake LLM was told the tool said.
    pub(crate) async fn bash(&self, user: &str, thread: &str, cwd: &Path, command: &str) -> String {
        self.tool(user, thread, cwd, "bash", json!({ "command": command }))
            .await
    }

    /// Runs tool `name` with `args` through `user`'s agent on a new `thread`, its question (when
    /// the kernel asks one) allowed: what the fake LLM was told the tool said. The LLM's requests
    /// of the turn are those of scenario [`scenario_of`]`(thread)`.
    pub(crate) async fn tool(
        &self,
        user: &str,
        thread: &str,
        cwd: &Path,
        name: &str,
        args: Value,
    ) -> String {
        let scenario = scenario_of(thread);
        self.env.llm.script(
            &scenario,
            testkit::fake_llm::Plan::tool("Probing.", name, args),
        );
        let r1 = self
            .turn(
                user,
                thread,
                &format!("{thread}-1"),
                &format!("Go. scenario:{scenario}"),
                cwd,
            )
            .await;
        assert_valid_run(&r1, thread, &format!("{thread}-1"));
        // A tool that only reads may run without a question.
        if r1.last()["outcome"]["type"] == "success" {
            return tool_result(&r1);
        }
        assert_eq!(r1.last()["outcome"]["type"], "interrupt", "{}", r1.raw);
        let id = r1.last()["outcome"]["interrupts"][0]["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let allow = json!([{"interruptId": id, "status": "resolved", "payload": {"decision": "allow_once"}}]);
        let h = Self::headers(user);
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let body = resume_body(
            thread,
            &format!("{thread}-2"),
            &cwd.display().to_string(),
            "inv-1",
            allow,
        );
        let r2 = post(&self.url, &body, &h).await;
        assert_valid_run(&r2, thread, &format!("{thread}-2"));
        assert_eq!(r2.last()["outcome"]["type"], "success", "{}", r2.raw);
        tool_result(&r2)
    }
}

impl Tenanted {
    /// The pid of `user`'s kernel: the one whose configuration directory is that user's (the
    /// test, unconfined, reads every kernel's environment).
    pub(crate) async fn kernel_of(&self, user: &str) -> Option<u32> {
        let mine = format!("kernels/{}/", kernel::tenant::user_key(Some(user)));
        self.kernel_pids().await.into_iter().find_map(|pid| {
            // A forked kernel's environment block is the fork server's: its working directory
            // (its HOME) tells whose it is.
            let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).ok()?;
            let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            let environ = String::from_utf8_lossy(&environ);
            let spawned = environ
                .split('\0')
                .any(|v| v.starts_with("IAC_CODE_CONFIG_DIR=") && v.contains(&mine));
            (spawned || format!("{}/", cwd.display()).contains(&mine)).then_some(pid as u32)
        })
    }

    /// Runs each of `probes` (a label, a bash command) in one bash tool call of `user`'s agent:
    /// what each printed, its errors too, by label. By `bash`, not the tool's `sh`: `/dev/tcp`.
    pub(crate) async fn probes(
        &self,
        user: &str,
        thread: &str,
        cwd: &Path,
        probes: &[(&str, String)],
    ) -> HashMap<String, String> {
        let script: String = probes
            .iter()
            .map(|(label, cmd)| format!("echo '@@@{label}'; ( {cmd} ) 2>&1\n"))
            .collect();
        let command = format!("bash <<'IAC_PROBES'\n{script}IAC_PROBES\n");
        let seen = self.bash(user, thread, cwd, &command).await;
        let out: HashMap<String, String> = seen
            .split("@@@")
            .skip(1)
            .map(|part| {
                let (label, rest) = part.split_once('\n').unwrap_or((part, ""));
                (label.trim().to_owned(), rest.to_owned())
            })
            .collect();
        for (label, _) in probes {
            assert!(
                out.contains_key(*label),
                "probe {label} did not run: {seen}"
            );
        }
        out
    }

    /// The bodies of the fake LLM's requests of `scenario` (at least one).
    pub(crate) fn llm_bodies(&self, scenario: &str) -> Vec<String> {
        let bodies: Vec<String> = self
            .env
            .llm
            .requests()
            .into_iter()
            .filter(|r| r.scenario == scenario)
            .map(|r| r.body.to_string())
            .collect();
        assert!(!bodies.is_empty(), "no LLM request of scenario {scenario}");
        bodies
    }
}

/// The fake LLM's scenario of the turns [`Tenanted::tool`] runs on `thread`.
fn scenario_of(thread: &str) -> String {
    format!("probe{}", thread.replace(['-', '_'], ""))
}

/// The TCP port the kernel `pid` listens on (a forked kernel's command line is the fork
/// server's): the loopback listener among its sockets.
pub(crate) fn port_of(pid: u32) -> u16 {
    let inodes: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            let t = target.to_str()?;
            Some(t.strip_prefix("socket:[")?.strip_suffix(']')?.to_owned())
        })
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // local address, state 0A (LISTEN), inode.
            let listening =
                f.get(3) == Some(&"0A") && inodes.iter().any(|i| Some(&i.as_str()) == f.get(9));
            let port = f.get(1)?.split(':').nth(1)?;
            listening
                .then(|| u16::from_str_radix(port, 16).ok())
                .flatten()
        })
        .unwrap_or_else(|| panic!("kernel {pid} listens on no port"))
}

/// The kernel fork server of the gateway `gateway` (its child named so on its command line).
pub(crate) fn fork_server_of(gateway: u32) -> u32 {
    children_of(gateway, "iac-code-agui-zygote")
        .into_iter()
        .next()
        .expect("a fork server")
}

/// The parent of process `pid` (none once it is gone).
pub(crate) fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The children of `parent` whose command line contains `marker`.
fn children_of(parent: u32, marker: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            parent_of(pid) == Some(parent) && String::from_utf8_lossy(&cmdline).contains(marker)
        })
        .collect()
}

/// The kernel the gateway `gateway` started itself (`shared` mode: `/health` names no pid).
fn kernel_child(gateway: u32) -> u32 {
    let kernels = children_of(gateway, "a2a");
    assert_eq!(kernels.len(), 1, "{kernels:?}");
    kernels[0]
}

/// The regular files beneath `dir`, those beneath `except` aside.
fn files_under(dir: &Path, except: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let kind = e.file_type().unwrap();
        if p.starts_with(except) {
            continue;
        } else if kind.is_dir() {
            out.extend(files_under(&p, except));
        } else if kind.is_file() {
            out.push(p);
        }
    }
    out
}

/// Opens `dir` to every uid (directories listable, files readable), `except` aside: what keeps a
/// kernel out of it is then its confinement alone, not the modes (kernels as `nobody` would
/// otherwise be kept out of root's 0700 state by the modes too).
fn open_to_all(dir: &Path, except: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(dir).unwrap().permissions().mode();
    chmod(dir, (mode & 0o7777) | 0o755);
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        let kind = e.file_type().unwrap();
        if p.starts_with(except) {
            continue;
        } else if kind.is_dir() {
            open_to_all(&p, except);
        } else if kind.is_file() {
            let mode = e.metadata().unwrap().permissions().mode();
            chmod(&p, (mode & 0o7777) | 0o644);
        }
    }
}

/// The kernel session ids a run's answer announced.
pub(crate) fn sessions(r: &RunResult) -> Vec<String> {
    r.events
        .iter()
        .filter(|e| e["name"] == "iac-code.session.v1")
        .filter_map(|e| e["value"]["sessionId"].as_str().map(str::to_owned))
        .collect()
}

/// The text of the tool result of a run's answer.
pub(crate) fn tool_result(r: &RunResult) -> String {
    r.events
        .iter()
        .filter(|e| e["type"] == "TOOL_CALL_RESULT")
        .filter_map(|e| e["content"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Two users' turns run in two kernel processes, each user's threads in one; each user's work
/// lands under their own root; a `cwd` outside it is refused before anything is made; the
/// capabilities name the caller's root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_users_turns_run_in_a_kernel_of_their_own() {
    let t = Tenanted::start(2, &[]).await;
    let (alice_root, bob_root) = (t.root_of("alice"), t.root_of("bob"));
    let a1 = t
        .turn(
            "alice",
            "a-1",
            "r1",
            "Hi. scenario:text",
            &alice_root.join("p1"),
        )
        .await;
    assert_valid_run(&a1, "a-1", "r1");
    assert_eq!(a1.last()["outcome"]["type"], "success", "{}", a1.raw);
    let after_alice = t.kernel_pids().await;
    assert_eq!(after_alice.len(), 1, "{}", t.health().await);
    let a2 = t
        .turn(
            "alice",
            "a-2",
            "r1",
            "Again. scenario:text",
            &alice_root.join("p2"),
        )
        .await;
    assert_eq!(a2.last()["outcome"]["type"], "success", "{}", a2.raw);
    assert_eq!(
        t.kernel_pids().await,
        after_alice,
        "alice's threads share her kernel"
    );
    let b1 = t
        .turn(
            "bob",
            "b-1",
            "r1",
            "Hi. scenario:text",
            &bob_root.join("p1"),
        )
        .await;
    assert_eq!(b1.last()["outcome"]["type"], "success", "{}", b1.raw);
    let both = t.kernel_pids().await;
    assert_eq!(both.len(), 2);
    // /health counts the seats and names no user.
    let h = t.health().await;
    assert_eq!(
        (
            &h["kernel"]["isolation"],
            &h["kernel"]["size"],
            &h["kernel"]["alive"]
        ),
        (&json!("user"), &json!(2), &json!(2)),
        "{h}"
    );
    // Both kernels were forked by the fork server (the tier's default start).
    assert_eq!(
        (&h["kernel"]["start"], &h["kernel"]["forkServer"]["forked"]),
        (&json!("fork"), &json!(2)),
        "{h}"
    );
    assert!(
        !h.to_string().contains("alice")
            && !h
                .to_string()
                .contains(&kernel::tenant::user_key(Some("alice")))
    );
    assert!(both.contains(&after_alice[0]) && both[0] != both[1]);
    // Directories: each user's root is theirs, 0700.
    use std::os::unix::fs::MetadataExt as _;
    for root in [&alice_root, &bob_root] {
        let m = std::fs::metadata(root).unwrap();
        assert_eq!(m.mode() & 0o777, 0o700, "{}", root.display());
        if is_root() {
            assert_eq!(m.uid(), 65534);
        }
    }
    // Bob names alice's folder, the root itself, a symlink to hers: 400 before anything.
    let link = bob_root.join("to-alice");
    std::os::unix::fs::symlink(&alice_root, &link).unwrap();
    for cwd in [
        alice_root.join("p1"),
        t.env.ws(),
        link.join("p1"),
        alice_root.join("new"),
    ] {
        let r = t.turn("bob", "b-x", "r1", "scenario:text", &cwd).await;
        assert_eq!(r.status, 400, "{}: {}", cwd.display(), r.raw);
        assert_eq!(r.error_code(), Some("INVALID_INPUT"));
    }
    assert!(!alice_root.join("new").exists());
    // The capabilities name each caller's own root.
    for (user, root) in [("alice", &alice_root), ("bob", &bob_root)] {
        let h = Tenanted::headers(user);
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let (_, caps) = get_as(&format!("{}capabilities", t.url), &h).await;
        assert_eq!(
            caps["custom"]["iacCode"]["workspaceRoot"],
            json!(root.display().to_string())
        );
        assert_eq!(caps["execution"]["sandboxed"], true);
    }
}

/// Bob's agent, through its own bash tool, goes for alice's files, her kernel's process and
/// port, and the gateway's state: every probe is denied, and bob's own work runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_users_agent_cannot_reach_anothers_files_kernel_or_the_gateways_state() {
    let t = Tenanted::start(2, &[]).await;
    let (alice_root, bob_root) = (t.root_of("alice"), t.root_of("bob"));
    let alice_ws = alice_root.join("proj");
    let out = t
        .bash(
            "alice",
            "a-secret",
            &alice_ws,
            "echo alice-secret-42 > secret.txt && cat secret.txt",
        )
        .await;
    assert!(out.contains("alice-secret-42"), "{out}");
    let h = t.health().await;
    let alice_pid = h["kernel"]["slots"][0]["pid"]
        .as_u64()
        .expect("alice's kernel");
    let bob_ws = bob_root.join("proj");
    let state = t.env.state_dir();
    let probe = format!(
        "cat {a}/secret.txt; echo ===; ls {a}; echo ===; echo planted > {a}/planted.txt; echo ===; \
         cat /proc/{pid}/environ | tr '\\0' '\\n' | grep -c IACCODE_A2A_HTTP_TOKEN; echo ===; \
         kill -0 {pid} && echo signalled; echo ===; ls {state}; echo ===; \
         echo mine > own.txt && cat own.txt",
        a = alice_ws.display(),
        pid = alice_pid,
        state = state.display(),
    );
    let seen = t.bash("bob", "b-probe", &bob_ws, &probe).await;
    let parts: Vec<&str> = seen.split("===").collect();
    assert_eq!(parts.len(), 7, "{seen}");
    assert!(
        !parts[0].contains("alice-secret-42"),
        "bob read alice's file: {seen}"
    );
    assert!(
        !parts[1].contains("secret.txt"),
        "bob listed alice's folder: {seen}"
    );
    assert!(
        !alice_ws.join("planted.txt").exists(),
        "bob wrote into alice's folder"
    );
    assert!(
        !parts[3].trim().starts_with('1'),
        "bob read alice's kernel's token: {seen}"
    );
    assert!(
        !parts[4].contains("signalled"),
        "bob signalled alice's kernel: {seen}"
    );
    assert!(
        !parts[5].contains("threads"),
        "bob listed the gateway's state: {seen}"
    );
    assert!(
        parts[6].contains("mine"),
        "bob's own work did not run: {seen}"
    );
    assert_eq!(
        std::fs::read_to_string(bob_ws.join("own.txt")).unwrap(),
        "mine\n"
    );
}

/// A user's kernel without runs for `--kernel-idle-stop` is stopped; their next turn starts
/// another, which restores the session: the conversation goes on (the second turn reads the
/// first turn's file), and the metrics count it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_users_kernel_stops_and_comes_back_with_its_session() {
    let t = Tenanted::start(2, &["--kernel-idle-stop", "2"]).await;
    let ws = t.root_of("carol").join("proj");
    let out = t
        .bash(
            "carol",
            "c-1",
            &ws,
            "echo first-turn > note.txt && cat note.txt",
        )
        .await;
    assert!(out.contains("first-turn"), "{out}");
    let r0 = t
        .turn("carol", "c-1", "c-1-0", "Still there? scenario:text", &ws)
        .await;
    assert_eq!(r0.last()["outcome"]["type"], "success", "{}", r0.raw);
    let first_session = sessions(&r0).pop().expect("a session");
    let first = t.kernel_pids().await;
    assert_eq!(first.len(), 1);
    let start = Instant::now();
    while !t.kernel_pids().await.is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            t.health().await
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The same thread, a new turn: another kernel, the session restored, the file there.
    let scenario = "probec1again";
    t.env.llm.script(
        scenario,
        testkit::fake_llm::Plan::tool("Reading.", "bash", json!({"command": "cat note.txt"})),
    );
    let r = t
        .turn(
            "carol",
            "c-1",
            "c-1-3",
            &format!("Again. scenario:{scenario}"),
            &ws,
        )
        .await;
    assert_valid_run(&r, "c-1", "c-1-3");
    // A command that only reads runs without a question.
    assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
    assert!(tool_result(&r).contains("first-turn"), "{}", r.raw);
    let restored = sessions(&r);
    assert!(
        !restored.is_empty() && restored.iter().all(|s| *s == first_session),
        "{}",
        r.raw
    );
    let again = t.kernel_pids().await;
    assert_eq!(again.len(), 1);
    assert_ne!(again, first);
    let metrics = t.metrics().await;
    for line in [
        "agui_kernels_started_total 2",
        "agui_kernels_stopped_total 1",
        "agui_kernels_restored_total 1",
        "agui_kernels_alive 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} missing:\n{metrics}"
        );
    }
    assert!(!metrics.contains("carol"));
}

/// Every kernel running another user's turn: a new user is told so before any stream, with a
/// time to retry and a code of its own; the user with the kernel is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_user_is_refused_while_every_kernel_runs_another_users_turn() {
    let t = Tenanted::start(1, &[]).await;
    let ws = t.root_of("dave").join("p");
    let url = t.url.clone();
    let cwd = ws.display().to_string();
    let slow = tokio::spawn(async move {
        let h = Tenanted::headers("dave");
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        post_turn_as(&url, "d-1", "r1", "Slowly. scenario:slow", &cwd, &h).await
    });
    // Dave's turn is running once his kernel is.
    let start = Instant::now();
    loop {
        let h = t.health().await;
        if h["kernel"]["slots"][0]["state"] == "ready" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "{h}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let r = t
        .turn(
            "erin",
            "e-1",
            "r1",
            "Me too. scenario:text",
            &t.root_of("erin").join("p"),
        )
        .await;
    assert_eq!(r.status, 503, "{}", r.raw);
    assert_eq!(r.error_code(), Some("KERNELS_BUSY"));
    assert!(
        r.headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("retry-after")),
        "{:?}",
        r.headers
    );
    slow.abort();
}

/// The red team's probes, deeper: bob's agent goes for alice's kernel (its port, memory,
/// environment, signals), the gateway (its port, environment, signals, state, configuration file
/// and TLS key, opened to every uid so that only the confinement stands in the way), alice's files
/// through the file tools, and her system prompt (`AGENTS.md`). Each is denied, by the tool's
/// output and by what is left on disk and in `/proc`; alice's next turn runs on the same kernel
/// without bob's instructions, and bob's own work, and his own `AGENTS.md`, carry on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_users_agent_reaches_nothing_of_alices_kernel_the_gateway_or_her_prompt() {
    // The configuration file and the admin listener's TLS key, readable by every uid.
    let conf = tempfile::tempdir().unwrap();
    chmod(conf.path(), 0o755);
    let ca = testkit::tls::Ca::new();
    let (cert, key) = ca.issue(&["127.0.0.1"]);
    let (cert_file, key_file) = (conf.path().join("admin.crt"), conf.path().join("admin.key"));
    std::fs::write(&cert_file, cert).unwrap();
    std::fs::write(&key_file, &key).unwrap();
    let config = conf.path().join("gateway.yaml");
    std::fs::write(
        &config,
        format!(
            "metrics_tls_cert: {}\nmetrics_tls_key: {}\n",
            cert_file.display(),
            key_file.display()
        ),
    )
    .unwrap();
    for f in [&cert_file, &key_file, &config] {
        chmod(f, 0o644);
    }
    let t = Tenanted::start(2, &["--config", &config.display().to_string()]).await;
    let (alice_root, bob_root) = (t.root_of("alice"), t.root_of("bob"));
    let alice_ws = alice_root.join("proj");
    let out = t
        .bash(
            "alice",
            "a-secret",
            &alice_ws,
            "echo alice-secret-42 > secret.txt && cat secret.txt",
        )
        .await;
    assert!(out.contains("alice-secret-42"), "{out}");
    let alice_pid = t.kernel_of("alice").await.expect("alice's kernel");
    let alice_port = port_of(alice_pid);
    let gateway_pid = t.gw.pid();
    let zygote_pid = fork_server_of(gateway_pid);
    let gateway_port: u16 = t
        .url
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // The ports are live: the test itself connects to both.
    for port in [alice_port, gateway_port, t.admin] {
        std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    }
    let state = t.env.state_dir();
    let kernels = state.join("kernels");
    // The threads' documents (targets below) are written from the journal a moment after the
    // turns.
    let start = Instant::now();
    while !state.join("threads").is_dir() && start.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    open_to_all(&state, &kernels);
    let gateway_files = files_under(&state, &kernels);
    let alice_kernel_dir = kernels.join(kernel::tenant::user_key(Some("alice")));
    let alice_kernel_files = files_under(&alice_kernel_dir, Path::new("/nowhere"));
    // The thread's record and transcript are in the journal until it is written out: the
    // targets are the record, or the journal that holds it.
    let has = |want: &str| {
        gateway_files
            .iter()
            .any(|f| f.strip_prefix(&state).unwrap().starts_with(want))
    };
    assert!(has("owner.key"), "{gateway_files:?}");
    assert!(has("threads") || has("journal"), "{gateway_files:?}");
    let holds_secret = |files: &[PathBuf]| {
        files.iter().any(|f| {
            String::from_utf8_lossy(&std::fs::read(f).unwrap()).contains("alice-secret-42")
        })
    };
    assert!(holds_secret(&gateway_files) && holds_secret(&alice_kernel_files));
    let thread_docs: Vec<PathBuf> = gateway_files
        .iter()
        .filter(|f| f.strip_prefix(&state).unwrap().starts_with("threads"))
        .cloned()
        .collect();
    let names = |files: &[PathBuf]| -> String {
        files
            .iter()
            .map(|f| format!("'{}' ", f.display()))
            .collect()
    };
    let marker = "bob-instructions-7731";
    let bob_ws = bob_root.join("proj");
    let seen = t
        .probes(
            "bob",
            "b-attack",
            &bob_ws,
            &[
                (
                    "alice-port",
                    format!("exec 3<>/dev/tcp/127.0.0.1/{alice_port} && echo CONNECTED"),
                ),
                (
                    "gateway-port",
                    format!("exec 3<>/dev/tcp/127.0.0.1/{gateway_port} && echo CONNECTED"),
                ),
                (
                    "admin-port",
                    format!("exec 3<>/dev/tcp/127.0.0.1/{} && echo CONNECTED", t.admin),
                ),
                (
                    "alice-mem",
                    format!("exec 4</proc/{alice_pid}/mem && echo OPENED"),
                ),
                (
                    "alice-environ",
                    format!("tr '\\0' '\\n' < /proc/{alice_pid}/environ"),
                ),
                (
                    "gateway-environ",
                    format!("tr '\\0' '\\n' < /proc/{gateway_pid}/environ"),
                ),
                ("state", format!("cat {}", names(&gateway_files))),
                (
                    "alice-kernel",
                    format!("cat {}", names(&alice_kernel_files)),
                ),
                (
                    "secrets",
                    format!("cat '{}' '{}'", key_file.display(), config.display()),
                ),
                (
                    "owner",
                    thread_docs
                        .iter()
                        .map(|d| format!("printf '{{\"owner\":\"bob\"}}' > '{}'; ", d.display()))
                        .collect(),
                ),
                (
                    "root-agents",
                    format!("echo {marker} > '{}/AGENTS.md'", t.env.ws().display()),
                ),
                (
                    "own-agents",
                    format!("echo {marker} > \"$IAC_CODE_CONFIG_DIR/AGENTS.md\" && echo WROTE"),
                ),
                (
                    "kill",
                    format!("kill -9 {alice_pid}; kill -9 {gateway_pid}"),
                ),
                ("own", "echo mine > own.txt && cat own.txt".into()),
            ],
        )
        .await;
    let all = format!("{seen:#?}");
    for port in ["alice-port", "gateway-port", "admin-port"] {
        assert!(
            !seen[port].contains("CONNECTED"),
            "bob connected to {port}: {all}"
        );
        assert!(seen[port].contains("Permission denied"), "{port}: {all}");
    }
    assert!(
        !seen["alice-mem"].contains("OPENED"),
        "bob opened alice's kernel's memory: {all}"
    );
    assert!(seen["alice-mem"].contains("Permission denied"), "{all}");
    assert!(
        !seen["alice-environ"].contains("IACCODE_A2A_HTTP_TOKEN"),
        "{all}"
    );
    assert!(seen["alice-environ"].contains("Permission denied"), "{all}");
    assert!(
        !seen["gateway-environ"].contains(TOKEN),
        "bob read the gateway's token: {all}"
    );
    assert!(
        seen["gateway-environ"].contains("Permission denied"),
        "{all}"
    );
    for (probe, files) in [
        ("state", &gateway_files),
        ("alice-kernel", &alice_kernel_files),
    ] {
        // Each file denied, or gone since it was listed (the journal moves on).
        assert!(
            seen[probe]
                .lines()
                .all(|l| l.ends_with(": Permission denied")
                    || l.ends_with(": No such file or directory")),
            "bob read some of {probe}: {all}"
        );
        assert!(
            seen[probe].matches("Permission denied").count() * 2 > files.len(),
            "{all}"
        );
        assert!(!seen[probe].contains("alice-secret-42"), "{all}");
    }
    assert_eq!(
        seen["secrets"].matches("Permission denied").count(),
        2,
        "{all}"
    );
    assert!(
        !seen["secrets"].contains("PRIVATE KEY") && !seen["secrets"].contains("metrics_tls"),
        "{all}"
    );
    for doc in &thread_docs {
        let doc: Value = serde_json::from_slice(&std::fs::read(doc).unwrap()).unwrap();
        assert_eq!(
            doc["owner"], "alice",
            "bob rewrote a thread document: {all}"
        );
    }
    assert!(!t.env.ws().join("AGENTS.md").exists(), "{all}");
    assert!(seen["own-agents"].contains("WROTE"), "{all}");
    let bob_agents = kernels
        .join(kernel::tenant::user_key(Some("bob")))
        .join("home/.iac-code/AGENTS.md");
    assert!(std::fs::read_to_string(bob_agents)
        .unwrap()
        .contains(marker));
    assert_eq!(
        seen["kill"].matches("Operation not permitted").count(),
        2,
        "{all}"
    );
    assert!(alive(alice_pid) && alive(gateway_pid), "{all}");
    // The fork server, every kernel's parent (alice's and bob's were forked by it): bob's agent
    // can neither signal it, read it, nor change its limits, priority or CPUs (its children
    // would inherit them), nor alice's kernel's.
    for pid in [alice_pid, t.kernel_of("bob").await.expect("bob's kernel")] {
        assert_eq!(parent_of(pid), Some(zygote_pid));
    }
    let zygote = t
        .probes(
            "bob",
            "b-zygote",
            &bob_ws,
            &[
                (
                    "environ",
                    format!("tr '\\0' '\\n' < /proc/{zygote_pid}/environ"),
                ),
                (
                    "mem",
                    format!("exec 4</proc/{zygote_pid}/mem && echo OPENED"),
                ),
                ("kill", format!("kill -9 {zygote_pid}")),
                ("stop", format!("kill -STOP {zygote_pid}")),
                (
                    "prlimit",
                    format!("prlimit --pid {zygote_pid} --cpu=1:1 && echo CHANGED"),
                ),
                (
                    "renice",
                    format!("renice -n 19 -p {zygote_pid} && echo CHANGED"),
                ),
                (
                    "taskset",
                    format!("taskset -p 1 {zygote_pid} && echo CHANGED"),
                ),
                (
                    "alice-prlimit",
                    format!("prlimit --pid {alice_pid} --nofile=4:4 && echo CHANGED"),
                ),
                (
                    "alice-renice",
                    format!("renice -n 19 -p {alice_pid} && echo CHANGED"),
                ),
                (
                    "own",
                    "ulimit -c 0 && nice -n 1 true && echo MINE".to_owned(),
                ),
            ],
        )
        .await;
    let all = format!("{zygote:?}");
    for probe in ["environ", "mem"] {
        assert!(zygote[probe].contains("Permission denied"), "{all}");
    }
    assert!(!zygote["mem"].contains("OPENED"), "{all}");
    for probe in ["kill", "stop"] {
        assert!(zygote[probe].contains("Operation not permitted"), "{all}");
    }
    for probe in [
        "prlimit",
        "renice",
        "taskset",
        "alice-prlimit",
        "alice-renice",
    ] {
        assert!(!zygote[probe].contains("CHANGED"), "{probe}: {all}");
        assert!(zygote[probe].contains("denied"), "{probe}: {all}");
    }
    assert!(zygote["own"].contains("MINE"), "{all}");
    assert!(alive(zygote_pid), "{all}");
    let limits = std::fs::read_to_string(format!("/proc/{zygote_pid}/limits")).unwrap();
    let cpu = limits
        .lines()
        .find(|l| l.starts_with("Max cpu time"))
        .unwrap();
    assert!(cpu.contains("unlimited"), "{cpu}");
    assert!(seen["own"].contains("mine"), "{all}");
    // The file tools, on alice's absolute paths.
    let read = t
        .tool(
            "bob",
            "b-read",
            &bob_ws,
            "read_file",
            json!({"path": alice_ws.join("secret.txt")}),
        )
        .await;
    assert!(
        !read.contains("alice-secret-42"),
        "bob's read_file read alice's file: {read}"
    );
    let planted = alice_ws.join("planted.txt");
    let wrote = t
        .tool(
            "bob",
            "b-write",
            &bob_ws,
            "write_file",
            json!({"path": planted, "content": "bob\n"}),
        )
        .await;
    assert!(
        !planted.exists(),
        "bob's write_file wrote into alice's folder: {wrote}"
    );
    // Alice's next turn: her kernel, not restarted, and nothing of bob's in what it sends.
    let a = t
        .turn(
            "alice",
            "a-after",
            "r1",
            "Still me. scenario:aliceafter",
            &alice_ws,
        )
        .await;
    assert_eq!(a.last()["outcome"]["type"], "success", "{}", a.raw);
    assert_eq!(t.kernel_of("alice").await, Some(alice_pid));
    for body in t.llm_bodies("aliceafter") {
        assert!(
            !body.contains(marker),
            "bob's AGENTS.md reached alice's prompt: {body}"
        );
    }
    // Bob's next turn reads his first turn's file, and his prompt has his AGENTS.md (so the
    // probe above was one that would have reached a prompt).
    let again = t.bash("bob", "b-again", &bob_ws, "cat own.txt").await;
    assert!(again.contains("mine"), "{again}");
    assert!(
        t.llm_bodies(&scenario_of("b-again"))
            .iter()
            .any(|b| b.contains(marker)),
        "bob's own AGENTS.md is not in his prompt"
    );
}

/// The control: the same probes on a `shared` gateway (one kernel for all, as the gateway's uid)
/// succeed, so the denials above are the isolation's, not probes that cannot work: bob reads
/// alice's file, the kernel's token from its environment, opens its memory and connects to its
/// port, and his `AGENTS.md` lands in alice's prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_isolation_the_same_probes_reach_alices_files_kernel_and_prompt() {
    let t = Tenanted::start_with(false, 1, &[]).await;
    let alice_ws = t.root_of("alice").join("proj");
    let out = t
        .bash(
            "alice",
            "a-secret",
            &alice_ws,
            "echo alice-secret-42 > secret.txt && cat secret.txt",
        )
        .await;
    assert!(out.contains("alice-secret-42"), "{out}");
    let pid = kernel_child(t.gw.pid());
    let port = port_of(pid);
    let marker = "bob-instructions-7731";
    let seen = t
        .probes(
            "bob",
            "b-attack",
            &t.root_of("bob").join("proj"),
            &[
                (
                    "file",
                    format!("cat '{}'", alice_ws.join("secret.txt").display()),
                ),
                ("environ", format!("tr '\\0' '\\n' < /proc/{pid}/environ")),
                ("mem", format!("exec 4</proc/{pid}/mem && echo OPENED")),
                (
                    "port",
                    format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo CONNECTED"),
                ),
                (
                    "agents",
                    format!("echo {marker} > \"$IAC_CODE_CONFIG_DIR/AGENTS.md\" && echo WROTE"),
                ),
            ],
        )
        .await;
    let all = format!("{seen:#?}");
    assert!(seen["file"].contains("alice-secret-42"), "{all}");
    assert!(seen["environ"].contains("IACCODE_A2A_HTTP_TOKEN="), "{all}");
    assert!(seen["mem"].contains("OPENED"), "{all}");
    assert!(seen["port"].contains("CONNECTED"), "{all}");
    assert!(seen["agents"].contains("WROTE"), "{all}");
    let a = t
        .turn(
            "alice",
            "a-after",
            "r1",
            "Still me. scenario:aliceafter",
            &alice_ws,
        )
        .await;
    assert_eq!(a.last()["outcome"]["type"], "success", "{}", a.raw);
    assert!(
        t.llm_bodies("aliceafter")
            .iter()
            .any(|b| b.contains(marker)),
        "bob's AGENTS.md did not reach alice's prompt in shared mode"
    );
}

/// A kernel that dies is started again with the rules its start-up made, rebuilt from the same
/// paths: bob replaces his configuration directory by a symlink to alice's and kills his own
/// kernel (his, so the signal is allowed). Whatever the gateway then does (refuse to start it,
/// or start it confined to his own directory), his agent must not reach alice's configuration
/// directory: her sessions (which hold her files' text) and her `AGENTS.md`, which would be in
/// her next turn's prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_kernel_is_not_confined_to_where_its_user_pointed_its_directories() {
    let t = Tenanted::start(2, &[]).await;
    let alice_ws = t.root_of("alice").join("proj");
    let out = t
        .bash(
            "alice",
            "a-secret",
            &alice_ws,
            "echo alice-secret-42 > secret.txt && cat secret.txt",
        )
        .await;
    assert!(out.contains("alice-secret-42"), "{out}");
    let alice_config = t
        .env
        .state_dir()
        .join("kernels")
        .join(kernel::tenant::user_key(Some("alice")))
        .join("home/.iac-code");
    assert!(alice_config.is_dir());
    let bob_ws = t.root_of("bob").join("proj");
    let out = t
        .bash("bob", "b-first", &bob_ws, "echo mine > own.txt && echo ok")
        .await;
    assert!(out.contains("ok"), "{out}");
    let bob_pid = t.kernel_of("bob").await.expect("bob's kernel");
    // The swap, then his own kernel killed (his turn dies with it). The link is made aside and
    // renamed in: the kernel, writing its session, may make its directory again meanwhile.
    let swap = format!(
        "c=$IAC_CODE_CONFIG_DIR; ln -s ${{c/{bob}/{alice}}} $c.new && for i in 1 2 3 4 5; do \
         mv $c $c.mine$i; mv -T $c.new $c && break; done; kill -9 {bob_pid}",
        bob = kernel::tenant::user_key(Some("bob")),
        alice = kernel::tenant::user_key(Some("alice")),
    );
    let (_, raw) = try_bash(&t, "bob", "b-swap", &bob_ws, &format!("bash -c '{swap}'")).await;
    let bob_config = alice_config.to_str().unwrap().replace(
        &kernel::tenant::user_key(Some("alice")),
        &kernel::tenant::user_key(Some("bob")),
    );
    assert_eq!(
        std::fs::read_link(&bob_config).ok().as_deref(),
        Some(alice_config.as_path()),
        "the swap did not happen: {raw}\n{:?}",
        std::process::Command::new("ls")
            .arg("-laR")
            .arg(Path::new(&bob_config).parent().unwrap())
            .output()
    );
    // His kernel back (or not: a gateway that refuses it is right too).
    let start = Instant::now();
    let mut back = false;
    while start.elapsed() < Duration::from_secs(20) {
        let h = t.health().await;
        let ready = h["kernel"]["slots"].as_array().unwrap().iter().any(|s| {
            s["state"] == "ready" && s["pid"].as_u64().is_some_and(|p| p as u32 != bob_pid)
        });
        if let Some(pid) = t.kernel_of("bob").await {
            if pid != bob_pid && ready && alive(pid) {
                back = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let marker = "bob-instructions-7731";
    let probe = format!(
        "c=$IAC_CODE_CONFIG_DIR; ls -A $c/; grep -rho alice-secret-42 $c/ | head -1; \
         echo {marker} > $c/AGENTS.md && echo WROTE"
    );
    let (seen, raw) = if back {
        try_bash(&t, "bob", "b-after", &bob_ws, &probe).await
    } else {
        (String::new(), "his kernel did not come back".to_owned())
    };
    assert!(
        !alice_config.join("AGENTS.md").exists(),
        "bob wrote alice's AGENTS.md through his restarted kernel: {seen}\n{raw}"
    );
    assert!(
        !seen.contains("alice-secret-42") && !seen.contains("WROTE"),
        "bob's restarted kernel reached alice's configuration directory: {seen}\n{raw}"
    );
    let a = t
        .turn(
            "alice",
            "a-after",
            "r1",
            "Still me. scenario:aliceafter",
            &alice_ws,
        )
        .await;
    assert_eq!(a.last()["outcome"]["type"], "success", "{}", a.raw);
    for body in t.llm_bodies("aliceafter") {
        assert!(
            !body.contains(marker),
            "bob's AGENTS.md reached alice's prompt"
        );
    }
}

/// [`Tenanted::bash`] that may fail (its kernel gone, refused): what the tool said (empty when
/// it did not run), and the last answer for the record.
async fn try_bash(
    t: &Tenanted,
    user: &str,
    thread: &str,
    cwd: &Path,
    command: &str,
) -> (String, String) {
    let scenario = scenario_of(thread);
    t.env.llm.script(
        &scenario,
        testkit::fake_llm::Plan::tool("Probing.", "bash", json!({ "command": command })),
    );
    let msg = format!("Go. scenario:{scenario}");
    let r1 = t
        .turn(user, thread, &format!("{thread}-1"), &msg, cwd)
        .await;
    if r1.last()["outcome"]["type"] != "interrupt" {
        return (tool_result(&r1), r1.raw);
    }
    let id = r1.last()["outcome"]["interrupts"][0]["id"].clone();
    let allow =
        json!([{"interruptId": id, "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let h = Tenanted::headers(user);
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let cwd = cwd.display().to_string();
    let body = resume_body(thread, &format!("{thread}-2"), &cwd, "inv-1", allow);
    let r2 = post(&t.url, &body, &h).await;
    (tool_result(&r2), r2.raw)
}

/// A caller without a user (here the service token acting for nobody) is one tenant of its own:
/// its turns run in a kernel apart from any user's, its workspaces are under `<root>/anonymous`,
/// and a user's folder is outside them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_without_a_user_is_a_tenant_of_its_own() {
    let t = Tenanted::start(2, &[]).await;
    t.hello("alice", "a-1", "r1").await;
    let nobody_root = t.env.ws().join(kernel::tenant::ANONYMOUS);
    let h = [("authorization", format!("Bearer {TOKEN}"))];
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let cwd = nobody_root.join("p").display().to_string();
    let r = post_turn_as(&t.url, "n-1", "r1", "Hi. scenario:text", &cwd, &h).await;
    assert_valid_run(&r, "n-1", "r1");
    assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
    let pids = t.kernel_pids().await;
    assert_eq!(pids.len(), 2, "{}", t.health().await);
    assert_ne!(pids[0], pids[1]);
    let (_, caps) = get_as(&format!("{}capabilities", t.url), &h).await;
    assert_eq!(
        caps["custom"]["iacCode"]["workspaceRoot"],
        json!(nobody_root.display().to_string())
    );
    let theirs = t.root_of("alice").join("p").display().to_string();
    let r = post_turn_as(&t.url, "n-2", "r1", "scenario:text", &theirs, &h).await;
    assert_eq!(r.status, 400, "{}", r.raw);
    assert_eq!(r.error_code(), Some("INVALID_INPUT"));
}
