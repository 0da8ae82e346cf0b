//! Crash consistency: turns with permission interrupts and resumes through the real kernel while
//! the gateway process is killed with SIGKILL at random moments (half of them right after one of
//! its state writes), then restarted on the same state directory.
//!
//! After every restart: every state file loads and no temporary file is left; a pending interrupt
//! still resumes (and its tool runs exactly once); a replayed answer is never applied twice; a new
//! turn on the thread whose run was cut works (its orphaned task is cancelled first); across the whole test no tool ran twice
//! (each turn's tool appends its own line to a file, and lines are counted).
//!
//! CI runs `CRASH_ITERATIONS` (default 8) iterations; set it higher for a long local run. The test
//! prints the seed of its random choices (kill mode moments, write counts); `CRASH_SEED=<n>`
//! makes the same choices again (the moments they fall on still depend on the machine's timing).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use store::ThreadDoc;
use testkit::fake_llm::Plan;
use testkit::real_kernel::{KernelEnv, KernelProcess};

use crate::support::{body, client, free_port, resume_body, wait_health};

struct Gateway {
    child: Child,
    port: u16,
}

fn start_gateway(env: &KernelEnv, kp: &KernelProcess, state: &Path, log: &Path) -> Gateway {
    let port = free_port();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_iac-code-agui"))
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--a2a-url",
            &kp.url(),
            "--state-dir",
        ])
        .arg(state)
        .env("IAC_CODE_AGUI_LOG", "iac_code_agui=trace,a2a=debug,warn")
        .env("IAC_CODE_AGUI_A2A_TOKEN", &kp.token)
        .env("IAC_CODE_AGUI_ALLOWED_CWDS", env.ws())
        .env("HOME", env.home())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let g = Gateway { child, port };
    assert!(
        wait_health(port, Duration::from_secs(10)).is_some(),
        "gateway not ready"
    );
    g
}

impl Gateway {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    fn sigkill(&mut self) {
        #[allow(unsafe_code)]
        // SAFETY: plain kill syscall.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGKILL);
        }
        let status = self.child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Prints the gateway's (debug) log when the test fails.
struct DumpOnPanic(PathBuf);
impl Drop for DumpOnPanic {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- gateway log ----\n{}",
                std::fs::read_to_string(&self.0).unwrap_or_default()
            );
        }
    }
}

/// A run as a client saw it, possibly cut by the crash.
#[derive(Debug, Default, Clone)]
struct Seen {
    events: Vec<Value>,
    raw: String,
}

