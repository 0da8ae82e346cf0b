//! What of a kernel's request goes upstream (pure): which of its headers, which of a run's own
//! headers, the body with usage asked for, and how many tokens the request may spend (reserved
//! against the user's budget until its answer says).
//!
//! The kernel is not trusted: its agent can call the egress itself with its capability. So only
//! the headers iac-code's clients send pass (a request naming another organisation, a `Host`, a
//! forwarding header would spend or send the operator's key elsewhere), and a streamed OpenAI
//! request always asks for its usage (iac-code asks only for some providers).

use indexmap::IndexMap;
use serde_json::value::RawValue;

/// What a request asks of the upstream: the routes iac-code's clients call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// OpenAI's `POST chat/completions` (and the capability probe's `GET models`).
    OpenAi,
    /// Anthropic's `POST v1/messages`.
    Anthropic,
}

/// The route of `method` on `rest` (the path after the kernel's capability), if it is one.
pub fn route(method: &http::Method, rest: &str) -> Option<Route> {
    match (method.as_str(), rest) {
        ("POST", "chat/completions" | "completions") => Some(Route::OpenAi),
        ("GET", "models") => Some(Route::OpenAi),
        ("POST", "v1/messages" | "messages") => Some(Route::Anthropic),
        _ => None,
    }
}

/// The tokens an answer is taken to have spent when it reports none: 4 bytes a token.
pub const BYTES_PER_TOKEN: u64 = 4;
/// The output a request is taken to ask for when it names no `max_tokens`.
const DEFAULT_MAX_TOKENS: u64 = 4096;
/// The most output one answer is reserved for.
const MAX_RESERVED_OUTPUT: u64 = 1_000_000;
/// The most answers one request is reserved for (`n`).
const MAX_ANSWERS: u64 = 128;

/// Whether the kernel's header `name` goes upstream: content negotiation, the SDKs' own, and
/// the providers' protocol headers iac-code sends.
pub fn kernel_header_passes(name: &str) -> bool {
    matches!(
        name,
        "content-type"
            | "accept"
            | "user-agent"
            | "anthropic-version"
            | "anthropic-beta"
            | "openai-beta"
            | "http-referer"
            | "x-title"
            | "x-dashscope-cachecontrol"
    ) || name.starts_with("x-stainless-")
}

/// Whether a run's own header `name` (`llmHeaders`, lower case) goes upstream: any but those of
/// the connection, the message's framing and encoding (the answer's usage is read), and where
/// the request goes. A run's own credentials pass: they replace the operator's key, as the
/// kernel would send them.
pub fn run_header_passes(name: &str) -> bool {
    !matches!(
        name,
        "host"
            | "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "content-length"
            | "content-encoding"
            | "accept-encoding"
            | "expect"
            | "forwarded"
            | "via"
    ) && !name.starts_with("x-forwarded-")
}

/// A run's `llmHeaders` as the kernel would take them (`resolve_a2a_llm_headers` of iac-code
/// 0.16.0): a name of token characters (at most 256 bytes, trimmed), an ASCII value without
/// control characters but tab (at most 8 KiB), the last of a name in any case, at most 64; the
/// others skipped. Then those a run may not set upstream ([`run_header_passes`]) are dropped.
pub fn run_headers<'a>(
    given: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<(String, String)> {
    let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
    let mut kept: Vec<(String, String)> = Vec::new();
    for (name, value) in given {
        if kept.len() >= 64 {
            break;
        }
        let name = name.trim();
        let fine = !name.is_empty()
            && name.len() <= 256
            && name.chars().all(token)
            && value.len() <= 8192
            && value
                .chars()
                .all(|c| c.is_ascii() && (c == '\t' || (' '..='~').contains(&c)));
        if !fine {
            continue;
        }
        let lower = name.to_ascii_lowercase();
        kept.retain(|(n, _)| *n != lower);
        kept.push((lower, value.to_owned()));
    }
    kept.retain(|(n, _)| run_header_passes(n));
    kept
}

/// A request body as it goes upstream, and the tokens it may spend.
#[derive(Debug, PartialEq, Eq)]
pub struct Prepared {
    /// The body to send: a JSON object's members once each, in their order (an upstream that
    /// took a member's first copy would spend otherwise than reserved), with usage asked for;
    /// `None`: the kernel's as it is (no JSON object).
    pub body: Option<Vec<u8>>,
    /// Input (estimated from its size) and the most output it asks for, times the answers.
    pub reserve: u64,
}

