//! The packages users install. The wheel (`scripts/wheel.sh` builds it once a run and
//! `scripts/test.sh` exports its path as `IAC_CODE_AGUI_WHEEL`): installed with pip into a fresh
//! virtual environment, the environment not activated and no repository on `PATH`, it serves a
//! real-kernel turn through the command it installed and stops gracefully. The container images
//! (`scripts/image.sh`, `IAC_CODE_AGUI_IMAGE`): their configuration, and each serving a
//! real-kernel turn from its root file system as a runtime would start it. The systemd unit:
//! `systemd-analyze verify` and its offline security review.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::free_port;
use testkit::real_kernel::{alive, KernelEnv};
use testkit::sse::{assert_valid_run, post};

use crate::support::get_as;

/// The wheel of this run. A missing wheel is a failure, never a skip.
fn wheel() -> PathBuf {
    let w = std::env::var("IAC_CODE_AGUI_WHEEL")
        .expect("IAC_CODE_AGUI_WHEEL is not set: `bash scripts/wheel.sh` builds the wheel");
    let w = PathBuf::from(w);
    assert!(w.is_file(), "no wheel at {}", w.display());
    w
}

/// Runs `cmd` to its end (at most `limit`), returning its output; a failure shows it whole.
fn output(mut cmd: Command, limit: Duration) -> String {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("{cmd:?} took more than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?}: {}\n{text}", out.status);
    text
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
    let mut child = Command::new(&bin)
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
    let url = format!("http://127.0.0.1:{port}/");
    let start = Instant::now();
    let health = loop {
        let h = tokio::time::timeout(Duration::from_secs(2), get_as(&format!("{url}health"), &[]))
            .await
            .ok()
            .filter(|(status, h)| *status == 200 && h["kernel"]["state"] == "ready");
        if let Some((_, h)) = h {
            break h;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the kernel is not ready: {:?}",
            child.try_wait()
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
    let body = json!({
        "threadId": "t1", "runId": "r1", "state": {}, "tools": [], "context": [],
        "messages": [{"id": "m1", "role": "user", "content": "Say hello. scenario:text"}],
        "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "inv-1", "cwd": ws}},
    });
    let res = post(&url, &body, &[]).await;
    assert_valid_run(&res, "t1", "r1");
    assert_eq!(res.last()["type"], "RUN_FINISHED", "{}", res.raw);
    let text: String = res
        .of("TEXT_MESSAGE_CONTENT")
        .iter()
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(text, "Hello from the fake LLM.", "{}", res.raw);

    // A graceful stop: status 0, and its kernel gone with it.
    #[allow(unsafe_code)]
    // SAFETY: plain kill syscall.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let stopped = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
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
    // It outwaits the gateway's longest stop with the default --shutdown-timeout (10 s): about
    // 2 * (10 + 2) + 12 s.
    let body = std::fs::read_to_string(&unit).unwrap();
    let stop: u64 = body
        .lines()
        .find_map(|l| l.strip_prefix("TimeoutStopSec="))
        .and_then(|v| v.parse().ok())
        .expect("TimeoutStopSec");
    assert!(stop > 2 * (10 + 2) + 12, "{stop}");
    for line in [
        "KillMode=mixed",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
    ] {
        assert!(body.lines().any(|l| l == line), "{line}");
    }
}

#[test]
fn the_environment_file_names_only_variables_the_gateway_or_kernel_reads() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/systemd/iac-code-agui.env"),
    )
    .unwrap();
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md"))
            .unwrap();
    let names: Vec<&str> = text
        .lines()
        .map(|l| l.trim_start_matches('#'))
        .filter_map(|l| l.split_once('=').map(|(k, _)| k))
        .filter(|k| !k.is_empty() && k.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
        .collect();
    assert!(names.len() >= 10, "{names:?}");
    for n in names {
        assert!(readme.contains(n), "{n} is not documented");
    }
}

/// The images of this run: `scripts/image.sh`'s OCI layout (`IAC_CODE_AGUI_IMAGE`), with the tags
/// `full` and `sidecar`. A missing layout is a failure, never a skip.
fn image_layout() -> PathBuf {
    let l = std::env::var("IAC_CODE_AGUI_IMAGE")
        .expect("IAC_CODE_AGUI_IMAGE is not set: `bash scripts/image.sh` builds the images");
    let l = PathBuf::from(l);
    assert!(
        l.join("index.json").is_file(),
        "no OCI layout at {}",
        l.display()
    );
    l
}

/// The image `tag` of the layout: its OCI configuration (entry point, user, environment, ports,
/// volumes, labels) and its root file system, unpacked by umoci into `dir`.
struct Image {
    config: serde_json::Value,
    rootfs: PathBuf,
}

impl Image {
    fn unpack(layout: &Path, tag: &str, dir: &Path) -> Image {
        let read = |digest: &str| -> serde_json::Value {
            let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
            serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap())
                .unwrap()
        };
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
        let manifest = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
            .unwrap_or_else(|| panic!("no {tag} in {index}"));
        let manifest = read(manifest["digest"].as_str().unwrap());
        let config = read(manifest["config"]["digest"].as_str().unwrap());
        let bundle = dir.join(tag);
        let mut cmd = Command::new("umoci");
        cmd.args(["unpack", "--image"])
            .arg(format!("{}:{tag}", layout.display()))
            .arg(&bundle);
        output(cmd, Duration::from_secs(300));
        Image {
            config,
            rootfs: bundle.join("rootfs"),
        }
    }

    /// The image's process as a container runtime starts it: its entry point (tini) as PID 1 of
    /// a PID namespace, chrooted into the root file system as the image's user, with the image's
    /// environment and `env`, `/proc` and `/dev` mounted and `binds` (`host`, `inside`) bound;
    /// on the host's network. `args` follow the entry point.
    fn command(
        &self,
        env: &[(String, String)],
        binds: &[(PathBuf, &str)],
        args: &[&str],
    ) -> Command {
        let c = &self.config["config"];
        let mut mounts = String::from(
            "set -e; r=$0; mount -t proc proc \"$r/proc\"; mount --rbind /dev \"$r/dev\"; ",
        );
        for (i, (_, inside)) in binds.iter().enumerate() {
            mounts.push_str(&format!(
                "mkdir -p \"$r{inside}\"; mount --bind \"$B{i}\" \"$r{inside}\"; "
            ));
        }
        mounts.push_str("exec chroot --userspec=\"$U\" \"$r\" env -i \"$@\"");
        let mut cmd = Command::new("unshare");
        cmd.args([
            "--mount",
            "--pid",
            "--fork",
            "--kill-child",
            "--propagation",
            "private",
        ])
        .args(["sh", "-c", &mounts])
        .arg(&self.rootfs);
        for v in c["Env"].as_array().into_iter().flatten() {
            cmd.arg(v.as_str().unwrap());
        }
        for (k, v) in env {
            cmd.arg(format!("{k}={v}"));
        }
        for v in c["Entrypoint"].as_array().into_iter().flatten() {
            cmd.arg(v.as_str().unwrap());
        }
        cmd.args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("U", c["User"].as_str().expect("the image names its user"));
        for (i, (host, _)) in binds.iter().enumerate() {
            cmd.env(format!("B{i}"), host);
        }
        cmd
    }
}

