//! Kernel item → AG-UI events, as pure code: no I/O, no clock.
//!
//! The [`Mapper`] holds the per-run span state (open text messages, reasoning, tool calls, steps),
//! usage, pipeline dedupe state and text snapshot digests. The run driver feeds it unwrapped kernel
//! items and forwards the events it appends. [`Mapper::close_all`] balances spans before any
//! terminal event.

pub mod fast;
pub mod interrupt;
mod pipeline;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use agui::{Event, Usage};
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};

use crate::canonical;

pub use pipeline::{is_allow_listed, ALLOW_LIST};

/// Per-run mapping state.
pub struct Mapper {
    run_id: String,
    /// The current (status-text) message id.
    current_text: Option<String>,
    /// All open text messages (status text and parallel pipeline messages).
    open_text: BTreeSet<String>,
    open_reasoning: BTreeSet<String>,
    open_tools: BTreeSet<String>,
    results_emitted: HashSet<String>,
    usage: Vec<UsageRecord>,
    text_emitted: bool,
    /// Accumulated text per message id (for snapshot digests).
    accumulated: HashMap<String, String>,
    /// Durable: digests of finalised message texts (for resume replay trimming).
    text_digests: BTreeSet<String>,
    /// Message ids already seen in this run (replay trimming applies to the first sight).
    seen_messages: HashSet<String>,
    /// Durable: the ids of every text and reasoning message this execution's runs have started.
    /// A span the kernel opens again under an id already used (its task's one text message id,
    /// after an interrupt's resume or a span closed earlier in the run) is sent under a new id
    /// derived from it, so that every message of a thread has its own id.
    used_ids: BTreeSet<String>,
    /// The id each open span is sent under: kernel text message id → sent id.
    text_ids: HashMap<String, String>,
    /// The same for reasoning messages: the reasoning's own id → sent id.
    reasoning_ids: HashMap<String, String>,
    /// Pipeline state.
    pub(crate) pipe: pipeline::PipelineState,
    /// Random id source for generated ids (injected for determinism in tests).
    gen: Box<dyn FnMut() -> String + Send + Sync>,
}

#[derive(Debug, Clone, Default)]
struct UsageRecord {
    provider: Option<String>,
    model: Option<String>,
    input: Option<u64>,
    output: Option<u64>,
    total: Option<u64>,
    cached: Option<u64>,
}

impl std::fmt::Debug for Mapper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mapper")
            .field("run_id", &self.run_id)
            .field("open_text", &self.open_text)
            .field("open_reasoning", &self.open_reasoning)
            .field("open_tools", &self.open_tools)
            .finish_non_exhaustive()
    }
}

/// A whole-number counter: integers, or doubles with no fraction (metadata numbers are doubles);
/// negative or fractional values are dropped, never fatal.
fn counter(v: Option<&Value>) -> Option<u64> {
    let n = v?.as_number()?;
    if let Some(u) = n.as_u64() {
        return Some(u);
    }
    let f = n.as_f64()?;
    (f >= 0.0 && f.fract() == 0.0 && f < 9.0e15).then_some(f as u64)
}

