//! The cost of endpoint filters and transforms (`--scenario scripts`): a typical filter and
//! a typical transform over a message of `--payload-bytes`, run by jaq in this process (the
//! language's own cost) and through Herald's sandbox (worker processes of the `herald`
//! binary, as deliveries run them: the cost a delivery pays). For the sandbox, the wall time
//! per evaluation one at a time, and the CPU of this process plus its workers per
//! evaluation with two callers at once. No server is involved.

use std::time::{Duration, Instant};

use anyhow::Context;
use herald::config::ScriptsConfig;
use herald::ids::AppId;
use herald::scripts::Sandbox;
use herald::scripts::engine::Program;
use serde::Serialize;

use super::BenchArgs;
use super::probe::ProcessSample;

/// Longest output a worker answers with (a transform's whole request).
const MAX_OUTPUT: usize = 1 << 20;

/// A filter as users write them: the event type and a threshold.
pub const FILTER: &str = r#".eventType == "invoice.paid" and .payload.amount > 100"#;
/// A transform as users write them: reshape the body, add a header.
pub const TRANSFORM: &str = r#"{payload: {id: .payload.id, amount: .payload.amount, customer: .payload.customer.email,
  lines: (.payload.lines | length)}, headers: (.headers + {"x-event": .eventType})}"#;

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScriptsReport {
    scenario: &'static str,
    payload_bytes: usize,
    evaluations: usize,
    filter: Costs,
    transform: Costs,
}

/// Microseconds per evaluation.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Costs {
    /// jaq in this process: compile once, run on the input.
    in_process_us: f64,
    /// Through the sandbox, one evaluation at a time: what one delivery waits.
    sandbox_wall_us: f64,
    /// Through the sandbox with two callers: CPU of this process and its workers.
    sandbox_cpu_us: f64,
}

pub async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let n = ((args.duration * 2000.0) as usize).max(1000);
    let input = input(args.payload_bytes);
    let sandbox = Sandbox::new(
        super::herald_binary(args)?,
        ScriptsConfig {
            timeout: Duration::from_secs(5),
            memory_bytes: 512 << 20,
            workers: 2,
            max_workers_per_app: 2,
            worker_program: None,
        },
        MAX_OUTPUT,
    );
    let tenant = AppId::generate();
    let mut costs = Vec::new();
    for code in [FILTER, TRANSFORM] {
        let program = Program::compile(code).map_err(|e| anyhow::anyhow!("{e}"))?;
        let started = Instant::now();
        for _ in 0..n {
            program.run(&input).map_err(|e| anyhow::anyhow!(e))?;
        }
        let in_process_us = per(started.elapsed(), n);
        sandbox.eval(&tenant, code, &input).await.context("starting the sandbox")?; // warm: workers started, program cached
        let started = Instant::now();
        for _ in 0..n {
            sandbox.eval(&tenant, code, &input).await?;
        }
        let sandbox_wall_us = per(started.elapsed(), n);
        let before = cpu_with_children();
        let (a, b) = tokio::join!(
            repeat(&sandbox, &tenant, code, &input, n / 2),
            repeat(&sandbox, &tenant, code, &input, n / 2)
        );
        a?;
        b?;
        let sandbox_cpu_us = (cpu_with_children() - before) * 1e6 / (n / 2 * 2) as f64;
        costs.push(Costs { in_process_us, sandbox_wall_us, sandbox_cpu_us });
    }
    let transform = costs.pop().expect("two");
    let filter = costs.pop().expect("two");
    let report =
        ScriptsReport { scenario: "scripts", payload_bytes: args.payload_bytes, evaluations: n, filter, transform };
    for (name, c) in [("filter", &report.filter), ("transform", &report.transform)] {
        println!(
            "{name:>9}: {:.1} µs in process; sandbox {:.1} µs per evaluation (wall, one at a time), {:.1} µs CPU (two at a time)",
            c.in_process_us, c.sandbox_wall_us, c.sandbox_cpu_us
        );
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

async fn repeat(sandbox: &Sandbox, tenant: &AppId, code: &str, input: &[u8], n: usize) -> anyhow::Result<()> {
    for _ in 0..n {
        sandbox.eval(tenant, code, input).await?;
    }
    Ok(())
}

/// Microseconds per one of `n` operations that took `elapsed`.
pub fn per(elapsed: Duration, n: usize) -> f64 {
    elapsed.as_secs_f64() * 1e6 / n as f64
}

/// The input a filter or transform sees, with a payload of about `bytes`.
fn input(bytes: usize) -> Vec<u8> {
    let lines: Vec<serde_json::Value> = (0..bytes / 60)
        .map(|i| serde_json::json!({"sku": format!("SKU-{i:05}"), "qty": i % 7, "price": 1250}))
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "eventType": "invoice.paid",
        "channels": null,
        "headers": {"x-team": "billing"},
        "method": "POST",
        "url": "https://hooks.example.com/in",
        "payload": {"id": "in_1234", "amount": 4200, "customer": {"email": "a@example.com"}, "lines": lines},
    }))
    .expect("JSON")
}

/// CPU seconds of this process and of its live children (the sandbox workers).
fn cpu_with_children() -> f64 {
    let me = std::process::id();
    let mut total = ProcessSample::read(me).map_or(0.0, |s| s.cpu_secs);
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let parent = stat.rsplit(')').next().and_then(|rest| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if parent == Some(me) {
            total += ProcessSample::read(pid).map_or(0.0, |s| s.cpu_secs);
        }
    }
    total
}
