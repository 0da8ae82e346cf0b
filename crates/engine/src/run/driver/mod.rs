//! The run driver: an admitted run's life, from `RUN_STARTED` to exactly one terminal event.
//!
//! A run is three owned parts and the phases that use them:
//! - its hold on the thread ([`ThreadHold`]): the only way it reads or changes its document;
//! - its output ([`output::Output`]): sink and mapper; it alone sends the terminal event;
//! - its kernel task ([`task::KernelTask`]): the ids the kernel told it, its calls, its one
//!   cancellation.
//!
//! Each mode has its phase file: `turn` (new turns and guidance), `resume` (answers to
//! interrupts, with `deliver`), and `stream` (reading a kernel stream, shared by all). Every path
//! returns an [`End`], and [`Driver::run`] turns it into the terminal event (`RUN_FINISHED`, success
//! or the pending interrupts, or `RUN_ERROR`) and what the end implies for the kernel task.
//!
//! The durability order: what a later run depends on (the task and session ids, an interrupt, an
//! accepted answer) is durable before anything that announces it is sent. A write that fails ends
//! the run failed closed: its task is cancelled and its execution ended.

mod bind;
mod deliver;
mod end;
mod output;
mod resume;
mod stream;
mod task;
mod turn;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use agui::Event;
use bytes::Bytes;
use serde_json::json;
use tokio::sync::mpsc;
use tracing::Instrument as _;

use crate::error::{msg, Code};
use crate::limits::RunSlot;
use crate::mapping::{interrupt, Mapper};
use crate::trace::with_incoming;
use clock::rfc3339_ms;
use store::{Lapse, LastRun, ThreadDoc};

use super::admit::{Admitted, Mode};
use super::hold::{ThreadHold, Unsaved};
use super::replay::RunEvents;
use super::request::Turn;
use super::sink::{Sink, Stop};
use super::RunControl;

use super::Runtime;
use end::{ending, End, Failure, Flow, RunEnd};
use output::Output;
use task::KernelTask;
pub(super) use task::CANCEL_WAIT;

/// Starts the driver of an admitted run; returns the receiving end of its SSE bytes. The run holds
/// `slot` (its place among `--max-runs`) until it ends, detached or not. The run is
/// driven inside `span` (the run's trace span, which ends with it); `trace_headers` are the
/// client's W3C headers, passed on to the kernel when tracing is off.
pub fn spawn_run(
    rt: Arc<Runtime>,
    adm: Admitted,
    slot: RunSlot,
    span: tracing::Span,
    trace_headers: Vec<(http::HeaderName, http::HeaderValue)>,
) -> mpsc::Receiver<Bytes> {
    let grace = rt.detach_grace();
    let replay = (!grace.is_zero()).then(|| {
        let events = RunEvents::limited(
            rt.settings().replay_buffer_bytes,
            grace,
            rt.limits().clone(),
        );
        let (thread, run) = (&adm.req.envelope.thread_id, &adm.req.envelope.run_id);
        rt.replays()
            .insert(thread, run, adm.owner.clone(), events.clone());
        (thread.clone(), run.clone(), events)
    });
    // The lapse of this instance's lease as of the run's start: the run's checks and its sends
    // watch the same one.
    let lapse = rt.threads().store().lease().map(|l| l.watch());
    let stop = Arc::new(RunStop {
        rt: rt.clone(),
        control: adm.control.clone(),
        lapse: lapse.clone(),
    });
    let (sink, rx) = Sink::new(
        rt.channel_capacity(),
        rt.settings().client_stall_timeout,
        stop,
        rt.clock().clone(),
        replay.as_ref().map(|(_, _, e)| e.clone()),
        rt.metrics().clone(),
    );
    let started = std::time::Instant::now();
    rt.metrics().run_started();
    tokio::spawn(async move {
        rt.activity().stream_opened();
        let mut d = Driver::new(rt.clone(), adm, sink, lapse);
        with_incoming(trace_headers, d.run())
            .instrument(span.clone())
            .await;
        let (outcome, code) = d.out.outcome();
        span.record("outcome", outcome.as_str());
        if let Some(c) = code {
            span.record("error_code", c.as_str());
        }
        span.record("event_count", d.out.events_sent() as i64);
        drop(d);
        // The span ends with the run (not with the buffer kept after it).
        drop(span);
        rt.metrics().run_finished(outcome, code, started.elapsed());
        rt.activity().stream_closed(rt.now_ms());
        // The run is over: its slot is free (its buffer may stay for late readers).
        drop(slot);
        // An ended run's events stay for late readers for the grace period.
        if let Some((thread, run, events)) = replay {
            tokio::time::sleep(grace).await;
            rt.replays().remove(&thread, &run, &events);
        }
    });
    rx
}

