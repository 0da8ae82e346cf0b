//! The run driver: an admitted run's life, from `RUN_STARTED` to exactly one terminal event.
//!
//! Each mode has its file: `turn` (new turns and guidance), `resume` (answers to interrupts, with
//! `deliver`), and `stream` (reading a kernel stream, shared by all). Every path returns an
//! [`End`], and [`Driver::run`] turns it into the terminal event, here and nowhere else, spans
//! balanced first: `RUN_FINISHED` (success or the pending interrupts) or `RUN_ERROR`.
//!
//! The durability order: what a later run depends on (the task and session ids, an interrupt, an
//! accepted answer) is durable before anything that announces it is sent. A write that fails ends
//! the run failed closed: its task is cancelled and its execution ended.

mod deliver;
mod end;
mod resume;
mod stream;
mod turn;

use std::sync::Arc;
use std::time::Duration;

use a2a::TaskState;
use agui::{Dialect, Event, Outcome};
use bytes::Bytes;
use serde_json::json;
use tokio::sync::mpsc;
use tracing::Instrument as _;

use crate::error::{msg, Code};
use crate::i18n;
use crate::mapping::interrupt::rfc3339_ms;
use crate::mapping::{interrupt, Mapper};
use crate::store::{Lapse, LastRun, StoreError, ThreadDoc};
use crate::telemetry::observer::with_incoming;
use crate::telemetry::RunOutcome;

use super::admit::{Admitted, Mode};
use super::replay::RunEvents;
use super::request::Turn;
use super::sink::Sink;

use super::Runtime;
use end::{ending, is_cancelled_outcome, End, Failure, Flow};

/// How long a run waits for a starting managed kernel.
const KERNEL_WAIT: Duration = Duration::from_secs(60);
/// Bound on best-effort cancellations.
pub(super) const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// Starts the driver of an admitted run; returns the receiving end of its SSE bytes. The run is
/// driven inside `span` (the run's trace span, which ends with it); `trace_headers` are the
/// client's W3C headers, passed on to the kernel when tracing is off.
pub fn spawn_run(
    rt: Arc<Runtime>,
    adm: Admitted,
    span: tracing::Span,
    trace_headers: Vec<(axum::http::HeaderName, axum::http::HeaderValue)>,
) -> mpsc::Receiver<Bytes> {
    let grace = rt.detach_grace();
    let replay = (!grace.is_zero()).then(|| {
        let events = RunEvents::new(rt.cfg().replay_buffer_bytes, grace);
        let (thread, run) = (&adm.req.envelope.thread_id, &adm.req.envelope.run_id);
        rt.replays().insert(thread, run, events.clone());
        (thread.clone(), run.clone(), events)
    });
    let (sink, rx) = Sink::new(
        rt.channel_capacity(),
        rt.clock().clone(),
        replay.as_ref().map(|(_, _, e)| e.clone()),
        rt.metrics().clone(),
    );
    let started = std::time::Instant::now();
    rt.metrics().run_started();
    tokio::spawn(async move {
        rt.activity().stream_opened();
        let mut d = Driver::new(rt.clone(), adm, sink);
        with_incoming(trace_headers, d.run())
            .instrument(span.clone())
            .await;
        let (outcome, code) = d.outcome;
        span.record("outcome", outcome.as_str());
        if let Some(c) = code {
            span.record("error_code", c.as_str());
        }
        span.record("event_count", d.sink.events_sent() as i64);
        drop(d);
        // The span ends with the run (not with the buffer kept after it).
        drop(span);
        rt.metrics().run_finished(outcome, code, started.elapsed());
        rt.activity().stream_closed(rt.now_ms());
        // An ended run's events stay for late readers for the grace period.
        if let Some((thread, run, events)) = replay {
            tokio::time::sleep(grace).await;
            rt.replays().remove(&thread, &run, &events);
        }
    });
    rx
}

/// Why a change of the thread's document was not saved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unsaved {
    /// A shared store refused it: the thread is not this instance's (any more).
    NotHeld,
    /// This instance's lease lapsed; `late`: noticed after the whole TTL.
    Lapsed {
        late: bool,
    },
    Failed,
}

