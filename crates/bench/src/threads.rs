//! `--threads`: the figures of the thread routes, with the file store and with PostgreSQL,
//! alternating. Every thread is made the way users make them, by runs through the gateway (the
//! service token acting for one of the users), so the transcripts, the list's index and the
//! thread documents are what the gateway itself wrote:
//!
//! * connect: a thread of `big_runs` turns (two messages each) is read with
//!   `GET /threads/{id}/connect`; the time is from the request to the end of the
//!   `MESSAGES_SNAPSHOT` frame at the client, a new connection each time;
//! * list: `threads` threads of `users` users (each its own thread, one turn each); every
//!   sampled user's threads are walked a page at a time (`GET /threads`, the default page), each
//!   page timed and checked (no thread twice, none missing); then the gateway is restarted and
//!   the first page after the restart is timed on its own (the file store reads every
//!   transcript's first line then);
//! * turns: the rate of whole short runs (admission, a few deltas, the end with its transcript
//!   write) while seeding, and the gateway's CPU per turn.

use std::collections::HashSet;

use futures_util::stream::{self, StreamExt as _};
use serde_json::Value;

use super::*;
use gateway::start_with;

const TOKEN: &str = "bench-service-token";

#[derive(Clone, Copy)]
pub(crate) struct ThreadSizes {
    big_runs: usize,
    connects: usize,
    threads: usize,
    users: usize,
    sampled_users: usize,
    concurrency: usize,
}

impl ThreadSizes {
    /// `n` threads of the list (at least one a user), the rest as they were.
    pub(crate) fn with_threads(self, n: usize) -> ThreadSizes {
        ThreadSizes {
            threads: n.max(self.users),
            ..self
        }
    }
}

pub(crate) const THREADS_FULL: ThreadSizes = ThreadSizes {
    big_runs: 500,
    connects: 200,
    threads: 100_000,
    users: 1_000,
    sampled_users: 200,
    concurrency: 64,
};

pub(crate) const THREADS_SMOKE: ThreadSizes = ThreadSizes {
    big_runs: 10,
    connects: 5,
    threads: 200,
    users: 10,
    sampled_users: 4,
    concurrency: 8,
};

/// A user message of a realistic length (the title comes from it).
fn user_text(kind: &str, i: usize) -> String {
    format!(
        "{kind}:Create a VPC with two vSwitches in cn-hangzhou for thread number {i}, then a \
         security group that allows HTTPS from the office range and an ECS instance behind it"
    )
}

fn with_user(rb: reqwest::RequestBuilder, user: &str) -> reqwest::RequestBuilder {
    rb.header("authorization", format!("Bearer {TOKEN}"))
        .header("x-iac-code-user", user)
}

/// One whole run, as `user` (none: a gateway without authentication): fails unless its stream
/// ends with `RUN_FINISHED`.
pub(crate) async fn turn(
    c: &reqwest::Client,
    g: &Gateway,
    user: Option<&str>,
    thread: &str,
    run_id: &str,
    text: &str,
) -> Result<()> {
    let body = json!({"threadId": thread, "runId": run_id, "state": {},
        "messages": [{"id": format!("m-{run_id}"), "role": "user", "content": text}],
        "tools": [], "context": [],
        "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": "bench", "cwd": g.ws}}});
    let rb = c.post(&g.url);
    let rb = match user {
        Some(u) => with_user(rb, u),
        None => rb,
    };
    let resp = rb
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!("turn on {thread}: HTTP {}", resp.status());
    }
    let mut last = Vec::new();
    read_events(resp, b"\n\n", |e| last = e.to_vec()).await?;
    if !last.windows(12).any(|w| w == b"RUN_FINISHED") {
        bail!(
            "turn on {thread} ended with {}",
            String::from_utf8_lossy(&last)
        );
    }
    Ok(())
}

/// Milliseconds from the request to the end of the `MESSAGES_SNAPSHOT` frame; its size.
async fn connect_once(
    c: &reqwest::Client,
    g: &Gateway,
    user: &str,
    thread: &str,
) -> Result<(f64, usize)> {
    let began = Instant::now();
    let resp = with_user(c.get(format!("{}threads/{thread}/connect", g.url)), user)
        .send()
        .await?;
    if !resp.status().is_success() {
        bail!("connect: HTTP {}", resp.status());
    }
    let mut s = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = s.next().await {
        buf.extend_from_slice(&chunk?);
        if let Some(at) = memchr::memmem::find(&buf, b"MESSAGES_SNAPSHOT") {
            if let Some(end) = memchr::memmem::find(&buf[at..], b"\n\n") {
                return Ok((began.elapsed().as_secs_f64() * 1000.0, at + end));
            }
        }
    }
    bail!("connect ended without a MESSAGES_SNAPSHOT")
}

