//! The schemaVersion-1 thread document: its in-memory form, serialisation (sorted keys, 2-space
//! indent, trailing newline) and validation on load.
//!
//! The in-memory types are the document's shape: serde writes them. `read` reads a document
//! back and validates it; members it does not know are ignored and a key given twice keeps its
//! last value. `bound` keeps a document within its bounds.

mod bound;
mod read;

pub use bound::{MAX_DOC_BYTES, MAX_EXECUTION_MARKS, MAX_RUN_DIGESTS};

use std::collections::{BTreeMap, BTreeSet};

use serde::{Serialize, Serializer};
use serde_json::{Map, Value};

use super::StoreError;
use agui::Code;

/// Fields of a kernel input that are kept (secrets and unknown keys are dropped).
pub const PENDING_ALLOW_LIST: &[&str] = &[
    "schemaVersion",
    "kind",
    "requestTaskId",
    "contextId",
    "inputId",
    "toolUseId",
    "toolName",
    "title",
    "purpose",
    "effect",
    "target",
    "isReadOnly",
    "prompt",
    "safeSummary",
    "options",
    "language",
    "deploymentSummary",
    "scope",
    "subPipelineId",
    "operation",
    "displayParameters",
    "allowFreeText",
    "freeTextPrompt",
    "required",
];

/// One pending interrupt.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingEntry {
    /// The allow-listed projection of the kernel input.
    pub value: Map<String, Value>,
    pub sideband: bool,
    /// RFC 3339 expiry instant (a field the reference does not write; it ignores it), `None` when
    /// expiry is off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

/// The current execution of a thread.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Execution {
    pub execution_id: String,
    pub ros_invocation_id: String,
    pub task_id: Option<String>,
    /// The task of the thread's latest execution that ended with one: kept when `task_id`
    /// becomes null, never cleared, carried over to the next execution. The kernel's session
    /// handoff finds a thread's task by `taskId`, else this. Written once known (iac-code's
    /// adapter after 0.16.0 writes null before; absent reads the same), so a document of 0.16.0,
    /// which ignores it, is written back as it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_task_id: Option<String>,
    pub pipeline_sequence: u64,
    pub pipeline_open_steps: BTreeSet<String>,
    pub text_snapshot_digests: BTreeSet<String>,
    /// The ids of the text and reasoning messages this execution's runs started (a gateway
    /// addition the reference ignores; written while there are any): a later run of the
    /// execution starts its messages under new ids.
    #[serde(skip_serializing_if = "BTreeSet::is_empty")]
    pub message_ids: BTreeSet<String>,
    /// Pending interrupts in insertion order (an object keyed by interrupt id on disk).
    #[serde(serialize_with = "in_order")]
    pub pending: Vec<(String, PendingEntry)>,
}

/// An applied resume answer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AppliedDigest {
    pub execution_id: String,
    pub interrupt_id: String,
    pub digest: String,
}

/// The run that holds a thread (`activeRun`, a gateway addition written only while one does).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunMark {
    pub run_id: String,
    /// RFC 3339, when the run was admitted.
    pub since: String,
}

/// How a run ended, as a thread document records it (`lastRun.outcome`) and the metrics count
/// it (`agui_runs_finished_total{outcome}`: its serde name is the label).
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    strum::IntoStaticStr,
)]
#[serde(rename_all = "lowercase")]
#[strum(serialize_all = "lowercase")]
pub enum RunOutcome {
    Success,
    Interrupt,
    Error,
    Cancelled,
    /// The client went away (or, with a detach grace, nobody re-attached in time).
    Disconnected,
}

impl RunOutcome {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// A value of a closed set as a document holds it: one this gateway names, or one it does not
/// (written by another version of it), kept as written so that the file still loads and reads
/// back the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Recorded<T> {
    Known(T),
    Other(String),
}

impl<T> From<T> for Recorded<T> {
    fn from(t: T) -> Recorded<T> {
        Recorded::Known(t)
    }
}

/// How the last run that held a thread ended (`lastRun`, a gateway addition). The threads API
/// shows it as it is stored, in this order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LastRun {
    pub run_id: String,
    pub outcome: Recorded<RunOutcome>,
    /// RFC 3339.
    pub ended_at: String,
    /// The `RUN_ERROR` code of an error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<Recorded<Code>>,
}

