//! One bench run's machinery, shared by every scenario: setting up applications and
//! endpoints through the API, driving phases of load, draining until the ledger closes,
//! and turning it all into a report.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::BenchArgs;
use super::ledger::Ledger;
use super::load::{self, Ack, Body, Outcome, Producer, Progress, Stream};
use super::probe::{self, ProcessSample};
use super::receiver::{Behaviour, Receiver};
use super::report::{AckLatency, CpuGroups, GroupLatency, LedgerCounts, Percentiles, Report};
use super::target::{Api, Target};

/// An application to create: its endpoints' behaviours, and fields every one of its
/// endpoints is created with.
#[derive(Debug, Clone)]
pub struct AppSpec {
    pub endpoints: Vec<Behaviour>,
    /// Fields merged into each endpoint's create body besides its URL (delivery settings, a
    /// filter, a transform, …), so a scenario says what it needs without special cases here.
    pub extra: Option<Value>,
}

impl AppSpec {
    pub fn fast(endpoints: usize) -> Self {
        Self::of(vec![Behaviour::Fast; endpoints])
    }

    pub fn of(endpoints: Vec<Behaviour>) -> Self {
        Self { endpoints, extra: None }
    }

    /// The same application, its endpoints created with `extra` (a JSON object) too.
    pub fn with(self, extra: Value) -> Self {
        Self { extra: Some(extra), ..self }
    }
}

struct App {
    id: String,
    /// Global endpoint indexes (the receiver's path numbers).
    endpoints: Vec<u32>,
}

pub struct Run<'a> {
    pub args: &'a BenchArgs,
    pub target: Target,
    pub receiver: Receiver,
    apps: Vec<App>,
    app_ids: Arc<Vec<String>>,
    pub groups: Vec<String>,
    pub ledger: Ledger,
    body: Arc<Body>,
    started: Option<Instant>,
    before: Option<ProcessSample>,
    db_before: Option<ProcessSample>,
    /// The PostgreSQL WAL position when measuring started.
    wal_before: Option<u64>,
    /// How messages are produced (the API, or the outbox).
    pub producer: Producer,
    /// This process (generator and receiver) at the start, for its own CPU figure.
    bench_before: Option<ProcessSample>,
    fsync: Option<f64>,
    pub messages: u64,
    pub failures: u64,
    offered: f64,
}

/// The result of one phase of load.
pub struct PhaseResult {
    pub start: Instant,
    pub acked: u64,
    pub failures: u64,
    /// When the last message was due.
    pub last_scheduled: Instant,
}

impl<'a> Run<'a> {
    pub async fn new(args: &'a BenchArgs, target: Target, groups: &[&str]) -> anyhow::Result<Self> {
        let fsync =
            target.data_dir.as_deref().and_then(|dir| probe::fsync_per_second(dir, Duration::from_secs(1)).ok());
        Ok(Self {
            args,
            producer: Producer::Api(Box::new(Api { idempotency_keys: args.idempotency_keys, ..target.api.clone() })),
            target,
            receiver: Receiver::start().await?,
            apps: vec![],
            app_ids: Arc::new(vec![]),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ledger: Ledger::new(groups.len()),
            body: Arc::new(Body::new(args.payload_bytes)),
            started: None,
            before: None,
            db_before: None,
            wal_before: None,
            bench_before: None,
            fsync,
            messages: 0,
            failures: 0,
            offered: 0.0,
        })
    }

    /// Creates the applications and endpoints; returns the index of the first app created.
    pub async fn setup(&mut self, specs: &[AppSpec]) -> anyhow::Result<usize> {
        let first = self.apps.len();
        let api = &self.target.api;
        let mut next_endpoint = self.apps.iter().map(|a| a.endpoints.len()).sum::<usize>();
        for (i, spec) in specs.iter().enumerate() {
            let app = api.create("/api/v1/app", json!({"name": format!("bench-{}", first + i)})).await?;
            let app_id = app["id"].as_str().unwrap_or_default().to_owned();
            let mut endpoints = vec![];
            for behaviour in &spec.endpoints {
                let mut body = json!({"url": self.receiver.url(*behaviour, next_endpoint)});
                if let (Some(Value::Object(extra)), Some(fields)) = (&spec.extra, body.as_object_mut()) {
                    fields.extend(extra.clone());
                }
                let endpoint = api.create(&format!("/api/v1/app/{app_id}/endpoint"), body).await?;
                let endpoint_id = endpoint["id"].as_str().unwrap_or_default();
                let secret = api.get(&format!("/api/v1/app/{app_id}/endpoint/{endpoint_id}/secret")).await?;
                self.receiver.set_secret(next_endpoint, secret["key"].as_str().unwrap_or_default());
                endpoints.push(next_endpoint as u32);
                next_endpoint += 1;
            }
            self.apps.push(App { id: app_id, endpoints });
        }
        self.app_ids = Arc::new(self.apps.iter().map(|a| a.id.clone()).collect());
        Ok(first)
    }