/// What the kernel told this run so far.
#[derive(Debug, Default)]
struct Seen {
    task_id: Option<String>,
    session_id: Option<String>,
    last_state: Option<TaskState>,
    /// The kernel reported FAILED (a provider error: the stream may go on with WORKING and
    /// stop; the run failed all the same, and the task is not followed).
    failed: bool,
    /// An answer's stream only acknowledged it: the kernel had it already, or carries the
    /// continuation elsewhere (see `stream::settle_acknowledged`).
    acknowledged_only: bool,
    /// CancelTask was sent.
    cancel_sent: bool,
}

/// The progress of a resume's answers.
#[derive(Debug, Default)]
struct Answers {
    /// Question answers delivered: `(toolUseId, answer)`, sent as `TOOL_CALL_RESULT` when the
    /// kernel goes on.
    questions: Vec<(String, String)>,
    /// Interrupts answered in this run (not re-announced when the kernel repeats them).
    applied: Vec<String>,
    /// The session event after the first accepted answer was sent.
    announced: bool,
    /// Sideband answers were sent: the pipeline's missed events are caught up before the run
    /// ends (the task id).
    catch_up: Option<String>,
}

struct Driver {
    rt: Arc<Runtime>,
    adm: Admitted,
    /// The resolved workspace, as the kernel is told it.
    cwd: String,
    sink: Sink,
    mapper: Mapper,
    seen: Seen,
    answers: Answers,
    /// How the run ended (`lastRun` of the thread, the metrics, the run's span): outcome and
    /// error code.
    outcome: (RunOutcome, Option<Code>),
    /// With a shared store: the lapse of this instance's lease, as of the run's start.
    lapse: Option<Arc<Lapse>>,
}

impl Driver {
    fn new(rt: Arc<Runtime>, adm: Admitted, sink: Sink) -> Driver {
        let envelope = &adm.req.envelope;
        let mapper = Mapper::new(&envelope.run_id, Default::default(), &envelope.thread_id);
        let lapse = rt.threads().store().lease().map(|l| l.watch());
        Driver {
            rt,
            cwd: adm.req.cwd.to_string_lossy().into_owned(),
            adm,
            sink,
            mapper,
            seen: Seen::default(),
            answers: Answers::default(),
            outcome: (RunOutcome::Disconnected, None),
            lapse,
        }
    }

    fn thread_id(&self) -> &str {
        &self.adm.req.envelope.thread_id
    }

    fn run_id(&self) -> &str {
        &self.adm.req.envelope.run_id
    }

    async fn run(&mut self) {
        let end = match self.drive().await {
            Ok(end) | Err(end) => end,
        };
        self.conclude(end).await;
        self.release().await;
    }

    async fn drive(&mut self) -> Flow<End> {
        let started = Event::RunStarted {
            thread_id: self.thread_id().to_owned(),
            run_id: self.run_id().to_owned(),
            parent_run_id: self.adm.req.envelope.parent_run_id.clone(),
            protocol_version: (self.dialect() == Dialect::V1).then_some(agui::PROTOCOL_VERSION),
        };
        self.emit(started).await?;
        match self.adm.mode.clone() {
            Mode::NewTurn => self.new_turn().await,
            // Boxed: a run holds its driver's future for its whole life (hours when parked); the
            // larger resume state then costs only the runs that resume.
            Mode::Resume(entries) => Box::pin(self.resume(entries)).await,
            Mode::Guidance => Box::pin(self.guidance()).await,
        }
    }

    /// Sends the terminal event of `end` (spans balanced first), and what the end implies for
    /// the kernel task.
    async fn conclude(&mut self, end: End) {
        let outcome = match end {
            End::Finished => Outcome::Success,
            End::Interrupted => match self.pending_interrupts().await {
                Some(interrupts) => Outcome::Interrupt(interrupts),
                None => {
                    return self
                        .fail(End::failure(Code::StateUnavailable, msg::STATE_UNAVAILABLE))
                        .await
                }
            },
            End::Failed(f) => return self.fail(f).await,
            End::Disconnected => return self.on_disconnect().await,
        };
        self.outcome = match outcome {
            Outcome::Interrupt(_) => (RunOutcome::Interrupt, None),
            _ => (RunOutcome::Success, None),
        };
        let mut events = Vec::new();
        self.mapper.close_all(&mut events);
        events.push(Event::RunFinished {
            thread_id: self.thread_id().to_owned(),
            run_id: self.run_id().to_owned(),
            outcome,
            usage: self.mapper.usage(),
        });
        let _ = self.emit_all(events).await;
    }

