//! `POST /extensions/iac-code/v1/executions/{executionId}/subscribe`: an observer of a thread's
//! running execution, as iac-code's adapter after 0.16.0 serves it (its session handoff follows a
//! task this way).
//!
//! The body is exactly `{threadId, runId, rosInvocationId, afterSequence?}`. The execution must
//! be the thread's current one with a known task, else 404 `EXECUTION_NOT_FOUND` (as for a
//! thread the caller may not touch); its invocation must be the body's and `runId` a run of the
//! thread, else 409 `EXECUTION_IDENTITY_CHANGED`. The kernel is asked for the task before the
//! stream (`GetTask`): one it does not know is 404 too, a kernel it cannot reach 503.
//!
//! The stream: `RUN_STARTED` with the body's run id, the session event, the task's current state
//! mapped as a run maps it, then its live updates (`SubscribeToTask`) while it runs, ending with
//! exactly one terminal event: `RUN_FINISHED` with the interrupts it waits for (input-required
//! with input not yet answered), `RUN_FINISHED` success (completed, canceled, input-required
//! without such input), `RUN_ERROR` `EXECUTION_FAILED` (failed, rejected, auth-required; upstream
//! sends `RUN_FINISHED` after it, which AG-UI forbids), or `RUN_ERROR` when the kernel breaks off
//! or the gateway stops. `afterSequence` is the pipeline event sequence the observer saw last:
//! pipeline events up to it are not sent again. An observer holds no lock, changes nothing of
//! the thread, and its leaving cancels nothing; it takes one of `--max-runs` while it lasts.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use a2a::{ItemView, TaskState};
use agui::{Event, Outcome};
use bytes::Bytes;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::auth::access::OBSERVE_ROUTE;
use crate::auth::Caller;
use crate::error::{msg, ApiError, Code};
use crate::threads_api::read_theirs;
use engine::bounded::is_bounded;
use engine::i18n::Lang;
use engine::limits::RunSlot;
use engine::mapping::{interrupt, Mapper};
use engine::run::sink::{Sink, Stop};
use engine::run::terminal::Terminal;
use engine::run::Runtime;
use store::ThreadDoc;

/// How long the kernel may take to show the task before the stream starts.
const GET_TASK_WAIT: Duration = Duration::from_secs(30);
/// History the task snapshot carries (its trailing text is the state shown).
const HISTORY: u32 = 100;

/// What an observer asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub thread_id: String,
    pub run_id: String,
    pub ros_invocation_id: String,
    pub after_sequence: Option<u64>,
}

fn not_found() -> ApiError {
    ApiError::new(Code::ExecutionNotFound, msg::EXECUTION_NOT_FOUND)
}

/// The body (pure): exactly its four members, the three ids non-empty strings within the bound
/// of ids, `afterSequence` a non-negative integer (null: none).
pub fn parse(obj: &Map<String, Value>) -> Result<Observation, ApiError> {
    let bad = || ApiError::new(Code::InvalidInput, msg::OBSERVE_FIELDS);
    let known = |k: &str| {
        matches!(
            k,
            "threadId" | "runId" | "rosInvocationId" | "afterSequence"
        )
    };
    if !obj.keys().all(|k| known(k)) {
        return Err(bad());
    }
    let text = |k: &str| {
        obj.get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(bad)
    };
    let (thread_id, run_id, ros_invocation_id) =
        (text("threadId")?, text("runId")?, text("rosInvocationId")?);
    let after_sequence = match obj.get("afterSequence") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(bad)?),
    };
    for (id, refusal) in [
        (&thread_id, msg::ID_THREAD),
        (&run_id, msg::ID_RUN),
        (&ros_invocation_id, msg::ID_INVOCATION),
    ] {
        if !is_bounded(id) {
            return Err(ApiError::new(Code::InvalidInput, refusal));
        }
    }
    Ok(Observation {
        thread_id,
        run_id,
        ros_invocation_id,
        after_sequence,
    })
}

