//! The `herald` command: `serve` runs the API and the delivery workers.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use herald::config::{DEFAULT_TOML, Sources};
use herald::import::{Api, Report};
use herald::store::sqlite::backup;
use herald::supervisor::StopDeadline;
use herald::{Config, Server, telemetry};
use tokio_util::sync::CancellationToken;

/// mimalloc: the delivery path allocates many small, short-lived buffers, and glibc's
/// allocator showed up at about 8 % of the server's CPU in profiles.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "herald", version, about = "Webhook delivery that speaks the Svix API")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the API and the delivery workers.
    Serve(ServeFlags),
    /// Check a configuration and what it needs (listen address, data directory, database,
    /// server key) without starting anything; print what is in effect, secrets masked.
    /// Exits 1 when a check fails.
    CheckConfig(ServeFlags),
    /// Apply PostgreSQL migrations and exit (they are also applied at start-up).
    Migrate {
        #[arg(long, env = "HERALD_DATABASE_URL")]
        database_url: String,
    },
    /// Write a consistent copy of the embedded store to a new file, while Herald runs or not.
    Backup {
        /// The file to write (it must not exist).
        #[arg(long)]
        to: PathBuf,
        #[command(flatten)]
        store: EmbeddedStore,
    },
    /// Replace the embedded store's database with a backup; refused while Herald runs.
    Restore {
        /// The backup to restore.
        #[arg(long)]
        from: PathBuf,
        /// Replace a database the data directory holds already.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        store: EmbeddedStore,
    },
    /// Copy another server into a running Herald, through both APIs.
    #[command(subcommand)]
    Import(ImportSource),
    /// Print the commented default configuration.
    DefaultConfig,
    /// Print Herald's OpenAPI document.
    Openapi,
    /// Run jq filters and transforms for a parent Herald (started by it, not by hand).
    #[command(hide = true)]
    SandboxWorker {
        #[arg(long)]
        memory_bytes: u64,
        /// Longest output answered; a longer one fails its evaluation.
        #[arg(long, default_value_t = herald::scripts::worker::MAX_FRAME)]
        max_output_bytes: usize,
    },
}

/// `serve`'s configuration flags (and `check-config`'s).
#[derive(clap::Args)]
struct ServeFlags {
    /// A TOML file overriding the defaults.
    #[arg(long, env = "HERALD_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on (default 127.0.0.1:8071).
    #[arg(long)]
    listen: Option<String>,
    /// Data directory for the embedded database (default ./herald-data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Run on PostgreSQL instead of the embedded database (also HERALD_DATABASE_URL).
    #[arg(long)]
    database_url: Option<String>,
    /// What this process does: all, api or worker (default all).
    #[arg(long)]
    role: Option<String>,
}

impl ServeFlags {
    /// Defaults, the file, the environment, then these flags.
    fn sources(self) -> Sources {
        let flags = [
            ("server.listen", self.listen),
            ("server.data_dir", self.data_dir.map(|d| d.display().to_string())),
            ("store.database_url", self.database_url),
            ("server.role", self.role),
        ];
        let overrides =
            flags.into_iter().filter_map(|(key, value)| Some((key.to_owned(), toml::Value::String(value?)))).collect();
        Sources { file: self.config, env: std::env::vars().collect(), overrides }
    }
}

