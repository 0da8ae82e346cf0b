//! `--llm-upstream`: the LLM egress, through the binary, with the real kernel and the scripted
//! fake LLM served over TLS by a CA of the test's own. No kernel holds the operator's key (its
//! environment, files, memory, what its agent's tools can read); a run's own key and headers
//! reach the upstream and never the kernel; capabilities are checked (a wrong one, another
//! kernel's, a run's after its run); spending is counted per user and a spent budget refuses;
//! the first token is not held back.

use std::collections::HashSet;
use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use testkit::fake_llm::{FakeLlm, Plan};
use testkit::real_kernel::KernelEnv;
use testkit::sse::{assert_valid_run, post};
use testkit::tls::Ca;

use crate::support::{body, client, get_as};
use crate::tenants_fork::{each_region, memory_holds};
use crate::tenants_real::{refs, Tenanted};

/// A gateway (users' own kernels when `isolated`, else shared ones) whose kernels reach the
/// fake LLM, served over TLS, through the egress; the operator's key.
async fn egressed(isolated: bool, extra: &[&str]) -> (Tenanted, String) {
    let ca = Ca::new();
    let env = KernelEnv::with_llm(FakeLlm::start_tls(&ca).await);
    let ca_file = env.dir.path().join("llm-ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let key = format!("sk-operator-{}", uuid::Uuid::new_v4().simple());
    let upstream = env.llm.base_url();
    let ca_file = ca_file.display().to_string();
    let flags: Vec<&str> = ["--llm-upstream", &upstream, "--llm-upstream-ca", &ca_file]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let t = Tenanted::start_in(env, isolated, 2, &flags, &[("IAC_CODE_API_KEY", &key)]).await;
    (t, key)
}

/// The egress's base URL and capability of `user`'s kernel, as its agent's shell sees them.
async fn kernel_capability(t: &Tenanted, user: &str, thread: &str) -> (String, String) {
    let cwd = t.root_of(user).join("cap");
    let out = t
        .bash(
            user,
            thread,
            &cwd,
            "echo \"BASE=$IAC_CODE_BASE_URL\"; echo \"KEY=$IAC_CODE_API_KEY\"",
        )
        .await;
    let var = |name: &str| {
        out.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("no {name}: {out}"))
            .to_owned()
    };
    let (base, key) = (var("BASE"), var("KEY"));
    assert!(
        base.starts_with("http://127.0.0.1:") && base.ends_with(&key) && key.len() == 64,
        "{out}"
    );
    (base, key)
}

/// The status of `GET <base>/models` with `key` as the bearer (none: no header).
async fn models(base: &str, key: Option<&str>) -> u16 {
    let mut req = client().get(format!("{base}/models"));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    req.send().await.unwrap().status().as_u16()
}

/// Every file under `dir` whose bytes hold `needle`.
fn files_holding(dir: &Path, needle: &str) -> Vec<String> {
    crate::fuzz_cwd::tree(dir)
        .into_iter()
        .filter(|p| p.is_file() && !p.is_symlink())
        .filter(|p| {
            std::fs::read(p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle.as_bytes()))
        })
        .map(|p| p.display().to_string())
        .collect()
}

