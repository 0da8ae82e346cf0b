//! The cancellation extension's route: `POST /extensions/iac-code/v1/executions/{id}/cancel`
//! (its body checked like a run's, its ids bounded before any store or forward sees them; the
//! cancellation itself: `run::cancel`).

use crate::error::Respond as _;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use serde_json::{json, Value};

use super::extract::{Authed, JsonBody};
use super::ids::ExecutionId;
use super::relay::{held_elsewhere, Outgoing};
use super::rules::CancelRoute;
use super::{json_ok, Answer, AppState, Refusal};
use crate::auth::access::CANCEL_ROUTE;
use crate::error::{msg, ApiError, Code};
use crate::telemetry::otel;
use engine::run::cancel;

pub(super) async fn cancel(
    State(s): State<AppState>,
    ExecutionId(execution_id): ExecutionId,
    uri: Uri,
    trace: HeaderMap,
    Authed { hl, caller, .. }: Authed<CancelRoute>,
    JsonBody { raw, obj, .. }: JsonBody<CancelRoute>,
) -> Answer {
    let rt = &s.rt;
    let field = |k: &str| obj.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
    let (Some(thread_id), Some(ros)) = (field("threadId"), field("rosInvocationId")) else {
        return Err(ApiError::new(Code::InvalidInput, msg::CANCEL_FIELDS).into_response_in(hl));
    };
    cancel::check_ids(&execution_id, thread_id, ros).or_answer(hl)?;
    let out = Outgoing::of(Method::POST, &uri, &trace, raw, &caller);
    let missing = cancel::not_found();
    if let Some(r) = held_elsewhere(&s, thread_id, out, CANCEL_ROUTE, missing, hl).await {
        return Ok(r);
    }
    let cancelled = engine::trace::with_incoming(
        otel::client_headers(&trace),
        cancel::cancel(rt, &caller, &execution_id, thread_id, ros),
    );
    let span = tracing::info_span!("agui.cancel", otel.kind = "server", thread_id, execution_id = %execution_id);
    otel::continue_trace(&span, &trace);
    let outcome = tracing::Instrument::instrument(cancelled, span)
        .await
        .or_answer(hl)?;
    Ok(json_ok(
        &json!({"executionId": execution_id, "status": outcome.as_str()}),
    ))
}
