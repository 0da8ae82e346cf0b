//! The binary as a process: configuration errors, start-up speed, signals.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{bin, client, free_port, spawn_healthy, wait_health};

/// The gateway `exe` on `port` with no kernel to reach (an external one on the discard port) and
/// its state under `dir`: what the tests of the process itself start.
fn offline(exe: impl AsRef<std::ffi::OsStr>, port: u16, dir: &std::path::Path) -> Command {
    let mut c = Command::new(exe);
    c.args([
        "--port",
        &port.to_string(),
        "--a2a-url",
        "http://127.0.0.1:9/",
    ])
    .arg("--state-dir")
    .arg(dir.join("state"));
    c
}

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(bin())
        .args(args)
        .env_remove("IAC_CODE_AGUI_A2A_URL")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn configuration_errors_exit_1_with_a_message() {
    let (code, err) = run(&["--a2a-url", "http://10.0.0.1:41242/"], &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("The AG-UI adapter may connect only to a loopback A2A HTTP(S) URL."),
        "{err}"
    );
    // A loopback kernel over TLS: the kernel client speaks plain HTTP, so it is refused here
    // rather than failing every stream after a clean start; from the variable as well.
    let https = "--a2a-url must be a plain http:// URL: the kernel is a loopback child or a \
                 sidecar, reached without TLS (nothing but this host can see the traffic).";
    let (code, err) = run(&["--a2a-url", "https://127.0.0.1:41242/"], &[]);
    assert_eq!((code, err.trim()), (1, https));
    let (code, err) = run(&[], &[("IAC_CODE_AGUI_A2A_URL", "https://localhost:1")]);
    assert_eq!((code, err.trim()), (1, https));
    let (code, err) = run(&["--port", "70000"], &[]);
    assert_eq!(
        (code, err.trim()),
        (1, "--port must be between 1 and 65535.")
    );
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, "[1, 2]\n").unwrap();
    let (code, err) = run(&["--config", cfg.to_str().unwrap()], &[]);
    assert_eq!(
        (code, err.trim()),
        (1, "AG-UI config file must contain a YAML mapping.")
    );
    let (code, err) = run(&["--idle-shutdown", "x"], &[]);
    assert_eq!(
        (code, err.trim()),
        (1, "--idle-shutdown must be a non-negative number.")
    );
    // The gateway's own variables never reach the kernel, not even named.
    let (code, err) = run(
        &[],
        &[("IAC_CODE_AGUI_KERNEL_ENV", "A,IAC_CODE_AGUI_AUTH_TOKEN")],
    );
    assert_eq!(
        (code, err.trim()),
        (
            1,
            "--kernel-env cannot pass IAC_CODE_AGUI_AUTH_TOKEN: the gateway's own IAC_CODE_AGUI_* \
             variables never reach the kernel."
        )
    );
}

/// Users' own kernels are refused where they could not be confined as promised: with external
/// kernels, without Landlock (or with too old an ABI: the test seam answers as such a machine),
/// as root without a kernel user, with the kernels' user unable to reach its directories.
#[test]
fn kernel_isolation_is_refused_where_it_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state").display().to_string();
    let user = ["--kernel-isolation", "user", "--state-dir", &state];
    let (code, err) = run(
        &[&user[..], &["--a2a-url", "http://127.0.0.1:9/"]].concat(),
        &[],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("--kernel-isolation user needs managed kernels"),
        "{err}"
    );
    let nobody = [&user[..], &["--kernel-user", "65534"]].concat();
    let (code, err) = run(&nobody, &[("IAC_CODE_AGUI_TEST_LANDLOCK_ABI", "none")]);
    assert_eq!(code, 1);
    assert!(
        err.contains("--kernel-isolation user: kernel confinement is not possible: Landlock is not in this Linux kernel"),
        "{err}"
    );
    // A password on the command line is every kernel's to read in /proc.
    let pg = [
        &nobody[..],
        &["--state-url", "postgres://u:secret-pw@127.0.0.1:1/db"],
    ]
    .concat();
    let (code, err) = run(&pg, &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("the state URL's password is on the command line"),
        "{err}"
    );
    let (code, err) = run(&nobody, &[("IAC_CODE_AGUI_TEST_LANDLOCK_ABI", "5")]);
    assert_eq!(code, 1);
    assert!(
        err.contains("Landlock ABI 6 or newer is needed; this kernel has ABI 5"),
        "{err}"
    );
    if is_root() {
        let (code, err) = run(&user, &[]);
        assert_eq!(code, 1);
        assert!(err.contains("kernels never do: set --kernel-user"), "{err}");
        // The temporary directory is 0700: nobody cannot enter it.
        let (code, err) = run(&nobody, &[]);
        assert_eq!(code, 1);
        assert!(
            err.contains("the kernels' user (uid 65534) cannot reach"),
            "{err}"
        );
    }
}