/// What the thread's document says of the observed execution.
#[derive(Debug, Clone, PartialEq)]
struct Target {
    execution_id: String,
    task_id: String,
    context_id: String,
    session_id: Option<String>,
    /// The kernel of a pool the thread is on.
    kernel: Option<String>,
    text_digests: BTreeSet<String>,
    message_ids: BTreeSet<String>,
    open_steps: BTreeSet<String>,
    /// The pending interrupts' expiry, by id.
    expiries: HashMap<String, Option<String>>,
    /// Interrupts of the execution already answered.
    applied: BTreeSet<String>,
}

/// The execution observed, or why not (pure): no current task is 404, a task that is not the
/// one the body names (another execution, invocation or a run the thread never had) is 409.
fn target(doc: &ThreadDoc, execution_id: &str, o: &Observation) -> Result<Target, ApiError> {
    let Some(task_id) = doc.execution.task_id.clone() else {
        return Err(not_found());
    };
    if !doc.is_current(execution_id)
        || doc.execution.ros_invocation_id != o.ros_invocation_id
        || !doc.run_digests.contains_key(&o.run_id)
    {
        return Err(ApiError::new(
            Code::ExecutionIdentityChanged,
            msg::OBSERVED_IDENTITY_CHANGED,
        ));
    }
    let e = &doc.execution;
    Ok(Target {
        execution_id: execution_id.to_owned(),
        task_id,
        context_id: doc.context_id.clone(),
        session_id: doc.session_id.clone(),
        kernel: doc.kernel.clone(),
        text_digests: e.text_snapshot_digests.clone(),
        message_ids: e.message_ids.clone(),
        open_steps: e.pipeline_open_steps.clone(),
        expiries: e
            .pending
            .iter()
            .map(|(id, p)| (id.clone(), p.expires_at.clone()))
            .collect(),
        applied: doc
            .applied_resume_digests
            .iter()
            .filter(|a| a.execution_id == execution_id)
            .map(|a| a.interrupt_id.clone())
            .collect(),
    })
}

/// How an observation ends, from one kernel item (pure): its state and whether it asks for
/// input not yet answered. `None`: the task goes on.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ending {
    /// Waits for answers: `RUN_FINISHED` with them.
    Interrupt,
    Success,
    Failed,
}

fn ending(state: Option<&TaskState>, asks: bool) -> Option<Ending> {
    if asks {
        return Some(Ending::Interrupt);
    }
    match state? {
        TaskState::InputRequired | TaskState::Completed | TaskState::Canceled => {
            Some(Ending::Success)
        }
        TaskState::Failed | TaskState::Rejected | TaskState::AuthRequired => Some(Ending::Failed),
        _ => None,
    }
}

/// Sends to an observer wait at most the stall timeout, and not past the gateway's drain.
struct Draining(Arc<Runtime>);

impl Stop for Draining {
    fn wait(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(self.0.shutdown().drained())
    }
}

