//! The HTTP surface: `GET|HEAD /health`, `/live` and `/ready`, `POST /`, `POST /extensions/iac-code/v1/executions/{id}/cancel`,
//! `GET /threads/{threadId}` and `GET /threads/{threadId}/runs/{runId}/events` (`threads_api`);
//! between instances, `GET /cluster/v1/hello` (`relay.rs`). With CORS origins configured, a preflight of an allowed origin on a POST route is answered
//! first (`cors.rs`), and every answer to an allowed origin carries its CORS headers.
//!
//! Before any route, without authentication configured: the request's host (421, `hosts.rs`;
//! `/health` answers it as a caller without the token). Order of checks on the POST routes: route
//! and method (404/405, plain text) → authentication (401; a forward's mark instead, `forward`) → Content-Type (415) → body size (413, from
//! Content-Length and while reading) and time (408; `request_body.rs`, which also drains a body an
//! early answer left unread) → JSON (400) → validation (400) → admission (409/503) → SSE. Every
//! error before the SSE response is the JSON envelope `{"error":{"code","message"}}` in the
//! negotiated language; a 413 and a 408 close the connection.

mod cancel_route;
mod ids;
mod observe_route;
mod relay;
mod rules;
mod threads;

use relay::{cluster_hello, get_held_elsewhere, held_elsewhere, to_holder, Outgoing};
use rules::{
    BodyRules, AGENTS_STATE_RULES, CANCEL_RULES, OBSERVE_RULES, PATCH_RULES, RUN_RULES,
    THREAD_METHODS,
};

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use ids::PathIds;
use serde_json::{json, Map, Value};

use crate::auth::access::{self, Refused, CANCEL_ROUTE, EVENTS_ROUTE, RUN_ROUTE, THREAD_ROUTE};
use crate::auth::Caller;
use crate::canonical;
use crate::config::Served;
use crate::error::{msg, ApiError, Code};
use crate::forward;
use crate::i18n::Lang;
use crate::request_body;
use crate::run::admit::{self, RunRequest};
use crate::run::{cancel, sink, spawn_run, Holder, Runtime};
use crate::telemetry::{self, observer, otel};
use crate::threads_api;
use crate::validate::{self, content, cwd, props};

pub const RUN_BODY_LIMIT: usize = 12 * 1024 * 1024;
pub const CANCEL_BODY_LIMIT: usize = 64 * 1024;
pub const HEARTBEAT: Duration = Duration::from_secs(15);

/// Shared handler state.
#[derive(Clone)]
pub struct AppState {
    pub rt: Arc<Runtime>,
    pub heartbeat: Duration,
}

/// The router of the main listener.
pub fn router(state: AppState) -> Router {
    routes(state, Served::Main)
}

/// What the admin listener serves besides its own routes when the console is there: the
/// gateway's routes (the console calls them on its own origin) and the console.
pub fn admin_routes(state: AppState) -> Option<Router> {
    (state.rt.cfg().console == Served::Admin).then(|| routes(state, Served::Admin))
}

