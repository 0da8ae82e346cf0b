//! Which threads a caller may touch, and the record of every refusal.
//!
//! A thread's owner is the user of its first admitted run (`ThreadDoc::owner`); a thread written
//! before owners were recorded is owned by the `userId` it is bound to, if any
//! (`ThreadDoc::owner_or_user`). A caller with a user touches only threads that user owns; to
//! anyone else such a thread is one that does not exist (the routes answer what they answer for
//! a missing thread). A caller without a user (no authentication, the service token acting for
//! nobody) touches every thread, as before owners existed.

use super::Denied;

pub use engine::caller::{not_theirs, run_user, CANCEL_ROUTE, RUN_ROUTE};

/// The routes that name a thread, as the audit names them.
pub const OBSERVE_ROUTE: &str = "POST /extensions/iac-code/v1/executions/{executionId}/subscribe";
pub const THREAD_ROUTE: &str = "GET /threads/{threadId}";
pub const EVENTS_ROUTE: &str = "GET /threads/{threadId}/runs/{runId}/events";
pub const LIST_ROUTE: &str = "GET /threads";
pub const CONNECT_ROUTE: &str = "GET /threads/{threadId}/connect";
pub const AGENTS_STATE_ROUTE: &str = "POST /agents/state";
pub const PATCH_ROUTE: &str = "PATCH /threads/{threadId}";
pub const DELETE_ROUTE: &str = "DELETE /threads/{threadId}";
pub const MESSAGES_ROUTE: &str = "GET /threads/{threadId}/messages";

/// Why access was refused: an authentication's [`Denied`], or an authenticated caller's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Auth(Denied),
    /// The thread is another user's (answered as a missing thread).
    NotOwner,
    /// `iacCode.userId` names another user.
    UserMismatch,
}

impl Refused {
    pub fn reason(self) -> &'static str {
        match self {
            Refused::Auth(d) => d.reason(),
            Refused::NotOwner => "not_owner",
            Refused::UserMismatch => "user_mismatch",
        }
    }
}

/// Records a refused access on `route` (its pattern, e.g. `GET /threads/{threadId}`): one
/// structured line (route, reason, the authenticated user and the thread when known; never a
/// token) and `agui_auth_refusals_total{reason}`.
pub fn record(
    metrics: &dyn engine::telemetry::Telemetry,
    route: &'static str,
    why: Refused,
    user: Option<&str>,
    thread_id: Option<&str>,
) {
    engine::caller::refused(metrics, route, why.reason(), user, thread_id);
}
