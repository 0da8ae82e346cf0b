//! The packages users install. The wheel (`scripts/wheel.sh` builds it once a run and
//! `scripts/test.sh` exports its path as `IAC_CODE_AGUI_WHEEL`): installed with pip into a fresh
//! virtual environment, the environment not activated and no repository on `PATH`, it serves a
//! real-kernel turn through the command it installed and stops gracefully. The systemd unit:
//! `systemd-analyze verify` and its offline security review. (The container images: `image`.)

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::free_port;
use testkit::real_kernel::{alive, KernelEnv};
use testkit::sse::{assert_valid_run, post};

/// The wheel of this run. A missing wheel is a failure, never a skip.
fn wheel() -> PathBuf {
    let w = std::env::var("IAC_CODE_AGUI_WHEEL")
        .expect("IAC_CODE_AGUI_WHEEL is not set: `bash scripts/wheel.sh` builds the wheel");
    let w = PathBuf::from(w);
    assert!(w.is_file(), "no wheel at {}", w.display());
    w
}

/// Runs `cmd` to its end (at most `limit`), returning its output; a failure shows it whole. The
/// output goes to a file, so a talkative command never blocks on a full pipe.
pub(crate) fn output(mut cmd: Command, limit: Duration) -> String {
    let mut log = tempfile::tempfile().expect("a temporary file");
    let mut child = cmd
        .stdout(log.try_clone().unwrap())
        .stderr(log.try_clone().unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{cmd:?} took more than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    use std::io::{Read as _, Seek as _};
    let mut text = String::new();
    log.rewind().unwrap();
    log.read_to_string(&mut text).unwrap();
    assert!(status.success(), "{cmd:?}: {status}\n{text}");
    text
}

/// A child killed when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `/health` of the gateway on `port` (with the bearer `token`) once its kernel is `ready` (or
/// `external`); `None` before, and while the gateway does not listen yet.
pub(crate) async fn kernel_ready(port: u16, token: Option<&str>) -> Option<serde_json::Value> {
    let client = reqwest::Client::builder().no_proxy().build().ok()?;
    let mut rb = client
        .get(format!("http://127.0.0.1:{port}/health"))
        .timeout(Duration::from_secs(2));
    if let Some(t) = token {
        rb = rb.bearer_auth(t);
    }
    let body = rb.send().await.ok()?.bytes().await.ok()?;
    let h: serde_json::Value = serde_json::from_slice(&body).ok()?;
    let state = &h["kernel"]["state"];
    (state == "ready" || state == "external").then_some(h)
}

/// A turn through the gateway on `port` (with the bearer `token`) in the workspace `cwd`: it
/// finishes, and the fake LLM's text comes back.
pub(crate) async fn turn_through(port: u16, token: Option<&str>, cwd: &str) {
    let body = json!({
        "threadId": "t1", "runId": "r1", "state": {}, "tools": [], "context": [],
        "messages": [{"id": "m1", "role": "user", "content": "Say hello. scenario:text"}],
        "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "inv-1", "cwd": cwd}},
    });
    let bearer = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = bearer
        .iter()
        .map(|b| ("authorization", b.as_str()))
        .collect();
    let res = post(&format!("http://127.0.0.1:{port}/"), &body, &headers).await;
    assert_valid_run(&res, "t1", "r1");
    assert_eq!(res.last()["type"], "RUN_FINISHED", "{}", res.raw);
    let text: String = res
        .of("TEXT_MESSAGE_CONTENT")
        .iter()
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(text, "Hello from the fake LLM.", "{}", res.raw);
}

/// The highest `GLIBC_x.y` symbol version `binary` needs, as `objdump -T` lists them.
fn newest_glibc(binary: &Path) -> (u32, u32) {
    let mut cmd = Command::new("objdump");
    cmd.arg("-T").arg(binary);
    let text = output(cmd, Duration::from_secs(60));
    text.split("GLIBC_")
        .skip(1)
        .filter_map(|rest| {
            let v: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
            Some((parts.next()??, parts.next().flatten().unwrap_or(0)))
        })
        .max()
        .expect("the binary links glibc")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wheel_installs_into_a_fresh_environment_and_serves_a_real_kernel_turn() {
    let wheel = wheel();
    let name = wheel.file_name().unwrap().to_string_lossy().into_owned();
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        name.starts_with(&format!("iac_code_agui-{version}-py3-none-"))
            && name.contains("manylinux_2_17_x86_64"),
        "{name}"
    );
    let env = KernelEnv::new().await;
    let dir = tempfile::tempdir().unwrap();
    let venv = dir.path().join("venv");
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "venv"]).arg(&venv);
    output(cmd, Duration::from_secs(120));
    // pip resolves the kernel the wheel requires from the package index (its cache).
    let mut cmd = Command::new(venv.join("bin/pip"));
    cmd.args(["install", "--no-input", "--disable-pip-version-check", "-q"])
        .arg(&wheel);
    output(cmd, Duration::from_secs(240));
    let bin = venv.join("bin/iac-code-agui");
    // Its manylinux tag is true: nothing newer than glibc 2.17 is needed.
    assert!(newest_glibc(&bin) <= (2, 17), "{:?}", newest_glibc(&bin));
    let mut cmd = Command::new(&bin);
    cmd.arg("--version");
    assert!(output(cmd, Duration::from_secs(10)).contains(version));
    let mut cmd = Command::new(venv.join("bin/pip"));
    cmd.args(["show", "iac-code", "a2a-sdk"]);
    let shown = output(cmd, Duration::from_secs(60));
    assert!(shown.contains("Version: 0.16.0"), "{shown}");
    assert!(shown.contains("Version: 1.1.5"), "{shown}");

    // The installed command as a user runs it: no activation, no kernel on PATH, no kernel
    // command named; only the model provider (the fake LLM) and where to keep state.
    let port = free_port();
    let child = Command::new(&bin)
        .args(["--port", &port.to_string(), "--state-dir"])
        .arg(dir.path().join("state"))
        .env_clear()
        .envs(env.vars().into_iter().filter(|(k, _)| k != "PATH"))
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the installed gateway starts");
    let mut child = KillOnDrop(child);
    let start = Instant::now();
    let health = loop {
        let h = kernel_ready(port, None).await;
        if let Some(h) = h {
            break h;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the kernel is not ready: {:?}",
            child.0.try_wait()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The kernel it started is the one installed beside it.
    let kernel = health["kernel"]["pid"].as_u64().expect("the kernel's pid") as u32;
    let cmdline = std::fs::read(format!("/proc/{kernel}/cmdline")).unwrap_or_default();
    let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(
        cmdline.contains(&venv.join("bin/iac-code").display().to_string()),
        "{cmdline}"
    );
    let ws = env.ws().join("w1");
    std::fs::create_dir_all(&ws).unwrap();
    turn_through(port, None, &ws.display().to_string()).await;

    // A graceful stop: status 0, and its kernel gone with it.
    #[allow(unsafe_code)]
    // SAFETY: plain kill syscall.
    unsafe {
        libc::kill(child.0.id() as i32, libc::SIGTERM);
    }
    let stopped = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(stopped.elapsed() < Duration::from_secs(30), "no exit");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.code(), Some(0));
    let start = Instant::now();
    while alive(kernel) && start.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!alive(kernel), "the kernel outlived its gateway");
}