/// The gateway's routes, with the console's when it is served on `listener`.
fn routes(state: AppState, listener: Served) -> Router {
    let bounds = state.rt.cfg().body_bounds();
    let cors = state.rt.cfg().cors_origins.clone();
    let metrics = state.rt.metrics().clone();
    let hosts = state.clone();
    let router = Router::new()
        .route("/health", any(health))
        .route("/live", any(live))
        .route("/ready", any(ready))
        .route("/", any(run))
        .route(
            "/extensions/iac-code/v1/executions/{execution_id}/cancel",
            any(cancel_route::cancel_route),
        )
        .route(
            "/extensions/iac-code/v1/executions/{execution_id}/subscribe",
            any(observe_route::observe_route),
        )
        .route("/threads", any(threads::list_route))
        .route("/agents/state", any(threads::agents_state_route))
        .route("/threads/{thread_id}", any(threads::thread_route))
        .route("/cluster/v1/hello", any(cluster_hello))
        .route("/capabilities", any(threads::capabilities_route))
        .route(
            "/threads/{thread_id}/messages",
            any(threads::messages_route),
        )
        .route("/threads/{thread_id}/connect", any(threads::connect_route))
        .route(
            "/threads/{thread_id}/runs/{run_id}/events",
            any(threads::events_route),
        )
        .fallback(not_found);
    // The console's routes exist only when it is asked for: otherwise its paths are 404.
    let router = match state.rt.cfg().console == listener {
        true => {
            let console = Arc::new(crate::console::Console::new(
                state.rt.auth().required(),
                // On the admin listener, `/metrics` is the page's own origin.
                listener == Served::Admin,
            ));
            let page = move |req: Request| {
                let console = console.clone();
                async move {
                    let (method, path) = (req.method(), req.uri().path());
                    console
                        .answer(method, path, req.headers())
                        .unwrap_or_else(|| plain(StatusCode::NOT_FOUND, "Not Found"))
                }
            };
            router
                .route("/console", any(page.clone()))
                .route("/console/", any(page.clone()))
                .route("/console/{file}", any(page))
        }
        false => router,
    };
    let router = router
        .with_state(state)
        .layer(axum::middleware::from_fn_with_state(hosts, host_check))
        .layer(axum::middleware::map_response(no_store_json))
        // The access line and the HTTP counters see every answer, CORS headers included.
        .layer(axum::middleware::from_fn(move |req, next| {
            telemetry::access::layer(metrics.clone(), req, next)
        }));
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

/// The DNS-rebinding defence (`hosts.rs`): 421 `HOST_NOT_ALLOWED` on every route but the probes
/// (`/health`, which judges the request itself, `/live`, `/ready`: they tell nothing of a user).
async fn host_check(
    State(s): State<AppState>,
    req: Request,
    next: axum::middleware::Next,
) -> Response {
    let probe = matches!(req.uri().path(), "/health" | "/live" | "/ready");
    if probe || host_allowed(s.rt.cfg(), req.uri(), req.headers()) {
        return next.run(req).await;
    }
    let hl = header_lang(&s.rt, req.headers());
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

/// The checks of the GET routes: preflight, method, authentication. Returns the header language
/// and the caller.
#[allow(clippy::result_large_err)]
async fn get_checks(
    rt: &Runtime,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    route: &'static str,
) -> Result<(Lang, Caller), Response> {
    if let Some(r) = rt.cfg().cors_origins.preflight(method, headers) {
        return Err(r);
    }
    if method != Method::GET {
        return Err(method_not_allowed("GET"));
    }
    bodiless_checks(rt, method, path, headers, route).await
}

/// The checks of a route without a body, whatever its method: preflight, authentication.
#[allow(clippy::result_large_err)]
async fn bodiless_checks(
    rt: &Runtime,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    route: &'static str,
) -> Result<(Lang, Caller), Response> {
    if let Some(r) = rt.cfg().cors_origins.preflight(method, headers) {
        return Err(r);
    }
    let hl = header_lang(rt, headers);
    let (caller, _) = authenticate(rt, method, path, headers, route, hl).await?;
    Ok((hl, caller))
}

/// Who is calling ([`crate::auth::Auth::authenticate`]), or the refusal to answer (recorded);
/// with the body digest a forward's signature covers (the route checks the body against it).
#[allow(clippy::result_large_err)]
async fn authenticate(
    rt: &Runtime,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
    route: &'static str,
    hl: Lang,
) -> Result<(Caller, Option<String>), Response> {
    // Forwarded by another instance: authenticated there.
    if let Some(f) = rt.with_trust(|t| forward::forwarded(method, path, headers, t)) {
        // A signed forward counts once: one sent again is no forward (and no client either).
        let fresh = f.signature.as_ref().is_none_or(|(sig, time)| {
            let now = rt.with_trust(|t| t.now);
            rt.forwards_seen().first(sig, *time, now)
        });
        if !fresh {
            tracing::warn!("a signed forward was sent again: refused");
            return Err(ApiError::new(Code::Unauthorized, msg::UNAUTHORIZED).into_response_in(hl));
        }
        return Ok((f.caller, f.body_sha256));
    }
    match rt.auth().authenticate(headers).await {
        Ok(caller) => Ok((caller, None)),
        Err(denied) => {
            access::record(rt.metrics(), route, Refused::Auth(denied), None, None);
            Err(denied.error().into_response_in(hl))
        }
    }
}

fn path_of(req: &Request) -> String {
    req.uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned())
}

/// A CORS preflight of an allowed origin on a POST route, answered before authentication.
fn preflight(rt: &Runtime, req: &Request) -> Option<Response> {
    rt.cfg().cors_origins.preflight(req.method(), req.headers())
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

fn method_not_allowed(allow: &'static str) -> Response {
    let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed");
    r.headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static(allow));
    r
}

async fn health(State(s): State<AppState>, req: Request) -> Response {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return method_not_allowed("GET, HEAD");
    }
    // Probes send any Host (a service's name, a pod's): they get the answer; a request for a host
    // that is not allowed gets what a caller without the token gets.
    let (cfg, h) = (s.rt.cfg(), req.headers());
    let operator =
        s.rt.auth()
            .authenticate(h)
            .await
            .is_ok_and(|c| c.is_operator());
    crate::health::answer(&s.rt, operator && host_allowed(cfg, req.uri(), h))
}

