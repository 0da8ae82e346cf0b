//! The routes of threads: `state` (`GET`/`PATCH`/`DELETE /threads/{id}`), `events` (a run's
//! events), `connect` (a reloaded page's stream), `messages` (the transcript), `list`
//! (`GET /threads`) and `agents_state` (`POST /agents/state`). A thread id beyond the bound of
//! ids names a thread that cannot exist; another user's thread is one that does not.

pub(super) mod agents_state;
pub(super) mod connect;
pub(super) mod events;
pub(super) mod list;
pub(super) mod messages;
pub(super) mod state;

use crate::error::Respond as _;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::Response;

use super::relay::{held_elsewhere, Outgoing};
use super::AppState;
use crate::auth::Caller;
use crate::error::{msg, ApiError, Code};
use engine::i18n::Lang;

/// A thread id within the bound of ids, or the route's refusal.
#[allow(clippy::result_large_err)]
fn checked(thread_id: &str, hl: Lang) -> Result<(), Response> {
    engine::run::hold::check_thread_id(thread_id).map_err(|e| e.into_response_in(hl))
}

/// [`held_elsewhere`] for the GET routes (no body): another user's thread is not found.
async fn get_held_elsewhere(
    s: &AppState,
    thread_id: &str,
    headers: &HeaderMap,
    uri: &Uri,
    caller: &Caller,
    route: &'static str,
    lang: Lang,
) -> Option<Response> {
    let out = Outgoing::of(Method::GET, uri, headers, axum::body::Bytes::new(), caller);
    let missing = ApiError::new(Code::ThreadNotFound, msg::THREAD_NOT_FOUND);
    held_elsewhere(s, thread_id, out, route, missing, lang).await
}
