//! Users' own kernels (`--kernel-isolation user`) as this configuration makes them: the one
//! kernel launch every user's starts from, where their directories go, the uid they run as and
//! what they may reach (`kernel::isolate`); and the start-up checks that refuse a machine or a
//! configuration where the confinement could not hold as promised.

use std::path::{Path, PathBuf};

use crate::config::isolation::{self, Mode, Start};
use crate::config::{Config, Env};
use kernel::confine::Confinement;
use kernel::isolate::Isolation;
use kernel::{ChildSpec, Launch};

/// The variable that makes the start-up check answer as a machine with that Landlock ABI would
/// (`none`: no Landlock): the refusal is tested on machines that have it.
pub const TEST_LANDLOCK_ABI: &str = "IAC_CODE_AGUI_TEST_LANDLOCK_ABI";

/// Whether the gateway runs as root (its effective uid).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let uid = unsafe { libc::geteuid() };
    uid == 0
}

/// The kernel program as the spawn would find it: a path as it is, a bare name on `PATH`.
fn program_path(program: &str, path_var: Option<&str>) -> PathBuf {
    if program.contains('/') {
        return PathBuf::from(program);
    }
    path_var
        .into_iter()
        .flat_map(|p| p.split(':'))
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(program))
}

/// The launch every managed kernel starts from: the program, and what of the gateway's
/// environment it may have.
pub fn base_launch(cfg: &Config, env: &Env) -> Launch {
    let exe = std::env::current_exe().ok();
    let mut launch = Launch::new(kernel::launch::resolve_program(
        &cfg.a2a_command,
        exe.as_deref(),
    ));
    // Of the gateway's environment, what the kernel may have (names: the process's, which the
    // gateway never changes; values: the snapshot).
    let names = std::env::vars_os().filter_map(|(k, _)| k.into_string().ok());
    launch.inherit(names, &**env, &cfg.kernel_env);
    launch
}

/// Takes out of `launch` what the LLM egress sets (the base URL among them) and every LLM key a
/// kernel could use instead of its capability.
pub fn without_llm_keys(launch: &mut Launch) {
    launch.remove(|k| crate::egress::is_llm_key(k) || crate::egress::KERNEL_VARS.contains(&k));
}

/// Users' kernels reach the LLM provider through `egress`: each with its user's capability, its
/// port among those they may connect to, and no key of the gateway's environment.
pub fn through_egress(iso: &mut Isolation, egress: &crate::egress::Egress, env: &Env) {
    without_llm_keys(&mut iso.base.launch);
    if !iso.runtime.connect_ports.contains(&egress.port()) {
        iso.runtime.connect_ports.push(egress.port());
    }
    let (egress, env) = (egress.clone(), env.clone());
    iso.user_env = Some(kernel::isolate::UserEnv(std::sync::Arc::new(move |key| {
        egress.kernel_vars(Some(key), &*env)
    })));
}