/// A counter of `/metrics` (0 when absent).
fn counter(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// `GET /threads` as `user`: its `llmUsage`.
async fn usage_of(t: &Tenanted, user: &str) -> Value {
    let h = Tenanted::headers(user);
    let (status, v) = get_as(&format!("{}threads", t.url), &refs(&h)).await;
    assert_eq!(status, 200, "{v}");
    v["llmUsage"].clone()
}

/// Kernels get a capability, never the key: a user's agent finds the operator's key nowhere it
/// can look (its environment, every process's it can read, its files), the kernel's memory holds
/// none of it, nor do the gateway's log and state; the upstream gets it over TLS and answers the
/// turn. A capability is checked: none, a wrong one, or one kernel's on another's path is 401;
/// another user's agent cannot spend through alice's kernel; only the kernels' routes are served.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_kernel_holds_the_operators_key_and_turns_are_answered_through_the_egress() {
    let (t, key) = egressed(true, &[]).await;
    t.hello("alice", "eg-a1", "eg-a1-r1").await;
    let requests = t.env.llm.requests();
    assert!(!requests.is_empty());
    for r in &requests {
        assert_eq!(
            r.headers.get("authorization").map(String::as_str),
            Some(format!("Bearer {key}").as_str()),
            "the upstream gets the operator's key"
        );
    }
    // The key in two halves: the command itself (which the kernel keeps in its session) never
    // holds it whole.
    let (a, b) = key.split_at(key.len() / 2);
    let cwd = t.root_of("alice").join("probe");
    let k = format!("A='{a}'; B='{b}';");
    // The pattern from a file descriptor: a grep with the key in its arguments would be found
    // in its own command line.
    let count =
        |what: &str| format!("{k} {what} 2>/dev/null | grep -c -F -f <(printf '%s\\n' \"$A$B\")");
    let probes = [
        ("control", count("echo \"$A$B\"")),
        (
            "base",
            "env | grep -c '^IAC_CODE_BASE_URL=http://127.0.0.1:'".to_owned(),
        ),
        ("env", count("env")),
        ("self", count("cat /proc/self/environ")),
        (
            "procs",
            count("for p in /proc/[0-9]*; do cat $p/environ $p/cmdline; done"),
        ),
        (
            "files",
            count("grep -rIl -F -f <(printf '%s\\n' \"$A$B\") \"$HOME\" \"${TMPDIR:-/tmp}\"; echo"),
        ),
    ];
    let out = t.probes("alice", "eg-a2", &cwd, &probes).await;
    let first = |label: &str| out[label].trim().lines().next().unwrap_or("").to_owned();
    assert_eq!(first("control"), "1", "the probe finds the key where it is");
    assert_eq!(first("base"), "1", "{out:?}");
    for label in ["env", "self", "procs", "files"] {
        assert_eq!(first(label), "0", "{label} found the key: {out:?}");
    }
    // The kernel's memory and the fork server's (read as root) hold none of it either.
    let pid = t.kernel_of("alice").await.expect("alice's kernel");
    assert!(!memory_holds(pid, key.as_bytes()), "the kernel's memory");
    if let Some(zygote) = crate::tenants_real::parent_of(pid) {
        assert!(!memory_holds(zygote, key.as_bytes()), "the fork server's");
    }
    assert!(!t.gw.log().contains(&key), "the log holds the key");
    assert_eq!(
        files_holding(&t.env.state_dir(), &key),
        Vec::<String>::new()
    );

    // Capabilities.
    let (alice_base, alice_cap) = kernel_capability(&t, "alice", "eg-a3").await;
    assert_eq!(models(&alice_base, Some(&alice_cap)).await, 200);
    assert_eq!(models(&alice_base, None).await, 401);
    assert_eq!(models(&alice_base, Some(&"0".repeat(64))).await, 401);
    let (bob_base, bob_cap) = kernel_capability(&t, "bob", "eg-b1").await;
    assert_ne!(bob_cap, alice_cap);
    assert_eq!(models(&bob_base, Some(&alice_cap)).await, 401);
    assert_eq!(models(&alice_base, Some(&bob_cap)).await, 401);
    let files = client()
        .post(format!("{alice_base}/files"))
        .bearer_auth(&alice_cap)
        .send()
        .await
        .unwrap();
    assert_eq!(files.status(), 404);
    // Bob's agent, told alice's base URL, spends nothing through it.
    let cwd = t.root_of("bob").join("probe");
    let steal = format!(
        "curl -s -o /dev/null -w 'status=%{{http_code}}' -H \"Authorization: Bearer $IAC_CODE_API_KEY\" '{alice_base}/models'"
    );
    let out = t.bash("bob", "eg-b2", &cwd, &steal).await;
    assert!(out.contains("status=401"), "{out}");

    // Counted: per request, and per user on their threads list.
    let m = t.metrics().await;
    assert!(
        counter(&m, "agui_llm_requests_total{outcome=\"ok\"}") >= 1.0,
        "{m}"
    );
    assert!(
        counter(&m, "agui_llm_requests_total{outcome=\"denied\"}") >= 5.0,
        "{m}"
    );
    assert!(
        counter(&m, "agui_llm_tokens_total{kind=\"input\"}") >= 100.0,
        "{m}"
    );
    assert!(!m.contains(&key) && !m.contains("alice"), "{m}");
    let u = usage_of(&t, "alice").await;
    assert!(u["requests"].as_u64().unwrap() >= 4, "{u}");
    assert!(u["inputTokens"].as_u64().unwrap() >= 400, "{u}");
    assert_eq!(u["window"]["seconds"], 86_400, "{u}");
    assert_eq!(u["window"]["budget"], Value::Null, "{u}");
    let carol = usage_of(&t, "carol").await;
    assert_eq!(carol["requests"], 0, "{carol}");
}

