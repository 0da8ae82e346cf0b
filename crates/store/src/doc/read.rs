//! Reading a thread document: the shape with every member taken as found, then one validation
//! pass that checks the members in a fixed order, so that a corrupt document is refused naming
//! the same member however its keys are ordered and whatever else is wrong with it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{self, DeserializeOwned, Deserializer, IntoDeserializer};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::{
    project_input, AppliedDigest, Execution, LastRun, PendingEntry, Recorded, RunMark, ThreadDoc,
};
use crate::StoreError;

/// Parses and validates a document for `thread_id`; its `ownerMac`, when a string.
pub(super) fn document(
    bytes: &[u8],
    thread_id: &str,
) -> Result<(ThreadDoc, Option<String>), StoreError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|_| invalid("not JSON"))?;
    if !v.is_object() {
        return Err(invalid("not an object"));
    }
    // Every member is taken as found: the shape of an object always reads.
    let mut shape = DocShape::deserialize(v).map_err(|_| invalid("not an object"))?;
    // Not the document's: the file store checks it (a wrong one is no seal).
    let mac = match std::mem::take(&mut shape.owner_mac) {
        Found::Is(mac) => mac,
        Found::Absent | Found::Wrong => None,
    };
    shape.validate(thread_id).map(|doc| (doc, mac))
}

fn invalid(what: &str) -> StoreError {
    StoreError::Invalid(what.to_owned())
}

impl<T: DeserializeOwned> Recorded<T> {
    /// The value named by `s` (its serde name, which is its name on disk), or `s` as it is.
    fn read(s: String) -> Recorded<T> {
        let known: Result<T, de::value::Error> = T::deserialize(s.as_str().into_deserializer());
        match known {
            Ok(t) => Recorded::Known(t),
            Err(_) => Recorded::Other(s),
        }
    }
}

/// A member as found in a document being read: absent, of its JSON type, or of another one.
#[derive(Default)]
enum Found<T> {
    #[default]
    Absent,
    Is(T),
    Wrong,
}

impl<T: DeserializeOwned> Found<T> {
    fn of(v: Value) -> Found<T> {
        T::deserialize(v).map_or(Found::Wrong, Found::Is)
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Found<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(Found::of)
    }
}

impl<T> Found<T> {
    /// Present and of its type.
    fn given(self, key: &str) -> Result<T, StoreError> {
        match self {
            Found::Is(x) => Ok(x),
            Found::Absent | Found::Wrong => Err(invalid(key)),
        }
    }

    /// Of its type if present.
    fn or(self, absent: T, key: &str) -> Result<T, StoreError> {
        match self {
            Found::Absent => Ok(absent),
            Found::Is(x) => Ok(x),
            Found::Wrong => Err(invalid(key)),
        }
    }
}

impl<T> Found<Option<T>> {
    /// Absent or null is `None`.
    fn optional(self, key: &str) -> Result<Option<T>, StoreError> {
        self.or(None, key)
    }
}

impl Found<String> {
    /// A non-empty string.
    fn text(self, key: &str) -> Result<String, StoreError> {
        match self {
            Found::Is(s) if !s.is_empty() => Ok(s),
            _ => Err(invalid(key)),
        }
    }
}

/// A JSON object read as `T` (a derived struct would take an array too, by position).
struct Obj<T>(T);

impl<'de, T: DeserializeOwned> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let m = Map::deserialize(d)?;
        T::deserialize(Value::Object(m))
            .map(Obj)
            .map_err(de::Error::custom)
    }
}

/// `pipelineSequence`: a non-negative integer, also written as an integral float (below 9e15,
/// where a float still holds every integer exactly).
struct Sequence(u64);

