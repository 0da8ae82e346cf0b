//! How a managed kernel is started and when it is ready: the one launch of `iac-code a2a`, used
//! by the supervisor and by the tests that run a real kernel themselves.
//!
//! The child listens on a loopback port with a bearer token, runs in its own process group (so
//! that it is signalled as a whole) and gets SIGKILL when the thread that spawned it dies (a
//! parent-death signal: the kernel never outlives its gateway). Its environment is only what
//! the launch sets (see `environment` for what of the gateway's it inherits), never the whole of
//! the gateway's.

use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, HOST};
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::rt::TokioIo;

use super::confine::{Confinement, Prepared};
use super::environment;
use super::zygote::{ForkRequest, ForkServer};

/// What a managed kernel is started with: the `iac-code` executable, its whole environment, and a
/// kernel configuration file.
#[derive(Debug, Clone)]
pub struct Launch {
    program: String,
    env: Vec<(String, String)>,
    /// `--config`, and what it says: removed when the last clone of the launch is dropped (the
    /// gateway exits); written again by a start that finds it gone (a temporary directory's
    /// clean-up took it from a long-running gateway).
    config_file: Option<(Arc<tempfile::TempPath>, String)>,
    /// What the kernel may reach (isolation `user`): enforced by the child before it executes,
    /// with its own port added to what it may bind.
    confinement: Option<Confinement>,
    /// The uid and gid it runs as, when not the gateway's.
    identity: Option<(u32, u32)>,
    /// Forked by this fork server when it is ready (a confined launch only).
    fork_server: Option<ForkServer>,
}

impl Launch {
    /// A launch of `program` (the `iac-code` executable).
    pub fn new(program: impl Into<String>) -> Launch {
        Launch {
            program: program.into(),
            env: Vec::new(),
            config_file: None,
            confinement: None,
            identity: None,
            fork_server: None,
        }
    }

    /// The executable.
    pub fn program(&self) -> &str {
        &self.program
    }

    /// The variables set so far (the token is added at each start).
    pub fn vars(&self) -> &[(String, String)] {
        &self.env
    }

