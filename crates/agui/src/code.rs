//! The codes this producer puts in `RUN_ERROR.code` and in the error envelope of a refused
//! request (`{"error":{"code","message"}}`); a thread document records the one a run ended with.
//! The gateway maps each to the HTTP status of a refusal; here is only the vocabulary.

/// Every error code the gateway emits. The book lists each in its errors page
/// (`docs/src/reference/errors.md`; a test checks).
/// Its serde name is its wire name.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    strum::VariantArray,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
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
    ThreadNotFound,
    RunNotFound,
    RunEventsGone,
    TooManyRuns,
    TooManyReaders,
    TooManyGuidanceRuns,
    TooManyUserRuns,
    KernelsBusy,
    LlmBudgetExhausted,
    HostNotAllowed,
    BodyTimeout,
    UserMismatch,
    ThreadIdTaken,
    ThreadExecutionOpen,
    ExecutionIdentityChanged,
    ExecutionFailed,
}

impl Code {
    /// The wire name (`THREAD_BUSY`, …). A match, so a code without its name does not compile.
    pub const fn as_str(self) -> &'static str {
        match self {
            Code::Unauthorized => "UNAUTHORIZED",
            Code::UnsupportedMediaType => "UNSUPPORTED_MEDIA_TYPE",
            Code::RequestTooLarge => "REQUEST_TOO_LARGE",
            Code::InvalidJson => "INVALID_JSON",
            Code::InvalidInput => "INVALID_INPUT",
            Code::DuplicateRunId => "DUPLICATE_RUN_ID",
            Code::RunIdConflict => "RUN_ID_CONFLICT",
            Code::ThreadBusy => "THREAD_BUSY",
            Code::ThreadExecutionOpen => "THREAD_EXECUTION_OPEN",
            Code::ThreadBindingConflict => "THREAD_BINDING_CONFLICT",
            Code::ResumeRequired => "RESUME_REQUIRED",
            Code::ExecutionLost => "EXECUTION_LOST",
            Code::StateUnavailable => "STATE_UNAVAILABLE",
            Code::ExecutionNotFound => "EXECUTION_NOT_FOUND",
            Code::IncompleteResume => "INCOMPLETE_RESUME",
            Code::UnknownInterrupt => "UNKNOWN_INTERRUPT",
            Code::ResumePayloadInvalid => "RESUME_PAYLOAD_INVALID",
            Code::ResumeAlreadyApplied => "RESUME_ALREADY_APPLIED",
            Code::ExecutionExpired => "EXECUTION_EXPIRED",
            Code::SessionBackupNotReady => "SESSION_BACKUP_NOT_READY",
            Code::StatePersistenceFailed => "STATE_PERSISTENCE_FAILED",
            Code::A2aUnavailable => "A2A_UNAVAILABLE",
            Code::A2aProtocolError => "A2A_PROTOCOL_ERROR",
            Code::A2aExecutionFailed => "A2A_EXECUTION_FAILED",
            Code::Cancelled => "CANCELLED",
            Code::ThreadNotFound => "THREAD_NOT_FOUND",
            Code::RunNotFound => "RUN_NOT_FOUND",
            Code::RunEventsGone => "RUN_EVENTS_GONE",
            Code::TooManyRuns => "TOO_MANY_RUNS",
            Code::TooManyReaders => "TOO_MANY_READERS",
            Code::TooManyGuidanceRuns => "TOO_MANY_GUIDANCE_RUNS",
            Code::TooManyUserRuns => "TOO_MANY_USER_RUNS",
            Code::KernelsBusy => "KERNELS_BUSY",
            Code::LlmBudgetExhausted => "LLM_BUDGET_EXHAUSTED",
            Code::HostNotAllowed => "HOST_NOT_ALLOWED",
            Code::BodyTimeout => "BODY_TIMEOUT",
            Code::UserMismatch => "USER_MISMATCH",
            Code::ThreadIdTaken => "THREAD_ID_TAKEN",
            Code::ExecutionIdentityChanged => "EXECUTION_IDENTITY_CHANGED",
            Code::ExecutionFailed => "EXECUTION_FAILED",
        }
    }

    /// The code of a wire name (`THREAD_BUSY` → [`Code::ThreadBusy`]), as stored or received.
    pub fn from_wire(name: &str) -> Option<Code> {
        <Code as strum::VariantArray>::VARIANTS
            .iter()
            .copied()
            .find(|c| c.as_str() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_upper_snake_and_round_trip() {
        let mut names = std::collections::HashSet::new();
        for &code in <Code as strum::VariantArray>::VARIANTS {
            let name = code.as_str();
            assert!(names.insert(name), "duplicate {name}");
            assert_eq!(Code::from_wire(name), Some(code));
            assert_eq!(serde_json::to_value(code).ok(), Some(name.into()));
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
                "{name}"
            );
        }
        assert_eq!(names.len(), 40);
        assert_eq!(Code::from_wire("thread_busy"), None);
        assert_eq!(Code::from_wire(""), None);
    }
}
