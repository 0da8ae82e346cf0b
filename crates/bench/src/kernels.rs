//! `--kernels`: whole turns through the real kernel (the pinned `iac-code a2a`, answered at once
//! by the scripted fake LLM) with one managed kernel and with two, alternating: turns a second
//! at a fixed concurrency, their latency, the CPU a turn costs the gateway and the kernels, and
//! each kernel's RSS after the turns.

use std::collections::HashSet;
use std::path::Path;

use testkit::real_kernel::KernelEnv;

use super::*;

/// The load of one configuration.
#[derive(Clone, Copy)]
pub(crate) struct Load {
    /// Threads turning at once.
    pub concurrency: usize,
    /// Turns each thread takes, one after another.
    pub turns: usize,
}

pub(crate) const LOAD_FULL: Load = Load {
    concurrency: 20,
    turns: 5,
};
pub(crate) const LOAD_SMOKE: Load = Load {
    concurrency: 4,
    turns: 1,
};

struct Measured {
    turns_per_s: f64,
    p50_ms: f64,
    p99_ms: f64,
    gateway_cpu_ms: f64,
    kernel_cpu_ms: f64,
    rss_mib: Vec<f64>,
}

/// The processes whose parent is `pid`.
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s[s.rfind(')')? + 2..].to_owned();
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect()
}

async fn health(c: &reqwest::Client, port: u16) -> Option<serde_json::Value> {
    let r = c
        .get(format!("http://127.0.0.1:{port}/health"))
        .send()
        .await
        .ok()?;
    serde_json::from_slice(&r.bytes().await.ok()?).ok()
}

