//! `herald-bench`: measures a Svix-compatible server end to end — its own receiver, an
//! open-model load generator, a ledger that must close, and a report of throughput,
//! latency, CPU, memory and disk figures. Against a Herald it starts itself (`--spawn`) or
//! any running server (`--url`, `--token`), so peers are measured with the same tool.
//! Kept apart from the product: the `herald` binary carries none of it.

mod floor;
mod ledger;
mod load;
mod probe;
mod receiver;
mod report;
mod run;
mod scenario;
mod scripts;
mod target;

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
    /// Messages queued in the `backlog` scenario.
    #[arg(long, default_value_t = 1_000_000)]
    pub messages: u64,
    /// Give up draining after this many seconds without a delivery.
    #[arg(long, default_value_t = 30.0)]
    pub drain_stall: f64,
    /// Send a fresh `idempotency-key` with every message, as the Svix SDKs do on every POST.
    #[arg(long)]
    pub idempotency_keys: bool,
}

/// Settings a spawned Herald gets for a scenario.
fn spawn_env(scenario: Scenario) -> Vec<(String, String)> {
    match scenario {
        Scenario::NoisyNeighbour => {
            vec![("HERALD_DELIVERY__MAX_IN_FLIGHT".into(), scenario::NOISY_GLOBAL_CAP.to_string())]
        }
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
        Scenario::HttpFloor | Scenario::Scripts => unreachable!("measured without a target above"),
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
