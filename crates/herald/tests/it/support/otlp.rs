//! An OpenTelemetry collector on loopback: accepts OTLP/HTTP protobuf exports on
//! `/v1/traces` (refusing other content types and, when it wants one, a missing header, as
//! a real collector with an API key would), decodes them with the OpenTelemetry protobuf
//! types and keeps every span with the name of the service that sent it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use prost::Message as _;
use serde_json::Value;

/// One exported span, ids in lowercase hex.
#[derive(Debug, Clone)]
pub struct CollectedSpan {
    pub service: String,
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// `SpanKind` as in the protocol: 1 internal, 2 server, 3 client.
    pub kind: i32,
    pub attributes: HashMap<String, Value>,
    /// Status code as in the protocol: 0 unset, 1 ok, 2 error.
    pub status: i32,
    pub status_message: String,
    pub start_ns: u64,
    pub end_ns: u64,
}

impl CollectedSpan {
    pub fn attr(&self, key: &str) -> &Value {
        self.attributes.get(key).unwrap_or(&Value::Null)
    }
}

#[derive(Default)]
struct Seen {
    spans: Vec<CollectedSpan>,
    requests: usize,
    refused: usize,
}

#[derive(Clone)]
struct Config {
    /// A header every export must carry, with its value.
    required: Option<(String, String)>,
    seen: Arc<Mutex<Seen>>,
}

pub struct Collector {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Seen>>,
}

impl Collector {
    pub async fn start() -> Self {
        Self::start_requiring(None).await
    }

    /// A collector that answers 401 to exports without `name: value`.
    pub async fn start_requiring(required: Option<(&str, &str)>) -> Self {
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let config = Config { required: required.map(|(n, v)| (n.to_owned(), v.to_owned())), seen: seen.clone() };
        let app = axum::Router::new().route("/v1/traces", post(export)).with_state(config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { addr, seen }
    }

    /// The base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn spans(&self) -> Vec<CollectedSpan> {
        self.seen.lock().unwrap().spans.clone()
    }

    /// Export requests received (accepted or refused).
    pub fn requests(&self) -> usize {
        self.seen.lock().unwrap().requests
    }

    pub fn refused(&self) -> usize {
        self.seen.lock().unwrap().refused
    }
}

async fn export(State(config): State<Config>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let mut seen = config.seen.lock().unwrap();
    seen.requests += 1;
    let protobuf = headers.get("content-type").is_some_and(|v| v == "application/x-protobuf");
    let authorized = config.required.as_ref().is_none_or(|(name, value)| headers.get(name).is_some_and(|v| v == value));
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        seen.refused += 1;
        return StatusCode::BAD_REQUEST;
    };
    if !protobuf || !authorized {
        seen.refused += 1;
        return if protobuf { StatusCode::UNAUTHORIZED } else { StatusCode::UNSUPPORTED_MEDIA_TYPE };
    }
    for resource_spans in request.resource_spans {
        let resource = resource_spans.resource.map(|r| attributes(&r.attributes)).unwrap_or_default();
        let service = resource.get("service.name").and_then(Value::as_str).unwrap_or_default().to_owned();
        for span in resource_spans.scope_spans.into_iter().flat_map(|s| s.spans) {
            let status = span.status.unwrap_or_default();
            seen.spans.push(CollectedSpan {
                service: service.clone(),
                name: span.name,
                trace_id: hex(&span.trace_id),
                span_id: hex(&span.span_id),
                parent_span_id: hex(&span.parent_span_id),
                kind: span.kind,
                attributes: attributes(&span.attributes),
                status: status.code,
                status_message: status.message,
                start_ns: span.start_time_unix_nano,
                end_ns: span.end_time_unix_nano,
            });
        }
    }
    StatusCode::OK
}

fn attributes(list: &[KeyValue]) -> HashMap<String, Value> {
    list.iter().map(|kv| (kv.key.clone(), kv.value.as_ref().map_or(Value::Null, value))).collect()
}

fn value(v: &AnyValue) -> Value {
    match &v.value {
        Some(any_value::Value::StringValue(s)) => Value::from(s.clone()),
        Some(any_value::Value::IntValue(i)) => Value::from(*i),
        Some(any_value::Value::DoubleValue(d)) => Value::from(*d),
        Some(any_value::Value::BoolValue(b)) => Value::from(*b),
        _ => Value::Null,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
