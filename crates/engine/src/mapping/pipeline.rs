//! Pipeline envelopes: live dedupe, standard projections, step lifecycle, CUSTOM allow-list.

use std::collections::{BTreeSet, HashSet};

use agui::Event;
use serde_json::{Map, Value};

use super::Mapper;

/// The `iac-code.pipeline.v1` CUSTOM allow-list: the pipeline events a client may see.
pub const ALLOW_LIST: &[&str] = &[
    "pipeline_started",
    "pipeline_resumed",
    "pipeline_completed",
    "pipeline_error",
    "pipeline_warning",
    "backup_blocked",
    "candidate_started",
    "candidate_completed",
    "candidate_failed",
    "candidate_interrupted",
    "candidate_restart_requested",
    "candidate_selected",
    "candidate_detail_shown",
    "candidate_step_failed",
    "sub_pipeline_started",
    "sub_pipeline_completed",
    "sub_step_failed",
    "step_failed",
    "stack_progress",
    "stack_instances_progress",
    "stack_current_changed",
    "cleanup_started",
    "cleanup_progress",
    "cleanup_completed",
    "cleanup_failed",
    "rollback_triggered",
    "rollback_completed",
    "context_compaction_started",
    "context_compacted",
    "context_compaction_failed",
    "fields_marked_stale",
    "diagram_shown",
    "mcp_status",
    "tool_progress",
];

pub fn is_allow_listed(event_type: &str) -> bool {
    ALLOW_LIST.contains(&event_type)
}

/// What an envelope's `eventType` means to the projections (the CUSTOM allow-list aside).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    TextDelta,
    ThinkingDelta,
    ToolStarted,
    ToolResult,
    Usage,
    /// A step (or a candidate's step) starts, or an answer resumes it.
    StepOpened,
    /// A step (or a candidate's step) ends, either way.
    StepClosed,
    Other,
}

impl Kind {
    fn of(event_type: &str) -> Kind {
        match event_type {
            "text_delta" => Kind::TextDelta,
            "thinking_delta" => Kind::ThinkingDelta,
            "tool_started" => Kind::ToolStarted,
            "tool_result" => Kind::ToolResult,
            "usage" => Kind::Usage,
            "step_started" | "candidate_step_started" | "input_received" => Kind::StepOpened,
            "step_completed"
            | "step_failed"
            | "candidate_step_completed"
            | "candidate_step_failed" => Kind::StepClosed,
            _ => Kind::Other,
        }
    }
}

#[derive(Debug)]
pub(crate) struct PipelineState {
    seen_event_ids: HashSet<String>,
    /// Highest sequence seen (the durable pipeline position).
    pub(crate) high_water: u64,
    /// Durable open steps (keys), initialised from the execution.
    pub(crate) durable_open_steps: BTreeSet<String>,
    /// Steps opened in this run.
    pub(crate) run_open_steps: BTreeSet<String>,
    pub(crate) pipeline_run_id: String,
}

impl PipelineState {
    pub(crate) fn new(thread_id: &str) -> PipelineState {
        PipelineState {
            seen_event_ids: HashSet::new(),
            high_water: 0,
            durable_open_steps: BTreeSet::new(),
            run_open_steps: BTreeSet::new(),
            pipeline_run_id: format!("pipeline-{thread_id}"),
        }
    }
}

/// The AG-UI step name of a step key: the step id for `step:` keys, the whole key otherwise.
pub fn step_name(key: &str) -> String {
    key.strip_prefix("step:").unwrap_or(key).to_owned()
}

fn str_of(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn seq_of(v: Option<&Value>) -> Option<u64> {
    super::counter(v)
}

fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
    }
}

impl Mapper {
    /// Sets the durable open steps and pipeline position of the execution (run start).
    pub fn set_pipeline_state(&mut self, open_steps: BTreeSet<String>, sequence: u64) {
        self.pipe.durable_open_steps = open_steps;
        self.pipe.high_water = sequence;
    }

