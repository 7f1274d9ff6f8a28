//! The bench report: a human table and one JSON object (the last line with `--json`).

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::Value;

#[derive(Debug, Clone, Default, Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
    pub count: u64,
}

impl Percentiles {
    /// `p50 … max` for the human table.
    pub fn line(&self) -> String {
        format!(
            "p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  max {:.2}",
            self.p50, self.p90, self.p99, self.p999, self.max
        )
    }

    /// Milliseconds from a histogram of microseconds.
    pub fn of(h: &Histogram<u64>) -> Self {
        let ms = |q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        if h.is_empty() {
            return Self::default();
        }
        Self {
            p50: ms(0.5),
            p90: ms(0.9),
            p99: ms(0.99),
            p999: ms(0.999),
            max: h.max() as f64 / 1000.0,
            count: h.len(),
        }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct AckLatency {
    pub p50: f64,
    pub p99: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct LedgerCounts {
    pub sent: u64,
    pub delivered: u64,
    /// What the server reports as dead letters among the owed deliveries that never
    /// arrived (information: it does not excuse them).
    pub dead: u64,
    /// Owed deliveries the receiver never got: sent − delivered, from the receipts alone.
    pub missing: u64,
    pub duplicates: u64,
    pub unexpected: u64,
}

/// CPU per delivered message, in µs, of each process group of the server.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CpuGroups {
    /// The server's own process.
    pub herald: Option<f64>,
    /// Every process of the database the bench started (PostgreSQL), when it did.
    pub database: Option<f64>,
    pub total: Option<f64>,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupLatency {
    pub group: String,
    pub latency_ms: Percentiles,
}

#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub scenario: String,
    pub target: String,
    pub cpus: usize,
    /// Messages per second offered by the generator.
    pub offered_rate: f64,
    /// Messages per second accepted and delivered, over the time from the first scheduled
    /// send to the last delivery.
    pub achieved_rate: f64,
    /// Deliveries (message × endpoint) per second over the same time.
    pub deliveries_per_second: f64,
    pub messages: u64,
    pub ingest_failures: u64,
    pub latency_ms: Percentiles,
    pub ack_latency_ms: AckLatency,
    pub groups: Vec<GroupLatency>,
    /// Server CPU (plus its database when spawned) per delivered message (one message at
    /// one endpoint), in µs: `cpu.total`.
    pub cpu_micros_per_message: Option<f64>,
    /// The same, per process group.
    pub cpu: CpuGroups,
    /// The spawned PostgreSQL's share, in µs per delivered message (`cpu.database`).
    pub database_cpu_micros_per_message: Option<f64>,
    pub cpu_seconds_per_1000: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
    /// Bytes the server (and its database) wrote to disk, per delivered message.
    pub bytes_written_per_message: Option<f64>,
    /// On PostgreSQL, the write-ahead log the run generated per delivered message (the
    /// `pg-write` figure): from the WAL insert position, so every process's WAL counts,
    /// the cluster's own included. `None` on SQLite and on a server given by `--url`.
    pub wal_bytes_per_message: Option<f64>,
    /// A probe of the data directory's disk before the run (4 KiB write + `fdatasync`, one
    /// thread, for a second): what the disk allows, not what the server did.
    pub disk_probe_fsync_per_second: Option<f64>,
    /// CPU of the bench itself (load generator and receiver) per message, in µs.
    pub bench_cpu_micros_per_message: Option<f64>,
    pub ledger: LedgerCounts,
    pub signatures_verified: u64,
    pub signatures_failed: u64,
    /// Scenario-specific figures (ramp steps, backlog drain, …).
    pub details: Value,
}

fn opt(value: Option<f64>, unit: &str) -> String {
    value.map_or_else(|| "n/a".to_owned(), |v| format!("{v:.1}{unit}"))
}

impl Report {
    pub fn print(&self, json: bool) {
        let l = &self.latency_ms;
        println!("scenario            {} ({}; {} CPUs)", self.scenario, self.target, self.cpus);
        println!("offered rate        {:.0} msg/s", self.offered_rate);
        println!(
            "achieved rate       {:.0} msg/s ({:.0} deliveries/s)",
            self.achieved_rate, self.deliveries_per_second
        );
        println!("messages            {} ({} ingest failures)", self.messages, self.ingest_failures);
        println!("latency (ms)        {}", l.line());
        for g in &self.groups {
            let p = &g.latency_ms;
            println!(
                "  {:<17} p50 {:.2}  p90 {:.2}  p99 {:.2}  p99.9 {:.2}  (n={})",
                g.group, p.p50, p.p90, p.p99, p.p999, p.count
            );
        }
        println!("ingest ack (ms)     p50 {:.2}  p99 {:.2}", self.ack_latency_ms.p50, self.ack_latency_ms.p99);
        println!("cpu per delivered   {}", opt(self.cpu_micros_per_message, " µs"));
        println!("  herald            {}", opt(self.cpu.herald, " µs"));
        if self.cpu.database.is_some() {
            println!("  database          {}", opt(self.cpu.database, " µs"));
        }
        println!("cpu per 1000        {}", opt(self.cpu_seconds_per_1000, " s"));
        println!("bench cpu / message {}", opt(self.bench_cpu_micros_per_message, " µs"));
        println!("peak rss            {}", opt(self.peak_rss_bytes.map(|b| b as f64 / 1_048_576.0), " MiB"));
        println!("written per message {}", opt(self.bytes_written_per_message, " B"));
        if self.wal_bytes_per_message.is_some() {
            println!("WAL per message     {}", opt(self.wal_bytes_per_message, " B"));
        }
        println!("disk probe (before) {}", opt(self.disk_probe_fsync_per_second, " fsync/s"));
        let c = &self.ledger;
        println!(
            "ledger              sent {}  delivered {}  missing {}  (dead per the server {}, duplicates {}, unexpected {})",
            c.sent, c.delivered, c.missing, c.dead, c.duplicates, c.unexpected
        );
        println!("signatures          {} verified, {} failed", self.signatures_verified, self.signatures_failed);
        if !self.details.is_null() {
            println!("details             {}", self.details);
        }
        if json {
            println!("{}", serde_json::to_string(self).expect("reports serialize"));
        }
    }
}
