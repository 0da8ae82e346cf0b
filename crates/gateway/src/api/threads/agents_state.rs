//! `POST /agents/state` (`{"threadId"}`; ADK's `appName`, `userId`, `name` and `properties` are
//! accepted and not used: the caller is who authenticated). The transcript is in the shared
//! store: any instance answers, none forwards.

use crate::error::Respond as _;
use axum::extract::State;

use super::super::extract::{Authed, JsonBody};
use super::super::rules::AgentsStateRoute;
use super::super::{json_ok, Answer, AppState, Refusal};
use crate::error::{msg, ApiError, Code};

pub(in crate::api) async fn agents_state(
    State(s): State<AppState>,
    Authed { hl, caller, .. }: Authed<AgentsStateRoute>,
    JsonBody { obj, .. }: JsonBody<AgentsStateRoute>,
) -> Answer {
    let Some(thread_id) = obj
        .get("threadId")
        .and_then(|v| v.as_str())
        .filter(|t| !t.is_empty())
    else {
        return Err(
            ApiError::new(Code::InvalidInput, msg::STATE_REQUEST_FIELDS).into_response_in(hl)
        );
    };
    let v = crate::history::agents_state(&s.rt, &caller, thread_id)
        .await
        .or_answer(hl)?;
    Ok(json_ok(&v))
}
