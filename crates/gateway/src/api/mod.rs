//! The HTTP surface, a file per route group: `probes` (`/health`, `/live`, `/ready`), `run`
//! (`POST /`), `cancel` and `observe` (the execution extensions), `threads/` (a thread's state,
//! its edits, its messages, a run's events, `connect`, the list, `POST /agents/state`),
//! `capabilities`, `console`, and between instances `relay` (forwards, `/cluster/v1/hello`).
//!
//! Before any route, without authentication configured: the request's host (421, `hosts.rs`;
//! the probes answer any host). With CORS origins configured, a preflight of an allowed origin
//! on a gateway route is answered first (`cors.rs`), and every answer to an allowed origin
//! carries its CORS headers. Order of checks on the POST routes: route and method (404/405, plain
//! text) → authentication (401; a forward's mark instead, `forward`; `extract::Authed`) →
//! Content-Type (415) → body size (413, from Content-Length and while reading) and time (408;
//! `request_body.rs`, which also drains a body an early answer left unread) → JSON (400;
//! `extract::JsonBody`) → validation (400) → admission (409/503) → SSE. Every error before the SSE
//! response is the JSON envelope `{"error":{"code","message"}}` in the negotiated language; a
//! 413 and a 408 close the connection.

pub mod admin;
mod cancel;
mod capabilities;
mod console;
mod extract;
mod ids;
mod observe;
mod probes;
mod relay;
mod rules;
mod run;
mod threads;

use crate::error::Respond as _;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, post};
use axum::Router;

use crate::config::Served;
use crate::edge::request_body;
use crate::error::{msg, ApiError, Code};
use crate::telemetry;
use engine::i18n::Lang;
use engine::run::{sink, Runtime};

pub const RUN_BODY_LIMIT: usize = 12 * 1024 * 1024;
pub const CANCEL_BODY_LIMIT: usize = 64 * 1024;
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// Shared handler state: the run core, and what the HTTP face keeps of its own.
#[derive(Clone)]
pub struct AppState {
    pub rt: Arc<Runtime>,
    /// The configuration the gateway started with.
    pub cfg: Arc<crate::config::Config>,
    /// The gateway's metrics (the engine reports into them as its `Telemetry`).
    pub metrics: Arc<crate::telemetry::Metrics>,
    pub heartbeat: Duration,
    /// How callers authenticate.
    pub auth: Arc<crate::auth::Auth>,
    /// Forwards to the instance that holds a thread.
    pub forwarding: Arc<crate::forward::Forwarding>,
    /// The kernel's Agent Card, for `/capabilities`.
    pub card: Arc<kernel::CardCache>,
    /// The LLM egress (`--llm-upstream`): runs get a capability in place of their key.
    pub egress: Option<crate::egress::Egress>,
}

impl AppState {
    /// What this instance trusts in a forwarded request, now.
    pub fn with_trust<R>(&self, f: impl FnOnce(crate::forward::Trust<'_>) -> R) -> R {
        let store = self.rt.threads().store();
        let (key, me) = (store.forward_key(), store.instance_id());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        f(crate::forward::Trust {
            secret: self.cfg.cluster_secret.as_deref().map(str::as_bytes),
            key: key.as_deref(),
            me: me.as_deref(),
            now,
            auth_required: self.auth.required(),
        })
    }
}

/// A handler's answer: a refusal is an answer too, so that `?` ends a handler.
type Answer = Result<Response, Response>;

/// An [`ApiError`] answered in a language.
trait Refusal<T> {
    #[allow(clippy::result_large_err)]
    fn or_answer(self, hl: Lang) -> Result<T, Response>;
}

impl<T> Refusal<T> for Result<T, ApiError> {
    fn or_answer(self, hl: Lang) -> Result<T, Response> {
        self.map_err(|e| e.into_response_in(hl))
    }
}

/// The router of the main listener.
pub fn router(state: AppState) -> Router {
    routes(state, Served::Main)
}

/// What the admin listener serves besides its own routes when the console is there: the
/// gateway's routes (the console calls them on its own origin) and the console.
fn admin_routes(state: AppState) -> Option<Router> {
    (state.cfg.console == Served::Admin).then(|| routes(state, Served::Admin))
}

/// The gateway's routes, with the console's when it is served on `listener`.
fn routes(state: AppState, listener: Served) -> Router {
    let bounds = state.cfg.body_bounds();
    let cors = state.cfg.cors_origins.clone();
    let metrics = state.metrics.clone();
    let hosts = state.clone();
    // The routes a page calls: a CORS preflight of an allowed origin is answered before the
    // method is (a route layer: an unknown path stays 404).
    let api = Router::new()
        .route("/", post(run::run))
        .route(
            "/extensions/iac-code/v1/executions/{execution_id}/cancel",
            post(cancel::cancel),
        )
        .route(
            "/extensions/iac-code/v1/executions/{execution_id}/subscribe",
            post(observe::observe),
        )
        .route("/threads", get(threads::list::list))
        .route("/agents/state", post(threads::agents_state::agents_state))
        .route(
            "/threads/{thread_id}",
            get(threads::state::get)
                .patch(threads::state::patch)
                .delete(threads::state::delete),
        )
        .route("/capabilities", get(capabilities::capabilities))
        .route(
            "/threads/{thread_id}/messages",
            get(threads::messages::messages),
        )
        .route(
            "/threads/{thread_id}/connect",
            get(threads::connect::connect),
        )
        .route(
            "/threads/{thread_id}/runs/{run_id}/events",
            get(threads::events::events),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            preflight,
        ));
    let router = Router::new()
        .merge(api)
        .merge(probes::routes())
        // Between instances only (404 without a cluster, whatever the method).
        .route("/cluster/v1/hello", any(relay::cluster_hello))
        .fallback(not_found);
    // The console's routes exist only when it is asked for: otherwise its paths are 404.
    let router = match state.cfg.console == listener {
        true => router.merge(console::routes(
            state.auth.required(),
            listener == Served::Admin,
        )),
        false => router,
    };
    let router = plain_405(
        router
            .with_state(state)
            .layer(axum::middleware::from_fn_with_state(hosts, host_check))
            .layer(axum::middleware::map_response(no_store_json))
            // The access line and the HTTP counters see every answer (its route matched).
            .layer(axum::middleware::from_fn(move |req, next| {
                telemetry::access::layer(metrics.clone(), req, next)
            })),
    );
    if cors.is_empty() {
        // No CORS: not even a layer in the way.
        return request_body::layer(router, bounds);
    }
    let cors = Arc::new(cors);
    let router = router.layer(axum::middleware::from_fn(
        move |req: Request, next: axum::middleware::Next| {
            let cors = cors.clone();
            async move {
                let origin = req.headers().get(header::ORIGIN).cloned();
                let mut response = next.run(req).await;
                let mut h = HeaderMap::new();
                if let Some(origin) = origin {
                    h.insert(header::ORIGIN, origin);
                }
                cors.decorate(&h, &mut response);
                response
            }
        },
    ));
    request_body::layer(router, bounds)
}

