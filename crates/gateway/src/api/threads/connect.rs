//! `GET /threads/{threadId}/connect`: everything a reloaded page needs, as one AG-UI stream
//! (`crate::connect`), at the thread's holder (a running run's events are in its memory).

use axum::extract::State;
use axum::http::{HeaderMap, Uri};

use super::super::extract::Authed;
use super::super::ids::PathIds;
use super::super::rules::ConnectRoute;
use super::super::{Answer, AppState, Refusal};
use super::{checked, get_held_elsewhere};
use crate::auth::access::CONNECT_ROUTE;

pub(in crate::api) async fn connect(
    State(s): State<AppState>,
    PathIds(thread_id): PathIds<String>,
    uri: Uri,
    headers: HeaderMap,
    Authed { hl, caller, .. }: Authed<ConnectRoute>,
) -> Answer {
    checked(&thread_id, hl)?;
    let q = crate::connect::connect_query(&headers, uri.query()).or_answer(hl)?;
    let elsewhere = get_held_elsewhere(&s, &thread_id, &headers, &uri, &caller, CONNECT_ROUTE, hl);
    if let Some(r) = elsewhere.await {
        return Ok(r);
    }
    crate::connect::connect(&s.rt, &caller, &thread_id, q, s.heartbeat)
        .await
        .or_answer(hl)
}
