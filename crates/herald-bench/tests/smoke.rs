//! A smoke run of `herald-bench`: a few seconds at a small rate against a Herald it spawns;
//! the ledger must close (nothing missing) and the JSON report carry the documented fields.
//! And one of `http-floor`, which measures the machine's HTTP without any server.
//! The full scenarios have their own command (see BENCHMARKS.md).

use std::process::Command;

use serde_json::Value;

/// The `herald` binary of the same build (a workspace build makes it next to this one).
fn herald() -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_BIN_EXE_herald-bench")).with_file_name("herald");
    assert!(path.is_file(), "{} is not built: run the workspace's tests (cargo test --workspace)", path.display());
    path
}

/// Runs `herald-bench` with `args` (and `--herald`, when it spawns); returns the JSON
/// report on its last line.
async fn bench(args: &'static [&'static str]) -> Value {
    let output = tokio::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_herald-bench"));
        command.args(args);
        if args.contains(&"--spawn") {
            command.arg("--herald").arg(herald());
        }
        command.output()
    })
    .await
    .unwrap()
    .expect("running herald-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "bench failed\n{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_str(stdout.lines().last().unwrap()).expect("the last line is JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_bench_run_closes_its_ledger() {
    let report =
        bench(&["--scenario", "steady", "--spawn", "--rate", "200", "--duration", "2", "--apps", "3", "--json"]).await;
    assert_eq!(report["ledger"]["missing"], 0, "{report}");
    assert_eq!(report["ledger"]["sent"], 400, "{report}");
    assert_eq!(report["ledger"]["delivered"], 400, "{report}");
    assert_eq!(report["signaturesFailed"], 0);
    assert!(report["signaturesVerified"].as_u64().unwrap() > 0, "signatures were sampled");
    for field in
        ["achievedRate", "cpuMicrosPerMessage", "peakRssBytes", "bytesWrittenPerMessage", "diskProbeFsyncPerSecond"]
    {
        assert!(report[field].is_number(), "{field} missing: {report}");
    }
    for p in ["p50", "p90", "p99", "p999"] {
        assert!(report["latencyMs"][p].as_f64().unwrap() > 0.0, "latency {p}: {report}");
    }
    assert!(report["ackLatencyMs"]["p99"].is_number());
    assert!(report["walBytesPerMessage"].is_null(), "SQLite has no PostgreSQL WAL: {report}");
}

/// On PostgreSQL the report carries the WAL the run generated per message (`pg-write`);
/// the SQLite run above checks that it reports none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_run_reports_its_wal_per_message() {
    let report = bench(&[
        "--scenario",
        "steady",
        "--spawn",
        "--postgres",
        "--rate",
        "200",
        "--duration",
        "2",
        "--apps",
        "3",
        "--json",
    ])
    .await;
    assert_eq!((report["ledger"]["delivered"].as_u64(), report["ledger"]["missing"].as_u64()), (Some(400), Some(0)));
    let wal = report["walBytesPerMessage"].as_f64().unwrap_or_else(|| panic!("no WAL figure: {report}"));
    // A message is at least its row, its delivery and its attempt in the log: hundreds of
    // bytes, not a handful; nor a whole segment each.
    assert!((300.0..50_000.0).contains(&wal), "{wal} WAL bytes per message: {report}");
    assert!(report["bytesWrittenPerMessage"].as_f64().unwrap() > 0.0, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_floor_is_measured_without_a_server() {
    let report = bench(&["--scenario", "http-floor", "--rate", "300", "--duration", "1", "--json"]).await;
    assert_eq!(report["exchanges"], 300, "{report}");
    assert_eq!(report["failures"], 0, "{report}");
    let cpu = report["cpuMicrosPerExchange"].as_f64().expect("CPU per exchange");
    let ceiling = report["rigCeiling"].as_f64().expect("rig ceiling");
    let cpus = report["cpus"].as_f64().unwrap();
    assert!(cpu > 0.0 && (ceiling - cpus * 1e6 / (2.0 * cpu)).abs() < 1.0, "{report}");
    assert!(report["latencyMs"]["p50"].as_f64().unwrap() > 0.0, "{report}");
}
