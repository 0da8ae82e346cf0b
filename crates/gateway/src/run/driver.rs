//! The run driver: from an admitted run to exactly one terminal AG-UI event.
//!
//! New turns (§9.2–§9.3), resumes (§12) and guidance runs (§13). Every path ends with exactly one
//! `RUN_FINISHED` or `RUN_ERROR`, spans balanced first (D-5). Recovery-critical writes (task id,
//! session id, interrupt commit, accepted answers) are durable before anything depending on them
//! is announced; a failed write cancels the kernel task (fail closed).

use std::borrow::Cow;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use a2a::{ItemView, TaskState};
use agui::{Event, Outcome};
use bytes::Bytes;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::canonical;
use crate::error::{msg, Code};
use crate::i18n;
use crate::mapping::interrupt::{self, RequiredInput};
use crate::mapping::{self, fast, Mapper};
use crate::store::{AppliedDigest, PendingEntry, ThreadDoc};
use crate::validate::{ResumeEntry, ResumeStatus};

use super::admission::{mark_terminal, Admitted, Mode, Orphan};
use super::request::Turn;
use super::sink::{Disconnected, Sink};
use super::Runtime;

/// How long a run waits for a starting managed kernel.
const KERNEL_WAIT: Duration = Duration::from_secs(60);
/// Bound on best-effort cancellations.
const CANCEL_WAIT: Duration = Duration::from_secs(10);
/// How long a task that refused an answer is watched for an earlier delivery of it starting.
const EARLIER_DELIVERY_WAIT: Duration = Duration::from_secs(2);
/// How long an answer the kernel only acknowledged is followed by polling its task.
const ACK_FOLLOW: Duration = Duration::from_secs(5);

/// Starts the driver of an admitted run; returns the receiving end of its SSE bytes.
pub fn spawn_run(rt: Arc<Runtime>, adm: Admitted) -> mpsc::Receiver<Bytes> {
    let (sink, rx) = Sink::new(rt.channel_capacity, rt.clock.clone());
    tokio::spawn(async move {
        rt.activity
            .open_streams
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut d = Driver::new(rt.clone(), adm, sink);
        d.run().await;
        rt.activity
            .open_streams
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        rt.touch();
    });
    rx
}

/// Why the main flow stopped early.
enum Stop {
    /// End with `RUN_ERROR`; `cancel`: also cancel the kernel task (when nothing is pending).
    Fail {
        code: Code,
        message: Cow<'static, str>,
        cancel: bool,
    },
    /// Fail closed after a recovery-critical write failed: cancel the task, clear pending, terminal.
    Persist(&'static str),
    /// The client went away.
    Disconnected,
}

impl From<Disconnected> for Stop {
    fn from(_: Disconnected) -> Stop {
        Stop::Disconnected
    }
}

fn fail(code: Code, message: &'static str) -> Stop {
    Stop::Fail {
        code,
        message: Cow::Borrowed(message),
        cancel: false,
    }
}

/// A protocol violation: the run ends and its task is cancelled (nothing is left running).
fn protocol(message: &'static str) -> Stop {
    Stop::Fail {
        code: Code::A2aProtocolError,
        message: Cow::Borrowed(message),
        cancel: true,
    }
}

fn kernel_error(e: &a2a::Error) -> Stop {
    match e {
        a2a::Error::Rpc(r) if r.is_backup_not_ready() => Stop::Fail {
            code: Code::SessionBackupNotReady,
            message: if r.message.is_empty() {
                Cow::Borrowed("Session backup is still synchronizing. Retry after 3 seconds.")
            } else {
                Cow::Owned(r.message.clone())
            },
            cancel: false,
        },
        _ => Stop::Fail {
            code: Code::A2aUnavailable,
            message: Cow::Borrowed(msg::A2A_UNAVAILABLE),
            cancel: true,
        },
    }
}

/// Outcome of [`Driver::reattach`].
enum Reattach {
    /// Follow the task on this stream.
    Stream(a2a::EventStream),
    /// The task waits for input: the run ended with an interrupt.
    Interrupted,
    /// End the run from what is known.
    No,
}

/// What is left of an answer's stream after its acceptance.
enum After {
    /// The run ended (an interrupt was emitted).
    Ended,
    /// The kernel had the answer already and is working on it (see `Driver::accept`).
    Acknowledged,
    /// The stream reached a stopping state.
    Closed,
    /// The stream goes on.
    Open(a2a::EventStream),
}

/// The outcome of [`Driver::settle`].
enum Settled {
    Ended,
    Next,
    Last(a2a::EventStream),
}

enum Step {
    Continue,
    /// A final state (or input-required without new input): stop reading.
    Break,
    /// The run ended with an interrupt.
    Interrupted,
}

struct Driver {
    rt: Arc<Runtime>,
    adm: Admitted,
    /// The resolved workspace, as the kernel is told it.
    cwd: String,
    sink: Sink,
    mapper: Mapper,
    task_id: Option<String>,
    session_id: Option<String>,
    last_state: Option<TaskState>,
    /// The run ended with an interrupt (no cancellation on disconnect, execution stays live).
    paused: bool,
    disconnected: bool,
    /// Question answers delivered in this resume: `(toolUseId, answer)` for `TOOL_CALL_RESULT`.
    answered_questions: Vec<(String, String)>,
    /// Interrupt ids applied in this resume (not re-interrupted when the kernel repeats them).
    applied_now: Vec<String>,
    /// An answer's stream acknowledged it without carrying the continuation (see `reattach`).
    acknowledged_only: bool,
    /// The kernel reported FAILED during this run (a provider error: the stream may go on with
    /// WORKING and stop; the run failed all the same, and is not re-attached).
    failed_seen: bool,
    kernel_cancel_sent: bool,
    /// The session event after the first accepted answer of a resume was emitted.
    accepted_once: bool,
    /// Sideband answers were sent: catch up on pipeline events before the run ends (§12.4).
    deferred_catchup: Option<String>,
}

impl Driver {
    fn new(rt: Arc<Runtime>, adm: Admitted, sink: Sink) -> Driver {
        let mapper = Mapper::new(
            &adm.req.envelope.run_id,
            Default::default(),
            &adm.req.envelope.thread_id,
        );
        Driver {
            rt,
            cwd: adm.req.cwd.to_string_lossy().into_owned(),
            adm,
            sink,
            mapper,
            task_id: None,
            session_id: None,
            last_state: None,
            paused: false,
            disconnected: false,
            answered_questions: Vec::new(),
            applied_now: Vec::new(),
            acknowledged_only: false,
            failed_seen: false,
            kernel_cancel_sent: false,
            accepted_once: false,
            deferred_catchup: None,
        }
    }

    fn thread_id(&self) -> &str {
        &self.adm.req.envelope.thread_id
    }

    fn run_id(&self) -> &str {
        &self.adm.req.envelope.run_id
    }

    /// Emits unless the client is gone (a gone client is noticed by the caller).
    async fn emit(&mut self, e: Event) -> Result<(), Stop> {
        if self.disconnected {
            return Ok(());
        }
        match self.sink.emit(&e).await {
            Ok(()) => Ok(()),
            Err(Disconnected) => {
                self.disconnected = true;
                Err(Stop::Disconnected)
            }
        }
    }

