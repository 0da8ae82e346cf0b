//! `GET /capabilities`: what this agent can do, in AG-UI's `AgentCapabilities` shape (the
//! convention of Google ADK's adapter, which `getCapabilities()` clients read). Who the agent is
//! comes from the kernel's Agent Card (kept a minute; without a kernel answer, the gateway's own
//! name); the rest from what the gateway serves and how it is configured. Ours are under
//! `custom.iacCode`.

use serde_json::{json, Value};

use engine::caller::Caller;
use engine::run::Runtime;

/// The answer.
pub async fn answer(rt: &Runtime, cache: &kernel::CardCache, caller: &Caller) -> Value {
    let card = cache.card(rt.kernels()).await;
    let mut v = describe(rt, &card);
    // With users' own kernels: where this caller's workspaces may be (the first of their roots).
    if let Some(t) = rt.kernels().tenants() {
        let key = kernel::tenant::user_key(caller.user.as_deref());
        if let Some(root) = t.isolation().workspaces_of(&key).first() {
            v["custom"]["iacCode"]["workspaceRoot"] = json!(root.display().to_string());
        }
    }
    v
}

/// The capabilities for a kernel card (`Null`: none could be read).
pub fn describe(rt: &Runtime, card: &Value) -> Value {
    let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_owned);
    let extensions: Vec<Value> = card["capabilities"]["extensions"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e.get("uri").cloned()).collect())
        .unwrap_or_default();
    let mut identity = json!({
        "name": text(&card["name"]).unwrap_or_else(|| "iac-code".into()),
        "type": "iac-code",
        "metadata": {
            "gatewayVersion": env!("CARGO_PKG_VERSION"),
            "kernelProtocolVersion": card["protocolVersion"].clone(),
            "kernelExtensions": extensions,
        },
    });
    for (key, value) in [
        ("description", text(&card["description"])),
        ("version", text(&card["version"])),
        ("provider", text(&card["provider"]["organization"])),
        ("documentationUrl", text(&card["documentationUrl"])),
    ] {
        if let Some(v) = value {
            identity[key] = json!(v);
        }
    }
    let cfg = rt.settings();
    json!({
        "identity": identity,
        "transport": {
            "streaming": true,
            "websocket": false,
            "httpBinary": false,
            "pushNotifications": false,
            // Runs outlive a dropped connection and are followed again by event id.
            "resumable": !cfg.detach_grace.is_zero(),
        },
        "tools": {"supported": true, "clientProvided": false},
        "state": {"snapshots": false, "deltas": false, "memory": true, "persistentState": true},
        "multiAgent": {"supported": false},
        "reasoning": {"supported": true, "streaming": true, "encrypted": false},
        "multimodal": {
            "input": {"image": true, "audio": false, "video": false, "pdf": false, "file": false},
            "output": {"image": false, "audio": false},
        },
        "execution": {"codeExecution": true, "sandboxed": rt.kernels().tenants().is_some()},
        "humanInTheLoop": {
            "supported": true,
            "approvals": true,
            "interrupts": true,
            "approveWithEdits": false,
            // Guidance: a message into a running pipeline.
            "interventions": true,
            "feedback": false,
        },
        "custom": {
            "iacCode": {
                "protocolVersions": agui::SUPPORTED_VERSIONS,
                "interruptTtlSeconds": cfg.interrupt_ttl_secs,
                "routes": {
                    "cancel": "/extensions/iac-code/v1/executions/{executionId}/cancel",
                    "thread": "/threads/{threadId}",
                    "runEvents": "/threads/{threadId}/runs/{runId}/events",
                },
                "images": {"mediaTypes": ["image/png", "image/jpeg", "image/gif", "image/webp"]},
            }
        }
    })
}
