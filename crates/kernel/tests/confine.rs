//! Landlock confinement for real: children started under a `Confinement` reach what it grants
//! and nothing else. Every denial is checked against the same command run unconfined, which
//! succeeds (the tests run as root in CI: nothing but Landlock stands in the way).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kernel::confine::{check_supported, confine, Confinement, Error};

/// `sh -c script`, confined to `c` when given.
fn sh(c: Option<&Confinement>, cwd: &Path, script: &str) -> Output {
    run(c, cwd, Command::new("/bin/sh").arg("-c").arg(script))
}

fn run(c: Option<&Confinement>, cwd: &Path, cmd: &mut Command) -> Output {
    cmd.current_dir(cwd).stdin(Stdio::null());
    if let Some(c) = c {
        confine(cmd, c).expect("confine");
    }
    cmd.output().expect("spawn")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The command succeeded; its stdout.
fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{:?}: {} {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The command failed with a Landlock denial (EACCES or EPERM; EXDEV for a link or rename out
/// of what the kernel may reach); its stderr.
fn denied(out: Output) -> String {
    let err = text(&out.stderr);
    assert!(!out.status.success(), "allowed: {}", text(&out.stdout));
    let denials = ["Permission denied", "not permitted", "cross-device"];
    assert!(denials.iter().any(|d| err.contains(d)), "{err}");
    err
}

/// A system program's confinement, with `rw` read-write.
fn confinement(program: &str, rw: &[&Path]) -> Confinement {
    let mut c = Confinement::runtime(Path::new(program));
    c.read_write.extend(rw.iter().map(|p| p.to_path_buf()));
    c
}

#[test]
fn this_machine_enforces_every_rule() {
    assert_eq!(check_supported(), Ok(()));
}

#[test]
fn a_kernel_reaches_its_own_files_and_no_one_elses() {
    let mine = tempfile::tempdir().expect("tempdir");
    let theirs = tempfile::tempdir().expect("tempdir");
    let t = theirs.path().display();
    std::fs::write(theirs.path().join("secret"), "their secret\n").expect("secret");
    std::os::unix::fs::symlink(theirs.path().join("secret"), mine.path().join("link"))
        .expect("symlink");
    std::os::unix::fs::symlink(theirs.path(), mine.path().join("dir")).expect("symlink");
    let c = confinement("/bin/sh", &[mine.path()]);
    let cwd = mine.path();

    let mut steps = String::from("echo hello > f && cat f && mkdir d && mv f d/g && rm d/g");
    steps += " && rmdir d && : > /dev/null && head -c 4 /dev/urandom | wc -c";
    assert_eq!(ok(sh(Some(&c), cwd, &steps)), "hello\n4\n");

    let attempts = [
        format!("cat {t}/secret"),
        format!("ls {t}"),
        format!("echo x > {t}/new"),
        format!("echo x >> {t}/secret"),
        format!("rm {t}/secret"),
        // Out through a symlink, a hard link or a rename: the same denial.
        "cat link".to_owned(),
        "ls dir/".to_owned(),
        format!("ln {t}/secret hard"),
        format!("mv {t}/secret stolen"),
        // Nothing else writable or readable: the shared temporary directory, root's home.
        format!(
            "echo x > {}/confine-test-{}",
            std::env::temp_dir().display(),
            std::process::id()
        ),
        "ls /root".to_owned(),
        // No device node, even for root (no CAP_MKNOD, and no rule grants one).
        "mknod sda b 8 0".to_owned(),
    ];
    for attempt in &attempts {
        denied(sh(Some(&c), cwd, attempt));
    }
    assert_eq!(
        std::fs::read_to_string(theirs.path().join("secret")).expect("intact"),
        "their secret\n"
    );
    let left: Vec<_> = std::fs::read_dir(mine.path())
        .expect("mine")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    // Unconfined, the same reads go through: only Landlock refused them.
    assert_eq!(ok(sh(None, cwd, "cat link")), "their secret\n");
    ok(sh(None, cwd, &format!("ls {t}")));
    if std::fs::read_dir("/root").is_ok() {
        ok(sh(None, cwd, "ls /root"));
    }
}

#[test]
fn a_kernel_cannot_read_or_signal_another_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    let peer = Peer(
        Command::new("sleep")
            .arg("30")
            .env("PEER_SECRET", "s3cr3t-of-the-peer")
            .spawn()
            .expect("sleep"),
    );
    let pid = peer.0.id();
    let c = confinement("/bin/sh", &[dir.path()]);
    let environ = format!("cat /proc/{pid}/environ");
    let signal = format!("kill -0 {pid}");

    // Unconfined, the same uid reads and signals it.
    assert!(ok(sh(None, dir.path(), &environ)).contains("s3cr3t-of-the-peer"));
    ok(sh(None, dir.path(), &signal));
    // Confined: neither, though /proc is readable and its own process is its to signal.
    let out = sh(Some(&c), dir.path(), &environ);
    assert!(!text(&out.stdout).contains("s3cr3t"));
    denied(out);
    denied(sh(Some(&c), dir.path(), &signal));
    assert_eq!(
        ok(sh(Some(&c), dir.path(), "kill -0 $$ && echo signalled")),
        "signalled\n"
    );
}

/// Another process (another user's kernel, the gateway), killed when the test ends.
struct Peer(std::process::Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `Cap*` and `NoNewPrivs` lines of a `/proc/<pid>/status`.
fn privileges(status: &str) -> Vec<(String, String)> {
    status
        .lines()
        .filter(|l| l.starts_with("Cap") || l.starts_with("NoNewPrivs"))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

#[test]
fn a_kernel_has_no_capability_and_gains_none() {
    let dir = tempfile::tempdir().expect("tempdir");
    let c = confinement("/bin/sh", &[dir.path()]);
    let mine = std::fs::read_to_string("/proc/self/status").expect("status");
    let mine = privileges(&mine);
    let theirs = privileges(&ok(sh(Some(&c), dir.path(), "cat /proc/self/status")));
    let zero = "0000000000000000";
    // CAP_SETPCAP (8) lets the bounding set be emptied too.
    let setpcap = mine
        .iter()
        .find(|(k, _)| k == "CapEff")
        .and_then(|(_, v)| u64::from_str_radix(v, 16).ok())
        .is_some_and(|eff| eff & (1 << 8) != 0);
    for (k, v) in &theirs {
        match k.as_str() {
            "NoNewPrivs" => assert_eq!(v, "1"),
            "CapBnd" if !setpcap => {}
            _ => assert_eq!(v, zero, "{k}: {theirs:?}"),
        }
    }
    // Read by `cat`, executed by the shell: an exec as root gave nothing back.
    assert_eq!(theirs.len(), 6, "{theirs:?}");
}

/// Whether `listener` (non-blocking) accepts a connection within `within`.
fn accepts(listener: &TcpListener, within: Duration) -> bool {
    let start = Instant::now();
    loop {
        match listener.accept() {
            Ok(_) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
        if start.elapsed() > within {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.set_nonblocking(true).expect("nonblocking");
    let port = l.local_addr().expect("addr").port();
    (l, port)
}

#[test]
fn a_kernel_connects_only_to_the_listed_ports() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (listed, listed_port) = listener();
    let (other, other_port) = listener();
    let mut c = confinement("/bin/bash", &[dir.path()]);
    c.connect_ports = vec![listed_port];
    let connect = |port: u16| format!("exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected");
    let bash = |c: Option<&Confinement>, script: &str| {
        run(
            c,
            dir.path(),
            Command::new("/bin/bash").arg("-c").arg(script),
        )
    };

    assert_eq!(ok(bash(Some(&c), &connect(listed_port))), "connected\n");
    assert!(accepts(&listed, Duration::from_secs(5)));
    denied(bash(Some(&c), &connect(other_port)));
    assert!(!accepts(&other, Duration::from_millis(200)));
    // Unconfined, the other port is open.
    ok(bash(None, &connect(other_port)));
    assert!(accepts(&other, Duration::from_secs(5)));
}

/// The machine's Python: its executable and its prefix (outside the system paths under pyenv).
fn python() -> (PathBuf, PathBuf) {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys; print(sys.executable); print(sys.base_prefix)",
        ])
        .output()
        .expect("python3 (the tests need one)");
    let text = ok(out);
    let mut lines = text.lines().map(PathBuf::from);
    (
        lines.next().expect("executable"),
        lines.next().expect("prefix"),
    )
}

/// `python -c code args…` confined to `c` (with Python's prefix read-only), or not.
fn py(c: Option<&Confinement>, cwd: &Path, code: &str, args: &[String]) -> Output {
    let (exe, prefix) = python();
    let c = c.map(|c| {
        let mut c = c.clone();
        c.read_only.push(prefix);
        c
    });
    run(
        c.as_ref(),
        cwd,
        Command::new(exe).arg("-c").arg(code).args(args),
    )
}

#[test]
fn a_kernel_binds_only_its_own_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let free = || {
        TcpListener::bind("127.0.0.1:0")
            .expect("bind")
            .local_addr()
            .expect("addr")
            .port()
    };
    let (own, other) = (free(), free());
    let mut c = Confinement::runtime(&python().0);
    c.read_write.push(dir.path().to_path_buf());
    c.bind_ports = vec![own];
    let bind = "import socket, sys\ns = socket.socket()\n\
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
                s.bind(('127.0.0.1', int(sys.argv[1])))\ns.listen()\nprint('bound')";

    assert_eq!(
        ok(py(Some(&c), dir.path(), bind, &[own.to_string()])),
        "bound\n"
    );
    denied(py(Some(&c), dir.path(), bind, &[other.to_string()]));
    assert_eq!(
        ok(py(None, dir.path(), bind, &[other.to_string()])),
        "bound\n"
    );
}

/// Multipath TCP (protocol 262) falls back to plain TCP against any server, and Landlock's
/// TCP rules do not see it: the seccomp filter refuses such a socket, as it does SCTP, while a
/// TCP socket to a listed port still connects and UDP stays as it was.
#[test]
fn a_kernel_cannot_get_past_the_port_rules_with_another_protocol() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (l, port) = listener();
    let (exe, _) = python();
    let mut c = Confinement::runtime(&exe);
    c.read_write.push(dir.path().to_path_buf());
    c.connect_ports = vec![port];
    let open = "import socket, sys\nproto = int(sys.argv[1])\n\
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, proto)\n\
                s.connect(('127.0.0.1', int(sys.argv[2])))\nprint('connected')";
    let args = |proto: i32| [proto.to_string(), port.to_string()];
    for proto in [262, 132] {
        let out = py(Some(&c), dir.path(), open, &args(proto));
        assert!(
            text(&out.stderr).contains("PermissionError"),
            "protocol {proto}: {out:?}"
        );
    }
    // Without confinement, MPTCP would have reached the listener (where the machine has it).
    let plain = py(None, dir.path(), open, &args(262));
    let mptcp_here =
        std::fs::read_to_string("/proc/sys/net/mptcp/enabled").is_ok_and(|v| v.trim() == "1");
    if mptcp_here {
        assert_eq!(ok(plain), "connected\n");
    }
    assert_eq!(ok(py(Some(&c), dir.path(), open, &args(6))), "connected\n");
    assert_eq!(ok(py(Some(&c), dir.path(), open, &args(0))), "connected\n");
    let udp = "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\nprint('udp')";
    assert_eq!(ok(py(Some(&c), dir.path(), udp, &[])), "udp\n");
    drop(l);
}

/// A pathname UNIX socket (another user's agent socket, the uid's own services) is out of
/// reach: no UNIX socket can be opened; a socket pair (an event loop's) still can.
#[test]
fn a_kernel_opens_no_unix_socket_but_a_socket_pair() {
    use std::os::unix::net::UnixListener;
    let dir = tempfile::tempdir().expect("tempdir");
    let other = tempfile::tempdir().expect("tempdir");
    let path = other.path().join("agent.sock");
    let server = UnixListener::bind(&path).expect("bind");
    let (exe, _) = python();
    let mut c = Confinement::runtime(&exe);
    c.read_write.push(dir.path().to_path_buf());
    let connect = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\n\
                   s.connect(sys.argv[1])\nprint('connected')";
    let arg = [path.display().to_string()];
    let out = py(Some(&c), dir.path(), connect, &arg);
    assert!(text(&out.stderr).contains("PermissionError"), "{out:?}");
    assert_eq!(ok(py(None, dir.path(), connect, &arg)), "connected\n");
    let pair = "import socket\na, b = socket.socketpair()\na.send(b'x')\nprint(b.recv(1).decode())";
    assert_eq!(ok(py(Some(&c), dir.path(), pair, &[])), "x\n");
    drop(server);
}

/// A kernel changes its own limits, priority and CPUs, never another process's of its uid (a
/// kernel of another user's, the fork server every kernel is forked from): Linux lets a uid,
/// and Landlock does not govern it.
#[test]
fn a_kernel_changes_no_other_processs_limits_priority_or_scheduling() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut other = Command::new("sleep").arg("30").spawn().expect("sleep");
    let (exe, _) = python();
    let mut c = Confinement::runtime(&exe);
    c.read_write.push(dir.path().to_path_buf());
    let code = "import os, resource, sys\n\
        pid = int(sys.argv[1])\n\
        def t(name, f):\n    \
            try:\n        f(); print(name, 'allowed')\n    \
            except OSError as e:\n        print(name, 'denied', e.errno)\n\
        t('own-rlimit', lambda: resource.setrlimit(resource.RLIMIT_CORE, (0, 0)))\n\
        t('own-nice', lambda: os.setpriority(os.PRIO_PROCESS, 0, min(19, os.getpriority(os.PRIO_PROCESS, 0) + 1)))\n\
        t('own-cpus', lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))\n\
        t('rlimit', lambda: resource.prlimit(pid, resource.RLIMIT_CPU, (1, 1)))\n\
        t('nice', lambda: os.setpriority(os.PRIO_PROCESS, pid, 19))\n\
        t('nice-group', lambda: os.setpriority(os.PRIO_PGRP, pid, 19))\n\
        t('nice-user', lambda: os.setpriority(os.PRIO_USER, 0, 19))\n\
        t('cpus', lambda: os.sched_setaffinity(pid, {0}))\n\
        t('scheduler', lambda: os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0)))\n\
        t('param', lambda: os.sched_setparam(pid, os.sched_param(0)))\n";
    let arg = [other.id().to_string()];
    let confined = ok(py(Some(&c), dir.path(), code, &arg));
    for own in ["own-rlimit", "own-nice", "own-cpus"] {
        assert!(confined.contains(&format!("{own} allowed")), "{confined}");
    }
    for call in [
        "rlimit",
        "nice",
        "nice-group",
        "nice-user",
        "cpus",
        "scheduler",
        "param",
    ] {
        assert!(
            confined.contains(&format!("{call} denied 13")),
            "{call}: {confined}"
        );
    }
    // Unconfined, the same uid may: what the filter takes away.
    let free = ok(py(None, dir.path(), code, &arg));
    for call in ["rlimit", "nice", "cpus"] {
        assert!(free.contains(&format!("{call} allowed")), "{call}: {free}");
    }
    let _ = other.kill();
    let _ = other.wait();
}

#[test]
fn a_kernel_cannot_reach_an_abstract_unix_socket_outside() {
    use std::os::linux::net::SocketAddrExt as _;
    use std::os::unix::net::{SocketAddr, UnixListener};
    let dir = tempfile::tempdir().expect("tempdir");
    let name = format!("iac-code-agui-confine-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("name");
    let server = UnixListener::bind_addr(&addr).expect("bind");
    let (exe, _) = python();
    let mut c = Confinement::runtime(&exe);
    c.read_write.push(dir.path().to_path_buf());
    let connect = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\n\
                   s.connect('\\0' + sys.argv[1])\nprint('connected')";

    let out = py(Some(&c), dir.path(), connect, std::slice::from_ref(&name));
    assert!(text(&out.stderr).contains("PermissionError"), "{out:?}");
    assert_eq!(ok(py(None, dir.path(), connect, &[name])), "connected\n");
    drop(server);
}

#[test]
fn a_path_that_is_not_there_is_refused_before_anything_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let gone = dir.path().join("not-yet");
    let c = confinement("/bin/sh", &[&gone]);
    let mut cmd = Command::new("/bin/sh");
    match confine(&mut cmd, &c) {
        Err(e @ Error::Path { .. }) => {
            assert!(e.to_string().contains("not-yet"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn one_confined_command_spawns_again_under_the_same_rules() {
    let mine = tempfile::tempdir().expect("tempdir");
    let theirs = tempfile::tempdir().expect("tempdir");
    let c = confinement("/bin/sh", &[mine.path()]);
    let mut cmd = Command::new("/bin/sh");
    let script = format!(
        "ls {} && ! ls {} 2> /dev/null",
        mine.path().display(),
        theirs.path().display()
    );
    cmd.arg("-c").arg(script).stdout(Stdio::null());
    confine(&mut cmd, &c).expect("confine");
    for _ in 0..2 {
        assert!(cmd.status().expect("spawn").success());
    }
}
