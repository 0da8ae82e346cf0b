//! The run's kernel task: what the kernel told the run of it (its id, the session it runs in, its
//! last state), the calls that start or follow it, and its one cancellation.
//!
//! The ids are learnt once: a different task or session later is a protocol violation. Making a
//! newly learnt id durable before it is announced is the driver's part (it owns the order).

use std::sync::Arc;
use std::time::Duration;

use a2a::TaskState;

use crate::error::{msg, Code};
use kernel::{Bound, Kernel};

use super::end::{End, Flow};
use super::output::Output;

/// How long a run waits for a starting managed kernel.
pub(super) const KERNEL_WAIT: Duration = Duration::from_secs(60);
/// Bound on best-effort cancellations.
pub(in crate::run) const CANCEL_WAIT: Duration = Duration::from_secs(10);

/// What the kernel told this run of its task so far.
pub(super) struct KernelTask {
    /// None until the run is bound to its user's own kernel (isolation `user`).
    kernel: Option<Arc<Kernel>>,
    /// The run's place in a pool of several kernels (counted in its slot's load until the run
    /// ends); none with one kernel.
    bound: Option<Bound>,
    id: Option<String>,
    session: Option<String>,
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

impl KernelTask {
    pub(super) fn new(kernel: Option<Arc<Kernel>>) -> KernelTask {
        KernelTask {
            kernel,
            bound: None,
            id: None,
            session: None,
            last_state: None,
            failed: false,
            acknowledged_only: false,
            cancel_sent: false,
        }
    }

    /// Binds the run to the kernel of its place in the pool.
    pub(super) fn bind(&mut self, bound: Bound) {
        self.kernel = Some(bound.kernel.clone());
        self.bound = Some(bound);
    }

    /// The thread came from another kernel of the pool: its session is restored first.
    pub(super) fn moved(&self) -> bool {
        self.bound.as_ref().is_some_and(|b| b.moved)
    }

    pub(super) fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    pub(super) fn session(&self) -> Option<&str> {
        self.session.as_deref()
    }

    /// What the thread's document knows already: the execution's task (when it has one) and
    /// the thread's session.
    pub(super) fn adopt(&mut self, task: Option<String>, session: Option<String>) {
        if task.is_some() {
            self.id = task;
        }
        self.session = session;
    }

    /// The task id an item names: `Ok(true)` when it is new to the run (to be made durable and
    /// announced), an error when it differs from the one the run knows.
    pub(super) fn learn_task(&mut self, task: &str) -> Flow<bool> {
        match &self.id {
            None => {
                self.id = Some(task.to_owned());
                Ok(true)
            }
            Some(x) if x != task => Err(End::protocol(msg::TASK_CHANGED)),
            Some(_) => Ok(false),
        }
    }

    /// The session id an item names: `Ok(true)` when it is new to the run, an error when it
    /// differs from the one the run knows.
    pub(super) fn learn_session(&mut self, session: &str) -> Flow<bool> {
        match &self.session {
            None => {
                self.session = Some(session.to_owned());
                Ok(true)
            }
            Some(x) if x != session => Err(End::protocol(msg::SESSION_CHANGED)),
            Some(_) => Ok(false),
        }
    }

    /// A state the kernel reported; `true` when the stream stops there (a final state, or input
    /// required).
    pub(super) fn observe(&mut self, state: TaskState) -> bool {
        tracing::trace!(state = ?state, "kernel item");
        self.failed |= state == TaskState::Failed;
        let stop = state.is_final() || state == TaskState::InputRequired;
        self.last_state = Some(state);
        stop
    }

    pub(super) fn last_state(&self) -> Option<&TaskState> {
        self.last_state.as_ref()
    }

    /// Whether the task may still be running, as far as the run knows.
    pub(super) fn may_be_live(&self) -> bool {
        !self.failed && self.last_state.as_ref().is_none_or(TaskState::is_active)
    }

    pub(super) fn acknowledged_only(&self) -> bool {
        self.acknowledged_only
    }

    pub(super) fn set_acknowledged_only(&mut self) {
        self.acknowledged_only = true;
    }

    /// A kernel client, waiting (bounded) for a managed kernel that is starting.
    pub(super) async fn client(&self) -> Flow<a2a::Client> {
        let unavailable = || End::fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE);
        let kernel = self.kernel.as_ref().ok_or_else(unavailable)?;
        if let Some(c) = kernel.client() {
            return Ok(c);
        }
        kernel.wait_ready(KERNEL_WAIT).await;
        kernel.client().ok_or_else(unavailable)
    }