/// One page of a user's list: its thread ids and its cursor; the time it took (ms).
async fn list_page(
    c: &reqwest::Client,
    g: &Gateway,
    user: &str,
    cursor: Option<&str>,
) -> Result<(Vec<String>, Option<String>, f64)> {
    let mut url = format!("{}threads", g.url);
    if let Some(cur) = cursor {
        url.push_str(&format!("?cursor={cur}"));
    }
    let began = Instant::now();
    let resp = with_user(c.get(url), user).send().await?;
    let status = resp.status();
    let body = resp.bytes().await?;
    let ms = began.elapsed().as_secs_f64() * 1000.0;
    if !status.is_success() {
        bail!("list: HTTP {status}");
    }
    let v: Value = serde_json::from_slice(&body)?;
    let ids = v["threads"]
        .as_array()
        .context("threads")?
        .iter()
        .filter_map(|t| t["threadId"].as_str().map(str::to_owned))
        .collect();
    Ok((ids, v["nextCursor"].as_str().map(str::to_owned), ms))
}

fn user_of(i: usize, z: ThreadSizes) -> String {
    format!("user-{:04}", i % z.users)
}

/// Walks every sampled user's list page by page; the page times (ms). Fails unless each walk
/// lists exactly that user's threads, once each.
async fn walk_lists(c: &reqwest::Client, g: &Gateway, z: ThreadSizes) -> Result<Vec<f64>> {
    let mut times = vec![];
    for k in 0..z.sampled_users {
        let n = k * (z.users / z.sampled_users);
        let user = user_of(n, z);
        let per_user = z.threads / z.users + usize::from(n < z.threads % z.users);
        let mut seen = HashSet::new();
        let mut cursor = None;
        loop {
            let (ids, next, ms) = list_page(c, g, &user, cursor.as_deref()).await?;
            times.push(ms);
            for id in ids {
                if !seen.insert(id.clone()) {
                    bail!("{user}'s list gave {id} twice");
                }
            }
            match next {
                Some(n) => cursor = Some(n),
                None => break,
            }
        }
        if seen.len() != per_user {
            bail!("{user}'s list has {} threads, not {per_user}", seen.len());
        }
    }
    Ok(times)
}