    /// The AG-UI interrupts of the execution's pending entries.
    async fn pending_interrupts(&self) -> Option<Vec<agui::Interrupt>> {
        let doc = self.doc().await?;
        Some(
            doc.execution
                .pending
                .iter()
                .map(|(id, e)| interrupt::build(id, &e.value, e.expires_at.as_deref()))
                .collect(),
        )
    }

    fn dialect(&self) -> Dialect {
        self.adm.req.envelope.dialect
    }

    /// Ends the run with `RUN_ERROR` after balancing spans (a cancellation told to a 1.0 client
    /// is `RUN_FINISHED` with the `cancelled` outcome instead).
    async fn fail(&mut self, f: Failure) {
        if f.fail_closed {
            self.cancel_task().await;
            self.end_execution().await;
        } else if f.cancel_task && self.adm.mode != Mode::Guidance && !self.waiting().await {
            // Guidance runs never cancel the task they inject into; an execution waiting for
            // answers keeps its task.
            self.cancel_task().await;
        }
        if self.sink.terminal_sent() {
            return;
        }
        self.outcome = match f.code {
            Code::Cancelled => (RunOutcome::Cancelled, None),
            code => (RunOutcome::Error, Some(code)),
        };
        let mut events = Vec::new();
        self.mapper.close_all(&mut events);
        events.push(self.terminal_failure(f.code, &f.message));
        let _ = self.emit_all(events).await;
    }

    /// The terminal event of a failure: `RUN_ERROR`, or the `cancelled` outcome for a 1.0 client.
    fn terminal_failure(&self, code: Code, message: &str) -> Event {
        if is_cancelled_outcome(self.dialect(), code) {
            Event::RunFinished {
                thread_id: self.thread_id().to_owned(),
                run_id: self.run_id().to_owned(),
                outcome: Outcome::Cancelled,
                usage: self.mapper.usage(),
            }
        } else {
            Event::RunError {
                message: i18n::tr(self.adm.req.lang, message),
                code: code.as_str().into(),
                usage: self.mapper.usage(),
            }
        }
    }

    /// A client that disconnects from a running turn cancels its kernel task (as soon as its id
    /// is known). A run that ended, or ended in an interrupt, is not cancelled.
    async fn on_disconnect(&mut self) {
        let ended = self.sink.terminal_sent();
        if self.sink.has_replay() && !ended {
            // Nobody is attached, but a late reader of the buffer gets a whole run: spans
            // balanced and one terminal event.
            let mut events = Vec::new();
            self.mapper.close_all(&mut events);
            events.push(self.terminal_failure(Code::Cancelled, msg::ABANDONED));
            for e in events {
                let _ = self.sink.emit(&e).await;
            }
        }
        self.sink.mark_gone();
        if ended || self.adm.mode == Mode::Guidance || self.waiting().await {
            return;
        }
        self.cancel_task().await;
    }

    /// Releases the thread; an execution that ended without pending interrupts becomes terminal.
    async fn release(&mut self) {
        if self.adm.mode == Mode::Guidance {
            return;
        }
        let mut st = self.adm.slot.lock().await;
        if st.hold() != self.adm.hold {
            // The thread is another hold's now: nothing of this run is recorded.
            return;
        }
        if st
            .active
            .as_ref()
            .is_some_and(|a| a.run_id == self.run_id())
        {
            st.active = None;
        }
        let ended = st.doc.as_ref().is_some_and(|d| {
            d.is_current(&self.adm.execution_id)
                && !d.is_waiting()
                && !d.is_terminal(&self.adm.execution_id)
        });
        let last = LastRun {
            run_id: self.run_id().to_owned(),
            outcome: self.outcome.0.into(),
            code: self.outcome.1.map(Into::into),
            ended_at: rfc3339_ms(self.rt.now_ms()),
        };
        let run_id = self.run_id().to_owned();
        let recorded = self
            .rt
            .threads()
            .record(&mut st, |d| {
                if ended {
                    d.end_execution();
                }
                if d.active_run.as_ref().is_some_and(|a| a.run_id == run_id) {
                    d.active_run = None;
                }
                d.last_run = Some(last);
            })
            .await;
        if let Some(Err(e)) = recorded {
            tracing::warn!(error = %e, "end-of-run state write failed");
        }
    }

