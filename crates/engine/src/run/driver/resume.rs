//! Resumes: the answers to a run's interrupts. The kernel's view of the task is fetched (after
//! making sure the kernel has the session), merged into the pending interrupts by the plan
//! ([`decide::resume`](crate::run::decide::resume)), stored, and the plan carried out.

use std::borrow::Cow;

use crate::error::{msg, Code};
use crate::mapping::{self, interrupt};
use crate::run::decide::resume::{self as plan, Then};
use crate::validate::ResumeEntry;
use store::AppliedDigest;

use super::{Driver, End, Failure, Flow};

/// The kernel's view of a task, as the resume plan reads it.
pub(super) fn task_view(view: &a2a::ItemView<'_>) -> plan::TaskView {
    let meta = view.meta();
    plan::TaskView {
        stage: plan::TaskStage::of(view.state()),
        lists_inputs: meta
            .is_some_and(|m| m.contains_key("input") || m.contains_key("pendingPermissions")),
        required: meta.map_or_else(Vec::new, |m| {
            interrupt::required_inputs(m, || uuid::Uuid::new_v4().simple().to_string())
        }),
    }
}

impl Driver {
    pub(super) async fn resume(&mut self, entries: Vec<ResumeEntry>) -> Flow<End> {
        let Some(doc) = self.init_from_doc().await else {
            return Err(End::fail(Code::ExecutionLost, msg::TASK_TO_RESUME_GONE));
        };
        self.out.map(|m, out| m.reopen_steps(out)).await?;
        self.emit_session().await?;
        self.bind_kernel(Some(&doc), true).await?;
        let task_id =
            plan::precheck(&doc, &self.adm.execution_id, &entries).map_err(End::refused)?;
        let client = self.task.client().await?;
        if let Some(session) = &doc.session_id {
            self.restore_session(&client, &doc.cwd, session, Some(&task_id))
                .await?;
        }
        let task = client
            .get_task(&task_id, 100)
            .await
            .map_err(|e| End::kernel(&e).keep_task())?;
        let view = task.view();
        if view.task_id() != Some(task_id.as_str())
            || view.context_id().is_some_and(|c| c != self.adm.context_id)
        {
            return Err(End::fail(Code::A2aProtocolError, msg::TASK_MISMATCH));
        }
        if let Some(s) = view.meta().and_then(mapping::session_id) {
            self.learn_session(s).await?;
        }
        // What the run missed while it waited: the task's state and the pipeline's events, sent
        // together once both are known.
        let mut missed = Vec::new();
        if let Some(meta) = view.meta() {
            self.out.mapper().map_meta(meta, &mut missed);
        }
        let after = doc
            .execution
            .pipeline_sequence
            .max(self.out.mapper().pipeline_sequence());
        if let Ok(Some(state)) = client.pipeline_state(&task_id, after).await {
            self.out.mapper().map_recovery(&state, &mut missed);
        }
        self.out.emit_all(missed).await?;

        let plan = plan::plan(
            &doc,
            &entries,
            task_view(&view),
            self.expires_at().as_deref(),
        )
        .map_err(End::refused)?;
        let seq = self.out.mapper().pipeline_sequence();
        let steps = self.out.mapper().durable_open_steps().clone();
        let pending = plan.pending;
        let execution = self.adm.execution_id.clone();
        let settled = plan.settled;
        for (id, _) in &settled {
            self.answers.applied.push(id.clone());
        }
        self.commit(msg::INTERRUPT_NOT_COMMITTED, |d| {
            d.execution.pending = pending;
            d.execution.pipeline_sequence = d.execution.pipeline_sequence.max(seq);
            d.execution.pipeline_open_steps = steps;
            for (interrupt_id, digest) in settled {
                let a = AppliedDigest {
                    execution_id: execution.clone(),
                    interrupt_id,
                    digest,
                };
                d.delivering.remove(&a);
                d.applied_resume_digests.insert(a);
            }
        })
        .await?;
        match plan.then {
            Then::Refuse(e) => Err(End::refused(e)),
            Then::Reinterrupt => Ok(End::Interrupted),
            Then::Deliver(answers) => self.deliver(&client, &task_id, answers).await,
            Then::Follow => {
                // The kernel has every answer (an earlier run delivered them): the run shows
                // what the task did with them.
                self.task.set_acknowledged_only();
                self.settle_acknowledged(&client, &task_id, true).await?;
                self.finish().await
            }
        }
    }

    /// Makes sure the kernel has the session the task runs in (a kernel restarted from a backup
    /// restores it on demand). After a takeover the session was another instance's kernel's: the
    /// shared backup may still be catching up, so a backup not ready yet is waited for, up to
    /// [`TAKEOVER_RESTORE_WAIT`], then reported (retryable).
    pub(super) async fn restore_session(
        &self,
        client: &a2a::Client,
        cwd: &str,
        session: &str,
        task_id: Option<&str>,
    ) -> Flow {
        let deadline = tokio::time::Instant::now() + TAKEOVER_RESTORE_WAIT;
        loop {
            match client.ensure_restored(cwd, session, task_id).await {
                Ok(a2a::RestoreOutcome::Ready) => return Ok(()),
                Ok(a2a::RestoreOutcome::NotFound) => {
                    return Err(End::fail(Code::ExecutionLost, msg::SESSION_GONE))
                }
                Ok(a2a::RestoreOutcome::BackupNotReady(_))
                    if (self.adm.took_over || self.task.moved())
                        && tokio::time::Instant::now() < deadline =>
                {
                    tracing::info!("the session backup is not ready yet; retrying");
                    tokio::time::sleep(RESTORE_RETRY).await;
                    // The wait ends with the client, a cancellation or the hold.
                    if self.out.is_closed() {
                        return Err(End::Disconnected);
                    }
                    if self.adm.control.is_cancel_requested() {
                        return Err(End::fail(Code::Cancelled, msg::CANCELLED));
                    }
                    self.still_held().await?;
                }
                Ok(a2a::RestoreOutcome::BackupNotReady(m)) => {
                    return Err(End::Failed(Failure {
                        code: Code::SessionBackupNotReady,
                        message: m.map_or(Cow::Borrowed(msg::BACKUP_NOT_READY), Cow::Owned),
                        cancel_task: false,
                        fail_closed: false,
                    }))
                }
                Err(e) => return Err(End::kernel(&e).keep_task()),
            }
        }
    }
}

/// How long a run that took its thread over waits for the shared session backup.
const TAKEOVER_RESTORE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
const RESTORE_RETRY: std::time::Duration = std::time::Duration::from_secs(1);