/// A thread's durable state.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ThreadDoc {
    pub thread_id: String,
    pub context_id: String,
    pub cwd: String,
    pub user_id: Option<String>,
    #[serde(rename = "iacCodeSessionId")]
    pub session_id: Option<String>,
    pub execution: Execution,
    pub run_digests: BTreeMap<String, String>,
    /// `runOrder` (written only when non-empty): the ids of `runDigests` in the order their runs
    /// were admitted, kept once a thread has recorded more than half of [`MAX_RUN_DIGESTS`], so
    /// that the oldest go first when the bound is reached. A thread with fewer runs writes
    /// nothing new: its file stays as the reference adapter writes it.
    #[serde(rename = "runOrder", skip_serializing_if = "Vec::is_empty")]
    pub run_order: Vec<String>,
    pub applied_resume_digests: BTreeSet<AppliedDigest>,
    pub terminal_execution_ids: BTreeSet<String>,
    /// `expiredInterrupts` (written only when non-empty, so reference files stay as they are):
    /// interrupts that
    /// expired, remembered with their execution so later answers get `EXECUTION_EXPIRED`.
    #[serde(skip_serializing_if = "BTreeSet::is_empty", serialize_with = "expired")]
    pub expired_interrupts: BTreeSet<(String, String)>,
    /// `deliveringAnswers` (written only when non-empty): answers on their way to the kernel,
    /// marked before they are sent and cleared when the kernel's acceptance is recorded. One left
    /// by a run that did not finish (a crash, a takeover) is settled from the task's state rather
    /// than sent again.
    #[serde(
        rename = "deliveringAnswers",
        skip_serializing_if = "BTreeSet::is_empty"
    )]
    pub delivering: BTreeSet<AppliedDigest>,
    /// `activeRun`: set at admission, cleared when the run lets go of the thread. Still set after
    /// a start-up means the run was lost with the process that ran it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_run: Option<RunMark>,
    /// `lastRun`: written when a run lets go of the thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_run: Option<LastRun>,
    /// `owner` (written only when known): the authenticated user of the thread's first admitted
    /// run, or of the first one after owners were recorded (`auth::access`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// `kernel` (written only with several kernels): the key of the kernel the thread's session
    /// and task live on (`kernel::place`); a thread without one is on the first.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<String>,
}

/// The document as written: its version and the thread.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Versioned<'a> {
    schema_version: u8,
    #[serde(flatten)]
    doc: &'a ThreadDoc,
}

fn in_order<S: Serializer>(pending: &[(String, PendingEntry)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(pending.iter().map(|(id, entry)| (id, entry)))
}

fn expired<S: Serializer>(marks: &BTreeSet<(String, String)>, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Expired<'a> {
        execution_id: &'a str,
        interrupt_id: &'a str,
    }
    s.collect_seq(marks.iter().map(|(e, i)| Expired {
        execution_id: e,
        interrupt_id: i,
    }))
}

/// Recursively sorts object keys (Python's `sort_keys=True`).
fn sorted(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let mut entries: Vec<(String, Value)> = m.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sorted).collect()),
        other => other,
    }
}

impl Execution {
    /// A new execution of the ROS invocation: no task yet, nothing pending.
    pub fn new(execution_id: impl Into<String>, ros_invocation_id: impl Into<String>) -> Execution {
        Execution {
            execution_id: execution_id.into(),
            ros_invocation_id: ros_invocation_id.into(),
            task_id: None,
            last_task_id: None,
            pipeline_sequence: 0,
            pipeline_open_steps: BTreeSet::new(),
            text_snapshot_digests: BTreeSet::new(),
            message_ids: BTreeSet::new(),
            pending: Vec::new(),
        }
    }
}