/// A stub kernel at `script`: it writes its environment to `dump` (whole, renamed into place),
/// then runs `then`.
fn stub_kernel(script: &std::path::Path, dump: &std::path::Path, then: &str) {
    use std::os::unix::fs::PermissionsExt;
    let d = dump.display();
    let text = format!("#!/bin/sh\nenv > '{d}.tmp'\nmv '{d}.tmp' '{d}'\n{then}");
    std::fs::write(script, text).unwrap();
    std::fs::set_permissions(script, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The managed kernel gets an allow-list of the gateway's environment, and its output goes
/// through the gateway's log: a stub kernel dumps its environment, writes a line to each stream
/// (one far too long) and exits.
#[test]
fn the_managed_kernel_gets_no_secret_of_the_gateway_and_its_output_is_logged() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("env");
    let script = dir.path().join("kernel");
    stub_kernel(
        &script,
        &dump,
        "echo kernel-stdout-marker\n\
         printf 'kernel-stderr-marker %020000d\\n' 0 >&2\nexit 3\n",
    );
    let log = dir.path().join("gateway.log");
    let port = free_port();
    let mut child = Command::new(bin())
        .args(["--port", &port.to_string(), "--log-format", "json"])
        .arg("--a2a-command")
        .arg(&script)
        .args(["--kernel-env", "PASSED_ON"])
        // The state URL's variable is set but not used (an empty flag wins): the file store.
        .args(["--state-url", "", "--state-dir"])
        .arg(dir.path().join("state"))
        .env_remove("IAC_CODE_AGUI_A2A_URL")
        .env_remove("IAC_CODE_AGUI_KERNEL_ENV")
        .env_remove("IAC_CODE_AGUI_ALLOWED_CWDS")
        .env_remove("IACCODE_A2A_ALLOWED_CWDS")
        .env("IAC_CODE_AGUI_AUTH_TOKEN", "gw-secret-1")
        .env(
            "IAC_CODE_AGUI_STATE_URL",
            "postgres://u:pw-secret-2@127.0.0.1:1/db",
        )
        .env("IAC_CODE_AGUI_A2A_TOKEN", "a2a-secret-3")
        .env("OTEL_EXPORTER_OTLP_HEADERS", "authorization=otel-secret-4")
        .env("IAC_CODE_API_KEY", "allowed-llm-key")
        .env("PASSED_ON", "passed-value")
        .env("NOT_PASSED_ON", "kept-back")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !(dump.exists()
        && std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("kernel-stderr-marker"))
    {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "no kernel output"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    #[allow(unsafe_code)]
    // SAFETY: plain kill syscall.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let _ = child.wait();

    let env = std::fs::read_to_string(&dump).unwrap();
    for secret in [
        "gw-secret-1",
        "pw-secret-2",
        "a2a-secret-3",
        "otel-secret-4",
    ] {
        assert!(!env.contains(secret), "{secret} reached the kernel: {env}");
    }
    assert!(!env.contains("kept-back"), "{env}");
    assert!(env.contains("IAC_CODE_API_KEY=allowed-llm-key\n"), "{env}");
    assert!(env.contains("PASSED_ON=passed-value\n"), "{env}");
    assert!(env.contains("IACCODE_A2A_HTTP_TOKEN="), "{env}");
    // Without configured roots the kernel checks workspaces against the gateway's default root
    // (its own default would be its process's directory and the temporary directory).
    let root = dir.path().join("state/workspaces");
    assert!(
        env.contains(&format!("IACCODE_A2A_ALLOWED_CWDS={}\n", root.display())),
        "{env}"
    );

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let kernel_line = |marker: &str| {
        lines
            .iter()
            .find(|l| l["message"].as_str().is_some_and(|m| m.starts_with(marker)))
            .unwrap_or_else(|| panic!("{marker} not logged: {text}"))
            .clone()
    };
    let out = kernel_line("kernel-stdout-marker");
    let marks = |l: &serde_json::Value| {
        [&l["level"], &l["source"], &l["stream"]].map(|v| v.as_str().unwrap_or("").to_owned())
    };
    assert_eq!(marks(&out), ["INFO", "kernel", "stdout"], "{out}");
    let err = kernel_line("kernel-stderr-marker");
    assert_eq!(marks(&err), ["WARN", "kernel", "stderr"], "{err}");
    // 20,021 bytes written, 8 KiB logged.
    let kept = err["message"].as_str().unwrap().len();
    assert_eq!(kept, 8192, "{err}");
    assert_eq!(err["cut_bytes"], 20021 - 8192, "{err}");
    // A managed kernel of a root gateway runs its tools as root: said at start-up.
    let warned = lines.iter().any(|l| {
        l["level"] == "WARN"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.contains("so does its managed kernel"))
    });
    assert_eq!(warned, is_root(), "{text}");
    // Without the LLM egress the key is the kernel's: said at start-up.
    let said = lines.iter().any(|l| {
        l["level"] == "WARN"
            && l["message"].as_str().is_some_and(|m| {
                m.contains("the LLM provider's key is in every kernel's environment")
            })
    });
    assert!(said, "{text}");
}

/// With `--llm-upstream` the managed kernel gets the egress's base URL and a capability in
/// place of the key, and no LLM key of the gateway's environment (`--kernel-env` included); a
/// wrong egress configuration stops the start.
#[test]
fn with_the_llm_egress_the_kernel_gets_a_capability_and_no_key() {
    let dir = tempfile::tempdir().unwrap();
    let dump = dir.path().join("env");
    let script = dir.path().join("kernel");
    std::fs::create_dir_all(dir.path().join("conf")).unwrap();
    std::fs::write(
        dir.path().join("conf/.credentials.yml"),
        "dashscope: on-file\n",
    )
    .unwrap();
    stub_kernel(&script, &dump, "sleep 30\n");
    let log = dir.path().join("gateway.log");
    let port = free_port();
    let mut child = Command::new(bin())
        .args(["--port", &port.to_string(), "--log-format", "json"])
        .arg("--a2a-command")
        .arg(&script)
        .args(["--kernel-env", "OPENAI_API_KEY"])
        .args(["--llm-upstream", "https://llm.example/compatible-mode/v1"])
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env_remove("IAC_CODE_AGUI_A2A_URL")
        .env_remove("IAC_CODE_AGUI_KERNEL_ENV")
        .env("IAC_CODE_PROVIDER", "DashScope")
        .env("IAC_CODE_API_KEY", "operator-llm-key-1")
        .env(
            "IAC_CODE_BASE_URL",
            "https://llm.example/compatible-mode/v1",
        )
        .env("OPENAI_API_KEY", "operator-llm-key-2")
        .env("NO_PROXY", "corp.example")
        .env_remove("no_proxy")
        .env("IAC_CODE_CONFIG_DIR", dir.path().join("conf"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let start = Instant::now();
    while !dump.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "no kernel");
        std::thread::sleep(Duration::from_millis(50));
    }
    #[allow(unsafe_code)]
    // SAFETY: plain kill syscall.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let _ = child.wait();
    let env = std::fs::read_to_string(&dump).unwrap();
    assert!(!env.contains("operator-llm-key"), "{env}");
    assert!(!env.contains("OPENAI_API_KEY"), "{env}");
    let var = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name}: {env}"))
            .to_owned()
    };
    let (base, key) = (var("IAC_CODE_BASE_URL"), var("IAC_CODE_API_KEY"));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("holds iac-code's credentials file"),
        "a key on file in the shared kernels' configuration directory is said: {text}"
    );
    assert_eq!(key.len(), 64, "{key}");
    assert!(key.bytes().all(|b| b.is_ascii_hexdigit()), "{key}");
    let (origin, path) = base
        .strip_prefix("http://127.0.0.1:")
        .and_then(|r| r.split_once('/'))
        .unwrap_or_else(|| panic!("{base}"));
    assert!(origin.parse::<u16>().is_ok() && path == key, "{base}");
    assert_eq!(var("IAC_CODE_PROVIDER"), "DashScope");
    assert_eq!(var("NO_PROXY"), "corp.example,127.0.0.1,localhost,::1");
    assert_eq!(var("no_proxy"), "127.0.0.1,localhost,::1");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("LLM egress on: no kernel holds the provider key"),
        "{text}"
    );
    assert!(!text.contains("operator-llm-key"), "{text}");
    assert!(
        text.contains("--kernel-env passes a variable that looks like a credential"),
        "{text}"
    );
    assert!(
        !text.contains("in every kernel's environment, where"),
        "{text}"
    );

    let state = dir.path().join("state2").display().to_string();
    let base_args = ["--state-dir", state.as_str()];
    let provider = [("IAC_CODE_PROVIDER", "DashScope")];
    for (args, env, says) in [
        (
            vec!["--llm-upstream", "http://llm.example/v1"],
            &provider[..],
            "--llm-upstream must be an https:// URL",
        ),
        (
            vec!["--llm-upstream", "https://llm.example/v1"],
            &[][..],
            "--llm-upstream needs IAC_CODE_PROVIDER",
        ),
        (
            vec!["--llm-token-budget", "5"],
            &provider[..],
            "need --llm-upstream",
        ),
        (
            vec![
                "--llm-upstream",
                "https://llm.example/v1",
                "--a2a-url",
                "http://127.0.0.1:9/",
            ],
            &provider[..],
            "--llm-upstream needs managed kernels",
        ),
        (
            vec![
                "--llm-upstream",
                "https://llm.example/v1",
                "--llm-upstream-ca",
                "/nonexistent/ca.pem",
            ],
            &provider[..],
            "--llm-upstream-ca /nonexistent/ca.pem",
        ),
    ] {
        let all: Vec<&str> = base_args
            .iter()
            .copied()
            .chain(args.iter().copied())
            .collect();
        let (code, err) = run(&all, env);
        assert_eq!(code, 1, "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// Whether the tests run as root (CI does).
fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        .unwrap()
}

/// The layers of a flagged option: the flag beats its variable, which beats the YAML key.
#[test]
fn flags_beat_variables_which_beat_yaml() {
    let dir = tempfile::tempdir().unwrap();
    let (yaml_port, env_port, flag_port) = (free_port(), free_port(), free_port());
    let cfg = dir.path().join("c.yaml");
    std::fs::write(
        &cfg,
        format!(
            "port: {yaml_port}\nstate-dir: {}\n",
            dir.path().join("s").display()
        ),
    )
    .unwrap();
    let serves_on = |args: &[&str], env: &[(&str, &str)], port: u16| {
        let mut child = Command::new(bin())
            .args([
                "--config",
                cfg.to_str().unwrap(),
                "--a2a-url",
                "http://127.0.0.1:9/",
            ])
            .args(args)
            .envs(env.iter().copied())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let up = wait_health(port, Duration::from_secs(10));
        let _ = child.kill();
        let _ = child.wait();
        up.is_some()
    };
    assert!(serves_on(&[], &[], yaml_port));
    let env_port_s = env_port.to_string();
    assert!(serves_on(
        &[],
        &[("IAC_CODE_AGUI_PORT", &env_port_s)],
        env_port
    ));
    assert!(serves_on(
        &["--port", &flag_port.to_string()],
        &[("IAC_CODE_AGUI_PORT", &env_port_s)],
        flag_port
    ));
}

/// The CORS origins from the variable (a comma-separated list), and the flag beating it.
#[test]
fn cors_origins_from_the_variable_and_the_flag() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let allow_origin = |port: u16, origin: &str| -> Option<String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        write!(
            s,
            "GET /health HTTP/1.1\r\nHost: x\r\nOrigin: {origin}\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
            .lines()
            .find_map(|l| l.strip_prefix("access-control-allow-origin: "))
            .map(str::to_owned)
    };
    let serve = |args: &[&str], env: &[(&str, &str)], checks: &dyn Fn(u16)| {
        let port = free_port();
        let mut child = spawn_healthy(
            Command::new(bin())
                .args([
                    "--a2a-url",
                    "http://127.0.0.1:9/",
                    "--port",
                    &port.to_string(),
                ])
                .arg("--state-dir")
                .arg(dir.path().join("s"))
                .args(args)
                .envs(env.iter().copied())
                .stderr(Stdio::null()),
            port,
            Duration::from_secs(10),
        );
        checks(port);
        let _ = child.kill();
        let _ = child.wait();
    };
    let var = [(
        "IAC_CODE_AGUI_CORS_ORIGINS",
        "http://a.test, http://b.test:81",
    )];
    serve(&[], &var, &|port| {
        assert_eq!(
            allow_origin(port, "http://a.test").as_deref(),
            Some("http://a.test")
        );
        assert_eq!(
            allow_origin(port, "http://b.test:81").as_deref(),
            Some("http://b.test:81")
        );
        assert_eq!(allow_origin(port, "http://c.test"), None);
    });
    serve(&["--cors-origin", "http://c.test"], &var, &|port| {
        assert_eq!(
            allow_origin(port, "http://c.test").as_deref(),
            Some("http://c.test")
        );
        assert_eq!(allow_origin(port, "http://a.test"), None);
    });
    let (code, err) = run(&["--cors-origin", "*"], &[]);
    assert_eq!(code, 1);
    assert!(err.contains("--cors-origin must be an origin"), "{err}");
}