    /// Re-opens the durable open steps at the start of a run (`STEP_STARTED` each, sorted).
    pub fn reopen_steps(&mut self, out: &mut Vec<Event>) {
        for key in self.pipe.durable_open_steps.clone() {
            if self.pipe.run_open_steps.insert(key.clone()) {
                out.push(Event::StepStarted {
                    step_name: step_name(&key),
                });
            }
        }
    }

    /// One live envelope.
    pub(crate) fn map_envelope(&mut self, env: &Value, out: &mut Vec<Event>) {
        let Some(e) = env.as_object() else { return };
        // Live dedupe: eventId first, then sequence.
        let event_id = str_of(e.get("eventId"));
        if let Some(id) = event_id {
            if self.pipe.seen_event_ids.contains(id) {
                return;
            }
        }
        if let Some(seq) = seq_of(e.get("sequence")).filter(|s| *s > 0) {
            if seq <= self.pipe.high_water {
                return;
            }
            self.pipe.high_water = seq;
        }
        if let Some(id) = event_id {
            self.pipe.seen_event_ids.insert(id.to_owned());
        }
        self.project_envelope(e, out);
    }

    /// Standard projections, step lifecycle and CUSTOM passthrough of one envelope.
    #[allow(clippy::collapsible_match)]
    pub(crate) fn project_envelope(&mut self, e: &Map<String, Value>, out: &mut Vec<Event>) {
        let event_type = str_of(e.get("eventType")).unwrap_or("pipeline_event");
        let kind = Kind::of(event_type);
        let step = e
            .get("candidateStep")
            .filter(|v| truthy(Some(v)))
            .or_else(|| e.get("step"))
            .and_then(Value::as_object);
        let step_id = step.and_then(|s| str_of(s.get("id")));
        if let Some(data) = e.get("data").and_then(Value::as_object) {
            match kind {
                Kind::TextDelta => {
                    if let Some(text) = str_of(data.get("text")) {
                        let id = self.pipeline_message_id(e);
                        self.emit_text(&id, text, false, out);
                    }
                }
                Kind::ThinkingDelta => {
                    if data.get("type").and_then(Value::as_str) == Some("raw_thinking") {
                        if let Some(text) = str_of(data.get("text")) {
                            let id = format!("reasoning-{}", self.pipeline_message_id(e));
                            self.reasoning(&id, text, out);
                        }
                    }
                }
                Kind::ToolStarted => {
                    let id = str_of(data.get("toolUseId"))
                        .map(str::to_owned)
                        .unwrap_or_else(|| format!("tool-{}", (self.gen)()));
                    let name = str_of(data.get("toolName")).unwrap_or("tool").to_owned();
                    let args = match data.get("input").filter(|v| !v.is_null()) {
                        Some(input) => crate::canonical::canonical_value(input),
                        None => {
                            crate::canonical::canonical_value(&serde_json::json!({"summary": null}))
                        }
                    };
                    self.tool_call(&id, &name, Some(args), out);
                }
                Kind::ToolResult => {
                    if let Some(id) = str_of(data.get("toolUseId")) {
                        let content = match data.get("result") {
                            Some(Value::String(s)) => s.clone(),
                            Some(v) => crate::canonical::canonical_value(v),
                            None => "null".into(),
                        };
                        self.tool_result(id, content, out);
                    }
                }
                Kind::Usage => self.record_usage(data),
                Kind::StepOpened | Kind::StepClosed | Kind::Other => {}
            }
        }
        if let Some(step_id) = step_id {
            let cid = e.get("candidate").and_then(Value::as_object).and_then(|c| {
                str_of(c.get("id"))
                    .or_else(|| str_of(c.get("subPipelineId")))
                    .or_else(|| str_of(c.get("runId")))
            });
            let key = match cid {
                Some(c) => format!("candidate:{c}:{step_id}"),
                None => format!("step:{step_id}"),
            };
            match kind {
                Kind::StepOpened => {
                    self.pipe.durable_open_steps.insert(key.clone());
                    if self.pipe.run_open_steps.insert(key.clone()) {
                        out.push(Event::StepStarted {
                            step_name: step_name(&key),
                        });
                    }
                }
                Kind::StepClosed => {
                    if self.pipe.durable_open_steps.remove(&key) {
                        if !self.pipe.run_open_steps.remove(&key) {
                            out.push(Event::StepStarted {
                                step_name: step_name(&key),
                            });
                        }
                        out.push(Event::StepFinished {
                            step_name: step_name(&key),
                        });
                    }
                }
                _ => {}
            }
        }
        if is_allow_listed(event_type) {
            out.push(Event::Custom {
                name: "iac-code.pipeline.v1".into(),
                value: Value::Object(e.clone()),
            });
        }
    }