    /// Ends the run's execution after its task was cancelled: in memory whatever the save says
    /// (nothing may be answered on a cancelled task), on disk if it can.
    async fn end_execution(&self) {
        let mut st = self.adm.slot.lock().await;
        if st.hold() != self.adm.hold {
            return;
        }
        let current = st
            .doc
            .as_ref()
            .is_some_and(|d| d.is_current(&self.adm.execution_id));
        if !current {
            return;
        }
        let recorded = self
            .rt
            .threads()
            .record(&mut st, ThreadDoc::end_execution)
            .await;
        if let Some(Err(e)) = recorded {
            tracing::warn!(error = %e, "state write failed; the execution is ended in memory");
        }
    }

    // ------------------------------------------------------------------ events

    /// Sends an event; once the client is known to be gone, sends nothing and carries on (a run
    /// may still need to read its stream, to learn the task to cancel).
    async fn emit(&mut self, e: Event) -> Flow {
        if self.sink.is_gone() {
            return Ok(());
        }
        Ok(self.sink.emit(&e).await?)
    }

    async fn emit_all(&mut self, events: Vec<Event>) -> Flow {
        for e in events {
            self.emit(e).await?;
        }
        Ok(())
    }

    /// `iac-code.session.v1`: the identities a client needs to cancel (null while unknown).
    fn session_event(&self) -> Event {
        Event::Custom {
            name: "iac-code.session.v1".into(),
            value: json!({
                "schemaVersion": 1,
                "threadId": self.thread_id(),
                "aguiRunId": self.run_id(),
                "executionId": self.adm.execution_id,
                "contextId": self.adm.context_id,
                "taskId": self.seen.task_id,
                "rosInvocationId": self.adm.req.iac.ros_invocation_id,
                "sessionId": self.seen.session_id,
            }),
        }
    }

    async fn emit_session(&mut self) -> Flow {
        let e = self.session_event();
        self.emit(e).await
    }

    // ------------------------------------------------------------------ state

    /// The thread's document (in memory: the run holds the thread).
    async fn doc(&self) -> Option<ThreadDoc> {
        self.adm.slot.lock().await.doc.clone()
    }

    /// Whether the run's execution waits for answers.
    async fn waiting(&self) -> bool {
        self.doc()
            .await
            .is_some_and(|d| d.is_current(&self.adm.execution_id) && d.is_waiting())
    }

    /// Changes the execution's document, durable first. An error when it could not be saved,
    /// or the execution is not the thread's current one any more.
    async fn try_edit(&self, change: impl FnOnce(&mut ThreadDoc)) -> Result<(), Unsaved> {
        let mut st = self.adm.slot.lock().await;
        if st.hold() != self.adm.hold {
            // Admitted in an earlier hold of this instance: the thread moved on without it.
            return Err(Unsaved::NotHeld);
        }
        let current = st
            .doc
            .as_ref()
            .is_some_and(|d| d.is_current(&self.adm.execution_id));
        if !current {
            return Err(Unsaved::Failed);
        }
        match self.rt.threads().edit(&mut st, change).await {
            Some(Ok(())) => Ok(()),
            Some(Err(StoreError::NotHeld(_))) => {
                tracing::warn!("state write refused: the thread is not this instance's any more");
                Err(Unsaved::NotHeld)
            }
            Some(Err(StoreError::LeaseLapsed { late })) => Err(Unsaved::Lapsed { late }),
            Some(Err(e)) => {
                tracing::warn!(error = %e, "state write failed");
                Err(Unsaved::Failed)
            }
            None => Err(Unsaved::Failed),
        }
    }

    /// [`Driver::try_edit`] of a recovery-critical change: the run fails closed when it is not
    /// durable. A thread another instance took over (this one was presumed dead) is left to it:
    /// its task is that instance's now, and is not cancelled from here.
    async fn commit(&self, what: &'static str, change: impl FnOnce(&mut ThreadDoc)) -> Flow {
        match self.try_edit(change).await {
            Ok(()) => Ok(()),
            Err(Unsaved::NotHeld) => Err(End::fail(Code::StatePersistenceFailed, msg::TAKEN_OVER)),
            Err(Unsaved::Lapsed { late }) => Err(End::lapsed(late)),
            Err(Unsaved::Failed) => Err(End::not_committed(what)),
        }
    }