#[test]
fn help_documents_every_option() {
    let out = Command::new(bin()).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--config",
        "--host",
        "--port",
        "--a2a-url",
        "--debug",
        "--log-stdout",
        "--state-dir",
        "--idle-shutdown",
        "--interrupt-ttl",
        "--a2a-command",
        "--shutdown-timeout",
        "--kernel-idle-timeout",
        "IAC_CODE_AGUI_KERNEL_IDLE_TIMEOUT",
        "IAC_CODE_AGUI_A2A_TOKEN",
        "--cors-origin",
        "IAC_CODE_AGUI_CORS_ORIGINS",
        "--metrics-listen",
        "IAC_CODE_AGUI_METRICS_LISTEN",
        "--log-format",
        "IAC_CODE_AGUI_LOG_FORMAT",
        "--state-url",
        "IAC_CODE_AGUI_STATE_URL",
        "--lease-ttl",
        "--advertise-url",
        "--kernel-backup-dir",
        "--kernel-persistence-dir",
        "--kernel-env",
        "IAC_CODE_AGUI_KERNEL_ENV",
        "--max-image-decodes",
        "--kernels",
        "IAC_CODE_AGUI_KERNELS",
        "IAC_CODE_AGUI_MAX_IMAGE_DECODES",
        "--body-timeout",
        "IAC_CODE_AGUI_BODY_TIMEOUT",
        "--linger-timeout",
        "IAC_CODE_AGUI_LINGER_TIMEOUT",
        "--allowed-host",
        "IAC_CODE_AGUI_ALLOWED_HOSTS",
        "--allow-unauthenticated",
        "IAC_CODE_AGUI_ALLOW_UNAUTHENTICATED",
        "--console",
        "IAC_CODE_AGUI_CONSOLE",
        "--auth-jwks",
        "IAC_CODE_AGUI_AUTH_JWKS",
        "--auth-issuer",
        "IAC_CODE_AGUI_AUTH_ISSUER",
        "--auth-audience",
        "IAC_CODE_AGUI_AUTH_AUDIENCE",
        "--auth-user-claim",
        "IAC_CODE_AGUI_AUTH_USER_CLAIM",
        "--auth-jwks-refresh",
        "IAC_CODE_AGUI_AUTH_JWKS_REFRESH",
        "--state-ca-file",
        "--tls-cert",
        "--tls-key",
        "--metrics-tls-cert",
        "--metrics-tls-key",
        "--cluster-ca",
        "IAC_CODE_AGUI_TLS_CERT",
        "--kernel-isolation",
        "IAC_CODE_AGUI_KERNEL_ISOLATION",
        "--kernel-idle-stop",
        "IAC_CODE_AGUI_KERNEL_IDLE_STOP",
        "--kernel-user",
        "IAC_CODE_AGUI_KERNEL_USER",
        "--kernel-connect-ports",
        "IAC_CODE_AGUI_KERNEL_CONNECT_PORTS",
    ] {
        assert!(help.contains(opt), "{opt} missing from --help");
    }
}

