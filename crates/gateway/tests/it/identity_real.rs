//! A permission interrupt of the real kernel under JWT authentication: another user can neither
//! see nor answer it (the tool does not run); its owner answers it and the tool runs once.

use serde_json::json;
use testkit::real_kernel::KernelEnv;
use testkit::sse::{assert_valid_run, post};

use crate::support::{
    bearer_for, get_as, jwks_file, jwt_server, managed, post_turn_as, resume_body,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_permission_interrupt_is_answered_by_its_owner_only() {
    let env = KernelEnv::new().await;
    let keys = tempfile::tempdir().unwrap();
    let jwks = jwks_file(keys.path(), &[testkit::jwt::ec()]);
    let s = jwt_server(&env, managed(&env).await, &jwks).await;
    let (alice, bob) = (bearer_for("alice"), bearer_for("bob"));
    let a = [("authorization", alice.as_str())];
    let b = [("authorization", bob.as_str())];
    let w = env.ws().join("owned").display().to_string();
    let r1 = post_turn_as(&s.url, "owned", "r1", "Run it. scenario:bash", &w, &a).await;
    assert_valid_run(&r1, "owned", "r1");
    assert_eq!(r1.last()["outcome"]["type"], "interrupt", "{}", r1.raw);
    let id = r1.last()["outcome"]["interrupts"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let allow =
        json!([{"interruptId": id, "status": "resolved", "payload": {"decision": "allow_once"}}]);
    let out = std::path::Path::new(&w).join("out.txt");

    // Bob: the thread does not exist for him; his answer is refused before the kernel.
    let (status, _) = get_as(&format!("{}threads/owned", s.url), &b).await;
    assert_eq!(status, 404);
    let stolen = post(
        &s.url,
        &resume_body("owned", "rb", &w, "inv-1", allow.clone()),
        &b,
    )
    .await;
    assert_eq!(stolen.status, 409);
    assert_eq!(stolen.error_code(), Some("EXECUTION_LOST"));
    assert!(!out.exists(), "another user's answer ran the tool");

    // Alice answers: the tool runs, once.
    let r2 = post(&s.url, &resume_body("owned", "r2", &w, "inv-1", allow), &a).await;
    assert_valid_run(&r2, "owned", "r2");
    assert_eq!(r2.last()["outcome"]["type"], "success", "{}", r2.raw);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "agui-test\n");
    let (_, state) = get_as(&format!("{}threads/owned", s.url), &a).await;
    assert_eq!(state["binding"]["userId"], "alice");
}
