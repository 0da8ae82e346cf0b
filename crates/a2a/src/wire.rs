//! Typed A2A 1.0 requests of the iac-code kernel: messages, parts, roles, task states, and the
//! kernel's own request metadata (`metadata.iac_code`).
//!
//! Everything here serialises to exactly what the kernel reads; no caller builds wire JSON by
//! hand. Secrets (API key, LLM headers, Alibaba Cloud credentials) appear only in
//! [`TurnMetadata`], whose `Debug` never prints them: the struct exists to be sent to the kernel,
//! not to be logged.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};
use serde_json::Value;

/// The sender of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    User,
    Agent,
}

impl Role {
    pub fn wire_name(self) -> &'static str {
        match self {
            Role::User => "ROLE_USER",
            Role::Agent => "ROLE_AGENT",
        }
    }

    /// Reads a role as A2A 1.0 (`ROLE_AGENT`) or 0.3 (`agent`) spells it.
    pub fn parse(raw: &str) -> Option<Role> {
        match raw {
            "ROLE_USER" | "user" => Some(Role::User),
            "ROLE_AGENT" | "agent" => Some(Role::Agent),
            _ => None,
        }
    }
}

impl Serialize for Role {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.wire_name())
    }
}

/// One part of a message.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Part {
    /// `{"text": …}`
    Text { text: String },
    /// `{"data": …, "mediaType": …}`: structured data (answers) or an inline file (images, whose
    /// data is `{"filename", "bytes"}`).
    Data {
        data: Value,
        #[serde(rename = "mediaType")]
        media_type: String,
    },
}

impl Part {
    pub fn text(text: impl Into<String>) -> Part {
        Part::Text { text: text.into() }
    }

    /// The data part that answers a permission request of the kernel.
    pub fn permission_answer(answer: &PermissionAnswer<'_>) -> Part {
        Part::Data {
            data: answer.data(),
            media_type: "application/json".into(),
        }
    }
}

/// A decision on a permission request, as the kernel spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermissionDecision {
    AllowOnce,
    Deny,
}

impl PermissionDecision {
    pub fn wire_name(self) -> &'static str {
        match self {
            PermissionDecision::AllowOnce => "allow_once",
            PermissionDecision::Deny => "deny",
        }
    }

    pub fn parse(raw: &str) -> Option<PermissionDecision> {
        match raw {
            "allow_once" => Some(PermissionDecision::AllowOnce),
            "deny" => Some(PermissionDecision::Deny),
            _ => None,
        }
    }
}

/// The kernel's permission answer (`kind: permission`, schema version 1). Built with named
/// fields, so its ids cannot be swapped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionAnswer<'a> {
    /// The task that asked.
    pub request_task_id: &'a str,
    /// The request's `inputId`.
    pub input_id: &'a str,
    /// The request's tool use id. The kernel checks the answer against Python's `str()` of its
    /// own, so a request without one is answered with the text `None`.
    pub tool_use_id: Option<&'a str>,
    pub decision: PermissionDecision,
}

impl PermissionAnswer<'_> {
    /// The answer's JSON, keys in the order the kernel has always been sent them.
    fn data(&self) -> Value {
        serde_json::json!({
            "schemaVersion": 1,
            "kind": "permission",
            "requestTaskId": self.request_task_id,
            "inputId": self.input_id,
            "toolUseId": self.tool_use_id.unwrap_or("None"),
            "decision": self.decision.wire_name(),
        })
    }
}

/// A message sent to the kernel (`SendMessage`, `SendStreamingMessage`).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Message<'a> {
    pub message_id: String,
    pub role: Role,
    pub parts: Vec<Part>,
    pub metadata: MessageMetadata<'a>,
    pub context_id: &'a str,
    /// Continues an existing task (answers, guidance) instead of starting one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<&'a str>,
}

/// `metadata` of a message: the kernel reads its own object under `iac_code`.
#[derive(Debug, Clone, Serialize)]
pub struct MessageMetadata<'a> {
    pub iac_code: TurnMetadata<'a>,
}

/// What the kernel needs to run a turn (`metadata.iac_code`). Field names are the kernel's.
#[derive(Clone, Default, Serialize)]
pub struct TurnMetadata<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel: Option<&'a str>,
    #[serde(rename = "preferredLanguage")]
    pub preferred_language: &'a str,
    #[serde(
        rename = "candidatePresentation",
        skip_serializing_if = "Option::is_none"
    )]
    pub candidate_presentation: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_mode: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipeline_name: Option<&'a str>,
    #[serde(rename = "cleanupOnly")]
    pub cleanup_only: bool,
    #[serde(rename = "rosInvocationId")]
    pub ros_invocation_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm_headers: Option<BTreeMap<&'a str, &'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alibaba_cloud_access_key_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alibaba_cloud_access_key_secret: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alibaba_cloud_security_token: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alibaba_cloud_region_id: Option<&'a str>,
    pub cwd: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iac_code_model: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iac_code_api_key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<Thinking<'a>>,
    /// A session handoff's fence, as the client gave it (a later kernel reads its `owner`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_fence: Option<&'a serde_json::Map<String, Value>>,
    /// A guidance input's identity and digest (a later kernel applies each guidance once).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guidance_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input_digest: Option<&'a str>,
}