/// Says at start-up where the LLM provider's key is: with the egress, in the gateway only (and
/// a warning for each `--kernel-env` variable that looks like a credential, which kernels still
/// get); without it, a warning when the kernels' environment holds one, which every agent's
/// tools can read.
pub fn say_where_the_llm_key_is(cfg: &Config, env: &Env) {
    if !cfg.a2a_urls.is_empty() {
        return;
    }
    // Shared kernels read iac-code's own configuration directory, where a key may be on file.
    if cfg.isolation.mode == Mode::Shared {
        let dir = env("IAC_CODE_CONFIG_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| Path::new(&h).join(".iac-code")));
        if let Some(file) = dir
            .map(|d| d.join(".credentials.yml"))
            .filter(|f| f.exists())
        {
            tracing::warn!(
                file = %file.display(),
                "the kernels' configuration directory holds iac-code's credentials file, which every agent's tools can read (with --llm-upstream give the key in IAC_CODE_AGUI_LLM_API_KEY instead)"
            );
        }
    }
    if let Some(e) = &cfg.egress {
        tracing::info!(
            key = if e.key.is_some() {
                "held by the gateway"
            } else {
                "none (per-request keys only)"
            },
            "LLM egress on: no kernel holds the provider key"
        );
        if e.key_in_file && cfg.isolation.mode == Mode::Shared {
            tracing::warn!(
                "llm_api_key is in the YAML file, which shared kernels (the gateway's uid) can read: give it in IAC_CODE_AGUI_LLM_API_KEY"
            );
        }
        let looks_secret = ["KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL"];
        for name in &cfg.kernel_env {
            if looks_secret
                .iter()
                .any(|w| name.to_ascii_uppercase().contains(w))
            {
                tracing::warn!(
                    variable = %name,
                    "--kernel-env passes a variable that looks like a credential to every kernel, where agents' tools can read it"
                );
            }
        }
        return;
    }
    let launch = base_launch(cfg, env);
    let keys: Vec<&str> = launch
        .vars()
        .iter()
        .map(|(k, _)| k.as_str())
        .filter(|k| crate::egress::is_llm_key(k))
        .collect();
    if !keys.is_empty() {
        tracing::warn!(
            variables = %keys.join(","),
            "the LLM provider's key is in every kernel's environment, where any user's agent can read it with its shell tool: --llm-upstream keeps it in the gateway"
        );
    }
}

/// Where users' kernels keep their HOME and TMPDIR: `<state-dir>/kernels`.
pub fn kernels_root(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("kernels")
}

/// How every user's kernel is made under `cfg` (isolation `user`).
pub fn isolation(cfg: &Config, env: &Env) -> Isolation {
    let launch = base_launch(cfg, env);
    let program = program_path(launch.program(), env("PATH").as_deref());
    let mut runtime = Confinement::runtime(&program);
    runtime.connect_ports = match &cfg.isolation.connect_ports {
        Some(ports) => ports.clone(),
        None => isolation::default_connect_ports(env("IAC_CODE_BASE_URL").as_deref()),
    };
    Isolation {
        base: ChildSpec {
            launch,
            ready_timeout: std::time::Duration::from_secs(20),
            timeouts: cfg.kernel_timeouts(),
        },
        kernels_root: kernels_root(cfg),
        workspace_roots: workspace_roots(cfg),
        persistence_root: cfg.kernel_persistence_dir.clone(),
        backup_root: cfg.kernel_backup_dir.clone(),
        identity: cfg.isolation.user,
        runtime,
        fork: None,
        user_env: None,
    }
}

/// The fork server of users' kernels (`--kernel-start fork`, isolation `user`), started now;
/// `None` (kernels are spawned, and the log says why) where it cannot run: a kernel command
/// that is no Python console script, or roots that cannot be made.
pub fn fork_server(cfg: &Config, env: &Env, iso: &Isolation) -> Option<kernel::zygote::ForkServer> {
    if cfg.isolation.mode != Mode::User || cfg.isolation.start != Start::Fork {
        return None;
    }
    let program = program_path(iso.base.launch.program(), env("PATH").as_deref());
    let Some(python) = kernel::zygote::interpreter_of(&program) else {
        tracing::warn!(
            command = %program.display(),
            "users' kernels are spawned, not forked: the kernel command is no Python console script"
        );
        return None;
    };
    // Tests list what a forked kernel still imports.
    let extra: Vec<(String, String)> = env(TRACE_IMPORTS)
        .map(|v| (TRACE_IMPORTS.to_owned(), v))
        .into_iter()
        .collect();
    match iso.fork_server_spec(python, &extra) {
        Ok(spec) => Some(kernel::zygote::ForkServer::start(spec)),
        Err(e) => {
            tracing::warn!(error = %e, "users' kernels are spawned, not forked");
            None
        }
    }
}

/// A variable of the gateway's that has each forked kernel name on its stderr every module it
/// imports after the fork (what the fork server's preload list missed).
const TRACE_IMPORTS: &str = "IAC_CODE_AGUI_ZYGOTE_TRACE_IMPORTS";

/// The workspace roots (each user's workspaces are under `<root>/<user-key>`).
fn workspace_roots(cfg: &Config) -> Vec<PathBuf> {
    match cfg.workspace_roots() {
        engine::validate::cwd::Roots::Configured(list) => list,
        engine::validate::cwd::Roots::Default(root) => vec![root],
    }
}

/// Refuses what users' own kernels could not be confined with: no Landlock (or too old), a root
/// gateway without `--kernel-user`, directories the kernels' uid cannot reach, and any of the
/// gateway's secrets (state, configuration, keys) within what every kernel may read. Nothing to
/// check in `shared` mode. The message names what is wrong and what to do.
pub fn check(cfg: &Config, env: &Env) -> Result<(), String> {
    if cfg.isolation.mode != Mode::User {
        return Ok(());
    }
    let refuse = |why: String| format!("--kernel-isolation user: {why}");
    let landlock = match env(TEST_LANDLOCK_ABI) {
        Some(v) => kernel::confine::check_abi(v.trim().parse().ok()),
        None => kernel::confine::check_supported(),
    };
    landlock.map_err(|e| refuse(format!("kernel confinement is not possible: {e}")))?;
    if is_root() && cfg.isolation.user.is_none() {
        return Err(refuse(
            "the gateway runs as root, and kernels never do: set --kernel-user UID[:GID] \
             (an unprivileged user the kernels run as), or run the gateway as one"
                .into(),
        ));
    }
    let iso = isolation(cfg, env);
    // Every kernel may connect to its listed ports on any address: none of them may be one of
    // this gateway's.
    if let Some(p) = iso
        .runtime
        .connect_ports
        .iter()
        .find(|p| gateway_ports(cfg).contains(p))
    {
        return Err(refuse(format!(
            "port {p}, which users' kernels may connect to (--kernel-connect-ports, or the \
             port of IAC_CODE_BASE_URL and 443), is one of this gateway's own: listen elsewhere \
             or list other ports"
        )));
    }
    // Every process's command line is readable from /proc, a kernel's included.
    if let Some(pw) = cfg.state_url.as_deref().and_then(state_password) {
        if std::env::args().skip(1).any(|a| a.contains(&pw)) {
            return Err(refuse(
                "the state URL's password is on the command line, which every kernel can read \
                 (/proc/<pid>/cmdline): give it in IAC_CODE_AGUI_STATE_URL or the YAML file"
                    .into(),
            ));
        }
    }
    // Made now, 0711 (entered, not listed), so that the check below sees them as they will be.
    for dir in [Some(&iso.kernels_root)]
        .into_iter()
        .chain(iso.workspace_roots.iter().map(Some))
        .chain([iso.persistence_root.as_ref(), iso.backup_root.as_ref()])
        .flatten()
    {
        passable_dir(dir, iso.identity.is_some())
            .map_err(|e| refuse(format!("cannot make {}: {e}", dir.display())))?;
    }
    if let Some((uid, gid)) = iso.identity {
        let program = iso.base.launch.program().to_owned();
        let program = program_path(&program, env("PATH").as_deref());
        let needed = [&iso.kernels_root, &program]
            .into_iter()
            .chain(&iso.workspace_roots)
            .chain(iso.persistence_root.iter())
            .chain(iso.backup_root.iter());
        for path in needed {
            if let Some(blocked) = kernel::isolate::unreachable_by(path, uid, gid) {
                return Err(refuse(format!(
                    "the kernels' user (uid {uid}) cannot reach {}: {} does not let it in \
                     (give it search permission, e.g. chmod o+x, or choose a place it can reach)",
                    path.display(),
                    blocked.display()
                )));
            }
        }
    }
    let secrets = secrets(cfg);
    if let Some(p) = secrets
        .iter()
        .find(|p| iso.runtime.exposes(p) && readable_by(p, iso.identity))
    {
        return Err(refuse(format!(
            "{} is readable by every user's kernel (it is under a path kernels may read): move it, \
             or make it unreadable to the kernels' user",
            p.display()
        )));
    }
    Ok(())
}

/// The ports this gateway listens on (the main and the metrics listener).
fn gateway_ports(cfg: &Config) -> Vec<u16> {
    let metrics = cfg
        .metrics_listen
        .as_deref()
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok());
    std::iter::once(cfg.port).chain(metrics).collect()
}

