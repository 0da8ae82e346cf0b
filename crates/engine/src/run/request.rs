//! A run's request: as validation leaves it ([`RunRequest`]), why one is not admitted
//! ([`NotAdmitted`]), and its kernel messages: the user's turn, guidance, and answers, each
//! carrying the request's turn settings (`metadata.iac_code`).
//!
//! This is the one place secrets of a request (LLM key and headers, Alibaba Cloud credentials)
//! go anywhere: into the message to the kernel.

use std::collections::BTreeMap;
use std::path::PathBuf;

use a2a::{Message, MessageMetadata, Part, Role, Thinking, TurnMetadata};

use crate::caller::Caller;
use crate::error::ApiError;
use crate::i18n::Lang;
use crate::validate::props::CandidatePresentation;
use crate::validate::{Envelope, IacCode, RunMode, UserMessage};

/// A request that passed validation.
#[derive(Debug)]
pub struct RunRequest {
    pub envelope: Envelope,
    pub iac: IacCode,
    /// The resolved workspace.
    pub cwd: PathBuf,
    /// The workspace does not exist yet: it is created once the thread's decision would admit
    /// the request (`run::prepare`), never for a refused one.
    pub create_cwd: bool,
    /// Digest of the request body (idempotency of run ids).
    pub digest: String,
    /// The latest user message (new turns and guidance).
    pub user_message: Option<UserMessage>,
    pub lang: Lang,
    /// Who sent it (its user, if any, owns the thread it starts and reaches only its own).
    pub caller: Caller,
    /// Set when the gateway's LLM egress refused one of the run's LLM calls because its user's
    /// token budget is spent: a kernel failure is then told as that.
    pub budget_refused: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
}

/// Why a request was not admitted here.
#[derive(Debug)]
pub enum NotAdmitted {
    /// Refused: the JSON error to answer.
    Refused(ApiError),
    /// Another live instance holds the thread: the request goes there.
    HeldElsewhere(store::Peer),
}

impl From<ApiError> for NotAdmitted {
    fn from(e: ApiError) -> NotAdmitted {
        NotAdmitted::Refused(e)
    }
}

/// What every message of a run shares.
#[derive(Debug, Clone, Copy)]
pub struct Turn<'a> {
    pub iac: &'a IacCode,
    pub lang: Lang,
    /// The resolved workspace.
    pub cwd: &'a str,
    pub context_id: &'a str,
}

