//! Compatibility with the official Svix Python SDK: `tests/sdk/svix_compat.py` drives every
//! SDK operation on the Svix v1 paths against a real Herald and verifies the webhooks it
//! receives with the official `standardwebhooks` package.

use std::process::Command;

use crate::support::TestServer;
use crate::support::server::ADMIN_TOKEN;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_svix_python_sdk_works_against_herald() {
    let python = std::env::var("HERALD_TEST_PYTHON").unwrap_or_else(|_| {
        panic!(
            "HERALD_TEST_PYTHON is not set: run the suite with scripts/test.sh, which creates a virtual \
             environment with the svix and standardwebhooks packages (tests/sdk/requirements.txt)"
        )
    });
    let server = TestServer::start().await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/svix_compat.py");
    let url = server.url("");
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python).arg(script).env("HERALD_URL", url).env("HERALD_TOKEN", ADMIN_TOKEN).output()
    })
    .await
    .unwrap()
    .expect("running the SDK script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the SDK script failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
    assert!(stdout.contains("ALL SDK OPERATIONS PASSED"), "{stdout}");
}
