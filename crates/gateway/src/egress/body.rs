//! What of a kernel's request goes upstream (pure): which of its headers, which of a run's own
//! headers, the body with usage asked for, and how many tokens the request may spend (reserved
//! against the user's budget until its answer says).
//!
//! The kernel is not trusted: its agent can call the egress itself with its capability. So only
//! the headers iac-code's clients send pass (a request naming another organisation, a `Host`, a
//! forwarding header would spend or send the operator's key elsewhere), and a streamed OpenAI
//! request always asks for its usage (iac-code asks only for some providers).

use serde_json::Value;

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
/// The most output one request is reserved for.
const MAX_RESERVED_OUTPUT: u64 = 1_000_000;

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
    ) || name.starts_with("x-stainless-")
        || name.starts_with("x-dashscope-")
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
    /// The body to send: the kernel's, or its JSON with usage asked for.
    pub body: Option<Vec<u8>>,
    /// Input (estimated from its size) and the most output it asks for.
    pub reserve: u64,
}

/// Prepares `body` of `route`: a streamed OpenAI request asks for its usage
/// (`stream_options.include_usage`); the reserve is the input's estimate and `max_tokens`
/// (`max_completion_tokens`), or a default.
pub fn prepare(route: Route, body: &[u8]) -> Prepared {
    let input = body.len() as u64 / BYTES_PER_TOKEN;
    let Ok(Value::Object(mut json)) = serde_json::from_slice::<Value>(body) else {
        return Prepared {
            body: None,
            reserve: input + DEFAULT_MAX_TOKENS,
        };
    };
    let output = ["max_completion_tokens", "max_tokens"]
        .iter()
        .find_map(|k| json.get(*k).and_then(Value::as_u64))
        .unwrap_or(DEFAULT_MAX_TOKENS)
        .min(MAX_RESERVED_OUTPUT);
    let reserve = input + output;
    let streamed = json.get("stream") == Some(&Value::Bool(true));
    if route != Route::OpenAi || !streamed {
        return Prepared {
            body: None,
            reserve,
        };
    }
    let asks = json
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        == Some(&Value::Bool(true));
    if asks {
        return Prepared {
            body: None,
            reserve,
        };
    }
    let options = json
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Default::default()));
    if !options.is_object() {
        *options = Value::Object(Default::default());
    }
    options["include_usage"] = Value::Bool(true);
    Prepared {
        body: serde_json::to_vec(&json).ok(),
        reserve,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sent(p: &Prepared, original: &Value) -> Value {
        match &p.body {
            Some(b) => serde_json::from_slice(b).unwrap(),
            None => original.clone(),
        }
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
        ] {
            let raw = serde_json::to_vec(&given).unwrap();
            let p = prepare(Route::OpenAi, &raw);
            let out = sent(&p, &given);
            assert_eq!(out["stream_options"]["include_usage"], true, "{given}");
            assert_eq!(out["model"], "m");
        }
        let keeps = json!({"stream": true, "stream_options": {"include_usage": true, "x": 1}});
        let p = prepare(Route::OpenAi, &serde_json::to_vec(&keeps).unwrap());
        assert_eq!(p.body, None, "already asked: sent as it is");
        for (route, given) in [
            (Route::OpenAi, json!({"stream": false})),
            (Route::OpenAi, json!({"messages": []})),
            (Route::Anthropic, json!({"stream": true})),
        ] {
            let p = prepare(route, &serde_json::to_vec(&given).unwrap());
            assert_eq!(p.body, None, "{given}");
        }
        assert_eq!(prepare(Route::OpenAi, b"not json").body, None);
    }

    #[test]
    fn the_reserve_is_the_input_estimate_and_the_output_asked_for() {
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
        assert_eq!(prepare(Route::OpenAi, b"[]").reserve, DEFAULT_MAX_TOKENS);
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
