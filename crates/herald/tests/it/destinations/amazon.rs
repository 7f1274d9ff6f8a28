//! Amazon SQS, SNS and EventBridge destinations against the moto server (the AWS
//! emulator), with IAM on: every request Herald signs is checked against the access key
//! the test made. The scenarios every type passes, read back with boto3
//! (`aws_consumer.py`): SQS from the queue itself, SNS from a queue subscribed to the topic
//! (raw delivery), EventBridge from a queue a rule on the bus targets.
//!
//! moto keeps its state in memory, so a killed moto would come back empty, as no AWS
//! service does: the scenarios' "broker" is a TCP forwarder in front of moto (socat),
//! which they kill and restart. To Herald that is the service unreachable, every
//! connection refused or reset, and back; the consumer reads moto directly.

use std::marker::PhantomData;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

use herald_test_support::brokers::Broker;
use serde_json::{Value, json};

use super::scenarios::{self, Fixture, endpoint};
use super::{Consumed, attempts, never_breaking, settles};
use crate::support::{TestServer, eventually};

const REGION: &str = "us-east-1";
const ACCOUNT: &str = "123456789012";
/// Consumer processes per queue.
const DRAINERS: usize = 8;

/// moto, the forwarder Herald reaches it through, and the consumer: its state and the
/// processes draining queues into it.
pub(super) struct Moto {
    moto: Broker,
    front: Broker,
    state: tempfile::TempDir,
    key: (String, String),
    drainers: Mutex<Vec<Child>>,
}

impl Drop for Moto {
    fn drop(&mut self) {
        for drainer in self.drainers.lock().unwrap().iter_mut() {
            let _ = drainer.kill();
            let _ = drainer.wait();
        }
    }
}

impl Moto {
    async fn start() -> Self {
        let python = std::env::var("HERALD_TEST_PYTHON").unwrap_or_else(|_| {
            panic!("HERALD_TEST_PYTHON is not set: run the suite with scripts/test.sh, which installs moto[server]")
        });
        // The consumer's first three requests make its IAM user, policy and access key.
        let moto = Broker::moto(&python, 3).unwrap();
        let front = Broker::forwarder(moto.port()).unwrap();
        let state = tempfile::tempdir().unwrap();
        let mut fixture = Self { moto, front, state, key: Default::default(), drainers: Default::default() };
        let keys = fixture.consumer(&["init"]).await;
        fixture.key = (keys["accessKeyId"].as_str().unwrap().into(), keys["secretAccessKey"].as_str().unwrap().into());
        fixture
    }