async fn live(req: Request) -> Response {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return method_not_allowed("GET, HEAD");
    }
    crate::health::live()
}

async fn ready(State(s): State<AppState>, req: Request) -> Response {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return method_not_allowed("GET, HEAD");
    }
    crate::health::ready(&s.rt).await
}

fn header_lang(rt: &Runtime, headers: &HeaderMap) -> Lang {
    let al = headers
        .get(header::ACCEPT_LANGUAGE)
        .and_then(|v| v.to_str().ok());
    Lang::from_accept_language(al, rt.cfg().fallback_lang)
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .eq_ignore_ascii_case("application/json")
        })
        .unwrap_or(false)
}

/// An error answer after which the connection closes: the rest of the body is not wanted (it is
/// drained within bounds all the same, so that the client reads the answer).
fn closing(mut r: Response) -> Response {
    r.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    r
}

fn parse_json(bytes: &[u8]) -> Option<Value> {
    let bytes = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    serde_json::from_slice(bytes).ok()
}

/// A POST route's checked request: the header language, the caller, the raw body and the
/// object.
struct JsonRequest {
    hl: Lang,
    caller: Caller,
    raw: Bytes,
    obj: Map<String, Value>,
}

/// The checks every POST route shares, in order: method, authentication, Content-Type, size,
/// JSON object.
#[allow(clippy::result_large_err)]
async fn json_object(
    rt: &Runtime,
    req: Request,
    rules: &BodyRules,
) -> Result<JsonRequest, Response> {
    if *req.method() != rules.method {
        return Err(method_not_allowed(rules.allow));
    }
    let hl = header_lang(rt, req.headers());
    let err = |code: Code, m: &'static str| Err(ApiError::new(code, m).into_response_in(hl));
    let path = path_of(&req);
    let method = req.method().clone();
    let (caller, signed_body) =
        authenticate(rt, &method, &path, req.headers(), rules.route, hl).await?;
    if !is_json(req.headers()) {
        return err(Code::UnsupportedMediaType, msg::UNSUPPORTED_MEDIA_TYPE);
    }
    let body = match request_body::read(req, rules.limit).await {
        Ok(b) => b,
        Err(request_body::Unread::TooLarge) => {
            return err(Code::RequestTooLarge, rules.too_large).map_err(closing)
        }
        // A body broken on the way is not JSON; the connection is not reused.
        Err(request_body::Unread::Broken) => {
            return err(Code::InvalidJson, rules.invalid_json).map_err(closing)
        }
        Err(request_body::Unread::Late) => {
            return err(Code::BodyTimeout, msg::BODY_TIMEOUT).map_err(closing)
        }
    };
    // A forward's signature names its body: another body is no forward of it.
    if signed_body.is_some_and(|d| d != forward::body_digest(&body)) {
        tracing::warn!("a forwarded request's body does not match its signature");
        return err(Code::Unauthorized, msg::UNAUTHORIZED);
    }
    match parse_json(&body) {
        None => err(Code::InvalidJson, rules.invalid_json),
        Some(Value::Object(obj)) => Ok(JsonRequest {
            hl,
            caller,
            raw: body,
            obj,
        }),
        Some(_) => err(Code::InvalidInput, rules.not_object),
    }
}

