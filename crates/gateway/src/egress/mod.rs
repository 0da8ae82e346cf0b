//! The LLM egress (`--llm-upstream`): kernels call the LLM provider through the gateway, which
//! holds the key, so that no kernel (and no agent's tool in it) ever has it.
//!
//! A loopback listener of its own, on a port the system picks: each managed kernel is started
//! with `IAC_CODE_BASE_URL=http://127.0.0.1:<port>/<capability>` and that capability as its
//! `IAC_CODE_API_KEY` (new at each start of a user's kernel; one for the shared kernels:
//! `grants`). Each run gets a capability of its own in place of the request's `llmApiKey`,
//! which stays here with its `llmHeaders` and the run's user; the kernel sends it as the key of
//! the run's LLM calls. `forward` checks and relays a request (`body`: what of it goes up and
//! what it may spend; `shares`: each user's share of the places); `usage` reads the tokens of
//! an answer as it passes; `ledger` keeps each user's totals, reserves and budget.

mod body;
mod forward;
mod grants;
mod ledger;
mod shares;
mod usage;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use serde_json::{json, Value};
use tokio::sync::Semaphore;

use crate::config::egress::Egress as Options;
use crate::config::EnvFn;
use crate::outbound::Outbound;
use crate::telemetry::Metrics;
use engine::validate::props::{IacCode, Secret};

pub use grants::GRACE;

/// TCP and TLS to the upstream must connect within this.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most connections kernels hold open to the egress at once.
const MAX_CONNECTIONS: usize = 1024;
/// A request head must come this soon (and an idle connection is closed after as long): a
/// kernel on this machine sends its at once, and a process holding connections without a
/// capability holds them briefly.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// A kernel's connection whose writes stall this long is closed.
const WRITE_STALL: Duration = Duration::from_secs(120);

/// The egress, running.
#[derive(Clone)]
pub struct Egress {
    inner: Arc<Inner>,
    port: u16,
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// What the egress's requests share.
struct Inner {
    grants: Mutex<grants::Grants>,
    ledger: Mutex<ledger::Ledger>,
    upstream: url::Url,
    /// The operator's key.
    key: Option<String>,
    client: Outbound,
    permits: Arc<Semaphore>,
    /// Each account's share of the requests and of the bodies held.
    shares: shares::Shares,
    /// A token budget is set.
    budgeted: bool,
    metrics: Arc<Metrics>,
    /// When a refused request was last said at warn level (refusals come unauthenticated).
    denied_said: Mutex<Option<Instant>>,
}

impl Inner {
    fn admit(&self, kernel: &str, key: Option<&str>) -> Result<grants::Spend, grants::Denied> {
        self.grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .admit(kernel, key, Instant::now())
    }

    fn ledger(&self) -> std::sync::MutexGuard<'_, ledger::Ledger> {
        self.ledger
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn exhausted(&self, account: &str) -> Option<Duration> {
        self.ledger().exhausted(account, Instant::now())
    }

    /// Reserves `tokens` of `account`'s budget, unless it is spent (how long until it frees).
    fn reserve(&self, account: &str, tokens: u64) -> Result<(), Duration> {
        let mut l = self.ledger();
        if let Some(wait) = l.exhausted(account, Instant::now()) {
            return Err(wait);
        }
        l.reserve(account, tokens, Instant::now());
        Ok(())
    }

    fn settle(&self, account: &str, reserved: u64, input: u64, output: u64) {
        self.ledger()
            .settle(account, reserved, input, output, Instant::now());
    }

    /// Says a refused request: at warn level at most once a minute, else at debug.
    fn say_denied(&self, why: grants::Denied) {
        let mut said = self
            .denied_said
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if said.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            *said = Some(Instant::now());
            tracing::warn!(reason = ?why, "an LLM request without a valid capability was refused (said once a minute; agui_llm_requests_total counts each)");
        } else {
            tracing::debug!(reason = ?why, "an LLM request without a valid capability was refused");
        }
    }
}

/// A run's capability: honoured until [`GRACE`] after it is dropped (the run's end).
pub struct RunGrant {
    inner: Arc<Inner>,
    token: String,
}

impl std::fmt::Debug for RunGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RunGrant(..)")
    }
}

impl Drop for RunGrant {
    fn drop(&mut self) {
        self.inner
            .grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .end_run(&self.token, Instant::now());
    }
}

