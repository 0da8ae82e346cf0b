//! Delivering a resume's answers: one kernel call per answer, in request order; each answer the
//! kernel accepts is durable before the next is sent, and its stream read to its end first.
//!
//! Permission answers that all belong to a pipeline's side requests go as unary messages (the
//! pipeline's own stream carries what follows, caught up afterwards); every other answer opens a
//! stream. Acceptance is the stream's first item.

use std::ops::ControlFlow;
use std::time::Duration;

use a2a::{EventStream, Part, PermissionAnswer};

use crate::error::{msg, Code};
use crate::run::decide::answer::Answer;
use crate::run::decide::resume::{Delivery, TaskStage};
use store::AppliedDigest;

use super::resume::task_view;
use super::{Driver, End, Flow, Unsaved, CANCEL_WAIT};

/// How long a task that refused an answer is watched for an earlier delivery of it starting.
const EARLIER_DELIVERY_WAIT: Duration = Duration::from_secs(2);

/// What a refused answer says of an earlier delivery (see [`Driver::earlier_delivery`]).
enum Earlier {
    /// The kernel carried this answer out (or is carrying it out).
    Carried,
    /// The kernel holds this answer's decision but its task shows nothing of it.
    Unconfirmed,
    /// The kernel carries out another answer to the interrupt.
    Other,
    /// There was no earlier delivery the kernel has: the refusal stands.
    Refused,
    /// The task could not be looked at.
    Unknown,
}

/// What the kernel did with an answer.
enum Accepted {
    /// Its stream goes on.
    Open(EventStream),
    /// Its stream reached a stopping state.
    Closed,
    /// The kernel had it already and is carrying it out (see [`Driver::earlier_delivery`]).
    Held,
}

impl Driver {
    pub(super) async fn deliver(
        &mut self,
        client: &a2a::Client,
        task_id: &str,
        answers: Vec<Delivery>,
    ) -> Flow<End> {
        let sideband = answers
            .iter()
            .all(|d| matches!(d.answer, Answer::Permission { .. }) && d.pending.sideband);
        let count = answers.len();
        let mut last_stream = None;
        for (i, d) in answers.into_iter().enumerate() {
            let last = i + 1 == count;
            // Marked before it reaches the kernel: a run that takes over after a crash or on
            // another instance settles it from the task instead of sending it again.
            self.mark_delivering(&d).await?;
            self.still_held().await?;
            let accepted = match &d.answer {
                Answer::Permission {
                    decision,
                    tool_use_id,
                } => {
                    let part = Part::permission_answer(&PermissionAnswer {
                        request_task_id: task_id,
                        input_id: &d.interrupt_id,
                        tool_use_id: tool_use_id.as_deref(),
                        decision: *decision,
                    });
                    if sideband {
                        self.send_sideband(client, task_id, &d, part).await?;
                        continue;
                    }
                    let id = format!("agui-resume-{}-{}", self.run_id(), d.interrupt_id);
                    match self
                        .send_streaming(client, id, vec![part], Some(task_id))
                        .await
                    {
                        Ok(stream) => {
                            self.accept(stream, &d, msg::PERMISSION_NOT_ACCEPTED)
                                .await?
                        }
                        // "Not pending" while the task works: an earlier delivery of this
                        // answer is being carried out.
                        Err(e) if e.is_permission_not_pending() => match self.refused(&d).await? {
                            Some(held) => held,
                            None => return Err(rejected(&e)),
                        },
                        Err(e) => {
                            if e.rpc().is_some() {
                                // Refused, not lost on the way: nothing to settle later.
                                self.unmark_delivering(&d).await;
                            }
                            return Err(rejected(&e));
                        }
                    }
                }
                Answer::CancelQuestion => {
                    client
                        .cancel_task(task_id)
                        .await
                        .map_err(|e| End::kernel(&e).keep_task())?;
                    self.hold.end_execution().await;
                    return Err(End::fail(Code::Cancelled, msg::CANCELLED_BY_ANSWER));
                }
                Answer::Question { text, tool_use_id } => {
                    if let Some(tool) = tool_use_id {
                        self.answers.questions.push((tool.clone(), text.clone()));
                    }
                    let id = format!("agui-resume-{}", self.run_id());
                    let stream = match self
                        .send_streaming(client, id, vec![Part::text(text.as_str())], Some(task_id))
                        .await
                    {
                        Ok(s) => s,
                        Err(e) => {
                            if e.rpc().is_some() {
                                self.unmark_delivering(&d).await;
                            }
                            return Err(End::kernel(&e));
                        }
                    };
                    self.accept(stream, &d, msg::ANSWER_NOT_ACCEPTED).await?
                }
            };
            match (accepted, last) {
                (Accepted::Held, true) => {
                    self.settle_acknowledged(client, task_id, true).await?;
                    return self.finish().await;
                }
                (Accepted::Closed, true) => return self.finish().await,
                (Accepted::Open(s), true) => last_stream = Some(s),
                (Accepted::Open(s), false) => self.drain(s).await?,
                (Accepted::Held | Accepted::Closed, false) => {}
            }
        }
        if sideband {
            return self.follow_sideband(client, task_id).await;
        }
        match last_stream {
            Some(s) => self.consume(s, true).await,
            None => match client.subscribe_to_task(task_id).await {
                Ok(s) => self.consume(s, true).await,
                Err(_) => self.finish().await,
            },
        }
    }