fn nonempty_str(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn is_agent_role(msg: &Value) -> bool {
    match msg.get("role") {
        None | Some(Value::Null) => true,
        Some(Value::String(r)) => a2a::Role::parse(r) == Some(a2a::Role::Agent),
        Some(_) => false,
    }
}

fn message_text(msg: &Value) -> String {
    let mut s = String::new();
    if let Some(parts) = msg.get("parts").and_then(Value::as_array) {
        for p in parts {
            if let Some(t) = p.get("text").and_then(Value::as_str) {
                s.push_str(t);
            }
        }
    }
    s
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

impl Mapper {
    pub fn new(run_id: &str, text_digests: BTreeSet<String>, thread_id: &str) -> Mapper {
        Mapper::with_idgen(
            run_id,
            text_digests,
            thread_id,
            Box::new(|| uuid::Uuid::new_v4().simple().to_string()),
        )
    }

    pub fn with_idgen(
        run_id: &str,
        text_digests: BTreeSet<String>,
        thread_id: &str,
        gen: Box<dyn FnMut() -> String + Send + Sync>,
    ) -> Mapper {
        Mapper {
            run_id: run_id.to_owned(),
            current_text: None,
            open_text: BTreeSet::new(),
            open_reasoning: BTreeSet::new(),
            open_tools: BTreeSet::new(),
            results_emitted: HashSet::new(),
            usage: Vec::new(),
            text_emitted: false,
            accumulated: HashMap::new(),
            text_digests,
            seen_messages: HashSet::new(),
            used_ids: BTreeSet::new(),
            text_ids: HashMap::new(),
            reasoning_ids: HashMap::new(),
            pipe: pipeline::PipelineState::new(thread_id),
            gen,
        }
    }

    /// Maps one unwrapped kernel item (in this order: pipeline batch, pipeline, thinking, tool, usage,
    /// artifact, status text).
    pub fn map_item(&mut self, item: &Value, out: &mut Vec<Event>) {
        let meta = item
            .get("metadata")
            .and_then(|m| m.get("iac_code"))
            .and_then(Value::as_object);
        if let Some(meta) = meta {
            if let Some(events) = meta
                .get("pipelineBatch")
                .and_then(|b| b.get("events"))
                .and_then(Value::as_array)
            {
                for env in events {
                    self.map_envelope(env, out);
                }
            }
            if let Some(env) = meta.get("pipeline").filter(|v| v.is_object()) {
                self.map_envelope(env, out);
            }
            self.map_meta(meta, out);
        }
        if let Some(artifact) = item.get("artifact").and_then(Value::as_object) {
            let mut value = Map::new();
            value.insert("schemaVersion".into(), json!(1));
            for (k, v) in artifact {
                value.insert(k.clone(), v.clone());
            }
            out.push(Event::Custom {
                name: "iac-code.artifact.v1".into(),
                value: Value::Object(value),
            });
        }
        self.map_status_text(item, meta, out);
    }

    /// Thinking, tool and usage metadata (no pipeline, no status text) — also used for snapshots.
    pub fn map_meta(&mut self, meta: &Map<String, Value>, out: &mut Vec<Event>) {
        if let Some(th) = meta.get("thinking").and_then(Value::as_object) {
            if th.get("type").and_then(Value::as_str) == Some("raw_thinking") {
                if let Some(text) = nonempty_str(th.get("text")) {
                    let base = self
                        .current_text
                        .clone()
                        .unwrap_or_else(|| self.run_id.clone());
                    self.reasoning(&format!("reasoning-{base}"), text, out);
                }
            }
        }
        if let Some(tool) = meta.get("tool").and_then(Value::as_object) {
            self.map_tool(tool, out);
        }
        if let Some(u) = meta.get("usage").and_then(Value::as_object) {
            self.record_usage(u);
        }
    }

    fn map_tool(&mut self, tool: &Map<String, Value>, out: &mut Vec<Event>) {
        let status = tool.get("status").and_then(Value::as_str).unwrap_or("");
        let id = nonempty_str(tool.get("toolUseId"))
            .map(str::to_owned)
            .unwrap_or_else(|| format!("tool-{}", (self.gen)()));
        let name = nonempty_str(tool.get("name")).unwrap_or("tool").to_owned();
        match status {
            "started" | "input_complete" => {
                let args = (status == "input_complete").then(|| {
                    match tool.get("toolInput").filter(|v| !v.is_null()) {
                        Some(input) => canonical::canonical_value(input),
                        None => canonical::canonical_value(
                            &json!({"summary": tool.get("inputSummary").cloned().unwrap_or(Value::Null)}),
                        ),
                    }
                });
                self.tool_call(&id, &name, args, out);
            }
            "completed" | "failed" => {
                let content = match tool.get("result") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => canonical::canonical_value(v),
                    None => "null".into(),
                };
                self.tool_result(&id, content, out);
            }
            "progress" => {
                let mut value = Map::new();
                value.insert("schemaVersion".into(), json!(1));
                for (k, v) in tool {
                    value.insert(k.clone(), v.clone());
                }
                out.push(Event::Custom {
                    name: "iac-code.tool-progress.v1".into(),
                    value: Value::Object(value),
                });
            }
            _ => {}
        }
    }

    /// `TOOL_CALL_START` (if not open), then ARGS+END when `args` is given.
    pub(crate) fn tool_call(
        &mut self,
        id: &str,
        name: &str,
        args: Option<String>,
        out: &mut Vec<Event>,
    ) {
        if let Some(cur) = self.current_text.clone() {
            self.finalise_digest(&cur);
        }
        if !self.open_tools.contains(id) {
            self.open_tools.insert(id.to_owned());
            let parent = self.current_text.as_ref().map(|c| self.sent_text_id(c));
            out.push(Event::ToolCallStart {
                tool_call_id: id.to_owned(),
                tool_call_name: name.to_owned(),
                parent_message_id: parent,
            });
        }
        if let Some(delta) = args {
            out.push(Event::ToolCallArgs {
                tool_call_id: id.to_owned(),
                delta,
            });
            out.push(Event::ToolCallEnd {
                tool_call_id: id.to_owned(),
            });
            self.open_tools.remove(id);
        }
    }

    /// `TOOL_CALL_RESULT`, once per tool id per run.
    pub fn tool_result(&mut self, id: &str, content: String, out: &mut Vec<Event>) {
        if !self.results_emitted.insert(id.to_owned()) {
            return;
        }
        out.push(Event::ToolCallResult {
            message_id: format!("tool-result-{id}"),
            tool_call_id: id.to_owned(),
            content,
        });
    }

    pub(crate) fn record_usage(&mut self, u: &Map<String, Value>) {
        self.usage.push(UsageRecord {
            provider: nonempty_str(u.get("provider")).map(str::to_owned),
            model: nonempty_str(u.get("model")).map(str::to_owned),
            input: counter(u.get("inputTokens")),
            output: counter(u.get("outputTokens")),
            total: counter(u.get("totalTokens")),
            cached: counter(u.get("cachedInputTokens")),
        });
    }

    pub(crate) fn reasoning(&mut self, id: &str, text: &str, out: &mut Vec<Event>) {
        if self.open_reasoning.insert(id.to_owned()) {
            let sent = self.new_message_id(id);
            self.reasoning_ids.insert(id.to_owned(), sent.clone());
            out.push(Event::ReasoningStart {
                message_id: sent.clone(),
            });
            out.push(Event::ReasoningMessageStart { message_id: sent });
        }
        out.push(Event::ReasoningMessageContent {
            message_id: self.reasoning_ids[id].clone(),
            delta: text.to_owned(),
        });
    }

    fn close_reasoning(&mut self, out: &mut Vec<Event>) {
        for id in std::mem::take(&mut self.open_reasoning) {
            let sent = self.reasoning_ids.remove(&id).unwrap_or(id);
            out.push(Event::ReasoningMessageEnd {
                message_id: sent.clone(),
            });
            out.push(Event::ReasoningEnd { message_id: sent });
        }
    }

    /// The id a message the kernel calls `id` starts under: `id` itself the first time in its
    /// execution, then `<id>-2`, `<id>-3`, … (the first free one), recorded as used. The same
    /// document and events give the same ids, so a replay or a re-attach sees what the client
    /// saw.
    fn new_message_id(&mut self, id: &str) -> String {
        let sent = if self.used_ids.contains(id) {
            (2u64..)
                .map(|n| format!("{id}-{n}"))
                .find(|c| !self.used_ids.contains(c))
                .expect("a free id")
        } else {
            id.to_owned()
        };
        self.used_ids.insert(sent.clone());
        sent
    }

    /// The id an open text message is sent under (its own until it is opened).
    fn sent_text_id(&self, id: &str) -> String {
        self.text_ids
            .get(id)
            .map_or_else(|| id.to_owned(), Clone::clone)
    }

    fn map_status_text(
        &mut self,
        item: &Value,
        meta: Option<&Map<String, Value>>,
        out: &mut Vec<Event>,
    ) {
        let msg = item
            .get("status")
            .and_then(|s| s.get("message"))
            .filter(|m| m.is_object());
        let mut text = String::new();
        let mut id: Option<String> = None;
        if let Some(m) = msg.filter(|m| is_agent_role(m)) {
            text = message_text(m);
            id = nonempty_str(m.get("messageId")).map(str::to_owned);
        }
        if text.is_empty() && !self.text_emitted {
            if let Some(history) = item.get("history").and_then(Value::as_array) {
                let mut end = history.len();
                while end > 0 && !is_agent_role(&history[end - 1]) {
                    end -= 1;
                }
                let mut start = end;
                while start > 0 && is_agent_role(&history[start - 1]) {
                    start -= 1;
                }
                if start < end {
                    text = history[start..end].iter().map(message_text).collect();
                    id = nonempty_str(history[end - 1].get("messageId")).map(str::to_owned);
                }
            }
        }
        let final_dup = meta
            .and_then(|m| m.get("assistantFinal"))
            .and_then(|f| f.get("complete"))
            .and_then(Value::as_bool)
            == Some(true);
        self.status_text(id, &text, final_dup, out);
    }

    /// The text of a status message (`id`: its message id); `final_dup`: the turn's final
    /// message, which repeats text already streamed.
    pub fn status_text(
        &mut self,
        id: Option<String>,
        text: &str,
        final_dup: bool,
        out: &mut Vec<Event>,
    ) {
        if text.is_empty() || (final_dup && self.text_emitted) {
            return;
        }
        let id = id
            .or_else(|| self.current_text.clone())
            .unwrap_or_else(|| format!("assistant-{}", (self.gen)()));
        self.emit_text(&id, text, true, out);
    }

    /// The per-delta hot path of status text: when `text` continues the message being streamed
    /// (it is the current one, open, nothing else to close), records it and returns the id the
    /// message is sent under; the caller then emits exactly one `TEXT_MESSAGE_CONTENT {that id,
    /// text}`, as [`Mapper::status_text`] would have. Otherwise changes nothing: `None`.
    pub fn continue_text(&mut self, id: &str, text: &str) -> Option<&str> {
        if text.is_empty()
            || !self.open_reasoning.is_empty()
            || self.current_text.as_deref() != Some(id)
            || !self.open_text.contains(id)
        {
            return None;
        }
        let acc = self.accumulated.get_mut(id)?;
        acc.push_str(text);
        self.text_emitted = true;
        self.text_ids.get(id).map(String::as_str)
    }

    /// Emits agent text. `exclusive`: status text (closes the current message when another
    /// starts); pipeline messages may be open in parallel.
    pub(crate) fn emit_text(
        &mut self,
        id: &str,
        text: &str,
        exclusive: bool,
        out: &mut Vec<Event>,
    ) {
        self.close_reasoning(out);
        let mut text = text;
        // Per-delta hot path: look up before allocating a key.
        let first_sight =
            !self.seen_messages.contains(id) && self.seen_messages.insert(id.to_owned());
        let mut accumulated_prefix = String::new();
        if first_sight && !self.text_digests.is_empty() {
            // Resume replay trimming: skip the longest prefix whose digest was recorded. One
            // running hash, finished at every character boundary: linear in the text (hashing
            // each prefix afresh was quadratic, seconds of CPU for a long first chunk).
            let mut best = 0;
            let mut running = Sha256::new();
            for (i, c) in text.char_indices() {
                let end = i + c.len_utf8();
                running.update(&text.as_bytes()[i..end]);
                if self
                    .text_digests
                    .contains(&hex::encode(running.clone().finalize()))
                {
                    best = end;
                }
            }
            accumulated_prefix = text[..best].to_owned();
            text = &text[best..];
        }
        if first_sight {
            self.accumulated
                .entry(id.to_owned())
                .or_default()
                .push_str(&accumulated_prefix);
        }
        if text.is_empty() {
            return;
        }
        if !self.open_text.contains(id) {
            if exclusive {
                if let Some(cur) = self.current_text.take() {
                    if self.open_text.remove(&cur) {
                        self.finalise_digest(&cur);
                        let sent = self.text_ids.remove(&cur).unwrap_or(cur);
                        out.push(Event::TextMessageEnd { message_id: sent });
                    }
                }
            }
            self.open_text.insert(id.to_owned());
            let sent = self.new_message_id(id);
            self.text_ids.insert(id.to_owned(), sent.clone());
            out.push(Event::TextMessageStart { message_id: sent });
        }
        if (exclusive || self.current_text.is_none()) && self.current_text.as_deref() != Some(id) {
            self.current_text = Some(id.to_owned());
        }
        match self.accumulated.get_mut(id) {
            Some(acc) => acc.push_str(text),
            None => {
                self.accumulated.insert(id.to_owned(), text.to_owned());
            }
        }
        self.text_emitted = true;
        out.push(Event::TextMessageContent {
            message_id: self.sent_text_id(id),
            delta: text.to_owned(),
        });
    }

    fn finalise_digest(&mut self, id: &str) {
        if let Some(t) = self.accumulated.get(id).filter(|t| !t.is_empty()) {
            self.text_digests.insert(sha256_hex(t));
        }
    }

    /// Finalises the digests of all open messages (at interrupt commit).
    pub fn finalise_all_digests(&mut self) {
        let ids: Vec<String> = self.open_text.iter().cloned().collect();
        for id in ids {
            self.finalise_digest(&id);
        }
    }

    /// True when anything is open (tests and assertions).
    pub fn has_open_spans(&self) -> bool {
        !self.open_text.is_empty()
            || !self.open_reasoning.is_empty()
            || !self.open_tools.is_empty()
            || !self.pipe.run_open_steps.is_empty()
    }

    /// Closes every open span, innermost first: reasoning, tool calls, text messages, steps opened in
    /// this run (they stay durable so the next run re-opens them).
    pub fn close_all(&mut self, out: &mut Vec<Event>) {
        self.close_reasoning(out);
        for id in std::mem::take(&mut self.open_tools) {
            out.push(Event::ToolCallEnd { tool_call_id: id });
        }
        for id in std::mem::take(&mut self.open_text) {
            self.finalise_digest(&id);
            let sent = self.text_ids.remove(&id).unwrap_or(id);
            out.push(Event::TextMessageEnd { message_id: sent });
        }
        self.current_text = None;
        for key in std::mem::take(&mut self.pipe.run_open_steps) {
            out.push(Event::StepFinished {
                step_name: pipeline::step_name(&key),
            });
        }
    }

    /// Aggregated usage: grouped by (provider, model) in first-seen order, counters summed.
    pub fn usage(&self) -> Option<Vec<Usage>> {
        if self.usage.is_empty() {
            return None;
        }
        let mut order: Vec<(Option<String>, Option<String>)> = Vec::new();
        let mut sums: BTreeMap<usize, Usage> = BTreeMap::new();
        for r in &self.usage {
            let key = (r.provider.clone(), r.model.clone());
            let idx = match order.iter().position(|k| *k == key) {
                Some(i) => i,
                None => {
                    order.push(key.clone());
                    order.len() - 1
                }
            };
            let u = sums.entry(idx).or_insert_with(|| Usage {
                provider: key.0.clone(),
                model: key.1.clone(),
                input_tokens: 0,
                output_tokens: 0,
                total_tokens: 0,
                cached_input_tokens: 0,
            });
            u.input_tokens += r.input.unwrap_or(0);
            u.output_tokens += r.output.unwrap_or(0);
            u.total_tokens += r.total.unwrap_or(0);
            u.cached_input_tokens += r.cached.unwrap_or(0);
        }
        Some(sums.into_values().collect())
    }

    /// Takes over what a thread's document knows of its execution: the digests of the texts
    /// already shown, the ids of the messages already started, and the pipeline's open steps
    /// and position.
    pub fn restore(
        &mut self,
        text_digests: BTreeSet<String>,
        message_ids: BTreeSet<String>,
        open_steps: BTreeSet<String>,
        seq: u64,
    ) {
        self.text_digests = text_digests;
        self.used_ids = message_ids;
        self.set_pipeline_state(open_steps, seq);
    }

    /// Durable: the ids of the messages this execution's runs started.
    pub fn message_ids(&self) -> &BTreeSet<String> {
        &self.used_ids
    }

    /// Durable: the digests of the message texts finalised so far.
    pub fn text_digests(&self) -> &BTreeSet<String> {
        &self.text_digests
    }

    /// Pipeline: the durable open steps after this run's events.
    pub fn durable_open_steps(&self) -> &BTreeSet<String> {
        &self.pipe.durable_open_steps
    }

    /// Pipeline: the highest sequence seen.
    pub fn pipeline_sequence(&self) -> u64 {
        self.pipe.high_water
    }
}

/// Session id of an item: `meta.iacCodeSessionId`, `meta.pipeline.iacCodeSessionId`, or any
/// `meta.pipelineBatch.events[*].iacCodeSessionId`.
pub fn session_id(meta: &Map<String, Value>) -> Option<&str> {
    nonempty_str(meta.get("iacCodeSessionId"))
        .or_else(|| nonempty_str(meta.get("pipeline").and_then(|p| p.get("iacCodeSessionId"))))
        .or_else(|| {
            meta.get("pipelineBatch")
                .and_then(|b| b.get("events"))
                .and_then(Value::as_array)
                .and_then(|evs| {
                    evs.iter()
                        .find_map(|e| nonempty_str(e.get("iacCodeSessionId")))
                })
        })
}

#[cfg(test)]
mod tests;
