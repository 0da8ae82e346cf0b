//! How a run ends: the one `End` every path of the driver returns, its failures, and the pure
//! rules that choose between them (a stopped stream's ending; when a cancellation is told as
//! AG-UI 1.0's `cancelled` outcome).

use std::borrow::Cow;

use a2a::TaskState;

use crate::error::{msg, ApiError, Code};

use super::super::admit::{Admitted, Mode};
use super::super::hold::{ThreadHold, Unsaved};
use super::super::sink::Disconnected;
use super::super::Runtime;
use clock::rfc3339_ms;
use store::RunOutcome;
use store::{BoxFuture, LastRun, StoreError, TranscriptAppend};

/// What a run's end writes before its terminal event (the driver's: the thread's document and
/// the transcript; a guidance run's, the transcript alone). The transcript append's outcome.
pub(super) trait Ending: Sync {
    /// `message_ids`: the ids of the messages the run's execution has started so far (kept
    /// while it goes on, so that its next run starts none of them again).
    fn write<'a>(
        &'a self,
        outcome: (RunOutcome, Option<Code>),
        transcript: Option<TranscriptAppend>,
        message_ids: &'a std::collections::BTreeSet<String>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;
}

/// What a run's end writes before its terminal event (its [`Ending`]): the thread's
/// document as the run leaves it with the run's messages (one durable write where the store
/// can), or a guidance run's messages alone (it does not hold the thread).
pub(super) struct RunEnd<'a> {
    pub(super) hold: &'a ThreadHold,
    pub(super) rt: &'a Runtime,
    pub(super) adm: &'a Admitted,
}

impl Ending for RunEnd<'_> {
    fn write<'a>(
        &'a self,
        (outcome, code): (RunOutcome, Option<Code>),
        transcript: Option<TranscriptAppend>,
        message_ids: &'a std::collections::BTreeSet<String>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let envelope = &self.adm.req.envelope;
            if self.adm.mode == Mode::Guidance {
                let Some(t) = transcript else {
                    return Ok(());
                };
                let store = self.rt.threads().store();
                return store.append_transcript(&envelope.thread_id, t).await;
            }
            let last = LastRun {
                run_id: envelope.run_id.clone(),
                outcome: outcome.into(),
                code: code.map(Into::into),
                ended_at: rfc3339_ms(self.rt.now_ms()),
            };
            let thread_id = &envelope.thread_id;
            self.hold
                .end_run(thread_id, last, transcript, message_ids)
                .await
        })
    }
}

/// How a run ended. Every path of the driver produces exactly one.
#[derive(Debug)]
pub(super) enum End {
    /// The turn completed: `RUN_FINISHED`, outcome success.
    Finished,
    /// The execution waits for answers (durable): `RUN_FINISHED` with the pending interrupts.
    Interrupted,
    /// `RUN_ERROR`.
    Failed(Failure),
    /// The client went away: nothing more is sent.
    Disconnected,
}

/// A failed run.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) code: Code,
    /// A catalogue text (translated when sent), or the kernel's own words.
    pub(super) message: Cow<'static, str>,
    /// Cancel the kernel task too (when nothing waits for answers): nothing is left running.
    pub(super) cancel_task: bool,
    /// A recovery-critical write failed: the task is cancelled and the execution ended.
    pub(super) fail_closed: bool,
}

impl End {
    /// Fails the run; the kernel task is left as it is.
    pub(super) fn fail(code: Code, message: &'static str) -> End {
        End::Failed(Failure {
            code,
            message: Cow::Borrowed(message),
            cancel_task: false,
            fail_closed: false,
        })
    }

    /// Fails the run and cancels its task.
    pub(super) fn fail_and_cancel(code: Code, message: &'static str) -> End {
        End::Failed(Failure {
            cancel_task: true,
            ..Self::failure(code, message)
        })
    }

    pub(super) fn failure(code: Code, message: &'static str) -> Failure {
        Failure {
            code,
            message: Cow::Borrowed(message),
            cancel_task: false,
            fail_closed: false,
        }
    }

    /// The kernel broke the protocol: the run fails and its task is cancelled.
    pub(super) fn protocol(message: &'static str) -> End {
        Self::fail_and_cancel(Code::A2aProtocolError, message)
    }

    /// This instance's lease on the shared state lapsed: in time, nobody can have taken the
    /// thread over, and its task is cancelled (nothing is left running); late, it may be
    /// another instance's now, and is left alone.
    pub(super) fn lapsed(late: bool) -> End {
        if late {
            End::fail(Code::StatePersistenceFailed, msg::LEASE_LAPSED)
        } else {
            End::fail_and_cancel(Code::StatePersistenceFailed, msg::LEASE_LAPSED)
        }
    }

    /// A recovery-critical write failed.
    pub(super) fn not_committed(message: &'static str) -> End {
        End::Failed(Failure {
            fail_closed: true,
            ..Self::failure(Code::StatePersistenceFailed, message)
        })
    }

