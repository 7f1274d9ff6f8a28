//! The `herald` command: `serve` runs the API and the delivery workers.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use herald::config::{DEFAULT_TOML, Sources};
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
    Serve {
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
    },
    /// Apply PostgreSQL migrations and exit (they are also applied at start-up).
    Migrate {
        #[arg(long, env = "HERALD_DATABASE_URL")]
        database_url: String,
    },
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

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::SandboxWorker { memory_bytes, max_output_bytes } => {
            Ok(herald::scripts::worker::serve(memory_bytes, max_output_bytes)?)
        }
        Command::Serve { config, listen, data_dir, database_url, role } => {
            let flags = [
                ("server.listen", listen),
                ("server.data_dir", data_dir.map(|d| d.display().to_string())),
                ("store.database_url", database_url),
                ("server.role", role),
            ];
            let overrides = flags
                .into_iter()
                .filter_map(|(key, value)| Some((key.to_owned(), toml::Value::String(value?))))
                .collect();
            let sources = Sources { file: config, env: std::env::vars().collect(), overrides };
            let config = Config::load(&sources)?;
            telemetry::init(&config.log);
            let mut runtime = tokio::runtime::Builder::new_multi_thread();
            if let Some(threads) = config.server.worker_threads {
                runtime.worker_threads(threads);
            }
            let runtime = runtime.enable_all().build().context("starting the runtime")?;
            let served = runtime.block_on(serve(config));
            // Whatever is still running (a blocking read) does not hold up the exit.
            runtime.shutdown_timeout(Duration::from_millis(500));
            served
        }
        Command::Migrate { database_url } => {
            telemetry::init(&Config::defaults().log);
            let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
            runtime.block_on(herald::store::postgres::migrate_url(&database_url))
        }
        Command::DefaultConfig => {
            print!("{DEFAULT_TOML}");
            Ok(())
        }
        Command::Openapi => {
            use utoipa::OpenApi;
            println!("{}", herald::api::openapi::ApiDoc::openapi().to_pretty_json()?);
            Ok(())
        }
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let server = Server::build(config).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(stop_on_signal(shutdown.clone()));
    server.run_until_stopped(shutdown).await
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