impl ThreadDoc {
    /// A thread bound to `cwd` (and the caller, if any) with its first execution: no session
    /// yet, no run recorded.
    pub fn new(
        thread_id: impl Into<String>,
        context_id: impl Into<String>,
        cwd: impl Into<String>,
        user_id: Option<String>,
        execution: Execution,
    ) -> ThreadDoc {
        ThreadDoc {
            thread_id: thread_id.into(),
            context_id: context_id.into(),
            cwd: cwd.into(),
            user_id,
            session_id: None,
            execution,
            run_digests: BTreeMap::new(),
            run_order: Vec::new(),
            applied_resume_digests: BTreeSet::new(),
            terminal_execution_ids: BTreeSet::new(),
            expired_interrupts: BTreeSet::new(),
            delivering: BTreeSet::new(),
            active_run: None,
            last_run: None,
            owner: None,
            kernel: None,
        }
    }

    /// Whom the thread belongs to: its recorded owner, else (a thread written before owners
    /// were recorded, or by a caller without a user) the user it is bound to, if any.
    pub fn owner_or_user(&self) -> Option<&str> {
        self.owner.as_deref().or(self.user_id.as_deref())
    }

    /// Whether `execution_id` is the thread's current execution.
    pub fn is_current(&self, execution_id: &str) -> bool {
        self.execution.execution_id == execution_id
    }

    /// Whether `execution_id` has ended (its task finished, failed, was cancelled or expired).
    pub fn is_terminal(&self, execution_id: &str) -> bool {
        self.terminal_execution_ids.contains(execution_id)
    }

    /// Whether the current execution waits for interrupt answers.
    pub fn is_waiting(&self) -> bool {
        !self.execution.pending.is_empty()
    }

    /// Ends the current execution: terminal, no task, nothing pending.
    pub fn end_execution(&mut self) {
        self.terminal_execution_ids
            .insert(self.execution.execution_id.clone());
        if let Some(task) = self.execution.task_id.take() {
            self.execution.last_task_id = Some(task);
        }
        self.execution.pending.clear();
        // No run of it follows.
        self.execution.message_ids.clear();
        let ended = &self.execution.execution_id;
        self.delivering.retain(|d| d.execution_id != *ended);
    }

    /// The document as JSON text: sorted keys, 2-space indent, raw UTF-8, trailing newline.
    pub fn to_json(&self) -> Vec<u8> {
        self.to_json_sealed(None)
    }

    /// [`ThreadDoc::to_json`] with `ownerMac`, the file store's seal of whom the thread belongs
    /// to (`owner_seal`), when given: a member of the file, not of the document in memory.
    pub(crate) fn to_json_sealed(&self, mac: Option<&str>) -> Vec<u8> {
        let doc = Versioned {
            schema_version: 1,
            doc: self,
        };
        // Sorted as a whole: the kernel inputs kept in `pending` have their own key order.
        let mut v = serde_json::to_value(doc).expect("document serialises");
        if let (Some(mac), Value::Object(members)) = (mac, &mut v) {
            members.insert("ownerMac".to_owned(), Value::String(mac.to_owned()));
        }
        let mut out = serde_json::to_vec_pretty(&sorted(v)).expect("document serialises");
        out.push(b'\n');
        out
    }

    /// Parses and validates a document for `thread_id`.
    pub fn from_json(bytes: &[u8], thread_id: &str) -> Result<ThreadDoc, StoreError> {
        read::document(bytes, thread_id).map(|(doc, _)| doc)
    }

    /// [`ThreadDoc::from_json`], and the file's `ownerMac` (`None`: absent, or not a string).
    pub(crate) fn from_json_sealed(
        bytes: &[u8],
        thread_id: &str,
    ) -> Result<(ThreadDoc, Option<String>), StoreError> {
        read::document(bytes, thread_id)
    }
}