    /// A recovery-critical change of the thread (`what`) was not saved: the thread was taken
    /// over (left to its new holder), the lease lapsed, or the save failed (fail closed).
    pub(super) fn unsaved(u: Unsaved, what: &'static str) -> End {
        match u {
            Unsaved::NotHeld => End::fail(Code::StatePersistenceFailed, msg::TAKEN_OVER),
            Unsaved::Lapsed { late } => End::lapsed(late),
            Unsaved::Failed => End::not_committed(what),
        }
    }

    /// A refusal decided before anything was sent (the interrupt stays answerable).
    pub(super) fn refused(e: ApiError) -> End {
        End::Failed(Failure {
            code: e.code,
            message: e.message,
            cancel_task: false,
            fail_closed: false,
        })
    }

    /// A kernel call failed: a backup still restoring is retryable and leaves the task alone;
    /// anything else is the kernel being unavailable, and the task is cancelled.
    pub(super) fn kernel(e: &a2a::Error) -> End {
        match e.rpc() {
            Some(r) if r.is_backup_not_ready() => End::Failed(Failure {
                code: Code::SessionBackupNotReady,
                message: if r.message.is_empty() {
                    Cow::Borrowed(msg::BACKUP_NOT_READY)
                } else {
                    Cow::Owned(r.message.clone())
                },
                cancel_task: false,
                fail_closed: false,
            }),
            _ => Self::fail_and_cancel(Code::A2aUnavailable, msg::A2A_UNAVAILABLE),
        }
    }

    /// The same end, with the kernel task left as it is.
    pub(super) fn keep_task(self) -> End {
        match self {
            End::Failed(f) => End::Failed(Failure {
                cancel_task: false,
                ..f
            }),
            other => other,
        }
    }
}

impl From<Disconnected> for End {
    fn from(_: Disconnected) -> End {
        End::Disconnected
    }
}

/// A step of a run: `Err` ends it.
pub(super) type Flow<T = ()> = Result<T, End>;

/// How a stream that stopped without an interrupt ends the run.
pub(super) fn ending(last_state: Option<&TaskState>, cancel_requested: bool) -> End {
    match last_state {
        Some(TaskState::Completed | TaskState::InputRequired) if !cancel_requested => End::Finished,
        Some(TaskState::Canceled) => End::fail(Code::Cancelled, msg::CANCELLED),
        _ if cancel_requested => End::fail(Code::Cancelled, msg::CANCELLED),
        Some(TaskState::Failed | TaskState::Rejected) => {
            End::fail(Code::A2aExecutionFailed, msg::A2A_FAILED)
        }
        // The stream ended while the task was still live (or its state is unknown): it may go
        // on running in the kernel, so it is cancelled.
        _ => End::fail_and_cancel(Code::A2aExecutionFailed, msg::A2A_FAILED),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn code(e: End) -> Option<(Code, bool)> {
        match e {
            End::Failed(f) => Some((f.code, f.cancel_task)),
            _ => None,
        }
    }

    #[test]
    fn how_a_stopped_stream_ends_the_run() {
        use TaskState::*;
        assert!(matches!(ending(Some(&Completed), false), End::Finished));
        assert!(matches!(ending(Some(&InputRequired), false), End::Finished));
        assert_eq!(
            code(ending(Some(&Completed), true)),
            Some((Code::Cancelled, false)),
            "a cancel the kernel raced is still the client's answer"
        );
        assert_eq!(
            code(ending(Some(&Canceled), false)),
            Some((Code::Cancelled, false))
        );
        assert_eq!(
            code(ending(Some(&Failed), false)),
            Some((Code::A2aExecutionFailed, false))
        );
        assert_eq!(
            code(ending(Some(&Working), false)),
            Some((Code::A2aExecutionFailed, true)),
            "a task left running is cancelled"
        );
        assert_eq!(
            code(ending(None, false)),
            Some((Code::A2aExecutionFailed, true))
        );
    }

    #[test]
    fn kernel_failures() {
        let backup = a2a::Error::Rpc(a2a::RpcError {
            code: -32603,
            message: String::new(),
            data: json!({"code": "SESSION_BACKUP_NOT_READY", "retryable": true}),
        });
        match End::kernel(&backup) {
            End::Failed(f) => {
                assert_eq!(f.code, Code::SessionBackupNotReady);
                assert_eq!(f.message, msg::BACKUP_NOT_READY);
                assert!(!f.cancel_task);
            }
            other => panic!("{other:?}"),
        }
        let down = a2a::Error::Transport("connect".into());
        assert_eq!(code(End::kernel(&down)), Some((Code::A2aUnavailable, true)));
        assert_eq!(
            code(End::kernel(&down).keep_task()),
            Some((Code::A2aUnavailable, false))
        );
    }
}
