//! `agui-bench`: starts the gateway (release build) in front of a synthetic A2A kernel and
//! measures throughput, fan-in, added latency, parked streams and start-up; optionally the same
//! load against the Python reference (`iac-code agui` from the pinned kernel venv), with ratios.
//!
//!   cargo run --release -p agui-bench -- [--smoke] [--python] [--gateway PATH]
//!                                         [--lat-streams N] [--parked N] [--throughput N]
//!   cargo run --release -p agui-bench -- --compare "ARGS" [--compare-gateway PATH] [--rounds N]
//!                                         [--turn-threads N] [--turns N] [--turn-concurrency N]
//!
//! `--compare` measures throughput, fan-in, CPU per event, whole short turns and admissions, of
//! the gateway as it is and of the variant (the same binary with ARGS added, or
//! `--compare-gateway`), side by side.
//!
//!   cargo run --release -p agui-bench -- --postgres [--rounds N] [--parked N] …
//!
//! `--postgres` runs the whole measurement with the file store and with the PostgreSQL store (a
//! private cluster, `synchronous_commit` on, a fresh database each round), alternating.
//!
//!   cargo run --release -p agui-bench -- --threads [--smoke] [--rounds N] [--thread-count N]
//!                                         [--store file|postgres|both]
//!
//! `--threads` measures the thread routes (connect to a long thread, list a user's threads among
//! many, the rate of whole turns) with the file store and with PostgreSQL, alternating.
//!
//!   cargo run --release -p agui-bench -- --kernels [--smoke] [--rounds N] [--turn-concurrency N]
//!                                         [--turns N]
//!
//! `--kernels` runs whole turns through the real kernel (the pinned venv, the scripted fake LLM)
//! with `--kernels 1` and `--kernels 2`, alternating: turns a second, latency, CPU a turn of
//! gateway and kernels, each kernel's RSS after.
//!
//! The latency test also runs once straight from the synthetic kernel to the client (no gateway):
//! that floor is what the generator, the client and the loopback cost on this machine, and the
//! gateway's own share is the difference. Both ends of the latency test are lean on purpose (one
//! generator thread for all paced streams, a plain-socket client with a substring search), so
//! that they leave the shared cores to what is measured.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::StreamExt;
use serde_json::json;
use testkit::synthetic_kernel::{now_micros, SyntheticKernel};
use testkit::{free_port, raise_fd_limit};

mod compare;
mod gateway;
mod kernels;
mod latency;
mod threads;

use gateway::{cpu_ms, rss_kib, start, Gateway};
use kernels::{LOAD_FULL, LOAD_SMOKE};
use latency::{direct_latency, latency_stream, percentiles, read_events};
use threads::{THREADS_FULL, THREADS_SMOKE};

#[derive(Clone, Copy)]
struct Sizes {
    throughput: u64,
    fan_runs: usize,
    fan_deltas: u64,
    parked: usize,
    lat_streams: usize,
    lat_rate: u64,
    lat_secs: u64,
    /// Whole short turns of `--compare`: threads, and turns a thread (one after another).
    turn_threads: usize,
    turns: usize,
    /// Threads whose turns run at once.
    turn_concurrency: usize,
}

const FULL: Sizes = Sizes {
    throughput: 50_000,
    fan_runs: 32,
    fan_deltas: 2_000,
    parked: 9_000,
    lat_streams: 100,
    lat_rate: 1_000,
    lat_secs: 3,
    turn_threads: 400,
    turns: 5,
    turn_concurrency: 32,
};

const SMOKE: Sizes = Sizes {
    throughput: 2_000,
    fan_runs: 4,
    fan_deltas: 200,
    parked: 50,
    lat_streams: 5,
    lat_rate: 200,
    lat_secs: 1,
    turn_threads: 20,
    turns: 2,
    turn_concurrency: 8,
};

#[derive(Debug, Default, Clone)]
struct Report {
    ready_ms: f64,
    throughput_eps: f64,
    fan_in_s: f64,
    /// Gateway CPU (user + system) per event of the throughput and fan-in runs: steadier than
    /// wall-clock rates on a shared machine.
    event_cpu_us: f64,
    lat_p50_us: f64,
    lat_p99_us: f64,
    /// Gateway CPU per event of the paced streams (the latency test: many slow streams at once,
    /// each event its own write; admissions included).
    paced_cpu_us: f64,
    parked_admitted: usize,
    parked_rss_kib_per_stream: f64,
    /// Gateway CPU time per admission (µs), all its threads.
    admission_cpu_us: f64,
    admission_rps: f64,
    /// Request → `RUN_STARTED` of one admission.
    admit_p50_us: f64,
    admit_p99_us: f64,
}

enum Target {
    /// The gateway binary and extra arguments (a variant of the configuration).
    Rust(PathBuf, Vec<String>),
    Python(PathBuf),
}

