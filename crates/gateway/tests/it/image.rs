//! The container images (`scripts/image.sh` builds them once a run into one OCI layout, which
//! `scripts/test.sh` exports as `IAC_CODE_AGUI_IMAGE`): their configuration, and each serving a
//! real-kernel turn from its root file system, started as a container runtime would start it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;
use testkit::free_port;
use testkit::real_kernel::KernelEnv;

use crate::package::{kernel_ready, output, turn_through};

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
    let start = Instant::now();
    loop {
        if let Some(h) = kernel_ready(port, Some(token)).await {
            return h;
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

/// The processes of the full image's kernel running from `rootfs`: (pid, real uid).
fn image_kernels(rootfs: &Path) -> Vec<(u32, u32)> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        // Only this test's: an installation on the machine runs the same command elsewhere.
        let root = std::fs::read_link(e.path().join("root")).unwrap_or_default();
        if !cmdline.contains("/opt/iac-code-agui/bin/iac-code a2a") || root != rootfs {
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
    // Nothing of the build host (its resolver, its host name), and no installer left in the
    // kernel's environment.
    for image in [&full, &sidecar] {
        for f in ["etc/resolv.conf", "etc/hostname"] {
            assert!(!image.rootfs.join(f).exists(), "{f}");
        }
    }
    assert!(!full.rootfs.join("opt/iac-code-agui/bin/pip").exists());
    assert!(full.rootfs.join("opt/iac-code-agui/bin/iac-code").exists());

    // The full image: its own kernel, as user 10001 under tini; a workspace bound in.
    let env = KernelEnv::new().await;
    let token = "image-token";
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(ws.path().join("w1")).unwrap();
    let chowned = Command::new("chown")
        .arg("-R")
        .arg("10001:10001")
        .arg(ws.path())
        .status()
        .unwrap();
    assert!(chowned.success(), "the image tier runs as root");
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
    let kernels = image_kernels(&full.rootfs);
    assert_eq!(kernels.len(), 1, "{kernels:?}");
    assert_eq!(kernels[0].1, 10001, "{kernels:?}");
    turn_through(port, Some(token), "/work/w1").await;
    assert_eq!(running.stop().await, Some(0));
    assert!(
        image_kernels(&full.rootfs).is_empty(),
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
    turn_through(port, Some(token), &kws.join("w2").display().to_string()).await;
    assert_eq!(running.stop().await, Some(0));
}