impl Egress {
    /// Binds the loopback listener and serves it (for as long as the gateway runs: kernels
    /// finish their turns while it drains). Refused: a CA file that cannot be read, a port that
    /// cannot be bound. Within the runtime.
    pub fn start(opts: &Options, env: EnvFn<'_>, metrics: Arc<Metrics>) -> Result<Egress, String> {
        if opts.upstream.scheme() == "https" {
            tls::client(opts.ca.as_deref(), "--llm-upstream-ca")?;
        }
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.set_nonblocking(true).map(|()| l))
            .and_then(tokio::net::TcpListener::from_std)
            .map_err(|e| format!("the LLM egress cannot listen on 127.0.0.1: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("the LLM egress's port: {e}"))?
            .port();
        let inner = Arc::new(Inner {
            grants: Mutex::new(grants::Grants::default()),
            ledger: Mutex::new(ledger::Ledger::new(opts.budget, Instant::now())),
            upstream: opts.upstream.clone(),
            key: opts.key.clone(),
            client: Outbound::upstream(opts.ca.clone(), CONNECT_TIMEOUT, env),
            permits: Arc::new(Semaphore::new(opts.max_requests)),
            shares: shares::Shares::new(opts.max_requests),
            budgeted: opts.budget.is_some(),
            metrics,
            denied_said: Mutex::new(None),
        });
        let served = inner.clone();
        let app = Router::new()
            .fallback(move |req: axum::extract::Request| forward::serve(served.clone(), req));
        let cap = crate::edge::server::ConnectionCap {
            max: MAX_CONNECTIONS,
            on_full: Box::new(|| {}),
        };
        tokio::spawn(crate::edge::server::serve_timed(
            listener,
            app,
            WRITE_STALL,
            HEAD_TIMEOUT,
            Some(cap),
            None,
            std::future::pending(),
        ));
        tracing::info!(
            port,
            upstream = %opts.upstream,
            "LLM egress: kernels reach the LLM provider through the gateway, which holds the key"
        );
        Ok(Egress { inner, port })
    }

    /// The loopback port kernels reach the egress on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The variables a kernel of `account` (a user's key; none: the shared kernels) is started
    /// with: its base URL and capability, and the loopback kept off any proxy.
    pub fn kernel_vars(&self, account: Option<&str>, env: EnvFn<'_>) -> Vec<(String, String)> {
        let token = self
            .inner
            .grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .kernel(account.map(str::to_owned));
        let mut vars = vec![
            (
                "IAC_CODE_BASE_URL".to_owned(),
                format!("http://127.0.0.1:{}/{token}", self.port),
            ),
            ("IAC_CODE_API_KEY".to_owned(), token),
        ];
        for name in ["NO_PROXY", "no_proxy"] {
            vars.push((name.to_owned(), no_proxy(env(name).as_deref())));
        }
        vars
    }

    /// The capability of a run of `account`'s on `thread`, put in place of the request's key
    /// and headers (which stay here), and the mark set when one of its calls is refused for the
    /// budget; refused while the user's budget is spent (how long until it frees).
    pub fn grant_run(
        &self,
        account: &str,
        thread: &str,
        iac: &mut IacCode,
    ) -> Result<(RunGrant, Arc<AtomicBool>), Duration> {
        if let Some(wait) = self.inner.exhausted(account) {
            return Err(wait);
        }
        let key = iac
            .llm_api_key
            .take()
            .map(|k| k.0.trim().to_owned())
            .filter(|k| !k.is_empty());
        let given = iac.llm_headers.take().unwrap_or_default();
        let headers = body::run_headers(given.iter().map(|(k, v)| (k.as_str(), v.0.as_str())));
        let run = grants::NewRun {
            account: account.to_owned(),
            thread: thread.to_owned(),
            key,
            headers,
        };
        let (token, refused) = self
            .inner
            .grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .run(run, Instant::now());
        iac.llm_api_key = Some(Secret(token.clone()));
        let grant = RunGrant {
            inner: self.inner.clone(),
            token,
        };
        Ok((grant, refused))
    }

    /// `account`'s figures, as the threads list shows them to its user.
    pub fn usage(&self, account: &str) -> Value {
        let l = self.inner.ledger();
        let t = l.totals(account, Instant::now());
        let (budget, window) = l.budget();
        json!({
            "requests": t.requests,
            "inputTokens": t.input_tokens,
            "outputTokens": t.output_tokens,
            "window": {
                "seconds": window.as_secs(),
                "tokens": t.window_tokens,
                "budget": budget,
            }
        })
    }

    /// Runs whose capability is honoured now.
    #[cfg(test)]
    fn live_runs(&self) -> usize {
        self.inner
            .grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .live_runs(Instant::now())
    }
}

/// What [`Egress::kernel_vars`] sets.
pub const KERNEL_VARS: [&str; 4] = [
    "IAC_CODE_BASE_URL",
    "IAC_CODE_API_KEY",
    "NO_PROXY",
    "no_proxy",
];

/// `NO_PROXY` with the loopback added: the kernel's HTTP clients send even a loopback URL to a
/// proxy the environment names, unless this says otherwise.
fn no_proxy(existing: Option<&str>) -> String {
    let mut hosts: Vec<&str> = existing
        .unwrap_or_default()
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    for h in ["127.0.0.1", "localhost", "::1"] {
        if !hosts.contains(&h) {
            hosts.push(h);
        }
    }
    hosts.join(",")
}

/// The names of LLM keys a kernel may find in its environment and use instead of its
/// capability: taken out of every kernel's while the egress is on.
pub fn is_llm_key(name: &str) -> bool {
    const NAMES: [&str; 7] = [
        "IAC_CODE_API_KEY",
        "OPENAI_API_KEY",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
        "DASHSCOPE_API_KEY",
        "AZURE_OPENAI_API_KEY",
        "OPENROUTER_API_KEY",
    ];
    NAMES.contains(&name)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod pure_tests {
    use super::*;

    #[test]
    fn the_loopback_is_added_to_no_proxy_once() {
        assert_eq!(no_proxy(None), "127.0.0.1,localhost,::1");
        assert_eq!(
            no_proxy(Some("corp.example, localhost")),
            "corp.example,localhost,127.0.0.1,::1"
        );
    }

    #[test]
    fn llm_keys_are_named() {
        assert!(is_llm_key("IAC_CODE_API_KEY") && is_llm_key("OPENAI_API_KEY"));
        assert!(!is_llm_key("IAC_CODE_PROVIDER") && !is_llm_key("PATH"));
    }
}
