//! The load generator: an open model. Message *i* of a stream is due at
//! `start + i / rate` whether or not earlier requests have been answered, and every latency
//! is measured from that scheduled time, so a slow server cannot hide its queueing delay by
//! slowing the generator down (no coordinated omission). Only the generator's own timer
//! lateness, at most one millisecond tick, is not charged to the server.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;

use super::target::Api;

/// How messages are produced: through the HTTP API, with `herald.send_message(…)` in the
/// database (the transactional outbox), or posted straight to a URL with no server between
/// (the HTTP floor; `Api::base` is then the whole URL).
#[derive(Clone)]
pub enum Producer {
    Api(Box<Api>),
    Outbox(deadpool_postgres::Pool),
    Direct(Box<Api>),
}

/// A constant-rate stream of messages to a set of applications (round-robin).
#[derive(Debug, Clone)]
pub struct Stream {
    pub apps: Vec<usize>,
    pub rate: f64,
    pub duration: Duration,
    /// Seconds after the phase start at which this stream begins.
    pub offset: Duration,
}

impl Stream {
    pub fn messages(&self) -> u64 {
        (self.rate * self.duration.as_secs_f64()).round() as u64
    }
}

/// Tokio's timer fires on millisecond ticks, so a worker sleeping until a message is due
/// wakes up to a tick late. That lateness is the generator's, not the server's: a message
/// whose worker was waiting for it is timed from when the request actually went out, but
/// never forgiven more than one tick. A message whose worker was still busy with earlier
/// ones when it fell due is timed from when it was due, so queueing still counts.
const TIMER_TICK: Duration = Duration::from_millis(1);

/// One accepted message.
#[derive(Debug, Clone)]
pub struct Ack {
    pub msg_id: Box<str>,
    pub app: usize,
    /// When it was due (see [`TIMER_TICK`]); every latency is measured from here.
    pub scheduled: Instant,
    pub acked: Instant,
}

/// Counters shown by the progress line.
#[derive(Default)]
pub struct Progress {
    pub offered: AtomicU64,
    pub acked: AtomicU64,
    pub failed: AtomicU64,
}

/// What a stream produced.
#[derive(Default)]
pub struct Outcome {
    pub acks: Vec<Ack>,
    pub failures: u64,
}

/// The request body template: `{"eventType":…,"payload":{"seq":N,"pad":"xxx…"}}` with the
/// payload close to `payload_bytes`.
pub struct Body {
    prefix: Vec<u8>,
    suffix: Vec<u8>,
}

impl Body {
    pub fn new(payload_bytes: usize) -> Self {
        let pad = "x".repeat(payload_bytes.saturating_sub(32));
        Self {
            prefix: br#"{"eventType":"bench.event","payload":{"seq":"#.to_vec(),
            suffix: format!(r#","pad":"{pad}"}}}}"#).into_bytes(),
        }
    }

    /// Just the payload object (for the outbox, which takes it separately).
    fn payload(&self, seq: u64) -> String {
        let full = self.render(seq);
        let text = std::str::from_utf8(&full).expect("ASCII");
        let start = text.find("\"payload\":").expect("template has a payload") + "\"payload\":".len();
        text[start..text.len() - 1].to_owned()
    }

    fn render(&self, seq: u64) -> Bytes {
        let mut out = Vec::with_capacity(self.prefix.len() + self.suffix.len() + 20);
        out.extend_from_slice(&self.prefix);
        out.extend_from_slice(seq.to_string().as_bytes());
        out.extend_from_slice(&self.suffix);
        Bytes::from(out)
    }
}

/// Drives one stream with `concurrency` connections; returns when every message has been
/// answered.
pub async fn drive(
    producer: &Producer,
    app_ids: Arc<Vec<String>>,
    stream: &Stream,
    start: Instant,
    concurrency: usize,
    body: Arc<Body>,
    progress: Arc<Progress>,
) -> Outcome {
    let total = stream.messages();
    let next = Arc::new(AtomicU64::new(0));
    let start = start + stream.offset;
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency.min(total.max(1) as usize) {
        let (producer, app_ids, next, body, progress) =
            (producer.clone(), app_ids.clone(), next.clone(), body.clone(), progress.clone());
        let (apps, rate) = (stream.apps.clone(), stream.rate);
        workers.push(tokio::spawn(async move {
            let mut outcome = Outcome::default();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= total {
                    return outcome;
                }
                let due = start + Duration::from_secs_f64(i as f64 / rate);
                let waiting = Instant::now() < due;
                tokio::time::sleep_until(due).await;
                let scheduled = timed_from(due, waiting, Instant::now());
                progress.offered.fetch_add(1, Ordering::Relaxed);
                let app = apps[i as usize % apps.len()];
                let sent = match &producer {
                    Producer::Api(api) => send(api, &app_ids[app], body.render(i)).await,
                    Producer::Outbox(pool) => send_outbox(pool, &app_ids[app], body.payload(i)).await,
                    Producer::Direct(api) => send_direct(api, body.render(i)).await,
                };
                match sent {
                    Some(msg_id) => {
                        progress.acked.fetch_add(1, Ordering::Relaxed);
                        outcome.acks.push(Ack { msg_id, app, scheduled, acked: Instant::now() });
                    }
                    None => {
                        progress.failed.fetch_add(1, Ordering::Relaxed);
                        outcome.failures += 1;
                    }
                }
            }
        }));
    }
    let mut merged = Outcome::default();
    for worker in workers {
        let outcome = worker.await.expect("a load worker panicked");
        merged.acks.extend(outcome.acks);
        merged.failures += outcome.failures;
    }
    merged
}

