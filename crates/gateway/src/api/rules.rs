//! The routes as the audit names them, and the body checks of each route that reads a JSON body:
//! its size bound and messages.

use crate::auth::access;
use crate::error::msg;

use super::{CANCEL_BODY_LIMIT, RUN_BODY_LIMIT};

/// A route, as the audit and the metrics of refusals name it.
pub(super) trait Route {
    const NAME: &'static str;
}

/// A route that reads a JSON body, and its checks.
pub(super) trait BodyRoute: Route {
    const RULES: BodyRules;
}

/// The messages of one POST route's body checks.
pub(super) struct BodyRules {
    pub limit: usize,
    pub too_large: &'static str,
    pub invalid_json: &'static str,
    pub not_object: &'static str,
}

macro_rules! routes {
    ($($marker:ident = $name:expr;)*) => {
        $(
            pub(super) struct $marker;
            impl Route for $marker {
                const NAME: &'static str = $name;
            }
        )*
    };
}

routes! {
    RunRoute = access::RUN_ROUTE;
    CancelRoute = access::CANCEL_ROUTE;
    ObserveRoute = access::OBSERVE_ROUTE;
    ThreadRoute = access::THREAD_ROUTE;
    PatchRoute = access::PATCH_ROUTE;
    DeleteRoute = access::DELETE_ROUTE;
    EventsRoute = access::EVENTS_ROUTE;
    ConnectRoute = access::CONNECT_ROUTE;
    ListRoute = access::LIST_ROUTE;
    MessagesRoute = access::MESSAGES_ROUTE;
    AgentsStateRoute = access::AGENTS_STATE_ROUTE;
    CapabilitiesRoute = "GET /capabilities";
}

impl BodyRoute for RunRoute {
    const RULES: BodyRules = BodyRules {
        limit: RUN_BODY_LIMIT,
        too_large: msg::RUN_TOO_LARGE,
        invalid_json: msg::RUN_INVALID_JSON,
        not_object: msg::RUN_NOT_OBJECT,
    };
}

impl BodyRoute for PatchRoute {
    const RULES: BodyRules = BodyRules {
        limit: crate::thread_edit::PATCH_BODY_LIMIT,
        too_large: msg::PATCH_TOO_LARGE,
        invalid_json: msg::PATCH_INVALID_JSON,
        not_object: msg::BAD_PATCH,
    };
}

impl BodyRoute for AgentsStateRoute {
    const RULES: BodyRules = BodyRules {
        limit: crate::thread_edit::PATCH_BODY_LIMIT,
        too_large: msg::STATE_REQUEST_TOO_LARGE,
        invalid_json: msg::STATE_REQUEST_INVALID_JSON,
        not_object: msg::STATE_REQUEST_FIELDS,
    };
}

impl BodyRoute for CancelRoute {
    const RULES: BodyRules = BodyRules {
        limit: CANCEL_BODY_LIMIT,
        too_large: msg::CANCEL_TOO_LARGE,
        invalid_json: msg::CANCEL_INVALID_JSON,
        not_object: msg::CANCEL_NOT_OBJECT,
    };
}

impl BodyRoute for ObserveRoute {
    const RULES: BodyRules = BodyRules {
        limit: CANCEL_BODY_LIMIT,
        too_large: msg::OBSERVE_TOO_LARGE,
        invalid_json: msg::OBSERVE_INVALID_JSON,
        not_object: msg::OBSERVE_FIELDS,
    };
}
