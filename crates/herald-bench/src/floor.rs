//! The machine's HTTP floor (`--scenario http-floor`): the load generator posts the bench's
//! messages straight to the bench's own receiver, with no server between. Both ends of every
//! exchange run in this process, so its CPU per exchange is what one keep-alive HTTP/1.1
//! POST costs on this machine with the stack Herald uses at both ends (hyper). A message
//! through any relay is at least two such exchanges — ingest and delivery — so
//! `cores / (2 × cpu per exchange)` bounds the rate of the whole rig here (generator, relay
//! and receiver sharing the cores, each exchange paid at both ends), even if the relay's own
//! work cost nothing. It bounds the rig, not Herald: with a cheaper generator and receiver
//! (`scripts/harness.py`: wrk and nginx), Herald's own cost decides.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use super::BenchArgs;
use super::ledger;
use super::load::{self, Body, Producer, Progress, Stream};
use super::probe::{self, ProcessSample};
use super::receiver::{Behaviour, Receiver};
use super::report::Percentiles;
use super::target::{Api, http_client};

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FloorReport {
    scenario: &'static str,
    cpus: usize,
    offered_rate: f64,
    achieved_rate: f64,
    exchanges: u64,
    failures: u64,
    /// From each request's scheduled time to its answer.
    latency_ms: Percentiles,
    /// Client and server ends together.
    cpu_micros_per_exchange: Option<f64>,
    /// `cpus / (2 × cpuMicrosPerExchange)`, in messages per second: the most this rig
    /// (generator, relay and receiver on these cores) could carry, not Herald's limit.
    rig_ceiling: Option<f64>,
}

/// Runs the floor measurement at `--rate` for `--duration` and prints its report.
pub async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let receiver = Receiver::start().await?;
    let api = Api {
        client: http_client(args.concurrency),
        base: receiver.url(Behaviour::Fast, 0),
        token: String::new(),
        idempotency_keys: false,
    };
    let stream = Stream {
        apps: vec![0],
        rate: args.rate,
        duration: Duration::from_secs_f64(args.duration),
        offset: Duration::ZERO,
    };
    let before = ProcessSample::read(std::process::id());
    let start = tokio::time::Instant::now() + Duration::from_millis(50);
    let outcome = load::drive(
        &Producer::Direct(Box::new(api)),
        Arc::new(vec![String::new()]),
        &stream,
        start,
        args.concurrency,
        Arc::new(Body::new(args.payload_bytes)),
        Arc::new(Progress::default()),
    )
    .await;
    let elapsed = start.elapsed().as_secs_f64();
    let after = ProcessSample::read(std::process::id());
    let mut latency = ledger::histogram();
    for ack in &outcome.acks {
        latency.saturating_record((ack.acked - ack.scheduled).as_micros() as u64);
    }
    let exchanges = outcome.acks.len() as u64;
    let cpus = probe::cpu_count();
    let cpu = match (before, after) {
        (Some(b), Some(a)) if exchanges > 0 => Some((a.cpu_secs - b.cpu_secs) * 1e6 / exchanges as f64),
        _ => None,
    };
    let report = FloorReport {
        scenario: "http-floor",
        cpus,
        offered_rate: args.rate,
        achieved_rate: exchanges as f64 / elapsed,
        exchanges,
        failures: outcome.failures,
        latency_ms: Percentiles::of(&latency),
        cpu_micros_per_exchange: cpu,
        rig_ceiling: cpu.map(|us| cpus as f64 * 1e6 / (2.0 * us)),
    };
    report.print(args.json);
    anyhow::ensure!(outcome.failures == 0, "{} exchanges failed", outcome.failures);
    Ok(())
}

impl FloorReport {
    fn print(&self, json: bool) {
        println!("scenario            http-floor (the bench's own receiver; {} CPUs)", self.cpus);
        println!("offered rate        {:.0} exchanges/s", self.offered_rate);
        println!("achieved rate       {:.0} exchanges/s ({} failed)", self.achieved_rate, self.failures);
        println!("latency (ms)        {}", self.latency_ms.line());
        if let (Some(cpu), Some(ceiling)) = (self.cpu_micros_per_exchange, self.rig_ceiling) {
            println!("cpu per exchange    {cpu:.1} µs (client and server ends)");
            println!(
                "rig ceiling         {ceiling:.0} msg/s (generator, relay and receiver on these cores; not Herald's limit)"
            );
        }
        if json {
            println!("{}", serde_json::to_string(self).expect("reports serialize"));
        }
    }
}
