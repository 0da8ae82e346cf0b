//! `POST /`: a `RunAgentInput` in, the run's event stream out (SSE). Everything that can refuse
//! the request is checked before the stream starts (`prepare`, then admission), so a refusal is
//! a plain JSON error and the run id is not consumed; a thread another instance holds is
//! forwarded there.

use crate::error::Respond as _;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method};
use axum::response::Response;
use serde_json::{Map, Value};

use super::extract::{authenticate, json_body, path_and_query};
use super::relay::{self, to_holder, Outgoing};
use super::rules::{BodyRoute, RunRoute};
use super::{header_lang, sse_response, AppState};
use crate::auth::access::{self, Refused, RUN_ROUTE};
use crate::auth::Caller;
use crate::error::{msg, ApiError, Code};
use crate::telemetry::otel;
use engine::canonical;
use engine::i18n::Lang;
use engine::limits;
use engine::run::admit::{self, RunRequest};
use engine::run::{spawn_run, Runtime};
use engine::validate::{self, content, cwd, props};

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

pub(super) async fn run(State(s): State<AppState>, req: Request) -> Response {
    use tracing::Instrument as _;
    let span = run_span(req.headers());
    let trace_headers = otel::client_headers(req.headers());
    // Kept for a forward to the thread's holder (a shared store only).
    let forwardable =
        s.rt.threads()
            .store()
            .shared()
            .then(|| (req.headers().clone(), path_and_query(req.uri())));
    run_request(s, req, span.clone(), trace_headers, forwardable)
        .instrument(span)
        .await
}

/// The run's request, authenticated and read within its span (a refusal is the span's outcome).
async fn run_request(
    s: AppState,
    req: Request,
    span: tracing::Span,
    trace_headers: Vec<(axum::http::HeaderName, HeaderValue)>,
    forwardable: Option<(HeaderMap, String)>,
) -> Response {
    let rt = s.rt.clone();
    let read = async {
        let hl = header_lang(&s.cfg, req.headers());
        let path = path_and_query(req.uri());
        let (caller, signed) =
            authenticate(&s, req.method(), &path, req.headers(), RUN_ROUTE, hl).await?;
        let mut req = req;
        if let Some(digest) = signed {
            super::extract::sign(&mut req, digest);
        }
        let (body, obj) = json_body(&s.cfg, req, &RunRoute::RULES).await?;
        Ok::<_, Response>((hl, caller, body, obj))
    };
    let (hl, caller, body, obj) = match read.await {
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
    let mut slot = match rt.limits().run(caller.user.as_deref()) {
        Ok(slot) => slot,
        Err(limit) => return refused(limits::refused_run(limit)),
    };
    let who = caller.clone();
    let mut request = match prepare(&rt, obj, &body, lang, caller).await {
        Ok(r) => r,
        Err(e) => return refused(e),
    };
    let secrets = request.iac.carries_secrets();
    // With the LLM egress, the kernel gets the run's capability in place of its key and
    // headers, which stay here for the run's life; a user whose budget is spent is refused.
    if let Some(egress) = &s.egress {
        let account = kernel::tenant::user_key(who.user.as_deref());
        let thread = request.envelope.thread_id.clone();
        match egress.grant_run(&account, &thread, &mut request.iac) {
            Ok((grant, refused)) => {
                slot.hold(grant);
                request.budget_refused = Some(refused);
            }
            Err(wait) => {
                let e = ApiError::new(Code::LlmBudgetExhausted, msg::LLM_BUDGET_EXHAUSTED);
                let mut r = refused(e);
                r.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from(wait.as_secs().max(1)),
                );
                return r;
            }
        }
    }
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
            if secrets && s.cfg.cluster_secret.is_none() {
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
                path,
                headers: &headers,
                body,
                caller: &who,
            };
            to_holder(&s, &peer, out, lang).await
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
        access::record(
            &**rt.metrics(),
            RUN_ROUTE,
            Refused::UserMismatch,
            user,
            thread,
        );
    })?;
    let digest = canonical::digest_bytes(raw)
        .map_err(|_| ApiError::new(Code::InvalidInput, msg::INVALID_PROPS))?;
    let rt2 = rt.clone();
    let raw_cwd = iac.cwd.clone();
    // With users' own kernels, a caller's workspaces are under their own roots only.
    let own_roots = rt.kernels().tenants().map(|t| {
        let iso = t.isolation();
        let key = kernel::tenant::user_key(caller.user.as_deref());
        (iso.workspaces_of(&key), iso.identity)
    });
    let tools_len = envelope.tools_len;
    let needs_message = envelope.resume.is_none() || iac.active_guidance;
    // Only the latest user message is used: the history leaves with the request instead of
    // staying with the run for its whole life.
    let messages = needs_message.then(|| std::mem::take(&mut envelope.messages));
    // The checks read the file system (the workspace) and base64: off the runtime. They change
    // nothing: images are decoded and the workspace created only once the thread would admit
    // the request (`run::prepare`).
    let (workspace, user_message) = tokio::task::spawn_blocking(move || {
        let workspace = match own_roots {
            None => cwd::resolve(&raw_cwd, &rt2.settings().workspaces)?,
            Some((dirs, identity)) => {
                for d in dirs.iter().filter(|d| !d.is_dir()) {
                    kernel::isolate::private_dir(d, identity)
                        .map_err(|_| ApiError::new(Code::InvalidInput, msg::CWD_CANNOT_CREATE))?;
                }
                cwd::resolve(&raw_cwd, &cwd::Roots::Configured(dirs))?
            }
        };
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
        budget_refused: None,
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