    /// The server's id of the application `setup` created at index `app`.
    pub fn app_id(&self, app: usize) -> &str {
        &self.apps[app].id
    }

    /// The receiver's endpoint indexes of application `app`, in creation order.
    pub fn endpoints_of(&self, app: usize) -> &[u32] {
        &self.apps[app].endpoints
    }

    /// The receiver index the next endpoint gets (for endpoints a scenario creates itself).
    pub fn next_endpoint(&self) -> u32 {
        self.apps.iter().map(|a| a.endpoints.len() as u32).sum()
    }

    /// Takes the samples the report's CPU, memory and disk figures start from, once: the
    /// first phase does it, and so does a scenario that drives its load itself.
    pub async fn start_measuring(&mut self, start: Instant) {
        if self.started.is_none() {
            self.wal_before = self.target.wal_position().await;
            self.before = self.target.sample();
            self.db_before = self.target.database_sample();
            self.bench_before = ProcessSample::read(std::process::id());
            self.started = Some(start);
        }
    }

    /// Accounts for messages a scenario sent itself, outside [`Run::phase`] (a closed loop,
    /// so offered = sent): each owed at one endpoint, its latency in `group`.
    pub fn account(&mut self, group: usize, sent: &[(Ack, u32)]) {
        for (ack, endpoint) in sent {
            self.ledger.expect(ack, group, &[*endpoint], &[]);
        }
        self.messages += sent.len() as u64;
        self.offered += sent.len() as f64;
    }

    /// Runs streams concurrently, each tagged with its latency group; the acks go into the
    /// ledger. Endpoints in `excluded` are not owed deliveries (never-answering ones): what
    /// arrives there is counted apart, neither owed nor unexpected.
    pub async fn phase(&mut self, label: &str, streams: &[(Stream, usize)], excluded: &[u32]) -> PhaseResult {
        let start = Instant::now() + Duration::from_millis(50);
        self.start_measuring(start).await;
        let progress = Arc::new(Progress::default());
        let total: u64 = streams.iter().map(|(s, _)| s.messages()).sum();
        let ticker = tokio::spawn(show_progress(label.to_owned(), total, progress.clone(), self.receiver.counter()));
        let runs = streams.iter().map(|(stream, _)| {
            load::drive(
                &self.producer,
                self.app_ids.clone(),
                stream,
                start,
                self.args.concurrency,
                self.body.clone(),
                progress.clone(),
            )
        });
        let outcomes: Vec<Outcome> = futures_util::future::join_all(runs).await;
        ticker.abort();
        eprintln!();
        let mut result = PhaseResult { start, acked: 0, failures: 0, last_scheduled: start };
        for ((stream, group), outcome) in streams.iter().zip(outcomes) {
            let end = start + stream.offset + stream.duration;
            result.last_scheduled = result.last_scheduled.max(end);
            result.failures += outcome.failures;
            result.acked += outcome.acks.len() as u64;
            for ack in &outcome.acks {
                let (owed, optional): (Vec<u32>, Vec<u32>) =
                    self.apps[ack.app].endpoints.iter().copied().partition(|e| !excluded.contains(e));
                self.ledger.expect(ack, *group, &owed, &optional);
            }
            self.offered += stream.rate * stream.duration.as_secs_f64();
        }
        self.messages += result.acked;
        self.failures += result.failures;
        result
    }