    /// Runs a consumer command against moto itself; what it printed.
    async fn consumer(&self, args: &[&str]) -> Value {
        let mut command = self.command(args);
        let output = tokio::task::spawn_blocking(move || command.output()).await.unwrap().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "aws_consumer.py {args:?} failed: {stderr}\n{}", self.moto.logs());
        serde_json::from_slice(&output.stdout).unwrap()
    }

    fn command(&self, args: &[&str]) -> Command {
        let python = std::env::var("HERALD_TEST_PYTHON").unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/destinations/aws_consumer.py");
        let mut command = Command::new(python);
        command.arg(script).arg(self.state.path()).arg(format!("http://127.0.0.1:{}", self.moto.port())).args(args);
        command
    }

    /// Starts reading `queue` as `kind` (`sqs`, `sns`, `eventbridge`) delivers it there,
    /// until the fixture is dropped. moto answers one request at a time and slows down with
    /// every message a queue holds, so three readers keep up with Herald's publishing.
    fn drain(&self, queue: &str, kind: &str) {
        self.drain_with(queue, kind, DRAINERS);
    }

    /// As [`Moto::drain`], with `readers` processes (one keeps a FIFO queue's order).
    /// Returns once every reader is reading: starting them is a burst of CPU that must not
    /// overlap the test's own work (a transform has 100 ms).
    fn drain_with(&self, queue: &str, kind: &str, readers: usize) {
        for _ in 0..readers {
            let drainer = self.command(&["drain", queue, kind]).process_group(0).stdout(Stdio::null()).spawn().unwrap();
            self.drainers.lock().unwrap().push(drainer);
        }
        let ready = |entry: &std::io::Result<std::fs::DirEntry>| {
            entry.as_ref().is_ok_and(|e| e.file_name().to_string_lossy().starts_with(&format!("{queue}.ready.")))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while std::fs::read_dir(self.state.path()).unwrap().filter(ready).count() < readers {
            assert!(std::time::Instant::now() < deadline, "the readers of {queue} did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Where Herald reaches the service: through the forwarder.
    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.front.port())
    }

    fn credentials(&self) -> Value {
        json!({"username": self.key.0, "password": self.key.1})
    }

    /// Every message in `queue` once the drainers have taken them all (none left to take,
    /// and what they took written: the kept file stops growing).
    async fn drained(&self, queue: &str) -> Vec<Read> {
        eventually(&format!("the queue {queue} drained"), || async {
            (self.consumer(&["pending", queue]).await == 0).then_some(())
        })
        .await;
        let mut kept = self.read(queue);
        loop {
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
            let now = self.read(queue);
            if now.len() == kept.len() {
                return now;
            }
            kept = now;
        }
    }

    /// Every message drained from `queue` so far, oldest first. A standard queue gives a
    /// message at least once (moto's, to two readers at the same time): a message the
    /// queue gave again under the same id is dropped here, as a consumer would; a second
    /// publish by Herald is another message, and stays.
    fn read(&self, queue: &str) -> Vec<Read> {
        let kept = std::fs::read_to_string(self.state.path().join(format!("{queue}.jsonl"))).unwrap_or_default();
        // A line still being written has no newline yet.
        let complete = &kept[..kept.rfind('\n').map_or(0, |end| end + 1)];
        let mut seen = std::collections::HashSet::new();
        let read = complete.lines().map(|line| Read::of(&serde_json::from_str(line).unwrap()));
        read.filter(|r| seen.insert(r.attributes["MessageId"].as_str().unwrap().to_owned())).collect()
    }
}

/// A message read from a queue: as the scenarios compare it, and the queue's attributes.
#[derive(Debug)]
struct Read {
    consumed: Consumed,
    attributes: Value,
}

impl Read {
    fn of(read: &Value) -> Self {
        let headers = read["headers"].as_object().unwrap();
        let headers = headers.iter().map(|(k, v)| (k.to_lowercase(), v.as_str().unwrap().to_owned())).collect();
        let body = read["body"].as_str().unwrap().as_bytes().to_vec();
        Self { consumed: Consumed { body, headers }, attributes: read["attributes"].clone() }
    }
}

/// One Amazon service as a destination type.
pub(super) trait Service {
    const ACKNOWLEDGED: &'static str;
    /// The queue a place's messages end up in.
    fn queue(place: &str) -> String;
    /// A destination publishing to `place`, made now (and drained) if `exists`.
    async fn destination(moto: &Moto, place: &str, exists: bool) -> Value;
}

pub(super) struct Sqs;
pub(super) struct Sns;
pub(super) struct EventBridge;

impl Service for Sqs {
    const ACKNOWLEDGED: &'static str = "SendMessage MessageId=";

    fn queue(place: &str) -> String {
        place.to_owned()
    }

    async fn destination(moto: &Moto, place: &str, exists: bool) -> Value {
        if exists {
            moto.consumer(&["queue", place]).await;
            moto.drain(place, "sqs");
        }
        let queue_url = format!("{}/{ACCOUNT}/{place}", moto.endpoint());
        json!({"type": "sqs", "queueUrl": queue_url, "region": REGION, "credentials": moto.credentials()})
    }
}

impl Service for Sns {
    const ACKNOWLEDGED: &'static str = "Publish MessageId=";

    fn queue(place: &str) -> String {
        format!("{place}-sink")
    }

    async fn destination(moto: &Moto, place: &str, exists: bool) -> Value {
        let arn = match exists {
            true => moto.consumer(&["topic", place]).await.as_str().unwrap().to_owned(),
            false => format!("arn:aws:sns:{REGION}:{ACCOUNT}:{place}"),
        };
        if exists {
            moto.drain(&Self::queue(place), "sns");
        }
        json!({"type": "sns", "broker": moto.endpoint(), "topicArn": arn, "region": REGION,
               "credentials": moto.credentials()})
    }
}

impl Service for EventBridge {
    const ACKNOWLEDGED: &'static str = "PutEvents EventId=";

    fn queue(place: &str) -> String {
        format!("{place}-sink")
    }

    async fn destination(moto: &Moto, place: &str, exists: bool) -> Value {
        if exists {
            moto.consumer(&["bus", place]).await;
            moto.drain(&Self::queue(place), "eventbridge");
        }
        json!({"type": "eventBridge", "broker": moto.endpoint(), "eventBus": place, "region": REGION,
               "source": "shop", "credentials": moto.credentials()})
    }
}

/// A service behind moto, as the scenarios drive it.
pub(super) struct Amazon<S>(Moto, PhantomData<S>);

impl<S> Amazon<S> {
    /// The service's endpoint, as Herald reaches it.
    pub fn endpoint(&self) -> String {
        self.0.endpoint()
    }

    /// The access key (id, secret) the consumer and Herald sign with.
    pub fn key(&self) -> &(String, String) {
        &self.0.key
    }
}

impl<S: Service> Fixture for Amazon<S> {
    const AUTH_REFUSED: &'static str = "SignatureDoesNotMatch";

    fn acknowledged(_place: &str) -> String {
        S::ACKNOWLEDGED.to_owned()
    }

    async fn start() -> Self {
        Self(Moto::start().await, PhantomData)
    }

    fn broker(&mut self) -> &mut Broker {
        &mut self.0.front
    }

    fn broker_port(&self) -> u16 {
        self.0.front.port()
    }

    async fn destination(&self, place: &str, exists: bool) -> Value {
        S::destination(&self.0, place, exists).await
    }

    /// Once the drainers have emptied the queue.
    async fn read_all(&self, place: &str) -> Vec<Consumed> {
        self.0.drained(&S::queue(place)).await.into_iter().map(|r| r.consumed).collect()
    }

    /// What the drainers have kept so far (the queue may hold more).
    async fn count(&self, place: &str) -> Option<usize> {
        Some(self.0.read(&S::queue(place)).len())
    }
}

macro_rules! scenarios {
    ($module:ident, $service:ty) => {
        mod $module {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn ten_thousand_messages_arrive_signed_and_none_is_lost_when_the_service_is_unreachable() {
                scenarios::ten_thousand_messages_survive_a_broker_kill::<Amazon<$service>>().await;
            }

            #[tokio::test]
            async fn a_wrong_secret_key_is_retried_until_corrected() {
                scenarios::wrong_credentials_are_retried_until_corrected::<Amazon<$service>>().await;
            }

            #[tokio::test]
            async fn a_missing_place_and_an_oversized_message_are_dead_lettered_at_once() {
                scenarios::a_missing_place_and_an_oversized_message_are_dead_lettered_at_once::<Amazon<$service>>()
                    .await;
            }

            #[tokio::test]
            async fn filters_and_transforms_apply_before_publishing() {
                scenarios::filters_and_transforms_apply_before_publishing::<Amazon<$service>>().await;
            }

            #[tokio::test]
            async fn the_breaker_opens_on_an_unreachable_service_and_closes_when_it_is_back() {
                scenarios::the_breaker_opens_on_a_dead_broker_and_closes_when_it_is_back::<Amazon<$service>>().await;
            }
        }
    };
}

scenarios!(sqs, Sqs);
scenarios!(sns, Sns);
scenarios!(eventbridge, EventBridge);

/// A FIFO queue gets the partition key's value as each message's group and the message id
/// as its deduplication id; with strict ordering each group holds its messages in the
/// order they were sent.
#[tokio::test]
async fn a_fifo_queue_groups_messages_by_the_partition_key_in_order() {
    let moto = Moto::start().await;
    let queue_url = moto.consumer(&["queue", "orders.fifo", "fifo"]).await;
    moto.drain_with("orders.fifo", "sqs", 1);
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    let queue_url =
        queue_url.as_str().unwrap().replace(&format!(":{}", moto.moto.port()), &format!(":{}", moto.front.port()));
    let destination = json!({"type": "sqs", "queueUrl": queue_url, "region": REGION, "partitionKey": "channel",
                             "credentials": moto.credentials()});
    let (_, secret) = endpoint(&server, &app, destination, json!({"delivery": {"ordering": "strict"}})).await;
    let mut sent = Vec::new();
    for i in 0..12 {
        let channel = ["eu", "us", "apac"][i % 3];
        let msg = json!({"eventType": "order.paid", "payload": {"i": i}, "channels": [channel]});
        sent.push((server.send(&app, msg).await, channel));
    }
    let read = eventually("twelve messages in the FIFO queue", || async {
        let read = moto.drained("orders.fifo").await;
        (read.len() >= 12).then_some(read)
    })
    .await;
    assert_eq!(read.len(), 12, "each message once");
    for channel in ["eu", "us", "apac"] {
        let group: Vec<&Read> = read.iter().filter(|r| r.attributes["MessageGroupId"] == channel).collect();
        let ids: Vec<&str> = group.iter().map(|r| r.consumed.header("webhook-id")).collect();
        let expected: Vec<&str> = sent.iter().filter(|(_, c)| *c == channel).map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, expected, "the {channel} group, in the order sent");
    }
    for r in &read {
        assert!(r.consumed.verifies(&secret));
        assert_eq!(r.attributes["MessageDeduplicationId"], r.consumed.header("webhook-id"));
    }
}