    /// Before the kernel is asked to do something in the thread's name (a turn, an answer):
    /// this instance must still hold the thread and its lease must hold (a shared store; a
    /// store of one instance always does). A lease that holds now holds for the margin before
    /// its TTL, time enough for the request to reach the kernel before anyone could take over.
    async fn still_held(&self) -> Flow {
        if self.adm.slot.lock().await.hold() != self.adm.hold {
            return Err(End::fail(Code::StatePersistenceFailed, msg::TAKEN_OVER));
        }
        match self.rt.threads().store().lease() {
            Some(lease) if !lease.holds() => Err(End::lapsed(lease.is_late())),
            _ => Ok(()),
        }
    }

    /// Takes over what the document knows of the execution (task id, text digests, pipeline
    /// position, session id).
    async fn init_from_doc(&mut self) -> Option<ThreadDoc> {
        let doc = self.doc().await?;
        if doc.is_current(&self.adm.execution_id) {
            self.seen.task_id = doc.execution.task_id.clone();
            self.mapper.text_digests = doc.execution.text_snapshot_digests.clone();
            self.mapper.set_pipeline_state(
                doc.execution.pipeline_open_steps.clone(),
                doc.execution.pipeline_sequence,
            );
        }
        self.seen.session_id = doc.session_id.clone();
        Some(doc)
    }

    /// Records the kernel's session id: durable before it is announced; a different one later
    /// is a protocol violation.
    async fn learn_session(&mut self, session: &str) -> Flow<bool> {
        match &self.seen.session_id {
            None => {
                let s = session.to_owned();
                self.seen.session_id = Some(s.clone());
                self.commit(msg::SESSION_NOT_COMMITTED, |d| d.session_id = Some(s))
                    .await?;
                Ok(true)
            }
            Some(x) if x != session => Err(End::protocol(msg::SESSION_CHANGED)),
            Some(_) => Ok(false),
        }
    }

    // ------------------------------------------------------------------ kernel

    /// A kernel client, waiting (bounded) for a managed kernel that is starting.
    async fn client(&self) -> Flow<a2a::Client> {
        if let Some(c) = self.rt.kernel().client() {
            return Ok(c);
        }
        self.rt.kernel().wait_ready(KERNEL_WAIT).await;
        self.rt
            .kernel()
            .client()
            .ok_or_else(|| End::fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE))
    }

    /// The request's turn settings, for a message to the kernel.
    fn turn(&self) -> Turn<'_> {
        Turn {
            iac: &self.adm.req.iac,
            lang: self.adm.req.lang,
            cwd: &self.cwd,
            context_id: &self.adm.context_id,
        }
    }

    /// Sends a streaming message, noticing a client disconnect meanwhile without abandoning the
    /// call: the task id it brings may still be needed for cancellation.
    async fn send_streaming(
        &mut self,
        client: &a2a::Client,
        message_id: String,
        parts: Vec<a2a::Part>,
        task_id: Option<&str>,
    ) -> Result<a2a::EventStream, a2a::Error> {
        let turn = Turn {
            iac: &self.adm.req.iac,
            lang: self.adm.req.lang,
            cwd: &self.cwd,
            context_id: &self.adm.context_id,
        };
        let message = turn.message(message_id, parts, task_id);
        let call = client.send_streaming_message(&message);
        tokio::pin!(call);
        let sink = &mut self.sink;
        loop {
            tokio::select! {
                r = &mut call => return r,
                _ = sink.closed(), if !sink.is_gone() => sink.mark_gone(),
            }
        }
    }

    /// Cancels the run's kernel task once (bounded), if its id is known.
    async fn cancel_task(&mut self) {
        let Some(task) = self.seen.task_id.clone() else {
            return;
        };
        if self.seen.cancel_sent {
            return;
        }
        self.seen.cancel_sent = true;
        if let Some(c) = self.rt.kernel().client() {
            let _ = tokio::time::timeout(CANCEL_WAIT, c.cancel_task(&task)).await;
        }
    }
}