/// Checks the observation, asks the kernel for the task, and starts the stream: its frames.
pub async fn observe(
    rt: &Arc<Runtime>,
    caller: &Caller,
    execution_id: &str,
    o: Observation,
    lang: Lang,
) -> Result<mpsc::Receiver<Bytes>, ApiError> {
    if !is_bounded(execution_id) {
        return Err(not_found());
    }
    // Another user's thread is, to this caller, one that does not exist.
    let target = read_theirs(rt, OBSERVE_ROUTE, caller, &o.thread_id, |_, doc| {
        target(doc, execution_id, &o)
    })
    .await
    .map_err(|e| match e.code {
        Code::ThreadNotFound => not_found(),
        _ => e,
    })??;
    if rt.shutdown().is_draining() {
        return Err(ApiError::new(Code::A2aUnavailable, msg::SHUTTING_DOWN));
    }
    // An observer holds a run's slot, its user's included: watching is bounded as running is.
    let slot = rt
        .limits()
        .run(caller.user.as_deref())
        .map_err(engine::limits::refused_run)?;
    let unavailable = || ApiError::new(Code::A2aUnavailable, msg::A2A_UNAVAILABLE);
    let client = rt
        .kernels()
        .of_thread(target.kernel.as_deref())
        .and_then(|k| k.client())
        .ok_or_else(unavailable)?;
    let snapshot = match tokio::time::timeout(
        GET_TASK_WAIT,
        client.get_task(&target.task_id, HISTORY),
    )
    .await
    {
        Ok(Ok(t)) => t,
        Ok(Err(e)) if e.is_task_gone() => return Err(not_found()),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the observed task could not be read");
            return Err(unavailable());
        }
        Err(_) => return Err(unavailable()),
    };
    let (sink, rx) = Sink::new(
        rt.channel_capacity(),
        rt.settings().client_stall_timeout,
        Arc::new(Draining(rt.clone())),
        rt.clock().clone(),
        None,
        rt.metrics().clone(),
    );
    let mut mapper = Mapper::new(&o.run_id, BTreeSet::new(), &o.thread_id);
    mapper.restore(
        target.text_digests.clone(),
        target.message_ids.clone(),
        target.open_steps.clone(),
        o.after_sequence.unwrap_or(0),
    );
    let observer = Observer {
        rt: rt.clone(),
        client,
        target,
        o,
        lang,
        sink,
        mapper,
        _slot: slot,
    };
    let span = tracing::info_span!("agui.observe", otel.kind = "server",
        thread_id = %observer.o.thread_id, execution_id = %observer.target.execution_id);
    tokio::spawn(tracing::Instrument::instrument(
        observer.run(snapshot),
        span,
    ));
    Ok(rx)
}

/// One observer's stream.
struct Observer {
    rt: Arc<Runtime>,
    client: a2a::Client,
    target: Target,
    o: Observation,
    lang: Lang,
    sink: Sink,
    mapper: Mapper,
    _slot: RunSlot,
}

/// Why the stream stops early.
enum Stopped {
    /// The client left: nothing more is sent, nothing is cancelled.
    Gone,
    /// One terminal event, then nothing.
    End(Event),
}

impl Observer {
    async fn run(mut self, snapshot: a2a::Task) {
        let rt = self.rt.clone();
        rt.activity().stream_opened();
        let end = match self.follow(snapshot).await {
            Ok(e) | Err(Stopped::End(e)) => Some(e),
            Err(Stopped::Gone) => None,
        };
        if let Some(end) = end {
            let mut events = Vec::new();
            self.mapper.close_all(&mut events);
            events.push(end);
            for e in events {
                if self.sink.emit(&e).await.is_err() {
                    break;
                }
            }
        }
        rt.activity().stream_closed(rt.now_ms());
    }

    /// The stream up to its terminal event (returned, not sent).
    async fn follow(&mut self, snapshot: a2a::Task) -> Result<Event, Stopped> {
        let started = Event::RunStarted {
            thread_id: self.o.thread_id.clone(),
            run_id: self.o.run_id.clone(),
            parent_run_id: None,
            protocol_version: None,
        };
        self.emit(started).await?;
        let session = self.session_event();
        self.emit(session).await?;
        if let Some(end) = self.item(snapshot.as_value()).await? {
            return Ok(end);
        }
        let task = self.target.task_id.clone();
        let mut stream = match self.client.subscribe_to_task(&task).await {
            Ok(s) => s,
            // It stopped between the two calls (the kernel follows running tasks only).
            Err(_) => return self.settle().await,
        };
        let rt = self.rt.clone();
        let gone = self.sink.gone_signal();
        let mut drained = std::pin::pin!(rt.shutdown().drained());
        let mut client_gone = std::pin::pin!(gone.wait());
        loop {
            let next = tokio::select! {
                n = stream.next() => n,
                () = client_gone.as_mut() => return Err(Stopped::Gone),
                () = drained.as_mut() => {
                    return Err(self.failure(Code::A2aUnavailable, msg::SHUTTING_DOWN));
                }
            };
            match next {
                Ok(Some(item)) => {
                    if let Some(end) = self.item(&item).await? {
                        return Ok(end);
                    }
                }
                Ok(None) | Err(_) => return self.settle().await,
            }
        }
    }

