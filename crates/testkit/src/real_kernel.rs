//! The real kernel (`iac-code a2a`, iac-code 0.16.0 + a2a-sdk 1.1.5) for tests.
//!
//! Its venv is created by `scripts/kernel-venv.sh` (CI runs it before the tests and exports
//! `IAC_CODE_AGUI_KERNEL_BIN`). A missing kernel is a test failure, never a skip.

use std::path::PathBuf;

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
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("home/.iac-code")).expect("home");
        std::fs::create_dir_all(dir.path().join("ws")).expect("ws");
        KernelEnv {
            dir,
            llm: FakeLlm::start().await,
        }
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