/// The allow-listed projection of a kernel input (secrets and unknown keys dropped).
pub fn project_input(input: &Map<String, Value>) -> Map<String, Value> {
    input
        .iter()
        .filter(|(k, _)| PENDING_ALLOW_LIST.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const REFERENCE_FILES: &[(&str, &str)] = &[
        ("S01_after_run.thread-s1.json", "thread-s1"),
        ("S03_after_interrupt.thread-s3.json", "thread-s3"),
        ("S03_after_resume.thread-s3.json", "thread-s3"),
        (
            "S06_after_disconnect_and_task_end.thread-s6.json",
            "thread-s6",
        ),
        ("S08_after_error_resumes.thread-s8r.json", "thread-s8r"),
    ];

    fn reference(name: &str) -> Vec<u8> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../gateway/tests/data/reference-state")
            .join(name);
        std::fs::read(path).unwrap()
    }

    #[test]
    fn reference_files_load_and_round_trip_byte_identically() {
        for (name, thread) in REFERENCE_FILES {
            let bytes = reference(name);
            let doc = ThreadDoc::from_json(&bytes, thread).unwrap();
            assert_eq!(
                String::from_utf8(doc.to_json()).unwrap(),
                String::from_utf8(bytes).unwrap(),
                "{name}"
            );
        }
        let doc = ThreadDoc::from_json(
            &reference("S03_after_interrupt.thread-s3.json"),
            "thread-s3",
        )
        .unwrap();
        assert_eq!(doc.execution.pending.len(), 1);
        assert!(doc.execution.task_id.is_some());
    }

    #[test]
    fn invalid_documents_are_rejected() {
        let good = reference("S03_after_interrupt.thread-s3.json");
        assert!(ThreadDoc::from_json(&good, "other-thread").is_err());
        assert!(ThreadDoc::from_json(b"{}", "thread-s3").is_err());
        assert!(ThreadDoc::from_json(&good[..good.len() / 2], "thread-s3").is_err());
        let mut v: Value = serde_json::from_slice(&good).unwrap();
        let key = v["execution"]["pending"]
            .as_object()
            .unwrap()
            .keys()
            .next()
            .unwrap()
            .clone();
        let entry = v["execution"]["pending"][&key].clone();
        v["execution"]["pending"] = json!({"other-id": entry});
        assert!(ThreadDoc::from_json(&serde_json::to_vec(&v).unwrap(), "thread-s3").is_err());
        let mut v: Value = serde_json::from_slice(&good).unwrap();
        v["execution"]["pipelineSequence"] = json!(true);
        assert!(ThreadDoc::from_json(&serde_json::to_vec(&v).unwrap(), "thread-s3").is_err());
        let mut v: Value = serde_json::from_slice(&good).unwrap();
        v["execution"]["textSnapshotDigests"] = json!(["ABC"]);
        assert!(ThreadDoc::from_json(&serde_json::to_vec(&v).unwrap(), "thread-s3").is_err());
    }

    /// Answers on their way to the kernel are written only while there are some (reference
    /// files stay as they are), read back, and cleared with their execution's end.
    #[test]
    fn delivering_answers_round_trip_and_end_with_their_execution() {
        let bytes = reference("S03_after_interrupt.thread-s3.json");
        let mut doc = ThreadDoc::from_json(&bytes, "thread-s3").unwrap();
        assert!(doc.delivering.is_empty());
        assert!(!String::from_utf8(doc.to_json())
            .unwrap()
            .contains("deliveringAnswers"));
        let mark = AppliedDigest {
            execution_id: doc.execution.execution_id.clone(),
            interrupt_id: "perm-1".into(),
            digest: "d".into(),
        };
        doc.delivering.insert(mark.clone());
        let text = doc.to_json();
        let back = ThreadDoc::from_json(&text, "thread-s3").unwrap();
        assert_eq!(back.delivering.iter().collect::<Vec<_>>(), vec![&mark]);
        assert_eq!(back, doc);
        let mut v: Value = serde_json::from_slice(&text).unwrap();
        v["deliveringAnswers"] = json!("x");
        assert!(ThreadDoc::from_json(&serde_json::to_vec(&v).unwrap(), "thread-s3").is_err());
        doc.end_execution();
        assert!(doc.delivering.is_empty());
    }

    /// `execution.lastTaskId`: the task kept when an execution ends, written once known (a
    /// document of 0.16.0 stays as it was), read back, and lenient on what only the kernel's
    /// handoff reads.
    #[test]
    fn the_last_task_is_kept_when_an_execution_ends() {
        let bytes = reference("S03_after_interrupt.thread-s3.json");
        let mut doc = ThreadDoc::from_json(&bytes, "thread-s3").unwrap();
        assert_eq!(doc.execution.last_task_id, None);
        let task = doc.execution.task_id.clone().unwrap();
        doc.end_execution();
        assert_eq!(doc.execution.task_id, None);
        assert_eq!(doc.execution.last_task_id.as_deref(), Some(task.as_str()));
        let text = doc.to_json();
        let v: Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(v["execution"]["lastTaskId"], json!(task));
        assert_eq!(v["execution"]["taskId"], Value::Null);
        assert_eq!(ThreadDoc::from_json(&text, "thread-s3").unwrap(), doc);
        // An execution that ends without a task keeps the last one.
        doc.end_execution();
        assert_eq!(doc.execution.last_task_id.as_deref(), Some(task.as_str()));
        // Upstream's null, and anything that is no task id, read as none.
        for odd in [Value::Null, json!(5), json!("")] {
            let mut v = v.clone();
            v["execution"]["lastTaskId"] = odd;
            let back = ThreadDoc::from_json(&serde_json::to_vec(&v).unwrap(), "thread-s3").unwrap();
            assert_eq!(back.execution.last_task_id, None);
        }
    }

    fn refusal(v: &Value) -> String {
        match ThreadDoc::from_json(&serde_json::to_vec(v).unwrap(), "thread-s3") {
            Err(StoreError::Invalid(what)) => what,
            other => panic!("{other:?}"),
        }
    }

    /// A corrupt document is refused naming the first member that fails, in the order of the
    /// checks whatever the order of its keys.
    #[test]
    fn a_corrupt_document_names_its_first_fault() {
        let good: Value =
            serde_json::from_slice(&reference("S03_after_interrupt.thread-s3.json")).unwrap();
        let pending_id = good["execution"]["pending"]
            .as_object()
            .unwrap()
            .keys()
            .next()
            .unwrap()
            .clone();
        for (path, bad, what) in [
            (vec!["schemaVersion"], json!(2), "schemaVersion"),
            (vec!["threadId"], json!("thread-x"), "threadId"),
            (vec!["contextId"], json!(""), "contextId"),
            (vec!["userId"], json!(5), "userId"),
            (vec!["execution"], json!([]), "execution"),
            (vec!["execution", "taskId"], json!(true), "taskId"),
            (
                vec!["execution", "pipelineSequence"],
                json!(-1),
                "pipelineSequence",
            ),
            (
                vec!["execution", "pipelineSequence"],
                json!(1.5),
                "pipelineSequence",
            ),
            (
                vec!["execution", "pipelineOpenSteps"],
                json!([""]),
                "pipelineOpenSteps",
            ),
            (vec!["execution", "pending"], json!([]), "pending"),
            (
                vec!["execution", "pending", &pending_id, "sideband"],
                Value::Null,
                "pending.sideband",
            ),
            (vec!["runDigests"], Value::Null, "runDigests"),
            (
                vec!["appliedResumeDigests"],
                json!([["e", "i", "d"]]),
                "appliedResumeDigests",
            ),
            (
                vec!["deliveringAnswers"],
                json!([{"executionId": "e"}]),
                "interruptId",
            ),
            (
                vec!["terminalExecutionIds"],
                json!({}),
                "terminalExecutionIds",
            ),
            (vec!["expiredInterrupts"], json!([5]), "expiredInterrupts"),
            (vec!["activeRun"], json!({"runId": "r"}), "since"),
            (
                vec!["lastRun"],
                json!({"runId": "r", "outcome": {"success": null}}),
                "outcome",
            ),
            (vec!["lastRun"], json!("success"), "lastRun"),
            (vec!["owner"], json!(["alice"]), "owner"),
            (vec!["kernel"], json!(0), "kernel"),
        ] {
            let mut v = good.clone();
            let (last, init) = path.split_last().unwrap();
            let mut at = &mut v;
            for k in init {
                at = &mut at[*k];
            }
            at[*last] = bad;
            assert_eq!(refusal(&v), what, "{path:?}");
        }
        // Two faults: the earlier check names the document, wherever its key is.
        let mut v = good.clone();
        v["lastRun"] = json!(1);
        v["cwd"] = json!(1);
        let mut text = serde_json::to_string(&v).unwrap();
        assert_eq!(refusal(&v), "cwd");
        text = text.replacen('{', r#"{"lastRun": 1, "#, 1);
        let doc = ThreadDoc::from_json(text.as_bytes(), "thread-s3").unwrap_err();
        assert_eq!(doc.to_string(), "thread state is invalid: cwd");
        // Unknown members are ignored; a key given twice keeps its last value.
        let mut v = good.clone();
        v["comment"] = json!({"any": "thing"});
        let text = serde_json::to_string(&v)
            .unwrap()
            .replacen('{', r#"{"cwd": 1, "#, 1);
        assert!(ThreadDoc::from_json(text.as_bytes(), "thread-s3").is_ok());
    }

    /// The kernel a thread is on is written only when recorded (one kernel records none, so a
    /// reference file stays as it is) and read back.
    #[test]
    fn the_kernel_round_trips_and_is_written_only_when_recorded() {
        let bytes = reference("S03_after_interrupt.thread-s3.json");
        let mut doc = ThreadDoc::from_json(&bytes, "thread-s3").unwrap();
        assert_eq!(doc.kernel, None);
        assert_eq!(doc.to_stored().unwrap(), bytes);
        doc.kernel = Some("managed:1".into());
        let stored = doc.to_stored().unwrap();
        assert!(String::from_utf8_lossy(&stored).contains(r#""kernel": "managed:1""#));
        let back = ThreadDoc::from_json(&stored, "thread-s3").unwrap();
        assert_eq!(back, doc);
    }

    /// A thread's owner is written only when known (a reference file stays as it is) and read
    /// back; without one, the bound user stands for it.
    #[test]
    fn the_owner_round_trips_and_is_written_only_when_known() {
        let bytes = reference("S03_after_interrupt.thread-s3.json");
        let mut doc = ThreadDoc::from_json(&bytes, "thread-s3").unwrap();
        assert_eq!(doc.owner, None);
        assert!(!String::from_utf8(doc.to_stored().unwrap())
            .unwrap()
            .contains("\"owner\""));
        doc.user_id = Some("carol".into());
        assert_eq!(doc.owner_or_user(), Some("carol"));
        doc.owner = Some("alice".into());
        assert_eq!(doc.owner_or_user(), Some("alice"));
        let stored = doc.to_stored().unwrap();
        let back = ThreadDoc::from_json(&stored, "thread-s3").unwrap();
        assert_eq!(back.owner.as_deref(), Some("alice"));
        assert_eq!(back, doc);
    }

    /// `lastRun` holds the outcome and code as their enums; a value this gateway does not name
    /// (another version's) still loads and is written back as it was.
    #[test]
    fn last_run_outcomes_and_codes_are_typed_and_foreign_ones_kept() {
        let mut doc = ThreadDoc::from_json(
            &reference("S03_after_interrupt.thread-s3.json"),
            "thread-s3",
        )
        .unwrap();
        for outcome in [
            RunOutcome::Success,
            RunOutcome::Interrupt,
            RunOutcome::Error,
            RunOutcome::Cancelled,
            RunOutcome::Disconnected,
        ] {
            assert_eq!(
                serde_json::to_value(outcome).unwrap(),
                json!(outcome.as_str())
            );
        }
        doc.last_run = Some(LastRun {
            run_id: "r1".into(),
            outcome: RunOutcome::Error.into(),
            ended_at: "2026-01-01T00:00:00.000Z".into(),
            code: Some(Code::A2aUnavailable.into()),
        });
        let text = doc.to_json();
        let v: Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(
            v["lastRun"],
            json!({"code": "A2A_UNAVAILABLE", "endedAt": "2026-01-01T00:00:00.000Z",
                   "outcome": "error", "runId": "r1"})
        );
        assert_eq!(ThreadDoc::from_json(&text, "thread-s3").unwrap(), doc);
        let mut v = v;
        v["lastRun"]["outcome"] = json!("paused");
        v["lastRun"]["code"] = json!("SOME_LATER_CODE");
        let text = serde_json::to_vec_pretty(&v).unwrap();
        let back = ThreadDoc::from_json(&text, "thread-s3").unwrap();
        let last = back.last_run.clone().unwrap();
        assert_eq!(last.outcome, Recorded::Other("paused".into()));
        assert_eq!(last.code, Some(Recorded::Other("SOME_LATER_CODE".into())));
        let mut expected = text;
        expected.push(b'\n');
        assert_eq!(back.to_json(), expected);
    }
}
