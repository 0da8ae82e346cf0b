//! Required kernel inputs → pending entries and AG-UI `Interrupt` objects (with `expiresAt`).

use agui::Interrupt;
use serde_json::{json, Map, Value};

use crate::error::msg;
use crate::i18n::{self, Lang};
use store::doc_project_input;

/// A required input found in a kernel item.
#[derive(Debug, Clone, PartialEq)]
pub struct RequiredInput {
    pub id: String,
    /// Allow-listed projection, with `inputId` set: an input without an id gets a generated one,
    /// stored with it, so the thread stays answerable.
    pub value: Map<String, Value>,
    pub sideband: bool,
}

/// Required inputs of an item's `metadata.iac_code`: `input`, then each `pendingPermissions[*]`;
/// only `required: true`; de-duplicated by `inputId` (or the canonical JSON without one).
pub fn required_inputs(
    meta: &Map<String, Value>,
    mut gen: impl FnMut() -> String,
) -> Vec<RequiredInput> {
    let mut out: Vec<RequiredInput> = Vec::new();
    let mut seen_canon: Vec<String> = Vec::new();
    let direct = meta.get("input").into_iter();
    let perms = meta
        .get("pendingPermissions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    for (i, cand) in direct
        .map(|v| (true, v))
        .chain(perms.map(|v| (false, v)))
        .enumerate()
    {
        let (is_direct, v) = cand;
        let _ = i;
        let Some(obj) = v.as_object() else { continue };
        if obj.get("required").and_then(Value::as_bool) != Some(true) {
            continue;
        }
        let id = obj
            .get("inputId")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned);
        let id = match id {
            Some(id) => {
                if out.iter().any(|r| r.id == id) {
                    continue;
                }
                id
            }
            None => {
                let canon = crate::canonical::canonical_value(v);
                if seen_canon.contains(&canon) {
                    continue;
                }
                seen_canon.push(canon);
                format!("input-{}", gen())
            }
        };
        let sideband = if is_direct {
            obj.get("scope").and_then(Value::as_str) == Some("candidate")
                || obj.get("subPipelineId").is_some_and(Value::is_string)
        } else {
            true
        };
        let mut value = doc_project_input(obj);
        value.insert("inputId".into(), Value::String(id.clone()));
        out.push(RequiredInput {
            id,
            value,
            sideband,
        });
    }
    out
}

/// What an interrupt asks for, read from its entry's `kind` (the entry keeps its raw value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InterruptKind {
    /// A permission for a tool call (`permission`): answered with a decision.
    Permission,
    /// Anything else (the kernel's `ask_user_question`, or no kind): answered with text.
    Question,
}

impl InterruptKind {
    /// The kind of an interrupt's entry (a required input's projection).
    pub fn of(value: &Map<String, Value>) -> InterruptKind {
        match value.get("kind").and_then(Value::as_str) {
            Some("permission") => InterruptKind::Permission,
            _ => InterruptKind::Question,
        }
    }
}

const PERMISSION_SCHEMA: &str = r#"{"type":"object","properties":{"decision":{"type":"string","enum":["allow_once","deny"]}},"required":["decision"],"additionalProperties":false}"#;

fn str_of(v: Option<&Value>) -> Option<&str> {
    v.and_then(Value::as_str).filter(|s| !s.is_empty())
}

fn python_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => i.to_string(),
            (None, Some(f)) => crate::canonical::python_float_repr(f),
            _ => n.to_string(),
        },
        other => crate::canonical::canonical_value(other),
    }
}

fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
    }
}

