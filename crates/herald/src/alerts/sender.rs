//! Operational webhooks: an alert as a signed Standard Webhooks request to the operator's
//! URL (Svix's operational-webhook shape: `{"type", "timestamp", "data"}`), with a few
//! retries. The URL is the operator's own configuration, so it is not subject to the
//! destination guard that protects tenant endpoints.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request};
use http_body_util::Full;
use serde_json::{Value, json};

use crate::clock::{now_ms, to_rfc3339};
use crate::ids::MessageId;
use crate::operator_client::{OperatorClient, operator_client};
use crate::signing::{SigningKey, signature_header};
use crate::supervisor::{Liveness, spawn_task};

/// Waits before the second and third tries.
const BACKOFF: [Duration; 2] = [Duration::from_secs(2), Duration::from_secs(10)];
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct Sender {
    client: OperatorClient,
    url: http::Uri,
    key: Arc<SigningKey>,
    /// Sends run as tasks that report a panic here.
    liveness: Arc<Liveness>,
}

impl Sender {
    pub fn new(url: http::Uri, key: SigningKey, liveness: Arc<Liveness>) -> Self {
        Self { client: operator_client(), url, key: Arc::new(key), liveness }
    }

    /// Sends one alert in the background.
    pub fn send(&self, kind: &str, data: Value) {
        let body = json!({"type": kind, "timestamp": to_rfc3339(now_ms()), "data": data}).to_string();
        let this = self.clone();
        let kind = kind.to_owned();
        spawn_task(&self.liveness, "an operational webhook", async move {
            let id = MessageId::generate().to_string();
            for (try_no, wait) in std::iter::once(Duration::ZERO).chain(BACKOFF).enumerate() {
                tokio::time::sleep(wait).await;
                match this.post(&id, &body).await {
                    Ok(()) => return,
                    Err(why) => {
                        tracing::warn!(alert = %kind, try_no = try_no + 1, error = %why, "operational webhook failed")
                    }
                }
            }
        });
    }

    async fn post(&self, id: &str, body: &str) -> Result<(), String> {
        let timestamp = now_ms() / 1000;
        let signature = signature_header([&*self.key], id, timestamp, body.as_bytes());
        let request = Request::builder()
            .method(Method::POST)
            .uri(self.url.clone())
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(Full::new(Bytes::from(body.to_owned())))
            .map_err(|e| e.to_string())?;
        match tokio::time::timeout(TIMEOUT, self.client.request(request)).await {
            Err(_) => Err("timed out".into()),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(response)) if response.status().is_success() => Ok(()),
            Ok(Ok(response)) => Err(format!("status {}", response.status())),
        }
    }
}
