//! Which threads a caller may touch, and the record of every refusal.
//!
//! A thread's owner is the user of its first admitted run (`ThreadDoc::owner`); a thread written
//! before owners were recorded is owned by the `userId` it is bound to, if any
//! (`ThreadDoc::owner_or_user`). A caller with a user touches only threads that user owns; to
//! anyone else such a thread is one that does not exist (the routes answer what they answer for
//! a missing thread). A caller without a user (no authentication, the service token acting for
//! nobody) touches every thread, as before owners existed.

use crate::error::{msg, ApiError, Code};
use crate::telemetry::Metrics;

use super::{Caller, Denied};

/// The routes that name a thread, as the audit names them.
pub const RUN_ROUTE: &str = "POST /";
pub const CANCEL_ROUTE: &str = "POST /extensions/iac-code/v1/executions/{executionId}/cancel";
pub const OBSERVE_ROUTE: &str = "POST /extensions/iac-code/v1/executions/{executionId}/subscribe";
pub const THREAD_ROUTE: &str = "GET /threads/{threadId}";
pub const EVENTS_ROUTE: &str = "GET /threads/{threadId}/runs/{runId}/events";
pub const LIST_ROUTE: &str = "GET /threads";
pub const CONNECT_ROUTE: &str = "GET /threads/{threadId}/connect";
pub const AGENTS_STATE_ROUTE: &str = "POST /agents/state";
pub const PATCH_ROUTE: &str = "PATCH /threads/{threadId}";
pub const DELETE_ROUTE: &str = "DELETE /threads/{threadId}";
pub const MESSAGES_ROUTE: &str = "GET /threads/{threadId}/messages";

/// The user a run acts for, which the kernel receives as `userId`: `iacCode.userId` when the
/// caller has no user; the caller's user otherwise, which `iacCode.userId` must name when it is
/// given (403 `USER_MISMATCH`).
pub fn run_user(caller: &Caller, given: Option<&str>) -> Result<Option<String>, ApiError> {
    match (&caller.user, given) {
        (None, g) => Ok(g.map(str::to_owned)),
        (Some(u), Some(g)) if g != u => Err(ApiError::new(Code::UserMismatch, msg::USER_MISMATCH)),
        (Some(u), _) => Ok(Some(u.clone())),
    }
}

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

/// Records that `caller` was refused `thread_id` because it is another user's.
pub fn not_theirs(metrics: &Metrics, route: &'static str, caller: &Caller, thread_id: &str) {
    let user = caller.user.as_deref();
    record(metrics, route, Refused::NotOwner, user, Some(thread_id));
}

/// Records a refused access on `route` (its pattern, e.g. `GET /threads/{threadId}`): one
/// structured line (route, reason, the authenticated user and the thread when known; never a
/// token) and `agui_auth_refusals_total{reason}`.
pub fn record(
    metrics: &Metrics,
    route: &'static str,
    why: Refused,
    user: Option<&str>,
    thread_id: Option<&str>,
) {
    metrics.auth_refused(why.reason());
    tracing::info!(
        target: "iac_code_agui::audit",
        route,
        reason = why.reason(),
        user,
        thread_id,
        "access refused"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Via;

    fn user(u: &str) -> Caller {
        Caller::jwt_user(u)
    }

    #[test]
    fn a_user_runs_as_themself() {
        assert_eq!(run_user(&user("a"), None), Ok(Some("a".into())));
        assert_eq!(run_user(&user("a"), Some("a")), Ok(Some("a".into())));
        let e = run_user(&user("a"), Some("b")).unwrap_err();
        assert_eq!(e.code, Code::UserMismatch);
        assert_eq!(crate::error::Status::status(e.code).as_u16(), 403);
        // Without a user, the request names whom it likes (as before).
        assert_eq!(run_user(&Caller::OPEN, Some("b")), Ok(Some("b".into())));
        assert_eq!(run_user(&Caller::OPEN, None), Ok(None));
        let service = Caller {
            via: Via::Service,
            user: None,
        };
        assert_eq!(run_user(&service, Some("b")), Ok(Some("b".into())));
    }

    #[test]
    fn a_user_touches_only_their_threads() {
        assert!(user("a").may_touch(Some("a")));
        assert!(!user("a").may_touch(Some("b")));
        assert!(!user("a").may_touch(None));
        assert!(Caller::OPEN.may_touch(Some("b")));
        assert!(Caller::OPEN.may_touch(None));
        let acting = Caller {
            via: Via::Service,
            user: Some("a".into()),
        };
        assert!(acting.may_touch(Some("a")) && !acting.may_touch(Some("b")));
        assert!(acting.is_operator() && !user("a").is_operator());
    }
}
