//! Reading a kernel stream: each item checked (identities), its new ids made durable, mapped to
//! AG-UI events, its interrupts committed; a stream that stops early is followed; the run ends
//! from the last state the kernel reported.

use std::ops::ControlFlow;
use std::pin::pin;
use std::time::Duration;

use a2a::{EventStream, ItemView, Next, TaskState};
use serde_json::{Map, Value};

use crate::error::{msg, Code};
use crate::mapping::interrupt::{self, RequiredInput};
use crate::mapping::{self, fast};
use store::PendingEntry;

use super::{ending, Driver, End, Flow, CANCEL_WAIT};

/// How long an answer the kernel only acknowledged is followed by polling its task.
const ACK_FOLLOW: Duration = Duration::from_secs(5);
/// How many times a run follows a task whose stream closed early.
const REATTACH_BUDGET: u8 = 2;

/// Keep reading, or stop (a final state, or input-required without new input).
type Read = ControlFlow<()>;

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

impl Driver {
    /// Reads a kernel stream to its end (or a stopping state), then ends the run.
    pub(super) async fn consume(&mut self, mut stream: EventStream, resume: bool) -> Flow<End> {
        let mut cancel_deadline: Option<tokio::time::Instant> = None;
        let mut reattach_budget = REATTACH_BUDGET;
        // The wake-ups other than the stream are armed once, not once per event: each one
        // registers with a waiter list (the drain one is shared by every run).
        let (rt, control, gone) = (
            self.rt.clone(),
            self.adm.control.clone(),
            self.out.gone_signal(),
        );
        let mut drained = pin!(rt.shutdown().drained());
        let mut cancel_asked = pin!(control.cancelled());
        let mut client_gone = pin!(gone.wait());
        let lapse = self.hold.lapse().cloned();
        let mut lapsed = pin!(async {
            match &lapse {
                Some(l) => l.wait().await,
                None => std::future::pending().await,
            }
        });
        loop {
            if let Some(l) = lapse.as_deref().filter(|l| l.is_set()) {
                return Err(End::lapsed(l.is_late()));
            }
            if rt.shutdown().is_draining() {
                return Err(End::fail_and_cancel(
                    Code::A2aUnavailable,
                    msg::SHUTTING_DOWN,
                ));
            }
            if control.is_cancel_requested() && cancel_deadline.is_none() {
                cancel_deadline = Some(tokio::time::Instant::now() + CANCEL_WAIT);
            }
            // Text deltas of the known task skip the generic JSON tree (see `mapping::fast`).
            let known = match (self.task.id(), self.answers.questions.is_empty()) {
                (Some(t), true) => Some(fast::Known {
                    task_id: t,
                    context_id: &self.adm.context_id,
                    session_id: self.task.session(),
                }),
                _ => None,
            };
            let next = tokio::select! {
                r = stream.next_with(move |d| known.and_then(|k| fast::text_delta(d, k))) => r,
                _ = client_gone.as_mut(), if !self.out.is_gone() => {
                    self.out.mark_gone();
                    if self.task.id().is_some() {
                        return Err(End::Disconnected);
                    }
                    // Keep reading until the task id is known, then cancel it.
                    continue;
                }
                _ = cancel_asked.as_mut(), if cancel_deadline.is_none() => continue,
                _ = drained.as_mut() => continue,
                _ = lapsed.as_mut() => continue,
                _ = sleep_until_opt(cancel_deadline) => {
                    // The kernel did not confirm in time: ask it once more; nothing is left
                    // running.
                    Box::pin(self.task.cancel()).await;
                    self.task.assume_cancelled();
                    break;
                }
            };
            let read = match next {
                Ok(Some(Next::Fast(delta))) => self.text_delta(delta).await,
                // Boxed: items other than text deltas are fewer, and their handling (saves, kernel
                // calls) would otherwise size every parked run's future.
                Ok(Some(Next::Item(result))) => Box::pin(self.process(&result, resume)).await,
                Ok(None) => match Box::pin(self.reattach(resume, &mut reattach_budget)).await? {
                    Some(s) => {
                        stream = s;
                        continue;
                    }
                    None => break,
                },
                Err(e) => {
                    tracing::warn!(error = %e, "kernel stream failed");
                    return Err(End::kernel(&e));
                }
            };
            match read {
                Ok(ControlFlow::Continue(())) => {
                    if self.out.is_gone() && self.task.id().is_some() {
                        return Err(End::Disconnected);
                    }
                }
                Ok(ControlFlow::Break(())) => break,
                // Gone before the kernel named the task: read on until it does, to cancel it.
                Err(End::Disconnected) if self.task.id().is_none() => {}
                Err(end) => return Err(end),
            }
        }
        if self.out.is_gone() {
            return Err(End::Disconnected);
        }
        Box::pin(self.finish()).await
    }

