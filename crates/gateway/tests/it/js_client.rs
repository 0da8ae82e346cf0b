//! The repository's JavaScript client (`clients/js`, `IacCodeAgent`) with `@ag-ui/client` 1.0.0
//! and 0.0.59 against the gateway and the real kernel: `forwardedProps.iacCode` from its options
//! and frontend tools kept in the browser, a stream cut mid-run re-attached with `Last-Event-ID`
//! (the text whole), a permission interrupt, a reloaded page that connects and has the thread and
//! its pending interrupt, answers it, and reads the capabilities.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use testkit::real_kernel::KernelEnv;

use crate::support::{managed, node, Builder};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../clients/js")
}

/// Runs the Node script `script` in `cwd` against the gateway at `url` with the service token
/// and `vars`; it must succeed (`what` names it in the failure): its output.
async fn run_script(
    script: &Path,
    cwd: &Path,
    url: &str,
    vars: &[(&str, &str)],
    what: &str,
) -> String {
    let mut env = vec![
        ("GATEWAY_URL", OsStr::new(url)),
        ("AUTH", OsStr::new("Bearer tok")),
    ];
    env.extend(vars.iter().map(|(k, v)| (*k, OsStr::new(*v))));
    let out = node(&[script.as_os_str()], cwd, &env, "").await;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_js_client_runs_reattaches_and_connects_against_the_real_kernel() {
    assert!(
        dir().join("node_modules/agui-client-0059").is_dir(),
        "the JavaScript client's packages are not installed: run `npm ci --prefix clients/js` (scripts/test.sh does)"
    );
    let env = KernelEnv::new().await;
    let s = Builder::in_env(&env)
        .kernel(managed(&env).await)
        .config(move |c| c.detach_grace = Duration::from_secs(30))
        .auth("tok")
        .start()
        .await;
    for client in ["1", "0059"] {
        let thread = format!("js-{client}");
        let cwd = env.ws().join(&thread).display().to_string();
        let vars = [("CLIENT", client), ("THREAD", &thread), ("CWD", &cwd)];
        let what = format!("client {client}");
        let stdout = run_script(&dir().join("e2e/run.mjs"), &dir(), &s.url, &vars, &what).await;
        // The cut was re-attached through the events route, and the thread was connected.
        assert!(stdout.contains("\"cut and re-attached\""), "{stdout}");
        assert!(stdout.contains("\"connect\""), "{stdout}");
    }

    // CopilotKit's runtime in process, with the client's agent and runner: a run, an interrupt
    // and its resume, a stop, and a new runtime instance that gets the thread from the gateway.
    let ck = dir().join("e2e/copilotkit");
    assert!(
        ck.join("node_modules/@copilotkit/runtime").is_dir(),
        "CopilotKit's runtime is not installed: run `npm ci --prefix clients/js/e2e/copilotkit` (scripts/test.sh does)"
    );
    let cwd = env.ws().join("ck").display().to_string();
    let vars = [("THREAD", "ck"), ("CWD", &cwd)];
    let stdout = run_script(&ck.join("run.mjs"), &ck, &s.url, &vars, "copilotkit").await;
    assert!(stdout.contains("\"connect after restart\""), "{stdout}");
}
