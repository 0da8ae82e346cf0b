//! Run admission (§8.2 with D-4, D-20, D-21): under the thread's own lock, decide whether a
//! validated request may start a run, update the binding, and persist before the SSE response.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use crate::error::{msg, ApiError, Code};
use crate::i18n::Lang;
use crate::mapping::interrupt::parse_rfc3339_ms;
use crate::store::{Execution, ThreadDoc};
use crate::validate::{Envelope, IacCode, ResumeEntry, RunMode, UserMessage};

use super::{context_id, ActiveRun, RunControl, Runtime, Slot};

/// A request that passed validation.
#[derive(Debug)]
pub struct RunRequest {
    pub envelope: Envelope,
    pub iac: IacCode,
    /// Resolved workspace.
    pub cwd: PathBuf,
    /// Request digest (§8.1).
    pub digest: String,
    /// The latest user message (new turns and guidance).
    pub user_message: Option<UserMessage>,
    pub lang: Lang,
}

/// What kind of run was admitted.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    NewTurn,
    Resume(Vec<ResumeEntry>),
    Guidance,
}

/// An admitted run.
pub struct Admitted {
    pub req: RunRequest,
    pub mode: Mode,
    pub slot: Arc<Slot>,
    pub control: Arc<RunControl>,
    pub execution_id: String,
    pub context_id: String,
    /// D-21: an orphaned kernel task to cancel before the new turn starts.
    pub orphan_task: Option<Orphan>,
    /// D-4: a task whose interrupts expired, to cancel (best effort).
    pub expired_task: Option<String>,
}

fn new_execution(ros: &str) -> Execution {
    Execution {
        execution_id: uuid::Uuid::new_v4().to_string(),
        ros_invocation_id: ros.to_owned(),
        task_id: None,
        pipeline_sequence: 0,
        pipeline_open_steps: BTreeSet::new(),
        text_snapshot_digests: BTreeSet::new(),
        pending: Vec::new(),
    }
}

/// D-21: the kernel task a crashed run left behind.
#[derive(Debug, Clone, PartialEq)]
pub enum Orphan {
    /// Its id was stored.
    Task(String),
    /// The run died before the kernel's first item: look the task up by context.
    Unknown,
}

/// Marks the current execution terminal (task id cleared, pending cleared).
pub fn mark_terminal(doc: &mut ThreadDoc) {
    doc.terminal_execution_ids
        .insert(doc.execution.execution_id.clone());
    doc.execution.task_id = None;
    doc.execution.pending.clear();
}

/// D-4: if a pending interrupt of the current execution has expired, clears the pending state,
/// remembers the expired ids and makes the execution terminal. Returns the task to cancel.
pub fn expire_if_due(doc: &mut ThreadDoc, now_ms: i64) -> Option<Option<String>> {
    let expired = doc.execution.pending.iter().any(|(_, e)| {
        e.expires_at
            .as_deref()
            .and_then(parse_rfc3339_ms)
            .is_some_and(|t| t <= now_ms)
    });
    if !expired {
        return None;
    }
    let exec = doc.execution.execution_id.clone();
    for (id, _) in &doc.execution.pending {
        doc.expired_interrupts.insert((exec.clone(), id.clone()));
    }
    let task = doc.execution.task_id.clone();
    mark_terminal(doc);
    Some(task)
}

fn err(code: Code, m: &'static str) -> ApiError {
    ApiError::new(code, m)
}

