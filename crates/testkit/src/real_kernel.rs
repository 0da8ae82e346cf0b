//! The real kernel (`iac-code a2a`, iac-code 0.16.0 + a2a-sdk 1.1.5) for tests.
//!
//! Its venv is created by `scripts/kernel-venv.sh` (CI runs it before the tests and exports
//! `IAC_CODE_AGUI_KERNEL_BIN`). A missing kernel is a test failure, never a skip.

use std::path::PathBuf;
use std::time::Duration;

use kernel::{launch, Launch};

use crate::fake_llm::FakeLlm;

/// The directory holding the pinned `iac-code` executable.
pub fn kernel_bin_dir() -> PathBuf {
    if let Ok(d) = std::env::var("IAC_CODE_AGUI_KERNEL_BIN") {
        let p = PathBuf::from(d);
        assert!(
            p.join("iac-code").is_file(),
            "IAC_CODE_AGUI_KERNEL_BIN has no iac-code: {}",
            p.display()
        );
        return p;
    }
    let cache = std::env::var("IAC_CODE_AGUI_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/iac-code-agui")
        });
    let p = cache.join("kernel-venv/bin");
    assert!(
        p.join("iac-code").is_file(),
        "the real kernel is not installed: run scripts/kernel-venv.sh (looked in {})",
        p.display()
    );
    p
}

/// An isolated environment for one real kernel: its own HOME/config dir, workspace root and
/// scripted fake LLM.
pub struct KernelEnv {
    pub dir: tempfile::TempDir,
    pub llm: FakeLlm,
}

impl KernelEnv {
    pub async fn new() -> KernelEnv {
        KernelEnv::with_llm(FakeLlm::start().await)
    }

    /// An environment whose kernel calls `llm` (one served over TLS, say).
    pub fn with_llm(llm: FakeLlm) -> KernelEnv {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("home/.iac-code")).expect("home");
        std::fs::create_dir_all(dir.path().join("ws")).expect("ws");
        KernelEnv { dir, llm }
    }

    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// The workspace root (allowed cwds of gateway and kernel).
    pub fn ws(&self) -> PathBuf {
        self.dir.path().join("ws").canonicalize().expect("ws")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// `iac-code` executable.
    pub fn command(&self) -> String {
        kernel_bin_dir()
            .join("iac-code")
            .to_string_lossy()
            .into_owned()
    }

    /// The gateway's launch of this kernel (what a gateway managing it adds to its environment
    /// aside).
    pub fn launch(&self) -> Launch {
        let mut l = Launch::new(self.command());
        // What a gateway would pass of its environment (this process's), then the test's own.
        let names = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
        l.inherit(names, &|k: &str| std::env::var(k).ok(), &[]);
        l.envs(self.vars());
        l
    }

    /// Environment of the kernel (and of a gateway process that manages it).
    pub fn vars(&self) -> Vec<(String, String)> {
        let home = self.home();
        let path = format!(
            "{}:{}",
            kernel_bin_dir().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        vec![
            ("HOME".into(), home.display().to_string()),
            (
                "IAC_CODE_CONFIG_DIR".into(),
                home.join(".iac-code").display().to_string(),
            ),
            ("IAC_CODE_PROVIDER".into(), "OpenAI Compatible".into()),
            ("IAC_CODE_BASE_URL".into(), self.llm.base_url()),
            ("IAC_CODE_API_KEY".into(), "fake-key".into()),
            ("IAC_CODE_MODEL".into(), "fake-model".into()),
            ("IAC_CODE_DISABLE_NONESSENTIAL_TRAFFIC".into(), "1".into()),
            ("DISABLE_TELEMETRY".into(), "1".into()),
            (
                "IAC_CODE_AGUI_ALLOWED_CWDS".into(),
                self.ws().display().to_string(),
            ),
            (
                "IACCODE_A2A_ALLOWED_CWDS".into(),
                self.ws().display().to_string(),
            ),
            ("NO_PROXY".into(), "127.0.0.1,localhost".into()),
            ("no_proxy".into(), "127.0.0.1,localhost".into()),
            ("PATH".into(), path),
        ]
    }
}

/// A real kernel run by the test itself (started as the gateway starts a managed one, on a
/// loopback port and token of its own), so a proxy can sit in front of it and the test can kill
/// and restart it.
pub struct KernelProcess {
    child: std::process::Child,
    pub port: u16,
    pub token: String,
}

impl KernelProcess {
    /// Starts the kernel of `env` and waits (up to 90 s) until it is ready.
    pub async fn start(env: &KernelEnv) -> KernelProcess {
        KernelProcess::start_with_token(env, &format!("test-{}", uuid::Uuid::new_v4().simple()))
            .await
    }

    /// [`KernelProcess::start`] with the bearer token `token` (kernels of one pool share theirs).
    pub async fn start_with_token(env: &KernelEnv, token: &str) -> KernelProcess {
        let port = crate::free_port();
        let child = spawn(env, port, token);
        let k = KernelProcess {
            child,
            port,
            token: token.to_owned(),
        };
        k.wait_ready().await;
        k
    }

    /// `http://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        launch::url(self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Probes it as the gateway does until it is ready.
    async fn wait_ready(&self) {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while !launch::ready(self.port, &self.token, Duration::from_secs(1)).await {
            assert!(
                std::time::Instant::now() < deadline,
                "the real kernel did not become ready"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILL to the kernel's whole process group, then reap it.
    pub fn kill(&mut self) {
        kill_group(self.child.id());
        let _ = self.child.wait();
    }

    /// Kills the kernel and starts a new one of `env` on a new port with the same token.
    pub async fn restart(&mut self, env: &KernelEnv) {
        self.kill();
        let port = crate::free_port();
        self.child = spawn(env, port, &self.token);
        self.port = port;
        self.wait_ready().await;
    }
}

impl Drop for KernelProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// True while a process with this pid exists (and is not a zombie of ours).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next())
                .is_some_and(|state| state != "Z" && state != "X")
        })
        .unwrap_or(false)
}

#[allow(unsafe_code)]
fn kill_group(pid: u32) {
    // SAFETY: plain syscall with integer arguments; a negative pid names the process group.
    unsafe {
        libc::kill(-(pid as i32), libc::SIGKILL);
    }
}

/// The gateway's launch of `env`'s kernel on `port` with `token`; its standard output is not read.
fn spawn(env: &KernelEnv, port: u16, token: &str) -> std::process::Child {
    env.launch()
        .command(port, token)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn the real kernel")
}