/// The unit, with its `ExecStart` pointed at this build's binary (verify checks that it exists).
fn unit_here(dir: &Path) -> PathBuf {
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/systemd/iac-code-agui.service"),
    )
    .unwrap();
    let exec = "ExecStart=/opt/iac-code-agui/bin/iac-code-agui";
    assert!(unit.contains(exec), "{unit}");
    let unit = unit.replace(
        exec,
        &format!("ExecStart={}", env!("CARGO_BIN_EXE_iac-code-agui")),
    );
    let path = dir.join("iac-code-agui.service");
    std::fs::write(&path, unit).unwrap();
    path
}

#[test]
fn the_service_unit_verifies_and_is_hardened() {
    let dir = tempfile::tempdir().unwrap();
    let unit = unit_here(dir.path());
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("systemd-analyze (Debian's systemd package)");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success() && said.trim().is_empty(), "{said}");
    // The offline security review: its exposure (0 safest, 10 least) is "OK".
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&unit)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let exposure: f64 = text
        .split("Overall exposure level for iac-code-agui.service:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in {text}"));
    assert!(exposure <= 2.0, "exposure {exposure}: {text}");
    // It outwaits the gateway's longest stop with the default --shutdown-timeout (10 s) twice:
    // about 10 + 7 s and the store's flush.
    let body = std::fs::read_to_string(&unit).unwrap();
    let stop: u64 = body
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.parse().ok())
        .expect("TimeoutStopSec");
    assert!(stop >= 2 * (10 + 7), "{stop}");
    for line in [
        "KillMode=mixed",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
    ] {
        assert!(body.lines().any(|l| l == line), "{line}");
    }
}
