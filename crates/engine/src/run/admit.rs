//! Admission's effects: under the thread's lock, load the document, decide
//! ([`decide::admission`](super::decide::admission)), make the new document durable, and only
//! then answer, so an admitted run id, binding or rotation survives a crash before the stream.

use std::sync::Arc;

use crate::caller as access;
use crate::error::{msg, ApiError, Code};
use crate::limits::GuidanceSlot;
use crate::validate::RunMode;
use clock::rfc3339_ms;
use store::{RunMark, ThreadDoc};

use super::decide::admission::{self, Ask};
pub use super::decide::admission::{Mode, Orphan};
pub use super::request::{NotAdmitted, RunRequest};
use super::{ActiveRun, Holder, RunControl, Runtime, Slot};

/// An admitted run.
pub struct Admitted {
    pub req: RunRequest,
    pub mode: Mode,
    pub slot: Arc<Slot>,
    pub control: Arc<RunControl>,
    pub execution_id: String,
    pub context_id: String,
    /// The kernel task a crashed run left behind, to cancel before the new turn starts.
    pub orphan: Option<Orphan>,
    /// This instance took the thread over from a dead one: the kernel session is restored
    /// from the shared backup before the run talks to the kernel.
    pub took_over: bool,
    /// This instance's hold on the thread the run was admitted in (see `ThreadState::hold`).
    pub hold: u64,
    /// A guidance run's place among its thread's `--max-guidance-per-thread`, held to its end.
    pub guidance: Option<GuidanceSlot>,
    /// Whom the thread belonged to when the run was admitted: only they read its buffered
    /// events (a thread deleted and made again by someone else is not theirs).
    pub owner: Option<String>,
}

fn state_unavailable(e: impl std::fmt::Display) -> ApiError {
    tracing::warn!(error = %e, "thread state unavailable");
    ApiError::new(Code::StateUnavailable, msg::STATE_UNAVAILABLE)
}

/// Admits a validated request, or says why not. Its costly part (images to decode, a workspace
/// to create) is done first, once a trial of the decision says the thread would admit it
/// ([`super::prepare`]); the admission itself is in a span of its own, timed.
pub async fn admit(rt: &Runtime, req: RunRequest) -> Result<Admitted, NotAdmitted> {
    use tracing::Instrument as _;
    // Guidance runs do not hold their thread, so nothing else bounds how many join it: a slot
    // among `--max-guidance-per-thread`, before anything costly (a decode, a workspace) or the
    // store is touched.
    let guidance = match mode_of(&req) {
        // Whose the thread is first: a stranger neither takes nor learns of its places.
        Mode::Guidance
            if !super::hold::may_touch(rt.threads(), &req.caller, &req.envelope.thread_id)
                .await? =>
        {
            strangers_refused(rt, &req);
            return Err(admission::stranger_answer(&Mode::Guidance).into());
        }
        Mode::Guidance => match rt.limits().guidance(&req.envelope.thread_id) {
            Some(g) => Some(g),
            None => {
                let e = ApiError::new(Code::TooManyGuidanceRuns, msg::TOO_MANY_GUIDANCE_RUNS);
                return Err(e.into());
            }
        },
        _ => None,
    };
    // A request refused for its thread (busy, a used run id, another binding…) costs no decode
    // and leaves no directory: the trial first.
    let req = if super::prepare::is_costly(&req) {
        trial(rt, &req).await?;
        super::prepare::costly_part(rt, req).await?
    } else {
        req
    };
    let started = std::time::Instant::now();
    let admitted = admit_now(rt, req, guidance)
        .instrument(tracing::info_span!("agui.admission"))
        .await;
    rt.metrics().admission(started.elapsed());
    admitted
}

/// What `req` gets when its thread is another user's (see `admission::stranger_answer`).
pub fn stranger_answer(req: &RunRequest) -> ApiError {
    admission::stranger_answer(&mode_of(req))
}

/// The kind of run a request asks for.
fn mode_of(req: &RunRequest) -> Mode {
    if req.iac.active_guidance {
        Mode::Guidance
    } else if let Some(entries) = &req.envelope.resume {
        Mode::Resume(entries.clone())
    } else {
        Mode::NewTurn
    }
}

/// The facts of `req` admission decides on.
fn ask_of<'a>(req: &'a RunRequest, mode: &'a Mode, cwd: &'a str) -> Ask<'a> {
    Ask {
        thread_id: &req.envelope.thread_id,
        run_id: &req.envelope.run_id,
        digest: &req.digest,
        mode,
        cwd,
        user_id: req.iac.user_id.as_deref(),
        ros_invocation_id: &req.iac.ros_invocation_id,
        pipeline: req.iac.run_mode == Some(RunMode::Pipeline),
        has_resume: req.envelope.resume.is_some(),
        owner: req.caller.user.as_deref(),
        // Learnt from the store in the admission itself (a trial needs no context).
        incarnation: 0,
    }
}