/// Admits a validated request.
pub async fn admit(rt: &Runtime, req: RunRequest) -> Result<Admitted, ApiError> {
    if rt.draining.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(err(Code::A2aUnavailable, msg::SHUTTING_DOWN));
    }
    let thread_id = req.envelope.thread_id.clone();
    let run_id = req.envelope.run_id.clone();
    let guidance = req.iac.active_guidance;
    let mode = if guidance {
        Mode::Guidance
    } else if let Some(entries) = &req.envelope.resume {
        Mode::Resume(entries.clone())
    } else {
        Mode::NewTurn
    };
    let slot = rt.threads.slot(&thread_id);
    let mut st = slot.state.lock().await;
    rt.threads
        .ensure_loaded(&mut st, &thread_id)
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "thread state unavailable");
            err(Code::StateUnavailable, msg::STATE_UNAVAILABLE)
        })?;

    // D-4: expiry on every access.
    let mut expired_task = None;
    let idle = st.active.is_none();
    if let Some(doc) = st.doc.as_mut() {
        if idle {
            let before = doc.clone();
            if let Some(task) = expire_if_due(doc, rt.clock.now_ms()) {
                if let Err(e) = rt.threads.persist(doc).await {
                    tracing::warn!(error = %e, "could not persist interrupt expiry");
                    *doc = before;
                    return Err(err(Code::StateUnavailable, msg::STATE_UNAVAILABLE));
                }
                expired_task = task;
            }
        }
    }

    let before = st.doc.clone();
    let doc = match st.doc.as_mut() {
        None => {
            if mode != Mode::NewTurn {
                return Err(err(Code::ExecutionLost, msg::EXECUTION_GONE));
            }
            st.doc = Some(ThreadDoc {
                thread_id: thread_id.clone(),
                context_id: context_id(&thread_id),
                cwd: req.cwd.to_string_lossy().into_owned(),
                user_id: req.iac.user_id.clone(),
                session_id: None,
                execution: new_execution(&req.iac.ros_invocation_id),
                run_digests: Default::default(),
                applied_resume_digests: Default::default(),
                terminal_execution_ids: Default::default(),
                expired_interrupts: Default::default(),
            });
            st.doc.as_mut().expect("just set")
        }
        Some(doc) => doc,
    };
    let created = before.is_none();

    if let Some(d) = doc.run_digests.get(&run_id) {
        let code = if *d == req.digest {
            Code::DuplicateRunId
        } else {
            Code::RunIdConflict
        };
        st.doc = before;
        return Err(err(code, msg::RUN_ID_USED));
    }
    if st.active.is_some() && mode != Mode::Guidance {
        st.doc = before;
        return Err(err(Code::ThreadBusy, msg::THREAD_BUSY));
    }
    let doc = st.doc.as_mut().expect("doc present");
    if !created && (doc.cwd != req.cwd.to_string_lossy() || doc.user_id != req.iac.user_id) {
        return Err(err(Code::ThreadBindingConflict, msg::BINDING_CONFLICT));
    }
    let mut orphan_task = None;
    match &mode {
        Mode::Guidance => {
            if req.envelope.resume.is_some()
                || req.iac.run_mode != Some(RunMode::Pipeline)
                || doc.execution.task_id.is_none()
            {
                return Err(err(Code::ExecutionLost, msg::EXECUTION_GONE));
            }
            if !doc.execution.pending.is_empty() {
                return Err(err(Code::ResumeRequired, msg::RESUME_REQUIRED));
            }
        }
        Mode::Resume(_) => {
            if doc.execution.ros_invocation_id != req.iac.ros_invocation_id {
                return Err(err(Code::ExecutionLost, msg::RESUME_MISMATCH));
            }
        }
        Mode::NewTurn => {
            if !doc.execution.pending.is_empty() {
                return Err(err(Code::ResumeRequired, msg::RESUME_REQUIRED));
            }
            if !created {
                // D-21: a running execution owned by no run of this process is orphaned.
                if !doc
                    .terminal_execution_ids
                    .contains(&doc.execution.execution_id)
                {
                    // A crash before the task id was stored leaves a task whose id only the
                    // kernel knows (found by context).
                    orphan_task = Some(match &doc.execution.task_id {
                        Some(t) => Orphan::Task(t.clone()),
                        None => Orphan::Unknown,
                    });
                }
                // Rotation (§8.3).
                doc.terminal_execution_ids
                    .insert(doc.execution.execution_id.clone());
                doc.execution = new_execution(&req.iac.ros_invocation_id);
            }
        }
    }
    doc.run_digests.insert(run_id.clone(), req.digest.clone());
    let execution_id = doc.execution.execution_id.clone();
    let context = doc.context_id.clone();
    let snapshot = doc.clone();
    let control = Arc::new(RunControl::default());
    if mode != Mode::Guidance {
        st.active = Some(ActiveRun {
            run_id: run_id.clone(),
            execution_id: execution_id.clone(),
            control: control.clone(),
        });
    }
    if let Err(e) = rt.threads.persist(&snapshot).await {
        tracing::warn!(error = %e, "admission could not be persisted");
        st.doc = before;
        if mode != Mode::Guidance {
            st.active = None;
        }
        return Err(err(Code::StateUnavailable, msg::STATE_UNAVAILABLE));
    }
    drop(st);
    rt.touch();
    Ok(Admitted {
        req,
        mode,
        slot,
        control,
        execution_id,
        context_id: context,
        orphan_task,
        expired_task,
    })
}
