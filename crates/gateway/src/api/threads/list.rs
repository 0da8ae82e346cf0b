//! `GET /threads`: the caller's threads, newest activity first (`history::list`).

use axum::extract::State;
use axum::http::Uri;

use super::super::extract::Authed;
use super::super::rules::ListRoute;
use super::super::{json_ok, Answer, AppState, Refusal};

pub(in crate::api) async fn list(
    State(s): State<AppState>,
    uri: Uri,
    Authed { hl, caller, .. }: Authed<ListRoute>,
) -> Answer {
    let q = crate::history::list_query(uri.query(), &caller).or_answer(hl)?;
    let v = crate::history::list(&s.rt, q).await.or_answer(hl)?;
    Ok(json_ok(&v))
}
