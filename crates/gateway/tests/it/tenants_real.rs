//! `--kernel-isolation user` with the real kernel and the scripted fake LLM, through the binary:
//! each user's runs in a kernel of their own (placement), their workspaces under their own root,
//! a kernel stopped for idleness back with its session, and the probes of the tenants' red team
//! run from one user's agent against another's, each denied.
//!
//! As root (CI), kernels run as `nobody` (`--kernel-user 65534`) from a venv that user can read
//! (`IAC_CODE_AGUI_KERNEL_BIN_SHARED`, installed by the test script); otherwise as the test's uid.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::free_port;
use testkit::real_kernel::KernelEnv;
use testkit::sse::{assert_valid_run, post, RunResult};

use crate::support::{client, get_as, post_turn_as, resume_body};

const TOKEN: &str = "tenants-service-token";

/// The `iac-code` a kernel of the isolation tier runs: readable by the kernels' user.
fn kernel_command() -> String {
    let dir = std::env::var("IAC_CODE_AGUI_KERNEL_BIN_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|_| testkit::real_kernel::kernel_bin_dir());
    let p = dir.join("iac-code");
    assert!(p.is_file(), "no kernel at {}", p.display());
    p.display().to_string()
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail.
    #[allow(unsafe_code)]
    let uid = unsafe { libc::geteuid() };
    uid == 0
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A gateway with users' own kernels (`seats` of them), a service token, and `extra` flags.
pub(crate) struct Tenanted {
    pub env: KernelEnv,
    pub child: Child,
    pub url: String,
    /// The admin listener (metrics).
    pub admin: u16,
}

impl Tenanted {
    pub(crate) async fn start(seats: usize, extra: &[&str]) -> Tenanted {
        let env = KernelEnv::new().await;
        // The kernels' user enters the test's directories (it lists none of them).
        chmod(env.dir.path(), 0o711);
        chmod(&env.ws(), 0o711);
        let port = free_port();
        let admin = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_iac-code-agui"));
        cmd.args([
            "--port",
            &port.to_string(),
            "--a2a-command",
            &kernel_command(),
        ])
        .args([
            "--kernel-isolation",
            "user",
            "--kernels",
            &seats.to_string(),
        ])
        .arg("--state-dir")
        .arg(env.state_dir())
        .args(["--metrics-listen", &format!("127.0.0.1:{admin}")])
        .args(extra)
        .envs(env.vars())
        .env("IAC_CODE_AGUI_AUTH_TOKEN", TOKEN)
        .env_remove("IAC_CODE_AGUI_A2A_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if is_root() {
            cmd.args(["--kernel-user", "65534"]);
        }
        std::fs::create_dir_all(env.state_dir()).unwrap();
        chmod(&env.state_dir(), 0o711);
        let child = cmd.spawn().unwrap();
        let url = format!("http://127.0.0.1:{port}/");
        let t = Tenanted {
            env,
            child,
            url,
            admin,
        };
        t.wait_listening().await;
        t
    }

    async fn wait_listening(&self) {
        let start = Instant::now();
        loop {
            if client()
                .get(format!("{}health", self.url))
                .send()
                .await
                .is_ok()
            {
                return;
            }
            assert!(start.elapsed() < Duration::from_secs(30), "never listened");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(crate) fn headers(user: &str) -> Vec<(&'static str, String)> {
        vec![
            ("authorization", format!("Bearer {TOKEN}")),
            ("x-iac-code-user", user.to_owned()),
        ]
    }

    /// `user`'s workspace root.
    pub(crate) fn root_of(&self, user: &str) -> PathBuf {
        self.env.ws().join(kernel::tenant::user_key(Some(user)))
    }

    pub(crate) async fn health(&self) -> Value {
        let h = [("authorization", format!("Bearer {TOKEN}"))];
        let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
        get_as(&format!("{}health", self.url), &h).await.1
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
        let scenario = format!("probe{}", thread.replace(['-', '_'], ""));
        self.env.llm.script(
            &scenario,
            testkit::fake_llm::Plan::tool("Probing.", "bash", json!({ "command": command })),
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

impl Drop for Tenanted {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The kernel session ids a run's answer announced.
fn sessions(r: &RunResult) -> Vec<String> {
    r.events
        .iter()
        .filter(|e| e["name"] == "iac-code.session.v1")
        .filter_map(|e| e["value"]["sessionId"].as_str().map(str::to_owned))
        .collect()
}

/// The text of the tool result of a run's answer.
fn tool_result(r: &RunResult) -> String {
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
    let metrics = client()
        .get(format!("http://127.0.0.1:{}/metrics", t.admin))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
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
