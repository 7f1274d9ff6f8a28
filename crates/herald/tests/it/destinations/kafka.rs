//! Kafka destinations against tansu, a Kafka-protocol broker, on its SQLite storage (so a
//! broker killed mid-run keeps what it acknowledged) with SASL required: the scenarios
//! every type passes, read back by an independent client (`kafka_consumer.py`:
//! confluent-kafka, which is librdkafka) that checks nothing but what Kafka clients see.

use herald_test_support::brokers::{Broker, free_port};
use serde_json::{Value, json};

use super::scenarios::{self, Fixture, endpoint};
use super::{Consumed, TlsSetup, settles, tls_setup};
use crate::support::TestServer;

pub(super) const USER: &str = "herald";
pub(super) const PASSWORD: &str = "broker-pa55";
/// Partitions of every topic the tests make.
const PARTITIONS: usize = 3;

pub(super) struct Kafka {
    broker: Broker,
    /// TLS in front of the broker, and the consumer's `CA,CERT,KEY` files for it.
    tls: Option<(Broker, String)>,
}

/// One record as the consumer read it.
struct Record {
    consumed: Consumed,
    partition: u64,
    key: String,
}

impl Kafka {
    fn start_plain() -> Self {
        Self { broker: Broker::tansu(USER, PASSWORD, None).unwrap(), tls: None }
    }

    /// tansu behind a TLS terminator that requires a client certificate, advertising the
    /// terminator's port so every connection Herald makes goes through it.
    fn start_tls(tls: &TlsSetup) -> Self {
        let port = free_port().unwrap();
        let broker = Broker::tansu(USER, PASSWORD, Some(port)).unwrap();
        let terminator = Broker::tls_terminator(broker.port(), &tls.broker, port).unwrap();
        let (cert, key) = &tls.client;
        let files = format!("{},{},{}", tls.broker.ca.display(), cert.display(), key.display());
        Self { broker, tls: Some((terminator, files)) }
    }

    /// Where clients reach the broker.
    fn port(&self) -> u16 {
        self.tls.as_ref().map_or(self.broker.port(), |(terminator, _)| terminator.port())
    }

    /// Runs a consumer command; what it printed, or `None` if it failed.
    async fn consumer(&self, args: &[&str]) -> Option<Value> {
        let python = std::env::var("HERALD_TEST_PYTHON").unwrap_or_else(|_| {
            panic!("HERALD_TEST_PYTHON is not set: run the suite with scripts/test.sh, which installs confluent-kafka")
        });
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/destinations/kafka_consumer.py");
        let mut command = std::process::Command::new(python);
        command.arg(script).args([format!("127.0.0.1:{}", self.port()), USER.into(), PASSWORD.into()]);
        if let Some((_, files)) = &self.tls {
            command.arg(files);
        }
        command.args(args);
        let output = tokio::task::spawn_blocking(move || command.output()).await.unwrap().unwrap();
        if !output.status.success() {
            eprintln!("kafka_consumer.py {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
            return None;
        }
        Some(serde_json::from_slice(&output.stdout).unwrap())
    }

    async fn records(&self, topic: &str) -> Vec<Record> {
        // tansu under load sometimes drops a consumer's connection: read again.
        let mut read = None;
        for _ in 0..3 {
            read = self.consumer(&["read", topic]).await;
            if read.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
        let read = read.expect("the consumer reads the topic");
        read.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let headers = r["headers"].as_object().unwrap();
                let headers = headers.iter().map(|(k, v)| (k.to_lowercase(), v.as_str().unwrap().to_owned())).collect();
                let body = r["body"].as_str().unwrap().as_bytes().to_vec();
                Record {
                    consumed: Consumed { body, headers },
                    partition: r["partition"].as_u64().unwrap(),
                    key: r["key"].as_str().unwrap().to_owned(),
                }
            })
            .collect()
    }
}

impl Fixture for Kafka {
    const AUTH_REFUSED: &'static str = "SASL";
    const OUTAGE: (std::time::Duration, Option<u64>) = (std::time::Duration::from_secs(3), Some(2000));
    const KILL_WHEN_POSTED: bool = true;

    fn acknowledged(place: &str) -> String {
        format!("{place} partition ")
    }

    async fn start() -> Self {
        Self::start_plain()
    }

    fn broker(&mut self) -> &mut Broker {
        &mut self.broker
    }

    fn broker_port(&self) -> u16 {
        self.broker.port()
    }

    async fn destination(&self, place: &str, exists: bool) -> Value {
        if exists {
            self.consumer(&["topic", place, &PARTITIONS.to_string()]).await.expect("the topic is made");
        }
        let scheme = if self.tls.is_some() { "kafkas" } else { "kafka" };
        json!({"type": "kafka", "broker": format!("{scheme}://127.0.0.1:{}", self.port()), "topic": place,
               "credentials": {"username": USER, "password": PASSWORD}})
    }

