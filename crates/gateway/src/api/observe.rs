//! The observer extension's route: `POST /extensions/iac-code/v1/executions/{id}/subscribe`
//! (`crate::observe`), its body checked like a cancellation's, forwarded to the thread's holder
//! with a shared store (its kernel runs the task).

use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};

use super::extract::{Authed, JsonBody};
use super::ids::ExecutionId;
use super::relay::{held_elsewhere, Outgoing};
use super::rules::ObserveRoute;
use super::{sse_response, Answer, AppState, Refusal};
use crate::auth::access::OBSERVE_ROUTE;
use crate::error::{msg, ApiError, Code};

pub(super) async fn observe(
    State(s): State<AppState>,
    ExecutionId(execution_id): ExecutionId,
    uri: Uri,
    headers: HeaderMap,
    Authed { hl, caller, .. }: Authed<ObserveRoute>,
    JsonBody { raw, obj, .. }: JsonBody<ObserveRoute>,
) -> Answer {
    let rt = &s.rt;
    let observation = crate::observe::parse(&obj).or_answer(hl)?;
    let out = Outgoing::of(Method::POST, &uri, &headers, raw, &caller);
    let missing = ApiError::new(Code::ExecutionNotFound, msg::EXECUTION_NOT_FOUND);
    let thread_id = observation.thread_id.clone();
    if let Some(r) = held_elsewhere(&s, &thread_id, out, OBSERVE_ROUTE, missing, hl).await {
        return Ok(r);
    }
    let rx = crate::observe::observe(rt, &caller, &execution_id, observation, hl)
        .await
        .or_answer(hl)?;
    Ok(sse_response(&s, rx))
}
