//! Event destinations end to end, against real brokers started by the tests
//! (`herald_test_support::brokers`): messages published through the real HTTP API, read
//! back by a consumer of the broker and verified with their Standard Webhooks signature;
//! brokers killed and restarted mid-run; each failure class; filters, transforms and
//! breakers; the API's validation and what it shows of the secrets. The scenarios every
//! type passes are written once (`scenarios.rs`); each type's file starts its broker and
//! reads it back.

mod amazon;
mod api;
mod kafka;
mod nats_jetstream;
mod portal;
mod rabbitmq;
mod redis_streams;
mod scenarios;

use std::collections::HashMap;
use std::path::PathBuf;

use herald_test_support::brokers::TlsFiles;
use serde_json::{Value, json};

use crate::support::certs::TestCa;
use crate::support::{TestServer, eventually};

/// One message as a broker's consumer read it: its body and its headers (or the broker's
/// equivalent), lower-case names.
#[derive(Debug, Clone)]
pub struct Consumed {
    pub body: Vec<u8>,
    pub headers: HashMap<String, String>,
}

impl Consumed {
    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map(String::as_str).unwrap_or_default()
    }

    /// Whether the message carries a valid Standard Webhooks signature of its body under
    /// `secret`, as a consumer would check it on arrival. The tests read a broker at the
    /// end of a run that may outlast the signature's five-minute tolerance, so it is
    /// checked as at its own timestamp, which must lie in the last hour and not ahead of
    /// now: a stale or future timestamp still fails.
    pub fn verifies(&self, secret: &str) -> bool {
        use herald::signing::{SignedHeaders, SigningKey, verify};
        let key = SigningKey::decode(secret).unwrap();
        let headers = SignedHeaders::from_pairs(self.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let now = chrono::Utc::now().timestamp();
        let Ok(signed_at) = self.header("webhook-timestamp").parse::<i64>() else { return false };
        (now - 3600..=now).contains(&signed_at) && verify(&key, &headers, &self.body, signed_at).is_ok()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

/// A CA, a broker certificate for 127.0.0.1 and a client certificate it signs: as files for
/// the broker and a consumer, and as the `tls` settings of a Herald endpoint.
pub struct TlsSetup {
    _dir: tempfile::TempDir,
    pub broker: TlsFiles,
    /// The client certificate and key, for a consumer.
    pub client: (PathBuf, PathBuf),
    pub endpoint_tls: Value,
}

pub fn tls_setup() -> TlsSetup {
    let ca = TestCa::new("broker-ca");
    let (server, client) = (ca.server(), ca.client("herald"));
    // Readable by every user: RabbitMQ runs as its own.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let write = |name: &str, pem: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
        path
    };
    let broker = TlsFiles {
        cert: write("broker.pem", &server.cert_pem),
        key: write("broker.key", &server.key_pem),
        ca: write("ca.pem", &ca.cert_pem),
    };
    let client_files = (write("client.pem", &client.cert_pem), write("client.key", &client.key_pem));
    let endpoint_tls =
        json!({"clientCertificatePem": client.cert_pem, "clientKeyPem": client.key_pem, "caPem": ca.cert_pem});
    TlsSetup { _dir: dir, broker, client: client_files, endpoint_tls }
}

/// Retries every 100 ms for a long while, and a breaker that reopens quickly: broker
/// outages in these tests last seconds.
pub fn quick_retries() -> Value {
    json!({"retry": {"strategy": "fixed", "intervalMs": 100, "maxAttempts": 100},
           "circuitBreaker": {"failureThreshold": 5, "cooldownMs": 300}})
}

/// Retries every 100 ms, up to 100 attempts: for failures that must not be retried.
pub fn never_breaking() -> Value {
    json!({"retry": {"strategy": "fixed", "intervalMs": 100, "maxAttempts": 100},
           "circuitBreaker": {"failureThreshold": 10000}})
}

/// Sends `n` messages of `event_type` to `app`, 16 at a time; their ids.
pub async fn send_many(server: &TestServer, app: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(16) {
        let sends = chunk.iter().map(|i| server.send(app, json!({"eventType": "order.paid", "payload": {"i": i}})));
        ids.extend(futures_util::future::join_all(sends).await);
    }
    ids
}

/// Waits for `n` attempts of `msg` and returns them, oldest first.
pub async fn attempts(server: &TestServer, app: &str, msg: &str, n: usize) -> Vec<Value> {
    eventually(&format!("{n} attempts of {msg}"), || async {
        let attempts = server.attempts(app, msg).await;
        (attempts.len() >= n).then_some(attempts)
    })
    .await
}

/// Waits until `msg`'s delivery at `endpoint` has the Svix status `status` (0 delivered,
/// 2 failed).
/// On timeout, the failure names the message's attempts.
pub async fn settles(server: &TestServer, app: &str, msg: &str, endpoint: &str, status: i64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while server.delivery_status(app, msg, endpoint).await != Some(status) {
        if tokio::time::Instant::now() >= deadline {
            let attempts = server.attempts(app, msg).await;
            panic!("timed out waiting for {msg} to reach status {status}; its attempts: {attempts:?}");
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits for the endpoint's breaker to be in `state` (`open`, `closed`).
pub async fn breaker(server: &TestServer, app: &str, endpoint: &str, state: &str) {
    eventually(&format!("the breaker to be {state}"), || async {
        let (_, health) = server.get(&format!("/api/v1/app/{app}/endpoint/{endpoint}/health")).await;
        (health["state"] == state).then_some(())
    })
    .await
}
