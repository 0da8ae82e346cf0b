//! The strict `forwardedProps.iacCode` extension.
//!
//! Sibling keys of `iacCode` are ignored. Inside it: unknown keys are rejected, types are never
//! coerced, `schemaVersion` is the JSON integer 1, snake_case spellings are accepted, and both
//! spellings of one field in one object are an error. Every fault gets the same answer
//! (`INVALID_PROPS`), so serde's derive checks the shape; the helpers below add what it would
//! let through. Then, on a well-formed extension, the strings the gateway keeps or logs are
//! bounded (`super::is_bounded`), each refused with a message naming it.

use std::collections::BTreeMap;
use std::fmt;
use std::num::NonZeroU64;

use serde::de::{self, DeserializeOwned, Deserializer, IntoDeserializer};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{msg, ApiError, Code};

/// A secret string: only ever sent to the kernel; never logged (its `Debug` is redacted).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(transparent)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunMode {
    Normal,
    Pipeline,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CandidatePresentation {
    Standard,
    Rich,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Thinking {
    #[serde(default)]
    pub enabled: bool,
    pub effort: Option<String>,
    #[serde(default, deserialize_with = "positive")]
    pub budget: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AlibabaCloud {
    #[serde(alias = "access_key_id")]
    pub access_key_id: Option<String>,
    #[serde(alias = "access_key_secret")]
    pub access_key_secret: Option<Secret>,
    #[serde(alias = "security_token")]
    pub security_token: Option<Secret>,
    #[serde(alias = "region_id")]
    pub region_id: Option<String>,
}

/// The validated extension (without `schemaVersion`, checked before).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct IacCode {
    #[serde(alias = "ros_invocation_id", deserialize_with = "invocation_id")]
    pub ros_invocation_id: String,
    pub cwd: String,
    pub model: Option<String>,
    #[serde(alias = "llm_api_key")]
    pub llm_api_key: Option<Secret>,
    #[serde(alias = "llm_headers")]
    pub llm_headers: Option<BTreeMap<String, Secret>>,
    #[serde(default, deserialize_with = "object")]
    pub thinking: Option<Thinking>,
    #[serde(alias = "user_id")]
    pub user_id: Option<String>,
    pub channel: Option<String>,
    #[serde(alias = "preferred_language")]
    pub preferred_language: Option<String>,
    #[serde(default, alias = "candidate_presentation", deserialize_with = "named")]
    pub candidate_presentation: Option<CandidatePresentation>,
    #[serde(default, alias = "run_mode", deserialize_with = "named")]
    pub run_mode: Option<RunMode>,
    #[serde(alias = "pipeline_name")]
    pub pipeline_name: Option<String>,
    #[serde(default, alias = "cleanup_only")]
    pub cleanup_only: bool,
    #[serde(default, alias = "active_guidance")]
    pub active_guidance: bool,
    #[serde(default, alias = "alibaba_cloud", deserialize_with = "object")]
    pub alibaba_cloud: Option<AlibabaCloud>,
    /// The kernel's session-handoff fence (its `owner` is read there when the fence is on),
    /// passed on as given in `metadata.iac_code.execution_fence`; never stored.
    #[serde(skip)]
    pub execution_fence: Option<Map<String, Value>>,
    /// A guidance input's identity and its digest, passed on as `guidance_id` and
    /// `input_digest` (the kernel applies a guidance once per id); never stored.
    #[serde(skip)]
    pub guidance_id: Option<String>,
    #[serde(skip)]
    pub input_digest: Option<String>,
}

impl IacCode {
    /// Whether the request carries a secret of the user's (an LLM key or headers, cloud
    /// credentials).
    pub fn carries_secrets(&self) -> bool {
        self.llm_api_key.is_some()
            || self.llm_headers.as_ref().is_some_and(|h| !h.is_empty())
            || self.alibaba_cloud.is_some()
    }
}

fn bad() -> ApiError {
    ApiError::new(Code::InvalidInput, msg::INVALID_PROPS)
}

/// `rosInvocationId`: 1 to 256 characters.
fn invocation_id<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() || s.chars().count() > 256 {
        return Err(de::Error::custom("rosInvocationId has 1 to 256 characters"));
    }
    Ok(s)
}

/// `thinking.budget`: a positive integer (never a float, even `1.0`).
fn positive<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(Option::<NonZeroU64>::deserialize(d)?.map(NonZeroU64::get))
}

