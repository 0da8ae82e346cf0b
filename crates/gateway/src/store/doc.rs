//! The schemaVersion-1 thread document: its in-memory form, serialisation (sorted keys, 2-space
//! indent, trailing newline) and validation on load.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use super::StoreError;

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
#[derive(Debug, Clone, PartialEq)]
pub struct PendingEntry {
    /// The allow-listed projection of the kernel input.
    pub value: Map<String, Value>,
    pub sideband: bool,
    /// RFC 3339 expiry instant (a field the reference does not write; it ignores it), `None` when
    /// expiry is off.
    pub expires_at: Option<String>,
}

/// The current execution of a thread.
#[derive(Debug, Clone, PartialEq)]
pub struct Execution {
    pub execution_id: String,
    pub ros_invocation_id: String,
    pub task_id: Option<String>,
    pub pipeline_sequence: u64,
    pub pipeline_open_steps: BTreeSet<String>,
    pub text_snapshot_digests: BTreeSet<String>,
    /// Pending interrupts in insertion order.
    pub pending: Vec<(String, PendingEntry)>,
}

/// An applied resume answer.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AppliedDigest {
    pub execution_id: String,
    pub interrupt_id: String,
    pub digest: String,
}

/// The run that holds a thread (`activeRun`, a gateway addition written only while one does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunMark {
    pub run_id: String,
    /// RFC 3339, when the run was admitted.
    pub since: String,
}

/// How the last run that held a thread ended (`lastRun`, a gateway addition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastRun {
    pub run_id: String,
    /// `success`, `interrupt`, `error`, `cancelled` or `disconnected`.
    pub outcome: String,
    /// The `RUN_ERROR` code of an error.
    pub code: Option<String>,
    /// RFC 3339.
    pub ended_at: String,
}

/// A thread's durable state.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadDoc {
    pub thread_id: String,
    pub context_id: String,
    pub cwd: String,
    pub user_id: Option<String>,
    pub session_id: Option<String>,
    pub execution: Execution,
    pub run_digests: BTreeMap<String, String>,
    pub applied_resume_digests: BTreeSet<AppliedDigest>,
    pub terminal_execution_ids: BTreeSet<String>,
    /// `expiredInterrupts` (written only when non-empty, so reference files stay as they are):
    /// interrupts that
    /// expired, remembered with their execution so later answers get `EXECUTION_EXPIRED`.
    pub expired_interrupts: BTreeSet<(String, String)>,
    /// `deliveringAnswers` (written only when non-empty): answers on their way to the kernel,
    /// marked before they are sent and cleared when the kernel's acceptance is recorded. One left
    /// by a run that did not finish (a crash, a takeover) is settled from the task's state rather
    /// than sent again.
    pub delivering: BTreeSet<AppliedDigest>,
    /// `activeRun`: set at admission, cleared when the run lets go of the thread. Still set after
    /// a start-up means the run was lost with the process that ran it.
    pub active_run: Option<RunMark>,
    /// `lastRun`: written when a run lets go of the thread.
    pub last_run: Option<LastRun>,
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

fn invalid(what: &str) -> StoreError {
    StoreError::Invalid(what.to_owned())
}