fn body(ws: &std::path::Path, thread: &str, text: &str) -> String {
    json!({"threadId": thread, "runId": "r1", "state": {}, "messages": [{"id": "m", "role": "user", "content": text}],
           "tools": [], "context": [], "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "bench", "cwd": ws}}})
    .to_string()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client")
}

/// Posts a run and counts the events of its stream; calls `on_event` with each event's JSON text.
async fn run(
    c: &reqwest::Client,
    g: &Gateway,
    thread: &str,
    text: &str,
    on_event: impl FnMut(&[u8]),
) -> Result<usize> {
    let resp = c
        .post(&g.url)
        .header("content-type", "application/json")
        .body(body(&g.ws, thread, text))
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!("HTTP {}", resp.status());
    }
    read_events(resp, b"\n\n", on_event).await
}

/// `z.fan_runs` runs of `z.fan_deltas` deltas at once: how long until the last ends (s).
async fn fan_in(c: &reqwest::Client, g: &Arc<Gateway>, z: Sizes) -> Result<f64> {
    let t = Instant::now();
    let mut tasks = vec![];
    for i in 0..z.fan_runs {
        let (c, g) = (c.clone(), g.clone());
        let text = format!("deltas:{}", z.fan_deltas);
        tasks.push(tokio::spawn(async move {
            run(&c, &g, &format!("fan-{i}"), &text, |_| {}).await
        }));
    }
    for t in tasks {
        let n = t.await??;
        if n < z.fan_deltas as usize {
            bail!("fan-in run lost events: {n}");
        }
    }
    Ok(t.elapsed().as_secs_f64())
}

async fn measure(target: &Target, kernel: &SyntheticKernel, z: Sizes) -> Result<Report> {
    let mut rep = Report::default();
    let g = start(target, kernel).await?;
    rep.ready_ms = g.ready.as_secs_f64() * 1000.0;
    let c = client();

    // Throughput: one run.
    let pid = g.child.id();
    let cpu_before = cpu_ms(pid);
    let t = Instant::now();
    let n = run(&c, &g, "tp", &format!("deltas:{}", z.throughput), |_| {}).await?;
    rep.throughput_eps = n as f64 / t.elapsed().as_secs_f64();

    // Fan-in.
    let g = Arc::new(g);
    rep.fan_in_s = fan_in(&c, &g, z).await?;
    let events = z.throughput + (z.fan_runs as u64) * z.fan_deltas;
    rep.event_cpu_us = cpu_ms(pid).saturating_sub(cpu_before) as f64 * 1000.0 / events as f64;

    // Added latency: kernel send time (in the delta) → client read.
    let mut tasks = vec![];
    let paced_cpu_before = cpu_ms(pid);
    let per = z.lat_rate * z.lat_secs;
    let interval = 1_000_000 / z.lat_rate;
    for i in 0..z.lat_streams {
        let g = g.clone();
        tasks.push(tokio::spawn(async move {
            // Steady state: the first 100 deltas of a run wait for the run's durable start (task
            // id and session written with fsync before anything is announced) and are not counted.
            let text = format!("paced:{per}:{interval}");
            let run = body(&g.ws, &format!("lat-{i}"), &text);
            let addr = g.url.trim_start_matches("http://").trim_end_matches('/');
            latency_stream(addr, "/", &run, b"\"delta\":\"", 100, per as usize).await
        }));
    }
    let mut all: Vec<u64> = vec![];
    for t in tasks {
        all.extend(t.await??);
    }
    let paced_events = (z.lat_streams as u64 * per).max(1);
    rep.paced_cpu_us =
        cpu_ms(pid).saturating_sub(paced_cpu_before) as f64 * 1000.0 / paced_events as f64;
    (rep.lat_p50_us, rep.lat_p99_us) = percentiles(all);

    // Parked streams: all admitted, RSS growth, admission rate.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let p = park(&c, &g, z.parked).await?;
    rep.parked_admitted = p.admitted;
    rep.parked_rss_kib_per_stream = p.rss_kib_per_stream;
    rep.admission_rps = p.rps;
    rep.admission_cpu_us = p.cpu_us;
    (rep.admit_p50_us, rep.admit_p99_us) = (p.p50_us, p.p99_us);
    Ok(rep)
}

/// What admitting parked streams measured.
struct Parked {
    admitted: usize,
    rss_kib_per_stream: f64,
    rps: f64,
    /// Gateway CPU per admission (µs).
    cpu_us: f64,
    p50_us: f64,
    p99_us: f64,
}

/// Admits `n` streams that stay open (256 at a time), then lets them go.
async fn park(c: &reqwest::Client, g: &Arc<Gateway>, n: usize) -> Result<Parked> {
    let pid = g.child.id();
    let before = rss_kib(pid);
    let cpu_before = cpu_ms(pid);
    let t = Instant::now();
    let sem = Arc::new(tokio::sync::Semaphore::new(256));
    let admitted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let failed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let admit_us = Arc::new(std::sync::Mutex::new(Vec::with_capacity(n)));
    let (hold_tx, hold_rx) = tokio::sync::watch::channel(false);
    let mut tasks = vec![];
    for i in 0..n {
        let (c, g, sem, mut hold) = (c.clone(), g.clone(), sem.clone(), hold_rx.clone());
        let (admitted, failed, admit_us) = (admitted.clone(), failed.clone(), admit_us.clone());
        tasks.push(tokio::spawn(async move {
            let permit = sem.acquire_owned().await.expect("semaphore");
            let began = Instant::now();
            let resp = c
                .post(&g.url)
                .header("content-type", "application/json")
                .body(body(&g.ws, &format!("park-{i}"), "park:600000"))
                .send()
                .await;
            let mut s = match resp {
                Ok(r) if r.status().is_success() => r.bytes_stream(),
                _ => {
                    failed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    return;
                }
            };
            match s.next().await {
                Some(Ok(b)) if b.windows(11).any(|w| w == b"RUN_STARTED") => {
                    admitted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    admit_us
                        .lock()
                        .expect("samples")
                        .push(began.elapsed().as_micros() as u64);
                }
                _ => {
                    failed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    return;
                }
            }
            drop(permit);
            let _ = hold.wait_for(|v| *v).await;
            drop(s);
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    while admitted.load(std::sync::atomic::Ordering::SeqCst)
        + failed.load(std::sync::atomic::Ordering::SeqCst)
        < n
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let admit_elapsed = t.elapsed();
    let admit_cpu_ms = cpu_ms(pid).saturating_sub(cpu_before);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = rss_kib(pid);
    let _ = hold_tx.send(true);
    for task in tasks {
        let _ = task.await;
    }
    let admitted = admitted.load(std::sync::atomic::Ordering::SeqCst);
    let samples = std::mem::take(&mut *admit_us.lock().expect("samples"));
    let (p50_us, p99_us) = percentiles(samples);
    Ok(Parked {
        admitted,
        rss_kib_per_stream: after.saturating_sub(before) as f64 / admitted.max(1) as f64,
        rps: admitted as f64 / admit_elapsed.as_secs_f64().max(1e-6),
        cpu_us: admit_cpu_ms as f64 * 1000.0 / admitted.max(1) as f64,
        p50_us,
        p99_us,
    })
}

fn print(name: &str, r: &Report, z: Sizes) {
    println!("== {name}");
    println!(
        "  ready (start → /health 200)        {:>10.1} ms",
        r.ready_ms
    );
    println!(
        "  throughput ({} deltas, 1 run)   {:>10.0} events/s",
        z.throughput, r.throughput_eps
    );
    println!(
        "  fan-in ({} × {})                  {:>10.3} s",
        z.fan_runs, z.fan_deltas, r.fan_in_s
    );
    println!(
        "  gateway CPU per event (both runs)  {:>10.2} µs",
        r.event_cpu_us
    );
    println!(
        "  added latency ({} × {}/s) p50/p99  {:>8.0} / {:.0} µs",
        z.lat_streams, z.lat_rate, r.lat_p50_us, r.lat_p99_us
    );
    println!(
        "  gateway CPU per event ({} paced)  {:>10.2} µs",
        z.lat_streams, r.paced_cpu_us
    );
    println!(
        "  parked streams admitted           {:>10} of {}",
        r.parked_admitted, z.parked
    );
    println!(
        "  RSS growth per parked stream      {:>10.1} KiB",
        r.parked_rss_kib_per_stream
    );
    println!(
        "  admission rate (fsync included)   {:>10.0} runs/s",
        r.admission_rps
    );
    println!(
        "  gateway CPU per admission         {:>10.0} µs",
        r.admission_cpu_us
    );
    println!(
        "  admission latency p50/p99        {:>8.1} / {:.1} ms",
        r.admit_p50_us / 1000.0,
        r.admit_p99_us / 1000.0
    );
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let has = |name: &str| args.iter().any(|a| a == name);
    let smoke = has("--smoke");
    let python = has("--python");
    let gateway = args
        .iter()
        .position(|a| a == "--gateway")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let exe = std::env::current_exe().expect("exe");
            exe.parent().expect("dir").join("iac-code-agui")
        });
    if !gateway.is_file() {
        bail!(
            "gateway binary not found at {} (build it with cargo build --release)",
            gateway.display()
        );
    }
    raise_fd_limit();
    let mut z = if smoke { SMOKE } else { FULL };
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse::<u64>().ok())
    };
    if let Some(n) = flag("--lat-streams") {
        z.lat_streams = n as usize;
    }
    if let Some(n) = flag("--parked") {
        z.parked = n as usize;
    }
    if let Some(n) = flag("--throughput") {
        z.throughput = n;
    }
    if let Some(n) = flag("--turn-threads") {
        z.turn_threads = n as usize;
    }
    if let Some(n) = flag("--turns") {
        z.turns = n as usize;
    }
    if let Some(n) = flag("--turn-concurrency") {
        z.turn_concurrency = n as usize;
    }
    let kernel = SyntheticKernel::start().await;
    let text = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
    };
    if has("--threads") {
        let mut sizes = if smoke { THREADS_SMOKE } else { THREADS_FULL };
        if let Some(n) = flag("--thread-count") {
            sizes = sizes.with_threads(n as usize);
        }
        let rounds = flag("--rounds").unwrap_or(1) as usize;
        let stores = threads::Stores::parse(text("--store").as_deref())?;
        return threads::threads(&gateway, &kernel, sizes, rounds, stores).await;
    }
    if has("--kernels") {
        let mut load = if smoke { LOAD_SMOKE } else { LOAD_FULL };
        if let Some(n) = flag("--turn-concurrency") {
            load.concurrency = n as usize;
        }
        if let Some(n) = flag("--turns") {
            load.turns = n as usize;
        }
        let rounds = flag("--rounds").unwrap_or(1) as usize;
        return kernels::kernels(&gateway, load, rounds).await;
    }
    if has("--postgres") {
        let pg = testkit::postgres::Cluster::start();
        let rounds = flag("--rounds").unwrap_or(1) as usize;
        for round in 0..rounds {
            let file = measure(&Target::Rust(gateway.clone(), vec![]), &kernel, z).await?;
            print(&format!("round {}: file store", round + 1), &file, z);
            let url = pg.create_db(&format!("bench{round}"));
            let extra = vec!["--state-url".to_owned(), url];
            let on_pg = measure(&Target::Rust(gateway.clone(), extra), &kernel, z).await?;
            print(
                &format!(
                    "round {}: PostgreSQL store (synchronous_commit on)",
                    round + 1
                ),
                &on_pg,
                z,
            );
        }
        return Ok(());
    }
    if let Some(extra) = text("--compare") {
        let variant_bin = text("--compare-gateway").map_or_else(|| gateway.clone(), PathBuf::from);
        let extra: Vec<String> = extra.split_whitespace().map(str::to_owned).collect();
        let label = format!("{} {}", variant_bin.display(), extra.join(" "));
        let rounds = flag("--rounds").unwrap_or(5) as usize;
        println!("== base: {}; variant: {label}", gateway.display());
        return compare::compare(
            Target::Rust(gateway, vec![]),
            Target::Rust(variant_bin, extra),
            &label,
            &kernel,
            z,
            rounds,
        )
        .await;
    }
    let rust = measure(&Target::Rust(gateway, vec![]), &kernel, z).await?;
    print("iac-code-agui (Rust)", &rust, z);
    let (p50, p99) = direct_latency(&kernel, z).await?;
    println!("== floor: the latency test without a gateway (kernel → client directly)");
    println!(
        "  latency ({} × {}/s) p50/p99        {:>8.0} / {:.0} µs",
        z.lat_streams, z.lat_rate, p50, p99
    );
    if python {
        let bin = std::env::var("IAC_CODE_AGUI_KERNEL_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|_| {
                PathBuf::from(std::env::var("HOME").unwrap_or_default())
                    .join(".cache/iac-code-agui/kernel-venv/bin")
            });
        let py_sizes = Sizes {
            parked: z.parked.min(1_000),
            ..z
        };
        let py = measure(&Target::Python(bin.join("iac-code")), &kernel, py_sizes).await?;
        print("iac-code agui (Python reference)", &py, py_sizes);
        println!("== ratios (Rust vs Python; > 1 means Rust is better)");
        println!("  ready            {:>8.1}×", py.ready_ms / rust.ready_ms);
        println!(
            "  throughput       {:>8.1}×",
            rust.throughput_eps / py.throughput_eps
        );
        println!("  fan-in           {:>8.1}×", py.fan_in_s / rust.fan_in_s);
        println!(
            "  latency p50/p99  {:>8.1}× / {:.1}×",
            py.lat_p50_us / rust.lat_p50_us.max(1.0),
            py.lat_p99_us / rust.lat_p99_us.max(1.0)
        );
        println!(
            "  RSS per stream   {:>8.1}×",
            py.parked_rss_kib_per_stream / rust.parked_rss_kib_per_stream.max(0.1)
        );
        println!(
            "  admission rate   {:>8.1}×",
            rust.admission_rps / py.admission_rps
        );
    }
    if rust.parked_admitted != z.parked {
        bail!(
            "only {} of {} parked streams were admitted",
            rust.parked_admitted,
            z.parked
        );
    }
    Ok(())
}
