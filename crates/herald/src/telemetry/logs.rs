//! Logging: structured `tracing` output as text or JSON, filtered by `log.level` or
//! `RUST_LOG`. JSON lines written while a traced request or attempt runs carry its
//! `trace_id` and `span_id`. Herald never logs payloads, secrets or tokens; libraries that
//! would (the PostgreSQL driver prints statement parameters at debug level) are capped
//! whatever the filter says.

use std::fmt;
use std::io::IsTerminal;

use opentelemetry::trace::TraceContextExt;
use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, JsonFields, Writer, format};
use tracing_subscriber::registry::LookupSpan;

use crate::config::LogConfig;

/// Log targets held at `info` or above: at lower levels they print data Herald must not log.
/// The OpenTelemetry crates say only what went wrong (a failed export, dropped spans).
const CAPPED: &[&str] = &["tokio_postgres=info", "postgres=info", "opentelemetry=warn"];

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
    let _ = if config.json {
        builder.fmt_fields(JsonFields::new()).event_format(WithTraceIds(format().json())).try_init()
    } else {
        builder.try_init()
    };
}

/// A JSON line formatter that puts the current span's `trace_id` and `span_id` first
/// (the OpenTelemetry context attached to the running request or attempt), when there is
/// one.
struct WithTraceIds<F>(F);

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let current = opentelemetry::Context::current();
        let span = current.span();
        let ids = span.span_context();
        if !ids.is_valid() {
            return self.0.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.0.format_event(ctx, Writer::new(&mut line), event)?;
        let rest = line.strip_prefix('{').ok_or(fmt::Error)?;
        write!(writer, "{{\"trace_id\":\"{}\",\"span_id\":\"{}\",{rest}", ids.trace_id(), ids.span_id())
    }
}