impl ThreadDoc {
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
        self.execution.task_id = None;
        self.execution.pending.clear();
        let ended = &self.execution.execution_id;
        self.delivering.retain(|d| d.execution_id != *ended);
    }

    /// The document as JSON text: sorted keys, 2-space indent, raw UTF-8, trailing newline.
    pub fn to_json(&self) -> Vec<u8> {
        let mut pending = Map::new();
        for (id, e) in &self.execution.pending {
            let mut entry =
                json!({"value": Value::Object(e.value.clone()), "sideband": e.sideband});
            if let Some(x) = &e.expires_at {
                entry["expiresAt"] = Value::String(x.clone());
            }
            pending.insert(id.clone(), entry);
        }
        let v = json!({
            "schemaVersion": 1,
            "threadId": self.thread_id,
            "contextId": self.context_id,
            "cwd": self.cwd,
            "userId": self.user_id,
            "iacCodeSessionId": self.session_id,
            "execution": {
                "executionId": self.execution.execution_id,
                "rosInvocationId": self.execution.ros_invocation_id,
                "taskId": self.execution.task_id,
                "pipelineSequence": self.execution.pipeline_sequence,
                "pipelineOpenSteps": self.execution.pipeline_open_steps,
                "textSnapshotDigests": self.execution.text_snapshot_digests,
                "pending": pending,
            },
            "runDigests": self.run_digests,
            "appliedResumeDigests": self.applied_resume_digests.iter().map(|a| json!({
                "executionId": a.execution_id, "interruptId": a.interrupt_id, "digest": a.digest
            })).collect::<Vec<_>>(),
            "terminalExecutionIds": self.terminal_execution_ids,
        });
        let mut v = v;
        if !self.expired_interrupts.is_empty() {
            v["expiredInterrupts"] = Value::Array(
                self.expired_interrupts
                    .iter()
                    .map(|(e, i)| json!({"executionId": e, "interruptId": i}))
                    .collect(),
            );
        }
        if !self.delivering.is_empty() {
            v["deliveringAnswers"] = Value::Array(
                self.delivering
                    .iter()
                    .map(|a| {
                        json!({"executionId": a.execution_id, "interruptId": a.interrupt_id, "digest": a.digest})
                    })
                    .collect(),
            );
        }
        if let Some(a) = &self.active_run {
            v["activeRun"] = json!({"runId": a.run_id, "since": a.since});
        }
        if let Some(l) = &self.last_run {
            let mut last = json!({"runId": l.run_id, "outcome": l.outcome, "endedAt": l.ended_at});
            if let Some(c) = &l.code {
                last["code"] = Value::String(c.clone());
            }
            v["lastRun"] = last;
        }
        let mut out = serde_json::to_vec_pretty(&sorted(v)).expect("document serialises");
        out.push(b'\n');
        out
    }

    /// Parses and validates a document for `thread_id`.
    pub fn from_json(bytes: &[u8], thread_id: &str) -> Result<ThreadDoc, StoreError> {
        let v: Value = serde_json::from_slice(bytes).map_err(|_| invalid("not JSON"))?;
        let o = v.as_object().ok_or_else(|| invalid("not an object"))?;
        match o.get("schemaVersion") {
            Some(Value::Number(n)) if n.as_f64() == Some(1.0) => {}
            _ => return Err(invalid("schemaVersion")),
        }
        if o.get("threadId").and_then(Value::as_str) != Some(thread_id) {
            return Err(invalid("threadId"));
        }
        let req = |m: &Map<String, Value>, k: &str| -> Result<String, StoreError> {
            m.get(k)
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .ok_or_else(|| invalid(k))
        };
        let opt = |m: &Map<String, Value>, k: &str| -> Result<Option<String>, StoreError> {
            match m.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(invalid(k)),
            }
        };
        let context_id = req(o, "contextId")?;
        let cwd = req(o, "cwd")?;
        let user_id = opt(o, "userId")?;
        let session_id = opt(o, "iacCodeSessionId")?;
        let e = o
            .get("execution")
            .and_then(Value::as_object)
            .ok_or_else(|| invalid("execution"))?;
        let execution_id = req(e, "executionId")?;
        let ros_invocation_id = req(e, "rosInvocationId")?;
        let task_id = opt(e, "taskId")?;
        let pipeline_sequence = match e.get("pipelineSequence") {
            None | Some(Value::Null) => 0,
            Some(Value::Number(n)) => match (n.as_u64(), n.as_f64()) {
                (Some(u), _) => u,
                (None, Some(f)) if f >= 0.0 && f.fract() == 0.0 && f < 9.0e15 => f as u64,
                _ => return Err(invalid("pipelineSequence")),
            },
            Some(_) => return Err(invalid("pipelineSequence")),
        };
        let str_list =
            |k: &str, check: &dyn Fn(&str) -> bool| -> Result<BTreeSet<String>, StoreError> {
                match e.get(k) {
                    None | Some(Value::Null) => Ok(BTreeSet::new()),
                    Some(Value::Array(a)) => a
                        .iter()
                        .map(|x| {
                            x.as_str()
                                .filter(|s| check(s))
                                .map(str::to_owned)
                                .ok_or_else(|| invalid(k))
                        })
                        .collect(),
                    Some(_) => Err(invalid(k)),
                }
            };
        let pipeline_open_steps = str_list("pipelineOpenSteps", &|s| !s.is_empty())?;
        let text_snapshot_digests = str_list("textSnapshotDigests", &|s| {
            s.len() == 64
                && s.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })?;
        let mut pending = Vec::new();
        match e.get("pending") {
            None | Some(Value::Null) => {}
            Some(Value::Object(p)) => {
                for (id, entry) in p {
                    let entry = entry.as_object().ok_or_else(|| invalid("pending"))?;
                    let value = entry
                        .get("value")
                        .and_then(Value::as_object)
                        .ok_or_else(|| invalid("pending.value"))?;
                    let sideband = match entry.get("sideband") {
                        None => false,
                        Some(Value::Bool(b)) => *b,
                        Some(_) => return Err(invalid("pending.sideband")),
                    };
                    let expires_at = match entry.get("expiresAt") {
                        None | Some(Value::Null) => None,
                        Some(Value::String(s)) => Some(s.clone()),
                        Some(_) => return Err(invalid("pending.expiresAt")),
                    };
                    let value = project_input(value);
                    if value.get("inputId").and_then(Value::as_str) != Some(id.as_str()) {
                        return Err(invalid("pending.inputId"));
                    }
                    pending.push((
                        id.clone(),
                        PendingEntry {
                            value,
                            sideband,
                            expires_at,
                        },
                    ));
                }
            }
            Some(_) => return Err(invalid("pending")),
        }
        let run_digests = match o.get("runDigests") {
            Some(Value::Object(m)) => m
                .iter()
                .filter_map(|(k, v)| {
                    let v = v.as_str().filter(|s| !s.is_empty())?;
                    (!k.is_empty()).then(|| (k.clone(), v.to_owned()))
                })
                .collect(),
            _ => return Err(invalid("runDigests")),
        };
        let digests = |a: &[Value], key: &str| {
            a.iter()
                .map(|x| {
                    let x = x.as_object().ok_or_else(|| invalid(key))?;
                    Ok(AppliedDigest {
                        execution_id: req(x, "executionId")?,
                        interrupt_id: req(x, "interruptId")?,
                        digest: req(x, "digest")?,
                    })
                })
                .collect::<Result<BTreeSet<_>, StoreError>>()
        };
        let applied_resume_digests = match o.get("appliedResumeDigests") {
            Some(Value::Array(a)) => digests(a, "appliedResumeDigests")?,
            _ => return Err(invalid("appliedResumeDigests")),
        };
        let delivering = match o.get("deliveringAnswers") {
            None | Some(Value::Null) => BTreeSet::new(),
            Some(Value::Array(a)) => digests(a, "deliveringAnswers")?,
            Some(_) => return Err(invalid("deliveringAnswers")),
        };
        let terminal_execution_ids = match o.get("terminalExecutionIds") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_str().filter(|s| !s.is_empty()).map(str::to_owned))
                .collect(),
            _ => return Err(invalid("terminalExecutionIds")),
        };
        let expired_interrupts = match o.get("expiredInterrupts") {
            None | Some(Value::Null) => BTreeSet::new(),
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    let x = x.as_object().ok_or_else(|| invalid("expiredInterrupts"))?;
                    Ok((req(x, "executionId")?, req(x, "interruptId")?))
                })
                .collect::<Result<_, StoreError>>()?,
            Some(_) => return Err(invalid("expiredInterrupts")),
        };
        let active_run = match o.get("activeRun") {
            None | Some(Value::Null) => None,
            Some(Value::Object(a)) => Some(RunMark {
                run_id: req(a, "runId")?,
                since: req(a, "since")?,
            }),
            Some(_) => return Err(invalid("activeRun")),
        };
        let last_run = match o.get("lastRun") {
            None | Some(Value::Null) => None,
            Some(Value::Object(l)) => Some(LastRun {
                run_id: req(l, "runId")?,
                outcome: req(l, "outcome")?,
                code: opt(l, "code")?,
                ended_at: req(l, "endedAt")?,
            }),
            Some(_) => return Err(invalid("lastRun")),
        };
        Ok(ThreadDoc {
            thread_id: thread_id.to_owned(),
            context_id,
            cwd,
            user_id,
            session_id,
            execution: Execution {
                execution_id,
                ros_invocation_id,
                task_id,
                pipeline_sequence,
                pipeline_open_steps,
                text_snapshot_digests,
                pending,
            },
            run_digests,
            applied_resume_digests,
            terminal_execution_ids,
            expired_interrupts,
            delivering,
            active_run,
            last_run,
        })
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
            .join("tests/data/reference-state")
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
}
