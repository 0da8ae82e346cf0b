//! Who a request comes from, which threads they may touch, and the record of every refusal.
//!
//! A thread's owner is the user of its first admitted run (`ThreadDoc::owner`); a thread written
//! before owners were recorded is owned by the `userId` it is bound to, if any
//! (`ThreadDoc::owner_or_user`). A caller with a user touches only threads that user owns; to
//! anyone else such a thread is one that does not exist. A caller without a user (no
//! authentication, the service token acting for nobody) touches every thread.

use crate::error::{msg, ApiError, Code};
use crate::telemetry::Telemetry;

/// The run route, as the audit names it.
pub const RUN_ROUTE: &str = "POST /";
/// The cancellation extension's route, as the audit names it.
pub const CANCEL_ROUTE: &str = "POST /extensions/iac-code/v1/executions/{executionId}/cancel";

/// How a caller authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// No authentication is configured.
    Open,
    /// The service token.
    Service,
    /// A JWT.
    Jwt,
}

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub via: Via,
    /// The user it acts for: a JWT's, or the one the service token's caller names. `None`: no
    /// user (no authentication, or the service token acting for nobody in particular).
    pub user: Option<String>,
}

impl Caller {
    pub const OPEN: Caller = Caller {
        via: Via::Open,
        user: None,
    };

    /// A user with a JWT (tests).
    #[cfg(test)]
    pub(crate) fn jwt_user(user: &str) -> Caller {
        Caller {
            via: Via::Jwt,
            user: Some(user.into()),
        }
    }

    /// Whether this caller may touch a thread owned by `owner` (see
    /// [`store::ThreadDoc::owner_or_user`]): a caller without a user (no authentication,
    /// the service token acting for nobody) any thread; a user only their own.
    pub fn may_touch(&self, owner: Option<&str>) -> bool {
        match &self.user {
            None => true,
            Some(u) => owner == Some(u.as_str()),
        }
    }

    /// Whether this caller operates the gateway (sees what `/health` tells an operator): anyone
    /// without authentication, the service token; not an end user's JWT.
    pub fn is_operator(&self) -> bool {
        self.via != Via::Jwt
    }
}

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

/// Records that `caller` was refused `thread_id` because it is another user's.
pub fn not_theirs(
    telemetry: &dyn Telemetry,
    route: &'static str,
    caller: &Caller,
    thread_id: &str,
) {
    let user = caller.user.as_deref();
    refused(telemetry, route, "not_owner", user, Some(thread_id));
}

/// Records a refused access on `route` (its pattern, e.g. `GET /threads/{threadId}`) for
/// `reason`: one structured line (route, reason, the authenticated user and the thread when
/// known; never a token) and `agui_auth_refusals_total{reason}`.
pub fn refused(
    telemetry: &dyn Telemetry,
    route: &'static str,
    reason: &'static str,
    user: Option<&str>,
    thread_id: Option<&str>,
) {
    telemetry.auth_refused(reason);
    tracing::info!(
        target: "iac_code_agui::audit",
        route,
        reason,
        user,
        thread_id,
        "access refused"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(u: &str) -> Caller {
        Caller::jwt_user(u)
    }

    #[test]
    fn a_user_runs_as_themself() {
        assert_eq!(run_user(&user("a"), None), Ok(Some("a".into())));
        assert_eq!(run_user(&user("a"), Some("a")), Ok(Some("a".into())));
        let e = run_user(&user("a"), Some("b")).unwrap_err();
        assert_eq!(e.code, Code::UserMismatch);
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
