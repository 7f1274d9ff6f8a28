//! The README's first-webhook walkthrough, run literally: its shell block is read from the
//! README itself (not copied here) and run with bash against a fresh server, so the page a
//! newcomer follows cannot rot. It needs bash, curl and python3, as the README says.

use std::process::Stdio;
use std::time::Duration;

use crate::support::TestServer;
use crate::support::server::ADMIN_TOKEN;

const README: &str = include_str!("../../../../README.md");

/// The first ```sh block after the heading `heading`.
fn shell_block(heading: &str) -> &'static str {
    let section = &README[README.find(heading).unwrap_or_else(|| panic!("the README has no {heading:?}"))..];
    let start = section.find("```sh\n").expect("a shell block") + "```sh\n".len();
    let end = section[start..].find("```").expect("the block ends");
    &section[start..start + end]
}

#[tokio::test]
async fn the_first_webhook_walkthrough_works_as_written() {
    let server = TestServer::start().await;
    let script = shell_block("### A first webhook");
    let run = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(script)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env("HERALD_URL", server.url(""))
        .env("HERALD_TOKEN", ADMIN_TOKEN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group, so that a receiver left behind by a failure is stopped too.
        .process_group(0)
        .kill_on_drop(true)
        .spawn()
        .expect("bash runs");
    let group = run.id().expect("running") as i32;
    let output = tokio::time::timeout(Duration::from_secs(90), run.wait_with_output()).await;
    // SAFETY: signals only the process group this test started.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    let output = output.expect("the walkthrough ends within 90 s").unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "{}\n{stdout}\n{stderr}", output.status);
    assert!(stdout.contains("(signature valid)"), "the receiver verified the delivery:\n{stdout}\n{stderr}");
    assert!(stdout.contains(r#""responseStatusCode":204"#), "the attempt is shown:\n{stdout}");
    let (_, endpoint) = server.get("/api/v1/app/acme/endpoint/acme-hooks").await;
    assert_eq!(endpoint["url"], "http://127.0.0.1:9000/webhooks");
    assert_eq!(endpoint["filterTypes"], serde_json::json!(["payment.succeeded"]));
}
