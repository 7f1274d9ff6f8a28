//! `herald check-config` through the real binary: what passes, what fails and why, and no
//! secret in what it prints. And the systemd unit in `docs/` that runs it.

use std::os::unix::fs::PermissionsExt;

use crate::support::process::run_herald;

/// Runs `herald check-config ARGS` with `env`; its success and its output.
async fn check_config(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    run_herald(&[&["check-config"], args].concat(), env).await
}

#[tokio::test]
async fn a_sound_configuration_passes_and_no_secret_is_printed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o700)).unwrap();
    let data = data.to_str().unwrap();
    let env = [
        ("HERALD_ADMIN_TOKEN", "hrld_do-not-print-me"),
        ("HERALD_SECRET_KEY", "c2VydmVyLWtleS1kby1ub3QtcHJpbnQtbWUtMDAwMDA="),
    ];
    let (ok, said) = check_config(&["--listen", "127.0.0.1:0", "--data-dir", data], &env).await;
    assert!(ok, "{said}");
    assert!(said.contains("ok    configuration: valid") && said.contains("ok    listen"), "{said}");
    assert!(said.contains("ok    server key: set (auth.secret_key)"), "{said}");
    assert!(said.contains(&format!("data_dir = \"{data}\"")), "the configuration in effect is printed: {said}");
    assert!(said.contains(r#"admin_token = "********""#), "{said}");
    assert!(!said.contains("do-not-print-me") && !said.contains("c2VydmVyLWtleS1k"), "{said}");
}

#[tokio::test]
async fn each_failure_is_named_and_fails_the_check() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    // A taken port.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (ok, said) = check_config(&["--listen", &addr, "--data-dir", data], &[]).await;
    assert!(!ok && said.contains(&format!("FAIL  listen: cannot listen on {addr}")), "{said}");
    // A server key others may read.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    let key = dir.path().join("secret-key");
    std::fs::write(&key, "c2VydmVyLWtleQ==\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (ok, said) = check_config(&["--listen", "127.0.0.1:0", "--data-dir", data], &[]).await;
    assert!(!ok && said.contains("FAIL  server key") && said.contains("mode 644"), "{said}");
    // A database that does not answer, whose password stays unprinted; and no server key.
    let url = "postgres://herald:hunter2@127.0.0.1:1/herald";
    let (ok, said) = check_config(&["--listen", "127.0.0.1:0", "--database-url", url], &[]).await;
    assert!(!ok && said.contains("FAIL  database: cannot connect"), "{said}");
    assert!(said.contains("FAIL  server key: auth.secret_key is required with PostgreSQL"), "{said}");
    assert!(!said.contains("hunter2") && said.contains("postgres://herald:********@127.0.0.1:1/herald"), "{said}");
    // A configuration that is not valid.
    let (ok, said) = check_config(&["--listen", "not an address"], &[]).await;
    assert!(!ok && said.contains("FAIL  configuration"), "{said}");
}

/// The unit file parses as systemd reads it (`systemd-analyze verify`, with the binary
/// this build made in place of /usr/local/bin/herald). Without systemd on the machine the
/// check cannot run, and says so.
#[test]
fn the_systemd_unit_verifies() {
    let Ok(analyze) = which("systemd-analyze") else {
        eprintln!("skipped: systemd-analyze is not installed (Debian package systemd)");
        return;
    };
    let unit =
        include_str!("../../../../docs/herald.service").replace("/usr/local/bin/herald", env!("CARGO_BIN_EXE_herald"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("herald.service");
    std::fs::write(&path, unit).unwrap();
    let output = std::process::Command::new(analyze).arg("verify").arg(&path).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success() && said.trim().is_empty(), "{said}");
}

fn which(program: &str) -> Result<std::path::PathBuf, ()> {
    let path = std::env::var_os("PATH").ok_or(())?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file()).ok_or(())
}
