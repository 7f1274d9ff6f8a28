//! Test support: a real Herald on port 0 with its own data directory, a real receiver
//! that records and scripts its answers, and small helpers to drive the API.

pub mod browser;
pub mod canary;
pub mod certs;
pub mod dns;
pub mod lock;
pub mod otlp;
pub mod process;
pub mod server;

pub use herald_test_support::receiver;

use std::future::Future;
use std::time::Duration;

pub use receiver::{Gate, Receiver, Reply};
pub use server::TestServer;

/// Waits for `check` to yield a value, polling the system under test. The deadline is a
/// safety net, not a measurement: it only turns a hang into a readable failure.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `request` carries a valid Standard Webhooks signature of its body under `secret`
/// (the endpoint's key), checked now.
pub fn verifies(secret: &str, request: &receiver::Received) -> bool {
    use herald::signing::{SignedHeaders, SigningKey, verify};
    let key = SigningKey::decode(secret).unwrap();
    let headers = SignedHeaders::from_pairs(request.headers.iter().map(|(k, v)| (k.as_str(), v.to_str().unwrap())));
    verify(&key, &headers, &request.body, chrono::Utc::now().timestamp()).is_ok()
}
