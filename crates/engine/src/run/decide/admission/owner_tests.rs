//! Admission and a thread's owner: a stranger's request changes nothing and gets a missing
//! thread's answer (a new turn: the id is taken); the owner's is admitted; a thread without an
//! owner becomes its user's at their first admitted run.

use super::*;
use crate::run::decide::testing::{doc_with_pending, NOW};

fn ask<'a>(mode: &'a Mode, run: &'a str, owner: Option<&'a str>, user: Option<&'a str>) -> Ask<'a> {
    Ask {
        thread_id: "thread-1",
        run_id: run,
        digest: "d1",
        mode,
        cwd: "/w",
        user_id: user,
        ros_invocation_id: "inv-1",
        pipeline: false,
        has_resume: matches!(mode, Mode::Resume(_)),
        owner,
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

fn owned(owner: Option<&str>, user: Option<&str>) -> ThreadDoc {
    let mut d = doc_with_pending(&[]);
    d.owner = owner.map(str::to_owned);
    d.user_id = user.map(str::to_owned);
    d
}

#[test]
fn a_new_thread_is_its_users() {
    let turn = Mode::NewTurn;
    let d = decide(
        None,
        false,
        &ask(&turn, "r1", Some("alice"), Some("alice")),
        NOW,
        &mut ids(),
    );
    assert!(d.verdict.is_ok() && !d.stranger);
    assert_eq!(d.doc.unwrap().owner.as_deref(), Some("alice"));
    // A caller without a user leaves it without an owner (as before).
    let d = decide(
        None,
        false,
        &ask(&turn, "r1", None, Some("bob")),
        NOW,
        &mut ids(),
    );
    assert_eq!(d.doc.unwrap().owner, None);
}

#[test]
fn a_strangers_request_gets_a_missing_threads_answer_and_changes_nothing() {
    // An interrupt due to expire: a stranger's request must not expire it.
    let mut doc = doc_with_pending(&[("perm-1", Some(NOW - 1))]);
    doc.owner = Some("alice".into());
    doc.user_id = Some("alice".into());
    let resume = Mode::Resume(vec![]);
    for mode in [Mode::NewTurn, resume.clone(), Mode::Guidance] {
        let d = decide(
            Some(&doc),
            false,
            &ask(&mode, "r9", Some("bob"), Some("bob")),
            NOW,
            &mut ids(),
        );
        assert!(d.stranger, "{mode:?}");
        assert!(
            d.doc.is_none() && d.expired.is_none(),
            "{mode:?}: nothing changes"
        );
        let code = d.verdict.unwrap_err().code;
        let missing = decide(
            None,
            false,
            &ask(&mode, "r9", Some("bob"), Some("bob")),
            NOW,
            &mut ids(),
        );
        match mode {
            Mode::NewTurn => assert_eq!(code, Code::ThreadIdTaken),
            _ => assert_eq!(code, missing.verdict.unwrap_err().code, "{mode:?}"),
        }
    }
    // Even a run id the owner used, or a busy thread, says nothing more.
    doc.run_digests.insert("r1".into(), "d1".into());
    let turn = Mode::NewTurn;
    let d = decide(
        Some(&doc),
        true,
        &ask(&turn, "r1", Some("bob"), None),
        NOW,
        &mut ids(),
    );
    assert_eq!(d.verdict.unwrap_err().code, Code::ThreadIdTaken);
    // The owner's request goes on to the usual checks (here: the expiry, then a resume).
    let d = decide(
        Some(&doc),
        false,
        &ask(&resume, "r2", Some("alice"), Some("alice")),
        NOW,
        &mut ids(),
    );
    assert!(!d.stranger && d.expired.is_some());
}

#[test]
fn a_thread_without_an_owner_is_its_bound_users_and_becomes_theirs() {
    let turn = Mode::NewTurn;
    let legacy = owned(None, Some("carol"));
    let d = decide(
        Some(&legacy),
        false,
        &ask(&turn, "r2", Some("carol"), Some("carol")),
        NOW,
        &mut ids(),
    );
    assert!(d.verdict.is_ok());
    assert_eq!(d.doc.unwrap().owner.as_deref(), Some("carol"));
    let d = decide(
        Some(&legacy),
        false,
        &ask(&turn, "r2", Some("dave"), Some("dave")),
        NOW,
        &mut ids(),
    );
    assert!(d.stranger);
    // Bound to nobody: only a caller without a user.
    let nobodys = owned(None, None);
    let d = decide(
        Some(&nobodys),
        false,
        &ask(&turn, "r2", Some("dave"), Some("dave")),
        NOW,
        &mut ids(),
    );
    assert!(d.stranger);
    let d = decide(
        Some(&nobodys),
        false,
        &ask(&turn, "r2", None, None),
        NOW,
        &mut ids(),
    );
    assert!(d.verdict.is_ok());
    assert_eq!(d.doc.unwrap().owner, None);
    // A caller without a user reaches an owned thread (the service token acting for nobody).
    let alices = owned(Some("alice"), Some("alice"));
    let d = decide(
        Some(&alices),
        false,
        &ask(&turn, "r2", None, Some("alice")),
        NOW,
        &mut ids(),
    );
    assert!(d.verdict.is_ok());
    assert_eq!(d.doc.unwrap().owner.as_deref(), Some("alice"));
}
