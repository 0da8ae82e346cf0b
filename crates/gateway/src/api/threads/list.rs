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
    let mut v = crate::history::list(&s.rt, q).await.or_answer(hl)?;
    // With the LLM egress: what the caller's user spent through it (this instance's count).
    if let Some(egress) = &s.egress {
        let account = kernel::tenant::user_key(caller.user.as_deref());
        v["llmUsage"] = egress.usage(&account);
    }
    Ok(json_ok(&v))
}