/// A trial of the decision on the thread as it is now, changing nothing (no save, no expiry, no
/// id consumed): the refusal admission would answer (busy, a used run id, another binding, a
/// resume with nothing to resume…), so that a request refused for it costs no image decode and
/// creates no workspace. The admission decides again (the thread may change meanwhile).
pub async fn trial(rt: &Runtime, req: &RunRequest) -> Result<(), ApiError> {
    if rt.shutdown().is_draining() {
        return Err(ApiError::new(Code::A2aUnavailable, msg::SHUTTING_DOWN));
    }
    // With users' own kernels: a user without one, when every kernel runs other users' turns,
    // is told before the stream starts (with a time to retry).
    if let Some(tenants) = rt.kernels().tenants() {
        if !tenants.would_seat(&kernel::tenant::user_key(req.caller.user.as_deref())) {
            return Err(ApiError::new(Code::KernelsBusy, msg::KERNELS_BUSY));
        }
    }
    let mode = mode_of(req);
    let thread_id = req.envelope.thread_id.as_str();
    let slot = rt.threads().slot(thread_id);
    let st = rt
        .threads()
        .lock(&slot, thread_id)
        .await
        .map_err(state_unavailable)?;
    let cwd = req.cwd.to_string_lossy();
    let ask = ask_of(req, &mode, &cwd);
    let decision = admission::decide(
        st.doc(),
        st.active().is_some(),
        &ask,
        rt.now_ms(),
        &mut String::new,
    );
    if decision.stranger {
        strangers_refused(rt, req);
    }
    decision.verdict.map(drop)
}

/// The audit of a request refused for another user's thread.
fn strangers_refused(rt: &Runtime, req: &RunRequest) {
    access::not_theirs(
        &**rt.metrics(),
        access::RUN_ROUTE,
        &req.caller,
        &req.envelope.thread_id,
    );
}

async fn admit_now(
    rt: &Runtime,
    req: RunRequest,
    guidance: Option<GuidanceSlot>,
) -> Result<Admitted, NotAdmitted> {
    if rt.shutdown().is_draining() {
        return Err(ApiError::new(Code::A2aUnavailable, msg::SHUTTING_DOWN).into());
    }
    let mode = mode_of(&req);
    let thread_id = req.envelope.thread_id.as_str();
    let slot = rt.threads().slot(thread_id);
    let mut st = rt
        .threads()
        .lock_for_admission(&slot, thread_id)
        .await
        .map_err(state_unavailable)?;
    let cwd = req.cwd.to_string_lossy();
    let ask = ask_of(&req, &mode, &cwd);
    let now = rt.now_ms();
    let mut decided = None;
    // The decision is made on the thread's current document inside the store's admission (with
    // a shared store: under the row's lock, in one transaction with the save).
    let decide = |doc: Option<&ThreadDoc>, held: bool, incarnation: u64| {
        let ask = Ask { incarnation, ..ask };
        let mut decision = admission::decide(doc, held, &ask, now, &mut || {
            uuid::Uuid::new_v4().to_string()
        });
        // The run that holds the thread is durable with its admission: a thread whose run was
        // lost with its process says so (`GET /threads/{threadId}`).
        if let (Some(doc), Ok(a)) = (&mut decision.doc, &decision.verdict) {
            if a.holds_thread {
                doc.active_run = Some(RunMark {
                    run_id: ask.run_id.to_owned(),
                    since: rfc3339_ms(now),
                });
            }
        }
        let next = decision.doc.take();
        decided = Some((decision.verdict, decision.expired, decision.stranger));
        next
    };
    let holder = rt
        .threads()
        .admit(&mut st, thread_id, Box::new(decide))
        .await
        .map_err(state_unavailable)?;
    let took_over = match holder {
        Holder::Elsewhere(peer) => return Err(NotAdmitted::HeldElsewhere(peer)),
        Holder::Here { took_over } => took_over,
    };
    let Some((verdict, expired, stranger)) = decided else {
        return Err(state_unavailable("no admission decision").into());
    };
    if stranger {
        strangers_refused(rt, &req);
    }
    // The task of interrupts that expired waits for answers nobody may give any more.
    if let Some(e) = expired {
        rt.cancel_task_later(e.kernel.as_deref(), e.task);
    }
    let admission = verdict?;
    let control = Arc::new(RunControl::default());
    let hold = st.hold();
    let owner = st.doc().and_then(|d| d.owner_or_user()).map(str::to_owned);
    if admission.holds_thread {
        st.set_active(Some(ActiveRun {
            since_ms: rt.now_ms(),
            run_id: req.envelope.run_id.clone(),
            execution_id: admission.execution_id.clone(),
            control: control.clone(),
        }));
    }
    drop(st);
    rt.touch();
    Ok(Admitted {
        req,
        mode,
        slot,
        control,
        execution_id: admission.execution_id,
        context_id: admission.context_id,
        orphan: admission.orphan,
        took_over,
        hold,
        guidance,
        owner,
    })
}