/// An optional nested object: a derived struct alone would take an array too, by position.
fn object<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    match Option::<Map<String, Value>>::deserialize(d)? {
        None => Ok(None),
        Some(m) => T::deserialize(Value::Object(m))
            .map(Some)
            .map_err(de::Error::custom),
    }
}

/// An optional enum named by a JSON string: a derived enum alone would take `{"rich": null}` too.
fn named<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(s) => T::deserialize(s.into_deserializer()).map(Some),
    }
}

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
    let mut obj = forwarded_props
        .and_then(iac_code_object)
        .ok_or_else(bad)?
        .clone();
    // The version is no field of the result: taken out (one spelling, the JSON integer 1) before
    // the rest is read.
    let version = match (
        obj.shift_remove("schemaVersion"),
        obj.shift_remove("schema_version"),
    ) {
        (Some(v), None) | (None, Some(v)) => v,
        _ => return Err(bad()),
    };
    if version.as_i64() != Some(1) {
        return Err(bad());
    }
    // The kernel's identities of a handoff and a guidance, taken out to be refused by name
    // once the rest is well-formed (a malformed extension stays `INVALID_PROPS`).
    let mut passed_on = [None, None, None];
    for (at, (camel, snake)) in PASSED_ON.iter().enumerate() {
        passed_on[at] = match (obj.shift_remove(*camel), obj.shift_remove(*snake)) {
            (None, None) => None,
            (Some(v), None) | (None, Some(v)) => Some(v),
            (Some(_), Some(_)) => return Err(bad()),
        };
    }
    let mut iac = IacCode::deserialize(Value::Object(obj)).map_err(|_| bad())?;
    bound_strings(&iac)?;
    let [fence, guidance, digest] = passed_on;
    iac.execution_fence = execution_fence(fence)?;
    iac.guidance_id = passed_on_id(guidance, msg::GUIDANCE_ID)?;
    iac.input_digest = passed_on_id(digest, msg::INPUT_DIGEST)?;
    Ok(iac)
}

/// The fields passed on to the kernel as they are, in both spellings.
const PASSED_ON: [(&str, &str); 3] = [
    ("executionFence", "execution_fence"),
    ("guidanceId", "guidance_id"),
    ("inputDigest", "input_digest"),
];

/// The most `executionFence` may hold, as compact JSON: a fence names a few ids (its owner's
/// sandbox, activation, run and leases); this leaves room and keeps every message to the
/// kernel small.
pub const MAX_FENCE_BYTES: usize = 16 * 1024;

/// `executionFence`: a JSON object (null: none) of at most [`MAX_FENCE_BYTES`].
fn execution_fence(v: Option<Value>) -> Result<Option<Map<String, Value>>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m))
            if serde_json::to_vec(&m).is_ok_and(|b| b.len() <= MAX_FENCE_BYTES) =>
        {
            Ok(Some(m))
        }
        Some(_) => Err(ApiError::new(Code::InvalidInput, msg::EXECUTION_FENCE)),
    }
}

/// `guidanceId`, `inputDigest`: a string (null: none) of 1 to 256 bytes without control
/// characters (upstream asks for a non-empty string; the gateway bounds every id it passes on).
fn passed_on_id(v: Option<Value>, refusal: &'static str) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() && super::is_bounded(&s) => Ok(Some(s)),
        Some(_) => Err(ApiError::new(Code::InvalidInput, refusal)),
    }
}

