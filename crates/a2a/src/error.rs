//! Errors of kernel calls, and the classifiers callers branch on.

use serde_json::Value;

/// A2A's `TaskNotFoundError`.
const TASK_NOT_FOUND: i64 = -32001;
/// A2A's `TaskNotCancelableError`.
const TASK_NOT_CANCELABLE: i64 = -32002;

/// A JSON-RPC error object.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub data: Value,
}

impl RpcError {
    pub(crate) fn from_value(v: &Value) -> RpcError {
        RpcError {
            code: v.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: v
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned(),
            data: v.get("data").cloned().unwrap_or(Value::Null),
        }
    }

    /// The kernel says the session backup is not restored yet, and the call may be retried.
    pub fn is_backup_not_ready(&self) -> bool {
        self.data.get("code").and_then(Value::as_str) == Some("SESSION_BACKUP_NOT_READY")
            && self.data.get("retryable").and_then(Value::as_bool) == Some(true)
    }

    /// The task is not running any more: unknown to the kernel, or past cancelling.
    pub fn is_task_gone(&self) -> bool {
        self.code == TASK_NOT_FOUND || self.code == TASK_NOT_CANCELABLE
    }

    /// The kernel refused a permission answer because no such permission is pending (it may be
    /// carrying out an earlier delivery of the same answer).
    ///
    /// The message is all there is to go by: the kernel raises this as an `InvalidParamsError`
    /// (-32602) whose text starts with its fixed reason, `permission_resume_invalid: …`; its
    /// `data` is the generic `ErrorInfo` (reason `INVALID_PARAMS`) that every -32602 carries, with
    /// no code of its own to tell this refusal from the others.
    pub fn is_permission_not_pending(&self) -> bool {
        self.message.starts_with("permission_resume_invalid")
    }
}

/// Errors of kernel calls.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Connection refused/reset, timeout, or the body could not be read.
    #[error("kernel transport error: {0}")]
    Transport(String),
    /// A non-2xx HTTP status.
    #[error("kernel answered HTTP {status}")]
    Status { status: u16, body: Value },
    /// A JSON-RPC error (as a response body or as a stream item).
    #[error("kernel JSON-RPC error {}: {}", .0.code, .0.message)]
    Rpc(RpcError),
    /// The kernel's answer could not be understood (malformed JSON, oversized frame, …).
    #[error("kernel protocol error: {0}")]
    Protocol(String),
}

impl Error {
    pub(crate) fn transport(kind: &str) -> Error {
        Error::Transport(kind.to_owned())
    }

    /// The JSON-RPC error, when the kernel answered with one.
    pub fn rpc(&self) -> Option<&RpcError> {
        match self {
            Error::Rpc(r) => Some(r),
            _ => None,
        }
    }

    /// See [`RpcError::is_backup_not_ready`].
    pub fn is_backup_not_ready(&self) -> bool {
        self.rpc().is_some_and(RpcError::is_backup_not_ready)
    }

    /// See [`RpcError::is_task_gone`].
    pub fn is_task_gone(&self) -> bool {
        self.rpc().is_some_and(RpcError::is_task_gone)
    }

    /// See [`RpcError::is_permission_not_pending`].
    pub fn is_permission_not_pending(&self) -> bool {
        self.rpc().is_some_and(RpcError::is_permission_not_pending)
    }
}

impl From<reqwest::Error> for Error {
    fn from(e: reqwest::Error) -> Self {
        // Never the URL's query or a header: only the kind of failure.
        let kind = if e.is_timeout() {
            "timeout"
        } else if e.is_connect() {
            "connect"
        } else if e.is_body() || e.is_decode() {
            "body"
        } else {
            "request"
        };
        Error::transport(kind)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn classifiers() {
        let e = |v: Value| Error::Rpc(RpcError::from_value(&v));
        assert!(e(json!({"code": -32001})).is_task_gone());
        assert!(e(json!({"code": -32002})).is_task_gone());
        assert!(!e(json!({"code": -32603})).is_task_gone());
        assert!(e(
            json!({"code": -32603, "data": {"code": "SESSION_BACKUP_NOT_READY", "retryable": true}})
        )
        .is_backup_not_ready());
        assert!(
            !e(json!({"code": -32603, "data": {"code": "SESSION_BACKUP_NOT_READY"}}))
                .is_backup_not_ready()
        );
        // As the kernel sends it (the wire contract's stale answer).
        assert!(e(json!({"code": -32602,
            "message": "permission_resume_invalid: pending permission is not active.",
            "data": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "INVALID_PARAMS", "domain": "a2a-protocol.org", "metadata": {}}]}))
        .is_permission_not_pending());
        assert!(
            e(json!({"code": -32602, "message": "permission_resume_invalid"}))
                .is_permission_not_pending()
        );
        for other in [
            "input_response_mismatch: permission correlation does not match.",
            "Permission response payload fields do not match schemaVersion 1.",
            "Invalid params",
            "",
        ] {
            assert!(
                !e(json!({"code": -32602, "message": other})).is_permission_not_pending(),
                "{other}"
            );
        }
        assert!(!Error::transport("timeout").is_task_gone());
    }
}