#[derive(Subcommand)]
enum ImportSource {
    /// Event types, applications and endpoints (with their signing secrets and headers) of
    /// a server speaking the Svix API, ids kept. Running it again changes only what
    /// differs. Exits 0 when everything came over, 1 when something failed or needs a
    /// hand, 2 when a side could not be read.
    Svix {
        /// The source's address (https://api.svix.com, or another Herald).
        #[arg(long)]
        from: String,
        /// The source's API token.
        #[arg(long, env = "HERALD_IMPORT_FROM_TOKEN", hide_env_values = true)]
        from_token: String,
        /// The destination Herald's address.
        #[arg(long, default_value = "http://127.0.0.1:8071")]
        to: String,
        /// The destination's admin token.
        #[arg(long, env = "HERALD_IMPORT_TO_TOKEN", hide_env_values = true)]
        to_token: String,
        /// Print what would be created and updated; write nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

/// Where the embedded store is: the data directory `serve` would use with the same
/// configuration.
#[derive(clap::Args)]
struct EmbeddedStore {
    /// A TOML file overriding the defaults.
    #[arg(long, env = "HERALD_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory of the embedded database (default ./herald-data).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

impl EmbeddedStore {
    fn data_dir(self) -> anyhow::Result<PathBuf> {
        let overrides = self
            .data_dir
            .map(|d| ("server.data_dir".to_owned(), toml::Value::String(d.display().to_string())))
            .into_iter()
            .collect();
        let config = Config::load(&Sources { file: self.config, env: std::env::vars().collect(), overrides })?;
        if config.store.database_url.is_some() {
            anyhow::bail!(
                "this Herald runs on PostgreSQL: back it up with pg_dump or base backups (see docs/operations.md)"
            );
        }
        Ok(config.server.data_dir)
    }
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::SandboxWorker { memory_bytes, max_output_bytes } => {
            Ok(herald::scripts::worker::serve(memory_bytes, max_output_bytes)?)
        }
        Command::Serve(flags) => {
            let sources = flags.sources();
            let config = Config::load(&sources)?;
            telemetry::init(&config.log);
            let mut runtime = tokio::runtime::Builder::new_multi_thread();
            if let Some(threads) = config.server.worker_threads {
                runtime.worker_threads(threads);
            }
            let runtime = runtime.enable_all().build().context("starting the runtime")?;
            let (served, deadline) = runtime.block_on(serve(config));
            // Whatever is still running (a blocking read) does not hold up the exit: the
            // runtime gets what is left of the grace period, half of the exit's margin
            // included, half a second at most.
            let stopping = std::time::Instant::now();
            let end = deadline.get().map(|d| d + StopDeadline::EXIT_MARGIN / 2);
            let left = end.map_or(RUNTIME_STOP, |d| d.saturating_duration_since(tokio::time::Instant::now()));
            runtime.shutdown_timeout(left.min(RUNTIME_STOP));
            tracing::info!(runtime_ms = stopping.elapsed().as_millis() as u64, "runtime stopped");
            served
        }
        Command::CheckConfig(flags) => {
            let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
            let report = runtime.block_on(herald::preflight::check(&flags.sources()));
            print!("{}", report.render());
            if !report.passed() {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Migrate { database_url } => {
            telemetry::init(&Config::defaults().log);
            let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
            runtime.block_on(herald::store::postgres::migrate_url(&database_url))
        }
        Command::Backup { to, store } => {
            let written = backup::backup(&store.data_dir()?, &to)?;
            println!("{}: {}", to.display(), describe(&written));
            println!(
                "It holds secrets sealed under the server key, not the key: keep the key apart; a restore needs both."
            );
            Ok(())
        }
        Command::Restore { from, force, store } => {
            let data_dir = store.data_dir()?;
            let restored = backup::restore(&data_dir, &from, force)?;
            println!("{} restored into {}: {}", from.display(), data_dir.display(), describe(&restored));
            Ok(())
        }
        Command::Import(ImportSource::Svix { from, from_token, to, to_token, dry_run }) => {
            let import =
                herald::import::Import { from: Api::new(&from, &from_token)?, to: Api::new(&to, &to_token)?, dry_run };
            let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
            let report = Report::new(dry_run);
            if let Err(e) = runtime.block_on(import.run(&report)) {
                eprintln!("herald import: {e:#}");
                std::process::exit(2);
            }
            let (summary, complete) = report.finish();
            print!("{summary}");
            std::process::exit(if complete { 0 } else { 1 });
        }
        Command::DefaultConfig => {
            print!("{DEFAULT_TOML}");
            Ok(())
        }
        Command::Openapi => {
            println!("{}", herald::api::openapi::document().to_pretty_json()?);
            Ok(())
        }
    }
}

fn describe(c: &backup::Contents) -> String {
    format!(
        "{} applications, {} endpoints, {} messages, {:.1} MB",
        c.applications,
        c.endpoints,
        c.messages,
        c.bytes as f64 / 1e6
    )
}

/// The longest the runtime waits for its blocking threads at exit.
const RUNTIME_STOP: Duration = Duration::from_millis(500);

/// Serves until a signal or a failure; the result, and when the stop had to be over.
async fn serve(config: Config) -> (anyhow::Result<()>, StopDeadline) {
    let server = match Server::build(config).await {
        Ok(server) => server,
        Err(e) => return (Err(e), StopDeadline::default()),
    };
    let deadline = server.stop_deadline();
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    (server.run_until_stopped(shutdown).await, deadline)
}

/// Cancels `shutdown` on SIGTERM or SIGINT.
async fn stop_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("installing the SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("shutting down: finishing in-flight attempts");
    shutdown.cancel();
}
