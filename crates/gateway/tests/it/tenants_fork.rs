//! Users' kernels forked by the kernel fork server (`--kernel-start fork`, the default), through
//! the binary with the real kernel and the scripted fake LLM: a forked kernel's first turn
//! imports (almost) nothing, the kernel is its user's (environment, directories, uid) while the
//! fork server holds nothing of any user's, the fork server comes back when killed (kernels are
//! spawned meanwhile), twelve users' kernels run at once, and `--kernel-start spawn` spawns.
//! The rest of the isolation tier (`tenants_real`, `tenants_chaos`, `tenants_cluster`: turns,
//! interrupts, restore after an idle stop, a kernel killed mid-turn, every attack probe) runs
//! on forked kernels too.

use std::time::{Duration, Instant};

use serde_json::json;
use testkit::real_kernel::alive;

use crate::tenants_real::{fork_server_of, is_root, parent_of, port_of, Tenanted};

/// The modules a forked kernel imported after the fork, from the gateway's log.
fn late_imports(log: &str) -> Vec<String> {
    log.lines()
        .filter_map(|l| l.split("late import ").nth(1))
        .map(|rest| {
            rest.split_whitespace()
                .next()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// Whether the writable memory of process `pid` holds `needle` (read through `/proc`, as its
/// uid or root may).
pub(crate) fn memory_holds(pid: u32, needle: &[u8]) -> bool {
    let mut found = false;
    each_region(pid, |buf| {
        found = found || buf.windows(needle.len()).any(|w| w == needle);
    });
    found
}

/// Calls `f` with each writable region of process `pid`'s memory (but the kernel's vdso and
/// vvar pages).
pub(crate) fn each_region(pid: u32, mut f: impl FnMut(&[u8])) {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if !fields[1].starts_with("rw") || fields.get(5).is_some_and(|n| n.starts_with("[v")) {
            continue;
        }
        let (a, b) = fields[0].split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let mut buf = vec![0u8; (b - a) as usize];
        if mem.seek(SeekFrom::Start(a)).is_err() || mem.read_exact(&mut buf).is_err() {
            continue;
        }
        f(&buf);
    }
}

/// A process's own memory: what it shares with no other process (Private_Clean and
/// Private_Dirty of `smaps_rollup`), in KiB.
pub(crate) fn private_kib(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    text.lines()
        .filter(|l| l.starts_with("Private_Clean:") || l.starts_with("Private_Dirty:"))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// A user's first turn with a tool call runs in a kernel forked from the fork server, which
/// imported what that turn needs: the kernel imports next to nothing after the fork (what the
/// fork server's preload list, `crates/kernel/zygote/preload.txt`, missed; a spawned kernel
/// imports about 4,000 modules during its first turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forked_kernels_first_turn_imports_little() {
    let t = Tenanted::start_env(true, 2, &[], &[("IAC_CODE_AGUI_ZYGOTE_TRACE_IMPORTS", "1")]).await;
    let ws = t.root_of("alice").join("p");
    let out = t.bash("alice", "a-1", &ws, "echo first-turn-ok").await;
    assert!(out.contains("first-turn-ok"), "{out}");
    t.hello("alice", "a-2", "r1").await;
    let h = t.health().await;
    assert_eq!(h["kernel"]["forkServer"]["forked"], 1, "{h}");
    let log = t.gw.log();
    // (That the trace names a module imported after it is set: `kernel::zygote::tests`.)
    assert!(
        log.contains("iac-code-agui zygote: tracing late imports"),
        "{log}"
    );
    let late = late_imports(&log);
    eprintln!("late imports: {late:?}");
    assert!(
        late.len() <= 10,
        "a forked kernel's first turn imported {} modules: {late:?}",
        late.len()
    );
}

/// A forked kernel runs as its user's: the bash tool sees that user's HOME, TMPDIR and
/// configuration directory, the kernels' uid, the kernel's name; the fork server's own
/// environment has no user's directory and no credential (the LLM key reaches each kernel in
/// its request only), and its channel is no descriptor of the kernel's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forked_kernel_is_its_users_and_the_fork_server_holds_nothing_of_theirs() {
    let t = Tenanted::start(2, &[]).await;
    let key = kernel::tenant::user_key(Some("alice"));
    let ws = t.root_of("alice").join("p");
    let out = t
        .bash(
            "alice",
            "a-1",
            &ws,
            "echo \"H=$HOME T=$TMPDIR C=$IAC_CODE_CONFIG_DIR K=$IAC_CODE_API_KEY U=$(id -u) P=$PWD\"",
        )
        .await;
    let kernels = t.env.state_dir().join("kernels").join(&key);
    for want in [
        format!("H={}", kernels.join("home").display()),
        format!("T={}", kernels.join("tmp").display()),
        format!("C={}", kernels.join("home/.iac-code").display()),
        format!("P={}", ws.display()),
    ] {
        assert!(out.contains(&want), "{want} not in {out}");
    }
    // The kernel has the LLM's key (it calls the LLM itself).
    assert!(!out.contains("K= "), "{out}");
    if is_root() {
        assert!(out.contains("U=65534"), "{out}");
    }
    let kernel = t.kernel_of("alice").await.expect("alice's kernel");
    let zygote = fork_server_of(t.gw.pid());
    assert_eq!(parent_of(kernel), Some(zygote), "forked by the fork server");
    let comm = std::fs::read_to_string(format!("/proc/{kernel}/comm")).unwrap();
    assert_eq!(comm.trim(), "iac-code-kernel");
    // Under memory pressure the kernel goes before the fork server.
    let oom = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap();
    assert_eq!((oom(kernel).trim(), oom(zygote).trim()), ("300", "0"));
    // The fork server's environment: nobody's HOME, no key, no user's directory.
    let environ = std::fs::read(format!("/proc/{zygote}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(
        environ.split('\0').any(|v| v == "HOME=/nonexistent"),
        "{environ}"
    );
    let api_key = t
        .env
        .vars()
        .into_iter()
        .find(|(k, _)| k == "IAC_CODE_API_KEY")
        .map(|(_, v)| v)
        .expect("the environment's LLM key");
    assert!(!environ.contains(&api_key), "{environ}");
    assert!(!environ.contains("IAC_CODE_API_KEY"), "{environ}");
    assert!(!environ.contains(&key), "{environ}");
    // The channel (the fork server's descriptor 3) is none of the kernel's sockets.
    let channel = std::fs::read_link(format!("/proc/{zygote}/fd/3")).unwrap();
    let kernel_fds: Vec<_> = std::fs::read_dir(format!("/proc/{kernel}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect();
    assert!(
        !kernel_fds.contains(&channel),
        "{channel:?} in {kernel_fds:?}"
    );
    // Its listener is its own, on loopback.
    let port = port_of(kernel);
    assert!(port > 0);
    // Under the kernels' uid, like the kernel.
    if is_root() {
        let status = std::fs::read_to_string(format!("/proc/{zygote}/status")).unwrap();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert!(
            uid.split_whitespace().skip(1).all(|u| u == "65534"),
            "{uid}"
        );
        let caps = status.lines().find(|l| l.starts_with("CapEff:")).unwrap();
        assert!(caps.ends_with("0000000000000000"), "{caps}");
    }
}

/// The fork server keeps nothing of a request once it forked it: after alice's kernel was
/// forked, neither the fork server's memory nor that of bob's kernel, forked after hers, holds
/// her key (every one of her directories is named by it in her request).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fork_server_keeps_nothing_of_a_users_request() {
    let t = Tenanted::start(2, &[]).await;
    t.hello("alice", "a-1", "r1").await;
    let zygote = fork_server_of(t.gw.pid());
    let alice = kernel::tenant::user_key(Some("alice"));
    // The control: her kernel has it (its HOME, its configuration directory).
    let alice_kernel = t.kernel_of("alice").await.expect("alice's kernel");
    assert!(memory_holds(alice_kernel, alice.as_bytes()));
    assert!(
        !memory_holds(zygote, alice.as_bytes()),
        "the fork server kept alice's request"
    );
    t.hello("bob", "b-1", "r1").await;
    let bob_kernel = t.kernel_of("bob").await.expect("bob's kernel");
    assert_eq!(parent_of(bob_kernel), Some(zygote));
    assert!(memory_holds(
        bob_kernel,
        kernel::tenant::user_key(Some("bob")).as_bytes()
    ));
    assert!(
        !memory_holds(bob_kernel, alice.as_bytes()),
        "bob's kernel holds alice's key"
    );
}

/// The fork server killed: its kernels die with it (a parent-death signal) and their
/// supervisors start them again; the gateway restarts it after a back-off, spawning users'
/// kernels meanwhile (and saying so), and forks again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fork_server_comes_back_and_kernels_are_spawned_meanwhile() {
    let t = Tenanted::start(3, &[]).await;
    t.hello("alice", "a-1", "r1").await;
    let alice = t.kernel_of("alice").await.expect("alice's kernel");
    let zygote = fork_server_of(t.gw.pid());
    crate::pool_real::signal(zygote as i32, libc::SIGKILL);
    // Bob's kernel starts while the fork server is down: spawned.
    t.hello("bob", "b-1", "r1").await;
    let start = Instant::now();
    while alive(alice) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "alice's kernel outlived its parent"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    t.gw.forking().await;
    let h = t.health().await;
    assert_eq!(h["kernel"]["forkServer"]["restarts"], 1, "{h}");
    assert_ne!(fork_server_of(t.gw.pid()), zygote);
    let log = t.gw.log();
    assert!(log.contains("the kernel fork server is down"), "{log}");
    assert!(
        log.contains("a user's kernel is spawned, not forked"),
        "{log}"
    );
    // Alice's next turn: her kernel came back (forked or spawned), her thread with it.
    t.hello("alice", "a-1", "r2").await;
    // Carol, after the fork server is back: forked again.
    let before = t.health().await["kernel"]["forkServer"]["forked"]
        .as_u64()
        .unwrap();
    t.hello("carol", "c-1", "r1").await;
    let h = t.health().await;
    let forked = h["kernel"]["forkServer"]["forked"].as_u64().unwrap();
    assert!(forked > before, "{h}");
    // The metrics say the same.
    let metrics = t.metrics().await;
    for line in [
        "agui_kernel_fork_server_up 1".to_owned(),
        "agui_kernel_fork_server_restarts_total 1".to_owned(),
        format!("agui_kernels_forked_total {forked}"),
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in {metrics}"
        );
    }
}

/// `--kernel-start spawn`: no fork server; each user's kernel is a new `iac-code a2a` process
/// of the gateway's, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_kernel_start_spawn_each_kernel_is_a_new_process() {
    let t = Tenanted::start(2, &["--kernel-start", "spawn"]).await;
    t.hello("alice", "a-1", "r1").await;
    let h = t.health().await;
    assert_eq!(h["kernel"]["start"], "spawn", "{h}");
    assert!(h["kernel"].get("forkServer").is_none(), "{h}");
    let kernel = t.kernel_of("alice").await.expect("alice's kernel");
    let cmdline = std::fs::read(format!("/proc/{kernel}/cmdline")).unwrap();
    let cmdline = String::from_utf8_lossy(&cmdline);
    assert!(
        cmdline.contains("a2a") && !cmdline.contains("zygote"),
        "{cmdline}"
    );
    assert_eq!(parent_of(kernel), Some(t.gw.pid()));
}

