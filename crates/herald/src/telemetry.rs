//! Logging: structured `tracing` output as text or JSON, filtered by `log.level` or
//! `RUST_LOG`. Herald never logs payloads, secrets or tokens; libraries that would (the
//! PostgreSQL driver prints statement parameters at debug level) are capped whatever the
//! filter says.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogConfig;

/// Log targets held at `info` or above: at lower levels they print data Herald must not log.
const CAPPED: &[&str] = &["tokio_postgres=info", "postgres=info"];

pub fn init(config: &LogConfig) {
    let mut filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&config.level));
    for cap in CAPPED {
        filter = filter.add_directive(cap.parse().expect("a valid directive"));
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    // A second initialisation (tests) is harmless: the first subscriber stays.
    let _ = if config.json { builder.json().try_init() } else { builder.try_init() };
}
