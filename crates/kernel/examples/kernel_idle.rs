//! What an idle user's kernel costs, forked and spawned, measured the way the density issue's
//! table was: each kernel started (`--kernel-isolation user`'s directories, confinement and uid)
//! until its `/health` answers, then its own memory while idle. Run by
//! `scripts/kernel-density.sh`:
//!
//!     cargo run --release -p kernel --example kernel_idle -- PROGRAM [KERNELS] [UID]
//!
//! PROGRAM: the `iac-code` console script; KERNELS per way (default 6); UID: the kernels' uid
//! (as root: required, e.g. 65534). Prints a Markdown table's rows.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kernel::confine::Confinement;
use kernel::isolate::Isolation;
use kernel::zygote::{interpreter_of, ForkServer};
use kernel::{ChildSpec, Kernel, KernelState, Launch};

fn kib(pid: u64, fields: &[&str]) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    text.lines()
        .filter(|l| fields.iter().any(|f| l.starts_with(&format!("{f}:"))))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn passable(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711)).unwrap();
}

fn isolation(program: &str, root: &Path, uid: Option<u32>) -> Isolation {
    let mut launch = Launch::new(program);
    launch.envs([
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("LANG", "C.UTF-8"),
        ("IAC_CODE_PROVIDER", "OpenAI Compatible"),
        ("IAC_CODE_BASE_URL", "http://127.0.0.1:9/v1"),
        ("IAC_CODE_API_KEY", "k"),
        ("IAC_CODE_MODEL", "m"),
        ("DISABLE_TELEMETRY", "1"),
        ("IAC_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ]);
    let mut runtime = Confinement::runtime(Path::new(program));
    runtime.connect_ports = vec![443];
    passable(&root.join("kernels"));
    passable(&root.join("ws"));
    Isolation {
        base: ChildSpec {
            launch,
            ready_timeout: Duration::from_secs(60),
            timeouts: a2a::Timeouts::default(),
        },
        kernels_root: root.join("kernels"),
        workspace_roots: vec![root.join("ws")],
        persistence_root: None,
        backup_root: None,
        identity: uid.map(|u| (u, u)),
        runtime,
        fork: None,
        user_env: None,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let program = args
        .get(1)
        .expect("PROGRAM: the iac-code console script")
        .clone();
    let count: usize = args.get(2).map_or(6, |n| n.parse().expect("KERNELS"));
    let uid: Option<u32> = args.get(3).map(|u| u.parse().expect("UID"));
    let rt = tokio::runtime::Runtime::new().unwrap();
    for way in ["fork", "spawn"] {
        let dir = tempfile::tempdir().unwrap();
        passable(dir.path());
        let mut iso = isolation(&program, dir.path(), uid);
        let mut zygote_kib = 0;
        if way == "fork" {
            let python: PathBuf = interpreter_of(Path::new(&program)).expect("a console script");
            let server = ForkServer::start(iso.fork_server_spec(python, &[]).unwrap());
            assert!(
                server.wait_ready(Duration::from_secs(180)),
                "the fork server"
            );
            iso.fork = Some(server);
        }
        let mut kernels: Vec<Arc<Kernel>> = Vec::new();
        let mut starts = Vec::new();
        for i in 0..count {
            let spec = iso.spec_for(&format!("u{i:032}")).unwrap().spec;
            let began = Instant::now();
            let k = Kernel::managed(spec, None);
            while k.state() != KernelState::Ready {
                assert!(began.elapsed() < Duration::from_secs(60), "{:?}", k.state());
                std::thread::sleep(Duration::from_millis(5));
            }
            starts.push(began.elapsed().as_secs_f64());
            kernels.push(k);
        }
        std::thread::sleep(Duration::from_secs(2));
        let pids: Vec<u64> = kernels
            .iter()
            .filter_map(|k| k.health()["pid"].as_u64())
            .collect();
        assert_eq!(pids.len(), count);
        let uss: Vec<f64> = pids
            .iter()
            .map(|&p| kib(p, &["Private_Clean", "Private_Dirty"]) as f64 / 1024.0)
            .collect();
        let pss: Vec<f64> = pids
            .iter()
            .map(|&p| kib(p, &["Pss"]) as f64 / 1024.0)
            .collect();
        if iso.fork.is_some() {
            // The fork server: every forked kernel's parent.
            let stat = std::fs::read_to_string(format!("/proc/{}/stat", pids[0])).unwrap();
            let zygote = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1));
            zygote_kib = kib(zygote.unwrap().parse().unwrap(), &["Rss"]);
        }
        let uss_m = median(uss);
        let fit = ((24.0 * 1024.0 - zygote_kib as f64 / 1024.0) / uss_m) as u64;
        println!(
            "| {way} | {:.0} ms | {uss_m:.1} MiB / {:.1} MiB | {fit} |",
            median(starts) * 1000.0,
            median(pss),
        );
        rt.block_on(async {
            futures_util::future::join_all(kernels.iter().map(|k| k.stop())).await;
        });
        if let Some(server) = &iso.fork {
            server.stop();
        }
    }
}
