//! Compatibility with the official Svix SDKs, run from their registries' packages against a
//! real Herald: the Python SDK (`tests/sdk/svix_compat.py`, webhooks verified with the
//! official `standardwebhooks` package) and the JavaScript SDK's kitchen sink
//! (`tests/sdk/js/kitchen_sink.mjs`: every method of the SDK, served or cleanly refused).
//! `scripts/test.sh` installs both SDKs at the pinned versions.

use std::process::Command;

use crate::support::TestServer;
use crate::support::server::ADMIN_TOKEN;

/// Runs `program script` against a fresh Herald; the script's standard output.
async fn run_against_herald(program: String, script: &str, env: &[(&str, String)]) -> String {
    let server = TestServer::start().await;
    let mut command = Command::new(program);
    command.arg(script).env("HERALD_URL", server.url("")).env("HERALD_TOKEN", ADMIN_TOKEN);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = tokio::task::spawn_blocking(move || command.output()).await.unwrap().expect("running the SDK script");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the SDK script failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}");
    stdout
}

/// The variable `scripts/test.sh` sets, or a panic that says so.
fn prepared(name: &str, what: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set: run the suite with scripts/test.sh, which installs {what}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_svix_python_sdk_works_against_herald() {
    let python =
        prepared("HERALD_TEST_PYTHON", "the svix and standardwebhooks Python packages (tests/sdk/requirements.txt)");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/svix_compat.py");
    let stdout = run_against_herald(python, script, &[]).await;
    assert!(stdout.contains("ALL SDK OPERATIONS PASSED"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_of_the_official_svix_javascript_sdk_against_herald() {
    let modules = prepared("HERALD_TEST_NODE_MODULES", "the svix npm package (tests/sdk/js/package.json)");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/js/kitchen_sink.mjs");
    let stdout = run_against_herald("node".into(), script, &[("HERALD_TEST_NODE_MODULES", modules)]).await;
    assert!(stdout.contains("SDK METHODS CHECKED"), "{stdout}");
}