/// A JSON object's members, unparsed (a member of any size costs its bytes, never a tree).
type Members = IndexMap<String, Box<RawValue>>;

/// Prepares `body` of `route`: a streamed OpenAI request asks for its usage
/// (`stream_options.include_usage`); the reserve is the input's estimate and `max_tokens`
/// (`max_completion_tokens`, else a default) for each of `n` (`best_of`) answers. CPU-bound on
/// a large body: run it off the runtime's workers.
pub fn prepare(route: Route, body: &[u8]) -> Prepared {
    let input = body.len() as u64 / BYTES_PER_TOKEN;
    let Ok(mut top) = serde_json::from_slice::<Members>(body) else {
        return Prepared {
            body: None,
            reserve: input + DEFAULT_MAX_TOKENS,
        };
    };
    let number = |k: &str| {
        top.get(k)
            .and_then(|v| serde_json::from_str::<u64>(v.get()).ok())
    };
    let output = number("max_completion_tokens")
        .or_else(|| number("max_tokens"))
        .unwrap_or(DEFAULT_MAX_TOKENS)
        .min(MAX_RESERVED_OUTPUT);
    let answers = number("n")
        .max(number("best_of"))
        .unwrap_or(1)
        .clamp(1, MAX_ANSWERS);
    let reserve = input.saturating_add(output.saturating_mul(answers));
    let streamed = top
        .get("stream")
        .and_then(|v| serde_json::from_str::<bool>(v.get()).ok())
        == Some(true);
    if route == Route::OpenAi && streamed {
        let mut options: Members = top
            .get("stream_options")
            .and_then(|v| serde_json::from_str(v.get()).ok())
            .unwrap_or_default();
        let yes = RawValue::from_string("true".to_owned()).expect("JSON true");
        options.insert("include_usage".to_owned(), yes);
        if let Ok(raw) = serde_json::value::to_raw_value(&options) {
            top.insert("stream_options".to_owned(), raw);
        }
    }
    Prepared {
        body: serde_json::to_vec(&top).ok(),
        reserve,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn sent(p: &Prepared) -> Value {
        serde_json::from_slice(p.body.as_deref().expect("a JSON object")).unwrap()
    }

    #[test]
    fn the_routes_iac_codes_clients_call_and_nothing_else() {
        use http::Method;
        assert_eq!(
            route(&Method::POST, "chat/completions"),
            Some(Route::OpenAi)
        );
        assert_eq!(route(&Method::GET, "models"), Some(Route::OpenAi));
        assert_eq!(route(&Method::POST, "v1/messages"), Some(Route::Anthropic));
        for (m, p) in [
            (Method::GET, "chat/completions"),
            (Method::POST, "files"),
            (Method::DELETE, "models"),
            (Method::POST, "../admin"),
            (Method::POST, ""),
            (Method::POST, "chat/completions/../../x"),
        ] {
            assert_eq!(route(&m, p), None, "{m} {p}");
        }
    }

    #[test]
    fn a_streamed_openai_request_always_asks_for_its_usage() {
        for given in [
            json!({"model": "m", "stream": true, "messages": []}),
            json!({"model": "m", "stream": true, "stream_options": null}),
            json!({"model": "m", "stream": true, "stream_options": {"include_usage": false, "x": 1}}),
            json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}}),
        ] {
            let raw = serde_json::to_vec(&given).unwrap();
            let out = sent(&prepare(Route::OpenAi, &raw));
            assert_eq!(out["stream_options"]["include_usage"], true, "{given}");
            assert_eq!(out["model"], "m");
            if given["stream_options"]["x"] == 1 {
                assert_eq!(out["stream_options"]["x"], 1, "the other options kept");
            }
        }
        for (route, given) in [
            (Route::OpenAi, json!({"stream": false, "a": [1, {"b": 2}]})),
            (Route::OpenAi, json!({"messages": [], "z": 1, "a": 2})),
            (Route::Anthropic, json!({"stream": true})),
        ] {
            let out = sent(&prepare(route, &serde_json::to_vec(&given).unwrap()));
            assert_eq!(out, given, "sent as it was");
            let keys: Vec<&String> = out.as_object().unwrap().keys().collect();
            let want: Vec<&String> = given.as_object().unwrap().keys().collect();
            assert_eq!(keys, want, "in its order");
        }
        assert_eq!(prepare(Route::OpenAi, b"not json").body, None);
        assert_eq!(prepare(Route::OpenAi, b"[1]").body, None);
    }

    /// A member given twice goes upstream once, the copy the reserve was made of.
    #[test]
    fn a_member_given_twice_goes_up_once() {
        let raw = br#"{"max_tokens":100000,"model":"m","max_tokens":1}"#;
        let p = prepare(Route::Anthropic, raw);
        assert_eq!(p.reserve, raw.len() as u64 / 4 + 1);
        assert_eq!(
            String::from_utf8(p.body.unwrap()).unwrap(),
            r#"{"max_tokens":1,"model":"m"}"#
        );
    }

    #[test]
    fn the_reserve_is_the_input_estimate_and_the_output_asked_for_each_answer() {
        let body = serde_json::to_vec(&json!({"max_tokens": 100, "pad": "x".repeat(400)})).unwrap();
        let input = body.len() as u64 / 4;
        assert_eq!(prepare(Route::Anthropic, &body).reserve, input + 100);
        let body =
            serde_json::to_vec(&json!({"max_completion_tokens": 7, "max_tokens": 100})).unwrap();
        assert_eq!(
            prepare(Route::OpenAi, &body).reserve,
            body.len() as u64 / 4 + 7
        );
        let body = serde_json::to_vec(&json!({"max_tokens": 1u64 << 60})).unwrap();
        assert_eq!(
            prepare(Route::OpenAi, &body).reserve,
            body.len() as u64 / 4 + MAX_RESERVED_OUTPUT
        );
        let body = serde_json::to_vec(&json!({"max_tokens": 10, "n": 5, "best_of": 8})).unwrap();
        assert_eq!(
            prepare(Route::OpenAi, &body).reserve,
            body.len() as u64 / 4 + 80
        );
        let body = serde_json::to_vec(&json!({"n": [1, 2], "max_tokens": "x"})).unwrap();
        assert_eq!(
            prepare(Route::OpenAi, &body).reserve,
            body.len() as u64 / 4 + DEFAULT_MAX_TOKENS
        );
        assert_eq!(prepare(Route::OpenAi, b"[]").reserve, DEFAULT_MAX_TOKENS);
    }

    /// A large body costs its bytes, not a tree of values (a 32 MiB array of zeros would be
    /// over a GiB as `Value`s).
    #[test]
    fn a_large_member_is_passed_unparsed() {
        let mut raw = br#"{"stream":true,"a":["#.to_vec();
        for _ in 0..2_000_000 {
            raw.extend_from_slice(b"0,");
        }
        raw.extend_from_slice(b"0]}");
        let p = prepare(Route::OpenAi, &raw);
        let body = p.body.unwrap();
        assert!(body.len() < raw.len() + 64);
        assert!(body.ends_with(br#"0],"stream_options":{"include_usage":true}}"#));
    }

    #[test]
    fn a_runs_headers_are_taken_as_the_kernel_takes_them() {
        let long = "v".repeat(8193);
        let given = [
            ("X-Org", "o1"),
            (" x-org ", "o2"),
            ("Bad Name", "v"),
            ("X-Ctl", "a\u{1}b"),
            ("X-Nl", "a\nb"),
            ("X-Utf", "é"),
            ("X-Long", long.as_str()),
            ("X-Tab", "a\tb"),
            ("Host", "elsewhere.example"),
            ("", "v"),
        ];
        assert_eq!(
            run_headers(given),
            [
                ("x-org".to_owned(), "o2".to_owned()),
                ("x-tab".to_owned(), "a\tb".to_owned())
            ]
        );
        let many: Vec<(String, String)> =
            (0..70).map(|i| (format!("x-h{i}"), "v".into())).collect();
        let kept = run_headers(many.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        assert_eq!(kept.len(), 64);
    }

    #[test]
    fn only_the_clients_own_headers_pass_and_a_run_cannot_redirect_its_request() {
        for ok in [
            "content-type",
            "user-agent",
            "anthropic-version",
            "x-stainless-retry-count",
            "x-dashscope-cachecontrol",
        ] {
            assert!(kernel_header_passes(ok), "{ok}");
        }
        for no in [
            "host",
            "openai-organization",
            "openai-project",
            "x-forwarded-host",
            "forwarded",
            "authorization",
            "x-api-key",
            "cookie",
        ] {
            assert!(!kernel_header_passes(no), "{no}");
        }
        for no in [
            "host",
            "accept-encoding",
            "content-length",
            "transfer-encoding",
            "x-forwarded-for",
            "forwarded",
            "expect",
        ] {
            assert!(!run_header_passes(no), "{no}");
        }
        for ok in ["x-org", "authorization", "openai-organization"] {
            assert!(run_header_passes(ok), "{ok}");
        }
    }
}