/// A running image: its runner's process; SIGTERM goes to its PID 1 (tini), as a runtime's stop.
struct Running {
    child: std::process::Child,
    log: PathBuf,
}

impl Running {
    fn start(mut cmd: Command, log: PathBuf) -> Running {
        let f = std::fs::File::create(&log).unwrap();
        let child = cmd
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .expect("unshare (util-linux)");
        Running { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The image's PID 1 (tini): the runner's one child.
    fn init(&self) -> Option<i32> {
        let pid = self.child.id();
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
        children.split_whitespace().next()?.parse().ok()
    }

    /// SIGTERM to tini; the runner's status is its status.
    async fn stop(mut self) -> Option<i32> {
        let init = self.init().expect("PID 1");
        let cmdline = std::fs::read(format!("/proc/{init}/cmdline")).unwrap();
        assert!(
            cmdline.starts_with(b"/usr/bin/tini\0"),
            "{:?}",
            String::from_utf8_lossy(&cmdline)
        );
        #[allow(unsafe_code)]
        // SAFETY: plain kill syscall.
        unsafe {
            libc::kill(init, libc::SIGTERM);
        }
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s.code();
            }
            assert!(
                start.elapsed() < Duration::from_secs(45),
                "no exit: {}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Its PID 1 first: the namespace's every process goes with it (the runner's own
        // parent-death signal does not survive the change of user).
        if let Some(init) = self.init() {
            #[allow(unsafe_code)]
            // SAFETY: plain kill syscall.
            unsafe {
                libc::kill(init, libc::SIGKILL);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the gateway on `port` answers `/health` with its kernel `ready` (or `external`).
async fn ready(port: u16, token: &str, running: &mut Running) -> serde_json::Value {
    let url = format!("http://127.0.0.1:{port}/health");
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let start = Instant::now();
    loop {
        // Refused until the gateway listens.
        let asked = client
            .get(&url)
            .bearer_auth(token)
            .timeout(Duration::from_secs(2))
            .send()
            .await;
        if let Ok(r) = asked {
            let body = r.bytes().await.unwrap_or_default();
            let h: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            if h["kernel"]["state"] == "ready" || h["kernel"]["state"] == "external" {
                return h;
            }
        }
        let exited = running.child.try_wait().unwrap();
        assert!(
            exited.is_none() && start.elapsed() < Duration::from_secs(120),
            "not ready ({exited:?}): {}",
            running.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A turn through the gateway on `port` in `cwd`: the fake LLM's text comes back.
async fn turn_through(port: u16, token: &str, cwd: &str) {
    let body = json!({
        "threadId": "t1", "runId": "r1", "state": {}, "tools": [], "context": [],
        "messages": [{"id": "m1", "role": "user", "content": "Say hello. scenario:text"}],
        "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "inv-1", "cwd": cwd}},
    });
    let bearer = format!("Bearer {token}");
    let res = post(
        &format!("http://127.0.0.1:{port}/"),
        &body,
        &[("authorization", &bearer)],
    )
    .await;
    assert_valid_run(&res, "t1", "r1");
    let text: String = res
        .of("TEXT_MESSAGE_CONTENT")
        .iter()
        .filter_map(|e| e["delta"].as_str())
        .collect();
    assert_eq!(text, "Hello from the fake LLM.", "{}", res.raw);
}

/// The processes of the full image's kernel on this machine: (pid, real uid).
fn image_kernels() -> Vec<(u32, u32)> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !cmdline.contains("/opt/iac-code-agui/bin/iac-code a2a") {
            continue;
        }
        let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok());
        if let Some(uid) = uid {
            out.push((pid, uid));
        }
    }
    out
}

/// The model provider of `env` as the image gets it (the fake LLM on the host's loopback).
fn provider(env: &KernelEnv) -> Vec<(String, String)> {
    env.vars()
        .into_iter()
        .filter(|(k, _)| {
            k.starts_with("IAC_CODE_")
                && k != "IAC_CODE_CONFIG_DIR"
                && !k.starts_with("IAC_CODE_AGUI_")
        })
        .chain([("DISABLE_TELEMETRY".to_owned(), "1".to_owned())])
        .collect()
}

/// The images (`scripts/image.sh`). No container runtime runs on these machines (podman's crun
/// refuses their cgroup hierarchy), so each image's root file system is run with its own entry
/// point, user and environment under `unshare` and `chroot`, as a runtime would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_images_run_as_their_user_and_serve_real_kernel_turns() {
    let layout = image_layout();
    let version = env!("CARGO_PKG_VERSION");
    let dir = tempfile::tempdir().unwrap();
    let full = Image::unpack(&layout, "full", dir.path());
    let sidecar = Image::unpack(&layout, "sidecar", dir.path());
    for (image, entry) in [
        (&full, "/opt/iac-code-agui/bin/iac-code-agui"),
        (&sidecar, "/usr/local/bin/iac-code-agui"),
    ] {
        let c = &image.config["config"];
        assert_eq!(
            c["Entrypoint"],
            json!(["/usr/bin/tini", "--", entry]),
            "{c}"
        );
        assert_eq!(c["User"], "10001:10001", "{c}");
        assert!(c["ExposedPorts"]["8000/tcp"].is_object(), "{c}");
        assert!(c["ExposedPorts"]["9464/tcp"].is_object(), "{c}");
        assert!(c["Volumes"]["/var/lib/iac-code-agui"].is_object(), "{c}");
        assert_eq!(
            c["Labels"]["org.opencontainers.image.version"], version,
            "{c}"
        );
        assert_eq!(
            c["Labels"]["org.opencontainers.image.title"], "iac-code-agui",
            "{c}"
        );
        let said = output(
            image.command(&[], &[], &["--version"]),
            Duration::from_secs(60),
        );
        assert!(said.contains(version), "{said}");
        // The state volume belongs to the image's user, and to it alone.
        use std::os::unix::fs::MetadataExt as _;
        let home = std::fs::metadata(image.rootfs.join("var/lib/iac-code-agui")).unwrap();
        assert_eq!(
            (home.uid(), home.gid(), home.mode() & 0o777),
            (10001, 10001, 0o700)
        );
    }
    // The sidecar image is the smaller one: no Python in it.
    let size = |root: &Path| {
        let out = Command::new("du").args(["-sk"]).arg(root).output().unwrap();
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(size(&sidecar.rootfs) * 4 < size(&full.rootfs));
    assert!(!sidecar.rootfs.join("usr/bin/python3").exists());

    // The full image: its own kernel, as user 10001 under tini; a workspace bound in.
    let env = KernelEnv::new().await;
    let token = "image-token";
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(ws.path().join("w1")).unwrap();
    Command::new("chown")
        .arg("-R")
        .arg("10001:10001")
        .arg(ws.path())
        .status()
        .unwrap();
    let port = free_port();
    let mut vars = provider(&env);
    vars.extend([
        ("IAC_CODE_AGUI_PORT".to_owned(), port.to_string()),
        ("IAC_CODE_AGUI_AUTH_TOKEN".to_owned(), token.to_owned()),
        ("IAC_CODE_AGUI_ALLOWED_CWDS".to_owned(), "/work".to_owned()),
    ]);
    let cmd = full.command(&vars, &[(ws.path().to_owned(), "/work")], &[]);
    let mut running = Running::start(cmd, dir.path().join("full.log"));
    let health = ready(port, token, &mut running).await;
    assert!(health["kernel"]["pid"].is_u64(), "{health}");
    // Its kernel (the pid /health gives is the image's own namespace's): the one installed in
    // the image, run as the image's user.
    let kernels = image_kernels();
    assert_eq!(kernels.len(), 1, "{kernels:?}");
    assert_eq!(kernels[0].1, 10001, "{kernels:?}");
    turn_through(port, token, "/work/w1").await;
    assert_eq!(running.stop().await, Some(0));
    assert!(
        image_kernels().is_empty(),
        "the kernel outlived its gateway"
    );

    // The sidecar image: the gateway alone, in front of a kernel outside it.
    let kernel = testkit::real_kernel::KernelProcess::start_with_token(&env, "kernel-token").await;
    let port = free_port();
    let kws = env.ws();
    std::fs::create_dir_all(kws.join("w2")).unwrap();
    let vars = vec![
        ("IAC_CODE_AGUI_PORT".to_owned(), port.to_string()),
        ("IAC_CODE_AGUI_AUTH_TOKEN".to_owned(), token.to_owned()),
        ("IAC_CODE_AGUI_A2A_URL".to_owned(), kernel.url()),
        (
            "IAC_CODE_AGUI_A2A_TOKEN".to_owned(),
            "kernel-token".to_owned(),
        ),
        (
            "IAC_CODE_AGUI_ALLOWED_CWDS".to_owned(),
            kws.display().to_string(),
        ),
    ];
    let inside = kws.display().to_string();
    let cmd = sidecar.command(&vars, &[(kws.clone(), inside.as_str())], &[]);
    let mut running = Running::start(cmd, dir.path().join("sidecar.log"));
    ready(port, token, &mut running).await;
    turn_through(port, token, &kws.join("w2").display().to_string()).await;
    assert_eq!(running.stop().await, Some(0));
}