impl<'a> Turn<'a> {
    /// A message of this run: a new turn without `task_id`, guidance and answers with it.
    pub fn message(
        &self,
        message_id: String,
        parts: Vec<Part>,
        task_id: Option<&'a str>,
    ) -> Message<'a> {
        Message {
            message_id,
            role: Role::User,
            parts,
            metadata: MessageMetadata {
                iac_code: self.metadata(),
            },
            context_id: self.context_id,
            task_id,
        }
    }

    fn metadata(&self) -> TurnMetadata<'a> {
        let iac = self.iac;
        let trimmed = |s: &'a Option<String>| s.as_deref().map(str::trim).filter(|s| !s.is_empty());
        TurnMetadata {
            user_id: iac.user_id.as_deref(),
            channel: iac.channel.as_deref(),
            preferred_language: self.lang.code(),
            // The kernel honours only "rich-v1" for the rich presentation.
            candidate_presentation: iac.candidate_presentation.map(|p| match p {
                CandidatePresentation::Standard => "standard",
                CandidatePresentation::Rich => "rich-v1",
            }),
            run_mode: iac.run_mode.map(|r| match r {
                RunMode::Normal => "normal",
                RunMode::Pipeline => "pipeline",
            }),
            pipeline_name: iac.pipeline_name.as_deref(),
            cleanup_only: iac.cleanup_only,
            ros_invocation_id: &iac.ros_invocation_id,
            llm_headers: iac.llm_headers.as_ref().map(|h| {
                h.iter()
                    .map(|(k, v)| (k.as_str(), v.0.as_str()))
                    .collect::<BTreeMap<_, _>>()
            }),
            alibaba_cloud_access_key_id: iac
                .alibaba_cloud
                .as_ref()
                .and_then(|a| a.access_key_id.as_deref()),
            alibaba_cloud_access_key_secret: iac
                .alibaba_cloud
                .as_ref()
                .and_then(|a| a.access_key_secret.as_ref())
                .map(|s| s.0.as_str()),
            alibaba_cloud_security_token: iac
                .alibaba_cloud
                .as_ref()
                .and_then(|a| a.security_token.as_ref())
                .map(|s| s.0.as_str()),
            alibaba_cloud_region_id: iac
                .alibaba_cloud
                .as_ref()
                .and_then(|a| a.region_id.as_deref()),
            cwd: self.cwd,
            iac_code_model: trimmed(&iac.model),
            iac_code_api_key: iac
                .llm_api_key
                .as_ref()
                .map(|k| k.0.trim())
                .filter(|s| !s.is_empty()),
            thinking: iac.thinking.as_ref().map(|t| Thinking {
                enabled: t.enabled,
                effort: trimmed(&t.effort),
                budget: t.budget,
            }),
            execution_fence: iac.execution_fence.as_ref(),
            guidance_id: iac.guidance_id.as_deref(),
            input_digest: iac.input_digest.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::validate::props::{AlibabaCloud, Secret};
    use serde_json::json;

    fn iac() -> IacCode {
        IacCode {
            ros_invocation_id: "inv-1".into(),
            cwd: "/w".into(),
            model: Some(" qwen ".into()),
            llm_api_key: Some(Secret(" k ".into())),
            llm_headers: Some([("X-A".to_owned(), Secret("b".into()))].into()),
            thinking: Some(crate::validate::props::Thinking {
                enabled: true,
                effort: Some(" ".into()),
                budget: Some(5),
            }),
            user_id: Some("u".into()),
            channel: None,
            preferred_language: None,
            candidate_presentation: Some(CandidatePresentation::Rich),
            run_mode: Some(RunMode::Pipeline),
            pipeline_name: None,
            cleanup_only: false,
            active_guidance: false,
            alibaba_cloud: Some(AlibabaCloud {
                access_key_id: Some("id".into()),
                access_key_secret: Some(Secret("sec".into())),
                security_token: None,
                region_id: None,
            }),
            execution_fence: None,
            guidance_id: None,
            input_digest: None,
        }
    }

    #[test]
    fn turn_settings_as_the_kernel_reads_them() {
        let iac = iac();
        let turn = Turn {
            iac: &iac,
            lang: Lang::Fr,
            cwd: "/w",
            context_id: "ctx",
        };
        let m = turn.message("m1".into(), vec![Part::text("hi")], Some("T"));
        assert_eq!(
            serde_json::to_value(&m).unwrap()["metadata"]["iac_code"],
            json!({"user_id": "u", "preferredLanguage": "fr", "candidatePresentation": "rich-v1",
                "run_mode": "pipeline", "cleanupOnly": false, "rosInvocationId": "inv-1",
                "llm_headers": {"X-A": "b"}, "alibaba_cloud_access_key_id": "id",
                "alibaba_cloud_access_key_secret": "sec", "cwd": "/w", "iac_code_model": "qwen",
                "iac_code_api_key": "k", "thinking": {"enabled": true, "budget": 5}})
        );
        let debug = format!("{m:?}");
        assert!(
            !debug.contains("sec") && !debug.contains("\"k\""),
            "{debug}"
        );
    }

    /// A later iac-code's handoff fence and guidance identity go on as upstream names them,
    /// the fence as given.
    #[test]
    fn the_handoff_fence_and_guidance_identity_are_passed_on() {
        let mut iac = iac();
        let fence =
            json!({"version": "session-handoff-v1", "owner": {"sandboxId": "sb", "runId": "r"}});
        iac.execution_fence = fence.as_object().cloned();
        iac.guidance_id = Some("g-1".into());
        iac.input_digest = Some("abc".into());
        let turn = Turn {
            iac: &iac,
            lang: Lang::En,
            cwd: "/w",
            context_id: "ctx",
        };
        let m = serde_json::to_value(turn.message("m1".into(), vec![], Some("T"))).unwrap();
        let meta = &m["metadata"]["iac_code"];
        assert_eq!(meta["execution_fence"], fence);
        assert_eq!(
            (&meta["guidance_id"], &meta["input_digest"]),
            (&json!("g-1"), &json!("abc"))
        );
    }
}
