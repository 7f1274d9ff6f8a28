//! Traces: each message's life as one OpenTelemetry trace. The ingest request is a server
//! span (continuing the caller's `traceparent`) with the commit under it. The message keeps
//! the ingest span's context (stored with it), so that every attempt, in this process or in
//! another one hours later, hangs under that span: one span for the wait in the dispatcher,
//! then an HTTP client span for the request.
//!
//! Off (no collector configured), [`Traces`] holds nothing and each call is one branch;
//! spans the sampler drops get their context (so children follow the decision) but no
//! attributes.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::Either;
use opentelemetry::context::FutureExt as _;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState, Tracer as _,
    TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SamplingDecision, SdkTracer, SdkTracerProvider, ShouldSample,
};
use sha2::{Digest, Sha256};

use super::export::{EXPORT_TIMEOUT, Exporter};
use crate::clock::Millis;
use crate::config::{OtelConfig, SamplerChoice};
use crate::ids::MessageId;

/// The route of the ingest span, and the span's name (the method and the route).
const INGEST_ROUTE: &str = "/api/v1/app/{app_id}/msg";
const INGEST_SPAN: &str = "POST /api/v1/app/{app_id}/msg";

/// A message as its spans need it: its id, and the trace context stored with it.
#[derive(Clone, Copy)]
pub struct Traced<'a> {
    pub id: &'a MessageId,
    pub trace: Option<&'a SpanContext>,
}

/// An attempt as its spans need it.
pub struct AttemptFacts<'a> {
    pub message: Traced<'a>,
    pub app_id: &'a str,
    pub endpoint_id: &'a str,
    /// 1 for the first attempt.
    pub number: u32,
    /// When the attempt became due: where its wait in the dispatcher starts.
    pub due: Millis,
    pub method: &'a http::Method,
    pub url: Option<&'a url::Url>,
}

/// How an attempt ended: how long it took, the status it was answered with, and the class
/// of its failure if it failed.
pub struct AttemptEnd {
    pub duration: Duration,
    pub status: Option<u16>,
    pub error_class: Option<&'static str>,
}

/// The tracer, or nothing when tracing is off. Cheap to clone.
#[derive(Clone, Default)]
pub struct Traces(Option<Arc<Tracing>>);

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "Traces(exporting)" } else { "Traces(off)" })
    }
}

struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// Decides for messages that carry no trace context (see [`Tracing::derived`]).
    sampler: Sampler,
    /// `db.system.name` of the commit spans.
    database: &'static str,
}

impl Traces {
    pub fn off() -> Self {
        Self(None)
    }