    /// Sets a variable of the kernel's environment.
    pub fn env(&mut self, key: impl Into<String>, value: impl Into<String>) -> &mut Launch {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Gives the kernel what of the gateway's environment it may have: of `names` (the gateway's
    /// variables), those [`environment::of`] allows or `passthrough` names, with their values in
    /// `env`. Variables set after this one replace them.
    pub fn inherit(
        &mut self,
        names: impl IntoIterator<Item = String>,
        env: crate::environment::EnvFn<'_>,
        passthrough: &[String],
    ) -> &mut Launch {
        self.envs(environment::of(names, env, passthrough))
    }

    /// Sets variables of the kernel's environment.
    pub fn envs<K: Into<String>, V: Into<String>>(
        &mut self,
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> &mut Launch {
        self.env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// Takes out of the kernel's environment every variable `unwanted` names.
    pub fn remove(&mut self, unwanted: impl Fn(&str) -> bool) -> &mut Launch {
        self.env.retain(|(k, _)| !unwanted(k));
        self
    }

    /// The directory the kernel backs its sessions up to. Shared by several instances: another
    /// instance's kernel restores them from there.
    pub fn backup_dir(&mut self, dir: &Path) -> &mut Launch {
        self.env("IAC_CODE_CONFIG_BACKUP_DIR", dir.display().to_string())
    }

    /// The directory the kernel keeps its tasks in (shared like the backup directory, so that
    /// another instance's kernel finds them): written to a private kernel configuration file,
    /// removed when the gateway exits. Created when missing.
    pub fn persistence_dir(&mut self, dir: &Path) -> std::io::Result<&mut Launch> {
        self.config_file = Some(config_file(dir)?);
        Ok(self)
    }

    /// Confines the kernel (see [`crate::confine`]): it may bind its own port besides.
    pub fn confine(&mut self, confinement: Confinement) -> &mut Launch {
        self.confinement = Some(confinement);
        self
    }

    /// Runs the kernel as `uid` and `gid` (supplementary groups dropped).
    pub fn run_as(&mut self, uid: u32, gid: u32) -> &mut Launch {
        self.identity = Some((uid, gid));
        self
    }

    /// Has the kernel forked by `server` when it is ready (a confined launch: the forked child
    /// confines itself with the launch's rules); spawned otherwise.
    pub fn fork_from(&mut self, server: ForkServer) -> &mut Launch {
        self.fork_server = Some(server);
        self
    }

    /// The fork server and what to ask it for a kernel on `port` with `token`: the spawned
    /// command's arguments and environment, the home directory as working directory, and the
    /// confinement prepared with `port` the one it may bind. `None`: the launch is not forked
    /// (no fork server, or nothing to confine it with).
    pub(crate) fn fork_request(
        &self,
        port: u16,
        token: &str,
    ) -> Option<Result<(&ForkServer, ForkRequest, Prepared), String>> {
        let server = self.fork_server.as_ref()?;
        let confinement = self.confinement.as_ref()?;
        let mut c = confinement.clone();
        c.bind_ports = vec![port];
        let prepared = match c.prepare() {
            Ok(p) => p,
            Err(e) => return Some(Err(e.to_string())),
        };
        let env = self.environment(token);
        let cwd = env
            .iter()
            .rev()
            .find(|(k, _)| k == "HOME")
            .map_or_else(|| "/".into(), |(_, v)| std::path::PathBuf::from(v));
        let mut argv = vec![self.program.clone()];
        argv.extend(
            self.arguments(port)
                .into_iter()
                .map(|a| a.to_string_lossy().into_owned()),
        );
        Some(Ok((server, ForkRequest { argv, env, cwd }, prepared)))
    }

    /// Whether the kernel must not listen on `port`: a port it may connect to (another kernel
    /// there would be reachable from it).
    pub fn avoids(&self, port: u16) -> bool {
        self.confinement
            .as_ref()
            .is_some_and(|c| c.connect_ports.contains(&port))
    }

    /// [`Launch::command`], as its uid and confined when the launch says so: the ruleset is built
    /// here, in the parent, with `port` the one port the kernel may bind.
    pub fn spawnable(&self, port: u16, token: &str) -> Result<Command, String> {
        use std::os::unix::process::CommandExt;
        let mut cmd = self.command(port, token);
        if let Some((uid, gid)) = self.identity {
            // Applied by the child before the `pre_exec` steps, which then keep the
            // parent-death signal (a change of uid clears one set earlier).
            cmd.uid(uid).gid(gid);
        }
        if let Some(c) = &self.confinement {
            let mut c = c.clone();
            c.bind_ports = vec![port];
            c.prepare().map_err(|e| e.to_string())?.apply(&mut cmd);
        }
        Ok(cmd)
    }

    /// The command that starts the kernel on `port` with `token`, with the launch's environment
    /// and nothing else. Spawn it from a thread that lives as long as the kernel should: the
    /// parent-death signal follows that thread.
    #[allow(unsafe_code)]
    pub fn command(&self, port: u16, token: &str) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(&self.program);
        cmd.args(self.arguments(port))
            .env_clear()
            .envs(self.environment(token))
            .stdin(Stdio::null())
            .process_group(0);
        super::lifetime::die_with_parent(&mut cmd);
        cmd
    }
}

impl Launch {
    /// The kernel's arguments: `a2a` on loopback `port`, and its configuration file.
    fn arguments(&self, port: u16) -> Vec<std::ffi::OsString> {
        let config = self.config_file.as_ref().filter(|(path, text)| {
            let ready = config_ready(path, text);
            if let Err(e) = &ready {
                tracing::error!(error = %e, "the kernel configuration is not the gateway's: not used");
            }
            ready.is_ok()
        });
        let mut args: Vec<std::ffi::OsString> = [
            "a2a",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--thinking-exposure",
            "all",
        ]
        .iter()
        .map(Into::into)
        .collect();
        if let Some((f, _)) = config {
            args.push("--config".into());
            args.push(f.as_os_str().into());
        }
        args
    }

    /// The kernel's whole environment: the launch's, then the token (last: no variable of the
    /// launch's replaces the token the probe and the client send).
    fn environment(&self, token: &str) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = self
            .env
            .iter()
            .filter(|(k, _)| k != "IACCODE_A2A_HTTP_TOKEN")
            .cloned()
            .collect();
        env.push(("IACCODE_A2A_HTTP_TOKEN".into(), token.into()));
        env
    }
}

/// The A2A URL of a kernel started on `port`.
pub fn url(port: u16) -> String {
    format!("http://127.0.0.1:{port}/")
}

/// Whether the kernel on `port` answers `GET /health` with 200 OK within `within`.
pub async fn ready(port: u16, token: &str, within: Duration) -> bool {
    tokio::time::timeout(within, health(port, token))
        .await
        .is_ok_and(|status| status == Some(StatusCode::OK))
}

/// The status of the kernel's `GET /health`; `None` when it gave no answer.
async fn health(port: u16, token: &str) -> Option<StatusCode> {
    let tcp = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
        .await
        .ok()?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .ok()?;
    let req = Request::get("/health")
        .header(HOST, format!("127.0.0.1:{port}"))
        .header(AUTHORIZATION, format!("Bearer {token}"))
        .body(Empty::<Bytes>::new())
        .ok()?;
    // The connection is driven here, not in a task of its own, so that it is closed when the
    // answer is in: nothing is left behind between probes.
    tokio::select! {
        answer = sender.send_request(req) => answer.ok().map(|r| r.status()),
        // A connection that ends ends the request too (answered or failed): the branch above
        // then says which.
        () = async {
            let _ = conn.await;
            std::future::pending::<()>().await
        } => None,
    }
}

/// Writes the kernel configuration file (`persistence_dir: <dir>`) into a private temporary file.
fn config_file(persistence_dir: &Path) -> std::io::Result<(Arc<tempfile::TempPath>, String)> {
    use std::io::Write as _;
    std::fs::create_dir_all(persistence_dir)?;
    let mut f = tempfile::Builder::new()
        .prefix("iac-code-agui-kernel-")
        .suffix(".yml")
        .tempfile()?;
    // A JSON string is a YAML scalar: any path, quoted right.
    let dir =
        serde_json::to_string(&persistence_dir.display().to_string()).expect("a string serialises");
    let text = format!("persistence_dir: {dir}\n");
    f.write_all(text.as_bytes())?;
    Ok((Arc::new(f.into_temp_path()), text))
}

/// Whether the configuration file at `path` says `text` and is the gateway's: written again when
/// a clean-up of the temporary directory took it, mended when it is the gateway's own file with
/// other words in it; refused when it is another user's, or not a plain file (planted under its
/// name, which the kernel's command line shows).
fn config_ready(path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
    let meta = match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return write_private(path, text),
        other => other?,
    };
    // SAFETY: geteuid has no preconditions.
    #[allow(unsafe_code)]
    let me = unsafe { libc::geteuid() };
    if !meta.is_file() || meta.uid() != me {
        return Err(std::io::Error::other(format!(
            "{} is not a file of the gateway's user",
            path.display()
        )));
    }
    if std::fs::read_to_string(path).ok().as_deref() == Some(text) && meta.mode() & 0o077 == 0 {
        return Ok(());
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    std::io::Write::write_all(&mut f, text.as_bytes())
}

/// Writes `text` to a new file at `path`, readable by its owner only.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())
}