/// The 64-hex-digit strings in the writable memory of process `pid`.
fn hex64_in_memory(pid: u32) -> HashSet<String> {
    let mut found = HashSet::new();
    each_region(pid, |buf| {
        let mut run = 0usize;
        for (i, b) in buf.iter().enumerate() {
            if b.is_ascii_hexdigit() && !b.is_ascii_uppercase() {
                run += 1;
                continue;
            }
            if run == 64 {
                found.insert(String::from_utf8_lossy(&buf[i - 64..i]).into_owned());
            }
            run = 0;
        }
    });
    found
}

/// A request's own key and headers (`llmApiKey`, `llmHeaders`) reach the upstream, and never the
/// kernel: its memory holds neither, only the run's capability, which the egress honours while
/// the run lives and refuses (401) once it has ended and its grace passed. The run after, without
/// a key of its own, spends the operator's.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_runs_own_key_reaches_the_upstream_never_the_kernel_and_its_capability_ends_with_it() {
    let (t, operator) = egressed(true, &[]).await;
    let (base, kernel_cap) = kernel_capability(&t, "alice", "eg-k1").await;
    // The capabilities of those runs lapse first (the kernel's memory still holds them).
    tokio::time::sleep(iac_code_agui::egress::GRACE + Duration::from_secs(1)).await;
    let own = format!("sk-alice-own-{}", uuid::Uuid::new_v4().simple());
    let org = format!("org-{}", uuid::Uuid::new_v4().simple());
    t.env.llm.script(
        "ownkey",
        Plan {
            text: vec!["Paid".into(), " by alice.".into()],
            initial_delay: Duration::from_secs(4),
            ..Plan::default()
        },
    );
    let cwd = t.root_of("alice").join("own");
    std::fs::create_dir_all(&cwd).ok();
    let props = json!({"llmApiKey": own, "llmHeaders": {"X-Tenant-Org": org}});
    let b = body(
        "eg-k2",
        "eg-k2-r1",
        "Hi. scenario:ownkey",
        &cwd.display().to_string(),
        props,
    );
    let h = Tenanted::headers("alice");
    let url = t.url.clone();
    let run = tokio::spawn(async move {
        let h = refs(&h);
        post(&url, &b, &h).await
    });
    // While the upstream thinks, the kernel holds the run's capability: one of the 64-digit
    // strings of its memory that the egress honours, other than the kernel's own.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let pid = t.kernel_of("alice").await.expect("alice's kernel");
    let mut run_caps = Vec::new();
    for candidate in hex64_in_memory(pid) {
        if candidate != kernel_cap && models(&base, Some(&candidate)).await == 200 {
            run_caps.push(candidate);
        }
    }
    assert_eq!(run_caps.len(), 1, "the run's capability: {run_caps:?}");
    let r = run.await.unwrap();
    assert_valid_run(&r, "eg-k2", "eg-k2-r1");
    assert_eq!(r.last()["outcome"]["type"], "success", "{}", r.raw);
    let seen: Vec<_> = t
        .env
        .llm
        .requests()
        .into_iter()
        .filter(|q| q.scenario == "ownkey")
        .collect();
    assert!(!seen.is_empty());
    for q in &seen {
        assert_eq!(
            q.headers.get("authorization"),
            Some(&format!("Bearer {own}"))
        );
        assert_eq!(q.headers.get("x-tenant-org"), Some(&org));
    }
    assert!(
        !memory_holds(pid, own.as_bytes()),
        "the kernel holds her key"
    );
    assert!(
        !memory_holds(pid, org.as_bytes()),
        "the kernel holds her header"
    );
    assert!(!t.gw.log().contains(&own) && !t.gw.log().contains(&org));
    // Replayed after the run (and its grace): refused.
    tokio::time::sleep(iac_code_agui::egress::GRACE + Duration::from_secs(1)).await;
    assert_eq!(models(&base, Some(&run_caps[0])).await, 401);
    assert_eq!(models(&base, Some(&kernel_cap)).await, 200);
    // The next run without a key of its own spends the operator's.
    t.hello("alice", "eg-k3", "eg-k3-r1").await;
    let last = t.env.llm.requests().pop().unwrap();
    assert_eq!(
        last.headers.get("authorization"),
        Some(&format!("Bearer {operator}"))
    );
}