    /// The subscription ended before the task did, or could not be made: the task as it is now
    /// decides; one still running is an error (the kernel broke off).
    async fn settle(&mut self) -> Result<Event, Stopped> {
        let task = self.target.task_id.clone();
        let read = tokio::time::timeout(GET_TASK_WAIT, self.client.get_task(&task, 0)).await;
        if let Ok(Ok(now)) = read {
            if let Some(end) = self.item(now.as_value()).await? {
                return Ok(end);
            }
        }
        Err(self.failure(Code::A2aUnavailable, msg::A2A_UNAVAILABLE))
    }

    /// One kernel item mapped and sent; the terminal event when it ends the observation.
    async fn item(&mut self, item: &Value) -> Result<Option<Event>, Stopped> {
        let view = ItemView::new(item);
        if view.task_id().is_some_and(|t| t != self.target.task_id) {
            return Err(self.failure(Code::A2aProtocolError, msg::TASK_CHANGED));
        }
        if view
            .context_id()
            .is_some_and(|c| c != self.target.context_id)
        {
            return Err(self.failure(Code::A2aProtocolError, msg::CONTEXT_CHANGED));
        }
        let mut events = Vec::new();
        self.mapper.map_item(view.obj, &mut events);
        for e in events {
            self.emit(e).await?;
        }
        let asked: Vec<agui::Interrupt> = view
            .meta()
            .map(|m| interrupt::required_inputs(m, || uuid::Uuid::new_v4().simple().to_string()))
            .unwrap_or_default()
            .into_iter()
            .filter(|r| !self.target.applied.contains(&r.id))
            .map(|r| {
                let expires = self.target.expiries.get(&r.id).cloned().flatten();
                interrupt::build(&r.id, &r.value, expires.as_deref())
            })
            .collect();
        Ok(match ending(view.state().as_ref(), !asked.is_empty()) {
            None => None,
            Some(Ending::Interrupt) => Some(self.finished(Outcome::Interrupt(asked))),
            Some(Ending::Success) => Some(self.finished(Outcome::Success)),
            Some(Ending::Failed) => {
                Some(self.error_event(Code::ExecutionFailed, msg::OBSERVED_EXECUTION_FAILED))
            }
        })
    }

    async fn emit(&mut self, e: Event) -> Result<(), Stopped> {
        self.sink.emit(&e).await.map_err(|_| Stopped::Gone)
    }

    fn finished(&self, outcome: Outcome) -> Event {
        self.terminal().finished(outcome)
    }

    fn failure(&self, code: Code, message: &str) -> Stopped {
        Stopped::End(self.error_event(code, message))
    }

    fn error_event(&self, code: Code, message: &str) -> Event {
        self.terminal().error(self.lang, code, message)
    }