#[test]
fn external_kernel_ready_fast_idle_shutdown_and_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = Command::new(bin())
        .args([
            "--port",
            &port.to_string(),
            "--a2a-url",
            "http://127.0.0.1:9/",
            "--state-dir",
        ])
        .arg(dir.path().join("state"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = wait_health(port, Duration::from_secs(10)).expect("health");
    eprintln!("ready after {ready:?}");
    assert!(ready < Duration::from_secs(2));
    #[allow(unsafe_code)]
    // SAFETY: plain kill syscall.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "no exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    // Idle shutdown.
    let port = free_port();
    let mut child = Command::new(bin())
        .args([
            "--port",
            &port.to_string(),
            "--a2a-url",
            "http://127.0.0.1:9/",
            "--idle-shutdown",
            "1",
            "--state-dir",
        ])
        .arg(dir.path().join("state"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_health(port, Duration::from_secs(10)).expect("health");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "idle shutdown did not happen"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    assert!(start.elapsed() >= Duration::from_millis(900));
}

/// A SIGTERM the moment the listener is bound, before any request: the signal handlers are in
/// place before the bind, so the gateway drains and exits 0 every time (the handlers were made
/// when the server first polled them, and a signal in between killed the process outright, one
/// run in many).
#[test]
fn a_sigterm_right_after_bind_always_drains_and_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..40 {
        let port = free_port();
        let mut child = offline(bin(), port, dir.path())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        // Bound as soon as a connection is taken (the accept queue answers before any accept).
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(10), "never bound");
            if let Some(s) = child.try_wait().unwrap() {
                panic!("round {round}: exited before binding: {s:?}");
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        #[allow(unsafe_code)]
        // SAFETY: plain kill syscall.
        unsafe {
            libc::kill(child.id() as i32, libc::SIGTERM);
        }
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(5));
        };
        assert_eq!(status.code(), Some(0), "round {round}: {status:?}");
    }
}

/// Secrets sent in a request never appear in debug logs, SSE output or the state dir.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_never_reach_debug_logs() {
    // Text and JSON logs at trace level, and the spans exported over OTLP.
    for format in ["text", "json"] {
        secrets_never_reach_logs_or_spans(format).await;
    }
}

