//! Admission: whether a validated request may start a run on its thread, and what the thread's
//! document becomes if it does.
//!
//! The checks, in order (the first that fails answers): a thread another user owns is, to the
//! caller, one that does not exist, except that its id cannot be taken (`THREAD_ID_TAKEN`; no
//! other state of it shows); interrupts due to expire are expired (a
//! thread no run holds only); a thread without a document accepts only a new turn; a run id is
//! used once (the same request again is `DUPLICATE_RUN_ID`, another one `RUN_ID_CONFLICT`); a
//! thread holds one run at a time (guidance runs join the running one); a thread stays bound to
//! its first workspace and caller; then the rules of each mode. A new turn on a thread whose
//! execution ended starts a new execution; one whose execution is still marked running, with no
//! run of this process holding the thread, left an orphaned kernel task behind (a crash), which
//! must be cancelled before the kernel accepts another turn in the context.

use crate::error::{msg, ApiError, Code};
use crate::validate::ResumeEntry;
use store::{Execution, ThreadDoc};

use super::expiry::{expire_if_due, Expired};

/// What kind of run a request asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    NewTurn,
    /// Answers to pending interrupts.
    Resume(Vec<ResumeEntry>),
    /// A message injected into the running pipeline task of the thread.
    Guidance,
}

impl Mode {
    /// The mode's name in traces and logs.
    pub fn name(&self) -> &'static str {
        match self {
            Mode::NewTurn => "turn",
            Mode::Resume(_) => "resume",
            Mode::Guidance => "guidance",
        }
    }
}

/// The facts of a request that admission decides on.
#[derive(Debug, Clone)]
pub struct Ask<'a> {
    pub thread_id: &'a str,
    pub run_id: &'a str,
    /// Digest of the request body (idempotency).
    pub digest: &'a str,
    pub mode: &'a Mode,
    /// The resolved workspace.
    pub cwd: &'a str,
    pub user_id: Option<&'a str>,
    pub ros_invocation_id: &'a str,
    /// `runMode: pipeline` (guidance needs it).
    pub pipeline: bool,
    /// The request carries a `resume` array (a guidance request must not).
    pub has_resume: bool,
    /// The authenticated user the request comes from (`None`: a caller without a user, who
    /// reaches every thread). A thread admitting it without an owner becomes theirs.
    pub owner: Option<&'a str>,
    /// How many threads of this id were deleted before (the store's tombstone, read when the
    /// thread has no document): a thread made now is that incarnation of the id.
    pub incarnation: u64,
}

/// The kernel task a crashed run left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Orphan {
    /// Its id was stored.
    Task(String),
    /// The run died before the kernel named its task: look it up by context.
    Unknown,
}

/// An admitted run.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    pub execution_id: String,
    pub context_id: String,
    /// The run holds the thread until it ends (every run but guidance).
    pub holds_thread: bool,
    /// An orphaned kernel task to cancel before the new turn starts.
    pub orphan: Option<Orphan>,
}

/// The decision.
#[derive(Debug)]
pub struct Decision {
    /// The document to make durable before answering; `None`: unchanged. Set on refusals too
    /// when interrupts expired.
    pub doc: Option<ThreadDoc>,
    /// Interrupts that expired just now.
    pub expired: Option<Expired>,
    pub verdict: Result<Admission, ApiError>,
    /// Refused because the thread is another user's (the audit records it).
    pub stranger: bool,
}

/// What a request for another user's thread gets: what it would get if the thread did not exist
/// (a resume or guidance has nothing to continue), except that a new turn cannot take the id.
pub fn stranger_answer(mode: &Mode) -> ApiError {
    match mode {
        Mode::NewTurn => ApiError::new(Code::ThreadIdTaken, msg::THREAD_ID_TAKEN),
        Mode::Resume(_) | Mode::Guidance => ApiError::new(Code::ExecutionLost, msg::EXECUTION_GONE),
    }
}

/// The context id of a thread: `agui-` and the first 40 hex digits of SHA-256(threadId).
pub fn context_id(thread_id: &str) -> String {
    let h = crate::canonical::sha256_hex(thread_id.as_bytes());
    format!("agui-{}", &h[..40])
}

/// The context id of an incarnation of a thread id (`n`: how many threads of the id were deleted
/// before it). The first keeps the reference's formula; a later one hashes the id, a NUL and `n`.
/// No thread id holds a NUL (ids have no control character), so that input is no other
/// incarnation's and no first incarnation's of any id: a thread made again never continues a
/// deleted one's kernel conversation, which the kernel keys by context.
pub fn incarnation_context_id(thread_id: &str, n: u64) -> String {
    if n == 0 {
        return context_id(thread_id);
    }
    let h = crate::canonical::sha256_hex(format!("{thread_id}\0{n}").as_bytes());
    format!("agui-{}", &h[..40])
}