    /// A sideband permission answer: a unary message, committed once the kernel has it.
    async fn send_sideband(
        &mut self,
        client: &a2a::Client,
        task_id: &str,
        d: &Delivery,
        part: Part,
    ) -> Flow {
        let message = self.turn().message(
            format!("agui-resume-{}", d.interrupt_id),
            vec![part],
            Some(task_id),
        );
        match client.send_message(&message).await {
            Ok(_) => {}
            Err(e) if e.is_backup_not_ready() => {
                return Err(End::fail(
                    Code::SessionBackupNotReady,
                    msg::BACKUP_NOT_READY,
                ))
            }
            Err(e) if e.rpc().is_some() => {
                self.unmark_delivering(d).await;
                return Err(End::fail(Code::A2aUnavailable, msg::ANSWER_REJECTED));
            }
            Err(_) => return Err(End::fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE)),
        }
        self.commit_answer(d).await
    }

    /// After sideband answers: the task is looked at, then followed (its pipeline goes on).
    async fn follow_sideband(&mut self, client: &a2a::Client, task_id: &str) -> Flow<End> {
        self.answers.catch_up = Some(task_id.to_owned());
        self.emit_session().await?;
        let task = client
            .get_task(task_id, 100)
            .await
            .map_err(|e| End::kernel(&e).keep_task())?;
        if self.process(task.as_value(), true).await?.is_break() {
            return self.finish().await;
        }
        if let Ok(s) = client.subscribe_to_task(task_id).await {
            return self.consume(s, true).await;
        }
        let task = client
            .get_task(task_id, 100)
            .await
            .map_err(|e| End::kernel(&e).keep_task())?;
        match self.process(task.as_value(), true).await? {
            ControlFlow::Break(()) => self.finish().await,
            ControlFlow::Continue(()) => Err(End::fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE)),
        }
    }

    /// Reads the first item of an answer's stream: acceptance. The answer is committed before
    /// anything else happens, then the item is mapped.
    async fn accept(
        &mut self,
        mut stream: EventStream,
        d: &Delivery,
        not_accepted: &'static str,
    ) -> Flow<Accepted> {
        match stream.next().await {
            Ok(Some(item)) => {
                self.commit_answer(d).await?;
                if !self.answers.announced {
                    self.answers.announced = true;
                    self.emit_session().await?;
                }
                Ok(match self.process(&item, true).await? {
                    ControlFlow::Break(()) => Accepted::Closed,
                    ControlFlow::Continue(()) => Accepted::Open(stream),
                })
            }
            Ok(None) => match self.refused(d).await? {
                Some(held) => Ok(held),
                None => Err(End::fail(Code::A2aUnavailable, not_accepted)),
            },
            Err(e) => Err(End::kernel(&e).keep_task()),
        }
    }

    /// The kernel refused an answer to a pending interrupt (an empty stream, or "not pending").
    /// `Some(Held)` when it had the answer from an earlier delivery and carries it out (the run
    /// follows the task); `None` when the answer was really not accepted (it stays pending);
    /// an end of its own otherwise (see [`Earlier`]).
    async fn refused(&mut self, d: &Delivery) -> Flow<Option<Accepted>> {
        match self.earlier_delivery(d).await {
            Earlier::Carried => {
                self.commit_answer(d).await?;
                self.task.set_acknowledged_only();
                Ok(Some(Accepted::Held))
            }
            Earlier::Unconfirmed => {
                // The kernel took this answer from a run that stopped while delivering it and
                // takes no other; whether its tool runs is the kernel's. It is recorded as
                // applied (never sent again, the same answer again is told so), the task is left
                // as it is (the next turn cancels it if it still waits), and the client learns
                // the answer is not this run's to apply.
                self.commit_answer(d).await?;
                Err(End::fail(Code::ResumeAlreadyApplied, msg::EARLIER_DELIVERY).keep_task())
            }
            Earlier::Other => {
                // Another answer, on its way from an earlier run, is what the kernel has: this
                // one is a conflict, and is not on its way (the other's mark stays, for the
                // resume that settles it).
                self.unmark_delivering(d).await;
                Err(End::fail(Code::ResumeAlreadyApplied, msg::ALREADY_APPLIED).keep_task())
            }
            Earlier::Refused => {
                // Only this run's own mark goes: one an earlier run left stays for later.
                if !d.sent_before {
                    self.unmark_delivering(d).await;
                }
                Ok(None)
            }
            Earlier::Unknown => {
                // The task could not be looked at (the kernel, or the client, went away): the
                // answer stays pending and every mark stays; nothing is claimed either way.
                Err(End::fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE).keep_task())
            }
        }
    }

    /// What a refusal of `d` says about an earlier delivery of an answer to its interrupt, by a
    /// run that stopped before it could record the outcome (only such a run leaves a mark).
    /// Without any mark there was none: the refusal stands. With this very answer marked
    /// (`sent_before`): the task working, completed or waiting for something else carried it
    /// out; the task still listing the interrupt after a short while holds a decision for it
    /// without showing progress (the kernel refuses a second one); a task cancelled or failed
    /// may have ended before it arrived. With another answer marked (`other_before`): a task
    /// that works or moved past carries that one out. The earlier delivery may still be on its
    /// way into the task, so a waiting task is looked at again for a short while.
    async fn earlier_delivery(&mut self, d: &Delivery) -> Earlier {
        if !d.sent_before && !d.other_before {
            return Earlier::Refused;
        }
        let (Some(task), Some(client)) =
            (self.task.id().map(str::to_owned), self.task.client_now())
        else {
            return Earlier::Unknown;
        };
        let carried = if d.sent_before {
            Earlier::Carried
        } else {
            Earlier::Other
        };
        let deadline = tokio::time::Instant::now() + EARLIER_DELIVERY_WAIT;
        loop {
            let view = match tokio::time::timeout(CANCEL_WAIT, client.get_task(&task, 0)).await {
                Ok(Ok(t)) if t.state().is_some_and(|s| s.is_active()) => return carried,
                Ok(Ok(t)) => task_view(&t.view()),
                _ => return Earlier::Unknown,
            };
            tracing::debug!(
                stage = ?view.stage,
                moved_past = view.moved_past(&d.interrupt_id),
                "answer refused; the task is looked at"
            );
            if view.moved_past(&d.interrupt_id) {
                return carried;
            }
            if view.stage == TaskStage::Ended {
                return Earlier::Refused;
            }
            if self.out.is_closed() {
                return Earlier::Unknown;
            }
            if tokio::time::Instant::now() >= deadline {
                // Still listing the interrupt it refuses an answer to: it holds this answer's
                // decision. A task that lists nothing (a kernel restarted: its summary) shows
                // nothing either way.
                let listed =
                    view.lists_inputs && view.required.iter().any(|r| r.id == d.interrupt_id);
                return match (d.sent_before, listed) {
                    (true, true) => Earlier::Unconfirmed,
                    (true, false) => Earlier::Unknown,
                    (false, _) => Earlier::Refused,
                };
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Reads an answer's stream to its end before the next answer is sent (an interrupt ends
    /// the run).
    async fn drain(&mut self, mut stream: EventStream) -> Flow {
        loop {
            match stream.next().await {
                Ok(Some(item)) => {
                    if self.process(&item, true).await?.is_break() {
                        return Ok(());
                    }
                }
                Ok(None) => return Ok(()),
                Err(e) => return Err(End::kernel(&e)),
            }
        }
    }

    /// Records an accepted answer and removes its interrupt from pending, durable before the run
    /// goes on.
    async fn commit_answer(&mut self, d: &Delivery) -> Flow {
        let applied = AppliedDigest {
            execution_id: self.adm.execution_id.clone(),
            interrupt_id: d.interrupt_id.clone(),
            digest: d.digest.clone(),
        };
        self.answers.applied.push(d.interrupt_id.clone());
        self.commit(msg::ANSWER_NOT_COMMITTED, |doc| {
            doc.execution
                .pending
                .retain(|(p, _)| *p != applied.interrupt_id);
            doc.delivering.remove(&applied);
            doc.applied_resume_digests.insert(applied);
        })
        .await
    }

    /// The kernel refused an answer: it is not on its way any more (best effort: a mark left
    /// behind is settled only if the task shows it has the answer).
    async fn unmark_delivering(&mut self, d: &Delivery) {
        let mark = AppliedDigest {
            execution_id: self.adm.execution_id.clone(),
            interrupt_id: d.interrupt_id.clone(),
            digest: d.digest.clone(),
        };
        let _ = self
            .hold
            .edit(|doc| {
                doc.delivering.remove(&mark);
            })
            .await;
    }

    /// Records that an answer is on its way to the kernel, durable before it is sent.
    async fn mark_delivering(&mut self, d: &Delivery) -> Flow {
        let mark = AppliedDigest {
            execution_id: self.adm.execution_id.clone(),
            interrupt_id: d.interrupt_id.clone(),
            digest: d.digest.clone(),
        };
        // Nothing was sent yet: a failed mark leaves the interrupt answerable (no fail-closed).
        match self
            .hold
            .edit(|doc| {
                doc.delivering.insert(mark);
            })
            .await
        {
            Ok(()) => Ok(()),
            Err(Unsaved::NotHeld) => Err(End::fail(Code::StatePersistenceFailed, msg::TAKEN_OVER)),
            Err(Unsaved::Lapsed { late }) => Err(End::lapsed(late).keep_task()),
            Err(Unsaved::Failed) => Err(End::fail(
                Code::StatePersistenceFailed,
                msg::INTERRUPT_NOT_COMMITTED,
            )),
        }
    }
}

/// A permission answer the kernel refused: a retryable backup state, or the answer was
/// rejected; the task is left waiting for it either way.
fn rejected(e: &a2a::Error) -> End {
    match End::kernel(e).keep_task() {
        End::Failed(f) if f.code == Code::A2aUnavailable => {
            End::fail(Code::A2aUnavailable, msg::ANSWER_REJECTED)
        }
        other => other,
    }
}
