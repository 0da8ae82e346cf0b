//! New turns, and guidance: a message injected into the running pipeline task of a thread.

use std::time::Duration;

use a2a::{ItemView, TaskState};

use crate::error::{msg, Code};

use super::super::admit::Orphan;
use super::{Driver, End, Flow, CANCEL_WAIT};

impl Driver {
    pub(super) async fn new_turn(&mut self) -> Flow<End> {
        let doc = self.init_from_doc().await;
        self.emit_session().await?;
        self.bind_kernel(doc.as_ref(), true).await?;
        let client = self.task.client().await?;
        // Taken over from a dead instance, or moved from a dead kernel of the pool: that kernel
        // had the thread's session; this one restores it from the shared backup before the
        // turn goes on in it.
        if let Some((session, cwd)) = doc
            .filter(|_| self.adm.took_over || self.task.moved())
            .and_then(|d| d.session_id.clone().map(|s| (s, d.cwd.clone())))
        {
            Box::pin(self.restore_session(&client, &cwd, &session, None)).await?;
        }
        if let Some(orphan) = self.adm.orphan.take() {
            // Boxed: a rare path that would otherwise size every run's future.
            Box::pin(cancel_orphan(&client, &self.adm.context_id, orphan)).await;
        }
        self.still_held().await?;
        // Taken, not cloned: the message (images included) is not kept for the run's life.
        let um = self
            .adm
            .req
            .user_message
            .take()
            .expect("new turns carry a validated user message");
        let stream = self
            .send_streaming(&client, um.message_id, um.parts, None)
            .await
            .map_err(|e| End::kernel(&e))?;
        drop(client);
        self.consume(stream, false).await
    }

    /// Guidance joins the thread's running pipeline task: its stream is only checked (never
    /// mapped: the running turn's stream carries the effects), and it never cancels the task.
    pub(super) async fn guidance(&mut self) -> Flow<End> {
        let doc = self.hold.doc().await;
        self.bind_kernel(doc.as_ref(), false).await?;
        let session = doc.as_ref().and_then(|d| d.session_id.clone());
        let Some(task) = doc.and_then(|d| d.execution.task_id) else {
            return Err(End::fail(Code::ExecutionLost, msg::TASK_TO_RESUME_GONE));
        };
        self.task.adopt(Some(task.clone()), session);
        self.emit_session().await?;
        let client = self.task.client().await?;
        let um = self
            .adm
            .req
            .user_message
            .take()
            .expect("guidance carries a validated user message");
        let mut stream = self
            .send_streaming(&client, um.message_id, um.parts, Some(&task))
            .await
            .map_err(|e| End::kernel(&e))?;
        loop {
            let next = tokio::select! {
                r = stream.next() => r,
                _ = self.out.closed(), if !self.out.is_gone() => return Err(End::Disconnected),
            };
            let item = match next {
                Ok(Some(item)) => item,
                Ok(None) => return Ok(End::Finished),
                Err(e) => return Err(End::kernel(&e).keep_task()),
            };
            let view = ItemView::new(&item);
            if view.task_id().is_some_and(|t| t != task) {
                return Err(End::protocol(msg::TASK_CHANGED));
            }
            if view.context_id().is_some_and(|c| c != self.adm.context_id) {
                return Err(End::protocol(msg::CONTEXT_CHANGED));
            }
            match view.state() {
                Some(TaskState::Failed | TaskState::Rejected | TaskState::AuthRequired) => {
                    return Err(End::fail(Code::A2aExecutionFailed, msg::A2A_FAILED))
                }
                Some(TaskState::Canceled) => {
                    return Err(End::fail(Code::Cancelled, msg::CANCELLED))
                }
                _ => {}
            }
        }
    }
}

/// Cancels the task a crashed run left running, and waits (bounded) until it stops: the kernel
/// would refuse a new turn in its context while it runs.
async fn cancel_orphan(client: &a2a::Client, context_id: &str, orphan: Orphan) {
    let tasks = match orphan {
        Orphan::Task(t) => vec![t],
        Orphan::Unknown => orphans_of_context(client, context_id).await,
    };
    for t in tasks {
        let _ = tokio::time::timeout(CANCEL_WAIT, client.cancel_task(&t)).await;
        wait_not_active(client, &t).await;
    }
}

/// The tasks a run that crashed before it learnt its task id may have left: the context's
/// submitted and working tasks, and its most recent input-required one (a permission or question
/// wait; when it is a finished turn instead, cancelling it is refused and changes nothing).
/// Bounded: one page each.
async fn orphans_of_context(client: &a2a::Client, context_id: &str) -> Vec<String> {
    let mut out = Vec::new();
    for state in [TaskState::Submitted, TaskState::Working] {
        if let Ok(Ok(tasks)) =
            tokio::time::timeout(CANCEL_WAIT, client.list_tasks(context_id, &state, 20)).await
        {
            out.extend(tasks.iter().filter_map(|t| t.id().map(str::to_owned)));
        }
    }
    if let Ok(Ok(tasks)) = tokio::time::timeout(
        CANCEL_WAIT,
        client.list_tasks(context_id, &TaskState::InputRequired, 100),
    )
    .await
    {
        // RFC 3339 UTC timestamps of one writer compare as strings.
        if let Some(latest) = tasks
            .iter()
            .max_by_key(|t| t.view().timestamp().unwrap_or("").to_owned())
            .and_then(|t| t.id())
        {
            out.push(latest.to_owned());
        }
    }
    out
}

/// Waits (bounded) until the kernel reports an orphaned task as no longer running.
async fn wait_not_active(client: &a2a::Client, task: &str) {
    let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
    while tokio::time::Instant::now() < deadline {
        match client.get_task(task, 0).await {
            Ok(t) if t.state().is_some_and(|s| s.is_active()) => {}
            _ => return,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
