//! Resume plans: which answers of a resume go to the kernel, or why none does.
//!
//! A resume answers the interrupts a run ended with. Two looks decide it: the thread document
//! alone ([`precheck`], before the kernel is asked), then the document with the kernel's view of
//! the task ([`plan`]): the task may have asked for more (an interrupt the gateway did not see),
//! or finished (its interrupts are gone). The plan merges that view into the pending interrupts,
//! which are stored before anything else happens, and then either refuses the resume, ends the
//! run again with the interrupts still unanswered, or delivers every answer.
//!
//! A refusal before the merge changes nothing. Answers are validated all together before any is
//! sent. An answer already applied is recognised by its digest: the same answer again is not
//! applied twice, a different one is a conflict.

use crate::error::{msg, ApiError, Code};
use crate::mapping::interrupt::RequiredInput;
use crate::validate::ResumeEntry;
use store::{PendingEntry, ThreadDoc};

use super::answer::{self, Answer};

/// What the kernel says about the task (`GetTask`), as far as the plan is concerned.
#[derive(Debug, Clone, Default)]
pub struct TaskView {
    pub stage: TaskStage,
    /// The task reports its inputs (`input`/`pendingPermissions` in its metadata): what it does
    /// not list is not pending any more.
    pub lists_inputs: bool,
    /// The inputs it requires now.
    pub required: Vec<RequiredInput>,
}

/// Where the task stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TaskStage {
    /// Not in a final state: working, waiting for input, or in a state the kernel did not say.
    #[default]
    Open,
    /// Completed: it had what it waited for.
    Completed,
    /// Another final state (cancelled, failed, rejected, auth required): it may have ended
    /// before an answer arrived.
    Ended,
}

impl TaskView {
    /// The task no longer waits for `interrupt_id`: it completed, or it lists its inputs and this
    /// one is not among them. An answer known to be on its way to it was had; one that was
    /// cancelled or failed may have ended before the answer arrived, so it does not count.
    pub fn moved_past(&self, interrupt_id: &str) -> bool {
        self.stage == TaskStage::Completed
            || (self.lists_inputs && !self.required.iter().any(|r| r.id == interrupt_id))
    }
}

impl TaskStage {
    /// The stage of a task in `state`.
    pub fn of(state: Option<a2a::TaskState>) -> TaskStage {
        match state {
            Some(a2a::TaskState::Completed) => TaskStage::Completed,
            Some(s) if s.is_final() => TaskStage::Ended,
            _ => TaskStage::Open,
        }
    }
}

/// One answer to deliver.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub interrupt_id: String,
    /// Remembered once the kernel accepted it.
    pub digest: String,
    pub pending: PendingEntry,
    pub answer: Answer,
    /// An earlier run marked this very answer (same digest) as on its way to the kernel and
    /// stopped before it knew the outcome: the kernel may have it already.
    pub sent_before: bool,
    /// An earlier run marked another answer to this interrupt as on its way: the kernel may
    /// be carrying that one out.
    pub other_before: bool,
}

/// What happens after the merged pending interrupts are stored.
#[derive(Debug, Clone, PartialEq)]
pub enum Then {
    Refuse(ApiError),
    /// The task asks for more than the resume answers, none of it known before: the run ends
    /// again with every pending interrupt.
    Reinterrupt,
    /// Every answer, in request order.
    Deliver(Vec<Delivery>),
    /// Every answer was settled (see [`Plan::settled`]): nothing is sent, the task is followed.
    Follow,
}

/// A resume plan.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The pending interrupts as they are now (store them first).
    pub pending: Vec<(String, PendingEntry)>,
    /// Answers an earlier run was delivering when it stopped (a crash, a takeover), which the
    /// task shows it has: `(interrupt, digest)`, recorded as applied with the pending
    /// interrupts, never sent again.
    pub settled: Vec<(String, String)>,
    pub then: Then,
}

fn refuse(code: Code, m: &'static str) -> ApiError {
    ApiError::new(code, m)
}

/// The digest of an interrupt's applied answer in this execution.
fn applied<'a>(doc: &'a ThreadDoc, execution_id: &str, interrupt_id: &str) -> Option<&'a str> {
    doc.applied_resume_digests
        .iter()
        .find(|a| a.execution_id == execution_id && a.interrupt_id == interrupt_id)
        .map(|a| a.digest.as_str())
}

