//! The HTTP face of the engine's errors: the one table that maps each code to its HTTP status,
//! and the JSON error envelope.
//!
//! Before the SSE response starts, an error is `{"error":{"code","message"}}` with the status of the
//! table. After it started, the same code travels in `RUN_ERROR`, after every open span has been
//! closed (a client sees balanced spans on every error).

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use engine::i18n::Lang;

/// The `Retry-After` of a refusal at a bound: long enough for a turn to end or a reader to
/// leave, short enough that a client waiting on it loses little.
pub const RETRY_AFTER_SECS: u32 = 5;

pub use engine::error::{msg, ApiError, Code};

/// The HTTP face of a code: the status of a refusal answered before the SSE stream, and when a
/// client should ask again.
pub trait Status {
    /// The HTTP status used when this error is answered before the SSE stream. Codes that only
    /// occur inside a stream (`RUN_ERROR`) carry the status they would have if a future path
    /// answered them over HTTP. A match, so a code without its row does not compile.
    fn status(self) -> StatusCode;
    /// Seconds a client should wait before it asks again (`Retry-After`): the refusals at a
    /// bound on concurrent work, which a slot freeing up lifts.
    fn retry_after(self) -> Option<u32>;
}

impl Status for Code {
    fn status(self) -> StatusCode {
        match self {
            Code::Unauthorized => StatusCode::UNAUTHORIZED,
            Code::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Code::RequestTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Code::InvalidJson => StatusCode::BAD_REQUEST,
            Code::InvalidInput => StatusCode::BAD_REQUEST,
            Code::DuplicateRunId => StatusCode::CONFLICT,
            Code::RunIdConflict => StatusCode::CONFLICT,
            Code::ThreadBusy => StatusCode::CONFLICT,
            Code::ThreadExecutionOpen => StatusCode::CONFLICT,
            Code::ThreadBindingConflict => StatusCode::CONFLICT,
            Code::ResumeRequired => StatusCode::CONFLICT,
            Code::ExecutionLost => StatusCode::CONFLICT,
            Code::StateUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::ExecutionNotFound => StatusCode::NOT_FOUND,
            Code::IncompleteResume => StatusCode::CONFLICT,
            Code::UnknownInterrupt => StatusCode::CONFLICT,
            Code::ResumePayloadInvalid => StatusCode::BAD_REQUEST,
            Code::ResumeAlreadyApplied => StatusCode::CONFLICT,
            Code::ExecutionExpired => StatusCode::CONFLICT,
            Code::SessionBackupNotReady => StatusCode::SERVICE_UNAVAILABLE,
            Code::StatePersistenceFailed => StatusCode::SERVICE_UNAVAILABLE,
            Code::A2aUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::A2aProtocolError => StatusCode::BAD_GATEWAY,
            Code::A2aExecutionFailed => StatusCode::BAD_GATEWAY,
            Code::Cancelled => StatusCode::CONFLICT,
            Code::ThreadNotFound => StatusCode::NOT_FOUND,
            Code::RunNotFound => StatusCode::NOT_FOUND,
            Code::RunEventsGone => StatusCode::GONE,
            Code::TooManyRuns => StatusCode::SERVICE_UNAVAILABLE,
            Code::TooManyReaders => StatusCode::TOO_MANY_REQUESTS,
            Code::TooManyGuidanceRuns => StatusCode::TOO_MANY_REQUESTS,
            Code::TooManyUserRuns => StatusCode::TOO_MANY_REQUESTS,
            Code::KernelsBusy => StatusCode::SERVICE_UNAVAILABLE,
            Code::LlmBudgetExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::HostNotAllowed => StatusCode::MISDIRECTED_REQUEST,
            Code::BodyTimeout => StatusCode::REQUEST_TIMEOUT,
            Code::UserMismatch => StatusCode::FORBIDDEN,
            Code::ThreadIdTaken => StatusCode::CONFLICT,
            Code::ExecutionIdentityChanged => StatusCode::CONFLICT,
            Code::ExecutionFailed => StatusCode::BAD_GATEWAY,
        }
    }

    fn retry_after(self) -> Option<u32> {
        match self {
            Code::TooManyRuns
            | Code::TooManyReaders
            | Code::TooManyGuidanceRuns
            | Code::TooManyUserRuns
            | Code::KernelsBusy => Some(RETRY_AFTER_SECS),
            _ => None,
        }
    }
}

/// An error answered before the SSE stream starts.
pub trait Respond {
    /// The JSON error envelope response, its message in `lang`.
    fn into_response_in(self, lang: Lang) -> Response;
}

impl Respond for ApiError {
    fn into_response_in(self, lang: Lang) -> Response {
        let body = serde_json::json!({
            "error": {"code": self.code.as_str(), "message": self.message_in(lang)}
        });
        let mut resp = (
            self.code.status(),
            [(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            // A JSON value's text (compact, as `to_vec` writes it): printing a value cannot fail.
            body.to_string(),
        )
            .into_response();
        if let Some(secs) = self.code.retry_after() {
            resp.headers_mut()
                .insert(axum::http::header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.code == Code::Unauthorized {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all() -> &'static [Code] {
        <Code as strum::VariantArray>::VARIANTS
    }

    #[test]
    fn every_code_has_an_error_status() {
        let mut names = std::collections::HashSet::new();
        for &code in all() {
            let name = code.as_str();
            assert!(names.insert(name), "duplicate {name}");
            assert!(
                code.status().is_client_error() || code.status().is_server_error(),
                "{name}"
            );
        }
        assert_eq!(names.len(), 40);
        assert_eq!(Code::ThreadBusy.status(), StatusCode::CONFLICT);
        assert_eq!(Code::StateUnavailable.status().as_u16(), 503);
        assert_eq!(Code::ExecutionNotFound.status().as_u16(), 404);
        assert_eq!(Code::RequestTooLarge.status().as_u16(), 413);
        assert_eq!(Code::RunEventsGone.status().as_u16(), 410);
        assert_eq!(Code::TooManyRuns.status().as_u16(), 503);
        assert_eq!(Code::TooManyReaders.status().as_u16(), 429);
        assert_eq!(Code::HostNotAllowed.status().as_u16(), 421);
        assert_eq!(Code::BodyTimeout.status().as_u16(), 408);
    }

    /// A refusal at a bound tells the client when to ask again; no other error does.
    #[test]
    fn refusals_at_a_bound_carry_retry_after() {
        for &code in all() {
            let r = ApiError::new(code, "x").into_response_in(Lang::En);
            let header = r.headers().get(axum::http::header::RETRY_AFTER);
            match code.retry_after() {
                Some(s) => assert_eq!(header.unwrap(), &s.to_string(), "{code:?}"),
                None => assert!(header.is_none(), "{code:?}"),
            }
        }
        assert_eq!(Code::TooManyRuns.retry_after(), Some(RETRY_AFTER_SECS));
        assert_eq!(Code::ThreadBusy.retry_after(), None);
    }
}