/// The password of a state URL, when it has one.
fn state_password(url: &str) -> Option<String> {
    let u = url::Url::parse(url).ok()?;
    let pw = u.password()?;
    let pw = percent_decoded(pw);
    (!pw.is_empty()).then_some(pw)
}

/// `%XX` sequences decoded (a URL's password as it was typed may be either).
fn percent_decoded(s: &str) -> String {
    url::form_urlencoded::parse(format!("p={s}").as_bytes())
        .next()
        .map_or_else(|| s.to_owned(), |(_, v)| v.into_owned())
}

/// What no kernel may read: the state directory, the configuration file, the key set file, the
/// TLS keys and certificates' directories' keys, the CA files.
fn secrets(cfg: &Config) -> Vec<PathBuf> {
    let canonical = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let mut out = vec![canonical(&cfg.state_dir)];
    out.extend(cfg.config_file.as_deref().map(canonical));
    for pair in [&cfg.tls, &cfg.metrics_tls].into_iter().flatten() {
        out.push(canonical(&pair.key));
    }
    if let Some(j) = cfg.jwt.jwks.as_deref().filter(|j| !j.contains("://")) {
        out.push(canonical(Path::new(j)));
    }
    out
}

/// Whether a kernel running as `identity` (none: the gateway's own uid) could read `path`, by
/// its modes and its ancestors'.
fn readable_by(path: &Path, identity: Option<(u32, u32)>) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Some((uid, gid)) = identity else {
        return true;
    };
    let Ok(m) = std::fs::metadata(path) else {
        return false;
    };
    let bit = if m.uid() == uid {
        0o400
    } else if m.gid() == gid {
        0o040
    } else {
        0o004
    };
    m.mode() & bit != 0
        && kernel::isolate::unreachable_by(path.parent().unwrap_or(path), uid, gid).is_none()
}

