//! The strict `forwardedProps.iacCode` extension.
//!
//! Sibling keys of `iacCode` are ignored. Inside it: unknown keys are rejected, types are never
//! coerced, `schemaVersion` is the JSON integer 1, snake_case spellings are accepted, and both
//! spellings of one field in one object are an error.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::{Map, Value};

use crate::error::{msg, ApiError, Code};

/// A secret string: only ever sent to the kernel; never logged (its `Debug` is redacted).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMode {
    Normal,
    Pipeline,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CandidatePresentation {
    Standard,
    Rich,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Thinking {
    pub enabled: bool,
    pub effort: Option<String>,
    pub budget: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AlibabaCloud {
    pub access_key_id: Option<String>,
    pub access_key_secret: Option<Secret>,
    pub security_token: Option<Secret>,
    pub region_id: Option<String>,
}

/// The validated extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IacCode {
    pub ros_invocation_id: String,
    pub cwd: String,
    pub model: Option<String>,
    pub llm_api_key: Option<Secret>,
    pub llm_headers: Option<BTreeMap<String, Secret>>,
    pub thinking: Option<Thinking>,
    pub user_id: Option<String>,
    pub channel: Option<String>,
    pub preferred_language: Option<String>,
    pub candidate_presentation: Option<CandidatePresentation>,
    pub run_mode: Option<RunMode>,
    pub pipeline_name: Option<String>,
    pub cleanup_only: bool,
    pub active_guidance: bool,
    pub alibaba_cloud: Option<AlibabaCloud>,
}

fn bad() -> ApiError {
    ApiError::new(Code::InvalidInput, msg::INVALID_PROPS)
}

/// Maps each key of a strict object to its canonical (camelCase) name; rejects unknown keys and
/// keys given under both spellings.
fn canonical_keys<'a>(
    obj: &'a Map<String, Value>,
    fields: &[(&'static str, &'static str)],
) -> Result<BTreeMap<&'static str, &'a Value>, ApiError> {
    let mut out = BTreeMap::new();
    for (k, v) in obj {
        let name = fields
            .iter()
            .find(|(camel, snake)| k == camel || k == snake)
            .map(|(camel, _)| *camel)
            .ok_or_else(bad)?;
        if out.insert(name, v).is_some() {
            return Err(bad());
        }
    }
    Ok(out)
}

fn opt_string(v: Option<&&Value>) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad()),
    }
}

fn opt_bool(v: Option<&&Value>) -> Result<bool, ApiError> {
    match v {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad()),
    }
}

const FIELDS: &[(&str, &str)] = &[
    ("schemaVersion", "schema_version"),
    ("rosInvocationId", "ros_invocation_id"),
    ("cwd", "cwd"),
    ("model", "model"),
    ("llmApiKey", "llm_api_key"),
    ("llmHeaders", "llm_headers"),
    ("thinking", "thinking"),
    ("userId", "user_id"),
    ("channel", "channel"),
    ("preferredLanguage", "preferred_language"),
    ("candidatePresentation", "candidate_presentation"),
    ("runMode", "run_mode"),
    ("pipelineName", "pipeline_name"),
    ("cleanupOnly", "cleanup_only"),
    ("activeGuidance", "active_guidance"),
    ("alibabaCloud", "alibaba_cloud"),
];

/// Finds the `iacCode` object (or its alias) among `forwardedProps`' keys.
pub fn iac_code_object(forwarded_props: &Value) -> Option<&Map<String, Value>> {
    let fp = forwarded_props.as_object()?;
    match (fp.get("iacCode"), fp.get("iac_code")) {
        (Some(v), None) | (None, Some(v)) => v.as_object(),
        _ => None,
    }
}

/// The raw `forwardedProps.iacCode.preferredLanguage` (camelCase path only), read before validation.
pub fn raw_preferred_language(body: &Map<String, Value>) -> Option<&str> {
    body.get("forwardedProps")?
        .get("iacCode")?
        .get("preferredLanguage")?
        .as_str()
}