    /// Starts exporting if `config` names a collector. Called on the runtime the exports
    /// are to run on.
    pub fn start(config: &OtelConfig, database: &'static str) -> anyhow::Result<Self> {
        let Some(export) = &config.export else { return Ok(Self::off()) };
        let headers = export
            .headers
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_str().unwrap_or_default().to_owned()))
            .collect();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(Exporter::new())
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(export.url.to_string())
            .with_headers(headers)
            .with_timeout(EXPORT_TIMEOUT)
            .build()?;
        let batches = BatchConfigBuilder::default().with_scheduled_delay(export.schedule_delay).build();
        let sampler = sampler(config.sampler);
        let provider = SdkTracerProvider::builder()
            .with_span_processor(BatchSpanProcessor::builder(exporter).with_batch_config(batches).build())
            .with_sampler(sampler.clone())
            .with_resource(Resource::builder().with_service_name(config.service_name.clone()).build())
            .build();
        let tracer = provider.tracer("herald");
        // Host and path only: user info in the URL would be a credential.
        let (host, path) = (export.url.host().unwrap_or_default(), export.url.path());
        tracing::info!(collector.host = host, collector.path = path, sampler = ?config.sampler, "exporting traces");
        Ok(Self(Some(Arc::new(Tracing { provider, tracer, sampler, database }))))
    }

    /// Exports what is left; called once, at the end. (Requests or attempts still running
    /// past the grace period end their spans after this; the SDK drops them with a warning.)
    pub async fn shutdown(&self) {
        let Some(inner) = self.0.clone() else { return };
        // Blocks until the exporting thread is done, and that thread's requests run on
        // this runtime: off its workers.
        // Long enough for the last export to get its whole budget.
        let patience = EXPORT_TIMEOUT + Duration::from_secs(1);
        match tokio::task::spawn_blocking(move || inner.provider.shutdown_with_timeout(patience)).await {
            Ok(Err(e)) => tracing::warn!(error = %e, "exporting the last traces failed"),
            Err(e) => tracing::warn!(error = %e, "exporting the last traces failed"),
            Ok(Ok(())) => {}
        }
    }

    /// The span of an ingest request, under the caller's `traceparent` if it sent one.
    pub fn ingest(&self, traceparent: Option<&http::HeaderValue>) -> Span {
        let Some(inner) = &self.0 else { return Span(None) };
        let parent = TraceContextPropagator::new().extract(&OnlyTraceparent(traceparent));
        let span = inner.tracer.span_builder(INGEST_SPAN).with_kind(SpanKind::Server);
        let mut span = Span(Some(span.start_with_context(&inner.tracer, &parent)));
        span.record(|| vec![KeyValue::new("http.request.method", "POST"), KeyValue::new("http.route", INGEST_ROUTE)]);
        span
    }

    /// The durable commit of `message` (a child of its ingest span).
    pub fn commit(&self, message: Traced<'_>, deliveries: usize) -> Span {
        let Some(inner) = &self.0 else { return Span(None) };
        let parent = inner.parent(message);
        let mut span = Span(Some(inner.tracer.start_with_context("herald.commit", &parent)));
        span.record(|| {
            vec![
                KeyValue::new("db.system.name", inner.database),
                KeyValue::new("herald.msg_id", message.id.to_string()),
                KeyValue::new("herald.deliveries", deliveries as i64),
            ]
        });
        span
    }

    /// Records the attempt's wait in the dispatcher (from when it was due until now) and
    /// starts its span; both are children of the message's ingest span.
    pub fn attempt(&self, attempt: &AttemptFacts<'_>) -> Span {
        let Some(inner) = &self.0 else { return Span(None) };
        let parent = inner.parent(attempt.message);
        let now = SystemTime::now();
        inner.record_wait(attempt, &parent, now);
        let method = attempt.method;
        let builder = inner.tracer.span_builder(method.to_string()).with_kind(SpanKind::Client).with_start_time(now);
        let mut span = Span(Some(builder.start_with_context(&inner.tracer, &parent)));
        span.record(|| {
            let mut attributes = vec![
                KeyValue::new("http.request.method", method.to_string()),
                KeyValue::new("herald.app_id", attempt.app_id.to_owned()),
                KeyValue::new("herald.msg_id", attempt.message.id.to_string()),
                KeyValue::new("herald.endpoint_id", attempt.endpoint_id.to_owned()),
                KeyValue::new("herald.attempt", i64::from(attempt.number)),
            ];
            if let Some(url) = attempt.url {
                attributes.extend(url_attributes(url));
            }
            attributes
        });
        span
    }
}

impl Tracing {
    /// The span of an attempt's wait in the dispatcher: from when it was due until `now`.
    fn record_wait(&self, attempt: &AttemptFacts<'_>, parent: &Context, now: SystemTime) {
        let due = (UNIX_EPOCH + Duration::from_millis(attempt.due.max(0) as u64)).min(now);
        let wait = self.tracer.span_builder("herald.dispatch.wait").with_start_time(due);
        let mut wait = wait.start_with_context(&self.tracer, parent);
        if wait.is_recording() {
            wait.set_attributes([
                KeyValue::new("herald.endpoint_id", attempt.endpoint_id.to_owned()),
                KeyValue::new("herald.attempt", i64::from(attempt.number)),
            ]);
        }
        wait.end_with_timestamp(now);
    }

    /// The context a message's spans hang under: its stored one, else one derived from it.
    fn parent(&self, message: Traced<'_>) -> Context {
        let context = message.trace.cloned().unwrap_or_else(|| self.derived(message.id));
        Context::new().with_remote_span_context(context)
    }

