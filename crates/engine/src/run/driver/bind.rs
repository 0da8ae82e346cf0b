//! A run's kernel among several: the one its thread is on, or goes to (`kernel::place`),
//! recorded with the thread before the kernel is asked anything, so that every later call about
//! its task (an answer, a lookup, a cancellation) finds it. With one kernel nothing is decided
//! and nothing is written.

use crate::error::{msg, Code};
use kernel::place::Ask;
use kernel::Unplaced;
use store::ThreadDoc;

use super::super::admit::Mode;
use super::task::KERNEL_WAIT;
use super::{Driver, End, Flow};

impl Driver {
    /// Binds the run to its kernel. `may_move`: the run restores the thread's session before it
    /// asks anything else (a new turn, an answer), so a thread whose kernel died may go to
    /// another; guidance joins a task that died with its kernel, and may not.
    pub(super) async fn bind_kernel(&mut self, doc: Option<&ThreadDoc>, may_move: bool) -> Flow {
        let pool = self.rt.kernels().clone();
        if let Some(tenants) = pool.tenants() {
            let tenant = kernel::tenant::user_key(self.adm.req.caller.user.as_deref());
            let recorded = doc.and_then(|d| d.kernel.as_deref());
            let bound = tenants.bind(&tenant, recorded).map_err(|e| match e {
                Unplaced::Busy => End::fail(Code::KernelsBusy, msg::KERNELS_BUSY),
                _ => End::fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE),
            })?;
            // The thread's task ran on a kernel of its user's that is gone: guidance has
            // nothing to join (as when a kernel of a pool died).
            if bound.moved && !may_move && recorded.is_some() {
                return Err(End::fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE));
            }
            return self.bound(bound).await;
        }
        if pool.slots().len() == 1 {
            return Ok(());
        }
        let ask = Ask {
            recorded: doc.and_then(|d| d.kernel.as_deref()),
            legacy: doc.is_some_and(|d| d.session_id.is_some() || d.execution.task_id.is_some()),
            took_over: self.adm.took_over,
            may_move,
        };
        let bound = pool
            .bind(&ask, KERNEL_WAIT)
            .await
            .map_err(|_| End::fail(Code::A2aUnavailable, msg::A2A_UNAVAILABLE))?;
        self.bound(bound).await
    }

    /// Takes the run's place, recording its kernel with the thread when it is new to it.
    async fn bound(&mut self, bound: kernel::Bound) -> Flow {
        let record = bound.record.clone();
        self.task.bind(bound);
        // A guidance run does not hold the thread: it writes nothing (the thread's own runs do).
        if let Some(key) = record.filter(|_| self.adm.mode != Mode::Guidance) {
            self.commit(msg::MAPPING_NOT_COMMITTED, |d| d.kernel = Some(key))
                .await?;
        }
        Ok(())
    }
}