/// The trace span of a run: from its request to its end. Its fields are the attributes an
/// operator filters on, filled in as they become known (never a secret).
fn run_span(headers: &HeaderMap) -> tracing::Span {
    use tracing::field::Empty;
    let span = tracing::info_span!(
        "agui.run",
        otel.kind = "server",
        thread_id = Empty,
        run_id = Empty,
        execution_id = Empty,
        mode = Empty,
        outcome = Empty,
        error_code = Empty,
        event_count = Empty,
    );
    otel::continue_trace(&span, headers);
    span
}

async fn run(State(s): State<AppState>, req: Request) -> Response {
    use tracing::Instrument as _;
    if let Some(r) = preflight(&s.rt, &req) {
        return r;
    }
    let span = run_span(req.headers());
    let trace_headers = otel::client_headers(req.headers());
    // Kept for a forward to the thread's holder (a shared store only).
    let forwardable =
        s.rt.threads()
            .store()
            .shared()
            .then(|| (req.headers().clone(), path_of(&req)));
    run_request(s, req, span.clone(), trace_headers, forwardable)
        .instrument(span)
        .await
}

async fn run_request(
    s: AppState,
    req: Request,
    span: tracing::Span,
    trace_headers: Vec<(axum::http::HeaderName, HeaderValue)>,
    forwardable: Option<(HeaderMap, String)>,
) -> Response {
    let rt = s.rt.clone();
    let JsonRequest {
        hl,
        caller,
        raw: body,
        obj,
    } = match json_object(&rt, req, &RUN_RULES).await {
        Ok(x) => x,
        Err(r) => {
            span.record("outcome", "refused");
            return r;
        }
    };
    let obj = &obj;
    let lang = props::raw_preferred_language(obj)
        .and_then(Lang::from_tag)
        .unwrap_or(hl);
    let refused = |e: ApiError| {
        span.record("outcome", "refused");
        span.record("error_code", e.code.as_str());
        e.into_response_in(lang)
    };
    // A slot among `--max-runs` before anything is touched (workspace, store, kernel): a refusal
    // leaves nothing behind. It goes with the run to its end (forwarded requests give it back).
    let Some(slot) = rt.limits().run() else {
        return refused(ApiError::new(Code::TooManyRuns, msg::TOO_MANY_RUNS));
    };
    let who = caller.clone();
    let request = match prepare(&rt, obj, &body, lang, caller).await {
        Ok(r) => r,
        Err(e) => return refused(e),
    };
    let secrets = request.iac.carries_secrets();
    let (stranger, thread_id) = (
        admit::stranger_answer(&request),
        request.envelope.thread_id.clone(),
    );
    span.record("thread_id", request.envelope.thread_id.as_str());
    span.record("run_id", request.envelope.run_id.as_str());
    match admit::admit(&rt, request).await {
        Ok(adm) => {
            span.record("execution_id", adm.execution_id.as_str());
            span.record("mode", adm.mode.name());
            let rx = spawn_run(s.rt.clone(), adm, slot, span, trace_headers);
            sse_response(&s, rx)
        }
        Err(admit::NotAdmitted::Refused(e)) => refused(e),
        Err(admit::NotAdmitted::HeldElsewhere(peer)) => {
            drop(slot);
            // Another user's thread is answered here as admission would, never forwarded.
            if let Err(r) = relay::theirs(&rt, &who, &thread_id, RUN_ROUTE, stranger, lang).await {
                span.record("outcome", "refused");
                return r;
            }
            // A user's secrets cross to another instance only to one proven by the secret.
            if secrets && rt.cfg().cluster_secret.is_none() {
                tracing::error!(
                    "a request carrying credentials (llmApiKey, llmHeaders, alibabaCloud) is for a \
                     thread another instance holds: it is not forwarded without a cluster secret \
                     (IAC_CODE_AGUI_CLUSTER_SECRET)"
                );
                return refused(ApiError::new(
                    Code::StateUnavailable,
                    msg::FORWARD_NEEDS_SECRET,
                ));
            }
            span.record("outcome", "forwarded");
            let (headers, path) = forwardable.unwrap_or_default();
            let out = Outgoing {
                method: Method::POST,
                path: &path,
                headers: &headers,
                body,
                caller: &who,
            };
            to_holder(&rt, &peer, out, lang).await
        }
    }
}

