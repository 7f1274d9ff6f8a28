//! Sending batches of spans to the collector: the OTLP exporter's HTTP client, on Herald's
//! own hyper stack and runtime. The SDK exports from its own thread; each request is run
//! as a task of the runtime that Herald serves on.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, Limited};
use opentelemetry_http::{HttpClient, HttpError};
use tokio::runtime::Handle;

use crate::operator_client::{OperatorClient, operator_client};

/// Longest a collector may take to answer one export.
pub(super) const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most of a collector's answer read (it is a small protobuf).
const ANSWER_LIMIT: usize = 64 * 1024;

#[derive(Debug, Clone)]
pub struct Exporter {
    client: OperatorClient,
    runtime: Handle,
}

impl Exporter {
    /// Must be called on the runtime the requests are to run on.
    pub fn new() -> Self {
        Self { client: operator_client(), runtime: Handle::current() }
    }
}

#[async_trait::async_trait]
impl HttpClient for Exporter {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let exchange = async move {
            let response = client.request(request.map(Full::new)).await?;
            let (parts, body) = response.into_parts();
            let body = Limited::new(body, ANSWER_LIMIT).collect().await?.to_bytes();
            Ok::<_, HttpError>(Response::from_parts(parts, body))
        };
        // Made on the runtime: the timer needs it.
        let task = self.runtime.spawn(async move { tokio::time::timeout(EXPORT_TIMEOUT, exchange).await });
        match task.await? {
            Ok(answer) => answer,
            Err(_) => Err(format!("the collector did not answer within {} s", EXPORT_TIMEOUT.as_secs()).into()),
        }
    }
}
