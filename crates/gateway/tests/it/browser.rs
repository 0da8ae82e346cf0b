//! Real-browser tier: headless Chromium (Debian's, driven by `conformance/browser/drive.mjs`
//! through puppeteer-core) loads a page from another origin whose script is the official
//! `@ag-ui/client` (1.0.0 and 0.0.59), bundled by esbuild at test time from the conformance
//! lockfile. The page runs real-kernel turns against the gateway, over https (a certificate of
//! the test's own CA, which Chromium is told to trust by its key), cross-origin, with its user's own
//! JWT as the bearer token (so every POST is preflighted; the gateway verifies it against the
//! key set and the thread becomes that user's): a permission interrupt answered by clicking the page's "Allow"
//! button, then a plain turn. Any console error (CORS blocks land there), page error, failed
//! request or `[ag-ui]...` client warning fails the run. A page of an origin the gateway does not
//! allow must be refused by the browser. A third page drops a run's stream and follows it again
//! with the browser's `EventSource` (`--detach-grace`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::http::{header, StatusCode, Uri};
use axum::response::IntoResponse;
use serde_json::{json, Value};
use testkit::real_kernel::KernelEnv;

use crate::support::{jwks_file, jwt_for, managed, Builder};

const CLIENTS: [&str; 2] = ["1", "0059"];

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../conformance")
}

