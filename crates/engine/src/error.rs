//! A run's errors: a code of the AG-UI protocol and an English catalogue message, translated
//! when it is sent. Before the SSE response starts the gateway answers it as a JSON envelope;
//! after, it travels in `RUN_ERROR`, after every open span has been closed.

use std::borrow::Cow;

use crate::i18n::{self, Lang};

pub use agui::Code;

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
}

/// The gateway's user-facing texts, in English: each is a key of the message catalogue
/// (`crate::i18n`), translated when it is sent.
pub mod msg {
    macro_rules! texts {
        ($($name:ident = $text:expr;)*) => {
            $(pub const $name: &str = $text;)*
            /// Every text above (the catalogue test covers each in every language).
            pub const ALL: &[&str] = &[$($name),*];
        };
    }

    texts! {
        UNAUTHORIZED = "A valid bearer token is required.";
        TOKEN_EXPIRED = "The bearer token has expired.";
        TOKEN_INVALID = "The bearer token is not valid for this gateway.";
        USER_HEADER_NOT_ALLOWED = "X-IAC-Code-User is honoured only together with the service token.";
        ID_USER_HEADER = "X-IAC-Code-User must be 1 to 256 bytes, without control characters.";
        USER_MISMATCH = "iacCode.userId must name the authenticated user.";
        THREAD_ID_TAKEN = "This thread id is already in use; start the thread under another id.";
        UNSUPPORTED_MEDIA_TYPE = "Content-Type must be application/json.";
        RUN_TOO_LARGE = "The AG-UI request body is too large.";
        CANCEL_TOO_LARGE = "The cancel request body is too large.";
        PATCH_TOO_LARGE = "The thread change is too large.";
        STATE_REQUEST_TOO_LARGE = "The agent state request is too large.";
        STATE_REQUEST_INVALID_JSON = "The agent state request is not valid JSON.";
        STATE_REQUEST_FIELDS = "The agent state request must be a JSON object with a threadId string.";
        PATCH_INVALID_JSON = "The thread change is not valid JSON.";
        BODY_TIMEOUT = "The request body did not arrive in time.";
        HOST_NOT_ALLOWED = "The request's Host is not one this gateway serves (see --allowed-host).";
        RUN_INVALID_JSON = "The request body is not valid JSON.";
        CANCEL_INVALID_JSON = "The cancel request body is not valid JSON.";
        RUN_NOT_OBJECT = "RunAgentInput must be a JSON object.";
        CANCEL_NOT_OBJECT = "The cancel request must be a JSON object.";
        INVALID_ENVELOPE = "Invalid AG-UI RunAgentInput envelope.";
        UNSUPPORTED_PROTOCOL = "The AG-UI protocol version is not supported. Supported versions: 1.0 (any 1.x); omit protocolVersion for the protocol before 1.0.";
        INVALID_PROPS = "Invalid iac-code forwarded properties.";
        ID_THREAD = "threadId must be at most 256 bytes, without control characters.";
        ID_RUN = "runId must be at most 256 bytes, without control characters.";
        ID_PARENT_RUN = "parentRunId must be at most 256 bytes, without control characters.";
        ID_INTERRUPT = "resume[].interruptId must be at most 256 bytes, without control characters.";
        ID_MESSAGE = "messages[].id must be at most 256 bytes, without control characters.";
        ID_USER = "iacCode.userId must be at most 256 bytes, without control characters.";
        MODEL_BOUND = "iacCode.model must be at most 256 bytes, without control characters.";
        CHANNEL_BOUND = "iacCode.channel must be at most 256 bytes, without control characters.";
        PIPELINE_BOUND = "iacCode.pipelineName must be at most 256 bytes, without control characters.";
        OBSERVE_TOO_LARGE = "The subscription request body is too large.";
        OBSERVE_INVALID_JSON = "The subscription request body is not valid JSON.";
        OBSERVE_FIELDS = "The subscription request must be {threadId, runId, rosInvocationId, afterSequence?}: three non-empty strings and a non-negative integer.";
        OBSERVED_IDENTITY_CHANGED = "The observed execution no longer matches: the execution, its invocation or the run is not the thread's.";
        OBSERVED_EXECUTION_FAILED = "The observed execution failed.";
        EXECUTION_FENCE = "iacCode.executionFence must be a JSON object of at most 16 KiB.";
        GUIDANCE_ID = "iacCode.guidanceId must be a string of 1 to 256 bytes, without control characters.";
        INPUT_DIGEST = "iacCode.inputDigest must be a string of 1 to 256 bytes, without control characters.";
        INVOCATION_CONTROL = "iacCode.rosInvocationId must not contain control characters.";
        CANCEL_FIELDS = "threadId and rosInvocationId are required.";
        ID_INVOCATION = "rosInvocationId must be at most 256 bytes, without control characters.";
        EXECUTION_NOT_FOUND = "The execution was not found.";
        TOOLS_UNSUPPORTED = "Client-provided tools are not supported.";
        CWD_NOT_ABSOLUTE = "The iac-code workspace must be an absolute path.";
        CWD_NOT_EXPANDED = "The iac-code workspace must be written out: ~ and $ are not expanded.";
        CWD_INVALID = "The iac-code workspace is invalid.";
        CWD_OUTSIDE_ROOTS = "The iac-code workspace is outside the allowed roots.";
        CWD_NOT_DIR = "The iac-code workspace is not a directory.";
        CWD_CANNOT_CREATE = "The iac-code workspace cannot be created.";
        NO_USER_MESSAGE = "A new run requires a user message.";
        CONTENT_INVALID = "The user message content is invalid.";
        ONLY_TEXT_AND_IMAGES = "Only text and inline data images are supported.";
        REMOTE_MEDIA = "Remote media URLs are not supported.";
        FILE_SOURCE = "Provider file references are not supported; send images as inline base64 data.";
        AUDIO_UNSUPPORTED = "Audio parts are not supported. Only text and inline data images are supported.";
        VIDEO_UNSUPPORTED = "Video parts are not supported. Only text and inline data images are supported.";
        DOCUMENT_UNSUPPORTED = "Document parts are not supported. Only text and inline data images are supported.";
        IMAGE_MIME = "The image media type is not supported.";
        IMAGE_BASE64 = "The image data is not valid base64.";
        IMAGE_TOO_LARGE = "An image exceeds the maximum size.";
        IMAGES_TOO_LARGE = "The total image content exceeds the maximum size.";
        IMAGE_INVALID = "The image data is invalid.";
        IMAGE_TOO_MANY_PIXELS = "An image has too many pixels (at most 36 megapixels).";
        STATE_UNAVAILABLE = "The AG-UI adapter state is unavailable.";
        RUN_ID_USED = "The AG-UI run id has already been used.";
        THREAD_BUSY = "The AG-UI thread already has an active run.";
        BINDING_CONFLICT = "The AG-UI thread is already bound to another workspace or caller.";
        RESUME_REQUIRED = "The AG-UI thread is waiting for interrupt responses.";
        EXECUTION_GONE = "The execution to resume is no longer available.";
        RESUME_MISMATCH = "The resume request does not match the interrupted run.";
        TASK_TO_RESUME_GONE = "The A2A task to resume is unavailable.";
        SESSION_GONE = "The iac-code session to resume is unavailable.";
        TASK_MISMATCH = "The A2A task identity does not match the interrupted run.";
        BACKUP_NOT_READY = "Session backup is still synchronizing. Retry after 3 seconds.";
        A2A_UNAVAILABLE = "The local A2A execution service is unavailable.";
        A2A_FAILED = "The A2A execution failed.";
        CANCELLED = "The execution was cancelled.";
        CANCELLED_BY_ANSWER = "The execution was cancelled by the interrupt response.";
        ABANDONED = "The execution was cancelled: no client was attached within the detach grace period.";
        THREAD_NOT_FOUND = "The AG-UI thread was not found.";
        RUN_NOT_FOUND = "The AG-UI run was not found.";
        RUN_EVENTS_GONE = "The run's events are no longer available.";
        BAD_LAST_EVENT_ID = "Last-Event-ID must be the id of an event of this run.";
        BAD_LIST_PAGE = "The page is invalid: limit must be a number from 1 to 100, cursor one this gateway returned, and archived true or false.";
        EXECUTION_OPEN = "The thread's execution is still open (it waits for interrupt responses, or a restart interrupted its run): cancel it before deleting the thread.";
        BAD_PATCH = "The change is invalid: send a title (1 to 120 characters, no control characters) or archived (true or false), and nothing else.";
        BAD_CONNECT = "The connect request is invalid: follow must be true or false, and each parameter given once.";
        BAD_CONNECT_EVENT_ID = "Last-Event-ID must be an id this stream sent (<runId>:<n>).";
        BAD_PAGE = "The page is invalid: before must be a message number (at least 1) and limit a number from 1 to 200.";
        TASK_CHANGED = "The A2A task identity changed unexpectedly.";
        CONTEXT_CHANGED = "The A2A context identity changed unexpectedly.";
        SESSION_CHANGED = "The iac-code session identity changed unexpectedly.";
        MAPPING_NOT_COMMITTED = "The execution mapping could not be committed.";
        SESSION_NOT_COMMITTED = "The execution session mapping could not be committed.";
        INTERRUPT_NOT_COMMITTED = "The interrupted execution state could not be committed.";
        ANSWER_NOT_COMMITTED = "The accepted interrupt response could not be committed.";
        INTERRUPT_OTHER_TASK = "An interrupt belongs to another A2A task.";
        INTERRUPT_OTHER_CONTEXT = "An interrupt belongs to another A2A context.";
        EXPIRED = "The interrupt has expired.";
        ALREADY_APPLIED = "The interrupt response has already been applied.";
        EARLIER_DELIVERY = "An earlier delivery of this interrupt response reached the kernel; it is not sent again.";
        DUPLICATE_ANSWERS = "The resume contains duplicate interrupt ids.";
        INCOMPLETE_RESUME = "The resume must resolve every pending interrupt exactly once.";
        UNKNOWN_INTERRUPT = "The resume references an unknown interrupt.";
        PAYLOAD_REQUIRED = "A resolved interrupt requires a payload.";
        PAYLOAD_INVALID = "The interrupt response payload is invalid.";
        NO_ANSWER = "The interrupt response does not contain an answer.";
        ANSWER_REJECTED = "The local A2A execution service rejected the interrupt response.";
        PERMISSION_NOT_ACCEPTED = "The A2A permission response was not accepted.";
        ANSWER_NOT_ACCEPTED = "The A2A interrupt response was not accepted.";
        SHUTTING_DOWN = "The execution service is shutting down.";
        HOLDER_UNREACHABLE = "The gateway instance that serves this thread cannot be reached.";
        FORWARD_NEEDS_SECRET = "This thread is served by another gateway instance; a request carrying credentials is passed on only when the instances share a cluster secret.";
        TAKEN_OVER = "This thread was taken over by another gateway instance.";
        LEASE_LAPSED = "This gateway instance lost its lease on the shared state.";
        PERMISSION_REQUIRED = "Permission required";
        INPUT_REQUIRED = "Input required";
        TOO_MANY_RUNS = "The gateway is serving as many runs as it may. Retry later.";
        TOO_MANY_READERS = "This run has as many readers as it may. Retry later.";
        TOO_MANY_GUIDANCE_RUNS = "This thread has as many guidance runs as it may. Retry later.";
        TOO_MANY_USER_RUNS = "This user has as many runs as they may. Retry later.";
        KERNELS_BUSY = "Every kernel is running other users' turns. Retry later.";
        LLM_BUDGET_EXHAUSTED = "This user's LLM token budget is spent. Retry later.";
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_gateway_text_is_in_the_catalogue() {
        for m in msg::ALL {
            assert!(
                crate::i18n::is_known(m),
                "{m:?} is missing from the catalogue"
            );
        }
        let unique: std::collections::HashSet<_> = msg::ALL.iter().collect();
        assert_eq!(unique.len(), msg::ALL.len(), "a text is listed twice");
    }
}