/// An earlier run marked this answer as on its way to the kernel (see [`Delivery::sent_before`]).
fn sent_before(doc: &ThreadDoc, execution_id: &str, interrupt_id: &str, digest: &str) -> bool {
    doc.delivering.iter().any(|m| {
        m.execution_id == execution_id && m.interrupt_id == interrupt_id && m.digest == digest
    })
}

/// The checks on the document alone: answers to expired interrupts, an execution with nothing
/// to resume. Returns the task to resume.
pub fn precheck(
    doc: &ThreadDoc,
    execution_id: &str,
    entries: &[ResumeEntry],
) -> Result<String, ApiError> {
    let expired = entries.iter().any(|e| {
        doc.expired_interrupts
            .iter()
            .any(|(_, i)| *i == e.interrupt_id)
    });
    if expired {
        return Err(refuse(Code::ExecutionExpired, msg::EXPIRED));
    }
    match &doc.execution.task_id {
        Some(t) if doc.is_waiting() => Ok(t.clone()),
        _ => {
            let all_applied = !entries.is_empty()
                && entries.iter().all(|e| {
                    applied(doc, execution_id, &e.interrupt_id) == Some(&answer::digest(e)[..])
                });
            Err(if all_applied {
                refuse(Code::ResumeAlreadyApplied, msg::ALREADY_APPLIED)
            } else {
                refuse(Code::ExecutionLost, msg::TASK_TO_RESUME_GONE)
            })
        }
    }
}

/// Plans a resume of `doc`'s current execution with `entries`, given the kernel's `task` view.
/// New pending entries expire at `expires_at`.
pub fn plan(
    doc: &ThreadDoc,
    entries: &[ResumeEntry],
    task: TaskView,
    expires_at: Option<&str>,
) -> Result<Plan, ApiError> {
    let exec = doc.execution.execution_id.as_str();
    let known: Vec<&str> = doc
        .execution
        .pending
        .iter()
        .map(|(id, _)| id.as_str())
        .collect();
    // An answer marked as on its way to the kernel by a run that did not finish, to an input
    // the task no longer waits for: the kernel had it. It is settled, not sent again.
    let settled: Vec<(String, String)> = entries
        .iter()
        .filter_map(|e| {
            let digest = answer::digest(e);
            (sent_before(doc, exec, &e.interrupt_id, &digest)
                && task.moved_past(&e.interrupt_id)
                && applied(doc, exec, &e.interrupt_id).is_none())
            .then(|| (e.interrupt_id.clone(), digest))
        })
        .collect();
    let mut pending = doc.execution.pending.clone();
    // The task's view wins: a finished task waits for nothing; a task that lists its inputs and
    // is answered on none the gateway knew waits only for what it lists.
    let answers_known = entries
        .iter()
        .any(|e| known.contains(&e.interrupt_id.as_str()));
    if task.stage != TaskStage::Open || (task.lists_inputs && !answers_known) {
        pending.clear();
    }
    for r in task.required {
        if applied(doc, exec, &r.id).is_some() {
            continue;
        }
        match pending.iter_mut().find(|(id, _)| *id == r.id) {
            Some((_, e)) => e.sideband |= r.sideband,
            None => pending.push((
                r.id,
                PendingEntry {
                    value: r.value,
                    sideband: r.sideband,
                    expires_at: expires_at.map(str::to_owned),
                },
            )),
        }
    }
    let mut ids: Vec<&str> = entries.iter().map(|e| e.interrupt_id.as_str()).collect();
    ids.sort_unstable();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        return Err(refuse(Code::IncompleteResume, msg::DUPLICATE_ANSWERS));
    }
    // An interrupt answered already is not pending; answering it differently is a conflict.
    let mut conflict = false;
    pending.retain(|(id, _)| match applied(doc, exec, id) {
        None => true,
        Some(d) => {
            conflict |= entries
                .iter()
                .any(|e| e.interrupt_id == *id && answer::digest(e) != d);
            false
        }
    });
    if conflict {
        return Err(refuse(Code::ResumeAlreadyApplied, msg::ALREADY_APPLIED));
    }
    pending.retain(|(id, _)| !settled.iter().any(|(s, _)| s == id));
    let then = then(doc, exec, entries, &pending, &known, &settled);
    Ok(Plan {
        pending,
        settled,
        then,
    })
}