    /// Waits until every owed delivery arrived, or nothing arrived for `stall`. Returns
    /// whether the ledger closed.
    pub async fn drain(&mut self, stall: Duration) -> bool {
        let mut last_progress = Instant::now();
        let mut last_delivered = self.ledger.delivered;
        loop {
            self.ledger.record(self.receiver.take_receipts());
            if self.ledger.outstanding() == 0 {
                return true;
            }
            if self.ledger.delivered != last_delivered {
                last_delivered = self.ledger.delivered;
                last_progress = Instant::now();
            } else if last_progress.elapsed() > stall {
                return false;
            }
            eprint!("\rdraining: {} deliveries outstanding      ", self.ledger.outstanding());
            let _ = std::io::stderr().flush();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// How many of the outstanding deliveries the server reports as dead letters.
    async fn dead_letters(&self) -> u64 {
        let mut dead = 0;
        for (endpoint, owed) in self.ledger.outstanding_by_endpoint() {
            let Some(app) = self.apps.iter().find(|a| a.endpoints.contains(&endpoint)) else { continue };
            let Ok(list) =
                self.target.api.get(&format!("/api/v1/app/{}/endpoint?limit=250&order=ascending", app.id)).await
            else {
                continue;
            };
            let position = app.endpoints.iter().position(|e| *e == endpoint).unwrap_or(0);
            let Some(id) = list["data"][position]["id"].as_str() else { continue };
            if let Ok(stats) = self.target.api.get(&format!("/api/v1/app/{}/endpoint/{id}/stats", app.id)).await {
                dead += stats["fail"].as_u64().unwrap_or(0).min(owed);
            }
        }
        dead
    }

    /// Builds the report from everything measured so far.
    pub async fn report(&mut self, scenario: &str, details: Value) -> Report {
        self.ledger.record(self.receiver.take_receipts());
        let after = self.target.sample();
        let db_after = self.target.database_sample();
        let wal_after = self.target.wal_position().await;
        let started = self.started.unwrap_or_else(Instant::now);
        let ended = self.ledger.last_delivery.unwrap_or_else(Instant::now).max(started + Duration::from_millis(1));
        let elapsed = (ended - started).as_secs_f64();
        let dead = if self.ledger.outstanding() > 0 { self.dead_letters().await } else { 0 };
        let mut all = self.ledger.latency[0].clone();
        for h in &self.ledger.latency[1..] {
            let _ = all.add(h);
        }
        let (verified, failed) = self.receiver.signature_checks();
        let server = match (self.before, after) {
            (Some(before), Some(after)) => Some((before, after)),
            _ => None,
        };
        // Per delivered message: each message received at one endpoint.
        let delivered = self.ledger.delivered + self.ledger.optional_delivered;
        let per_message = |v: f64| if delivered == 0 { None } else { Some(v / delivered as f64) };
        let database = match (self.db_before, db_after) {
            (Some(b), Some(a)) => Some((a.cpu_secs - b.cpu_secs, (a.write_bytes - b.write_bytes) as f64)),
            _ => None,
        };
        let (db_cpu, db_written) = database.unwrap_or((0.0, 0.0));
        let bench_cpu = match (self.bench_before, ProcessSample::read(std::process::id())) {
            (Some(b), Some(a)) => per_message((a.cpu_secs - b.cpu_secs) * 1e6),
            _ => None,
        };
        Report {
            scenario: scenario.to_owned(),
            target: match (&self.target.database, self.args.spawn) {
                (Some(_), true) => "herald (spawned) on PostgreSQL".into(),
                (None, true) => "herald (spawned) on SQLite".into(),
                _ => self.target.api.base.clone(),
            },
            cpus: probe::cpu_count(),
            offered_rate: self.offered / elapsed.max(f64::MIN_POSITIVE),
            achieved_rate: self.messages as f64 / elapsed,
            deliveries_per_second: self.ledger.delivered as f64 / elapsed,
            messages: self.messages,
            ingest_failures: self.failures,
            latency_ms: Percentiles::of(&all),
            ack_latency_ms: AckLatency {
                p50: self.ledger.ack_latency.value_at_quantile(0.5) as f64 / 1000.0,
                p99: self.ledger.ack_latency.value_at_quantile(0.99) as f64 / 1000.0,
            },
            groups: self
                .groups
                .iter()
                .zip(&self.ledger.latency)
                .map(|(g, h)| GroupLatency { group: g.clone(), latency_ms: Percentiles::of(h) })
                .collect(),
            cpu_micros_per_message: server.and_then(|(b, a)| per_message((a.cpu_secs - b.cpu_secs + db_cpu) * 1e6)),
            cpu: CpuGroups {
                herald: server.and_then(|(b, a)| per_message((a.cpu_secs - b.cpu_secs) * 1e6)),
                database: database.and_then(|(cpu, _)| per_message(cpu * 1e6)),
                total: server.and_then(|(b, a)| per_message((a.cpu_secs - b.cpu_secs + db_cpu) * 1e6)),
            },
            cpu_seconds_per_1000: server.and_then(|(b, a)| per_message((a.cpu_secs - b.cpu_secs + db_cpu) * 1000.0)),
            database_cpu_micros_per_message: database.and_then(|(cpu, _)| per_message(cpu * 1e6)),
            peak_rss_bytes: after.map(|a| a.peak_rss),
            bytes_written_per_message: server
                .and_then(|(b, a)| per_message((a.write_bytes - b.write_bytes) as f64 + db_written)),
            wal_bytes_per_message: self
                .wal_before
                .zip(wal_after)
                .and_then(|(b, a)| per_message(a.saturating_sub(b) as f64)),
            disk_probe_fsync_per_second: self.fsync,
            bench_cpu_micros_per_message: bench_cpu,
            ledger: LedgerCounts {
                sent: self.ledger.expected,
                delivered: self.ledger.delivered,
                dead,
                missing: self.ledger.outstanding(),
                duplicates: self.ledger.duplicates,
                unexpected: self.ledger.unexpected,
            },
            signatures_verified: verified,
            signatures_failed: failed,
            details,
        }
    }
}

async fn show_progress(label: String, total: u64, progress: Arc<Progress>, received: impl Fn() -> u64) {
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let acked = progress.acked.load(Ordering::Relaxed);
        let rate = acked as f64 / started.elapsed().as_secs_f64();
        let width = 30usize;
        let done = if total == 0 { width } else { (acked as usize * width / total as usize).min(width) };
        eprint!(
            "\r{label} [{}{}] {acked}/{total} acked, {} received, {} failed, {rate:.0} msg/s   ",
            "#".repeat(done),
            " ".repeat(width - done),
            received(),
            progress.failed.load(Ordering::Relaxed),
        );
        let _ = std::io::stderr().flush();
    }
}