async fn secrets_never_reach_logs_or_spans(format: &str) {
    use serde_json::json;
    use testkit::fake_kernel::{FakeKernel, Item, Stream};
    let k = FakeKernel::start().await;
    let otlp = testkit::otlp::OtlpReceiver::start().await;
    let c = engine::run::context_id("t1");
    // The kernel echoes the request metadata (with secrets) in its first task event, like the real one.
    k.stream(
        Stream::of("task-1", &c)
            .then(Item::Result(json!({"task": {"id": "task-1", "contextId": c, "status": {"state": "TASK_STATE_SUBMITTED"},
            "history": [{"role": "ROLE_USER", "parts": [{"text": "x"}], "metadata": {"iac_code": {"iac_code_api_key": "SECRET-KEY-1", "alibaba_cloud_access_key_secret": "SECRET-AK-3"}}}]}})))
            .text("hi", "m")
            .then(Item::Raw("data: {broken\r\n\r\n".into())),
    );
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let port = free_port();
    let mut child = spawn_healthy(
        Command::new(bin())
            .args([
                "--port",
                &port.to_string(),
                "--debug",
                "--log-format",
                format,
                "--a2a-url",
                &k.url(),
                "--state-dir",
            ])
            .arg(dir.path().join("state"))
            .env("IAC_CODE_AGUI_ALLOWED_CWDS", &ws)
            .env("IAC_CODE_AGUI_LOG", "trace")
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint())
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .stderr(Stdio::piped())
            .stdout(Stdio::piped()),
        port,
        Duration::from_secs(10),
    );
    let body = json!({"threadId":"t1","runId":"r1","state":{},"messages":[{"id":"m","role":"user","content":"x"}],"tools":[],"context":[],
        "forwardedProps":{"iacCode":{"schemaVersion":1,"rosInvocationId":"i","cwd":ws.join("a"),"llmApiKey":"SECRET-KEY-1",
        "llmHeaders":{"X-Key":"SECRET-HDR-2"},"alibabaCloud":{"accessKeySecret":"SECRET-AK-3","securityToken":"SECRET-STS-4"}}}});
    let r = testkit::sse::post(&format!("http://127.0.0.1:{port}/"), &body, &[]).await;
    assert_eq!(r.status, 200);
    let mut bad = body.clone();
    bad["forwardedProps"]["iacCode"]["unknown"] = json!(1);
    let r2 = testkit::sse::post(&format!("http://127.0.0.1:{port}/"), &bad, &[]).await;
    assert_eq!(r2.status, 400);
    #[allow(unsafe_code)]
    // SAFETY: plain kill syscall.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let out = tokio::task::spawn_blocking(move || {
        let _ = child.wait();
        let mut s = String::new();
        use std::io::Read;
        child.stderr.take().unwrap().read_to_string(&mut s).unwrap();
        child.stdout.take().unwrap().read_to_string(&mut s).unwrap();
        s
    })
    .await
    .unwrap();
    assert!(
        out.contains("DEBUG") || out.contains("INFO"),
        "logging is on: {out}"
    );
    if format == "json" {
        assert!(
            out.lines()
                .all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()),
            "{out}"
        );
    }
    // The run's spans were exported (the shutdown flushed them), so the search below means something.
    let spans = otlp.spans();
    assert!(spans.iter().any(|s| s.name == "agui.run"), "{spans:?}");
    let exported = format!("{}{spans:?}", otlp.raw_text());
    let mut files = String::new();
    for e in walkdir(&dir.path().join("state")) {
        files.push_str(&String::from_utf8_lossy(&std::fs::read(e).unwrap()));
    }
    for secret in [
        "SECRET-KEY-1",
        "SECRET-HDR-2",
        "SECRET-AK-3",
        "SECRET-STS-4",
    ] {
        assert!(!out.contains(secret), "{secret} in {format} logs");
        assert!(!exported.contains(secret), "{secret} in exported spans");
        assert!(!r.raw.contains(secret), "{secret} in SSE");
        assert!(!r2.raw.contains(secret), "{secret} in an error body");
        assert!(!files.contains(secret), "{secret} in state");
    }
}