    /// Ends a run whose stream stopped without an interrupt.
    pub(super) async fn finish(&mut self) -> Flow<End> {
        self.catch_up().await?;
        Ok(ending(
            self.task.last_state(),
            self.adm.control.is_cancel_requested(),
        ))
    }

    /// One kernel item: identity checks, new ids made durable, the session event, mapping, and
    /// interrupt detection (an interrupt ends the run).
    pub(super) async fn process(&mut self, result: &Value, resume: bool) -> Flow<Read> {
        let view = ItemView::new(result);
        let mut ids_changed = false;
        if let Some(t) = view.task_id() {
            if self.task.learn_task(t)? {
                let t = t.to_owned();
                self.commit(msg::MAPPING_NOT_COMMITTED, |d| {
                    d.execution.task_id = Some(t)
                })
                .await?;
                ids_changed = true;
            }
        }
        if view.context_id().is_some_and(|c| c != self.adm.context_id) {
            return Err(End::protocol(msg::CONTEXT_CHANGED));
        }
        // The kernel had this answer already (a run that crashed delivered it) or runs its
        // continuation on another stream: this stream will not carry the continuation.
        if resume && view.is_acknowledgement() {
            self.task.set_acknowledged_only();
        }
        let meta = view.meta();
        if let Some(s) = meta.and_then(mapping::session_id) {
            ids_changed |= self.learn_session(s).await?;
        }
        if ids_changed {
            self.emit_session().await?;
        }
        if self.adm.control.is_cancel_requested() {
            self.task.cancel().await;
        }
        if resume {
            for (tool, answer) in std::mem::take(&mut self.answers.questions) {
                self.out
                    .map(|m, out| m.tool_result(&tool, answer, out))
                    .await?;
            }
        }
        self.out.map(|m, out| m.map_item(view.obj, out)).await?;

        if let Some(meta) = meta {
            let inputs = self.new_inputs(meta).await;
            if !inputs.is_empty() {
                self.check_inputs(&inputs)?;
                self.commit_interrupt(inputs).await?;
                return Err(End::Interrupted);
            }
        }
        if let Some(s) = view.state() {
            if self.task.observe(s) {
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    }

    /// An interrupt must belong to the run's own task and context.
    fn check_inputs(&self, inputs: &[RequiredInput]) -> Flow {
        let field = |r: &'_ RequiredInput, k: &str| {
            r.value
                .get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
        };
        for r in inputs {
            if field(r, "requestTaskId").is_some_and(|t| Some(t.as_str()) != self.task.id()) {
                return Err(End::protocol(msg::INTERRUPT_OTHER_TASK));
            }
            if field(r, "contextId").is_some_and(|c| c != self.adm.context_id) {
                return Err(End::protocol(msg::INTERRUPT_OTHER_CONTEXT));
            }
        }
        Ok(())
    }

    /// [`Driver::process`] for a fast text delta: what `process` does with such an item (no id
    /// or session change, no metadata) is the cancellation check, the status text and the
    /// WORKING state.
    async fn text_delta(&mut self, d: fast::TextDelta) -> Flow<Read> {
        if self.adm.control.is_cancel_requested() {
            Box::pin(self.task.cancel()).await;
        }
        self.out.text_delta(d.message_id, &d.text).await?;
        self.task.observe(TaskState::Working);
        Ok(ControlFlow::Continue(()))
    }

    /// Required inputs of an item that are neither applied nor already pending.
    async fn new_inputs(&self, meta: &Map<String, Value>) -> Vec<RequiredInput> {
        let found = interrupt::required_inputs(meta, || uuid::Uuid::new_v4().simple().to_string());
        if found.is_empty() {
            return found;
        }
        let Some(doc) = self.hold.doc().await else {
            return found;
        };
        let exec = &self.adm.execution_id;
        found
            .into_iter()
            .filter(|r| {
                !self.answers.applied.contains(&r.id)
                    && !doc
                        .applied_resume_digests
                        .iter()
                        .any(|a| a.execution_id == *exec && a.interrupt_id == r.id)
                    && !doc.execution.pending.iter().any(|(id, _)| *id == r.id)
            })
            .collect()
    }

    /// When a new interrupt expires (none when expiry is off).
    pub(super) fn expires_at(&self) -> Option<String> {
        let ttl = self.rt.settings().interrupt_ttl_secs;
        (ttl > 0).then(|| {
            let ms = i64::try_from(ttl).unwrap_or(i64::MAX).saturating_mul(1000);
            clock::rfc3339_ms(self.rt.now_ms().saturating_add(ms))
        })
    }

    /// Commits new interrupts (durable before anything announces them), with what a resume of
    /// them needs to know of the run so far; then catches up on the pipeline.
    async fn commit_interrupt(&mut self, inputs: Vec<RequiredInput>) -> Flow {
        self.out.mapper().finalise_all_digests();
        let expires_at = self.expires_at();
        let digests = self.out.mapper().text_digests().clone();
        let message_ids = self.out.mapper().message_ids().clone();
        let steps = self.out.mapper().durable_open_steps().clone();
        let seq = self.out.mapper().pipeline_sequence();
        self.commit(msg::INTERRUPT_NOT_COMMITTED, |d| {
            for r in inputs {
                match d.execution.pending.iter_mut().find(|(id, _)| *id == r.id) {
                    Some((_, e)) => e.sideband |= r.sideband,
                    None => d.execution.pending.push((
                        r.id,
                        PendingEntry {
                            value: r.value,
                            sideband: r.sideband,
                            expires_at: expires_at.clone(),
                        },
                    )),
                }
            }
            d.execution.text_snapshot_digests = digests;
            d.execution.message_ids = message_ids;
            d.execution.pipeline_open_steps = steps;
            d.execution.pipeline_sequence = d.execution.pipeline_sequence.max(seq);
        })
        .await?;
        self.catch_up().await
    }

    /// After sideband answers: the pipeline's events the streams did not carry (after the stored
    /// sequence) are mapped before the run ends.
    async fn catch_up(&mut self) -> Flow {
        let Some(task) = self.answers.catch_up.take() else {
            return Ok(());
        };
        let after = self.out.mapper().pipeline_sequence();
        if after == 0 {
            return Ok(());
        }
        let Some(client) = self.task.client_now() else {
            return Ok(());
        };
        if let Ok(Some(state)) = client.pipeline_state(&task, after).await {
            self.out.map(|m, out| m.map_recovery(&state, out)).await?;
        }
        Ok(())
    }

    /// A stream that closed while its task was still live. The kernel's reply may go on
    /// elsewhere: an answer delivered twice (the first time by a run that crashed before it
    /// could record it) gets a one-event acknowledgement; a pipeline reply can re-enter on a
    /// separate stream. The task is looked at (GetTask): an interrupt or an end state ends the
    /// run as usual, a live task is followed (SubscribeToTask). Bounded by `budget`; anything
    /// that fails leaves the run to end as it would have. `None`: end from what is known.
    async fn reattach(&mut self, resume: bool, budget: &mut u8) -> Flow<Option<EventStream>> {
        if *budget == 0
            || !self.task.may_be_live()
            || self.out.is_gone()
            || self.adm.control.is_cancel_requested()
        {
            return Ok(None);
        }
        let (Some(task), Some(client)) =
            (self.task.id().map(str::to_owned), self.task.client_now())
        else {
            return Ok(None);
        };
        *budget -= 1;
        if self.task.acknowledged_only() {
            self.settle_acknowledged(&client, &task, resume).await?;
            return Ok(None);
        }
        let Ok(Ok(snapshot)) = tokio::time::timeout(CANCEL_WAIT, client.get_task(&task, 0)).await
        else {
            return Ok(None);
        };
        if self.process(snapshot.as_value(), resume).await?.is_break() {
            return Ok(None);
        }
        Ok(match client.subscribe_to_task(&task).await {
            Ok(s) => {
                tracing::debug!(task = %task, "kernel stream closed early; following the task");
                Some(s)
            }
            Err(_) => None,
        })
    }

    /// An answer the kernel acknowledged without its continuation: it had it already, from a run
    /// that crashed after delivering it (the tool is not run again). The task is polled (bounded,
    /// [`ACK_FOLLOW`]) until it leaves the working state, and the run ends from that snapshot
    /// (success, failure or the next interrupt). A task still working then is not followed: the
    /// kernel can leave the state at WORKING after a duplicate answer, and a subscription to it
    /// stays silent. The run ends with `RESUME_ALREADY_APPLIED`, which is what the kernel
    /// reported; the next turn cancels the task if it still runs.
    pub(super) async fn settle_acknowledged(
        &mut self,
        client: &a2a::Client,
        task: &str,
        resume: bool,
    ) -> Flow {
        let deadline = tokio::time::Instant::now() + ACK_FOLLOW;
        loop {
            if let Ok(Ok(snapshot)) =
                tokio::time::timeout(CANCEL_WAIT, client.get_task(task, 0)).await
            {
                if !snapshot.state().is_some_and(|s| s.is_active()) {
                    // Stopped or not, the snapshot is all there is (an interrupt ends the run).
                    let _ = self.process(snapshot.as_value(), resume).await?;
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline
                || self.adm.control.is_cancel_requested()
                || self.out.is_closed()
            {
                return Err(End::fail(Code::ResumeAlreadyApplied, msg::ALREADY_APPLIED));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}