impl std::fmt::Debug for TurnMetadata<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Identifiers only: the struct carries secrets.
        f.debug_struct("TurnMetadata")
            .field("ros_invocation_id", &self.ros_invocation_id)
            .field("cwd", &self.cwd)
            .finish_non_exhaustive()
    }
}

/// Extended thinking settings of a turn.
#[derive(Debug, Clone, Serialize)]
pub struct Thinking<'a> {
    pub enabled: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub effort: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<u64>,
}

/// A task's state, normalised from the wire (`TASK_STATE_INPUT_REQUIRED`, `input-required`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskState {
    Submitted,
    Working,
    InputRequired,
    Completed,
    Failed,
    Canceled,
    Rejected,
    AuthRequired,
    Other(String),
}

impl TaskState {
    /// Reads a wire state: case-insensitive, with or without the `TASK_STATE_` prefix, `_` or `-`.
    pub fn parse(raw: &str) -> TaskState {
        let lower = raw.to_ascii_lowercase();
        let s = lower
            .strip_prefix("task_state_")
            .unwrap_or(&lower)
            .replace('_', "-");
        match s.as_str() {
            "submitted" => TaskState::Submitted,
            "working" => TaskState::Working,
            "input-required" => TaskState::InputRequired,
            "completed" => TaskState::Completed,
            "failed" => TaskState::Failed,
            "canceled" | "cancelled" => TaskState::Canceled,
            "rejected" => TaskState::Rejected,
            "auth-required" => TaskState::AuthRequired,
            _ => TaskState::Other(s),
        }
    }

    /// The A2A 1.0 wire name (`ListTasks` filters by it).
    pub fn wire_name(&self) -> &str {
        match self {
            TaskState::Submitted => "TASK_STATE_SUBMITTED",
            TaskState::Working => "TASK_STATE_WORKING",
            TaskState::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            TaskState::Completed => "TASK_STATE_COMPLETED",
            TaskState::Failed => "TASK_STATE_FAILED",
            TaskState::Canceled => "TASK_STATE_CANCELED",
            TaskState::Rejected => "TASK_STATE_REJECTED",
            TaskState::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
            TaskState::Other(s) => s,
        }
    }

    /// States after which a stream carries nothing more for the turn. (Input-required is decided
    /// by the caller: it stops a turn only when new input is pending.)
    pub fn is_final(&self) -> bool {
        matches!(
            self,
            TaskState::Completed
                | TaskState::Failed
                | TaskState::Canceled
                | TaskState::Rejected
                | TaskState::AuthRequired
        )
    }

    /// The task is running (or about to): the kernel would refuse a new turn in its context.
    pub fn is_active(&self) -> bool {
        matches!(self, TaskState::Submitted | TaskState::Working)
    }
}

impl Serialize for TaskState {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.wire_name())
    }
}

/// `configuration` of a send: the gateway accepts text output only.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SendConfiguration {
    pub accepted_output_modes: [&'static str; 1],
}

/// Params of `SendMessage` and `SendStreamingMessage`.
#[derive(Debug, Serialize)]
pub(crate) struct SendParams<'a> {
    pub message: &'a Message<'a>,
    pub configuration: SendConfiguration,
}

impl<'a> SendParams<'a> {
    pub fn new(message: &'a Message<'a>) -> SendParams<'a> {
        SendParams {
            message,
            configuration: SendConfiguration {
                accepted_output_modes: ["text/plain"],
            },
        }
    }
}

/// Params of `GetTask`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct GetTaskParams<'a> {
    pub id: &'a str,
    pub history_length: u32,
}

/// Params of `CancelTask` and `SubscribeToTask`.
#[derive(Debug, Serialize)]
pub(crate) struct TaskIdParams<'a> {
    pub id: &'a str,
}

/// Params of `ListTasks`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ListTasksParams<'a> {
    pub context_id: &'a str,
    pub status: &'a TaskState,
    pub page_size: u32,
    pub history_length: u32,
}

/// Body of `POST /iac-code/session/ensure-restored`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct EnsureRestored<'a> {
    pub cwd: &'a str,
    pub session_id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task_id: Option<&'a str>,
}

/// A JSON-RPC 2.0 request.
#[derive(Debug, Serialize)]
pub(crate) struct RpcRequest<'a, P> {
    pub jsonrpc: &'static str,
    pub id: String,
    pub method: &'a str,
    pub params: P,
}