/// Where a message's latency starts: see [`TIMER_TICK`].
fn timed_from(due: Instant, waited: bool, now: Instant) -> Instant {
    if waited { now.min(due + TIMER_TICK) } else { due }
}

/// Posts one message; returns its id when accepted (202).
async fn send(api: &Api, app_id: &str, body: Bytes) -> Option<Box<str>> {
    // Like the Svix SDKs, ask for the answer without the payload echoed back.
    let mut request = http::Request::post(format!("{}/api/v1/app/{app_id}/msg?with_content=false", api.base))
        .header("authorization", format!("Bearer {}", api.token))
        .header("content-type", "application/json");
    if api.idempotency_keys {
        request = request.header("idempotency-key", format!("auto_{}", herald::ids::random_token(16)));
    }
    let request = request.body(Full::new(body)).ok()?;
    let response = api.client.request(request).await.ok()?;
    let accepted = response.status().as_u16() == 202;
    let bytes = response.into_body().collect().await.ok()?.to_bytes();
    if !accepted {
        return None;
    }
    message_id(&bytes)
}

/// Posts one message straight to `api.base`; any 2xx answer counts (it carries no id).
async fn send_direct(api: &Api, body: Bytes) -> Option<Box<str>> {
    let request =
        http::Request::post(api.base.as_str()).header("content-type", "application/json").body(Full::new(body)).ok()?;
    let response = api.client.request(request).await.ok()?;
    let ok = response.status().is_success();
    response.into_body().collect().await.ok()?;
    ok.then(|| "".into())
}

/// Enqueues one message with `herald.send_message` in its own transaction.
async fn send_outbox(pool: &deadpool_postgres::Pool, app_id: &str, payload: String) -> Option<Box<str>> {
    let client = pool.get().await.ok()?;
    let row = client
        .query_one("SELECT herald.send_message($1, 'bench.event', $2::text::jsonb)", &[&app_id, &payload])
        .await
        .ok()?;
    Some(row.get::<_, String>(0).into())
}

/// Picks `"id":"…"` out of a response without a full JSON parse.
fn message_id(body: &[u8]) -> Option<Box<str>> {
    let text = std::str::from_utf8(body).ok()?;
    let start = text.find("\"id\":\"")? + 6;
    let end = start + text[start..].find('"')?;
    Some(text[start..end].into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_valid_json_of_about_the_requested_size() {
        let body = Body::new(1024);
        let rendered = body.render(42);
        let parsed: serde_json::Value = serde_json::from_slice(&rendered).unwrap();
        assert_eq!(parsed["payload"]["seq"], 42);
        let payload = serde_json::to_string(&parsed["payload"]).unwrap();
        assert!((1000..=1050).contains(&payload.len()), "{}", payload.len());
    }

    #[test]
    fn the_outbox_payload_is_the_payload_object_alone() {
        let payload: serde_json::Value = serde_json::from_str(&Body::new(200).payload(7)).unwrap();
        assert_eq!(payload["seq"], 7);
        assert!(payload.get("eventType").is_none());
    }

    #[test]
    fn message_ids_are_found_in_answers() {
        assert_eq!(message_id(br#"{"id":"msg_1","eventType":"a"}"#).as_deref(), Some("msg_1"));
        assert_eq!(message_id(b"{}"), None);
    }

    #[test]
    fn only_the_timer_s_own_lateness_is_forgiven() {
        let due = Instant::now();
        let ms = |n: f64| Duration::from_secs_f64(n / 1000.0);
        assert_eq!(timed_from(due, true, due + ms(0.4)), due + ms(0.4), "a tick's lateness is the generator's");
        assert_eq!(timed_from(due, true, due + ms(5.0)), due + TIMER_TICK, "beyond a tick, the wait counts");
        assert_eq!(timed_from(due, false, due + ms(5.0)), due, "a busy worker's message counts from when it was due");
    }

    #[test]
    fn a_stream_sends_rate_times_duration_messages() {
        let s = Stream { apps: vec![0], rate: 250.0, duration: Duration::from_secs(4), offset: Duration::ZERO };
        assert_eq!(s.messages(), 1000);
    }
}
