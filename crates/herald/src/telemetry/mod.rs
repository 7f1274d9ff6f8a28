//! What Herald tells operators about itself: logs (`logs`), and OpenTelemetry traces of
//! each message from ingest to its last attempt (`traces`, exported by `export`).
//! Prometheus metrics live in `crate::metrics`.

mod export;
mod logs;
mod traces;

pub use logs::init;
pub use traces::{AttemptEnd, AttemptFacts, Span, Traced, Traces};