    fn terminal(&self) -> Terminal<'_> {
        Terminal {
            thread_id: &self.o.thread_id,
            run_id: &self.o.run_id,
            usage: self.mapper.usage(),
        }
    }

    /// `iac-code.session.v1`, as the runs of the execution send it (the observer's run id).
    fn session_event(&self) -> Event {
        Event::Custom {
            name: "iac-code.session.v1".into(),
            value: json!({
                "schemaVersion": 1,
                "threadId": self.o.thread_id,
                "aguiRunId": self.o.run_id,
                "executionId": self.target.execution_id,
                "contextId": self.target.context_id,
                "taskId": self.target.task_id,
                "rosInvocationId": self.o.ros_invocation_id,
                "sessionId": self.target.session_id,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use store::{Execution, PendingEntry};

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn the_body_is_exactly_its_four_members() {
        let o = parse(&body(
            json!({"threadId": "t", "runId": "r", "rosInvocationId": "i"}),
        ))
        .unwrap();
        assert_eq!((o.thread_id.as_str(), o.after_sequence), ("t", None));
        let o = parse(&body(
            json!({"threadId": "t", "runId": "r", "rosInvocationId": "i", "afterSequence": 7}),
        ))
        .unwrap();
        assert_eq!(o.after_sequence, Some(7));
        for bad in [
            json!({"threadId": "t", "runId": "r"}),
            json!({"threadId": "t", "runId": "r", "rosInvocationId": ""}),
            json!({"threadId": 1, "runId": "r", "rosInvocationId": "i"}),
            json!({"threadId": "t", "runId": "r", "rosInvocationId": "i", "other": 1}),
            json!({"threadId": "t", "runId": "r", "rosInvocationId": "i", "afterSequence": -1}),
            json!({"threadId": "t", "runId": "r", "rosInvocationId": "i", "afterSequence": "3"}),
            json!({"threadId": "t", "runId": "r", "rosInvocationId": "i", "afterSequence": 1.5}),
        ] {
            let e = parse(&body(bad.clone())).unwrap_err();
            assert_eq!(
                (e.code, &*e.message),
                (Code::InvalidInput, msg::OBSERVE_FIELDS),
                "{bad}"
            );
        }
        let long = "x".repeat(257);
        let e = parse(&body(
            json!({"threadId": long, "runId": "r", "rosInvocationId": "i"}),
        ))
        .unwrap_err();
        assert_eq!(e.message, msg::ID_THREAD);
        let e = parse(&body(
            json!({"threadId": "t", "runId": "r\n", "rosInvocationId": "i"}),
        ))
        .unwrap_err();
        assert_eq!(e.message, msg::ID_RUN);
    }

    fn doc() -> ThreadDoc {
        let mut d = ThreadDoc::new("t", "ctx", "/w", None, Execution::new("exec-1", "inv-1"));
        d.execution.task_id = Some("task-1".into());
        d.run_digests.insert("r1".into(), "d".into());
        d.execution.pending.push((
            "perm-1".into(),
            PendingEntry {
                value: Map::new(),
                sideband: false,
                expires_at: Some("2026-12-07T00:00:00.000Z".into()),
            },
        ));
        d
    }

    fn obs(run: &str, ros: &str) -> Observation {
        Observation {
            thread_id: "t".into(),
            run_id: run.into(),
            ros_invocation_id: ros.into(),
            after_sequence: None,
        }
    }

    #[test]
    fn the_current_execution_with_a_task_and_the_bodys_identity_is_observed() {
        let t = target(&doc(), "exec-1", &obs("r1", "inv-1")).unwrap();
        assert_eq!(
            (t.task_id.as_str(), t.context_id.as_str()),
            ("task-1", "ctx")
        );
        assert_eq!(
            t.expiries["perm-1"].as_deref(),
            Some("2026-12-07T00:00:00.000Z")
        );
        // Another execution, invocation or a run the thread never had: the identity changed.
        for (exec, o) in [
            ("exec-0", obs("r1", "inv-1")),
            ("exec-1", obs("r1", "inv-2")),
            ("exec-1", obs("r9", "inv-1")),
        ] {
            let e = target(&doc(), exec, &o).unwrap_err();
            assert_eq!(e.code, Code::ExecutionIdentityChanged, "{exec} {o:?}");
        }
        // No task (not known yet, or the execution ended): not found, before the identity.
        let mut ended = doc();
        ended.end_execution();
        for exec in ["exec-1", "exec-0"] {
            let e = target(&ended, exec, &obs("r1", "inv-1")).unwrap_err();
            assert_eq!(e.code, Code::ExecutionNotFound);
        }
    }

    #[test]
    fn an_observation_ends_where_a_run_would() {
        use TaskState::*;
        assert_eq!(ending(Some(&Working), true), Some(Ending::Interrupt));
        assert_eq!(ending(Some(&InputRequired), true), Some(Ending::Interrupt));
        for s in [InputRequired, Completed, Canceled] {
            assert_eq!(ending(Some(&s), false), Some(Ending::Success), "{s:?}");
        }
        for s in [Failed, Rejected, AuthRequired] {
            assert_eq!(ending(Some(&s), false), Some(Ending::Failed), "{s:?}");
        }
        for s in [Submitted, Working] {
            assert_eq!(ending(Some(&s), false), None);
        }
        assert_eq!(ending(None, false), None);
    }
}