/// What stops a run while it waits on its client: its cancellation, the drain, its lease
/// lapsing. A send blocked on a client that does not read returns at once, and the run's checks
/// end it for that reason (so the cancellation extension's answer and the run's end agree).
struct RunStop {
    rt: Arc<Runtime>,
    control: Arc<RunControl>,
    lapse: Option<Arc<Lapse>>,
}

impl Stop for RunStop {
    fn wait(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let lapsed = async {
                match &self.lapse {
                    Some(l) => l.wait().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = self.control.cancelled() => {}
                () = self.rt.shutdown().drained() => {}
                () = lapsed => {}
            }
        })
    }
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
    hold: ThreadHold,
    out: Output,
    task: KernelTask,
    answers: Answers,
}

impl Driver {
    fn new(rt: Arc<Runtime>, adm: Admitted, sink: Sink, lapse: Option<Arc<Lapse>>) -> Driver {
        let envelope = &adm.req.envelope;
        let mapper = Mapper::new(&envelope.run_id, Default::default(), &envelope.thread_id);
        // `--transcript-limit 0`: no transcript.
        let limit = rt.settings().caps.transcript_limit;
        let keep = (limit > 0).then(|| output::Keep {
            limit,
            clock: rt.clock().clone(),
            metrics: rt.metrics().clone(),
        });
        let mut out = Output::new(
            sink,
            mapper,
            envelope.dialect,
            adm.req.lang,
            &envelope.thread_id,
            &envelope.run_id,
            keep,
        );
        match (&adm.mode, &adm.req.user_message) {
            (Mode::Resume(entries), _) => out.recorder().answers(entries),
            (_, Some(u)) => out.recorder().user(&u.message_id, &u.parts),
            (_, None) => {}
        }
        let hold = ThreadHold::new(
            rt.threads_arc().clone(),
            adm.slot.clone(),
            adm.hold,
            adm.execution_id.clone(),
            lapse,
        );
        Driver {
            task: KernelTask::new(rt.kernels().first().cloned()),
            rt,
            cwd: adm.req.cwd.to_string_lossy().into_owned(),
            adm,
            hold,
            out,
            answers: Answers::default(),
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
        let parent = self.adm.req.envelope.parent_run_id.clone();
        self.out.start(parent).await?;
        match self.adm.mode.clone() {
            Mode::NewTurn => self.new_turn().await,
            // Boxed: a run holds its driver's future for its whole life (hours when parked); the
            // larger resume state then costs only the runs that resume.
            Mode::Resume(entries) => Box::pin(self.resume(entries)).await,
            Mode::Guidance => Box::pin(self.guidance()).await,
        }
    }

    /// Sends the terminal event of `end`, and does what the end implies for the kernel task.
    async fn conclude(&mut self, end: End) {
        match end {
            End::Finished => {
                let ending = RunEnd {
                    hold: &self.hold,
                    rt: &self.rt,
                    adm: &self.adm,
                };
                self.out.finish(None, &ending).await
            }
            End::Interrupted => match self.pending_interrupts().await {
                Some(interrupts) => {
                    let ending = RunEnd {
                        hold: &self.hold,
                        rt: &self.rt,
                        adm: &self.adm,
                    };
                    self.out.finish(Some(interrupts), &ending).await
                }
                None => {
                    self.fail(End::failure(Code::StateUnavailable, msg::STATE_UNAVAILABLE))
                        .await
                }
            },
            End::Failed(mut f) => {
                // The kernel failed because the egress refused its LLM call: said as that.
                let spent = self.adm.req.budget_refused.as_ref();
                if f.code == Code::A2aExecutionFailed
                    && spent.is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed))
                {
                    f.code = Code::LlmBudgetExhausted;
                    f.message = msg::LLM_BUDGET_EXHAUSTED.into();
                }
                self.fail(f).await
            }
            End::Disconnected => self.on_disconnect().await,
        }
    }

    /// The AG-UI interrupts of the execution's pending entries.
    async fn pending_interrupts(&self) -> Option<Vec<agui::Interrupt>> {
        let doc = self.hold.doc().await?;
        Some(
            doc.execution
                .pending
                .iter()
                .map(|(id, e)| interrupt::build(id, &e.value, e.expires_at.as_deref()))
                .collect(),
        )
    }

    /// A failed run: its task cancelled as the failure says, then `RUN_ERROR` (or the
    /// `cancelled` outcome for a 1.0 client).
    async fn fail(&mut self, f: Failure) {
        if f.fail_closed {
            self.task.cancel().await;
            self.hold.end_execution().await;
        } else if f.cancel_task && self.adm.mode != Mode::Guidance && !self.hold.waiting().await {
            // Guidance runs never cancel the task they inject into; an execution waiting for
            // answers keeps its task.
            self.task.cancel().await;
        }
        let ending = RunEnd {
            hold: &self.hold,
            rt: &self.rt,
            adm: &self.adm,
        };
        self.out.fail(f.code, &f.message, &ending).await;
    }

    /// A client that disconnects from a running turn cancels its kernel task (as soon as its id
    /// is known). A run that ended, or ended in an interrupt, is not cancelled.
    async fn on_disconnect(&mut self) {
        let ended = self.out.ended();
        // Cancelled before the end is written: the end clears the execution's task, and a crash
        // between the two would leave a task that nothing cancels.
        if !(ended || self.adm.mode == Mode::Guidance || self.hold.waiting().await) {
            self.task.cancel().await;
        }
        let ending = RunEnd {
            hold: &self.hold,
            rt: &self.rt,
            adm: &self.adm,
        };
        self.out.abandon(&ending).await;
    }

    /// Releases the thread (guidance runs never held it): its end written before the terminal
    /// event (or here, when no ending was sent), the thread free for its next run.
    async fn release(&mut self) {
        if self.adm.mode == Mode::Guidance {
            return;
        }
        if !self.out.end_written() {
            let (outcome, code) = self.out.outcome();
            let last = LastRun {
                run_id: self.run_id().to_owned(),
                outcome: outcome.into(),
                code: code.map(Into::into),
                ended_at: rfc3339_ms(self.rt.now_ms()),
            };
            let thread_id = &self.adm.req.envelope.thread_id;
            let ids = self.out.mapper().message_ids().clone();
            let _ = self.hold.end_run(thread_id, last, None, &ids).await;
        }
        self.hold.free(&self.adm.req.envelope.run_id).await;
    }

    // ------------------------------------------------------------------ events

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
                "taskId": self.task.id(),
                "rosInvocationId": self.adm.req.iac.ros_invocation_id,
                "sessionId": self.task.session(),
            }),
        }
    }

    async fn emit_session(&mut self) -> Flow {
        let e = self.session_event();
        self.out.emit(e).await
    }

    // ------------------------------------------------------------------ state

    /// [`ThreadHold::edit`] of a recovery-critical change: the run fails closed when it is not
    /// durable. A thread another instance took over (this one was presumed dead) is left to it:
    /// its task is that instance's now, and is not cancelled from here.
    async fn commit(&self, what: &'static str, change: impl FnOnce(&mut ThreadDoc)) -> Flow {
        self.hold
            .edit(change)
            .await
            .map_err(|u| End::unsaved(u, what))
    }

    /// [`ThreadHold::still_held`], before the kernel is asked to act in the thread's name.
    async fn still_held(&self) -> Flow {
        self.hold.still_held().await.map_err(|u| match u {
            Unsaved::Lapsed { late } => End::lapsed(late),
            _ => End::fail(Code::StatePersistenceFailed, msg::TAKEN_OVER),
        })
    }

    /// Takes over what the document knows of the execution (task id, text digests, pipeline
    /// position, session id).
    async fn init_from_doc(&mut self) -> Option<ThreadDoc> {
        let doc = self.hold.doc().await?;
        let task = if doc.is_current(&self.adm.execution_id) {
            self.out.mapper().restore(
                doc.execution.text_snapshot_digests.clone(),
                doc.execution.message_ids.clone(),
                doc.execution.pipeline_open_steps.clone(),
                doc.execution.pipeline_sequence,
            );
            doc.execution.task_id.clone()
        } else {
            None
        };
        self.task.adopt(task, doc.session_id.clone());
        Some(doc)
    }

    /// Records the kernel's session id: durable before it is announced; a different one later
    /// is a protocol violation.
    async fn learn_session(&mut self, session: &str) -> Flow<bool> {
        if !self.task.learn_session(session)? {
            return Ok(false);
        }
        let s = session.to_owned();
        self.commit(msg::SESSION_NOT_COMMITTED, |d| d.session_id = Some(s))
            .await?;
        Ok(true)
    }

    // ------------------------------------------------------------------ kernel

    /// The request's turn settings, for a message to the kernel.
    fn turn(&self) -> Turn<'_> {
        turn(&self.adm, &self.cwd)
    }

    /// Sends a streaming message of the run's turn (see [`KernelTask::send_streaming`]).
    async fn send_streaming(
        &mut self,
        client: &a2a::Client,
        message_id: String,
        parts: Vec<a2a::Part>,
        task_id: Option<&str>,
    ) -> Result<a2a::EventStream, a2a::Error> {
        let message = turn(&self.adm, &self.cwd).message(message_id, parts, task_id);
        self.task
            .send_streaming(client, &message, &mut self.out)
            .await
    }
}

/// The turn settings of an admitted request (a free function: the driver lends its output to the
/// kernel call at the same time).
fn turn<'a>(adm: &'a Admitted, cwd: &'a str) -> Turn<'a> {
    Turn {
        iac: &adm.req.iac,
        lang: adm.req.lang,
        cwd,
        context_id: &adm.context_id,
    }
}

#[cfg(test)]
mod tests;