/// Shared kernels hold no key either (their environment as the operator reads it), and each
/// user's spending is their own: every run carries its user's capability.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shared_kernels_hold_no_key_and_each_users_spending_is_their_own() {
    let (t, key) = egressed(false, &[]).await;
    t.hello("alice", "eg-s1", "eg-s1-r1").await;
    t.hello("bob", "eg-s2", "eg-s2-r1").await;
    t.hello("bob", "eg-s3", "eg-s3-r1").await;
    let alice = usage_of(&t, "alice").await;
    let bob = usage_of(&t, "bob").await;
    let (na, nb) = (
        alice["requests"].as_u64().unwrap(),
        bob["requests"].as_u64().unwrap(),
    );
    assert!(na >= 1 && nb >= 2 * na, "alice {alice}, bob {bob}");
    assert_eq!(
        bob["inputTokens"].as_u64().unwrap(),
        100 * nb,
        "the fake LLM's usage: 100 in, 10 out"
    );
    assert_eq!(bob["outputTokens"].as_u64().unwrap(), 10 * nb);
    for pid in t.kernel_pids().await {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let environ = String::from_utf8_lossy(&environ);
        assert!(!environ.contains(&key), "a shared kernel's environment");
        assert!(environ.contains("IAC_CODE_API_KEY="), "{environ}");
        assert!(!memory_holds(pid as u32, key.as_bytes()), "its memory");
    }
    assert!(t.gw.log().contains("LLM egress on"), "{}", t.gw.log());
}

/// `--llm-token-budget`: a user who spent it is refused their next run before it starts (429
/// `LLM_BUDGET_EXHAUSTED`, with `Retry-After`), while another user runs on; a run that spends
/// past it mid-turn gets its next LLM call refused by the egress (counted as `budget`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spent_budget_refuses_the_users_runs_with_a_clear_error() {
    let (t, _) = egressed(false, &["--llm-token-budget", "150"]).await;
    t.hello("alice", "eg-b1", "eg-b1-r1").await;
    // 110 of 150: still admitted; this run's first call takes her past it, and its second (after
    // the tool) is refused.
    let cwd = t.root_of("alice").join("b");
    std::fs::create_dir_all(&cwd).ok();
    let r = t
        .turn("alice", "eg-b2", "eg-b2-r1", "Go. scenario:readfile", &cwd)
        .await;
    assert_valid_run(&r, "eg-b2", "eg-b2-r1");
    let m = t.metrics().await;
    assert!(
        counter(&m, "agui_llm_requests_total{outcome=\"budget\"}") >= 1.0,
        "{m}\n{}",
        r.raw
    );
    assert_eq!(r.last()["type"], "RUN_ERROR", "{}", r.raw);
    assert_eq!(r.last()["code"], "LLM_BUDGET_EXHAUSTED", "{}", r.raw);
    let h = Tenanted::headers("alice");
    let refused = post(
        &t.url,
        &body(
            "eg-b3",
            "eg-b3-r1",
            "Hi. scenario:text",
            &t.root_of("alice").join("p").display().to_string(),
            json!({}),
        ),
        &refs(&h),
    )
    .await;
    assert_eq!(refused.status, 429, "{}", refused.raw);
    assert_eq!(refused.error_code(), Some("LLM_BUDGET_EXHAUSTED"));
    let retry: u64 = refused
        .headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case("retry-after"))
        .and_then(|(_, v)| v.parse().ok())
        .expect("Retry-After");
    assert!((1..=86_400).contains(&retry), "{retry}");
    t.hello("bob", "eg-b4", "eg-b4-r1").await;
    let u = usage_of(&t, "alice").await;
    assert_eq!(u["window"]["budget"], 150, "{u}");
    assert!(u["window"]["tokens"].as_u64().unwrap() >= 150, "{u}");
}

/// The time from the fake LLM's first text piece to the client's first `TEXT_MESSAGE_CONTENT`
/// of a run on `t` (scenario `scenario`).
async fn first_token_lag(t: &Tenanted, thread: &str, scenario: &str) -> Duration {
    use futures_util::StreamExt as _;
    let cwd = t.root_of("alice").join("lat");
    std::fs::create_dir_all(&cwd).ok();
    let b = body(
        thread,
        &format!("{thread}-r"),
        &format!("Hi. scenario:{scenario}"),
        &cwd.display().to_string(),
        json!({}),
    );
    let mut req = client()
        .post(&t.url)
        .header("content-type", "application/json")
        .body(b.to_string());
    for (k, v) in Tenanted::headers("alice") {
        req = req.header(k, v);
    }
    let resp = req.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut seen = String::new();
    let mut first: Option<Instant> = None;
    while let Some(chunk) = stream.next().await {
        seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        if first.is_none() && seen.contains("TEXT_MESSAGE_CONTENT") {
            first = Some(Instant::now());
        }
    }
    let got = first.unwrap_or_else(|| panic!("no text: {seen}"));
    let sent = *t.env.llm.first_texts(scenario).last().expect("sent");
    got.saturating_duration_since(sent)
}