    async fn emit_all(&mut self, events: Vec<Event>) -> Result<(), Stop> {
        for e in events {
            self.emit(e).await?;
        }
        Ok(())
    }

    async fn run(&mut self) {
        let started = Event::RunStarted {
            thread_id: self.thread_id().to_owned(),
            run_id: self.run_id().to_owned(),
            parent_run_id: self.adm.req.envelope.parent_run_id.clone(),
        };
        if let Some(task) = self.adm.expired_task.take() {
            // D-4: the task of an expired interrupt is cancelled (best effort).
            if let Some(c) = self.rt.kernel.client() {
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(CANCEL_WAIT, c.cancel_task(&task)).await;
                });
            }
        }
        let result = match self.emit(started).await {
            Err(s) => Err(s),
            Ok(()) => match self.adm.mode.clone() {
                Mode::NewTurn => self.new_turn().await,
                // Boxed: a run holds its driver's future for its whole life (hours when parked);
                // the larger resume state then costs only the runs that resume.
                Mode::Resume(entries) => Box::pin(self.resume(entries)).await,
                Mode::Guidance => Box::pin(self.guidance()).await,
            },
        };
        match result {
            Ok(()) => {}
            Err(Stop::Disconnected) => self.on_disconnect().await,
            Err(Stop::Fail {
                code,
                message,
                cancel,
            }) => self.fail(code, &message, cancel).await,
            Err(Stop::Persist(m)) => {
                self.fail_closed().await;
                self.fail(Code::StatePersistenceFailed, m, false).await;
            }
        }
        self.release().await;
    }

    // ---------------------------------------------------------------- common pieces

    async fn client(&self) -> Result<a2a::Client, Stop> {
        if let Some(c) = self.rt.kernel.client() {
            return Ok(c);
        }
        self.rt.kernel.wait_ready(KERNEL_WAIT).await;
        self.rt
            .kernel
            .client()
            .ok_or_else(|| fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE))
    }

    /// Loads the thread's document (it is in memory: the run holds the thread active).
    async fn doc(&self) -> Option<ThreadDoc> {
        self.adm.slot.state.lock().await.doc.clone()
    }

    /// Mutates the document under the thread's lock and persists it; reverts on failure.
    async fn update(&self, f: impl FnOnce(&mut ThreadDoc)) -> bool {
        let mut st = self.adm.slot.state.lock().await;
        let Some(doc) = st.doc.as_mut() else {
            return false;
        };
        if doc.execution.execution_id != self.adm.execution_id {
            return false;
        }
        let before = doc.clone();
        f(doc);
        match self.rt.threads.persist(doc).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "state write failed");
                *doc = before;
                false
            }
        }
    }

    fn session_event(&self) -> Event {
        Event::Custom {
            name: "iac-code.session.v1".into(),
            value: json!({
                "schemaVersion": 1,
                "threadId": self.thread_id(),
                "aguiRunId": self.run_id(),
                "executionId": self.adm.execution_id,
                "contextId": self.adm.context_id,
                "taskId": self.task_id,
                "rosInvocationId": self.adm.req.iac.ros_invocation_id,
                "sessionId": self.session_id,
            }),
        }
    }

    async fn cancel_task_best_effort(&mut self) {
        let Some(task) = self.task_id.clone() else {
            return;
        };
        if self.kernel_cancel_sent {
            return;
        }
        self.kernel_cancel_sent = true;
        if let Some(c) = self.rt.kernel.client() {
            let _ = tokio::time::timeout(CANCEL_WAIT, c.cancel_task(&task)).await;
        }
    }

    /// Ends the run with `RUN_ERROR` after balancing spans (D-5).
    async fn fail(&mut self, code: Code, message: &str, cancel: bool) {
        // Guidance runs never cancel the task they inject into (§13).
        if cancel
            && !self.paused
            && self.adm.mode != Mode::Guidance
            && self.pending_is_empty().await
        {
            self.cancel_task_best_effort().await;
        }
        if self.sink.terminal_sent() {
            return;
        }
        let mut events = Vec::new();
        self.mapper.close_all(&mut events);
        events.push(Event::RunError {
            message: i18n::tr(self.adm.req.lang, message),
            code: code.as_str().into(),
            usage: self.mapper.usage(),
        });
        let _ = self.emit_all(events).await;
    }

    async fn pending_is_empty(&self) -> bool {
        self.doc().await.is_none_or(|d| {
            d.execution.execution_id != self.adm.execution_id || d.execution.pending.is_empty()
        })
    }

    /// After a failed recovery-critical write: cancel the task, clear pending, terminal.
    async fn fail_closed(&mut self) {
        self.cancel_task_best_effort().await;
        let mut st = self.adm.slot.state.lock().await;
        if let Some(doc) = st.doc.as_mut() {
            if doc.execution.execution_id == self.adm.execution_id {
                mark_terminal(doc);
                let _ = self.rt.threads.persist(doc).await;
            }
        }
        self.paused = false;
    }

    /// D-6: a client disconnect of an ordinary active run cancels the kernel task (once its id is
    /// known). Runs that ended in an interrupt or already finished are not cancelled.
    async fn on_disconnect(&mut self) {
        self.disconnected = true;
        if self.paused || self.sink.terminal_sent() || self.adm.mode == Mode::Guidance {
            return;
        }
        if !self.pending_is_empty().await {
            return;
        }
        self.cancel_task_best_effort().await;
    }

    /// Releases the thread; an execution that ended without pending interrupts becomes terminal.
    async fn release(&mut self) {
        if self.adm.mode == Mode::Guidance {
            return;
        }
        let mut st = self.adm.slot.state.lock().await;
        if st
            .active
            .as_ref()
            .is_some_and(|a| a.run_id == self.adm.req.envelope.run_id)
        {
            st.active = None;
        }
        let mut persist = None;
        if let Some(doc) = st.doc.as_mut() {
            // An execution that did not end in an interrupt becomes terminal (its task finished,
            // failed, or was cancelled on error/disconnect).
            if doc.execution.execution_id == self.adm.execution_id
                && !self.paused
                && doc.execution.pending.is_empty()
            {
                mark_terminal(doc);
                persist = Some(doc.clone());
            }
        }
        if let Some(doc) = persist {
            if let Err(e) = self.rt.threads.persist(&doc).await {
                tracing::warn!(error = %e, "end-of-run state write failed");
            }
        }
    }

    // ---------------------------------------------------------------- item processing

    /// Identity checks, persistence of new ids, session event, mapping and interrupt detection.
    async fn process(&mut self, result: &Value, resume: bool) -> Result<Step, Stop> {
        let view = ItemView::new(result);
        let mut ids_changed = false;
        if let Some(t) = view.task_id() {
            match &self.task_id {
                None => {
                    let t = t.to_owned();
                    self.task_id = Some(t.clone());
                    if !self.update(|d| d.execution.task_id = Some(t)).await {
                        return Err(Stop::Persist(msg::MAPPING_NOT_COMMITTED));
                    }
                    ids_changed = true;
                }
                Some(x) if x != t => return Err(protocol(msg::TASK_CHANGED)),
                Some(_) => {}
            }
        }
        if let Some(c) = view.context_id() {
            if c != self.adm.context_id {
                return Err(protocol(msg::CONTEXT_CHANGED));
            }
        }
        let meta = view.meta();
        // The kernel had this answer already (a run that crashed delivered it) or runs its
        // continuation on another stream: this stream will not carry the continuation.
        if resume && view.is_acknowledgement() {
            self.acknowledged_only = true;
        }
        if let Some(s) = meta.and_then(mapping::session_id) {
            match &self.session_id {
                None => {
                    let s = s.to_owned();
                    self.session_id = Some(s.clone());
                    if !self.update(|d| d.session_id = Some(s)).await {
                        return Err(Stop::Persist(msg::SESSION_NOT_COMMITTED));
                    }
                    ids_changed = true;
                }
                Some(x) if x != s => return Err(protocol(msg::SESSION_CHANGED)),
                Some(_) => {}
            }
        }
        if ids_changed {
            let e = self.session_event();
            self.emit(e).await?;
        }
        if self.adm.control.is_cancel_requested()
            && self.task_id.is_some()
            && !self.kernel_cancel_sent
        {
            self.cancel_task_best_effort().await;
        }
        if resume && !self.answered_questions.is_empty() {
            for (tool, answer) in std::mem::take(&mut self.answered_questions) {
                let mut out = Vec::new();
                self.mapper.tool_result(&tool, answer, &mut out);
                self.emit_all(out).await?;
            }
        }
        let mut events = Vec::new();
        self.mapper.map_item(view.obj, &mut events);
        self.emit_all(events).await?;

        if let Some(meta) = meta {
            let new_inputs = self.new_inputs(meta).await;
            if !new_inputs.is_empty() {
                for r in &new_inputs {
                    if let Some(t) = r
                        .value
                        .get("requestTaskId")
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                    {
                        if Some(t) != self.task_id.as_deref() {
                            return Err(protocol(msg::INTERRUPT_OTHER_TASK));
                        }
                    }
                    if let Some(c) = r
                        .value
                        .get("contextId")
                        .and_then(Value::as_str)
                        .filter(|s| !s.is_empty())
                    {
                        if c != self.adm.context_id {
                            return Err(protocol(msg::INTERRUPT_OTHER_CONTEXT));
                        }
                    }
                }
                self.commit_interrupt(new_inputs).await?;
                return Ok(Step::Interrupted);
            }
        }
        let state = view.state();
        if let Some(s) = &state {
            tracing::trace!(state = ?s, "kernel item");
            if *s == TaskState::Failed {
                self.failed_seen = true;
            }
            self.last_state = Some(s.clone());
            if s.is_final() || *s == TaskState::InputRequired {
                return Ok(Step::Break);
            }
        }
        Ok(Step::Continue)
    }

    /// Required inputs of an item that are neither applied nor already pending.
    async fn new_inputs(&self, meta: &Map<String, Value>) -> Vec<RequiredInput> {
        let found = interrupt::required_inputs(meta, || uuid::Uuid::new_v4().simple().to_string());
        if found.is_empty() {
            return found;
        }
        let Some(doc) = self.doc().await else {
            return found;
        };
        found
            .into_iter()
            .filter(|r| {
                !self.applied_now.contains(&r.id)
                    && !doc
                        .applied_resume_digests
                        .iter()
                        .any(|a| a.execution_id == self.adm.execution_id && a.interrupt_id == r.id)
                    && !doc.execution.pending.iter().any(|(id, _)| *id == r.id)
            })
            .collect()
    }

    /// Commits new interrupts (durable first), then closes spans and ends with the interrupt.
    async fn commit_interrupt(&mut self, inputs: Vec<RequiredInput>) -> Result<(), Stop> {
        self.mapper.finalise_all_digests();
        let ttl = self.rt.cfg.interrupt_ttl_secs;
        let expires_at =
            (ttl > 0).then(|| interrupt::rfc3339_ms(self.rt.clock.now_ms() + (ttl as i64) * 1000));
        let digests = self.mapper.text_digests.clone();
        let steps = self.mapper.durable_open_steps().clone();
        let seq = self.mapper.pipeline_sequence();
        let ok = self
            .update(|d| {
                for r in inputs {
                    if let Some((_, e)) = d.execution.pending.iter_mut().find(|(id, _)| *id == r.id)
                    {
                        e.sideband |= r.sideband;
                    } else {
                        d.execution.pending.push((
                            r.id,
                            PendingEntry {
                                value: r.value,
                                sideband: r.sideband,
                                expires_at: expires_at.clone(),
                            },
                        ));
                    }
                }
                d.execution.text_snapshot_digests = digests;
                d.execution.pipeline_open_steps = steps;
                d.execution.pipeline_sequence = d.execution.pipeline_sequence.max(seq);
            })
            .await;
        if !ok {
            return Err(Stop::Persist(msg::INTERRUPT_NOT_COMMITTED));
        }
        self.paused = true;
        self.catch_up_deferred().await?;
        self.finish_with_interrupt().await
    }

    /// The deferred pipeline catch-up after sideband answers: missed envelopes (after the stored
    /// sequence) are mapped before the run ends.
    async fn catch_up_deferred(&mut self) -> Result<(), Stop> {
        let Some(task) = self.deferred_catchup.take() else {
            return Ok(());
        };
        let after = self.mapper.pipeline_sequence();
        if after == 0 {
            return Ok(());
        }
        let Some(client) = self.rt.kernel.client() else {
            return Ok(());
        };
        if let Ok(Some(state)) = client.pipeline_state(&task, after).await {
            let mut out = Vec::new();
            self.mapper.map_recovery(&state, &mut out);
            self.emit_all(out).await?;
        }
        Ok(())
    }

    async fn finish_with_interrupt(&mut self) -> Result<(), Stop> {
        let Some(doc) = self.doc().await else {
            return Err(fail(Code::StateUnavailable, msg::STATE_UNAVAILABLE));
        };
        let interrupts = doc
            .execution
            .pending
            .iter()
            .map(|(id, e)| interrupt::build(id, &e.value, e.expires_at.as_deref()))
            .collect();
        let mut events = Vec::new();
        self.mapper.close_all(&mut events);
        events.push(Event::RunFinished {
            thread_id: self.thread_id().to_owned(),
            run_id: self.run_id().to_owned(),
            outcome: Outcome::Interrupt(interrupts),
            usage: self.mapper.usage(),
        });
        self.emit_all(events).await
    }

    /// Reads a kernel stream to its end (or a stopping state), then ends the run.
    async fn consume(&mut self, mut stream: a2a::EventStream, resume: bool) -> Result<(), Stop> {
        let mut cancel_deadline: Option<tokio::time::Instant> = None;
        let mut reattach_budget: u8 = 2;
        // The wake-up sources other than the stream are armed once, not once per event: each
        // `notified()`/`closed()` future registers with a shared waiter list (the drain one is
        // shared by every run), which cost a lock and an unlock per event twice over.
        let (rt, control, tx) = (
            self.rt.clone(),
            self.adm.control.clone(),
            self.sink.sender(),
        );
        let mut drain = pin!(rt.drain.notified());
        let mut cancel_asked = pin!(control.notify.notified());
        let mut client_gone = pin!(tx.closed());
        loop {
            if self.rt.draining.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(Stop::Fail {
                    code: Code::A2aUnavailable,
                    message: Cow::Borrowed(msg::SHUTTING_DOWN),
                    cancel: true,
                });
            }
            if self.adm.control.is_cancel_requested() && cancel_deadline.is_none() {
                cancel_deadline = Some(tokio::time::Instant::now() + CANCEL_WAIT);
            }
            // Text deltas of the known task skip the generic JSON tree (see `mapping::fast`).
            let known = match (&self.task_id, self.answered_questions.is_empty()) {
                (Some(t), true) => Some(fast::Known {
                    task_id: t,
                    context_id: &self.adm.context_id,
                    session_id: self.session_id.as_deref(),
                }),
                _ => None,
            };
            let next = tokio::select! {
                r = stream.next_with(move |d| known.and_then(|k| fast::text_delta(d, k))) => r,
                _ = client_gone.as_mut(), if !self.disconnected => {
                    self.disconnected = true;
                    if self.task_id.is_some() {
                        return Err(Stop::Disconnected);
                    }
                    // D-6: keep reading until the task id is known, then cancel.
                    continue;
                }
                _ = cancel_asked.as_mut(), if cancel_deadline.is_none() => {
                    cancel_asked.set(control.notify.notified());
                    continue;
                }
                _ = drain.as_mut() => {
                    drain.set(rt.drain.notified());
                    continue;
                }
                _ = sleep_until_opt(cancel_deadline) => {
                    // The kernel did not confirm in time: ask it once more (nothing left running).
                    self.cancel_task_best_effort().await;
                    self.last_state = Some(TaskState::Canceled);
                    break;
                }
            };
            let processed = match next {
                Ok(Some(a2a::Next::Fast(delta))) => self.apply_text_delta(delta).await,
                Ok(Some(a2a::Next::Item(result))) => self.process(&result, resume).await,
                Ok(None) => match self.reattach(resume, &mut reattach_budget).await? {
                    Reattach::Stream(s) => {
                        stream = s;
                        continue;
                    }
                    Reattach::Interrupted => return Ok(()),
                    Reattach::No => break,
                },
                Err(e) => {
                    tracing::warn!(error = %e, "kernel stream failed");
                    return Err(kernel_error(&e));
                }
            };
            match processed {
                Ok(Step::Continue) => {
                    if self.disconnected && self.task_id.is_some() {
                        return Err(Stop::Disconnected);
                    }
                }
                Ok(Step::Break) => break,
                Ok(Step::Interrupted) => return Ok(()),
                Err(Stop::Disconnected) => {
                    if self.task_id.is_some() || self.paused {
                        return Err(Stop::Disconnected);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if self.disconnected {
            return Err(Stop::Disconnected);
        }
        self.finish().await
    }

    /// An answer the kernel acknowledged without its continuation: it had it already, from a run
    /// that crashed after delivering it (the tool is not run again). The task is polled
    /// (bounded, [`ACK_FOLLOW`]) until it leaves the working state, and the run ends from that
    /// snapshot (success, failure or the next interrupt). A task still "working" then is not
    /// followed: the kernel can leave the state at WORKING after a duplicate answer, and a
    /// subscription to it stays silent. The run ends with `RESUME_ALREADY_APPLIED`, which is
    /// what the kernel reported; the next turn cancels the task if it still runs (D-21).
    async fn settle_acknowledged(
        &mut self,
        client: &a2a::Client,
        task: &str,
        resume: bool,
    ) -> Result<Reattach, Stop> {
        let deadline = tokio::time::Instant::now() + ACK_FOLLOW;
        loop {
            if let Ok(Ok(snapshot)) =
                tokio::time::timeout(CANCEL_WAIT, client.get_task(task, 0)).await
            {
                let working = snapshot.state().is_some_and(|s| s.is_active());
                if !working {
                    return Ok(match self.process(snapshot.as_value(), resume).await? {
                        Step::Interrupted => Reattach::Interrupted,
                        Step::Break | Step::Continue => Reattach::No,
                    });
                }
            }
            if tokio::time::Instant::now() >= deadline
                || self.adm.control.is_cancel_requested()
                || self.sink.is_closed()
            {
                return Err(fail(
                    Code::ResumeAlreadyApplied,
                    "The interrupt response has already been applied.",
                ));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// [`Driver::process`] for a fast text delta (`mapping::fast`): what `process` does with such
    /// an item — no id or session change, no metadata — is the cancellation check, the status
    /// text and the WORKING state.
    async fn apply_text_delta(&mut self, d: fast::TextDelta) -> Result<Step, Stop> {
        if self.adm.control.is_cancel_requested() && !self.kernel_cancel_sent {
            self.cancel_task_best_effort().await;
        }
        if self.mapper.continue_text(&d.message_id, &d.text) {
            // The message being streamed goes on: one event, encoded straight from the frame.
            if !self.disconnected
                && self
                    .sink
                    .emit_text_content(&d.message_id, &d.text)
                    .await
                    .is_err()
            {
                self.disconnected = true;
                return Err(Stop::Disconnected);
            }
        } else {
            let mut events = Vec::new();
            self.mapper
                .status_text(Some(d.message_id), &d.text, false, &mut events);
            self.emit_all(events).await?;
        }
        tracing::trace!(state = ?TaskState::Working, "kernel item");
        self.last_state = Some(TaskState::Working);
        Ok(Step::Continue)
    }

    /// A stream that closed while its task was still live. The kernel's reply may go on
    /// elsewhere: an answer delivered twice (the first time by a run that crashed before it could
    /// record it) gets a one-event `inputReceived {duplicate: true}` stream; a pipeline reply can
    /// re-enter on a separate stream. The task is looked at (GetTask): an interrupt or an end
    /// state ends the run as usual, a live task is followed (SubscribeToTask). Bounded by
    /// `budget`; anything that fails leaves the run to end as it would have.
    async fn reattach(&mut self, resume: bool, budget: &mut u8) -> Result<Reattach, Stop> {
        let live = matches!(
            self.last_state,
            None | Some(TaskState::Working) | Some(TaskState::Submitted)
        );
        if *budget == 0
            || !live
            || self.failed_seen
            || self.disconnected
            || self.adm.control.is_cancel_requested()
        {
            return Ok(Reattach::No);
        }
        let (Some(task), Some(client)) = (self.task_id.clone(), self.rt.kernel.client()) else {
            return Ok(Reattach::No);
        };
        *budget -= 1;
        if self.acknowledged_only {
            return self.settle_acknowledged(&client, &task, resume).await;
        }
        let Ok(Ok(snapshot)) = tokio::time::timeout(CANCEL_WAIT, client.get_task(&task, 0)).await
        else {
            return Ok(Reattach::No);
        };
        match self.process(snapshot.as_value(), resume).await? {
            Step::Interrupted => Ok(Reattach::Interrupted),
            Step::Break => Ok(Reattach::No),
            Step::Continue => match client.subscribe_to_task(&task).await {
                Ok(s) => {
                    tracing::debug!(task = %task, "kernel stream closed early; following the task");
                    Ok(Reattach::Stream(s))
                }
                Err(_) => Ok(Reattach::No),
            },
        }
    }

    /// Ends a run whose stream stopped without an interrupt.
    async fn finish(&mut self) -> Result<(), Stop> {
        self.catch_up_deferred().await?;
        let cancelled = self.adm.control.is_cancel_requested();
        match self.last_state {
            Some(TaskState::Completed) | Some(TaskState::InputRequired) if !cancelled => {
                let mut events = Vec::new();
                self.mapper.close_all(&mut events);
                events.push(Event::RunFinished {
                    thread_id: self.thread_id().to_owned(),
                    run_id: self.run_id().to_owned(),
                    outcome: Outcome::Success,
                    usage: self.mapper.usage(),
                });
                self.emit_all(events).await
            }
            Some(TaskState::Canceled) => Err(fail(Code::Cancelled, msg::CANCELLED)),
            _ if cancelled => Err(fail(Code::Cancelled, msg::CANCELLED)),
            Some(TaskState::Failed) | Some(TaskState::Rejected) => {
                Err(fail(Code::A2aExecutionFailed, msg::A2A_FAILED))
            }
            // The stream ended while the task was still live (or its state is unknown): the
            // task may go on running in the kernel, so it is cancelled.
            _ => Err(Stop::Fail {
                code: Code::A2aExecutionFailed,
                message: Cow::Borrowed(msg::A2A_FAILED),
                cancel: true,
            }),
        }
    }

    // ---------------------------------------------------------------- new turn

    async fn init_from_doc(&mut self) -> Option<ThreadDoc> {
        let doc = self.doc().await?;
        if doc.execution.execution_id == self.adm.execution_id {
            self.task_id = doc.execution.task_id.clone();
            self.mapper.text_digests = doc.execution.text_snapshot_digests.clone();
            self.mapper.set_pipeline_state(
                doc.execution.pipeline_open_steps.clone(),
                doc.execution.pipeline_sequence,
            );
        }
        self.session_id = doc.session_id.clone();
        Some(doc)
    }

    async fn new_turn(&mut self) -> Result<(), Stop> {
        self.init_from_doc().await;
        let e = self.session_event();
        self.emit(e).await?;
        let client = self.client().await?;
        if let Some(orphan) = self.adm.orphan_task.take() {
            // D-21: the kernel would refuse a new turn while the orphaned task still runs.
            let tasks = match orphan {
                Orphan::Task(t) => vec![t],
                Orphan::Unknown => orphans_of_context(&client, &self.adm.context_id).await,
            };
            for t in tasks {
                let _ = tokio::time::timeout(CANCEL_WAIT, client.cancel_task(&t)).await;
                wait_not_active(&client, &t).await;
            }
        }
        let um = self
            .adm
            .req
            .user_message
            .clone()
            .expect("new turns carry a validated user message");
        let message = turn(&self.adm, &self.cwd).message(um.message_id, um.parts, None);
        let stream = watch_client(
            &self.sink,
            &mut self.disconnected,
            client.send_streaming_message(&message),
        )
        .await
        .map_err(|e| kernel_error(&e))?;
        self.consume(stream, false).await
    }

    // ---------------------------------------------------------------- guidance (§13)

    async fn guidance(&mut self) -> Result<(), Stop> {
        let doc = self.doc().await;
        self.session_id = doc.as_ref().and_then(|d| d.session_id.clone());
        let Some(task) = doc.and_then(|d| d.execution.task_id) else {
            return Err(fail(Code::ExecutionLost, msg::TASK_TO_RESUME_GONE));
        };
        self.task_id = Some(task.clone());
        let e = self.session_event();
        self.emit(e).await?;
        let client = self.client().await?;
        let um = self
            .adm
            .req
            .user_message
            .clone()
            .expect("guidance carries a validated user message");
        let message = turn(&self.adm, &self.cwd).message(um.message_id, um.parts, Some(&task));
        let mut stream = watch_client(
            &self.sink,
            &mut self.disconnected,
            client.send_streaming_message(&message),
        )
        .await
        .map_err(|e| kernel_error(&e))?;
        loop {
            let next = tokio::select! {
                r = stream.next() => r,
                _ = self.sink.closed(), if !self.disconnected => return Err(Stop::Disconnected),
            };
            match next {
                Ok(Some(result)) => {
                    let view = ItemView::new(&result);
                    if view.task_id().is_some_and(|t| t != task) {
                        return Err(protocol(msg::TASK_CHANGED));
                    }
                    if view.context_id().is_some_and(|c| c != self.adm.context_id) {
                        return Err(protocol(msg::CONTEXT_CHANGED));
                    }
                    match view.state() {
                        Some(TaskState::Failed | TaskState::Rejected | TaskState::AuthRequired) => {
                            return Err(fail(Code::A2aExecutionFailed, msg::A2A_FAILED))
                        }
                        Some(TaskState::Canceled) => {
                            return Err(fail(Code::Cancelled, msg::CANCELLED))
                        }
                        _ => {}
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    return Err(match kernel_error(&e) {
                        Stop::Fail { code, message, .. } => Stop::Fail {
                            code,
                            message,
                            cancel: false,
                        },
                        other => other,
                    })
                }
            }
        }
        self.emit(Event::RunFinished {
            thread_id: self.thread_id().to_owned(),
            run_id: self.run_id().to_owned(),
            outcome: Outcome::Success,
            usage: None,
        })
        .await
    }

    // ---------------------------------------------------------------- resume (§12)

    async fn resume(&mut self, entries: Vec<ResumeEntry>) -> Result<(), Stop> {
        let Some(doc) = self.init_from_doc().await else {
            return Err(fail(Code::ExecutionLost, msg::TASK_TO_RESUME_GONE));
        };
        let mut out = Vec::new();
        self.mapper.reopen_steps(&mut out);
        self.emit_all(out).await?;
        let e = self.session_event();
        self.emit(e).await?;
        let exec = self.adm.execution_id.clone();

        // D-4: answers to expired interrupts.
        if entries.iter().any(|e| {
            doc.expired_interrupts
                .iter()
                .any(|(_, i)| *i == e.interrupt_id)
        }) {
            return Err(fail(Code::ExecutionExpired, msg::EXPIRED));
        }
        let applied = |id: &str| {
            doc.applied_resume_digests
                .iter()
                .find(|a| a.execution_id == exec && a.interrupt_id == id)
                .map(|a| a.digest.clone())
        };
        let task_id = match (&doc.execution.task_id, doc.execution.pending.is_empty()) {
            (Some(t), false) => t.clone(),
            _ => {
                let all_applied = !entries.is_empty()
                    && entries.iter().all(|e| {
                        applied(&e.interrupt_id).as_deref() == Some(&resume_digest(e)[..])
                    });
                return Err(if all_applied {
                    fail(
                        Code::ResumeAlreadyApplied,
                        "The interrupt response has already been applied.",
                    )
                } else {
                    fail(Code::ExecutionLost, msg::TASK_TO_RESUME_GONE)
                });
            }
        };
        let client = self.client().await?;
        let no_cancel = |s: Stop| match s {
            Stop::Fail { code, message, .. } => Stop::Fail {
                code,
                message,
                cancel: false,
            },
            other => other,
        };
        if let Some(session) = doc.session_id.clone() {
            match client
                .ensure_restored(&doc.cwd, &session, Some(&task_id))
                .await
            {
                Ok(a2a::RestoreOutcome::Ready) => {}
                Ok(a2a::RestoreOutcome::NotFound) => {
                    return Err(fail(
                        Code::ExecutionLost,
                        "The iac-code session to resume is unavailable.",
                    ))
                }
                Ok(a2a::RestoreOutcome::BackupNotReady(m)) => {
                    return Err(Stop::Fail {
                        code: Code::SessionBackupNotReady,
                        message: Cow::Owned(m.unwrap_or_else(|| {
                            "Session backup is still synchronizing. Retry after 3 seconds.".into()
                        })),
                        cancel: false,
                    })
                }
                Err(e) => return Err(no_cancel(kernel_error(&e))),
            }
        }
        let task = client
            .get_task(&task_id, 100)
            .await
            .map_err(|e| no_cancel(kernel_error(&e)))?;
        let view = task.view();
        if view.task_id() != Some(task_id.as_str())
            || view.context_id().is_some_and(|c| c != self.adm.context_id)
        {
            return Err(fail(
                Code::A2aProtocolError,
                "The A2A task identity does not match the interrupted run.",
            ));
        }
        if let Some(s) = view.meta().and_then(mapping::session_id) {
            match &self.session_id {
                None => {
                    let s = s.to_owned();
                    self.session_id = Some(s.clone());
                    if !self.update(|d| d.session_id = Some(s)).await {
                        return Err(Stop::Persist(msg::SESSION_NOT_COMMITTED));
                    }
                }
                Some(x) if x != s => return Err(protocol(msg::SESSION_CHANGED)),
                Some(_) => {}
            }
        }
        let mut snapshot_events = Vec::new();
        if let Some(meta) = view.meta() {
            self.mapper.map_meta(meta, &mut snapshot_events);
        }
        // Pipeline catch-up.
        let after = doc
            .execution
            .pipeline_sequence
            .max(self.mapper.pipeline_sequence());
        if let Ok(Some(state)) = client.pipeline_state(&task_id, after).await {
            self.mapper.map_recovery(&state, &mut snapshot_events);
        }
        self.emit_all(snapshot_events).await?;

        // Merge the task's required inputs into pending.
        let known: Vec<String> = doc
            .execution
            .pending
            .iter()
            .map(|(id, _)| id.clone())
            .collect();
        let mut pending: Vec<(String, PendingEntry)> = doc.execution.pending.clone();
        let task_state = view.state();
        if let Some(meta) = view.meta() {
            let found =
                interrupt::required_inputs(meta, || uuid::Uuid::new_v4().simple().to_string());
            let answers_known = entries.iter().any(|e| known.contains(&e.interrupt_id));
            let has_input_keys =
                meta.contains_key("input") || meta.contains_key("pendingPermissions");
            let terminal = task_state.as_ref().is_some_and(TaskState::is_final);
            if terminal || (!answers_known && has_input_keys) {
                pending.clear();
            }
            let ttl = self.rt.cfg.interrupt_ttl_secs;
            let expires_at = (ttl > 0)
                .then(|| interrupt::rfc3339_ms(self.rt.clock.now_ms() + (ttl as i64) * 1000));
            for r in found {
                if applied(&r.id).is_some() {
                    continue;
                }
                if let Some((_, e)) = pending.iter_mut().find(|(id, _)| *id == r.id) {
                    e.sideband |= r.sideband;
                } else {
                    pending.push((
                        r.id,
                        PendingEntry {
                            value: r.value,
                            sideband: r.sideband,
                            expires_at: expires_at.clone(),
                        },
                    ));
                }
            }
        } else if task_state.as_ref().is_some_and(TaskState::is_final) {
            pending.clear();
        }
        // Duplicates.
        let mut ids: Vec<&str> = entries.iter().map(|e| e.interrupt_id.as_str()).collect();
        ids.sort_unstable();
        if ids.windows(2).any(|w| w[0] == w[1]) {
            return Err(fail(
                Code::IncompleteResume,
                "The resume contains duplicate interrupt ids.",
            ));
        }
        // Already-applied pending ids.
        let mut conflict = false;
        pending.retain(|(id, _)| match applied(id) {
            None => true,
            Some(d) => {
                if let Some(e) = entries.iter().find(|e| e.interrupt_id == *id) {
                    if resume_digest(e) != d {
                        conflict = true;
                    }
                }
                false
            }
        });
        if conflict {
            return Err(fail(
                Code::ResumeAlreadyApplied,
                "The interrupt response has already been applied.",
            ));
        }
        let seq = self.mapper.pipeline_sequence();
        let steps = self.mapper.durable_open_steps().clone();
        let pending_now = pending.clone();
        if !self
            .update(|d| {
                d.execution.pending = pending_now;
                d.execution.pipeline_sequence = d.execution.pipeline_sequence.max(seq);
                d.execution.pipeline_open_steps = steps;
            })
            .await
        {
            return Err(Stop::Persist(msg::INTERRUPT_NOT_COMMITTED));
        }
        if pending.is_empty() {
            return Err(fail(Code::ExecutionLost, msg::TASK_TO_RESUME_GONE));
        }
        for e in &entries {
            if pending.iter().any(|(id, _)| *id == e.interrupt_id) {
                continue;
            }
            match applied(&e.interrupt_id) {
                Some(d) if d == resume_digest(e) => {}
                Some(_) => {
                    return Err(fail(
                        Code::ResumeAlreadyApplied,
                        "The interrupt response has already been applied.",
                    ))
                }
                None => {
                    return Err(fail(
                        Code::UnknownInterrupt,
                        "The resume references an unknown interrupt.",
                    ))
                }
            }
        }
        let unanswered: Vec<&String> = pending
            .iter()
            .map(|(id, _)| id)
            .filter(|id| !entries.iter().any(|e| e.interrupt_id == **id))
            .collect();
        if !unanswered.is_empty() {
            if unanswered.iter().any(|id| known.contains(id)) {
                return Err(fail(
                    Code::IncompleteResume,
                    "The resume must resolve every pending interrupt exactly once.",
                ));
            }
            self.paused = true;
            return self.finish_with_interrupt().await;
        }
        // Validate every payload before anything is sent (§12.2).
        let answers: Vec<(ResumeEntry, PendingEntry)> = entries
            .iter()
            .filter_map(|e| {
                pending
                    .iter()
                    .find(|(id, _)| *id == e.interrupt_id)
                    .map(|(_, p)| (e.clone(), p.clone()))
            })
            .collect();
        if answers.is_empty() {
            return Err(fail(
                Code::ResumeAlreadyApplied,
                "The interrupt response has already been applied.",
            ));
        }
        for (e, p) in &answers {
            validate_answer(e, p)?;
        }
        self.deliver(&client, &task_id, answers).await
    }

    /// Delivers every answer (D-17), committing each accepted one before the next.
    async fn deliver(
        &mut self,
        client: &a2a::Client,
        task_id: &str,
        answers: Vec<(ResumeEntry, PendingEntry)>,
    ) -> Result<(), Stop> {
        let all_sideband = answers.iter().all(|(_, p)| is_permission(p) && p.sideband);
        let mut last_stream: Option<a2a::EventStream> = None;
        let count = answers.len();
        for (idx, (entry, pending)) in answers.into_iter().enumerate() {
            let remaining = count - idx - 1;
            let id = entry.interrupt_id.clone();
            let digest = resume_digest(&entry);
            if is_permission(&pending) {
                let decision = match entry.status {
                    ResumeStatus::Cancelled => "deny".to_owned(),
                    ResumeStatus::Resolved => entry
                        .payload
                        .as_ref()
                        .and_then(|p| p.get("decision"))
                        .and_then(Value::as_str)
                        .unwrap_or("deny")
                        .to_owned(),
                };
                let tool_use = match pending.value.get("toolUseId") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Null) | None => "None".into(),
                    Some(v) => canonical::canonical_value(v),
                };
                let part = a2a::Part::permission_answer(&a2a::PermissionAnswer::new(
                    task_id, &id, &tool_use, &decision,
                ));
                if all_sideband {
                    let message = turn(&self.adm, &self.cwd).message(
                        format!("agui-resume-{id}"),
                        vec![part],
                        Some(task_id),
                    );
                    match client.send_message(&message).await {
                        Ok(_) => {}
                        Err(a2a::Error::Rpc(r)) if r.is_backup_not_ready() => {
                            return Err(Stop::Fail {
                                code: Code::SessionBackupNotReady,
                                message: Cow::Borrowed(
                                    "Session backup is still synchronizing. Retry after 3 seconds.",
                                ),
                                cancel: false,
                            })
                        }
                        Err(a2a::Error::Rpc(_)) => {
                            return Err(fail(
                                Code::A2aUnavailable,
                                "The local A2A execution service rejected the interrupt response.",
                            ))
                        }
                        Err(_) => return Err(fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE)),
                    }
                    self.commit_answer(&id, &digest).await?;
                } else {
                    let message = turn(&self.adm, &self.cwd).message(
                        format!("agui-resume-{}-{id}", self.run_id()),
                        vec![part],
                        Some(task_id),
                    );
                    let opened = watch_client(
                        &self.sink,
                        &mut self.disconnected,
                        client.send_streaming_message(&message),
                    )
                    .await;
                    let after = match opened {
                        Ok(stream) => {
                            self.accept(
                                stream,
                                &id,
                                &digest,
                                "The A2A permission response was not accepted.",
                            )
                            .await?
                        }
                        // "pending permission is not active" while the task works: an earlier
                        // delivery of this answer is being carried out (see `accept`).
                        Err(e)
                            if e.is_permission_not_pending()
                                && self.busy_with_earlier_delivery().await =>
                        {
                            self.commit_answer(&id, &digest).await?;
                            self.acknowledged_only = true;
                            After::Acknowledged
                        }
                        Err(e) => {
                            return Err(match kernel_error(&e) {
                                Stop::Fail { code: Code::A2aUnavailable, .. } => Stop::Fail {
                                    code: Code::A2aUnavailable,
                                    message: Cow::Borrowed("The local A2A execution service rejected the interrupt response."),
                                    cancel: false,
                                },
                                other => other,
                            })
                        }
                    };
                    match self.settle(after, remaining).await? {
                        Settled::Ended => return Ok(()),
                        Settled::Next => {}
                        Settled::Last(stream) => last_stream = Some(stream),
                    }
                }
            } else {
                if entry.status == ResumeStatus::Cancelled {
                    client
                        .cancel_task(task_id)
                        .await
                        .map_err(|e| no_cancel_stop(kernel_error(&e)))?;
                    let _ = self.update(mark_terminal).await;
                    return Err(fail(
                        Code::Cancelled,
                        "The execution was cancelled by the interrupt response.",
                    ));
                }
                let answer = answer_text(&entry, &pending);
                if answer.is_empty() {
                    return Err(fail(
                        Code::ResumePayloadInvalid,
                        "The interrupt response does not contain an answer.",
                    ));
                }
                if let Some(tool) = pending
                    .value
                    .get("toolUseId")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                {
                    self.answered_questions
                        .push((tool.to_owned(), answer.clone()));
                }
                let message = turn(&self.adm, &self.cwd).message(
                    format!("agui-resume-{}", self.run_id()),
                    vec![a2a::Part::text(answer.clone())],
                    Some(task_id),
                );
                let stream = watch_client(
                    &self.sink,
                    &mut self.disconnected,
                    client.send_streaming_message(&message),
                )
                .await
                .map_err(|e| kernel_error(&e))?;
                let after = self
                    .accept(
                        stream,
                        &id,
                        &digest,
                        "The A2A interrupt response was not accepted.",
                    )
                    .await?;
                match self.settle(after, remaining).await? {
                    Settled::Ended => return Ok(()),
                    Settled::Next => {}
                    Settled::Last(stream) => last_stream = Some(stream),
                }
            }
        }
        if all_sideband {
            self.deferred_catchup = Some(task_id.to_owned());
            let e = self.session_event();
            self.emit(e).await?;
            let task = client
                .get_task(task_id, 100)
                .await
                .map_err(|e| no_cancel_stop(kernel_error(&e)))?;
            match self.process(task.as_value(), true).await? {
                Step::Interrupted => return Ok(()),
                Step::Break => return self.finish().await,
                Step::Continue => {}
            }
            match client.subscribe_to_task(task_id).await {
                Ok(s) => return self.consume(s, true).await,
                Err(_) => {
                    let task = client
                        .get_task(task_id, 100)
                        .await
                        .map_err(|e| no_cancel_stop(kernel_error(&e)))?;
                    return match self.process(task.as_value(), true).await? {
                        Step::Interrupted => Ok(()),
                        Step::Break => self.finish().await,
                        Step::Continue => Err(fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE)),
                    };
                }
            }
        }
        match last_stream {
            Some(s) => self.consume(s, true).await,
            None => match client.subscribe_to_task(task_id).await {
                Ok(s) => self.consume(s, true).await,
                Err(_) => self.finish().await,
            },
        }
    }

    /// Reads the first item of an answer's stream: acceptance. Commits the answer before anything
    /// else happens, then maps the item.
    async fn accept(
        &mut self,
        mut stream: a2a::EventStream,
        id: &str,
        digest: &str,
        not_accepted: &'static str,
    ) -> Result<After, Stop> {
        match stream.next().await {
            Ok(Some(item)) => {
                self.commit_answer(id, digest).await?;
                if !self.accepted_once {
                    self.accepted_once = true;
                    let e = self.session_event();
                    self.emit(e).await?;
                }
                Ok(match self.process(&item, true).await? {
                    Step::Interrupted => After::Ended,
                    Step::Break => After::Closed,
                    Step::Continue => After::Open(stream),
                })
            }
            Ok(None) => {
                if self.busy_with_earlier_delivery().await {
                    self.commit_answer(id, digest).await?;
                    self.acknowledged_only = true;
                    return Ok(After::Acknowledged);
                }
                Err(fail(Code::A2aUnavailable, not_accepted))
            }
            Err(e) => Err(no_cancel_stop(kernel_error(&e))),
        }
    }

    /// The kernel refused an answer to a pending interrupt (empty stream, or "pending permission
    /// is not active") while its task is working: an earlier delivery of the same answer, by a
    /// run that crashed before it could record it, is being carried out. A task waiting for
    /// input or finished is not: the answer was then really not accepted, and stays pending.
    /// The earlier delivery may still be on its way into the task, so a waiting task is looked
    /// at again for a short while ([`EARLIER_DELIVERY_WAIT`]).
    async fn busy_with_earlier_delivery(&mut self) -> bool {
        let (Some(task), Some(client)) = (self.task_id.clone(), self.rt.kernel.client()) else {
            return false;
        };
        let deadline = tokio::time::Instant::now() + EARLIER_DELIVERY_WAIT;
        loop {
            match tokio::time::timeout(CANCEL_WAIT, client.get_task(&task, 0)).await {
                Ok(Ok(t)) => {
                    if t.state().is_some_and(|s| s.is_active()) {
                        return true;
                    }
                }
                _ => return false,
            }
            if tokio::time::Instant::now() >= deadline || self.sink.is_closed() {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What happens after an answer was accepted: the run ended (interrupt, or the last answer's
    /// stream stopped), the next answer goes out (this stream drained first, D-17), or the last
    /// answer's stream is read to the end of the run.
    async fn settle(&mut self, after: After, remaining: usize) -> Result<Settled, Stop> {
        Ok(match after {
            After::Ended => Settled::Ended,
            After::Acknowledged if remaining == 0 => {
                let (Some(task), Some(client)) = (self.task_id.clone(), self.rt.kernel.client())
                else {
                    return Err(fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE));
                };
                if let Reattach::No = self.settle_acknowledged(&client, &task, true).await? {
                    self.finish().await?;
                }
                Settled::Ended
            }
            After::Acknowledged => Settled::Next,
            After::Closed if remaining == 0 => {
                self.finish().await?;
                Settled::Ended
            }
            After::Closed => Settled::Next,
            After::Open(s) if remaining == 0 => Settled::Last(s),
            After::Open(s) => {
                if self.drain(s).await? {
                    Settled::Ended
                } else {
                    Settled::Next
                }
            }
        })
    }

    /// Reads an answer's stream to its end before the next answer is sent (D-17). Returns true
    /// when the run ended with an interrupt.
    async fn drain(&mut self, mut stream: a2a::EventStream) -> Result<bool, Stop> {
        loop {
            match stream.next().await {
                Ok(Some(item)) => match self.process(&item, true).await? {
                    Step::Interrupted => return Ok(true),
                    Step::Break => return Ok(false),
                    Step::Continue => {}
                },
                Ok(None) => return Ok(false),
                Err(e) => return Err(kernel_error(&e)),
            }
        }
    }

    /// Records an accepted answer and removes it from pending (durable before going on).
    async fn commit_answer(&mut self, interrupt_id: &str, digest: &str) -> Result<(), Stop> {
        let exec = self.adm.execution_id.clone();
        let id = interrupt_id.to_owned();
        let digest = digest.to_owned();
        self.applied_now.push(id.clone());
        if !self
            .update(|d| {
                d.applied_resume_digests.insert(AppliedDigest {
                    execution_id: exec,
                    interrupt_id: id.clone(),
                    digest,
                });
                d.execution.pending.retain(|(p, _)| *p != id);
            })
            .await
        {
            return Err(Stop::Persist(msg::ANSWER_NOT_COMMITTED));
        }
        Ok(())
    }
}

fn no_cancel_stop(s: Stop) -> Stop {
    match s {
        Stop::Fail { code, message, .. } => Stop::Fail {
            code,
            message,
            cancel: false,
        },
        other => other,
    }
}

fn is_permission(p: &PendingEntry) -> bool {
    p.value.get("kind").and_then(Value::as_str) == Some("permission")
}

/// §12.3: SHA-256 of the canonical JSON of `{"status", "payload"}` (raw payload, null if absent).
pub fn resume_digest(e: &ResumeEntry) -> String {
    canonical::digest_value(
        &json!({"status": e.status.as_str(), "payload": e.payload.clone().unwrap_or(Value::Null)}),
    )
}

/// §12.2: payload validation with a Draft 2020-12 validator.
fn validate_answer(e: &ResumeEntry, p: &PendingEntry) -> Result<(), Stop> {
    let payload = match (e.status, is_permission(p)) {
        (ResumeStatus::Cancelled, true) => json!({"decision": "deny"}),
        (ResumeStatus::Cancelled, false) => return Ok(()),
        (ResumeStatus::Resolved, _) => match &e.payload {
            Some(v) => v.clone(),
            None => {
                return Err(fail(
                    Code::ResumePayloadInvalid,
                    "A resolved interrupt requires a payload.",
                ))
            }
        },
    };
    let schema = interrupt::build(&e.interrupt_id, &p.value, None)
        .response_schema
        .unwrap_or(Value::Bool(true));
    let valid = jsonschema::options()
        .with_draft(jsonschema::Draft::Draft202012)
        .build(&schema)
        .map(|v| v.is_valid(&payload))
        .unwrap_or(false);
    if !valid {
        return Err(fail(
            Code::ResumePayloadInvalid,
            "The interrupt response payload is invalid.",
        ));
    }
    Ok(())
}

/// The text sent for a question answer (§12.4).
fn answer_text(e: &ResumeEntry, p: &PendingEntry) -> String {
    let payload = e.payload.clone().unwrap_or(Value::Null);
    if let Some(t) = payload
        .get("freeText")
        .or_else(|| payload.get("free_text"))
        .and_then(Value::as_str)
    {
        return t.to_owned();
    }
    let Some(sel) = payload.get("selectedId").and_then(Value::as_str) else {
        return String::new();
    };
    if let Some(options) = p.value.get("options").and_then(Value::as_array) {
        for o in options {
            let Some(m) = o.as_object() else { continue };
            let oid = m.get("id").map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
            if oid.as_deref() == Some(sel) {
                for k in ["label", "name"] {
                    if let Some(s) = m.get(k).and_then(Value::as_str).filter(|s| !s.is_empty()) {
                        return s.to_owned();
                    }
                }
                return sel.to_owned();
            }
        }
    }
    sel.to_owned()
}

/// The messages of a run share its request's turn settings.
fn turn<'a>(adm: &'a Admitted, cwd: &'a str) -> Turn<'a> {
    Turn {
        iac: &adm.req.iac,
        lang: adm.req.lang,
        cwd,
        context_id: &adm.context_id,
    }
}

/// Waits for a kernel call, noticing a client disconnect meanwhile without abandoning the call:
/// the task id it brings may still be needed for cancellation.
async fn watch_client<T>(
    sink: &Sink,
    disconnected: &mut bool,
    fut: impl std::future::Future<Output = Result<T, a2a::Error>>,
) -> Result<T, a2a::Error> {
    tokio::pin!(fut);
    loop {
        tokio::select! {
            r = &mut fut => return r,
            _ = sink.closed(), if !*disconnected => *disconnected = true,
        }
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// D-21 for a run that crashed before it learnt its task id: the context's submitted and working
/// tasks, and its most recent input-required one (a permission or question wait; when it is a
/// finished turn instead, cancelling it is refused and changes nothing). Bounded: one page each.
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

/// D-21: waits (bounded) until the kernel reports the orphaned task as no longer working.
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
