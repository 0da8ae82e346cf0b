//! The gateway under test as a process: start it, read its RSS and CPU time.

use super::*;

pub(crate) fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time (user + system) the process has used, in ms (`/proc/<pid>/stat`, 100 ticks a second).
pub(crate) fn cpu_ms(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // Fields after the command name (which may hold spaces): state is field 3.
            let rest = &s[s.rfind(')')? + 2..];
            let f: Vec<&str> = rest.split_whitespace().collect();
            let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
            Some(ticks * 10)
        })
        .unwrap_or(0)
}

pub(crate) struct Gateway {
    pub(crate) child: Child,
    pub(crate) url: String,
    pub(crate) ready: Duration,
    pub(crate) ws: PathBuf,
    dir: Option<tempfile::TempDir>,
}

impl Gateway {
    /// Stops the gateway (SIGKILL) and keeps its state directory for the next start.
    pub(crate) fn into_dir(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.dir.take().expect("the state directory")
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) async fn start(target: &Target, kernel: &SyntheticKernel) -> Result<Gateway> {
    start_with(target, kernel, &[], None).await
}

/// Starts the gateway with `env` added, in `dir` (a fresh directory when `None`).
pub(crate) async fn start_with(
    target: &Target,
    kernel: &SyntheticKernel,
    env: &[(&str, &str)],
    dir: Option<tempfile::TempDir>,
) -> Result<Gateway> {
    let dir = match dir {
        Some(d) => d,
        None => tempfile::tempdir()?,
    };
    let ws = dir.path().canonicalize()?.join("ws");
    std::fs::create_dir_all(&ws)?;
    let port = free_port();
    let mut cmd = match target {
        Target::Rust(bin, extra) => {
            let mut c = Command::new(bin);
            c.args(["--port", &port.to_string(), "--a2a-url", &kernel.url()]);
            // The bench parks thousands of streams: far past the default bounds on runs and
            // connections, which a deployment sizes for its kernel.
            c.env("IAC_CODE_AGUI_MAX_RUNS", "1000000")
                .env("IAC_CODE_AGUI_MAX_CONNECTIONS", "1000000");
            c.args(extra);
            c
        }
        Target::Python(iac) => {
            let mut c = Command::new(iac);
            c.args([
                "agui",
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--a2a-url",
                &kernel.url(),
            ]);
            c
        }
    };
    let began = Instant::now();
    let child = cmd
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("IAC_CODE_AGUI_ALLOWED_CWDS", &ws)
        .env("HOME", dir.path())
        .env_remove("IAC_CODE_AGUI_AUTH_TOKEN")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start the gateway")?;
    let url = format!("http://127.0.0.1:{port}/");
    loop {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            let _ = s.write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            let mut b = [0u8; 12];
            if s.read_exact(&mut b).is_ok() && &b[9..12] == b"200" {
                break;
            }
        }
        if began.elapsed() > Duration::from_secs(60) {
            bail!("the gateway did not become ready");
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    Ok(Gateway {
        child,
        url,
        ready: began.elapsed(),
        ws,
        dir: Some(dir),
    })
}