/// Twelve users at once, each a first turn on a kernel of their own: every kernel forked,
/// every turn right, every kernel alive after, each with little memory of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twelve_users_kernels_run_at_once() {
    let t = Tenanted::start(12, &[]).await;
    let users: Vec<String> = (0..12).map(|i| format!("user{i}")).collect();
    let t = &t;
    let turns = users.iter().map(|u| {
        let thread = format!("{u}-t");
        async move { (u.clone(), t.hello(u, &thread, "r1").await) }
    });
    for (u, r) in futures_util::future::join_all(turns).await {
        let text: String = r
            .events
            .iter()
            .filter(|e| e["type"] == "TEXT_MESSAGE_CONTENT")
            .filter_map(|e| e["delta"].as_str())
            .collect();
        assert!(!text.is_empty(), "{u}: {}", r.raw);
    }
    let h = t.health().await;
    assert_eq!(
        (&h["kernel"]["alive"], &h["kernel"]["forkServer"]["forked"]),
        (&json!(12), &json!(12)),
        "{h}"
    );
    let pids = t.kernel_pids().await;
    assert_eq!(pids.len(), 12);
    for pid in pids {
        let kib = private_kib(pid as u32);
        assert!(kib < 80 * 1024, "kernel {pid}: {kib} KiB of its own");
    }
}