fn walkdir(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = vec![];
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walkdir(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// SIGTERM with 100 open streams: every stream ends with one terminal event within the drain
/// deadline, a paused interrupt stays durable, and the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_drains_open_streams() {
    use serde_json::json;
    use testkit::fake_kernel::{FakeKernel, Item, Stream};
    let k = FakeKernel::start().await;
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().canonicalize().unwrap().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let port = free_port();
    let mut child = spawn_healthy(
        Command::new(bin())
            .args([
                "--port",
                &port.to_string(),
                "--a2a-url",
                &k.url(),
                "--shutdown-timeout",
                "5",
                "--state-dir",
            ])
            .arg(dir.path().join("state"))
            .env("IAC_CODE_AGUI_ALLOWED_CWDS", &ws)
            .stderr(Stdio::null()),
        port,
        Duration::from_secs(10),
    );
    let url = format!("http://127.0.0.1:{port}/");
    let body = |t: &str| {
        json!({"threadId": t, "runId": "r1", "state": {}, "messages": [{"id": "m", "role": "user", "content": "x"}],
        "tools": [], "context": [], "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "i", "cwd": ws}}})
    };
    // One paused execution (an interrupt) that must survive the shutdown.
    let ctx = engine::run::context_id("paused");
    k.stream(
        Stream::of("task-p", &ctx)
            .submitted(json!({}))
            .input_required(json!({"input": {"kind": "permission", "inputId": "perm-1", "requestTaskId": "task-p", "required": true}})),
    );
    let r = testkit::sse::post(&url, &body("paused"), &[]).await;
    assert_eq!(r.last()["outcome"]["type"], "interrupt");
    let mut streams = vec![];
    for i in 0..100 {
        let t = format!("s{i}");
        let c = engine::run::context_id(&t);
        k.stream(
            Stream::of(&format!("task-{i}"), &c)
                .task("TASK_STATE_WORKING", json!({}))
                .text("working", "m")
                .then(Item::Stall),
        );
        let (url, b) = (url.clone(), body(&t));
        streams.push(tokio::spawn(async move {
            testkit::sse::post(&url, &b, &[]).await
        }));
        k.wait_calls("SendStreamingMessage", i + 2, Duration::from_secs(10))
            .await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = std::time::Instant::now();
    #[allow(unsafe_code)]
    // SAFETY: plain kill syscall.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    for (i, s) in streams.into_iter().enumerate() {
        let r = s.await.unwrap();
        testkit::sse::assert_valid_run(&r, &format!("s{i}"), "r1");
        assert_eq!(r.last()["type"], "RUN_ERROR");
        assert_eq!(
            r.last()["message"],
            "The execution service is shutting down."
        );
    }
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "drain took {:?}",
        started.elapsed()
    );
    // The running tasks were cancelled; the paused one was not, and its interrupt is durable.
    assert_eq!(k.calls("CancelTask").len(), 100);
    let doc: serde_json::Value = serde_json::from_slice(
        &std::fs::read(dir.path().join("state/threads/paused.json")).unwrap(),
    )
    .unwrap();
    // The clean stop checkpointed the journal: only thread files are left.
    let journal_logs = std::fs::read_dir(dir.path().join("state/journal"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
                .count()
        })
        .unwrap_or(0);
    assert_eq!(
        journal_logs, 0,
        "the journal was not checkpointed at shutdown"
    );
    assert!(doc["execution"]["pending"]["perm-1"].is_object());
}

/// No route but /health is reachable without the token, whatever the path spelling.
#[tokio::test]
async fn auth_hardening_path_variants_and_headers() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = offline(bin(), port, dir.path())
        .env("IAC_CODE_AGUI_AUTH_TOKEN", "tok")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_health(port, Duration::from_secs(10)).is_some());
    let c = client();
    let base = format!("http://127.0.0.1:{port}");
    for path in [
        "/",
        "//",
        "/./",
        "/%2F",
        "/%2e/",
        "/?x=1",
        "/extensions/iac-code/v1/executions/e/cancel",
        "/extensions/iac-code/v1/executions/e/cancel/",
        "//extensions/iac-code/v1/executions/e/cancel",
        "/extensions/iac-code/v1/executions/e%2Fx/cancel",
        "/EXTENSIONS/iac-code/v1/executions/e/cancel",
        "/health/../",
    ] {
        let r = c
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await
            .unwrap();
        let s = r.status().as_u16();
        assert!(matches!(s, 401 | 404 | 405), "{path}: {s}");
    }
    let huge = format!("Bearer {}", "x".repeat(60_000));
    let r = c
        .post(format!("{base}/"))
        .header("authorization", huge)
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await;
    if let Ok(r) = r {
        assert!(matches!(r.status().as_u16(), 401 | 431), "{}", r.status());
    }
    let r = c
        .post(format!("{base}/"))
        .header("authorization", "Bearer tok")
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "the right token passes");
    let _ = child.kill();
    let _ = child.wait();
}

/// Running without a token is said at start-up; an empty token variable never switches a YAML
/// token off (it counts as unset, as for every option).
#[tokio::test]
async fn authentication_off_is_logged_and_an_empty_variable_keeps_the_yaml_token() {
    let dir = tempfile::tempdir().unwrap();
    let start = |env_token: Option<&str>, config: Option<&std::path::Path>| {
        let port = free_port();
        let mut cmd = offline(bin(), port, dir.path());
        cmd.args(["--idle-shutdown", "1"])
            .env_remove("IAC_CODE_AGUI_AUTH_TOKEN")
            .stderr(Stdio::piped());
        if let Some(t) = env_token {
            cmd.env("IAC_CODE_AGUI_AUTH_TOKEN", t);
        }
        if let Some(c) = config {
            cmd.arg("--config").arg(c);
        }
        (port, cmd.spawn().unwrap())
    };
    let (port, child) = start(None, None);
    wait_health(port, Duration::from_secs(10)).expect("health");
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("authentication is off"), "{log}");
    // Nobody is named, and the kernel is external: neither warning.
    assert!(!log.contains("share the kernel processes"), "{log}");
    assert!(!log.contains("so does its managed kernel"), "{log}");

    let yaml = dir.path().join("agui.yaml");
    std::fs::write(&yaml, "auth_token: from-yaml\n").unwrap();
    let (port, child) = start(Some(""), Some(&yaml));
    wait_health(port, Duration::from_secs(10)).expect("health");
    let c = client();
    let r = c
        .post(format!("http://127.0.0.1:{port}/"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401, "the YAML token still holds");
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!log.contains("authentication is off"), "{log}");
}

/// The service token's caller that names a user is told once that users share the kernels; a
/// caller that names nobody is not.
#[tokio::test]
async fn a_service_token_naming_users_is_warned_once_of_shared_kernels() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = offline(bin(), port, dir.path())
        .args(["--idle-shutdown", "2"])
        .env("IAC_CODE_AGUI_AUTH_TOKEN", "svc-token")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_health(port, Duration::from_secs(10)).expect("health");
    let c = client();
    let get = |user: Option<&str>| {
        let mut r = c
            .get(format!("http://127.0.0.1:{port}/threads/t1"))
            .header("authorization", "Bearer svc-token");
        if let Some(u) = user {
            r = r.header("x-iac-code-user", u);
        }
        r.send()
    };
    assert_eq!(get(None).await.unwrap().status(), 404);
    for user in ["alice", "bob"] {
        assert_eq!(get(Some(user)).await.unwrap().status(), 404);
    }
    let out = tokio::task::spawn_blocking(move || {
        let _ = child.wait();
        let mut s = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut s).unwrap();
        s
    })
    .await
    .unwrap();
    let warnings = out
        .matches("the service token's caller names users, but every user's runs share the kernel processes")
        .count();
    assert_eq!(warnings, 1, "{out}");
}