    /// A message accepted without a trace context (from the outbox, or while tracing was
    /// off) still gets one trace for all its attempts: ids derived from the message id,
    /// sampled as the sampler decides for that trace id. Its root span is not exported.
    fn derived(&self, message: &MessageId) -> SpanContext {
        let digest = Sha256::digest(message.as_str().as_bytes());
        let trace_id = TraceId::from_bytes(digest[..16].try_into().expect("16 bytes"));
        let span_id = SpanId::from_bytes(digest[16..24].try_into().expect("8 bytes"));
        let decision = self.sampler.should_sample(None, trace_id, "message", &SpanKind::Internal, &[], &[]).decision;
        let flags =
            if decision == SamplingDecision::RecordAndSample { TraceFlags::SAMPLED } else { TraceFlags::default() };
        SpanContext::new(trace_id, span_id, flags, true, TraceState::default())
    }
}

/// The server an attempt went to. Not `url.full`: webhook URLs often carry their secret in
/// the path or the query (`/services/T0/B0/<secret>`), and spans leave Herald.
fn url_attributes(url: &url::Url) -> Vec<KeyValue> {
    let host = url.host_str().unwrap_or_default().to_owned();
    let port = url.port_or_known_default().map_or(0, i64::from);
    vec![
        KeyValue::new("url.scheme", url.scheme().to_owned()),
        KeyValue::new("server.address", host),
        KeyValue::new("server.port", port),
    ]
}

/// The caller's `traceparent` as the W3C propagator reads headers (it is the only one
/// Herald continues; `tracestate` is not kept).
struct OnlyTraceparent<'a>(Option<&'a http::HeaderValue>);

impl Extractor for OnlyTraceparent<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.filter(|_| key.eq_ignore_ascii_case("traceparent")).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.map_or(vec![], |_| vec!["traceparent"])
    }
}

fn sampler(choice: SamplerChoice) -> Sampler {
    let parent_based = |root| Sampler::ParentBased(Box::new(root));
    match choice {
        SamplerChoice::AlwaysOn => Sampler::AlwaysOn,
        SamplerChoice::AlwaysOff => Sampler::AlwaysOff,
        SamplerChoice::TraceIdRatio(ratio) => Sampler::TraceIdRatioBased(ratio),
        SamplerChoice::ParentBasedAlwaysOn => parent_based(Sampler::AlwaysOn),
        SamplerChoice::ParentBasedAlwaysOff => parent_based(Sampler::AlwaysOff),
        SamplerChoice::ParentBasedTraceIdRatio(ratio) => parent_based(Sampler::TraceIdRatioBased(ratio)),
    }
}

/// A span being recorded, or nothing (tracing off). Ends when dropped.
pub struct Span(Option<opentelemetry_sdk::trace::Span>);

impl Span {
    /// The span's context, to store with a message or send on (also when the sampler
    /// dropped the span: children then follow that decision).
    pub fn context(&self) -> Option<SpanContext> {
        self.0.as_ref().map(|span| span.span_context().clone()).filter(SpanContext::is_valid)
    }

    /// Runs `work` with this span current, so that log lines carry its ids.
    pub fn scope<F: Future>(&self, work: F) -> impl Future<Output = F::Output> {
        match self.context() {
            Some(context) => Either::Left(work.with_context(Context::new().with_remote_span_context(context))),
            None => Either::Right(work),
        }
    }

    /// Adds attributes, built only if the span is sampled.
    fn record(&mut self, attributes: impl FnOnce() -> Vec<KeyValue>) {
        if let Some(span) = self.0.as_mut().filter(|span| span.is_recording()) {
            span.set_attributes(attributes());
        }
    }

    fn fail(&mut self, description: String) {
        if let Some(span) = self.0.as_mut().filter(|span| span.is_recording()) {
            span.set_status(Status::error(description));
        }
    }