/// The bounds of a well-formed extension's strings, in the order of its fields (the first
/// that fails answers). `rosInvocationId` keeps its shape's bound (1 to 256 characters, an
/// `INVALID_PROPS` beyond) and refuses control characters only; `userId` (kept in the thread
/// document), `model`, `channel` and `pipelineName` (sent on and logged) have at most 256
/// bytes. `cwd` has its own checks.
fn bound_strings(iac: &IacCode) -> Result<(), ApiError> {
    if iac.ros_invocation_id.chars().any(char::is_control) {
        return Err(ApiError::new(Code::InvalidInput, msg::INVOCATION_CONTROL));
    }
    for (value, refusal) in [
        (&iac.model, msg::MODEL_BOUND),
        (&iac.user_id, msg::ID_USER),
        (&iac.channel, msg::CHANNEL_BOUND),
        (&iac.pipeline_name, msg::PIPELINE_BOUND),
    ] {
        if value.as_deref().is_some_and(|v| !super::is_bounded(v)) {
            return Err(ApiError::new(Code::InvalidInput, refusal));
        }
    }
    Ok(())
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

    /// The strings kept or logged are bounded, each refusal naming its field, after the shape's
    /// own checks (a malformed extension is still `INVALID_PROPS`).
    #[test]
    fn kept_strings_are_bounded_and_refusals_name_them() {
        for (field, refusal) in [
            ("model", msg::MODEL_BOUND),
            ("userId", msg::ID_USER),
            ("channel", msg::CHANNEL_BOUND),
            ("pipelineName", msg::PIPELINE_BOUND),
        ] {
            for bad in ["x".repeat(257), "a\u{0}b".into(), "\u{1b}[31m".into()] {
                let e = p(json!({ field: bad })).unwrap_err();
                assert_eq!((e.code, &*e.message), (Code::InvalidInput, refusal));
                let e = p(json!({ field: bad, "unknown": 1 })).unwrap_err();
                assert_eq!(e.message, msg::INVALID_PROPS);
            }
            assert!(p(json!({ field: "é".repeat(128) })).is_ok());
        }
        let e = p(json!({"rosInvocationId": "inv\n1"})).unwrap_err();
        assert_eq!(e.message, msg::INVOCATION_CONTROL);
        let e = p(json!({"rosInvocationId": "x".repeat(257)})).unwrap_err();
        assert_eq!(e.message, msg::INVALID_PROPS);
    }

    /// The fields of a later iac-code (a handoff's fence, a guidance's identity): typed as
    /// upstream types them, bounded, each refusal naming its field, null as absent, snake_case
    /// too, and a malformed extension still `INVALID_PROPS`.
    #[test]
    fn the_handoff_and_guidance_fields_are_typed_bounded_and_named() {
        let fence = json!({"version": "session-handoff-v1", "owner": {"sandboxId": "sb-1",
            "activationId": "a-1", "runId": "r-1", "leaseId": "l-1", "identityKind": "slot"}});
        let v =
            p(json!({"executionFence": fence, "guidanceId": "g-1", "inputDigest": "d".repeat(64)}))
                .unwrap();
        assert_eq!(v.execution_fence, fence.as_object().cloned());
        assert_eq!(v.guidance_id.as_deref(), Some("g-1"));
        assert_eq!(v.input_digest, Some("d".repeat(64)));
        let v = p(json!({"execution_fence": {}, "guidance_id": "g", "input_digest": "x"})).unwrap();
        assert_eq!(v.execution_fence, Some(Map::new()));
        assert_eq!(
            (v.guidance_id.unwrap(), v.input_digest.unwrap()),
            ("g".into(), "x".into())
        );
        let v =
            p(json!({"executionFence": null, "guidanceId": null, "inputDigest": null})).unwrap();
        assert_eq!(
            (v.execution_fence, v.guidance_id, v.input_digest),
            (None, None, None)
        );
        let big = json!({"owner": {"sandboxId": "s".repeat(MAX_FENCE_BYTES)}});
        for (field, bad, refusal) in [
            ("executionFence", json!("fence"), msg::EXECUTION_FENCE),
            ("executionFence", json!([1]), msg::EXECUTION_FENCE),
            ("executionFence", big, msg::EXECUTION_FENCE),
            ("guidanceId", json!(""), msg::GUIDANCE_ID),
            ("guidanceId", json!(5), msg::GUIDANCE_ID),
            ("guidanceId", json!("x".repeat(257)), msg::GUIDANCE_ID),
            ("guidance_id", json!("a\nb"), msg::GUIDANCE_ID),
            ("inputDigest", json!(""), msg::INPUT_DIGEST),
            ("inputDigest", json!({"sha256": "x"}), msg::INPUT_DIGEST),
        ] {
            let e = p(json!({ field: bad })).unwrap_err();
            assert_eq!(
                (e.code, &*e.message),
                (Code::InvalidInput, refusal),
                "{field}"
            );
            let e = p(json!({ field: bad, "unknown": 1 })).unwrap_err();
            assert_eq!(e.message, msg::INVALID_PROPS, "{field}");
        }
        // Both spellings of one field: malformed.
        let e = p(json!({"guidanceId": "g", "guidance_id": "g"})).unwrap_err();
        assert_eq!(e.message, msg::INVALID_PROPS);
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
