//! `GET /threads/{threadId}/messages`: a page of the thread's transcript (`history::messages`).
//! The transcript is in the shared store: any instance answers, none forwards.

use axum::extract::State;
use axum::http::Uri;

use super::super::extract::Authed;
use super::super::ids::PathIds;
use super::super::rules::MessagesRoute;
use super::super::{json_ok, Answer, AppState, Refusal};
use super::checked;

pub(in crate::api) async fn messages(
    State(s): State<AppState>,
    PathIds(thread_id): PathIds<String>,
    uri: Uri,
    Authed { hl, caller, .. }: Authed<MessagesRoute>,
) -> Answer {
    checked(&thread_id, hl)?;
    let q = crate::history::page_query(uri.query()).or_answer(hl)?;
    let v = crate::history::messages(&s.rt, &caller, &thread_id, q)
        .await
        .or_answer(hl)?;
    Ok(json_ok(&v))
}