/// An EventBridge event's detail type is the event type and its source the destination's;
/// SQS and SNS carry at most ten message attributes, so an endpoint whose headers would
/// make more fails permanently, saying so.
#[tokio::test]
async fn events_carry_the_event_type_and_too_many_headers_are_refused() {
    let moto = Moto::start().await;
    let server = TestServer::start().await;
    let app = server.create_app("shop").await;
    endpoint(&server, &app, EventBridge::destination(&moto, "orders", true).await, json!({})).await;
    server.send(&app, json!({"eventType": "invoice.issued", "payload": {"n": 1}})).await;
    let read = eventually("the event", || async {
        let read = moto.read("orders-sink");
        (!read.is_empty()).then_some(read)
    })
    .await;
    assert_eq!(
        (&read[0].attributes["detail-type"], &read[0].attributes["source"]),
        (&json!("invoice.issued"), &json!("shop"))
    );
    assert_eq!(read[0].consumed.json(), json!({"n": 1}));

    let crowded = server.create_app("crowded").await;
    let headers: serde_json::Map<String, Value> = (0..5).map(|i| (format!("x-extra-{i}"), json!("v"))).collect();
    let destination = Sqs::destination(&moto, "crowded", true).await;
    let extra = json!({"headers": headers, "delivery": never_breaking()});
    let (ep, _) = endpoint(&server, &crowded, destination, extra).await;
    let msg = server.send(&crowded, json!({"eventType": "order.paid", "payload": {}})).await;
    settles(&server, &crowded, &msg, &ep, 2).await;
    let tried = attempts(&server, &crowded, &msg, 1).await;
    assert_eq!(tried.len(), 1, "{tried:?}");
    assert_eq!(tried[0]["errorClass"], "broker_refused");
    assert!(tried[0]["error"].as_str().unwrap().contains("at most 10 message attributes"), "{tried:?}");
}