/// The kernels' pids once all `n` are ready.
async fn ready(c: &reqwest::Client, port: u16, n: usize) -> Result<Vec<u32>> {
    let start = Instant::now();
    loop {
        if let Some(v) = health(c, port).await {
            let slots = match v["kernel"]["slots"].as_array() {
                Some(s) => s.clone(),
                None => vec![v["kernel"].clone()],
            };
            if slots.len() == n && slots.iter().all(|s| s["state"] == "ready") {
                return Ok(slots
                    .iter()
                    .filter_map(|s| s["pid"].as_u64().map(|p| p as u32))
                    .collect());
            }
        }
        if start.elapsed() > Duration::from_secs(120) {
            bail!("{n} kernels not ready in 120 s");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One configuration: a gateway with `n` kernels, `load` turns, then stopped.
async fn measure(gateway: &Path, n: usize, load: Load) -> Result<Measured> {
    let env = KernelEnv::new().await;
    let port = free_port();
    let mut child = Command::new(gateway)
        .args(["--port", &port.to_string(), "--a2a-command", &env.command()])
        .arg("--state-dir")
        .arg(env.state_dir())
        .args(["--kernels", &n.to_string()])
        .envs(env.vars())
        .env_remove("IAC_CODE_AGUI_A2A_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("start the gateway")?;
    let result = turns(&mut child, &env, port, n, load).await;
    // SIGTERM: the kernels stop with the gateway.
    #[allow(unsafe_code)]
    // SAFETY: plain kill syscall.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let _ = child.wait();
    result
}

async fn turns(
    child: &mut Child,
    env: &KernelEnv,
    port: u16,
    n: usize,
    load: Load,
) -> Result<Measured> {
    let c = client();
    let pids = ready(&c, port, n).await?;
    let url = format!("http://127.0.0.1:{port}/");
    let ws = env.ws();
    let one = move |c: reqwest::Client, thread: String, run: String| {
        let (url, ws) = (url.clone(), ws.clone());
        async move {
            let b = body(&ws, &thread, "Hi. scenario:text").replace("\"r1\"", &format!("{run:?}"));
            let started = Instant::now();
            let text = c
                .post(&url)
                .header("content-type", "application/json")
                .body(b)
                .send()
                .await?
                .text()
                .await?;
            if !text.contains("RUN_FINISHED") || text.contains("RUN_ERROR") {
                bail!(
                    "a turn did not finish: {}",
                    &text[text.len().saturating_sub(400)..]
                );
            }
            Ok::<_, anyhow::Error>(started.elapsed())
        }
    };
    // Warm-up: a turn on each kernel (the first turn of a kernel loads what it needs).
    for i in 0..n {
        one(c.clone(), format!("warm{i}"), "r1".into()).await?;
    }
    let kernel_pids: HashSet<u32> = children(child.id()).into_iter().chain(pids).collect();
    let kernel_cpu = || kernel_pids.iter().map(|p| cpu_ms(*p)).sum::<u64>();
    let (gw0, k0) = (cpu_ms(child.id()), kernel_cpu());
    let started = Instant::now();
    let mut tasks = Vec::new();
    for t in 0..load.concurrency {
        let one = one.clone();
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let mut times = Vec::new();
            for turn in 0..load.turns {
                times.push(one(c.clone(), format!("t{t}"), format!("r{turn}")).await?);
            }
            Ok::<_, anyhow::Error>(times)
        }));
    }
    let mut times = Vec::new();
    for t in tasks {
        times.extend(t.await??);
    }
    let wall = started.elapsed().as_secs_f64();
    let total = times.len() as f64;
    let mut ms: Vec<f64> = times.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 * q) as usize).min(ms.len() - 1)];
    let rss_mib = kernel_pids
        .iter()
        .map(|p| rss_kib(*p) as f64 / 1024.0)
        .filter(|r| *r > 0.0)
        .collect();
    Ok(Measured {
        turns_per_s: total / wall,
        p50_ms: at(0.5),
        p99_ms: at(0.99),
        gateway_cpu_ms: (cpu_ms(child.id()) - gw0) as f64 / total,
        kernel_cpu_ms: kernel_cpu().saturating_sub(k0) as f64 / total,
        rss_mib,
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// One kernel, then two, `rounds` times; medians and the ratio of turns a second.
pub(crate) async fn kernels(gateway: &Path, load: Load, rounds: usize) -> Result<()> {
    println!(
        "== whole turns through the real kernel: {} threads at once, {} turns each",
        load.concurrency, load.turns
    );
    let mut by = [Vec::new(), Vec::new()];
    for round in 0..rounds {
        for (i, n) in [1usize, 2].into_iter().enumerate() {
            let m = measure(gateway, n, load).await?;
            let rss: Vec<String> = m.rss_mib.iter().map(|r| format!("{r:.0}")).collect();
            println!(
                "  round {} --kernels {n}: {:>5.1} turns/s  p50/p99 {:.0} / {:.0} ms  gateway {:.1} ms CPU/turn  kernels {:.0} ms CPU/turn  RSS {} MiB",
                round + 1,
                m.turns_per_s,
                m.p50_ms,
                m.p99_ms,
                m.gateway_cpu_ms,
                m.kernel_cpu_ms,
                rss.join(" / ")
            );
            by[i].push(m);
        }
    }
    let med = |i: usize, f: fn(&Measured) -> f64| median(by[i].iter().map(f).collect());
    for (i, n) in [1, 2].into_iter().enumerate() {
        println!(
            "  median --kernels {n}: {:>5.1} turns/s  p50/p99 {:.0} / {:.0} ms  gateway {:.1} ms CPU/turn  kernels {:.0} ms CPU/turn",
            med(i, |m| m.turns_per_s),
            med(i, |m| m.p50_ms),
            med(i, |m| m.p99_ms),
            med(i, |m| m.gateway_cpu_ms),
            med(i, |m| m.kernel_cpu_ms),
        );
    }
    println!(
        "  turns a second, --kernels 2 / --kernels 1: {:.2}×",
        med(1, |m| m.turns_per_s) / med(0, |m| m.turns_per_s)
    );
    Ok(())
}