fn ms_percentiles(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| {
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    (at(0.5), at(0.99))
}

/// The figures of one store.
async fn measure_store(
    name: &str,
    target: &Target,
    kernel: &SyntheticKernel,
    z: ThreadSizes,
) -> Result<()> {
    let env = [("IAC_CODE_AGUI_AUTH_TOKEN", TOKEN)];
    let g = start_with(target, kernel, &env, None).await?;
    let c = client();
    let pid = g.child.id();
    println!("== {name}");

    // A thread of big_runs turns: 2 messages each (the user's, the assistant's 400 characters).
    let big_user = "user-big";
    let t = Instant::now();
    for r in 0..z.big_runs {
        turn(
            &c,
            &g,
            Some(big_user),
            "big",
            &format!("r{r}"),
            &user_text("deltas:400", r),
        )
        .await?;
    }
    println!(
        "  {} turns on one thread, one after another   {:>8.1} s",
        z.big_runs,
        t.elapsed().as_secs_f64()
    );
    let mut times = vec![];
    let mut size = 0;
    for _ in 0..z.connects {
        let (ms, bytes) = connect_once(&c, &g, big_user, "big").await?;
        times.push(ms);
        size = bytes;
    }
    let (p50, p99) = ms_percentiles(times);
    println!(
        "  connect, {} messages ({} KiB snapshot): to MESSAGES_SNAPSHOT p50/p99 {:>6.2} / {:.2} ms",
        z.big_runs * 2,
        size / 1024,
        p50,
        p99
    );

    // threads threads of users users, one turn each, concurrency at a time.
    let cpu_before = cpu_ms(pid);
    let rss_before = rss_kib(pid);
    let t = Instant::now();
    let g = Arc::new(g);
    let results: Vec<Result<()>> = stream::iter(0..z.threads)
        .map(|i| {
            let (c, g) = (c.clone(), g.clone());
            async move {
                let thread = format!("t-{i:06}");
                turn(
                    &c,
                    &g,
                    Some(&user_of(i, z)),
                    &thread,
                    "r0",
                    &user_text("deltas:20", i),
                )
                .await
            }
        })
        .buffer_unordered(z.concurrency)
        .collect()
        .await;
    if let Some(e) = results.into_iter().find_map(Result::err) {
        return Err(e);
    }
    let secs = t.elapsed().as_secs_f64();
    let turn_cpu_us = cpu_ms(pid).saturating_sub(cpu_before) as f64 * 1000.0 / z.threads as f64;
    println!(
        "  {} threads of {} users, one turn each ({} at a time): {:>8.0} turns/s, {:.0} µs gateway CPU a turn",
        z.threads,
        z.users,
        z.concurrency,
        z.threads as f64 / secs,
        turn_cpu_us
    );
    println!(
        "  RSS growth over those threads                 {:>8.0} B a thread",
        rss_kib(pid).saturating_sub(rss_before) as f64 * 1024.0 / z.threads as f64
    );
    let (p50, p99) = ms_percentiles(walk_lists(&c, &g, z).await?);
    println!(
        "  list a user's threads ({} users walked, {} a page): p50/p99 {:>6.2} / {:.2} ms a page",
        z.sampled_users,
        listing_page(z),
        p50,
        p99
    );

    // The first page after a restart, then the walks again.
    let g = Arc::into_inner(g).context("the gateway is still shared")?;
    let dir = g.into_dir();
    let g = start_with(target, kernel, &env, Some(dir)).await?;
    let (_, _, first) = list_page(&c, &g, &user_of(0, z), None).await?;
    let (p50, p99) = ms_percentiles(walk_lists(&c, &g, z).await?);
    println!(
        "  after a restart: first page {:>8.1} ms, then p50/p99 {:.2} / {:.2} ms a page",
        first, p50, p99
    );
    Ok(())
}

fn listing_page(z: ThreadSizes) -> usize {
    (z.threads / z.users).min(20)
}

/// The stores measured: the file store, PostgreSQL, or both (alternating).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stores {
    File,
    Postgres,
    Both,
}

impl Stores {
    pub(crate) fn parse(s: Option<&str>) -> Result<Stores> {
        match s {
            None | Some("both") => Ok(Stores::Both),
            Some("file") => Ok(Stores::File),
            Some("postgres") => Ok(Stores::Postgres),
            Some(other) => bail!("--store is file, postgres or both, not {other}"),
        }
    }
}

pub(crate) async fn threads(
    gateway: &std::path::Path,
    kernel: &SyntheticKernel,
    z: ThreadSizes,
    rounds: usize,
    stores: Stores,
) -> Result<()> {
    let pg = (stores != Stores::File).then(testkit::postgres::Cluster::start);
    for round in 0..rounds {
        if stores != Stores::Postgres {
            let file = Target::Rust(gateway.to_owned(), vec![]);
            let name = format!("round {}: file store", round + 1);
            measure_store(&name, &file, kernel, z).await?;
        }
        let Some(pg) = &pg else {
            continue;
        };
        let url = pg.create_db(&format!("threads{round}"));
        let on_pg = Target::Rust(gateway.to_owned(), vec!["--state-url".to_owned(), url]);
        let name = format!(
            "round {}: PostgreSQL store (synchronous_commit on)",
            round + 1
        );
        measure_store(&name, &on_pg, kernel, z).await?;
    }
    Ok(())
}

/// Turns `turns` (run ids `r<n>`) of each of `threads` threads (a thread's turns one after
/// another, `concurrency` threads at a time), without authentication: turns a second.
pub(crate) async fn turn_rate(
    c: &reqwest::Client,
    g: &Arc<Gateway>,
    threads: usize,
    turns: std::ops::Range<usize>,
    concurrency: usize,
) -> Result<f64> {
    let count = threads * turns.len();
    let t = Instant::now();
    let results: Vec<Result<()>> = stream::iter(0..threads)
        .map(|i| {
            let (c, g, turns) = (c.clone(), g.clone(), turns.clone());
            async move {
                for r in turns {
                    let run = format!("r{r}");
                    turn(
                        &c,
                        &g,
                        None,
                        &format!("turns-{i}"),
                        &run,
                        &user_text("deltas:20", i),
                    )
                    .await?;
                }
                Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    if let Some(e) = results.into_iter().find_map(Result::err) {
        return Err(e);
    }
    Ok(count as f64 / t.elapsed().as_secs_f64())
}
