//! `herald-bench`: measures a Svix-compatible server end to end — its own receiver, an
//! open-model load generator, a ledger that must close, and a report of throughput,
//! latency, CPU, memory and disk figures. Against a Herald it starts itself (`--spawn`) or
//! any running server (`--url`, `--token`), so peers are measured with the same tool.
//! Kept apart from the product: the `herald` binary carries none of it.
//!
//! Four scenarios measure what one tenant can do to another ([`tenants`]), each as a ratio
//! of two measures taken in one run (targets in brackets):
//!
//! - `scripts-noisy`: a quiet application's delivery p99 with a typical filter and
//!   transform, alone and while another application's transform runs until the sandbox's
//!   deadline on every attempt, both at `--rate` (≤ 2×).
//! - `long-polls`: the server's CPU per delivered message while 500 long-polls wait on
//!   another application's poller, against none (≤ 1.1×).
//! - `endpoint-churn`: the server's resident memory after 10,000 (`--messages`) cycles of an
//!   endpoint created through a portal token, sent one message and deleted, against after a
//!   1,000-cycle warm-up (≤ 1.10×).
//! - `endpoint-neighbour`: a fast endpoint's p99 beside a never-answering endpoint of the
//!   same application, against a fast endpoint alone, at `--rate`/2 (≤ 2×).
//!
//! ```text
//! herald-bench --spawn --scenario scripts-noisy --rate 500 --duration 15
//! herald-bench --spawn --scenario long-polls --rate 2000 --duration 15 [--postgres]
//! herald-bench --spawn --scenario endpoint-churn [--postgres]
//! herald-bench --spawn --scenario endpoint-neighbour --rate 2000 --duration 15 [--postgres]
//! ```

mod floor;
mod key_index;
mod ledger;
mod load;
mod probe;
mod receiver;
mod report;
mod run;
mod scenario;
mod scripts;
mod target;
mod tenants;

use anyhow::{Context, bail};

use run::Run;
use target::{SpawnOptions, Target};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// A constant rate to `--apps` applications (the smoke test and the basic figure).
    Steady,
    /// The highest sustained rate, in steps of +15 %.
    Ramp,
    /// One message to ten endpoints.
    Fanout,
    /// Ten times the rate for `--burst-seconds`, then drain.
    Burst,
    /// One application's endpoint never answers; the other's latency is compared.
    NoisyNeighbour,
    /// 10 % of endpoints answer after 500 ms.
    SlowEndpoints,
    /// `--messages` deliveries pending while the receiver is paused; memory and drain rate.
    Backlog,
    /// Producers call `herald.send_message` in their own transactions (PostgreSQL only).
    Outbox,
    /// No server: messages posted straight to the bench's receiver, to measure what one
    /// HTTP exchange costs on this machine (needs neither `--spawn` nor `--url`).
    HttpFloor,
    /// No server: what a typical endpoint filter and transform cost per evaluation, in
    /// process and through Herald's jq sandbox (uses the `herald` binary, see `--herald`).
    Scripts,
    /// No server: a keyed message's lookup in SQLite's key index built at full size
    /// (`--key-runs` runs of `--run-keys` keys), for a new key and a replay. Minutes.
    KeyIndex,
    /// A quiet application's endpoint (a typical filter and transform) alone at `--rate`,
    /// then while a noisy application's transform runs until the sandbox's deadline on
    /// every attempt, also at `--rate`; the quiet one's p99 ratio.
    ScriptsNoisy,
    /// The server's CPU per delivered message at `--rate`, without and then with 500
    /// long-polls waiting on another application's poller; the ratio.
    LongPolls,
    /// Endpoints created through a portal token, sent one message and deleted, 16 at a time:
    /// the server's RSS after 1,000 cycles and after `--messages` (default 10,000) more.
    EndpointChurn,
    /// A fast endpoint alone, then a fast endpoint beside a never-answering one of the same
    /// application, each at `--rate`/2; the fast one's p99 ratio.
    EndpointNeighbour,
}

#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    #[arg(long, value_enum)]
    pub scenario: Scenario,
    /// Start a Herald for the run (SQLite in a temporary directory).
    #[arg(long, conflicts_with_all = ["url", "token"])]
    pub spawn: bool,
    /// The `herald` binary to start with --spawn, or whose jq sandbox `--scenario scripts`
    /// measures (default: the one next to this `herald-bench`, else `herald` on the PATH).
    #[arg(long)]
    pub herald: Option<std::path::PathBuf>,
    /// With --spawn: run the spawned Herald on this PostgreSQL database.
    #[arg(long, requires = "spawn", conflicts_with = "postgres")]
    pub database_url: Option<String>,
    /// With --spawn: start a throwaway PostgreSQL cluster too, run Herald on it, and count
    /// its CPU with Herald's.
    #[arg(long, requires = "spawn")]
    pub postgres: bool,
    /// A running Svix-compatible server.
    #[arg(long, requires = "token")]
    pub url: Option<String>,
    #[arg(long)]
    pub token: Option<String>,
    /// With --url: the server's process id, to report its CPU and memory.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Messages per second offered.
    #[arg(long, default_value_t = 5000.0)]
    pub rate: f64,
    /// Seconds of load (per step for `ramp`).
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// End with one JSON object on the last line.
    #[arg(long)]
    pub json: bool,
    /// Concurrent HTTP connections of the load generator.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Approximate size of each message payload.
    #[arg(long, default_value_t = 1024)]
    pub payload_bytes: usize,
    /// Applications the load is spread over.
    #[arg(long, default_value_t = 10)]
    pub apps: usize,
    /// Length of the burst in the `burst` scenario.
    #[arg(long, default_value_t = 60.0)]
    pub burst_seconds: f64,
    /// Messages queued in the `backlog` scenario (default 1,000,000), or measured cycles of
    /// `endpoint-churn` (default 10,000).
    #[arg(long)]
    pub messages: Option<u64>,
    /// Give up draining after this many seconds without a delivery.
    #[arg(long, default_value_t = 30.0)]
    pub drain_stall: f64,
    /// Send a fresh `idempotency-key` with every message, as the Svix SDKs do on every POST.
    #[arg(long)]
    pub idempotency_keys: bool,
    /// Runs of the key index built by `--scenario key-index` (80: 1,000 keyed messages a
    /// second over the 12-hour TTL).
    #[arg(long, default_value_t = 80)]
    pub key_runs: usize,
    /// Keys per run for `--scenario key-index` (the store's default run size).
    #[arg(long, default_value_t = 524_288)]
    pub run_keys: usize,
}

