//! `GET /threads/{threadId}/runs/{runId}/events`: a run's events, replayed from `Last-Event-ID`
//! or `?after=` and then followed (`threads_api::events`), at the run's holder.

use crate::error::Respond as _;
use axum::extract::State;
use axum::http::{HeaderMap, Uri};

use super::super::extract::Authed;
use super::super::ids::PathIds;
use super::super::rules::EventsRoute;
use super::super::{Answer, AppState, Refusal};
use super::{checked, get_held_elsewhere};
use crate::auth::access::EVENTS_ROUTE;
use crate::error::{msg, ApiError, Code};
use crate::threads_api;

pub(in crate::api) async fn events(
    State(s): State<AppState>,
    PathIds((thread_id, run_id)): PathIds<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
    Authed { hl, caller, .. }: Authed<EventsRoute>,
) -> Answer {
    checked(&thread_id, hl)?;
    let Ok(after) = threads_api::resume_point(&headers, uri.query()) else {
        return Err(ApiError::new(Code::InvalidInput, msg::BAD_LAST_EVENT_ID).into_response_in(hl));
    };
    let elsewhere = get_held_elsewhere(&s, &thread_id, &headers, &uri, &caller, EVENTS_ROUTE, hl);
    if let Some(r) = elsewhere.await {
        return Ok(r);
    }
    threads_api::events(&s.rt, &caller, &thread_id, &run_id, after, s.heartbeat)
        .await
        .or_answer(hl)
}