/// Where the kernel command `program` is found: a bare name (`iac-code`) beside the gateway's own
/// executable `exe` first, then on `PATH` (as the spawn looks it up); a path as it is. A wheel
/// installs the gateway and the kernel into one environment's `bin`, which need not be on `PATH`.
pub fn resolve_program(program: &str, exe: Option<&Path>) -> String {
    use std::os::unix::fs::PermissionsExt as _;
    if program.is_empty() || program.contains('/') {
        return program.to_owned();
    }
    let beside = exe.and_then(Path::parent).map(|dir| dir.join(program));
    match beside {
        Some(p)
            if std::fs::metadata(&p)
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0) =>
        {
            p.to_string_lossy().into_owned()
        }
        _ => program.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_kernel_command_is_found_beside_the_gateway_first() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("tempdir");
        let exe = dir.path().join("iac-code-agui");
        // Nothing beside: PATH decides.
        assert_eq!(resolve_program("iac-code", Some(&exe)), "iac-code");
        let kernel = dir.path().join("iac-code");
        std::fs::write(&kernel, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&kernel, std::fs::Permissions::from_mode(0o644)).unwrap();
        // Not executable: not a command.
        assert_eq!(resolve_program("iac-code", Some(&exe)), "iac-code");
        std::fs::set_permissions(&kernel, std::fs::Permissions::from_mode(0o755)).unwrap();
        let found = kernel.to_string_lossy().into_owned();
        assert_eq!(resolve_program("iac-code", Some(&exe)), found);
        // A path is the operator's choice; a directory of that name is no command.
        assert_eq!(
            resolve_program("/opt/k/iac-code", Some(&exe)),
            "/opt/k/iac-code"
        );
        assert_eq!(resolve_program("./iac-code", Some(&exe)), "./iac-code");
        std::fs::create_dir(dir.path().join("kdir")).unwrap();
        assert_eq!(resolve_program("kdir", Some(&exe)), "kdir");
        assert_eq!(resolve_program("iac-code", None), "iac-code");
    }

    fn args(cmd: &Command) -> Vec<String> {
        cmd.get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    fn env_of(cmd: &Command) -> Vec<(String, String)> {
        cmd.get_envs()
            .filter_map(|(k, v)| Some((k.to_str()?.to_owned(), v?.to_str()?.to_owned())))
            .collect()
    }

    #[test]
    fn the_kernel_listens_on_loopback_with_the_token_and_the_extra_environment() {
        let mut l = Launch::new("/opt/iac-code");
        l.env("A", "1").backup_dir(Path::new("/shared/backup"));
        let cmd = l.command(4711, "tok");
        assert_eq!(cmd.get_program(), "/opt/iac-code");
        assert_eq!(
            args(&cmd),
            [
                "a2a",
                "--host",
                "127.0.0.1",
                "--port",
                "4711",
                "--thinking-exposure",
                "all"
            ]
        );
        let env = env_of(&cmd);
        assert!(env.contains(&("IACCODE_A2A_HTTP_TOKEN".into(), "tok".into())));
        assert!(env.contains(&("A".into(), "1".into())));
        assert!(env.contains(&("IAC_CODE_CONFIG_BACKUP_DIR".into(), "/shared/backup".into())));
        assert_eq!(url(4711), "http://127.0.0.1:4711/");
    }

    #[test]
    fn the_token_is_the_launchs_whatever_a_variable_says() {
        let mut l = Launch::new("k");
        l.env("IACCODE_A2A_HTTP_TOKEN", "stale");
        let tokens: Vec<_> = env_of(&l.command(1, "tok"))
            .into_iter()
            .filter(|(k, _)| k == "IACCODE_A2A_HTTP_TOKEN")
            .collect();
        assert_eq!(
            tokens,
            [("IACCODE_A2A_HTTP_TOKEN".to_owned(), "tok".to_owned())]
        );
    }

    /// The kernel started by the launch dumps its environment: the gateway's secrets are not in
    /// it, and nothing of this test's own process environment either (a command that did not
    /// start from an empty environment would pass all of it on).
    #[test]
    fn the_kernel_gets_the_launchs_environment_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dump = dir.path().join("env");
        // `sh a2a …` in that directory runs the script: no freshly written file is executed.
        let script = format!("env > '{}'\n", dump.display());
        std::fs::write(dir.path().join("a2a"), script).expect("script");
        let gateway = |k: &str| {
            let v = match k {
                "IAC_CODE_AGUI_AUTH_TOKEN" => "gw-secret-1",
                "IAC_CODE_AGUI_STATE_URL" => "postgres://u:pw-secret-2@db/x",
                "OTEL_EXPORTER_OTLP_HEADERS" => "authorization=secret-3",
                "IAC_CODE_API_KEY" => "llm-key",
                "PATH" => "/usr/bin:/bin",
                _ => return None,
            };
            Some(v.to_owned())
        };
        let names = [
            "IAC_CODE_AGUI_AUTH_TOKEN",
            "IAC_CODE_AGUI_STATE_URL",
            "OTEL_EXPORTER_OTLP_HEADERS",
            "IAC_CODE_API_KEY",
        ]
        .map(String::from);
        let mut l = Launch::new("/bin/sh");
        l.inherit(names, &gateway, &[]);
        let status = l
            .command(1, "tok")
            .current_dir(dir.path())
            .status()
            .expect("sh");
        assert!(status.success());
        let text = std::fs::read_to_string(&dump).expect("dump");
        for secret in ["gw-secret-1", "pw-secret-2", "secret-3"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(text.contains("IAC_CODE_API_KEY=llm-key\n"), "{text}");
        assert!(text.contains("IACCODE_A2A_HTTP_TOKEN=tok\n"), "{text}");
        for line in text.lines() {
            let name = line.split('=').next().unwrap_or_default();
            let ours = ["IAC_CODE_API_KEY", "IACCODE_A2A_HTTP_TOKEN", "PATH"];
            // The shell's own.
            let shells = ["PWD", "OLDPWD", "SHLVL", "_"];
            assert!(ours.contains(&name) || shells.contains(&name), "{line}");
        }
    }

    #[test]
    fn a_persistence_dir_is_a_config_file_the_kernel_is_started_with() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tasks = dir.path().join("tasks \"q\"");
        let mut l = Launch::new("iac-code");
        l.persistence_dir(&tasks).expect("config");
        assert!(tasks.is_dir());
        let a = args(&l.command(1, "t"));
        assert_eq!(a[a.len() - 2], "--config");
        let file = std::path::PathBuf::from(&a[a.len() - 1]);
        let text = std::fs::read_to_string(&file).expect("config file");
        let expected = serde_json::to_string(&tasks.display().to_string()).expect("json");
        assert_eq!(text, format!("persistence_dir: {expected}\n"));
        // Taken by a clean-up of the temporary directory: the next start writes it again.
        std::fs::remove_file(&file).expect("remove");
        let _ = l.command(1, "t");
        assert_eq!(std::fs::read_to_string(&file).expect("again"), text);
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&file).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Other words in the gateway's own file: mended.
        std::fs::write(&file, "persistence_dir: \"/elsewhere\"\n").expect("plant");
        let _ = l.command(1, "t");
        assert_eq!(std::fs::read_to_string(&file).expect("mended"), text);
        // Another user's file under its name: never given to the kernel, never written to.
        std::fs::remove_file(&file).expect("remove");
        std::fs::write(&file, "persistence_dir: \"/elsewhere\"\n").expect("plant");
        if std::os::unix::fs::chown(&file, Some(65534), Some(65534)).is_ok() {
            let a = args(&l.command(1, "t"));
            assert!(!a.iter().any(|x| x == "--config"), "{a:?}");
            assert_eq!(
                std::fs::read_to_string(&file).expect("planted"),
                "persistence_dir: \"/elsewhere\"\n"
            );
            std::fs::remove_file(&file).expect("remove");
            let _ = l.command(1, "t");
        }
        // Kept while a clone of the launch is (the supervisor's), removed with the last.
        let clone = l.clone();
        drop(l);
        assert!(file.exists());
        drop(clone);
        assert!(!file.exists());
    }

    /// A listener on a free loopback port, and the port.
    async fn listener() -> (tokio::net::TcpListener, u16) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        (l, port)
    }

    /// A listener answering every connection with `answer` once.
    async fn answering(answer: &'static str) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (l, port) = listener().await;
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(answer.as_bytes()).await;
            }
        });
        port
    }

    #[tokio::test]
    async fn ready_is_a_200_answer_and_nothing_else() {
        let ok = answering("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await;
        assert!(ready(ok, "t", Duration::from_secs(5)).await);
        // An interim answer first, then the final one.
        let interim =
            answering("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await;
        assert!(ready(interim, "t", Duration::from_secs(5)).await);
        let refused = answering("HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n").await;
        assert!(!ready(refused, "t", Duration::from_secs(5)).await);
        // Bytes 9-12 say 200, but this is no HTTP answer.
        let garbage = answering("HTTP/1.1 200xx\r\n\r\n").await;
        assert!(!ready(garbage, "t", Duration::from_secs(5)).await);
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        assert!(!ready(closed, "t", Duration::from_secs(5)).await);
    }

    #[tokio::test]
    async fn a_kernel_that_does_not_answer_is_not_ready_when_the_time_is_up() {
        let (l, port) = listener().await;
        let started = std::time::Instant::now();
        assert!(!ready(port, "t", Duration::from_millis(200)).await);
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(l);
    }

    #[tokio::test]
    async fn the_probe_carries_the_token() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (l, port) = listener().await;
        let seen = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.expect("accept");
            let mut buf = vec![0u8; 4096];
            let n = s.read(&mut buf).await.expect("read");
            let _ = s
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                .await;
            String::from_utf8_lossy(&buf[..n]).into_owned()
        });
        assert!(ready(port, "secret", Duration::from_secs(5)).await);
        let req = seen.await.expect("request").to_ascii_lowercase();
        assert!(req.starts_with("get /health http/1.1\r\n"), "{req}");
        assert!(req.contains("authorization: bearer secret\r\n"), "{req}");
    }
}