/// The plan's second half: against the merged pending interrupts.
fn then(
    doc: &ThreadDoc,
    exec: &str,
    entries: &[ResumeEntry],
    pending: &[(String, PendingEntry)],
    known: &[&str],
    settled: &[(String, String)],
) -> Then {
    if pending.is_empty() && settled.is_empty() {
        return Then::Refuse(refuse(Code::ExecutionLost, msg::TASK_TO_RESUME_GONE));
    }
    let is_pending = |id: &str| pending.iter().any(|(p, _)| p == id);
    let is_settled = |id: &str| settled.iter().any(|(s, _)| s == id);
    for e in entries
        .iter()
        .filter(|e| !is_pending(&e.interrupt_id) && !is_settled(&e.interrupt_id))
    {
        match applied(doc, exec, &e.interrupt_id) {
            Some(d) if d == answer::digest(e) => {}
            Some(_) => {
                return Then::Refuse(refuse(Code::ResumeAlreadyApplied, msg::ALREADY_APPLIED))
            }
            None => return Then::Refuse(refuse(Code::UnknownInterrupt, msg::UNKNOWN_INTERRUPT)),
        }
    }
    if pending.is_empty() {
        // Every answer was settled (the others checked above): the task is followed.
        return Then::Follow;
    }
    let unanswered: Vec<&str> = pending
        .iter()
        .map(|(id, _)| id.as_str())
        .filter(|id| !entries.iter().any(|e| e.interrupt_id == *id))
        .collect();
    if !unanswered.is_empty() {
        return if unanswered.iter().any(|id| known.contains(id)) {
            Then::Refuse(refuse(Code::IncompleteResume, msg::INCOMPLETE_RESUME))
        } else {
            Then::Reinterrupt
        };
    }
    let mut deliveries = Vec::new();
    for e in entries {
        let Some((_, p)) = pending.iter().find(|(id, _)| *id == e.interrupt_id) else {
            continue;
        };
        match answer::validate(e, p) {
            Ok(answer) => {
                let digest = answer::digest(e);
                deliveries.push(Delivery {
                    interrupt_id: e.interrupt_id.clone(),
                    sent_before: sent_before(doc, exec, &e.interrupt_id, &digest),
                    other_before: doc.delivering.iter().any(|m| {
                        m.execution_id == exec
                            && m.interrupt_id == e.interrupt_id
                            && m.digest != digest
                    }),
                    digest,
                    pending: p.clone(),
                    answer,
                })
            }
            Err(err) => return Then::Refuse(err.into()),
        }
    }
    if deliveries.is_empty() {
        return Then::Refuse(refuse(Code::ResumeAlreadyApplied, msg::ALREADY_APPLIED));
    }
    Then::Deliver(deliveries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::decide::testing::{doc_with_pending, NOW};
    use crate::validate::ResumeStatus;
    use proptest::prelude::*;
    use serde_json::{json, Value};
    use store::AppliedDigest;

    fn allow(id: &str) -> ResumeEntry {
        ResumeEntry {
            interrupt_id: id.into(),
            status: ResumeStatus::Resolved,
            payload: Some(json!({"decision": "allow_once"})),
        }
    }

    fn deny(id: &str) -> ResumeEntry {
        ResumeEntry {
            payload: Some(json!({"decision": "deny"})),
            ..allow(id)
        }
    }

    fn required(id: &str) -> RequiredInput {
        RequiredInput {
            id: id.into(),
            value: json!({"kind": "permission", "inputId": id})
                .as_object()
                .cloned()
                .unwrap(),
            sideband: false,
        }
    }

    fn applied_to(doc: &mut ThreadDoc, e: &ResumeEntry) {
        doc.applied_resume_digests.insert(AppliedDigest {
            execution_id: doc.execution.execution_id.clone(),
            interrupt_id: e.interrupt_id.clone(),
            digest: answer::digest(e),
        });
    }

    fn code(r: &Result<Plan, ApiError>) -> Option<&'static str> {
        match r {
            Err(e) => Some(e.code.as_str()),
            Ok(Plan {
                then: Then::Refuse(e),
                ..
            }) => Some(e.code.as_str()),
            Ok(_) => None,
        }
    }

    #[test]
    fn prechecks() {
        let doc = doc_with_pending(&[("a", None)]);
        assert_eq!(precheck(&doc, "exec-0", &[allow("a")]).unwrap(), "task-1");
        let mut expired = doc.clone();
        expired
            .expired_interrupts
            .insert(("exec-old".into(), "a".into()));
        assert_eq!(
            precheck(&expired, "exec-0", &[allow("a")])
                .unwrap_err()
                .code,
            Code::ExecutionExpired,
            "an expired id stays expired, whatever execution"
        );
        let mut done = doc_with_pending(&[]);
        assert_eq!(
            precheck(&done, "exec-0", &[allow("a")]).unwrap_err().code,
            Code::ExecutionLost
        );
        applied_to(&mut done, &allow("a"));
        assert_eq!(
            precheck(&done, "exec-0", &[allow("a")]).unwrap_err().code,
            Code::ResumeAlreadyApplied,
            "the same answer again"
        );
        assert_eq!(
            precheck(&done, "exec-0", &[deny("a")]).unwrap_err().code,
            Code::ExecutionLost
        );
    }

    #[test]
    fn task_stages() {
        use a2a::TaskState as S;
        assert_eq!(TaskStage::of(None), TaskStage::Open);
        for s in [
            S::Submitted,
            S::Working,
            S::InputRequired,
            S::Other("x".into()),
        ] {
            assert_eq!(TaskStage::of(Some(s)), TaskStage::Open);
        }
        assert_eq!(TaskStage::of(Some(S::Completed)), TaskStage::Completed);
        for s in [S::Failed, S::Canceled, S::Rejected, S::AuthRequired] {
            assert_eq!(TaskStage::of(Some(s)), TaskStage::Ended);
        }
    }

    #[test]
    fn every_answer_delivered_in_request_order() {
        let doc = doc_with_pending(&[("a", None), ("b", None)]);
        let p = plan(&doc, &[deny("b"), allow("a")], TaskView::default(), None).unwrap();
        assert_eq!(p.pending.len(), 2);
        let Then::Deliver(d) = p.then else {
            panic!("{:?}", p.then)
        };
        let ids: Vec<&str> = d.iter().map(|d| d.interrupt_id.as_str()).collect();
        assert_eq!(ids, ["b", "a"]);
        assert!(matches!(
            &d[0].answer,
            Answer::Permission {
                decision: a2a::PermissionDecision::Deny,
                ..
            }
        ));
    }

    #[test]
    fn refusals() {
        let doc = doc_with_pending(&[("a", None), ("b", None)]);
        let none = TaskView::default();
        assert_eq!(
            code(&plan(&doc, &[allow("a"), allow("a")], none.clone(), None)),
            Some("INCOMPLETE_RESUME")
        );
        assert_eq!(
            code(&plan(&doc, &[allow("a")], none.clone(), None)),
            Some("INCOMPLETE_RESUME"),
            "b is unanswered"
        );
        assert_eq!(
            code(&plan(
                &doc,
                &[allow("a"), allow("b"), allow("c")],
                none.clone(),
                None
            )),
            Some("UNKNOWN_INTERRUPT")
        );
        let bad = ResumeEntry {
            payload: Some(json!({"decision": "maybe"})),
            ..allow("b")
        };
        assert_eq!(
            code(&plan(&doc, &[allow("a"), bad], none.clone(), None)),
            Some("RESUME_PAYLOAD_INVALID"),
            "nothing is sent when one answer is invalid"
        );
        let finished = TaskView {
            stage: TaskStage::Ended,
            ..TaskView::default()
        };
        let p = plan(&doc, &[allow("a"), allow("b")], finished, None).unwrap();
        assert!(p.pending.is_empty(), "stored: the task waits for nothing");
        assert_eq!(code(&Ok(p)), Some("EXECUTION_LOST"));
    }

    #[test]
    fn applied_answers_are_recognised() {
        let mut doc = doc_with_pending(&[("a", None), ("b", None)]);
        applied_to(&mut doc, &allow("a"));
        // The same answer to a again, and b: a is not delivered twice.
        let p = plan(&doc, &[allow("a"), allow("b")], TaskView::default(), None).unwrap();
        assert_eq!(p.pending.len(), 1);
        let Then::Deliver(d) = p.then else { panic!() };
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].interrupt_id, "b");
        assert_eq!(
            code(&plan(
                &doc,
                &[deny("a"), allow("b")],
                TaskView::default(),
                None
            )),
            Some("RESUME_ALREADY_APPLIED")
        );
    }

    fn marked(doc: &mut ThreadDoc, e: &ResumeEntry) {
        doc.delivering.insert(AppliedDigest {
            execution_id: doc.execution.execution_id.clone(),
            interrupt_id: e.interrupt_id.clone(),
            digest: answer::digest(e),
        });
    }

    /// An answer an earlier run was delivering when it stopped: settled when the task shows it
    /// has it (it waits for something else, or finished), delivered when the task still waits
    /// for it; a different answer, or one never marked, is not settled.
    #[test]
    fn answers_on_their_way_are_settled_from_the_task() {
        let mut doc = doc_with_pending(&[("a", None), ("b", None)]);
        marked(&mut doc, &allow("a"));
        let moved_on = TaskView {
            lists_inputs: true,
            required: vec![required("b")],
            ..TaskView::default()
        };
        let p = plan(&doc, &[allow("a"), allow("b")], moved_on.clone(), None).unwrap();
        assert_eq!(
            p.settled,
            vec![("a".to_owned(), answer::digest(&allow("a")))]
        );
        assert_eq!(p.pending.len(), 1, "only b stays pending");
        let Then::Deliver(d) = &p.then else {
            panic!("{:?}", p.then)
        };
        assert_eq!(
            d.iter()
                .map(|d| d.interrupt_id.as_str())
                .collect::<Vec<_>>(),
            ["b"]
        );
        // All settled: nothing to send, the task is followed.
        let mut only_a = doc_with_pending(&[("a", None)]);
        marked(&mut only_a, &allow("a"));
        let waits_for_nothing = TaskView {
            lists_inputs: true,
            ..TaskView::default()
        };
        let p = plan(&only_a, &[allow("a")], waits_for_nothing.clone(), None).unwrap();
        assert_eq!(p.then, Then::Follow);
        assert!(p.pending.is_empty());
        // Settled, and the task asks something new: the run ends with the new interrupt.
        let p = plan(&only_a, &[allow("a")], moved_on.clone(), None).unwrap();
        assert_eq!(p.settled.len(), 1);
        assert_eq!(p.then, Then::Reinterrupt);
        assert_eq!(p.pending.len(), 1);
        let completed = TaskView {
            stage: TaskStage::Completed,
            ..TaskView::default()
        };
        assert_eq!(
            plan(&only_a, &[allow("a")], completed, None).unwrap().then,
            Then::Follow
        );
        // A task cancelled or failed may have ended before the answer arrived: not settled.
        let cancelled = TaskView {
            stage: TaskStage::Ended,
            ..TaskView::default()
        };
        let p = plan(&only_a, &[allow("a")], cancelled, None);
        assert_eq!(code(&p), Some("EXECUTION_LOST"));
        // The other answers are still checked: an unknown one refuses the resume.
        let p = plan(
            &only_a,
            &[allow("a"), allow("zz")],
            waits_for_nothing.clone(),
            None,
        );
        assert_eq!(code(&p), Some("UNKNOWN_INTERRUPT"));
        // Still waited for: the mark settles nothing, the answer goes (the kernel knows a
        // duplicate).
        let waits = TaskView {
            lists_inputs: true,
            required: vec![required("a")],
            ..TaskView::default()
        };
        let p = plan(&only_a, &[allow("a")], waits.clone(), None).unwrap();
        assert!(p.settled.is_empty());
        let Then::Deliver(d) = &p.then else {
            panic!("{:?}", p.then)
        };
        // The delivery knows the kernel may have it already (a refusal is then looked into).
        assert!(d[0].sent_before);
        // Another answer than the marked one, or no mark at all: nothing was sent before.
        let Then::Deliver(d) = plan(&only_a, &[deny("a")], waits.clone(), None)
            .unwrap()
            .then
        else {
            panic!()
        };
        assert!(!d[0].sent_before);
        assert!(d[0].other_before, "allow was on its way");
        let unmarked = doc_with_pending(&[("a", None)]);
        let Then::Deliver(d) = plan(&unmarked, &[allow("a")], waits, None).unwrap().then else {
            panic!()
        };
        assert!(!d[0].sent_before && !d[0].other_before);
        // A task that lists nothing (a kernel restarted: its durable summary) settles nothing.
        let p = plan(&only_a, &[allow("a")], TaskView::default(), None).unwrap();
        assert!(p.settled.is_empty());
        // Another answer than the one on its way is not settled by it.
        let p = plan(&only_a, &[deny("a")], moved_on, None);
        assert!(p.as_ref().is_ok_and(|p| p.settled.is_empty()), "{p:?}");
    }

    #[test]
    fn the_tasks_new_interrupts() {
        let doc = doc_with_pending(&[("a", None)]);
        let more = TaskView {
            lists_inputs: true,
            required: vec![required("a"), required("n")],
            ..TaskView::default()
        };
        let exp = clock::rfc3339_ms(NOW);
        let p = plan(&doc, &[allow("a")], more.clone(), Some(&exp)).unwrap();
        assert_eq!(p.pending.len(), 2);
        assert_eq!(p.pending[1].1.expires_at.as_deref(), Some(exp.as_str()));
        // n is new (not known before): the run ends again with a and n, nothing delivered.
        assert_eq!(p.then, Then::Reinterrupt);
        // The task lists only interrupts the gateway never saw, and the resume answers none the
        // gateway knew: the task's list replaces the pending set, and the run ends again with it.
        let other = TaskView {
            lists_inputs: true,
            required: vec![required("n")],
            ..TaskView::default()
        };
        let p = plan(&doc, &[], other.clone(), None).unwrap();
        assert_eq!(p.pending.len(), 1);
        assert_eq!(p.pending[0].0, "n");
        assert_eq!(p.then, Then::Reinterrupt);
        // An answer to an interrupt nobody asked for is unknown, whatever the task lists.
        let p = plan(&doc, &[allow("x")], other, None).unwrap();
        assert_eq!(code(&Ok(p)), Some("UNKNOWN_INTERRUPT"));
    }

    fn arb_entry() -> impl Strategy<Value = ResumeEntry> {
        (
            "[a-d]",
            any::<bool>(),
            prop::option::of(prop_oneof![
                Just(json!({"decision": "allow_once"})),
                Just(json!({"decision": "deny"})),
                Just(json!({"decision": "nope"})),
                Just(Value::Null),
            ]),
        )
            .prop_map(|(id, resolved, payload)| ResumeEntry {
                interrupt_id: id,
                status: if resolved {
                    ResumeStatus::Resolved
                } else {
                    ResumeStatus::Cancelled
                },
                payload,
            })
    }

    proptest! {
        /// Whatever the thread, the answers and the task: a delivery answers every pending
        /// interrupt exactly once with a valid answer, never one applied before; the stored
        /// pending set never holds an applied interrupt.
        #[test]
        fn plan_invariants(
            pending in prop::collection::btree_set("[a-d]", 0..4),
            applied in prop::collection::vec(arb_entry(), 0..3),
            entries in prop::collection::vec(arb_entry(), 0..4),
            stage in prop_oneof![Just(TaskStage::Open), Just(TaskStage::Completed), Just(TaskStage::Ended)],
            lists in any::<bool>(),
            task_requires in prop::collection::btree_set("[a-e]", 0..3),
        ) {
            let ids: Vec<(&str, Option<i64>)> = pending.iter().map(|i| (i.as_str(), None)).collect();
            let mut doc = doc_with_pending(&ids);
            for a in &applied {
                applied_to(&mut doc, a);
            }
            let view = TaskView {
                stage,
                lists_inputs: lists,
                required: task_requires.iter().map(|i| required(i)).collect(),
            };
            let was_applied = |id: &str| doc.applied_resume_digests.iter().any(|a| a.interrupt_id == id);
            match plan(&doc, &entries, view, None) {
                Err(_) => {}
                Ok(p) => {
                    for (id, _) in &p.pending {
                        prop_assert!(!was_applied(id), "applied {} still pending", id);
                    }
                    if let Then::Deliver(d) = &p.then {
                        let mut answered: Vec<&str> = d.iter().map(|d| d.interrupt_id.as_str()).collect();
                        answered.sort_unstable();
                        let mut want: Vec<&str> = p.pending.iter().map(|(id, _)| id.as_str()).collect();
                        want.sort_unstable();
                        prop_assert_eq!(answered, want);
                        for x in d {
                            prop_assert!(!was_applied(&x.interrupt_id));
                            prop_assert!(entries.iter().any(|e| e.interrupt_id == x.interrupt_id));
                        }
                    }
                }
            }
        }
    }
}
