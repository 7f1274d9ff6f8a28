//! Logging: structured `tracing` output as text or JSON, filtered by `log.level` or
//! `RUST_LOG`.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogConfig;

pub fn init(config: &LogConfig) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    // A second initialisation (tests) is harmless: the first subscriber stays.
    let _ = if config.json { builder.json().try_init() } else { builder.try_init() };
}
