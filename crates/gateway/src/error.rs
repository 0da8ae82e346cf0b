//! Error codes, the one table that maps each to its HTTP status, and the JSON error envelope.
//!
//! Before the SSE response starts, an error is `{"error":{"code","message"}}` with the status of the
//! table. After it started, the same code travels in `RUN_ERROR` (spans balanced first, D-5).

use std::borrow::Cow;

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::i18n::{self, Lang};

/// Every error code the gateway emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    Unauthorized,
    UnsupportedMediaType,
    RequestTooLarge,
    InvalidJson,
    InvalidInput,
    DuplicateRunId,
    RunIdConflict,
    ThreadBusy,
    ThreadBindingConflict,
    ResumeRequired,
    ExecutionLost,
    StateUnavailable,
    ExecutionNotFound,
    IncompleteResume,
    UnknownInterrupt,
    ResumePayloadInvalid,
    ResumeAlreadyApplied,
    ExecutionExpired,
    SessionBackupNotReady,
    StatePersistenceFailed,
    A2aUnavailable,
    A2aProtocolError,
    A2aExecutionFailed,
    Cancelled,
}

/// The contract: code → wire name → HTTP status when it is answered before the SSE stream.
/// Codes that only occur inside a stream (`RUN_ERROR`) carry the status they would have if a
/// future path answered them over HTTP.
const TABLE: &[(Code, &str, u16)] = &[
    (Code::Unauthorized, "UNAUTHORIZED", 401),
    (Code::UnsupportedMediaType, "UNSUPPORTED_MEDIA_TYPE", 415),
    (Code::RequestTooLarge, "REQUEST_TOO_LARGE", 413),
    (Code::InvalidJson, "INVALID_JSON", 400),
    (Code::InvalidInput, "INVALID_INPUT", 400),
    (Code::DuplicateRunId, "DUPLICATE_RUN_ID", 409),
    (Code::RunIdConflict, "RUN_ID_CONFLICT", 409),
    (Code::ThreadBusy, "THREAD_BUSY", 409),
    (Code::ThreadBindingConflict, "THREAD_BINDING_CONFLICT", 409),
    (Code::ResumeRequired, "RESUME_REQUIRED", 409),
    (Code::ExecutionLost, "EXECUTION_LOST", 409),
    (Code::StateUnavailable, "STATE_UNAVAILABLE", 503),
    (Code::ExecutionNotFound, "EXECUTION_NOT_FOUND", 404),
    (Code::IncompleteResume, "INCOMPLETE_RESUME", 409),
    (Code::UnknownInterrupt, "UNKNOWN_INTERRUPT", 409),
    (Code::ResumePayloadInvalid, "RESUME_PAYLOAD_INVALID", 400),
    (Code::ResumeAlreadyApplied, "RESUME_ALREADY_APPLIED", 409),
    (Code::ExecutionExpired, "EXECUTION_EXPIRED", 409),
    (Code::SessionBackupNotReady, "SESSION_BACKUP_NOT_READY", 503),
    (
        Code::StatePersistenceFailed,
        "STATE_PERSISTENCE_FAILED",
        503,
    ),
    (Code::A2aUnavailable, "A2A_UNAVAILABLE", 503),
    (Code::A2aProtocolError, "A2A_PROTOCOL_ERROR", 502),
    (Code::A2aExecutionFailed, "A2A_EXECUTION_FAILED", 502),
    (Code::Cancelled, "CANCELLED", 409),
];

impl Code {
    fn row(self) -> &'static (Code, &'static str, u16) {
        TABLE
            .iter()
            .find(|r| r.0 == self)
            .expect("every code has a row")
    }

    /// The wire name (`THREAD_BUSY`, …).
    pub fn as_str(self) -> &'static str {
        self.row().1
    }

    /// The HTTP status used when this error is answered before the SSE stream.
    pub fn status(self) -> StatusCode {
        StatusCode::from_u16(self.row().2).expect("valid status")
    }
}