impl<'de> Deserialize<'de> for Sequence {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = Sequence;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a non-negative integer")
            }
            fn visit_u64<E: de::Error>(self, n: u64) -> Result<Sequence, E> {
                Ok(Sequence(n))
            }
            fn visit_i64<E: de::Error>(self, n: i64) -> Result<Sequence, E> {
                u64::try_from(n)
                    .map(Sequence)
                    .map_err(|_| E::custom("negative"))
            }
            fn visit_f64<E: de::Error>(self, f: f64) -> Result<Sequence, E> {
                if f >= 0.0 && f.fract() == 0.0 && f < 9.0e15 {
                    Ok(Sequence(f as u64))
                } else {
                    Err(E::custom("not an integer"))
                }
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// The document's members as found (unknown ones are ignored).
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct DocShape {
    schema_version: Found<f64>,
    thread_id: Found<String>,
    context_id: Found<String>,
    cwd: Found<String>,
    user_id: Found<Option<String>>,
    #[serde(rename = "iacCodeSessionId")]
    session_id: Found<Option<String>>,
    execution: Found<Obj<ExecutionShape>>,
    run_digests: Found<BTreeMap<String, Found<String>>>,
    run_order: Found<Option<Vec<Found<String>>>>,
    applied_resume_digests: Found<Vec<Found<Obj<MarkShape>>>>,
    #[serde(rename = "deliveringAnswers")]
    delivering: Found<Option<Vec<Found<Obj<MarkShape>>>>>,
    terminal_execution_ids: Found<Vec<Found<String>>>,
    expired_interrupts: Found<Option<Vec<Found<Obj<MarkShape>>>>>,
    active_run: Found<Option<Obj<RunMarkShape>>>,
    last_run: Found<Option<Obj<LastRunShape>>>,
    owner: Found<Option<String>>,
    owner_mac: Found<Option<String>>,
    kernel: Found<Option<String>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct ExecutionShape {
    execution_id: Found<String>,
    ros_invocation_id: Found<String>,
    task_id: Found<Option<String>>,
    last_task_id: Found<Option<String>>,
    pipeline_sequence: Found<Option<Sequence>>,
    pipeline_open_steps: Found<Option<Vec<String>>>,
    text_snapshot_digests: Found<Option<Vec<String>>>,
    message_ids: Found<Option<Vec<String>>>,
    /// Read as an object in its own order; each entry is checked on its own.
    pending: Found<Option<Map<String, Value>>>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct PendingShape {
    value: Found<Map<String, Value>>,
    sideband: Found<bool>,
    expires_at: Found<Option<String>>,
}

/// An applied, delivering (with `digest`) or expired (without) answer.
#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct MarkShape {
    execution_id: Found<String>,
    interrupt_id: Found<String>,
    digest: Found<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct RunMarkShape {
    run_id: Found<String>,
    since: Found<String>,
}

#[derive(Deserialize, Default)]
#[serde(default, rename_all = "camelCase")]
struct LastRunShape {
    run_id: Found<String>,
    outcome: Found<String>,
    code: Found<Option<String>>,
    ended_at: Found<String>,
}

fn is_digest(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A list of strings that each pass `ok`; absent or null is empty.
fn strings(
    found: Found<Option<Vec<String>>>,
    key: &str,
    ok: fn(&str) -> bool,
) -> Result<BTreeSet<String>, StoreError> {
    let list = found.optional(key)?.unwrap_or_default();
    if list.iter().all(|s| ok(s)) {
        Ok(list.into_iter().collect())
    } else {
        Err(invalid(key))
    }
}

/// Answers with all three members (`key` names the list).
fn answers(
    list: Vec<Found<Obj<MarkShape>>>,
    key: &str,
) -> Result<BTreeSet<AppliedDigest>, StoreError> {
    list.into_iter()
        .map(|m| {
            let Found::Is(Obj(m)) = m else {
                return Err(invalid(key));
            };
            Ok(AppliedDigest {
                execution_id: m.execution_id.text("executionId")?,
                interrupt_id: m.interrupt_id.text("interruptId")?,
                digest: m.digest.text("digest")?,
            })
        })
        .collect()
}

/// The non-empty strings of a list (others are dropped, as the reference adapter does).
fn non_empty(list: Vec<Found<String>>) -> impl Iterator<Item = String> {
    list.into_iter().filter_map(|x| match x {
        Found::Is(s) if !s.is_empty() => Some(s),
        _ => None,
    })
}

impl DocShape {
    /// The checks, in the order that decides which member a corrupt document is refused for.
    fn validate(self, thread_id: &str) -> Result<ThreadDoc, StoreError> {
        if !matches!(self.schema_version, Found::Is(v) if v == 1.0) {
            return Err(invalid("schemaVersion"));
        }
        if !matches!(&self.thread_id, Found::Is(t) if t == thread_id) {
            return Err(invalid("threadId"));
        }
        let context_id = self.context_id.text("contextId")?;
        let cwd = self.cwd.text("cwd")?;
        let user_id = self.user_id.optional("userId")?;
        let session_id = self.session_id.optional("iacCodeSessionId")?;
        let Obj(execution) = self.execution.given("execution")?;
        let execution = execution.validate()?;
        let run_digests: BTreeMap<String, String> = self
            .run_digests
            .given("runDigests")?
            .into_iter()
            .filter_map(|(k, v)| match v {
                Found::Is(v) if !k.is_empty() && !v.is_empty() => Some((k, v)),
                _ => None,
            })
            .collect();
        // Only runs the document still records, each once (a file another program rewrote may
        // have lost some): the order is a hint for pruning, never a fault.
        let mut ordered = BTreeSet::new();
        let run_order = non_empty(self.run_order.optional("runOrder")?.unwrap_or_default())
            .filter(|r| run_digests.contains_key(r) && ordered.insert(r.clone()))
            .collect();
        let applied_resume_digests = answers(
            self.applied_resume_digests.given("appliedResumeDigests")?,
            "appliedResumeDigests",
        )?;
        let delivering = answers(
            self.delivering
                .optional("deliveringAnswers")?
                .unwrap_or_default(),
            "deliveringAnswers",
        )?;
        let terminal_execution_ids =
            non_empty(self.terminal_execution_ids.given("terminalExecutionIds")?).collect();
        let expired_interrupts = self
            .expired_interrupts
            .optional("expiredInterrupts")?
            .unwrap_or_default()
            .into_iter()
            .map(|m| {
                let Found::Is(Obj(m)) = m else {
                    return Err(invalid("expiredInterrupts"));
                };
                Ok((
                    m.execution_id.text("executionId")?,
                    m.interrupt_id.text("interruptId")?,
                ))
            })
            .collect::<Result<_, StoreError>>()?;
        let active_run = match self.active_run.optional("activeRun")? {
            None => None,
            Some(Obj(a)) => Some(RunMark {
                run_id: a.run_id.text("runId")?,
                since: a.since.text("since")?,
            }),
        };
        let last_run = match self.last_run.optional("lastRun")? {
            None => None,
            // Checked in the order of the members on disk: run, outcome, code, end.
            Some(Obj(l)) => Some(LastRun {
                run_id: l.run_id.text("runId")?,
                outcome: Recorded::read(l.outcome.text("outcome")?),
                code: l.code.optional("code")?.map(Recorded::read),
                ended_at: l.ended_at.text("endedAt")?,
            }),
        };
        let owner = self.owner.optional("owner")?;
        let kernel = self.kernel.optional("kernel")?;
        Ok(ThreadDoc {
            thread_id: thread_id.to_owned(),
            context_id,
            cwd,
            user_id,
            session_id,
            execution,
            run_digests,
            run_order,
            applied_resume_digests,
            terminal_execution_ids,
            expired_interrupts,
            delivering,
            active_run,
            last_run,
            owner,
            kernel,
        })
    }
}

impl ExecutionShape {
    fn validate(self) -> Result<Execution, StoreError> {
        let execution_id = self.execution_id.text("executionId")?;
        let ros_invocation_id = self.ros_invocation_id.text("rosInvocationId")?;
        let task_id = self.task_id.optional("taskId")?;
        // Only the kernel's handoff reads it, as iac-code's adapter does (no type check there):
        // anything but a task id is none, never an unreadable thread.
        let last_task_id = match self.last_task_id {
            Found::Is(Some(t)) if !t.is_empty() => Some(t),
            _ => None,
        };
        let pipeline_sequence = self
            .pipeline_sequence
            .optional("pipelineSequence")?
            .map_or(0, |s| s.0);
        let pipeline_open_steps = strings(self.pipeline_open_steps, "pipelineOpenSteps", |s| {
            !s.is_empty()
        })?;
        let text_snapshot_digests =
            strings(self.text_snapshot_digests, "textSnapshotDigests", is_digest)?;
        let message_ids = strings(self.message_ids, "messageIds", |s| !s.is_empty())?;
        let pending = self
            .pending
            .optional("pending")?
            .unwrap_or_default()
            .into_iter()
            .map(|(id, entry)| {
                let Found::Is(Obj(entry)) = Found::<Obj<PendingShape>>::of(entry) else {
                    return Err(invalid("pending"));
                };
                let value = entry.value.given("pending.value")?;
                let sideband = entry.sideband.or(false, "pending.sideband")?;
                let expires_at = entry.expires_at.optional("pending.expiresAt")?;
                let value = project_input(&value);
                if value.get("inputId").and_then(Value::as_str) != Some(id.as_str()) {
                    return Err(invalid("pending.inputId"));
                }
                Ok((
                    id,
                    PendingEntry {
                        value,
                        sideband,
                        expires_at,
                    },
                ))
            })
            .collect::<Result<_, StoreError>>()?;
        Ok(Execution {
            execution_id,
            ros_invocation_id,
            task_id,
            last_task_id,
            pipeline_sequence,
            pipeline_open_steps,
            text_snapshot_digests,
            message_ids,
            pending,
        })
    }
}