    /// Ends an ingest span with the answer's status (5xx is an error, as for any server);
    /// `app` as the caller named it, and the message's id if one was accepted.
    pub fn answered(mut self, status: http::StatusCode, app: &str, msg: Option<&MessageId>) {
        self.record(|| {
            let mut attributes = vec![
                KeyValue::new("http.response.status_code", i64::from(status.as_u16())),
                KeyValue::new("herald.app", app.to_owned()),
            ];
            if let Some(msg) = msg {
                attributes.push(KeyValue::new("herald.msg_id", msg.to_string()));
            }
            if status.is_server_error() {
                attributes.push(KeyValue::new("error.type", status.as_u16().to_string()));
            }
            attributes
        });
        if status.is_server_error() {
            self.fail(status.to_string());
        }
    }

    /// Ends a commit span; `failure` if the commit failed.
    pub fn committed(mut self, failure: Option<String>) {
        if let Some(why) = failure {
            self.record(|| vec![KeyValue::new("error.type", "commit")]);
            self.fail(why);
        }
    }

    /// Ends an attempt's span with its result (and its error class if it failed).
    pub fn attempted(mut self, end: &AttemptEnd) {
        let class = end.error_class;
        self.record(|| {
            let mut attributes = vec![KeyValue::new("herald.duration_ms", end.duration.as_secs_f64() * 1000.0)];
            if let Some(status) = end.status {
                attributes.push(KeyValue::new("http.response.status_code", i64::from(status)));
            }
            if let Some(class) = class {
                attributes.push(KeyValue::new("error.type", class));
            }
            attributes
        });
        // Herald's reason texts stay in the attempt log: some quote what the endpoint or a
        // transform said, and spans leave Herald.
        if let Some(class) = class {
            let why = match end.status {
                Some(status) => format!("the endpoint answered {status}"),
                None => class.to_owned(),
            };
            self.fail(why);
        }
    }

    /// Ends the span of a delivery its transform dropped (no request was sent).
    pub fn skipped(mut self) {
        self.record(|| vec![KeyValue::new("herald.skipped", true)]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::MessageId;

    fn tracing_with(sampler: Sampler) -> Tracing {
        let provider = SdkTracerProvider::builder().with_sampler(sampler.clone()).build();
        let tracer = provider.tracer("test");
        Tracing { provider, tracer, sampler, database: "sqlite" }
    }

    #[test]
    fn a_message_without_a_stored_context_gets_one_derived_from_its_id() {
        let on = tracing_with(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
        let m = MessageId::generate();
        let (first, again) = (on.derived(&m), on.derived(&m));
        assert_eq!(first, again, "every attempt of the message joins the same trace");
        assert!(first.is_valid() && first.is_sampled() && first.is_remote());
        assert_ne!(on.derived(&MessageId::generate()).trace_id(), first.trace_id());
        let off = tracing_with(Sampler::ParentBased(Box::new(Sampler::AlwaysOff)));
        assert!(!off.derived(&m).is_sampled(), "the sampler decides for the derived trace");
    }

    #[test]
    fn a_stored_context_is_the_parent_and_an_unsampled_one_records_nothing() {
        let tracing = tracing_with(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)));
        let stored = SpanContext::new(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap(),
            TraceFlags::default(),
            true,
            TraceState::default(),
        );
        let traces = Traces(Some(Arc::new(tracing)));
        let span = traces.commit(Traced { id: &MessageId::generate(), trace: Some(&stored) }, 1);
        let context = span.context().unwrap();
        assert_eq!(context.trace_id(), stored.trace_id());
        assert!(!context.is_sampled(), "the ingest's decision holds for its children");
        assert!(!span.0.as_ref().unwrap().is_recording());
    }

    #[test]
    fn off_makes_no_span_and_url_attributes_drop_credentials() {
        assert!(Traces::off().commit(Traced { id: &MessageId::generate(), trace: None }, 1).context().is_none());
        let url = url::Url::parse("https://user:pw@hooks.example.com:8443/in?token=secret").unwrap();
        let attributes = url_attributes(&url);
        assert_eq!(attributes[1], KeyValue::new("server.address", "hooks.example.com"));
        assert_eq!(attributes[2], KeyValue::new("server.port", 8443_i64));
        let text = format!("{attributes:?}");
        assert!(!text.contains("secret") && !text.contains("/in") && !text.contains("pw"), "{text}");
    }
}