/// Validation before admission: everything that can refuse a run (envelope, `iacCode`, workspace,
/// message content) is checked before the SSE response starts, so a refusal is a plain JSON error
/// and the run id is not consumed.
async fn prepare(
    rt: &Arc<Runtime>,
    obj: &Map<String, Value>,
    raw: &[u8],
    lang: Lang,
    caller: Caller,
) -> Result<RunRequest, ApiError> {
    let mut envelope = validate::envelope::parse(obj)?;
    let forwarded = obj
        .get("forwardedProps")
        .or_else(|| obj.get("forwarded_props"));
    let mut iac = props::parse(forwarded)?;
    // The run acts for the authenticated user: the kernel gets them as `userId`.
    iac.user_id = access::run_user(&caller, iac.user_id.as_deref()).inspect_err(|_| {
        let (user, thread) = (caller.user.as_deref(), Some(envelope.thread_id.as_str()));
        access::record(rt.metrics(), RUN_ROUTE, Refused::UserMismatch, user, thread);
    })?;
    let digest = canonical::digest_bytes(raw)
        .map_err(|_| ApiError::new(Code::InvalidInput, msg::INVALID_PROPS))?;
    let rt2 = rt.clone();
    let raw_cwd = iac.cwd.clone();
    let tools_len = envelope.tools_len;
    let needs_message = envelope.resume.is_none() || iac.active_guidance;
    // Only the latest user message is used: the history leaves with the request instead of
    // staying with the run for its whole life.
    let messages = needs_message.then(|| std::mem::take(&mut envelope.messages));
    // The checks read the file system (the workspace) and base64: off the runtime. They change
    // nothing: images are decoded and the workspace created only once the thread would admit
    // the request (`run::prepare`).
    let (workspace, user_message) = tokio::task::spawn_blocking(move || {
        let workspace = cwd::resolve(&raw_cwd, rt2.cfg())?;
        if tools_len > 0 {
            return Err(ApiError::new(Code::InvalidInput, msg::TOOLS_UNSUPPORTED));
        }
        let user_message = match messages {
            Some(m) => Some(content::latest_user_message(
                &m,
                content::ImageLimits::default(),
            )?),
            None => None,
        };
        Ok((workspace, user_message))
    })
    .await
    .map_err(|_| ApiError::new(Code::InvalidInput, msg::INVALID_PROPS))??;
    Ok(RunRequest {
        envelope,
        iac,
        cwd: workspace.path,
        create_cwd: workspace.missing,
        digest,
        user_message,
        lang,
        caller,
    })
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