/// A method a route does not serve is answered in plain text, `Allow` naming what it serves
/// (axum's 405 has no body and lists the methods without a space). Around the whole router: a
/// route's `Allow` is added outside the layers of its own.
pub fn plain_405(router: Router) -> Router {
    let whole = Router::new().fallback_service(router);
    whole.layer(axum::middleware::map_response(
        |mut r: Response| async move {
            if r.status() != StatusCode::METHOD_NOT_ALLOWED {
                return r;
            }
            let allow = r
                .headers()
                .get(header::ALLOW)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.split(',').map(str::trim).collect::<Vec<_>>().join(", "));
            let mut plain = plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
            if let Some(v) = allow.and_then(|a| HeaderValue::from_str(&a).ok()) {
                plain.headers_mut().insert(header::ALLOW, v);
            }
            std::mem::swap(&mut r, &mut plain);
            r
        },
    ))
}

/// A CORS preflight of an allowed origin, answered before the method and the token are.
async fn preflight(
    State(s): State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    match s.cfg.cors_origins.preflight(req.method(), req.headers()) {
        Some(answer) => answer,
        None => next.run(req).await,
    }
}

/// The DNS-rebinding defence (`hosts.rs`): 421 `HOST_NOT_ALLOWED` on every route but the probes
/// (`/health`, which judges the request itself, `/live`, `/ready`: they tell nothing of a user).
async fn host_check(
    State(s): State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let probe = matches!(req.uri().path(), "/health" | "/live" | "/ready");
    if probe || host_allowed(&s.cfg, req.uri(), req.headers()) {
        return next.run(req).await;
    }
    let hl = header_lang(&s.cfg, req.headers());
    ApiError::new(Code::HostNotAllowed, msg::HOST_NOT_ALLOWED).into_response_in(hl)
}

/// Whether a request may be served as far as its host goes: always with authentication
/// configured (the credential is the check), else when it names an allowed host.
fn host_allowed(cfg: &crate::config::Config, uri: &axum::http::Uri, headers: &HeaderMap) -> bool {
    cfg.has_auth() || cfg.allowed_hosts.allows(uri, headers)
}

/// A JSON answer (an error, a thread's state, a cancellation, `/health`) is about one moment and
/// may carry a thread's binding: no cache keeps it.
async fn no_store_json(mut response: Response) -> Response {
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if json {
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    response
}

fn plain(status: StatusCode, text: &'static str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        text,
    )
        .into_response()
}

async fn not_found() -> Response {
    plain(StatusCode::NOT_FOUND, "Not Found")
}

fn header_lang(cfg: &crate::config::Config, headers: &HeaderMap) -> Lang {
    let al = headers
        .get(header::ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok());
    Lang::from_accept_language(al, cfg.fallback_lang)
}

fn json_ok(v: &serde_json::Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(v).expect("serialises"),
    )
        .into_response()
}

fn sse_response(s: &AppState, rx: tokio::sync::mpsc::Receiver<Bytes>) -> Response {
    let body = Body::from_stream(sink::body_stream(rx, s.heartbeat));
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .header(header::CONNECTION, "keep-alive")
        .body(body)
        .expect("response builds")
}