    /// `pipeline-message:<pipelineRunId>:<scope|pipeline>[:<coord>…]`.
    fn pipeline_message_id(&self, e: &Map<String, Value>) -> String {
        let run = &self.pipe.pipeline_run_id;
        let scope = str_of(e.get("scope")).unwrap_or("pipeline");
        let mut id = format!("pipeline-message:{run}:{scope}");
        let mut seen: Vec<&str> = Vec::new();
        for key in ["candidate", "candidateStep", "step"] {
            if let Some(o) = e.get(key).and_then(Value::as_object) {
                if let Some(c) = str_of(o.get("runId")).or_else(|| str_of(o.get("id"))) {
                    if !seen.contains(&c) {
                        seen.push(c);
                        id.push(':');
                        id.push_str(c);
                    }
                }
            }
        }
        id
    }
}

impl Mapper {
    /// Pipeline recovery after a pause: `ACTIVITY_SNAPSHOT` of the snapshot, then the missed events.
    pub fn map_recovery(&mut self, state: &Value, out: &mut Vec<Event>) {
        let Some(snapshot) = state.get("snapshot").filter(|s| s.is_object()) else {
            return;
        };
        if let Some(id) = str_of(snapshot.get("pipelineRunId")) {
            self.pipe.pipeline_run_id = id.to_owned();
        }
        let run = self.pipe.pipeline_run_id.clone();
        out.push(Event::ActivitySnapshot {
            message_id: format!("pipeline:{run}"),
            activity_type: "iac-code.pipeline.v1".into(),
            content: serde_json::json!({"schemaVersion": 1, "pipelineRunId": run, "snapshot": snapshot}),
            replace: true,
        });
        if let Some(events) = state.get("events").and_then(Value::as_array) {
            for env in events {
                let Some(e) = env.as_object() else { continue };
                match str_of(e.get("eventId")) {
                    Some(id) => {
                        if !self.pipe.seen_event_ids.insert(id.to_owned()) {
                            continue;
                        }
                    }
                    None => {
                        if seq_of(e.get("sequence")).is_some_and(|s| s <= self.pipe.high_water) {
                            continue;
                        }
                    }
                }
                if let Some(s) = seq_of(e.get("sequence")) {
                    self.pipe.high_water = self.pipe.high_water.max(s);
                }
                self.project_envelope(e, out);
            }
        }
        if let Some(last) = seq_of(snapshot.get("lastSequence")) {
            self.pipe.high_water = self.pipe.high_water.max(last);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_kinds() {
        for (t, k) in [
            ("text_delta", Kind::TextDelta),
            ("thinking_delta", Kind::ThinkingDelta),
            ("tool_started", Kind::ToolStarted),
            ("tool_result", Kind::ToolResult),
            ("usage", Kind::Usage),
            ("step_started", Kind::StepOpened),
            ("candidate_step_started", Kind::StepOpened),
            ("input_received", Kind::StepOpened),
            ("step_completed", Kind::StepClosed),
            ("step_failed", Kind::StepClosed),
            ("candidate_step_completed", Kind::StepClosed),
            ("candidate_step_failed", Kind::StepClosed),
            ("pipeline_started", Kind::Other),
            ("pipeline_event", Kind::Other),
            ("Step_Started", Kind::Other),
            ("", Kind::Other),
        ] {
            assert_eq!(Kind::of(t), k, "{t}");
        }
    }
}
