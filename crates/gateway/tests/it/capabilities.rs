//! `GET /capabilities`: the agent's identity from the real kernel's Agent Card, the rest from the
//! gateway, in the shape `@ag-ui/core`'s `AgentCapabilitiesSchema` accepts (checked with the
//! official package: every key one the schema knows); authenticated like every other route.

use std::time::Duration;

use serde_json::Value;
use testkit::fake_kernel::FakeKernel;
use testkit::real_kernel::KernelEnv;

use crate::support::{get_as, managed, node, Builder};

/// Parses `caps` with the official schema; every key (two levels down, `custom` aside) must be
/// one the schema names.
async fn official_schema_accepts(caps: &Value) {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conformance");
    let script = r#"
        const { AgentCapabilitiesSchema } = require("@ag-ui/core");
        let text = ""; process.stdin.on("data", (d) => (text += d));
        process.stdin.on("end", () => {
          const v = JSON.parse(text);
          AgentCapabilitiesSchema.parse(v);
          const shape = (z) => { while (z && z._def && z._def.innerType) z = z._def.innerType;
                                 return z && z._def && z._def.shape ? z._def.shape() : null; };
          const check = (value, schema, path) => {
            const s = shape(schema); if (!s) return;
            for (const k of Object.keys(value)) {
              if (!(k in s)) throw new Error(`unknown key ${path}${k}`);
              if (k !== "custom" && k !== "metadata" && value[k] && typeof value[k] === "object"
                  && !Array.isArray(value[k])) check(value[k], s[k], `${path}${k}.`);
            }
          };
          check(v, AgentCapabilitiesSchema, "");
          console.log("ok");
        });"#;
    let args = ["-e", script].map(std::ffi::OsStr::new);
    let out = node(&args, &dir, &[], &caps.to_string()).await;
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok"),
        "the official schema refused {caps:#}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_capabilities_name_the_real_kernel_and_pass_the_official_schema() {
    let env = KernelEnv::new().await;
    let kernel = managed(&env).await;
    let card = kernel
        .client()
        .expect("a ready kernel")
        .agent_card(Duration::from_secs(5))
        .await
        .unwrap();
    let s = Builder::new()
        .dir(env.dir.path().canonicalize().unwrap())
        .kernel(kernel)
        .config(move |c| c.detach_grace = Duration::from_secs(30))
        .start()
        .await;
    let (status, caps) = get_as(&format!("{}capabilities", s.url), &[]).await;
    assert_eq!(status, 200, "{caps}");
    assert_eq!(caps["identity"]["name"], card["name"], "{caps:#}");
    assert!(caps["identity"]["name"]
        .as_str()
        .is_some_and(|n| !n.is_empty()));
    let extensions = caps["identity"]["metadata"]["kernelExtensions"].to_string();
    assert!(
        extensions.contains("urn:iac-code:a2a:pipeline-events:v1"),
        "{extensions}"
    );
    assert_eq!(caps["transport"]["resumable"], true);
    assert_eq!(caps["tools"]["clientProvided"], false);
    assert_eq!(caps["multimodal"]["input"]["image"], true);
    assert_eq!(caps["humanInTheLoop"]["interrupts"], true);
    assert_eq!(caps["custom"]["iacCode"]["protocolVersions"][0], "1.0");
    official_schema_accepts(&caps).await;
}

/// Without a kernel card the agent is still named; the route takes the token every route takes.
#[tokio::test]
async fn the_capabilities_need_the_token_and_stand_without_a_card() {
    let k = FakeKernel::start().await;
    let s = Builder::for_fake(&k).auth("tok").start().await;
    let url = format!("{}capabilities", s.url);
    assert_eq!(get_as(&url, &[]).await.0, 401);
    let (status, caps) = get_as(&url, &[("authorization", "Bearer tok")]).await;
    assert_eq!(status, 200);
    assert_eq!(caps["identity"]["name"], "iac-code");
    assert_eq!(caps["transport"]["resumable"], false);
    official_schema_accepts(&caps).await;
}