/// Bundles the page for `client` into `out/<client>/` (index.html + page.js).
async fn bundle(client: &str, out: &Path) {
    let o = tokio::process::Command::new("node")
        .arg(dir().join("browser/bundle.mjs"))
        .arg(client)
        .arg(out.join(client))
        .current_dir(dir())
        .output()
        .await
        .expect("node");
    assert!(
        o.status.success(),
        "bundle {client}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Serves `root` (the bundles) on a fresh loopback port; returns the origin `http://127.0.0.1:PORT`.
async fn static_origin(root: PathBuf) -> String {
    let app = axum::Router::new().fallback(move |uri: Uri| {
        let root = root.clone();
        async move {
            // Only `/<client>/` and `/<client>/page.js`: nothing else of the disk is reachable.
            let path = uri.path().trim_start_matches('/');
            let (client, file) = path.split_once('/').unwrap_or((path, ""));
            let (file, mime) = match file {
                "" | "index.html" => ("index.html", "text/html; charset=utf-8"),
                "page.js" => ("page.js", "text/javascript; charset=utf-8"),
                _ => return StatusCode::NOT_FOUND.into_response(),
            };
            if !CLIENTS.contains(&client) {
                return StatusCode::NOT_FOUND.into_response();
            }
            match tokio::fs::read(root.join(client).join(file)).await {
                Ok(bytes) => ([(header::CONTENT_TYPE, mime)], bytes).into_response(),
                Err(_) => StatusCode::NOT_FOUND.into_response(),
            }
        }
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    origin
}

/// Runs the driver with `plan`; returns (passed, report).
async fn drive(plan: Value) -> (bool, Value) {
    crate::support::browser_driver(&dir().join("browser/drive.mjs"), &dir(), &plan).await
}

/// The page's config for a thread: the gateway, its user's JWT, and the messages of its turns.
fn page_config(env: &KernelEnv, url: &str, thread: &str, messages: Value) -> Value {
    let cwd = env.ws().join(thread).display().to_string();
    let token = jwt_for(&format!("user-{thread}"));
    json!({"url": url, "token": token, "threadId": thread, "messages": messages,
           "forwardedProps": {"iacCode": {"schemaVersion": 1, "rosInvocationId": format!("inv-{thread}"), "cwd": cwd}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_clients_in_chromium_across_origins() {
    crate::support::chromium();
    let d = dir();
    for m in [
        "agui-client-1",
        "agui-client-0059",
        "puppeteer-core",
        "esbuild",
    ] {
        assert!(
            d.join("node_modules").join(m).is_dir(),
            "{m} is not installed: run `npm ci --prefix conformance` (scripts/test.sh does)"
        );
    }
    let bundles = tempfile::tempdir().unwrap();
    for client in CLIENTS {
        bundle(client, bundles.path()).await;
    }
    // Origin A is allowed by the gateway; origin B serves the same pages but is not.
    let allowed = static_origin(bundles.path().to_path_buf()).await;
    let foreign = static_origin(bundles.path().to_path_buf()).await;

    let env = KernelEnv::new().await;
    let kernel = managed(&env).await;
    let keys = tempfile::tempdir().unwrap();
    let jwks = jwks_file(keys.path(), &[testkit::jwt::ec()]);
    // The gateway serves https with a certificate of the test's own CA; Chromium trusts exactly
    // that certificate (by its public key), nothing else.
    let ca = testkit::tls::Ca::new();
    let (cert, key, spki) = ca.issue_with_spki(&["127.0.0.1", "localhost"]);
    let (cert_file, key_file) = (keys.path().join("cert.pem"), keys.path().join("key.pem"));
    std::fs::write(&cert_file, cert).unwrap();
    std::fs::write(&key_file, key).unwrap();
    let s = Builder::in_env(&env)
        .kernel(kernel.clone())
        .jwks(&jwks, Duration::from_secs(300))
        .tls(&cert_file, &key_file)
        .cors_origin(&allowed)
        .start()
        .await;
    // A gateway whose runs survive a dropped connection, without a token: an `EventSource`
    // cannot send one.
    let detaching = Builder::new()
        .env(
            "IAC_CODE_AGUI_ALLOWED_CWDS",
            &env.ws().display().to_string(),
        )
        .kernel(kernel)
        .cors_origin(&allowed)
        .config(move |c| c.detach_grace = Duration::from_secs(10))
        .start()
        .await;

    let secure = s.url.replacen("http://", "https://", 1);
    for client in CLIENTS {
        let thread = format!("browser-{client}");
        let blocked = format!("blocked-{client}");
        let reattached = format!("reattach-{client}");
        let mut reattach_config = page_config(
            &env,
            &detaching.url,
            &reattached,
            json!(["Steady. scenario:steady"]),
        );
        reattach_config["mode"] = json!("reattach");
        reattach_config["dropAfter"] = json!(5);
        let trust = format!("--ignore-certificate-errors-spki-list={spki}");
        let plan = json!({"timeoutMs": 180_000, "chromiumArgs": [trust], "pages": [
            {"name": "allowed", "page": format!("{allowed}/{client}/"),
             "config": page_config(&env, &secure, &thread, json!(["Run. scenario:bash", "Hello. scenario:text"])),
             "expect": ["interrupt", "success", "success"]},
            {"name": "blocked", "page": format!("{foreign}/{client}/"),
             "config": page_config(&env, &secure, &blocked, json!(["Hello. scenario:text"])),
             "expect": "blocked"},
            {"name": "reattach", "page": format!("{allowed}/{client}/"),
             "config": reattach_config, "expect": ["success"], "dropsStream": true}]});
        let (ok, report) = drive(plan).await;
        assert!(ok, "client {client}: {report:#}");

        let page = &report["pages"][0];
        assert_eq!(page["name"], "allowed");
        assert_eq!(page["agui"]["client"], client, "{page:#}");
        let runs = page["agui"]["runs"].as_array().expect("runs");
        assert_eq!(runs.len(), 3, "{page:#}");
        for r in runs {
            assert_eq!(r["runStarted"]["type"], "RUN_STARTED", "{r:#}");
            assert_eq!(r["runStarted"]["threadId"], thread.as_str(), "{r:#}");
            assert!(r["runStarted"]["runId"].is_string(), "{r:#}");
            // The 1.0 client declared 1.0 and got the 1.0 dialect; 0.0.59 declares nothing.
            let declared = &r["runStarted"]["protocolVersion"];
            if client == "1" {
                assert_eq!(declared, "1.0", "{r:#}");
            } else {
                assert!(declared.is_null(), "{r:#}");
            }
            assert_eq!(r["last"]["type"], "RUN_FINISHED", "{r:#}");
        }
        // The permission turn, answered through the page's button.
        let interrupts = runs[0]["last"]["outcome"]["interrupts"]
            .as_array()
            .expect("interrupts");
        assert!(!interrupts.is_empty(), "{:#}", runs[0]);
        assert!(
            interrupts.iter().all(|i| i["id"].is_string()),
            "{interrupts:?}"
        );
        assert_eq!(page["clicks"], 1);
        // The page's JWT made the thread its user's.
        let owner = format!("user-{thread}");
        assert_eq!(s.thread_doc(&thread)["owner"], owner.as_str());
        // The bearer header made the browser preflight the POSTs, and the gateway allowed them.
        let preflights = page["preflights"].as_array().expect("preflights");
        assert!(
            !preflights.is_empty()
                && preflights
                    .iter()
                    .all(|p| p.as_str().unwrap().starts_with("204 ")),
            "{preflights:?}"
        );
        assert_eq!(runs[1]["resume"], true);
        assert_eq!(runs[1]["outcome"], "success", "{:#}", runs[1]);
        // The plain turn streamed text.
        assert_eq!(runs[2]["resume"], false);
        assert!(
            runs[2]["types"]
                .to_string()
                .contains("TEXT_MESSAGE_CONTENT"),
            "{:#}",
            runs[2]
        );

        // The foreign origin's page never reached the gateway: the browser refused the preflight.
        let page = &report["pages"][1];
        assert_eq!(page["name"], "blocked");
        let run = &page["agui"]["runs"][0];
        assert!(run["error"].is_string(), "{page:#}");
        assert_eq!(run["types"], json!([]), "{page:#}");
        assert!(
            !s.thread_file(&blocked).exists(),
            "a run of the foreign origin reached the gateway"
        );

        // The run the page dropped after 5 events and followed again with `EventSource` from
        // there: joined, the whole run, ids 1, 2, 3, … without a gap or a repeat. The stream
        // ended after the terminal event; the `EventSource` reconnected with its
        // `Last-Event-ID`, got 204 and stopped (no repeat, no error).
        let page = &report["pages"][2];
        assert_eq!(page["name"], "reattach");
        let run = &page["agui"]["runs"][0];
        assert_eq!(run["dropAfter"], 5, "{page:#}");
        let ids: Vec<u64> = run["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|i| i.as_u64().unwrap())
            .collect();
        assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>(), "{page:#}");
        assert_eq!(run["runStarted"]["threadId"], reattached.as_str());
        assert_eq!(run["outcome"], "success", "{page:#}");
        assert!(ids.len() > 10, "{page:#}");
        // It reconnected once after the end (with the terminal event's id) and the 204 stopped it.
        assert_eq!(run["opens"], 1, "{page:#}");
        assert_eq!(page["eventsResponses"], json!([200, 204]), "{page:#}");
    }
}