/// The standard options `(id, title)` of a question.
pub fn standard_options(value: &Map<String, Value>) -> Vec<(String, String)> {
    let Some(options) = value.get("options").and_then(Value::as_array) else {
        return Vec::new();
    };
    let mut out: Vec<(String, String)> = Vec::new();
    for (i, o) in options.iter().enumerate() {
        let (mut id, title) = match o.as_object() {
            Some(m) => {
                let id = if let Some(v) = m.get("id") {
                    python_str(v)
                } else if let Some(v) = m.get("candidate_index") {
                    python_str(v)
                } else {
                    i.to_string()
                };
                let title = ["label", "name", "title"]
                    .iter()
                    .find_map(|k| m.get(*k).filter(|v| truthy(Some(v))).map(python_str))
                    .unwrap_or_else(|| id.clone());
                (id, title)
            }
            None => {
                let s = python_str(o);
                (s.clone(), s)
            }
        };
        if id.is_empty() {
            id = format!("option-{}", i + 1);
        }
        let base = id.clone();
        let mut n = 2;
        while out.iter().any(|(x, _)| *x == id) {
            id = format!("{base}-{n}");
            n += 1;
        }
        out.push((id, title));
    }
    out
}

/// Builds the AG-UI interrupt of a pending entry. `expires_at`: RFC 3339, or none when expiry is
/// off.
pub fn build(id: &str, value: &Map<String, Value>, expires_at: Option<&str>) -> Interrupt {
    let lang = value
        .get("language")
        .and_then(Value::as_str)
        .and_then(Lang::from_tag)
        .unwrap_or(Lang::En);
    let options = standard_options(value);
    let (reason, message, schema) = if InterruptKind::of(value) == InterruptKind::Permission {
        let message = str_of(value.get("prompt"))
            .or_else(|| str_of(value.get("title")))
            .map(str::to_owned)
            .unwrap_or_else(|| i18n::tr(lang, msg::PERMISSION_REQUIRED));
        let schema: Value = serde_json::from_str(PERMISSION_SCHEMA).expect("schema literal");
        ("tool_call", message, schema)
    } else {
        let mut message = str_of(value.get("prompt"))
            .map(str::to_owned)
            .unwrap_or_else(|| i18n::tr(lang, msg::INPUT_REQUIRED));
        for (oid, title) in &options {
            message.push_str(&format!("\n- {oid}: {title}"));
        }
        let mut branches: Vec<Value> = options
            .iter()
            .map(|(oid, title)| {
                json!({"type":"object","properties":{"selectedId":{"type":"string","const":oid,"title":title}},
                       "required":["selectedId"],"additionalProperties":false})
            })
            .collect();
        if truthy(value.get("allowFreeText")) || options.is_empty() {
            branches.push(
                json!({"type":"object","properties":{"freeText":{"type":"string","minLength":1}},
                                 "required":["freeText"],"additionalProperties":false}),
            );
        }
        ("input_required", message, json!({"oneOf": branches}))
    };
    let mut metadata = Map::new();
    metadata.insert("schemaVersion".into(), json!(1));
    for (k, v) in value {
        metadata.insert(k.clone(), v.clone());
    }
    metadata.insert(
        "standardOptions".into(),
        Value::Array(
            options
                .iter()
                .map(|(i, t)| json!({"id": i, "title": t}))
                .collect(),
        ),
    );
    Interrupt {
        id: id.to_owned(),
        reason: reason.into(),
        message: Some(message),
        tool_call_id: str_of(value.get("toolUseId")).map(str::to_owned),
        response_schema: Some(schema),
        expires_at: expires_at.map(str::to_owned),
        metadata: Some(Value::Object(metadata)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn interrupt_kinds() {
        let kind = |v: Value| InterruptKind::of(&obj(v));
        assert_eq!(
            kind(json!({"kind": "permission"})),
            InterruptKind::Permission
        );
        for other in [
            json!({"kind": "ask_user_question"}),
            json!({"kind": "Permission"}),
            json!({"kind": ""}),
            json!({"kind": null}),
            json!({"kind": ["permission"]}),
            json!({}),
        ] {
            assert_eq!(kind(other), InterruptKind::Question);
        }
    }

    #[test]
    fn permission_interrupt() {
        let input = json!({"schemaVersion":1.0,"kind":"permission","requestTaskId":"task-1","contextId":"C","inputId":"perm-1",
            "toolUseId":"tu1","toolName":"bash","prompt":"Run bash Allow once?","title":"Run bash",
            "options":[{"id":"allow_once","label":"Allow once"},{"id":"deny","label":"Deny"}],"language":"en","required":true,"secretThing":"zzz"});
        let r = required_inputs(&obj(json!({"input": input})), || "x".into());
        assert_eq!(r.len(), 1);
        assert!(!r[0].value.contains_key("secretThing"));
        let i = build(&r[0].id, &r[0].value, Some("2026-11-30T00:00:00.000Z"));
        let v = serde_json::to_value(&i).unwrap();
        assert_eq!(v["id"], "perm-1");
        assert_eq!(v["reason"], "tool_call");
        assert_eq!(v["message"], "Run bash Allow once?");
        assert_eq!(v["toolCallId"], "tu1");
        assert_eq!(v["expiresAt"], "2026-11-30T00:00:00.000Z");
        assert_eq!(
            v["responseSchema"]["properties"]["decision"]["enum"],
            json!(["allow_once", "deny"])
        );
        assert_eq!(
            v["metadata"]["standardOptions"],
            json!([{"id":"allow_once","title":"Allow once"},{"id":"deny","title":"Deny"}])
        );
        assert_eq!(v["metadata"]["schemaVersion"], json!(1.0));
        assert!(v["metadata"].get("secretThing").is_none());
    }

    #[test]
    fn question_options_l2() {
        let input = obj(
            json!({"kind":"ask_user_question","inputId":"q-1","toolUseId":"tu-q","prompt":"Which region?",
            "options":[{"id":"a","label":"Hangzhou"},{"id":"a","label":"Beijing"},{"label":"NoId"},"plain",{"candidate_index":3,"name":"Cand"}],
            "allowFreeText":false,"required":true}),
        );
        let i = build("q-1", &input, None);
        assert_eq!(i.reason, "input_required");
        assert_eq!(i.message.as_deref(), Some("Which region?\n- a: Hangzhou\n- a-2: Beijing\n- 2: NoId\n- plain: plain\n- 3: Cand"));
        let branches = i.response_schema.unwrap()["oneOf"]
            .as_array()
            .unwrap()
            .clone();
        let consts: Vec<&str> = branches
            .iter()
            .map(|b| b["properties"]["selectedId"]["const"].as_str().unwrap())
            .collect();
        assert_eq!(consts, ["a", "a-2", "2", "plain", "3"]);
        let q = build(
            "q-2",
            &obj(json!({"kind":"ask_user_question","inputId":"q-2","prompt":"Anything?"})),
            None,
        );
        assert_eq!(
            q.response_schema.unwrap()["oneOf"][0]["properties"]["freeText"]["minLength"],
            1
        );
        assert_eq!(q.tool_call_id, None);
        let zh = build(
            "p",
            &obj(json!({"kind":"permission","language":"zh"})),
            None,
        );
        assert_ne!(zh.message.as_deref(), Some("Permission required"));
    }

    #[test]
    fn multiple_and_non_required_inputs_l5_and_generated_ids() {
        let p1 = json!({"inputId":"p1","kind":"permission","required":true});
        let p2 = json!({"inputId":"p2","kind":"permission","required":true});
        let nr = json!({"inputId":"p3","kind":"permission","required":false});
        let r = required_inputs(
            &obj(json!({"input":p1,"pendingPermissions":[p2, p1, nr]})),
            || "g".into(),
        );
        let ids: Vec<&str> = r.iter().map(|x| x.id.as_str()).collect();
        assert_eq!(ids, ["p1", "p2"]);
        assert!(!r[0].sideband);
        assert!(r[1].sideband);
        let noid = json!({"kind":"ask_user_question","required":true});
        let r = required_inputs(
            &obj(json!({"input":noid.clone(),"pendingPermissions":[noid]})),
            || "0123".into(),
        );
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].id, "input-0123");
        assert_eq!(r[0].value["inputId"], "input-0123");
    }
}