fn refuse(code: Code, m: &'static str) -> Result<Admission, ApiError> {
    Err(ApiError::new(code, m))
}

/// Decides on `ask` for a thread whose document is `doc` and which a run of this process holds
/// (`held`) or not, at `now_ms`. `new_id` names new executions.
pub fn decide(
    doc: Option<&ThreadDoc>,
    held: bool,
    ask: &Ask<'_>,
    now_ms: i64,
    new_id: &mut dyn FnMut() -> String,
) -> Decision {
    // Before anything else, expiry included: a stranger changes nothing and learns nothing.
    if let (Some(d), Some(user)) = (doc, ask.owner) {
        if d.owner_or_user() != Some(user) {
            return Decision {
                doc: None,
                expired: None,
                verdict: Err(stranger_answer(ask.mode)),
                stranger: true,
            };
        }
    }
    let mut next = doc.cloned();
    let expired = match next.as_mut() {
        Some(d) if !held => expire_if_due(d, now_ms),
        _ => None,
    };
    let expired_doc = expired.as_ref().and(next.clone());
    let verdict = admit(&mut next, held, ask, new_id);
    Decision {
        doc: if verdict.is_ok() { next } else { expired_doc },
        expired,
        verdict,
        stranger: false,
    }
}

/// The checks after expiry; on success `doc` is the document to store.
fn admit(
    doc: &mut Option<ThreadDoc>,
    held: bool,
    ask: &Ask<'_>,
    new_id: &mut dyn FnMut() -> String,
) -> Result<Admission, ApiError> {
    let created = doc.is_none();
    let d = match doc {
        Some(d) => d,
        None => {
            if *ask.mode != Mode::NewTurn {
                return refuse(Code::ExecutionLost, msg::EXECUTION_GONE);
            }
            doc.insert(ThreadDoc::new(
                ask.thread_id,
                incarnation_context_id(ask.thread_id, ask.incarnation),
                ask.cwd,
                ask.user_id.map(str::to_owned),
                Execution::new(new_id(), ask.ros_invocation_id),
            ))
        }
    };
    if let Some(seen) = d.run_digests.get(ask.run_id) {
        return if seen == ask.digest {
            refuse(Code::DuplicateRunId, msg::RUN_ID_USED)
        } else {
            refuse(Code::RunIdConflict, msg::RUN_ID_USED)
        };
    }
    if held && *ask.mode != Mode::Guidance {
        return refuse(Code::ThreadBusy, msg::THREAD_BUSY);
    }
    if !created && (d.cwd != ask.cwd || d.user_id.as_deref() != ask.user_id) {
        return refuse(Code::ThreadBindingConflict, msg::BINDING_CONFLICT);
    }
    let mut orphan = None;
    match ask.mode {
        Mode::Guidance => {
            if ask.has_resume || !ask.pipeline || d.execution.task_id.is_none() {
                return refuse(Code::ExecutionLost, msg::EXECUTION_GONE);
            }
            if !d.execution.pending.is_empty() {
                return refuse(Code::ResumeRequired, msg::RESUME_REQUIRED);
            }
        }
        Mode::Resume(_) => {
            if d.execution.ros_invocation_id != ask.ros_invocation_id {
                return refuse(Code::ExecutionLost, msg::RESUME_MISMATCH);
            }
        }
        Mode::NewTurn => {
            if !d.execution.pending.is_empty() {
                return refuse(Code::ResumeRequired, msg::RESUME_REQUIRED);
            }
            if !created {
                if !d.is_terminal(&d.execution.execution_id) {
                    orphan = Some(match &d.execution.task_id {
                        Some(t) => Orphan::Task(t.clone()),
                        None => Orphan::Unknown,
                    });
                }
                d.terminal_execution_ids
                    .insert(d.execution.execution_id.clone());
                // The ended execution's task (an orphan's, cancelled before the turn) is the
                // thread's last.
                let last = d
                    .execution
                    .task_id
                    .take()
                    .or(d.execution.last_task_id.take());
                d.execution = Execution::new(new_id(), ask.ros_invocation_id);
                d.execution.last_task_id = last;
            }
        }
    }
    // The thread is its user's from its first admitted run (or the first since owners were
    // recorded: the stranger check above let only that user through).
    if d.owner.is_none() {
        d.owner = ask.owner.map(str::to_owned);
    }
    // The save that records a run also keeps the document within its bounds.
    d.record_run(ask.run_id, ask.digest);
    Ok(Admission {
        execution_id: d.execution.execution_id.clone(),
        context_id: d.context_id.clone(),
        holds_thread: *ask.mode != Mode::Guidance,
        orphan,
    })
}