/// Validates `forwardedProps.iacCode`.
pub fn parse(forwarded_props: Option<&Value>) -> Result<IacCode, ApiError> {
    let obj = forwarded_props.and_then(iac_code_object).ok_or_else(bad)?;
    let f = canonical_keys(obj, FIELDS)?;

    match f.get("schemaVersion") {
        Some(Value::Number(n)) if n.is_i64() && n.as_i64() == Some(1) => {}
        _ => return Err(bad()),
    }
    let ros_invocation_id = match f.get("rosInvocationId") {
        Some(Value::String(s)) if !s.is_empty() && s.chars().count() <= 256 => s.clone(),
        _ => return Err(bad()),
    };
    let cwd = match f.get("cwd") {
        Some(Value::String(s)) => s.clone(),
        _ => return Err(bad()),
    };
    let llm_headers = match f.get("llmHeaders") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => {
            let mut out = BTreeMap::new();
            for (k, v) in m {
                let v = v.as_str().ok_or_else(bad)?;
                out.insert(k.clone(), Secret(v.to_owned()));
            }
            Some(out)
        }
        Some(_) => return Err(bad()),
    };
    let thinking = match f.get("thinking") {
        None | Some(Value::Null) => None,
        Some(Value::Object(t)) => {
            let t = canonical_keys(
                t,
                &[
                    ("enabled", "enabled"),
                    ("effort", "effort"),
                    ("budget", "budget"),
                ],
            )?;
            let budget = match t.get("budget") {
                None | Some(Value::Null) => None,
                Some(Value::Number(n)) if n.is_u64() && n.as_u64().unwrap_or(0) > 0 => n.as_u64(),
                Some(_) => return Err(bad()),
            };
            Some(Thinking {
                enabled: opt_bool(t.get("enabled"))?,
                effort: opt_string(t.get("effort"))?,
                budget,
            })
        }
        Some(_) => return Err(bad()),
    };
    let candidate_presentation = match f.get("candidatePresentation") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "standard" => Some(CandidatePresentation::Standard),
        Some(Value::String(s)) if s == "rich" => Some(CandidatePresentation::Rich),
        Some(_) => return Err(bad()),
    };
    let run_mode = match f.get("runMode") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s == "normal" => Some(RunMode::Normal),
        Some(Value::String(s)) if s == "pipeline" => Some(RunMode::Pipeline),
        Some(_) => return Err(bad()),
    };
    let alibaba_cloud = match f.get("alibabaCloud") {
        None | Some(Value::Null) => None,
        Some(Value::Object(a)) => {
            let a = canonical_keys(
                a,
                &[
                    ("accessKeyId", "access_key_id"),
                    ("accessKeySecret", "access_key_secret"),
                    ("securityToken", "security_token"),
                    ("regionId", "region_id"),
                ],
            )?;
            Some(AlibabaCloud {
                access_key_id: opt_string(a.get("accessKeyId"))?,
                access_key_secret: opt_string(a.get("accessKeySecret"))?.map(Secret),
                security_token: opt_string(a.get("securityToken"))?.map(Secret),
                region_id: opt_string(a.get("regionId"))?,
            })
        }
        Some(_) => return Err(bad()),
    };
    Ok(IacCode {
        ros_invocation_id,
        cwd,
        model: opt_string(f.get("model"))?,
        llm_api_key: opt_string(f.get("llmApiKey"))?.map(Secret),
        llm_headers,
        thinking,
        user_id: opt_string(f.get("userId"))?,
        channel: opt_string(f.get("channel"))?,
        preferred_language: opt_string(f.get("preferredLanguage"))?,
        candidate_presentation,
        run_mode,
        pipeline_name: opt_string(f.get("pipelineName"))?,
        cleanup_only: opt_bool(f.get("cleanupOnly"))?,
        active_guidance: opt_bool(f.get("activeGuidance"))?,
        alibaba_cloud,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn p(extra: Value) -> Result<IacCode, ApiError> {
        let mut iac = json!({"schemaVersion":1,"rosInvocationId":"inv","cwd":"/w"});
        for (k, v) in extra.as_object().unwrap() {
            iac[k] = v.clone();
        }
        parse(Some(&json!({"iacCode": iac, "copilotkit": {"x": 1}})))
    }

    #[test]
    fn strict_types_and_unknown_keys() {
        assert!(p(json!({})).is_ok());
        for bad in [
            json!({"unknown":1}),
            json!({"schemaVersion":2}),
            json!({"schemaVersion":"1"}),
            json!({"schemaVersion":1.0}),
            json!({"schemaVersion":true}),
            json!({"rosInvocationId":""}),
            json!({"rosInvocationId":"x".repeat(257)}),
            json!({"rosInvocationId":5}),
            json!({"cleanupOnly":null}),
            json!({"cleanupOnly":"true"}),
            json!({"thinking":{"budget":0}}),
            json!({"thinking":{"budget":1.0}}),
            json!({"thinking":{"enabled":1}}),
            json!({"thinking":{"x":1}}),
            json!({"runMode":"fast"}),
            json!({"candidatePresentation":"RICH"}),
            json!({"llmHeaders":{"a":1}}),
            json!({"alibabaCloud":{"foo":"a"}}),
            json!({"userId":1}),
            json!({"ros_invocation_id":"x"}),
        ] {
            assert!(p(bad.clone()).is_err(), "{bad}");
        }
        assert!(p(json!({"rosInvocationId":"é".repeat(256)})).is_ok());
        assert!(p(json!({"thinking":{}})).is_ok());
        assert!(p(json!({"model":null,"runMode":null,"alibabaCloud":{}})).is_ok());
    }

    #[test]
    fn snake_aliases_and_missing_object() {
        let v = parse(Some(
            &json!({"iac_code":{"schema_version":1,"ros_invocation_id":"i","cwd":"/w",
            "alibaba_cloud":{"access_key_secret":"s"}}}),
        ))
        .unwrap();
        assert_eq!(v.ros_invocation_id, "i");
        assert_eq!(v.alibaba_cloud.unwrap().access_key_secret.unwrap().0, "s");
        assert!(parse(Some(&json!({}))).is_err());
        assert!(parse(Some(&Value::Null)).is_err());
        assert!(parse(None).is_err());
    }

    #[test]
    fn secrets_are_redacted_in_debug() {
        let v = p(
            json!({"llmApiKey":"SECRET-KEY","llmHeaders":{"X":"SECRET-H"},
            "alibabaCloud":{"accessKeySecret":"SECRET-AK","securityToken":"SECRET-STS"}}),
        )
        .unwrap();
        let d = format!("{v:?}");
        for s in ["SECRET-KEY", "SECRET-H", "SECRET-AK", "SECRET-STS"] {
            assert!(!d.contains(s), "{d}");
        }
    }
}