/// Makes `dir` (0700 when new) and, for kernels of another uid, lets everyone enter it without
/// listing it (0711): each user's directory beneath is theirs alone.
fn passable_dir(dir: &Path, other_uid: bool) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    if other_uid {
        let mode = std::fs::metadata(dir)?.permissions().mode();
        if mode & 0o011 != 0o011 {
            std::fs::set_permissions(
                dir,
                std::fs::Permissions::from_mode((mode & 0o7777) | 0o011),
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn cfg_with(dir: &Path, args: &[&str], vars: &[(&str, &str)]) -> (Config, Env) {
        use clap::Parser as _;
        let vars: std::collections::HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let env: Env = Arc::new(move |k: &str| vars.get(k).cloned());
        let mut argv = vec!["iac-code-agui", "--state-dir"];
        let state = dir.join("state").display().to_string();
        argv.push(&state);
        argv.extend_from_slice(args);
        let cli = crate::config::Cli::try_parse_from(argv).unwrap();
        (Config::load(cli, &*env).unwrap(), env)
    }

    /// Through the egress, a user's kernel gets its user's capability (another user's is
    /// another) and no LLM key, and the egress's port is among those kernels may connect to.
    #[tokio::test]
    async fn users_kernels_reach_the_llm_through_the_egress_with_their_own_capability() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws").display().to_string();
        let vars = [
            ("IAC_CODE_AGUI_ALLOWED_CWDS", ws.as_str()),
            ("IAC_CODE_PROVIDER", "OpenAI Compatible"),
            ("IAC_CODE_API_KEY", "op-key"),
        ];
        let args = [
            "--kernel-isolation",
            "user",
            "--kernel-start",
            "spawn",
            "--llm-upstream",
            "https://llm.example/v1",
        ];
        let (cfg, env) = cfg_with(dir.path(), &args, &vars);
        let egress = crate::egress::Egress::start(
            cfg.egress.as_ref().unwrap(),
            &*env,
            Arc::new(crate::telemetry::Metrics::new()),
        )
        .unwrap();
        let mut iso = isolation(&cfg, &env);
        iso.base.launch.envs([
            ("IAC_CODE_API_KEY", "op-key"),
            ("OPENAI_API_KEY", "op-key-2"),
            ("IAC_CODE_BASE_URL", "https://llm.example/v1"),
        ]);
        through_egress(&mut iso, &egress, &env);
        assert!(iso.runtime.connect_ports.contains(&egress.port()));
        let vars_of = |key: &str| -> Vec<(String, String)> {
            let t = iso.spec_for(key).unwrap();
            t.spec.launch.vars().to_vec()
        };
        let get = |vars: &[(String, String)], k: &str| -> Vec<String> {
            vars.iter()
                .filter(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
                .collect()
        };
        let (alice, bob) = (vars_of("ualice"), vars_of("ubob"));
        assert!(
            !alice.iter().any(|(_, v)| v.contains("op-key")),
            "{alice:?}"
        );
        assert!(get(&alice, "OPENAI_API_KEY").is_empty());
        let (key, base) = (
            get(&alice, "IAC_CODE_API_KEY"),
            get(&alice, "IAC_CODE_BASE_URL"),
        );
        assert_eq!(key.len(), 1, "one key: {alice:?}");
        assert_eq!(
            base,
            [format!("http://127.0.0.1:{}/{}", egress.port(), key[0])]
        );
        assert_ne!(get(&bob, "IAC_CODE_API_KEY"), key, "another user's");
        assert_ne!(
            get(&vars_of("ualice"), "IAC_CODE_API_KEY"),
            key,
            "a new one at her kernel's next start"
        );
    }

    /// A fork server only for users' own kernels started by fork, and only from a Python
    /// console script: otherwise kernels are spawned.
    #[test]
    fn a_fork_server_is_made_only_where_users_kernels_are_forked_from_a_console_script() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("iac-code");
        std::fs::write(&script, "#!/bin/sh\nexec true\n").unwrap();
        let command = script.display().to_string();
        let ws = dir.path().join("ws").display().to_string();
        let vars = [("IAC_CODE_AGUI_ALLOWED_CWDS", ws.as_str())];
        let shared = ["--a2a-command", command.as_str()];
        let spawn = [
            "--a2a-command",
            command.as_str(),
            "--kernel-isolation",
            "user",
            "--kernel-start",
            "spawn",
        ];
        let fork = [
            "--a2a-command",
            command.as_str(),
            "--kernel-isolation",
            "user",
        ];
        for args in [&shared[..], &spawn[..], &fork[..]] {
            let (cfg, env) = cfg_with(dir.path(), args, &vars);
            let iso = isolation(&cfg, &env);
            assert!(fork_server(&cfg, &env, &iso).is_none(), "{args:?}");
        }
        // With a console script, user mode forks by default.
        std::fs::write(&script, "#!/usr/bin/python3\nimport sys\n").unwrap();
        let (cfg, env) = cfg_with(dir.path(), &fork, &vars);
        let iso = isolation(&cfg, &env);
        let server = fork_server(&cfg, &env, &iso).expect("a fork server");
        server.stop();
    }

    #[test]
    fn shared_mode_checks_nothing_and_user_mode_refuses_a_machine_without_landlock() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, env) = cfg_with(dir.path(), &[], &[(TEST_LANDLOCK_ABI, "none")]);
        assert_eq!(check(&cfg, &env), Ok(()));
        let (cfg, env) = cfg_with(
            dir.path(),
            &["--kernel-isolation", "user", "--kernel-user", "4242"],
            &[(TEST_LANDLOCK_ABI, "none")],
        );
        let e = check(&cfg, &env).unwrap_err();
        assert!(
            e.starts_with("--kernel-isolation user: kernel confinement is not possible: Landlock is not in this Linux kernel"),
            "{e}"
        );
        let (cfg, env) = cfg_with(
            dir.path(),
            &["--kernel-isolation", "user", "--kernel-user", "4242"],
            &[(TEST_LANDLOCK_ABI, "3")],
        );
        let e = check(&cfg, &env).unwrap_err();
        assert!(e.contains("this kernel has ABI 3"), "{e}");
    }

    #[test]
    fn a_root_gateway_needs_a_kernel_user() {
        if !is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (cfg, env) = cfg_with(dir.path(), &["--kernel-isolation", "user"], &[]);
        let e = check(&cfg, &env).unwrap_err();
        assert!(e.contains("set --kernel-user"), "{e}");
    }

    #[test]
    fn the_kernels_user_must_reach_its_directories_and_no_secret() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let (cfg, env) = cfg_with(
            dir.path(),
            &["--kernel-isolation", "user", "--kernel-user", "4242"],
            &[("PATH", "/usr/bin:/bin")],
        );
        if is_root() {
            let e = check(&cfg, &env).unwrap_err();
            assert!(
                e.contains("uid 4242") && e.contains(&dir.path().display().to_string()),
                "{e}"
            );
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
            std::fs::set_permissions(
                dir.path().join("state"),
                std::fs::Permissions::from_mode(0o711),
            )
            .unwrap();
            // The program (`iac-code` not on PATH: as it is) is not a path to check.
            assert_eq!(check(&cfg, &env), Ok(()));
            assert_eq!(
                std::fs::metadata(kernels_root(&cfg))
                    .unwrap()
                    .permissions()
                    .mode()
                    & 0o777,
                0o711
            );
        }
        // A configuration file under a path every kernel reads is refused while their uid can
        // read it.
        let mut cfg = cfg;
        let inside = std::fs::canonicalize("/etc/passwd").unwrap();
        cfg.config_file = Some(inside.clone());
        cfg.isolation.user = Some((4242, 4242));
        if is_root() {
            let e = check(&cfg, &env).unwrap_err();
            assert!(
                e.contains("/etc/passwd is readable by every user's kernel"),
                "{e}"
            );
        }
        assert!(readable_by(&inside, Some((4242, 4242))));
        assert!(!readable_by(Path::new("/etc/shadow"), Some((4242, 4242))));
    }

    #[test]
    fn no_port_of_the_gateway_is_one_kernels_may_connect_to() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, env) = cfg_with(
            dir.path(),
            &[
                "--kernel-isolation",
                "user",
                "--kernel-user",
                "4242",
                "--port",
                "8123",
            ],
            &[("IAC_CODE_BASE_URL", "http://127.0.0.1:8123/v1")],
        );
        let e = check(&cfg, &env).unwrap_err();
        assert!(e.contains("port 8123"), "{e}");
        let (cfg, env) = cfg_with(
            dir.path(),
            &[
                "--kernel-isolation",
                "user",
                "--kernel-user",
                "4242",
                "--metrics-listen",
                "127.0.0.1:9100",
                "--kernel-connect-ports",
                "443,9100",
            ],
            &[],
        );
        let e = check(&cfg, &env).unwrap_err();
        assert!(e.contains("port 9100"), "{e}");
        assert_eq!(gateway_ports(&cfg), [8000, 9100]);
        assert_eq!(
            state_password("postgres://u:p%40ss@db/x").as_deref(),
            Some("p@ss")
        );
        assert_eq!(state_password("postgres://u@db/x"), None);
    }

    #[test]
    fn a_bare_program_is_found_on_the_path() {
        assert_eq!(
            program_path("/x/iac-code", Some("/usr/bin")),
            PathBuf::from("/x/iac-code")
        );
        assert_eq!(
            program_path("sh", Some("/nonexistent:/bin")),
            PathBuf::from("/bin/sh")
        );
        assert_eq!(
            program_path("nothing-by-this-name", Some("/bin")),
            PathBuf::from("nothing-by-this-name")
        );
    }
}