/// Streaming is passed on as it comes: the first token reaches the client through the egress no
/// more than 20 ms later than straight from the upstream (the best of five turns each way, the
/// same TLS upstream, in one run).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_first_token_through_the_egress_is_not_held_back() {
    let plan = || Plan {
        text: (0..8).map(|i| format!("piece{i} ")).collect(),
        initial_delay: Duration::from_millis(300),
        delay: Duration::from_millis(50),
        ..Plan::default()
    };
    let (through, _) = egressed(false, &[]).await;
    let ca = Ca::new();
    let env = KernelEnv::with_llm(FakeLlm::start_tls(&ca).await);
    let ca_file = env.dir.path().join("llm-ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let ca_file = ca_file.display().to_string();
    let direct =
        Tenanted::start_in(env, false, 1, &[], &[("SSL_CERT_FILE", ca_file.as_str())]).await;
    let mut best = [Duration::MAX; 2];
    for (i, t) in [&through, &direct].into_iter().enumerate() {
        t.hello(
            "alice",
            &format!("lat-warm-{i}"),
            &format!("lat-warm-{i}-r"),
        )
        .await;
        for n in 0..5 {
            let scenario = format!("lat{i}x{n}");
            t.env.llm.script(&scenario, plan());
            let lag = first_token_lag(t, &format!("lat-{i}-{n}"), &scenario).await;
            best[i] = best[i].min(lag);
        }
    }
    eprintln!(
        "first token after the upstream sent it: through the egress {:?}, straight {:?}",
        best[0], best[1]
    );
    assert!(
        best[0] <= best[1] + Duration::from_millis(20),
        "through the egress {:?}, straight {:?}",
        best[0],
        best[1]
    );
}

/// iac-code's Anthropic client through the egress: a kernel of provider
/// `anthropic_compatible` sends its capability as Bearer to `v1/messages`; the upstream gets
/// the operator's key the same way and answers the turn as Anthropic streams; its usage
/// (`message_start`'s input, the last `message_delta`'s output) is counted to the user.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_anthropic_client_reaches_its_upstream_through_the_egress() {
    let ca = Ca::new();
    let env = KernelEnv::with_llm(FakeLlm::start_tls(&ca).await);
    let ca_file = env.dir.path().join("llm-ca.pem");
    std::fs::write(&ca_file, ca.pem()).unwrap();
    let key = format!("sk-ant-operator-{}", uuid::Uuid::new_v4().simple());
    // The Anthropic client adds `/v1/messages` to its base URL.
    let upstream = format!("https://{}", env.llm.addr);
    let ca_file = ca_file.display().to_string();
    let flags = ["--llm-upstream", &upstream, "--llm-upstream-ca", &ca_file];
    let vars = [
        ("IAC_CODE_API_KEY", key.as_str()),
        ("IAC_CODE_PROVIDER", "anthropic_compatible"),
    ];
    let t = Tenanted::start_in(env, false, 1, &flags, &vars).await;
    let r = t.hello("alice", "eg-an1", "eg-an1-r1").await;
    assert!(r.raw.contains("from the"), "{}", r.raw);
    let seen = t.env.llm.requests();
    let q = seen.last().expect("a request upstream");
    assert_eq!(
        q.headers.get("authorization"),
        Some(&format!("Bearer {key}"))
    );
    assert!(
        q.headers.contains_key("anthropic-version"),
        "{:?}",
        q.headers
    );
    // Anthropic's request (its `max_tokens` is required), streamed, left as the kernel sent it.
    assert!(q.body["max_tokens"].is_u64(), "{}", q.body);
    assert_eq!(q.body["stream"], true, "{}", q.body);
    assert!(q.body.get("stream_options").is_none(), "{}", q.body);
    let u = usage_of(&t, "alice").await;
    assert!(u["requests"].as_u64().unwrap() >= 1, "{u}");
    assert_eq!(
        u["inputTokens"].as_u64().unwrap(),
        100 * u["requests"].as_u64().unwrap(),
        "{u}"
    );
    assert_eq!(
        u["outputTokens"].as_u64().unwrap(),
        10 * u["requests"].as_u64().unwrap(),
        "{u}"
    );
}