/// An error with a code and an English catalogue message (translated when rendered).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    pub code: Code,
    pub message: Cow<'static, str>,
}

impl ApiError {
    pub fn new(code: Code, message: impl Into<Cow<'static, str>>) -> ApiError {
        ApiError {
            code,
            message: message.into(),
        }
    }

    /// The message in `lang` (catalogue texts are translated, others pass through).
    pub fn message_in(&self, lang: Lang) -> String {
        i18n::tr(lang, &self.message)
    }

    /// The JSON error envelope response.
    pub fn into_response_in(self, lang: Lang) -> Response {
        let body = serde_json::json!({
            "error": {"code": self.code.as_str(), "message": self.message_in(lang)}
        });
        let mut resp = (
            self.code.status(),
            [(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            )],
            serde_json::to_vec(&body).expect("envelope serialises"),
        )
            .into_response();
        if self.code == Code::Unauthorized {
            resp.headers_mut().insert(
                axum::http::header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

/// English source texts used by the gateway (all in the catalogue).
pub mod msg {
    pub const UNAUTHORIZED: &str = "A valid bearer token is required.";
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "Content-Type must be application/json.";
    pub const RUN_TOO_LARGE: &str = "The AG-UI request body is too large.";
    pub const CANCEL_TOO_LARGE: &str = "The cancel request body is too large.";
    pub const RUN_INVALID_JSON: &str = "The request body is not valid JSON.";
    pub const CANCEL_INVALID_JSON: &str = "The cancel request body is not valid JSON.";
    pub const RUN_NOT_OBJECT: &str = "RunAgentInput must be a JSON object.";
    pub const CANCEL_NOT_OBJECT: &str = "The cancel request must be a JSON object.";
    pub const INVALID_ENVELOPE: &str = "Invalid AG-UI RunAgentInput envelope.";
    pub const INVALID_PROPS: &str = "Invalid iac-code forwarded properties.";
    pub const CANCEL_FIELDS: &str = "threadId and rosInvocationId are required.";
    pub const EXECUTION_NOT_FOUND: &str = "The execution was not found.";
    pub const TOOLS_UNSUPPORTED: &str = "Client-provided tools are not supported.";
    pub const CWD_NOT_ABSOLUTE: &str = "The iac-code workspace must be an absolute path.";
    pub const CWD_INVALID: &str = "The iac-code workspace is invalid.";
    pub const CWD_OUTSIDE_ROOTS: &str = "The iac-code workspace is outside the allowed roots.";
    pub const CWD_NOT_DIR: &str = "The iac-code workspace is not a directory.";
    pub const CWD_CANNOT_CREATE: &str = "The iac-code workspace cannot be created.";
    pub const NO_USER_MESSAGE: &str = "A new run requires a user message.";
    pub const ONLY_TEXT_AND_IMAGES: &str = "Only text and inline data images are supported.";
    pub const REMOTE_MEDIA: &str = "Remote media URLs are not supported.";
    pub const IMAGE_MIME: &str = "The image media type is not supported.";
    pub const IMAGE_BASE64: &str = "The image data is not valid base64.";
    pub const IMAGE_TOO_LARGE: &str = "An image exceeds the maximum size.";
    pub const IMAGES_TOO_LARGE: &str = "The total image content exceeds the maximum size.";
    pub const IMAGE_INVALID: &str = "The image data is invalid.";
    pub const STATE_UNAVAILABLE: &str = "The AG-UI adapter state is unavailable.";
    pub const RUN_ID_USED: &str = "The AG-UI run id has already been used.";
    pub const THREAD_BUSY: &str = "The AG-UI thread already has an active run.";
    pub const BINDING_CONFLICT: &str =
        "The AG-UI thread is already bound to another workspace or caller.";
    pub const RESUME_REQUIRED: &str = "The AG-UI thread is waiting for interrupt responses.";
    pub const EXECUTION_GONE: &str = "The execution to resume is no longer available.";
    pub const RESUME_MISMATCH: &str = "The resume request does not match the interrupted run.";
    pub const TASK_TO_RESUME_GONE: &str = "The A2A task to resume is unavailable.";
    pub const A2A_UNAVAILABLE: &str = "The local A2A execution service is unavailable.";
    pub const A2A_FAILED: &str = "The A2A execution failed.";
    pub const CANCELLED: &str = "The execution was cancelled.";
    pub const TASK_CHANGED: &str = "The A2A task identity changed unexpectedly.";
    pub const CONTEXT_CHANGED: &str = "The A2A context identity changed unexpectedly.";
    pub const SESSION_CHANGED: &str = "The iac-code session identity changed unexpectedly.";
    pub const MAPPING_NOT_COMMITTED: &str = "The execution mapping could not be committed.";
    pub const SESSION_NOT_COMMITTED: &str = "The execution session mapping could not be committed.";
    pub const INTERRUPT_NOT_COMMITTED: &str =
        "The interrupted execution state could not be committed.";
    pub const ANSWER_NOT_COMMITTED: &str =
        "The accepted interrupt response could not be committed.";
    pub const INTERRUPT_OTHER_TASK: &str = "An interrupt belongs to another A2A task.";
    pub const INTERRUPT_OTHER_CONTEXT: &str = "An interrupt belongs to another A2A context.";
    pub const EXPIRED: &str = "The interrupt has expired.";
    pub const SHUTTING_DOWN: &str = "The execution service is shutting down.";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_complete_and_unique() {
        let mut names = std::collections::HashSet::new();
        for (code, name, status) in TABLE {
            assert!(names.insert(*name), "duplicate {name}");
            assert_eq!(code.as_str(), *name);
            assert!(StatusCode::from_u16(*status).is_ok());
        }
        assert_eq!(Code::ThreadBusy.status(), StatusCode::CONFLICT);
        assert_eq!(Code::StateUnavailable.status().as_u16(), 503);
        assert_eq!(Code::ExecutionNotFound.status().as_u16(), 404);
    }

    #[test]
    fn every_gateway_message_is_in_the_catalogue() {
        use msg::*;
        for m in [
            UNAUTHORIZED,
            UNSUPPORTED_MEDIA_TYPE,
            RUN_TOO_LARGE,
            CANCEL_TOO_LARGE,
            RUN_INVALID_JSON,
            CANCEL_INVALID_JSON,
            RUN_NOT_OBJECT,
            CANCEL_NOT_OBJECT,
            INVALID_ENVELOPE,
            INVALID_PROPS,
            CANCEL_FIELDS,
            EXECUTION_NOT_FOUND,
            TOOLS_UNSUPPORTED,
            CWD_NOT_ABSOLUTE,
            CWD_INVALID,
            CWD_OUTSIDE_ROOTS,
            CWD_NOT_DIR,
            CWD_CANNOT_CREATE,
            NO_USER_MESSAGE,
            ONLY_TEXT_AND_IMAGES,
            REMOTE_MEDIA,
            IMAGE_MIME,
            IMAGE_BASE64,
            IMAGE_TOO_LARGE,
            IMAGES_TOO_LARGE,
            IMAGE_INVALID,
            STATE_UNAVAILABLE,
            RUN_ID_USED,
            THREAD_BUSY,
            BINDING_CONFLICT,
            RESUME_REQUIRED,
            EXECUTION_GONE,
            RESUME_MISMATCH,
            TASK_TO_RESUME_GONE,
            A2A_UNAVAILABLE,
            A2A_FAILED,
            CANCELLED,
            TASK_CHANGED,
            CONTEXT_CHANGED,
            SESSION_CHANGED,
            MAPPING_NOT_COMMITTED,
            SESSION_NOT_COMMITTED,
            SHUTTING_DOWN,
            INTERRUPT_NOT_COMMITTED,
            ANSWER_NOT_COMMITTED,
            INTERRUPT_OTHER_TASK,
            INTERRUPT_OTHER_CONTEXT,
            EXPIRED,
        ] {
            assert!(crate::i18n::is_known(m), "{m} missing from catalogue");
        }
    }
}