impl Seen {
    fn terminal(&self) -> Option<&Value> {
        self.events
            .last()
            .filter(|e| e["type"] == "RUN_FINISHED" || e["type"] == "RUN_ERROR")
    }
    fn outcome(&self) -> &str {
        match self.terminal() {
            Some(t) if t["type"] == "RUN_FINISHED" => t["outcome"]["type"].as_str().unwrap_or(""),
            Some(t) => t["code"].as_str().unwrap_or(""),
            None => "",
        }
    }
    fn interrupt_ids(&self) -> Vec<String> {
        self.terminal()
            .and_then(|t| t["outcome"]["interrupts"].as_array())
            .map(|a| {
                a.iter()
                    .filter_map(|i| i["id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Posts and reads what arrives; a dead gateway yields a partial (or empty) result, no panic.
async fn try_post(url: &str, body: &Value) -> Seen {
    use futures_util::StreamExt;
    let client = client();
    let Ok(resp) = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .timeout(Duration::from_secs(120))
        .send()
        .await
    else {
        return Seen::default();
    };
    let mut raw = String::new();
    let mut stream = resp.bytes_stream();
    while let Some(Ok(chunk)) = stream.next().await {
        raw.push_str(&String::from_utf8_lossy(&chunk));
    }
    // Only complete events (a cut may leave half of one).
    let complete = raw.rfind("\n\n").map(|i| &raw[..i + 2]).unwrap_or("");
    let (events, _) = testkit::sse::parse(complete);
    Seen { events, raw }
}

fn answers(ids: &[String]) -> Value {
    Value::Array(
        ids.iter()
            .map(|id| json!({"interruptId": id, "status": "resolved", "payload": {"decision": "allow_once"}}))
            .collect(),
    )
}

/// A fingerprint of the state directory's thread files and journal (names, sizes, modification
/// times): it changes with every durable write (a journal append) and every checkpoint.
fn fingerprint(state: &Path) -> Vec<(String, u64, Option<SystemTime>)> {
    let mut v: Vec<_> = ["threads", "journal"]
        .iter()
        .filter_map(|sub| std::fs::read_dir(state.join(sub)).ok())
        .flat_map(|d| {
            d.flatten().filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((e.path().display().to_string(), m.len(), m.modified().ok()))
            })
        })
        .collect();
    v.sort();
    v
}

/// Every state file loads; no temporary file is left.
fn check_state_files(threads: &Path) -> Vec<ThreadDoc> {
    let mut docs = vec![];
    for e in std::fs::read_dir(threads).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(
            !name.ends_with(".tmp"),
            "temporary file left after restart: {name}"
        );
        let stem = name.strip_suffix(".json").expect("only thread files");
        let bytes = std::fs::read(e.path()).unwrap();
        docs.push(
            ThreadDoc::from_json(&bytes, stem)
                .unwrap_or_else(|err| panic!("{name} does not load: {err:?}")),
        );
    }
    docs
}

fn effects(ws: &Path, turn: usize) -> usize {
    std::fs::read_to_string(ws.join("effects.txt"))
        .unwrap_or_default()
        .lines()
        .filter(|l| *l == format!("turn{turn}"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_moments_loses_nothing_and_runs_no_tool_twice() {
    let iterations: usize = std::env::var("CRASH_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let env = KernelEnv::new().await;
    let kp = KernelProcess::start(&env).await;
    let state: PathBuf = env.dir.path().join("state");
    let threads = state.join("threads");
    let log = env.dir.path().join("gateway.log");
    let ws = env.ws().join("w");
    std::fs::create_dir_all(&ws).unwrap();
    let w = ws.display().to_string();
    for i in 0..iterations {
        env.llm.script(
            &format!("crash{i}"),
            Plan::tool(
                "Running.",
                "bash",
                json!({"command": format!("echo turn{i} >> effects.txt")}),
            ),
        );
    }
    let _dump = DumpOnPanic(log.clone());
    let mut gw = start_gateway(&env, &kp, &state, &log);
    let seed = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("crash test seed {seed} (CRASH_SEED={seed} replays its choices)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    // How long one turn + resume takes here (the random kill moments fall inside it).
    // Measured on undisturbed sequences: whole span, resume span, state writes per sequence.
    let mut span = Duration::from_secs(3);
    let mut resume_span = Duration::from_secs(1);
    let mut writes = 4usize;
    let mut kills = 0;
    let mut kernel_dropped = 0;
    let mut kernel_took = 0;
    let mut must_be_once: Vec<usize> = vec![];
    // Runs whose client saw their end: their messages are in the transcript, whatever came after.
    let mut ended: Vec<(String, String)> = vec![];

    for i in 0..iterations {
        let thread = format!("c{}", i % 3);
        let url = gw.url();
        let (t, w2) = (thread.clone(), w.clone());
        let started = Instant::now();
        let first_done = std::sync::Arc::new(std::sync::Mutex::new(None::<Instant>));
        let first_done2 = first_done.clone();
        let sequence = tokio::spawn(async move {
            let first = try_post(
                &url,
                &body(
                    &t,
                    &format!("run{i}a"),
                    &format!("Go. scenario:crash{i}"),
                    &w2,
                    json!({}),
                ),
            )
            .await;
            let ids = first.interrupt_ids();
            *first_done2.lock().unwrap() = Some(Instant::now());
            let second = if ids.is_empty() {
                None
            } else {
                Some(
                    try_post(
                        &url,
                        &resume_body(&t, &format!("run{i}b"), &w2, "inv-1", answers(&ids)),
                    )
                    .await,
                )
            };
            (first, ids, second)
        });
        // The kill. Iteration 0 runs undisturbed (it measures); then, in turn: a random moment
        // of the whole sequence, right after its k-th state write, a random moment of the
        // resume (around the answer's acceptance).
        let mode = if i == 0 { 0 } else { 1 + (i - 1) % 3 };
        let k = rng.gen_range(1..=writes.max(1));
        let at = span.mul_f64(rng.gen_range(0.0..0.95));
        let in_resume = resume_span.mul_f64(rng.gen_range(0.0..0.95));
        let mut seen_writes = 0;
        let mut last = fingerprint(&state);
        let killed = loop {
            if sequence.is_finished() {
                break false;
            }
            let now = fingerprint(&state);
            if now != last {
                seen_writes += 1;
                last = now;
            }
            let fire = match mode {
                1 => started.elapsed() >= at,
                2 => seen_writes >= k,
                3 => first_done
                    .lock()
                    .unwrap()
                    .is_some_and(|t| t.elapsed() >= in_resume),
                _ => false,
            };
            if fire {
                break true;
            }
            tokio::time::sleep(Duration::from_micros(500)).await;
        };
        if killed {
            gw.sigkill();
            kills += 1;
        }
        let (first, ids, second) = sequence.await.unwrap();
        for (run, seen) in [("a", Some(&first)), ("b", second.as_ref())] {
            if seen.is_some_and(|s| s.terminal().is_some()) {
                ended.push((thread.clone(), format!("run{i}{run}")));
            }
        }
        eprintln!(
            "iteration {i}: mode {mode}, killed {killed} after {:?} ({seen_writes} writes); first {:?}, second {:?}",
            started.elapsed(),
            first.outcome(),
            second.as_ref().map(Seen::outcome)
        );
        if !killed {
            assert_eq!(first.outcome(), "interrupt", "iteration {i}: {}", first.raw);
            span = started.elapsed();
            if let Some(t) = *first_done.lock().unwrap() {
                resume_span = t.elapsed();
            }
            if i == 0 {
                writes = seen_writes;
            }
            assert_eq!(
                second.as_ref().map(Seen::outcome),
                Some("success"),
                "iteration {i}"
            );
            must_be_once.push(i);
            continue;
        }

        // Restart on the same state directory.
        gw = start_gateway(&env, &kp, &state, &log);
        let docs = check_state_files(&threads);
        let doc = docs.iter().find(|d| d.thread_id == thread);
        let pending: Vec<String> = doc
            .map(|d| {
                d.execution
                    .pending
                    .iter()
                    .map(|(id, _)| id.clone())
                    .collect()
            })
            .unwrap_or_default();
        eprintln!("  after restart: pending {}", pending.len());
        if !pending.is_empty() {
            // The interrupt survived the crash: it still resumes and its tool runs once. When the
            // crashed run had delivered the answer already, the kernel acknowledges it without
            // running the tool again, and the run says so (RESUME_ALREADY_APPLIED).
            let r = try_post(
                &gw.url(),
                &resume_body(&thread, &format!("run{i}c"), &w, "inv-1", answers(&pending)),
            )
            .await;
            match r.outcome() {
                // The crashed run's delivery reached the kernel, which took the answer but shows
                // nothing of it: whether its tool ran is the kernel's (at most once, checked at
                // the end); the answer is not sent again.
                "RESUME_ALREADY_APPLIED" if r.raw.contains("An earlier delivery") => {
                    kernel_took += 1;
                }
                "success" | "RESUME_ALREADY_APPLIED" => must_be_once.push(i),
                // The kernel can consume an answer whose request was cut before its first event
                // (the gateway died while delivering it) without running it: it then reports
                // the permission as no longer pending while the task still waits. Nothing ran,
                // the gateway keeps the interrupt pending (the answer is never marked applied),
                // and cancelling the execution frees the thread.
                "A2A_UNAVAILABLE" if r.raw.contains("was not accepted") => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    assert_eq!(
                        effects(&ws, i),
                        0,
                        "iteration {i}: refused, yet the tool ran"
                    );
                    let doc = check_state_files(&threads)
                        .into_iter()
                        .find(|d| d.thread_id == thread)
                        .expect("thread state");
                    assert_eq!(doc.execution.pending.len(), pending.len(), "iteration {i}");
                    let cancel = client()
                        .post(format!(
                            "{}extensions/iac-code/v1/executions/{}/cancel",
                            gw.url(),
                            doc.execution.execution_id
                        ))
                        .header("content-type", "application/json")
                        .body(json!({"threadId": thread, "rosInvocationId": "inv-1"}).to_string())
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(cancel.status(), 200, "iteration {i}");
                    kernel_dropped += 1;
                }
                _ => panic!(
                    "iteration {i}: pending interrupt does not resume: {}",
                    r.raw
                ),
            }
        } else if !ids.is_empty() {
            // The answer may have been accepted before the crash: replaying it never runs the
            // tool a second time.
            let before = effects(&ws, i);
            let r = try_post(
                &gw.url(),
                &resume_body(&thread, &format!("run{i}d"), &w, "inv-1", answers(&ids)),
            )
            .await;
            assert!(
                r.terminal().is_some() || r.raw.contains("RESUME_ALREADY_APPLIED"),
                "iteration {i}: {}",
                r.raw
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
            assert!(
                effects(&ws, i) <= before.max(1),
                "iteration {i}: replay ran the tool again"
            );
        }
        // A new turn on the thread whose run was cut works (its orphan is cancelled first).
        let r = try_post(
            &gw.url(),
            &body(
                &thread,
                &format!("run{i}e"),
                "Hi. scenario:text",
                &w,
                json!({}),
            ),
        )
        .await;
        assert_eq!(
            r.outcome(),
            "success",
            "iteration {i}: new turn after the crash: {}",
            r.raw
        );
        if second.as_ref().is_some_and(|s| s.outcome() == "success") {
            must_be_once.push(i);
        }
    }
    // Every run whose end a client saw kept its messages through the SIGKILLs (the transcript is
    // written before the terminal event is sent).
    for t in ["c0", "c1", "c2"] {
        let (status, page) =
            crate::support::get_as(&format!("{}threads/{t}/messages?limit=200", gw.url()), &[])
                .await;
        if status == 404 {
            continue;
        }
        assert_eq!(status, 200, "{page}");
        assert!(
            page.get("nextBefore").is_none(),
            "one page holds the thread"
        );
        let runs: std::collections::BTreeSet<&str> = page["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["runId"].as_str().unwrap())
            .collect();
        for (_, run) in ended.iter().filter(|(th, _)| th == t) {
            assert!(
                runs.contains(run.as_str()),
                "{t}: {run} ended, but its messages are gone: {runs:?}"
            );
        }
    }
    assert!(!ended.is_empty());
    // No tool ran twice; every acknowledged answer ran its tool exactly once.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for i in 0..iterations {
        let n = effects(&ws, i);
        assert!(n <= 1, "turn {i}'s tool ran {n} times");
        if must_be_once.contains(&i) {
            assert_eq!(n, 1, "turn {i}'s accepted answer was lost");
        }
    }
    eprintln!(
        "crash consistency: {kills} SIGKILLs survived in {iterations} iterations \
         ({kernel_dropped} answers the kernel dropped in flight, {kernel_took} it took without \
         showing them)"
    );
    assert!(kills >= iterations / 3, "too few kills landed ({kills})");
}