impl<'a, P: Serialize> RpcRequest<'a, P> {
    pub fn body(method: &'a str, params: P) -> Vec<u8> {
        serde_json::to_vec(&RpcRequest {
            jsonrpc: "2.0",
            id: uuid::Uuid::new_v4().to_string(),
            method,
            params,
        })
        .expect("request serialises")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn states_normalise_and_name_themselves() {
        assert_eq!(
            TaskState::parse("TASK_STATE_INPUT_REQUIRED"),
            TaskState::InputRequired
        );
        assert_eq!(TaskState::parse("working"), TaskState::Working);
        assert_eq!(TaskState::parse("cancelled"), TaskState::Canceled);
        assert_eq!(
            TaskState::parse("TASK_STATE_UNSPECIFIED"),
            TaskState::Other("unspecified".into())
        );
        for s in [
            TaskState::Submitted,
            TaskState::Working,
            TaskState::InputRequired,
            TaskState::Completed,
            TaskState::Failed,
            TaskState::Canceled,
            TaskState::Rejected,
            TaskState::AuthRequired,
        ] {
            assert_eq!(TaskState::parse(s.wire_name()), s);
        }
        assert!(TaskState::Failed.is_final());
        assert!(!TaskState::InputRequired.is_final());
        assert!(TaskState::Submitted.is_active() && !TaskState::Completed.is_active());
        assert_eq!(Role::parse("agent"), Some(Role::Agent));
        assert_eq!(Role::parse(Role::Agent.wire_name()), Some(Role::Agent));
        assert_eq!(Role::parse("ROLE_USER"), Some(Role::User));
        assert_eq!(Role::parse("robot"), None);
    }

    #[test]
    fn permission_answers_are_the_bytes_the_kernel_reads() {
        for d in [PermissionDecision::AllowOnce, PermissionDecision::Deny] {
            assert_eq!(PermissionDecision::parse(d.wire_name()), Some(d));
        }
        assert_eq!(PermissionDecision::Deny.wire_name(), "deny");
        assert_eq!(PermissionDecision::parse("allow_always"), None);
        assert_eq!(PermissionDecision::parse("Deny"), None);
        let part = |tool_use_id, decision| {
            let answer = PermissionAnswer {
                request_task_id: "T",
                input_id: "in-1",
                tool_use_id,
                decision,
            };
            serde_json::to_string(&Part::permission_answer(&answer)).unwrap()
        };
        assert_eq!(
            part(Some("tool-1"), PermissionDecision::AllowOnce),
            r#"{"data":{"schemaVersion":1,"kind":"permission","requestTaskId":"T","inputId":"in-1","toolUseId":"tool-1","decision":"allow_once"},"mediaType":"application/json"}"#
        );
        // No tool use id: Python's `str(None)`, as the kernel compares it.
        assert_eq!(
            part(None, PermissionDecision::Deny),
            r#"{"data":{"schemaVersion":1,"kind":"permission","requestTaskId":"T","inputId":"in-1","toolUseId":"None","decision":"deny"},"mediaType":"application/json"}"#
        );
    }

    #[test]
    fn messages_serialise_as_the_kernel_reads_them() {
        let answer = PermissionAnswer {
            request_task_id: "T",
            input_id: "in-1",
            tool_use_id: Some("tool-1"),
            decision: PermissionDecision::AllowOnce,
        };
        let m = Message {
            message_id: "m1".into(),
            role: Role::User,
            parts: vec![Part::text("hi"), Part::permission_answer(&answer)],
            metadata: MessageMetadata {
                iac_code: TurnMetadata {
                    preferred_language: "en",
                    ros_invocation_id: "inv",
                    cwd: "/w",
                    iac_code_api_key: Some("secret-key"),
                    llm_headers: Some([("X-A", "b")].into_iter().collect()),
                    thinking: Some(Thinking {
                        enabled: true,
                        effort: None,
                        budget: Some(5),
                    }),
                    ..TurnMetadata::default()
                },
            },
            context_id: "ctx",
            task_id: Some("T"),
        };
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!({"messageId": "m1", "role": "ROLE_USER", "contextId": "ctx", "taskId": "T",
                "parts": [{"text": "hi"}, {"mediaType": "application/json", "data": {"schemaVersion": 1,
                    "kind": "permission", "requestTaskId": "T", "inputId": "in-1", "toolUseId": "tool-1",
                    "decision": "allow_once"}}],
                "metadata": {"iac_code": {"preferredLanguage": "en", "cleanupOnly": false,
                    "rosInvocationId": "inv", "cwd": "/w", "iac_code_api_key": "secret-key",
                    "llm_headers": {"X-A": "b"}, "thinking": {"enabled": true, "budget": 5}}}})
        );
        let debug = format!("{m:?}");
        assert!(!debug.contains("secret-key"), "{debug}");
    }
}