#[cfg(test)]
mod owner_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::decide::testing::{doc_with_pending, NOW};
    use crate::validate::ResumeStatus;
    use proptest::prelude::*;

    fn ask<'a>(mode: &'a Mode, run: &'a str) -> Ask<'a> {
        Ask {
            thread_id: "thread-1",
            run_id: run,
            digest: "d1",
            mode,
            cwd: "/w",
            user_id: None,
            ros_invocation_id: "inv-1",
            pipeline: false,
            has_resume: matches!(mode, Mode::Resume(_)),
            owner: None,
            incarnation: 0,
        }
    }

    fn ids() -> impl FnMut() -> String {
        let mut n = 0;
        move || {
            n += 1;
            format!("exec-{n}")
        }
    }

    fn code(d: &Decision) -> Option<&'static str> {
        d.verdict.as_ref().err().map(|e| e.code.as_str())
    }

    /// A thread remembers its newest runs only: after 1,000 + k turns the oldest k are gone (a
    /// retry of one is a new run), the newest is still a duplicate, and the records of past
    /// executions are bounded too.
    #[test]
    fn run_digests_stay_bounded_over_many_turns() {
        use store::{MAX_EXECUTION_MARKS, MAX_RUN_DIGESTS};
        let mut new_id = ids();
        let turn = Mode::NewTurn;
        let mut doc: Option<ThreadDoc> = None;
        let n = MAX_RUN_DIGESTS + 20;
        for i in 0..n {
            let d = decide(
                doc.as_ref(),
                false,
                &ask(&turn, &format!("r{i}")),
                NOW,
                &mut new_id,
            );
            assert!(d.verdict.is_ok(), "{i}");
            doc = d.doc;
        }
        let d = doc.as_ref().unwrap();
        assert_eq!(d.run_digests.len(), MAX_RUN_DIGESTS);
        assert_eq!(d.terminal_execution_ids.len(), MAX_EXECUTION_MARKS);
        let last = format!("r{}", n - 1);
        let again = decide(doc.as_ref(), false, &ask(&turn, &last), NOW, &mut new_id);
        assert_eq!(code(&again), Some("DUPLICATE_RUN_ID"));
        let oldest = decide(doc.as_ref(), false, &ask(&turn, "r0"), NOW, &mut new_id);
        assert!(oldest.verdict.is_ok());
    }

    #[test]
    fn context_id_formula() {
        assert_eq!(
            context_id("thread-1"),
            "agui-4b0a5fefc328e6b9257bc535e3c5d26fec36b52f"
        );
    }

    /// The first incarnation keeps the reference's context; each later one has its own, never
    /// an earlier one's nor another id's first, and only a thread made now takes it: an existing
    /// document keeps the context it records.
    #[test]
    fn a_thread_made_again_gets_a_context_of_its_own() {
        assert_eq!(
            incarnation_context_id("thread-1", 0),
            context_id("thread-1")
        );
        let seen: std::collections::BTreeSet<String> = (0..50)
            .map(|n| incarnation_context_id("thread-1", n))
            .chain((0..50).map(|n| incarnation_context_id("thread-11", n)))
            .collect();
        assert_eq!(seen.len(), 100);
        assert!(seen.iter().all(|c| c.len() == 45 && c.starts_with("agui-")));
        let turn = Mode::NewTurn;
        let mut again = ask(&turn, "r1");
        again.incarnation = 2;
        let d = decide(None, false, &again, NOW, &mut ids());
        let made = d.doc.unwrap();
        assert_eq!(made.context_id, incarnation_context_id("thread-1", 2));
        assert_eq!(d.verdict.unwrap().context_id, made.context_id);
        let mut next = ask(&turn, "r2");
        next.incarnation = 7;
        let d = decide(Some(&made), false, &next, NOW, &mut ids());
        assert_eq!(d.verdict.unwrap().context_id, made.context_id);
        assert_eq!(d.doc.unwrap().context_id, made.context_id);
    }

    #[test]
    fn a_first_turn_binds_the_thread() {
        let d = decide(None, false, &ask(&Mode::NewTurn, "r1"), NOW, &mut ids());
        let a = d.verdict.unwrap();
        let doc = d.doc.unwrap();
        assert_eq!(a.execution_id, "exec-1");
        assert_eq!(doc.cwd, "/w");
        assert_eq!(doc.run_digests["r1"], "d1");
        assert_eq!(a.context_id, context_id("thread-1"));
        assert!(a.holds_thread && a.orphan.is_none());
        let resume = Mode::Resume(vec![]);
        let d = decide(None, false, &ask(&resume, "r1"), NOW, &mut ids());
        assert_eq!(code(&d), Some("EXECUTION_LOST"));
        assert!(d.doc.is_none());
    }

    #[test]
    fn a_second_turn_rotates_and_finds_the_orphan_of_a_crash() {
        let mut prev = doc_with_pending(&[]);
        prev.execution.task_id = Some("task-1".into());
        let old = prev.execution.execution_id.clone();
        let d = decide(
            Some(&prev),
            false,
            &ask(&Mode::NewTurn, "r2"),
            NOW,
            &mut ids(),
        );
        let a = d.verdict.unwrap();
        assert_eq!(a.orphan, Some(Orphan::Task("task-1".into())));
        let doc = d.doc.unwrap();
        assert!(doc.is_terminal(&old));
        assert_eq!(doc.execution.execution_id, "exec-1");
        assert!(doc.execution.task_id.is_none());
        // The orphan's task is the thread's last (its execution ended here).
        assert_eq!(doc.execution.last_task_id.as_deref(), Some("task-1"));
        // An ended execution leaves nothing to cancel, and its task stays the last through the
        // rotation.
        prev.end_execution();
        let d = decide(
            Some(&prev),
            false,
            &ask(&Mode::NewTurn, "r2"),
            NOW,
            &mut ids(),
        );
        assert_eq!(d.verdict.unwrap().orphan, None);
        let doc = d.doc.unwrap();
        assert_eq!(doc.execution.last_task_id.as_deref(), Some("task-1"));
    }

    #[test]
    fn refusals_in_order() {
        let pending = doc_with_pending(&[("i1", None)]);
        let new_turn = Mode::NewTurn;
        let guidance = Mode::Guidance;
        let mut used = pending.clone();
        used.run_digests.insert("r1".into(), "d1".into());
        let d = decide(Some(&used), true, &ask(&new_turn, "r1"), NOW, &mut ids());
        assert_eq!(code(&d), Some("DUPLICATE_RUN_ID"), "before busy");
        let mut other = ask(&new_turn, "r1");
        other.digest = "d2";
        assert_eq!(
            code(&decide(Some(&used), false, &other, NOW, &mut ids())),
            Some("RUN_ID_CONFLICT")
        );
        let d = decide(Some(&pending), true, &ask(&new_turn, "r2"), NOW, &mut ids());
        assert_eq!(code(&d), Some("THREAD_BUSY"));
        let mut elsewhere = ask(&new_turn, "r2");
        elsewhere.cwd = "/other";
        assert_eq!(
            code(&decide(Some(&pending), false, &elsewhere, NOW, &mut ids())),
            Some("THREAD_BINDING_CONFLICT")
        );
        assert_eq!(
            code(&decide(
                Some(&pending),
                false,
                &ask(&new_turn, "r2"),
                NOW,
                &mut ids()
            )),
            Some("RESUME_REQUIRED")
        );
        let mut g = ask(&guidance, "r2");
        g.pipeline = true;
        assert_eq!(
            code(&decide(Some(&pending), true, &g, NOW, &mut ids())),
            Some("RESUME_REQUIRED"),
            "guidance joins a held thread"
        );
        g.pipeline = false;
        assert_eq!(
            code(&decide(Some(&pending), true, &g, NOW, &mut ids())),
            Some("EXECUTION_LOST")
        );
        let resume = Mode::Resume(vec![]);
        let mut r = ask(&resume, "r2");
        r.ros_invocation_id = "inv-other";
        let d = decide(Some(&pending), false, &r, NOW, &mut ids());
        assert_eq!(code(&d), Some("EXECUTION_LOST"));
        assert_eq!(
            d.verdict.unwrap_err().message,
            msg::RESUME_MISMATCH,
            "the specific message"
        );
    }

    #[test]
    fn expiry_is_stored_even_when_the_request_is_refused() {
        let doc = doc_with_pending(&[("i1", Some(NOW - 1))]);
        let mut used = doc.clone();
        used.run_digests.insert("r1".into(), "d1".into());
        let d = decide(
            Some(&used),
            false,
            &ask(&Mode::NewTurn, "r1"),
            NOW,
            &mut ids(),
        );
        assert_eq!(code(&d), Some("DUPLICATE_RUN_ID"));
        assert_eq!(d.expired.unwrap().task.as_deref(), Some("task-1"));
        assert!(d.doc.unwrap().execution.pending.is_empty());
        // A held thread is not touched: its run owns the execution.
        let d = decide(
            Some(&doc),
            true,
            &ask(&Mode::NewTurn, "r2"),
            NOW,
            &mut ids(),
        );
        assert!(d.expired.is_none() && d.doc.is_none());
        // A new turn after expiry proceeds as a new execution.
        let d = decide(
            Some(&doc),
            false,
            &ask(&Mode::NewTurn, "r2"),
            NOW,
            &mut ids(),
        );
        assert!(d.verdict.is_ok());
        assert_eq!(d.doc.unwrap().execution.execution_id, "exec-1");
    }

    fn arb_doc() -> impl Strategy<Value = Option<ThreadDoc>> {
        let pending = prop::collection::vec(
            (
                "[a-c]",
                prop::option::of(-5i64..5).prop_map(|o| o.map(|d| NOW + d)),
            ),
            0..3,
        );
        (
            any::<bool>(),
            pending,
            any::<bool>(),
            prop::option::of("[a-b]"),
            prop::collection::btree_map("r[1-3]", "d[1-2]", 0..3),
            any::<bool>(),
        )
            .prop_map(|(some, pending, task, user, runs, terminal)| {
                some.then(|| {
                    let ids: Vec<(&str, Option<i64>)> =
                        pending.iter().map(|(i, t)| (i.as_str(), *t)).collect();
                    let mut d = doc_with_pending(&ids);
                    if !task {
                        d.execution.task_id = None;
                    }
                    d.user_id = user;
                    d.run_digests = runs;
                    if terminal {
                        d.terminal_execution_ids
                            .insert(d.execution.execution_id.clone());
                    }
                    d
                })
            })
    }

    fn arb_mode() -> impl Strategy<Value = Mode> {
        prop_oneof![
            Just(Mode::NewTurn),
            Just(Mode::Guidance),
            Just(Mode::Resume(vec![ResumeEntry {
                interrupt_id: "a".into(),
                status: ResumeStatus::Resolved,
                payload: None,
            }])),
        ]
    }

    proptest! {
        /// Whatever the thread and the request: an admitted run's id is recorded with its digest
        /// in the document to store, a refused request changes nothing but expiry, a used run id
        /// is never admitted, a held thread admits guidance only, and the binding never changes.
        #[test]
        fn admission_invariants(
            doc in arb_doc(),
            held in any::<bool>(),
            mode in arb_mode(),
            run in "r[1-4]",
            digest in "d[1-2]",
            user in prop::option::of("[a-b]"),
            pipeline in any::<bool>(),
            ros in prop::sample::select(vec!["inv-1", "inv-2"]),
        ) {
            let mut a = ask(&mode, &run);
            a.digest = &digest;
            a.user_id = user.as_deref();
            a.pipeline = pipeline;
            a.ros_invocation_id = ros;
            let d = decide(doc.as_ref(), held, &a, NOW, &mut ids());
            let used = doc.as_ref().is_some_and(|x| x.run_digests.contains_key(run.as_str()));
            match &d.verdict {
                Ok(adm) => {
                    let stored = d.doc.as_ref().expect("an admitted run stores its document");
                    prop_assert_eq!(stored.run_digests.get(run.as_str()), Some(&digest));
                    prop_assert_eq!(&stored.execution.execution_id, &adm.execution_id);
                    prop_assert!(!used);
                    prop_assert!(!held || mode == Mode::Guidance);
                    prop_assert_eq!(adm.holds_thread, mode != Mode::Guidance);
                    if let Some(before) = &doc {
                        prop_assert_eq!(&stored.cwd, &before.cwd);
                        prop_assert_eq!(&stored.user_id, &before.user_id);
                        prop_assert_eq!(stored.user_id.as_deref(), user.as_deref());
                    }
                    if mode == Mode::NewTurn {
                        prop_assert!(stored.execution.pending.is_empty());
                    }
                }
                Err(_) => {
                    match (&d.doc, &d.expired) {
                        (None, None) => {}
                        (Some(stored), Some(_)) => {
                            let before = doc.as_ref().expect("expiry needs a document");
                            prop_assert!(stored.execution.pending.is_empty());
                            prop_assert_eq!(&stored.run_digests, &before.run_digests);
                            prop_assert!(!held);
                        }
                        other => prop_assert!(false, "unexpected {:?}", other),
                    }
                }
            }
            if used {
                let code = d.verdict.as_ref().unwrap_err().code;
                let same = doc.as_ref().unwrap().run_digests[run.as_str()] == digest;
                prop_assert_eq!(code, if same { Code::DuplicateRunId } else { Code::RunIdConflict });
            }
        }
    }
}