    /// A client of a kernel that is up now, without waiting (the best-effort calls of a run
    /// that is ending or following its task).
    pub(super) fn client_now(&self) -> Option<a2a::Client> {
        self.kernel.as_ref()?.client()
    }

    /// Sends a streaming message, noticing a client disconnect meanwhile without abandoning the
    /// call: the task id it brings may still be needed for cancellation.
    pub(super) async fn send_streaming(
        &self,
        client: &a2a::Client,
        message: &a2a::Message<'_>,
        out: &mut Output,
    ) -> Result<a2a::EventStream, a2a::Error> {
        let call = client.send_streaming_message(message);
        tokio::pin!(call);
        let gone = out.gone_signal();
        loop {
            tokio::select! {
                r = &mut call => return r,
                _ = gone.wait(), if !out.is_gone() => out.mark_gone(),
            }
        }
    }

    /// Cancels the task once (bounded), if its id is known.
    pub(super) async fn cancel(&mut self) {
        let Some(task) = self.id.clone() else {
            return;
        };
        if self.cancel_sent {
            return;
        }
        self.cancel_sent = true;
        if let Some(c) = self.client_now() {
            let _ = tokio::time::timeout(CANCEL_WAIT, c.cancel_task(&task)).await;
        }
    }

    /// The kernel did not confirm a cancellation in time: the run ends as cancelled.
    pub(super) fn assume_cancelled(&mut self) {
        self.last_state = Some(TaskState::Canceled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task() -> KernelTask {
        KernelTask::new(Some(Kernel::external(
            "http://127.0.0.1:9/",
            None,
            Default::default(),
            None,
        )))
    }

    fn code(e: End) -> Code {
        match e {
            End::Failed(f) => f.code,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn ids_are_learnt_once_and_never_change() {
        let mut t = task();
        assert_eq!(t.learn_task("t1").ok(), Some(true));
        assert_eq!(t.learn_task("t1").ok(), Some(false));
        assert_eq!(
            code(t.learn_task("t2").unwrap_err()),
            Code::A2aProtocolError
        );
        assert_eq!(t.id(), Some("t1"));
        assert_eq!(t.learn_session("s1").ok(), Some(true));
        assert_eq!(t.learn_session("s1").ok(), Some(false));
        assert_eq!(
            code(t.learn_session("s2").unwrap_err()),
            Code::A2aProtocolError
        );
    }

    #[test]
    fn the_documents_ids_are_adopted() {
        let mut t = task();
        t.adopt(Some("t1".into()), Some("s1".into()));
        assert_eq!((t.id(), t.session()), (Some("t1"), Some("s1")));
        // An execution without a task yet keeps what the run learnt.
        t.adopt(None, None);
        assert_eq!((t.id(), t.session()), (Some("t1"), None));
    }

    #[test]
    fn states_stop_the_stream_and_a_failure_is_remembered() {
        let mut t = task();
        assert!(t.may_be_live());
        assert!(!t.observe(TaskState::Working));
        assert!(t.may_be_live());
        assert!(!t.observe(TaskState::Failed) || t.last_state() == Some(&TaskState::Failed));
        assert!(!t.may_be_live());
        // The kernel can go on with WORKING after FAILED: the run still failed.
        t.observe(TaskState::Working);
        assert!(!t.may_be_live());
        let mut t = task();
        assert!(t.observe(TaskState::InputRequired));
        assert!(t.observe(TaskState::Completed));
        assert!(!t.may_be_live());
    }

    #[tokio::test]
    async fn a_task_is_cancelled_once_and_only_when_known() {
        let kernel = testkit::fake_kernel::FakeKernel::start().await;
        let mut t = KernelTask::new(Some(Kernel::external(
            &kernel.url(),
            None,
            Default::default(),
            None,
        )));
        t.cancel().await;
        assert_eq!(
            kernel.calls("CancelTask").len(),
            0,
            "no id: nothing to cancel"
        );
        t.learn_task("task-1").unwrap();
        t.cancel().await;
        t.cancel().await;
        assert_eq!(kernel.calls("CancelTask").len(), 1);
    }
}