/// Settings a spawned Herald gets for a scenario.
fn spawn_env(scenario: Scenario) -> Vec<(String, String)> {
    match scenario {
        Scenario::NoisyNeighbour => {
            vec![("HERALD_DELIVERY__MAX_IN_FLIGHT".into(), scenario::NOISY_GLOBAL_CAP.to_string())]
        }
        // The per-application cap on waiting long-polls (100 by default) must admit them all.
        Scenario::LongPolls => {
            vec![("HERALD_TENANTS__MAX_WAITING_POLLS".into(), (2 * tenants::LONG_POLLS).to_string())]
        }
        // Portal tokens are limited to 50 requests/s by default; the churn is made of them.
        Scenario::EndpointChurn => vec![("HERALD_AUTH__PORTAL_REQUESTS_PER_SECOND".into(), "0".into())],
        _ => vec![],
    }
}

/// The Herald binary a spawned run starts.
fn herald_binary(args: &BenchArgs) -> anyhow::Result<std::path::PathBuf> {
    if let Some(path) = &args.herald {
        return Ok(path.clone());
    }
    let sibling = std::env::current_exe().context("locating herald-bench")?.with_file_name("herald");
    Ok(if sibling.is_file() { sibling } else { "herald".into() })
}

/// The database a spawned Herald runs on, if any.
async fn database(args: &BenchArgs) -> anyhow::Result<Option<target::Database>> {
    if args.postgres {
        let cluster = herald_test_support::pg_cluster::TempCluster::start()?;
        let url = cluster.create_database().await?;
        return Ok(Some(target::Database { url, cluster: Some(cluster) }));
    }
    Ok(args.database_url.clone().map(|url| target::Database { url, cluster: None }))
}

/// Runs a benchmark and prints its report; fails if the ledger does not close.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.scenario {
        Scenario::HttpFloor => return floor::run(&args).await,
        Scenario::Scripts => return scripts::run(&args).await,
        Scenario::KeyIndex => return key_index::run(&args).await,
        _ => {}
    }
    let target = match (&args.url, args.spawn) {
        (Some(url), _) => {
            Target::connect(url, args.token.as_deref().unwrap_or_default(), args.server_pid, args.concurrency)
        }
        (None, true) => Target::spawn(SpawnOptions {
            binary: &herald_binary(&args)?,
            database: database(&args).await?,
            env: spawn_env(args.scenario),
            connections: args.concurrency,
        })?,
        (None, false) => bail!("give either --spawn or --url with --token"),
    };
    let groups: &[&str] = match args.scenario {
        Scenario::Burst => &["before burst", "burst", "after burst"],
        Scenario::NoisyNeighbour => &["healthy alone", "healthy w/ noisy", "noisy"],
        Scenario::SlowEndpoints => &["fast endpoints", "slow endpoints"],
        Scenario::ScriptsNoisy => &["quiet alone", "quiet w/ noisy", "noisy"],
        Scenario::LongPolls => &["without polls", "with polls"],
        Scenario::EndpointChurn => &["warm-up", "churn"],
        Scenario::EndpointNeighbour => &["fast alone", "fast w/ silent"],
        _ => &["all"],
    };
    let mut run = Run::new(&args, target, groups).await?;
    let details = match args.scenario {
        Scenario::Steady => scenario::steady(&mut run).await,
        Scenario::Ramp => scenario::ramp(&mut run).await,
        Scenario::Fanout => scenario::fanout(&mut run).await,
        Scenario::Burst => scenario::burst(&mut run).await,
        Scenario::NoisyNeighbour => scenario::noisy_neighbour(&mut run).await,
        Scenario::SlowEndpoints => scenario::slow_endpoints(&mut run).await,
        Scenario::Backlog => scenario::backlog(&mut run).await,
        Scenario::Outbox => scenario::outbox(&mut run).await,
        Scenario::ScriptsNoisy => tenants::scripts_noisy(&mut run).await,
        Scenario::LongPolls => tenants::long_polls(&mut run).await,
        Scenario::EndpointChurn => tenants::endpoint_churn(&mut run).await,
        Scenario::EndpointNeighbour => tenants::endpoint_neighbour(&mut run).await,
        Scenario::HttpFloor | Scenario::Scripts | Scenario::KeyIndex => unreachable!("measured without a target above"),
    };
    let name = format!("{:?}", args.scenario).to_lowercase();
    let details = match details {
        Ok(details) => details,
        Err(e) => {
            run.target.stop();
            return Err(e);
        }
    };
    let report = run.report(&name, details).await;
    eprintln!();
    run.target.stop();
    report.print(args.json);
    if report.ledger.missing > 0 || report.signatures_failed > 0 {
        bail!("{} deliveries missing, {} bad signatures", report.ledger.missing, report.signatures_failed);
    }
    Ok(())
}