/// With `--auth-jwks` the start-up says how callers authenticate, a non-loopback address needs
/// nothing more, and JWTs are checked; a key set that cannot be read stops the start (status 1,
/// a message naming it).
#[tokio::test]
async fn jwt_authentication_is_announced_and_an_unreadable_key_set_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = crate::support::jwks_file(dir.path(), &[testkit::jwt::ec()]);
    let command = |port: u16, jwks: &std::path::Path| {
        let mut c = Command::new(bin());
        c.args(["--host", "0.0.0.0", "--port", &port.to_string()])
            .args(["--a2a-url", "http://127.0.0.1:9/", "--idle-shutdown", "2"])
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--auth-jwks")
            .arg(jwks)
            .args(["--auth-issuer", testkit::jwt::ISSUER])
            .args(["--auth-audience", testkit::jwt::AUDIENCE])
            .env_remove("IAC_CODE_AGUI_AUTH_TOKEN")
            .env_remove("IAC_CODE_AGUI_ALLOW_UNAUTHENTICATED")
            .stderr(Stdio::piped());
        c
    };
    let port = free_port();
    let child = command(port, &jwks).spawn().unwrap();
    wait_health(port, Duration::from_secs(10)).expect("health");
    let c = client();
    let url = format!("http://127.0.0.1:{port}/threads/t1");
    let anonymous = c.get(&url).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let user = c
        .get(&url)
        .header("authorization", crate::support::bearer_for("alice"))
        .send()
        .await
        .unwrap();
    assert_eq!(user.status(), 404);
    let mut expired = testkit::jwt::claims_for("mallory");
    expired["exp"] = (testkit::jwt::now() - 600).into();
    let stale = testkit::jwt::sign(testkit::jwt::ec(), Some("ec-1"), &expired);
    let refused = c
        .get(&url)
        .header("authorization", format!("Bearer {stale}"))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 401);
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("authentication: JWTs (keys from"), "{log}");
    assert!(
        log.contains("JWTs name users, but every user's runs share the kernel processes"),
        "{log}"
    );
    // Each refusal is one audit line (route and reason), and no token is ever written.
    let audit: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("access refused"))
        .collect();
    assert_eq!(audit.len(), 2, "{log}");
    assert!(
        audit[0].contains("reason=\"missing\"") && audit[0].contains("GET /threads/{threadId}"),
        "{log}"
    );
    assert!(audit[1].contains("reason=\"expired\""), "{log}");
    let alice = crate::support::bearer_for("alice");
    let signature = |t: &str| t.rsplit('.').next().unwrap().to_owned();
    for token in [stale.as_str(), alice.trim_start_matches("Bearer ")] {
        assert!(
            !log.contains(&signature(token)),
            "a token in the log: {log}"
        );
    }
    assert!(!log.contains("authentication is off"), "{log}");

    let out = command(free_port(), &dir.path().join("missing.json"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read the JWT key set") && err.contains("missing.json"),
        "{err}"
    );
}

/// TLS on both listeners from the binary: https on the main and the admin listener; SIGHUP reads
/// the certificate again (the process keeps serving: without its handler SIGHUP would end it);
/// a key that does not match stops the start with a message naming the file.
#[tokio::test]
async fn tls_listeners_serve_https_and_sighup_reads_the_certificate_again() {
    use testkit::tls::Ca;
    let dir = tempfile::tempdir().unwrap();
    let ca = Ca::new();
    let write = |name: &str| {
        let (cert, key) = ca.issue(&["localhost", "127.0.0.1"]);
        let (c, k) = (
            dir.path().join(format!("{name}.crt")),
            dir.path().join(format!("{name}.key")),
        );
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        (c, k)
    };
    let (cert, key) = write("main");
    let (mcert, mkey) = write("admin");
    let (port, admin) = (free_port(), free_port());
    let mut child = offline(bin(), port, dir.path())
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .args(["--metrics-listen", &format!("127.0.0.1:{admin}")])
        .arg("--metrics-tls-cert")
        .arg(&mcert)
        .arg("--metrics-tls-key")
        .arg(&mkey)
        .env_remove("IAC_CODE_AGUI_AUTH_TOKEN")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let client = || crate::support::https_client(&ca);
    let cert_of = crate::support::presented_cert;
    let health = format!("https://127.0.0.1:{port}/health");
    let start = std::time::Instant::now();
    let first = loop {
        match client().get(&health).send().await {
            Ok(r) => break cert_of(&r),
            Err(_) if start.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("no https answer: {e}"),
        }
    };
    let metrics = client()
        .get(format!("https://127.0.0.1:{admin}/metrics"))
        .send()
        .await
        .unwrap();
    assert_eq!(metrics.status(), 200);
    // A new pair with the files' times unchanged: only the signal makes it read.
    let times: Vec<_> = [&cert, &key]
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().modified().unwrap())
        .collect();
    let (cert2, key2) = ca.issue(&["localhost", "127.0.0.1"]);
    for ((p, text), t) in [(&cert, cert2), (&key, key2)].into_iter().zip(times) {
        std::fs::write(p, text).unwrap();
        std::fs::File::options()
            .write(true)
            .open(p)
            .unwrap()
            .set_modified(t)
            .unwrap();
    }
    #[allow(unsafe_code)]
    // SAFETY: plain kill syscall.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGHUP);
    }
    let start = std::time::Instant::now();
    loop {
        let r = client()
            .get(&health)
            .send()
            .await
            .expect("still serving after SIGHUP");
        if cert_of(&r) != first {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "SIGHUP did not read the certificate"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP ended the process"
    );
    let _ = child.kill();
    let _ = child.wait();

    // Another pair's key: refused at start, naming the file.
    let (_, other_key) = write("other");
    let out = offline(bin(), free_port(), dir.path())
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&other_key)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("other.key") && err.contains("does not match"),
        "{err}"
    );
}