    async fn read_all(&self, place: &str) -> Vec<Consumed> {
        self.records(place).await.into_iter().map(|r| r.consumed).collect()
    }

    async fn count(&self, place: &str) -> Option<usize> {
        self.consumer(&["count", place]).await?.as_u64().map(|n| n as usize)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_reach_the_topic_signed_and_none_is_lost_when_the_broker_is_killed() {
    scenarios::ten_thousand_messages_survive_a_broker_kill::<Kafka>().await;
}

#[tokio::test]
async fn wrong_credentials_are_retried_until_corrected() {
    scenarios::wrong_credentials_are_retried_until_corrected::<Kafka>().await;
}

#[tokio::test]
async fn a_missing_topic_and_an_oversized_message_are_dead_lettered_at_once() {
    scenarios::a_missing_place_and_an_oversized_message_are_dead_lettered_at_once::<Kafka>().await;
}

#[tokio::test]
async fn filters_and_transforms_apply_before_publishing() {
    scenarios::filters_and_transforms_apply_before_publishing::<Kafka>().await;
}

#[tokio::test]
async fn the_breaker_opens_on_a_dead_broker_and_closes_when_it_is_back() {
    scenarios::the_breaker_opens_on_a_dead_broker_and_closes_when_it_is_back::<Kafka>().await;
}

/// TLS is terminated in front of tansu (see `Broker::tls_terminator`), which requires the
/// endpoint's client certificate; the Kafka exchange, SASL included, runs inside it.
#[tokio::test]
async fn a_topic_over_tls_with_a_client_certificate() {
    let tls = tls_setup();
    let kafka = Kafka::start_tls(&tls);
    let destination = kafka.destination("orders", true).await;
    scenarios::tls_with_a_client_certificate(&kafka, destination, &tls).await;
}

/// Each key's records go to one partition, the one the Java client would pick (murmur2),
/// in the order Herald sent them; a strict endpoint's messages arrive in sequence.
#[tokio::test]
async fn a_partition_key_keeps_each_channels_messages_on_one_partition_in_order() {
    let kafka = Kafka::start().await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let mut destination = kafka.destination("orders", true).await;
    destination["partitionKey"] = json!("channel");
    let (ep, _) = endpoint(&server, &app, destination, json!({"delivery": {"ordering": "strict"}})).await;
    let mut sent = Vec::new();
    for i in 0..30 {
        let channel = ["north", "south", "east"][i % 3];
        let payload = json!({"eventType": "order.paid", "channels": [channel], "payload": {"i": i}});
        sent.push((channel, server.send(&app, payload).await));
    }
    for (_, msg) in &sent {
        settles(&server, &app, msg, &ep, 0).await;
    }
    let records = kafka.records("orders").await;
    assert_eq!(records.len(), sent.len());
    for channel in ["north", "south", "east"] {
        let mine: Vec<&Record> = records.iter().filter(|r| r.key == channel).collect();
        let expected: Vec<&str> = sent.iter().filter(|(c, _)| *c == channel).map(|(_, m)| m.as_str()).collect();
        let got: Vec<&str> = mine.iter().map(|r| r.consumed.header("webhook-id")).collect();
        assert_eq!(got, expected, "{channel}'s records, in order");
        assert!(mine.iter().all(|r| r.partition == mine[0].partition), "{channel} on one partition");
    }
    // murmur2 as Java computes it: these three keys do not all share a partition.
    let partitions: std::collections::HashSet<u64> = records.iter().map(|r| r.partition).collect();
    assert!(partitions.len() > 1, "{partitions:?}");
}

/// SCRAM-SHA-256 logs in as SCRAM-SHA-512 does (the other scenarios use the default,
/// SHA-512), and a wrong password under it is `broker_auth`.
#[tokio::test]
async fn scram_sha_256_logs_in_too() {
    let kafka = Kafka::start().await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let mut destination = kafka.destination("orders", true).await;
    destination["saslMechanism"] = json!("SCRAM-SHA-256");
    let (ep, secret) = endpoint(&server, &app, destination.clone(), json!({})).await;
    let msg = server.send(&app, json!({"eventType": "order.paid", "payload": {"sha": 256}})).await;
    settles(&server, &app, &msg, &ep, 0).await;
    let records = kafka.read_all("orders").await;
    assert_eq!(records.len(), 1);
    assert!(records[0].verifies(&secret));

    let refused_app = server.create_app("refused").await;
    destination["credentials"]["password"] = json!("not-the-password");
    let (_, _) = endpoint(&server, &refused_app, destination, json!({"delivery": super::never_breaking()})).await;
    let refused = server.send(&refused_app, json!({"eventType": "order.paid", "payload": {}})).await;
    let tried = super::attempts(&server, &refused_app, &refused, 1).await;
    assert_eq!(tried[0]["errorClass"], "broker_auth", "{tried:?}");
    assert!(tried[0]["error"].as_str().unwrap().contains("SASL SCRAM-SHA-256"), "{tried:?}");
}
