//! NATS JetStream destinations against a real nats-server (JetStream on, streams in
//! files, so a message JetStream acknowledged survives a kill): the scenarios every type
//! passes, read back by the official client (`async-nats`) by sequence; and the stream's
//! own size limit.

use async_nats::jetstream::{self, stream};
use herald_test_support::brokers::Broker;
use serde_json::{Value, json};

use super::scenarios::{self, Fixture, endpoint};
use super::{Consumed, TlsSetup, never_breaking, settles, tls_setup};
use crate::support::TestServer;

pub(super) const USER: &str = "herald";
pub(super) const PASSWORD: &str = "broker-pa55";

pub(super) struct Nats {
    broker: Broker,
    /// With TLS: the CA and the client certificate a consumer connects with.
    tls: Option<(std::path::PathBuf, (std::path::PathBuf, std::path::PathBuf))>,
}

impl Nats {
    /// A consumer's JetStream context (made anew each time: the broker may have been
    /// restarted), or `None` while the broker is down.
    async fn jetstream(&self) -> Option<jetstream::Context> {
        let mut options = async_nats::ConnectOptions::with_user_and_password(USER.into(), PASSWORD.into());
        if let Some((ca, (cert, key))) = &self.tls {
            options = options
                .require_tls(true)
                .add_root_certificates(ca.clone())
                .add_client_certificate(cert.clone(), key.clone());
        }
        let client = options.connect(format!("127.0.0.1:{}", self.broker.port())).await.ok()?;
        Some(jetstream::new(client))
    }

    /// Makes the stream that takes `subject` (`ORDERS` for `orders`), in files, with an
    /// optional size limit per message.
    pub(super) async fn make_stream(&self, subject: &str, max_message_size: Option<i32>) {
        let config = stream::Config {
            name: stream_name(subject),
            subjects: vec![subject.to_owned()],
            storage: stream::StorageType::File,
            max_message_size: max_message_size.unwrap_or(-1),
            ..Default::default()
        };
        self.jetstream().await.expect("NATS answers").get_or_create_stream(config).await.unwrap();
    }
}

fn stream_name(subject: &str) -> String {
    subject.replace('.', "_").to_uppercase()
}

impl Fixture for Nats {
    const AUTH_REFUSED: &'static str = "Authorization Violation";

    fn acknowledged(place: &str) -> String {
        format!("PUB {place} stream {} seq ", stream_name(place))
    }

    async fn start() -> Self {
        Self { broker: Broker::nats(USER, PASSWORD).unwrap(), tls: None }
    }

    fn broker(&mut self) -> &mut Broker {
        &mut self.broker
    }

    fn broker_port(&self) -> u16 {
        self.broker.port()
    }

    /// With `exists`, a stream takes the subject; without, none does.
    async fn destination(&self, place: &str, exists: bool) -> Value {
        if exists {
            self.make_stream(place, None).await;
        }
        json!({
            "type": "natsJetStream",
            "broker": format!("{}://127.0.0.1:{}", if self.tls.is_some() { "tls" } else { "nats" }, self.broker.port()),
            "subject": place,
            "credentials": {"username": USER, "password": PASSWORD},
        })
    }

    async fn read_all(&self, place: &str) -> Vec<Consumed> {
        let context = self.jetstream().await.expect("NATS answers");
        let Ok(mut stream) = context.get_stream(stream_name(place)).await else { return Vec::new() };
        let state = stream.info().await.unwrap().state.clone();
        let mut messages = Vec::with_capacity(state.messages as usize);
        for sequence in state.first_sequence..=state.last_sequence {
            if state.messages == 0 {
                break;
            }
            let message = stream.get_raw_message(sequence).await.unwrap();
            let headers = message
                .headers
                .iter()
                .flat_map(|(name, values)| values.first().map(|v| (name.to_string().to_lowercase(), v.to_string())))
                .collect();
            messages.push(Consumed { body: message.payload.to_vec(), headers });
        }
        messages
    }

    async fn count(&self, place: &str) -> Option<usize> {
        let context = self.jetstream().await?;
        match context.get_stream(stream_name(place)).await {
            Ok(mut stream) => Some(stream.info().await.ok()?.state.messages as usize),
            Err(e) if matches!(e.kind(), jetstream::context::GetStreamErrorKind::JetStream(_)) => Some(0),
            Err(_) => None,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_reach_the_stream_signed_and_none_is_lost_when_nats_is_killed() {
    scenarios::ten_thousand_messages_survive_a_broker_kill::<Nats>().await;
}

#[tokio::test]
async fn wrong_credentials_are_retried_until_corrected() {
    scenarios::wrong_credentials_are_retried_until_corrected::<Nats>().await;
}

#[tokio::test]
async fn a_subject_no_stream_takes_and_an_oversized_message_are_dead_lettered_at_once() {
    scenarios::a_missing_place_and_an_oversized_message_are_dead_lettered_at_once::<Nats>().await;
}

#[tokio::test]
async fn filters_and_transforms_apply_before_publishing() {
    scenarios::filters_and_transforms_apply_before_publishing::<Nats>().await;
}

#[tokio::test]
async fn the_breaker_opens_on_a_dead_broker_and_closes_when_it_is_back() {
    scenarios::the_breaker_opens_on_a_dead_broker_and_closes_when_it_is_back::<Nats>().await;
}

/// A message over the stream's own `max_msg_size` is refused by JetStream, and that is
/// `message_too_large` too: dead-lettered after one attempt, the connection kept.
#[tokio::test]
async fn a_message_over_the_streams_own_limit_is_dead_lettered_at_once() {
    let nats = Nats::start().await;
    nats.make_stream("small", Some(256)).await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let destination = json!({
        "type": "natsJetStream", "broker": format!("nats://127.0.0.1:{}", nats.broker.port()), "subject": "small",
        "credentials": {"username": USER, "password": PASSWORD},
    });
    let (ep, _) = endpoint(&server, &app, destination, json!({"delivery": never_breaking()})).await;
    let big = server.send(&app, json!({"eventType": "order.paid", "payload": {"note": "x".repeat(400)}})).await;
    settles(&server, &app, &big, &ep, 2).await;
    let tried = server.attempts(&app, &big).await;
    assert_eq!(tried.len(), 1, "{tried:?}");
    assert_eq!(tried[0]["errorClass"], "message_too_large", "{tried:?}");
    assert!(tried[0]["error"].as_str().unwrap().contains("JetStream"), "the broker's own words: {tried:?}");
    let fits = server.send(&app, json!({"eventType": "order.paid", "payload": {}})).await;
    settles(&server, &app, &fits, &ep, 0).await;
    assert_eq!(nats.read_all("small").await.len(), 1);
}

#[tokio::test]
async fn a_subject_over_tls_takes_the_endpoints_client_certificate() {
    let tls: TlsSetup = tls_setup();
    let broker = Broker::nats_tls(USER, PASSWORD, tls.broker.clone()).unwrap();
    let nats = Nats { broker, tls: Some((tls.broker.ca.clone(), tls.client.clone())) };
    let destination = nats.destination("orders", true).await;
    scenarios::tls_with_a_client_certificate(&nats, destination, &tls).await;
}