/// Without a token, a non-loopback address is refused at start (status 1, a message that says
/// what to do) unless `--allow-unauthenticated` or its variable says so; with a token it starts.
#[test]
fn a_non_loopback_address_without_a_token_needs_allow_unauthenticated() {
    let dir = tempfile::tempdir().unwrap();
    let command = |port: u16, args: &[&str], env: &[(&str, &str)]| {
        let mut c = Command::new(bin());
        c.args(["--host", "0.0.0.0", "--port", &port.to_string()])
            .args(["--a2a-url", "http://127.0.0.1:9/", "--state-dir"])
            .arg(dir.path().join("state"))
            .args(args)
            .env_remove("IAC_CODE_AGUI_AUTH_TOKEN")
            .env_remove("IAC_CODE_AGUI_ALLOW_UNAUTHENTICATED")
            .env_remove("IAC_CODE_AGUI_A2A_URL")
            .envs(env.iter().copied());
        c
    };
    for env in [
        &[][..],
        &[("IAC_CODE_AGUI_ALLOW_UNAUTHENTICATED", "false")][..],
    ] {
        let port = free_port();
        let out = output_within_10s(command(port, &[], env));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert_eq!(
            err.trim(),
            format!(
                "Refusing to listen on 0.0.0.0:{port} without authentication: anyone who reaches \
                 it could use the gateway. Set IAC_CODE_AGUI_AUTH_TOKEN (or auth_token in the \
                 config file) or --auth-jwks (with --auth-issuer and --auth-audience), listen on \
                 a loopback address (--host 127.0.0.1), or pass --allow-unauthenticated \
                 (IAC_CODE_AGUI_ALLOW_UNAUTHENTICATED=true) to serve without authentication."
            )
        );
    }
    let serves = |args: &[&str], env: &[(&str, &str)]| {
        let port = free_port();
        let mut child = command(port, args, env)
            .args(["--idle-shutdown", "1"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let up = wait_health(port, Duration::from_secs(10));
        if up.is_none() {
            let _ = child.kill();
        }
        let out = child.wait_with_output().unwrap();
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(up.is_some(), "{args:?} {env:?}: {log}");
        log
    };
    let log = serves(&["--allow-unauthenticated"], &[]);
    assert!(log.contains("on a non-loopback address"), "{log}");
    serves(&[], &[("IAC_CODE_AGUI_ALLOW_UNAUTHENTICATED", "1")]);
    let log = serves(&[], &[("IAC_CODE_AGUI_AUTH_TOKEN", "tok")]);
    assert!(!log.contains("authentication is off"), "{log}");
}

/// A command's output, with a bound on how long it may take.
fn output_within_10s(mut cmd: Command) -> std::process::Output {
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output().unwrap());
    let start = Instant::now();
    while !waiter.is_finished() {
        if start.elapsed() > Duration::from_secs(10) {
            #[allow(unsafe_code)]
            // SAFETY: plain kill syscall of the child started above.
            unsafe {
                libc::kill(pid as i32, libc::SIGKILL);
            }
            panic!("the gateway started where it must refuse to");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    waiter.join().unwrap()
}

/// The managed kernel runs tools an LLM chooses, as the gateway's user: no process of that user
/// reads the gateway's environment (its secrets) or memory, while it reads any other process of
/// the user's (the control). As root the test drops to an unprivileged user for both (root reads
/// everything).
#[test]
fn the_gateways_environment_is_closed_to_processes_of_its_own_user() {
    use std::os::unix::process::CommandExt as _;
    #[allow(unsafe_code)]
    // SAFETY: plain getter.
    let root = unsafe { libc::geteuid() } == 0;
    let as_user = |c: &mut Command| {
        if root {
            c.uid(10001).gid(10001);
        }
    };
    let dir = tempfile::tempdir().unwrap();
    // The build's directory may be closed to that user (a target directory under root's home):
    // the binary is run from the test's own directory (a hard link, else a copy).
    let exe = dir.path().join("iac-code-agui");
    if std::fs::hard_link(bin(), &exe).is_err() {
        std::fs::copy(bin(), &exe).unwrap();
    }
    if root {
        // The directory (not the link: it would change the build's binary) becomes the user's.
        let chowned = Command::new("chown")
            .arg("10001:10001")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(chowned.success());
    }
    let port = free_port();
    let secret = "the-service-token-nobody-may-read";
    let mut gateway = offline(&exe, port, dir.path());
    gateway
        .env("IAC_CODE_AGUI_AUTH_TOKEN", secret)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    as_user(&mut gateway);
    let mut gateway = gateway.spawn().unwrap();
    let mut other = Command::new("sleep");
    other.arg("30").env("SOME_VARIABLE", "readable");
    as_user(&mut other);
    let mut other = other.spawn().unwrap();
    let ready = wait_health(port, Duration::from_secs(10));
    let read = |pid: u32, file: &str| {
        let mut cat = Command::new("cat");
        cat.arg(format!("/proc/{pid}/{file}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        as_user(&mut cat);
        let out = cat.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let control = (read(other.id(), "environ"), read(other.id(), "maps"));
    let environ = read(gateway.id(), "environ");
    // What a reader of its memory would look at first.
    let maps = read(gateway.id(), "maps");
    let _ = gateway.kill();
    let _ = other.kill();
    let _ = (gateway.wait(), other.wait());
    assert!(ready.is_some(), "the gateway did not start");
    assert!(
        control.0 .0 && control.0 .1.contains("SOME_VARIABLE=readable"),
        "{control:?}"
    );
    assert!(control.1 .0 && !control.1 .1.is_empty(), "{control:?}");
    assert!(!environ.0 && !environ.1.contains(secret), "{environ:?}");
    assert!(!maps.0 && maps.1.is_empty(), "{maps:?}");
}

/// A second gateway on a state directory another one uses is refused at start, naming the
/// process that holds it (it would sweep, replay and retire the first's journal under it); once
/// the first has stopped, the directory is free.
#[test]
fn a_second_gateway_on_a_state_directory_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut first = offline(bin(), port, dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_health(port, Duration::from_secs(10)).expect("health");
    let out = output_within_10s(offline(bin(), free_port(), dir.path()));
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(
        log.contains(&format!("another process (pid {})", first.id()))
            && log.contains("one gateway per state directory"),
        "{log}"
    );
    let _ = first.kill();
    let _ = first.wait();
    let port = free_port();
    let mut again = offline(bin(), port, dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up = wait_health(port, Duration::from_secs(10));
    let _ = again.kill();
    let _ = again.wait();
    assert!(
        up.is_some(),
        "the directory stayed locked after its process ended"
    );
}
