//! Apache Kafka: an idempotent producer written for Herald over `kafka-protocol`'s
//! encodings, so every broker connection goes through the destination guard, the egress
//! proxy and the endpoint's TLS settings like every other destination (a client library
//! such as librdkafka dials the brokers a cluster advertises by itself).
//!
//! A [`Connection`] is one producer: connected to the bootstrap broker, it learns the
//! cluster (`Metadata`), takes a producer id (`InitProducerId`), and opens a connection to
//! each partition leader when it first needs one (`wire.rs`). A message goes to the
//! partition its key picks (`partition.rs`, as the Java client picks it), where a lane
//! sends it with whatever else is waiting for that partition as one batch, `acks=all`,
//! numbered with the partition's next sequence. A batch whose answer is lost (the
//! connection dropped, the leader moved) is sent again with the same numbers, so the
//! broker keeps it once; a batch whose fate is still unknown at its deadline breaks the
//! producer, and the next one starts with a new producer id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{InitProducerIdRequest, MetadataRequest, TopicName};
use tokio::sync::mpsc;
use tokio::time::Instant;

mod lane;
mod partition;
mod scram;
mod wire;

use self::lane::{Lane, Pending};
use self::wire::{Versioned, Wire};
use super::message::Outbound;
use super::{Acknowledgement, Dialer, PublishError};
use crate::destinations::{Address, BrokerCredentials, SaslMechanism};
use crate::outcome::Failure;

/// Kafka's default limit on a record batch (`max.message.bytes`, 1 MiB plus overhead):
/// a larger message is refused before it is sent, unless `maxMessageBytes` allows more.
pub const DEFAULT_MAX_MESSAGE: usize = 1_048_576;
/// Brokers and partitions a cluster may claim (a hostile broker must not make Herald
/// allocate without bound).
const MAX_BROKERS: usize = 256;
const MAX_PARTITIONS: usize = 10_000;
/// How long a topic's partitions and leaders are trusted before they are asked again.
const METADATA_TTL: Duration = Duration::from_secs(60);

/// One idempotent producer for one destination identity; cheap to clone.
#[derive(Clone)]
pub struct Connection {
    cluster: Arc<Cluster>,
    lanes: Arc<Mutex<HashMap<Partition, mpsc::Sender<Pending>>>>,
}

/// A topic and one of its partitions: what a lane writes to.
type Partition = (String, i32);
/// A broker's address and, once opened, the connection to it.
type Known = (Address, Option<Arc<Wire>>);

/// What a producer's lanes share: the way to the brokers, what is known of the cluster,
/// and the producer id every batch carries.
struct Cluster {
    dialer: Dialer,
    tls: bool,
    credentials: BrokerCredentials,
    mechanism: SaslMechanism,
    /// The broker the destination names, and the connection to it (made again when it
    /// breaks): where the cluster is asked about.
    bootstrap: (Address, Mutex<Option<Arc<Wire>>>),
    /// Broker id → its address, and the open connection to it.
    brokers: Mutex<HashMap<i32, Known>>,
    /// Topic → each partition's leader, and when that was learnt.
    topics: Mutex<HashMap<String, (Vec<i32>, Instant)>>,
    producer: (i64, i16),
    /// Set once a batch's fate is unknown: every later attempt fails until Herald
    /// connects again (a new producer id).
    broken: Mutex<Option<String>>,
}

/// Connects to the bootstrap broker at `address` and takes a producer id.
pub(super) async fn connect(
    dialer: &Dialer,
    address: &Address,
    credentials: &BrokerCredentials,
    mechanism: SaslMechanism,
) -> Result<Connection, PublishError> {
    let bootstrap = Wire::open(dialer, address, credentials, mechanism).await?;
    let init = InitProducerIdRequest::default()
        .with_transaction_timeout_ms(i32::MAX)
        .with_producer_id((-1).into())
        .with_producer_epoch(-1);
    let answer = within(dialer.budget, bootstrap.call(&init)).await?;
    if let Some(e) = ResponseError::try_from_code(answer.error_code) {
        let failure = if is_auth(e) { Failure::BrokerAuth } else { Failure::BrokerRefused };
        return Err(PublishError::new(failure, format!("InitProducerId: {e}"), true));
    }
    let cluster = Cluster {
        dialer: dialer.clone(),
        tls: address.tls,
        credentials: credentials.clone(),
        mechanism,
        bootstrap: (address.clone(), Mutex::new(Some(Arc::new(bootstrap)))),
        brokers: Mutex::default(),
        topics: Mutex::default(),
        producer: (answer.producer_id.0, answer.producer_epoch),
        broken: Mutex::default(),
    };
    Ok(Connection { cluster: Arc::new(cluster), lanes: Arc::default() })
}

impl Connection {
    /// Publishes `message` to `topic` under `key` within `deadline`; acknowledged once
    /// every in-sync replica has it.
    pub async fn publish(
        &self,
        topic: &str,
        key: String,
        message: &Outbound,
        max_bytes: usize,
        deadline: Instant,
    ) -> Result<Acknowledgement, PublishError> {
        let size =
            message.body.len() + key.len() + message.headers.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>();
        if size > max_bytes {
            let why = format!("the record is {size} bytes, more than the {max_bytes} the topic takes");
            return Err(PublishError::new(Failure::MessageTooLarge, why, false));
        }
        self.cluster.check_broken()?;
        let leaders = self.cluster.leaders(topic, false).await?;
        let partition = partition::for_key(key.as_bytes(), leaders.len());
        let (reply, answer) = tokio::sync::oneshot::channel();
        let pending = Pending { key, message: message.clone(), deadline, reply };
        self.lane(topic, partition).send(pending).await.map_err(|_| broken("the partition's lane stopped"))?;
        let (partition, offset) = answer.await.map_err(|_| broken("the partition's lane stopped"))??;
        Ok(format!("{topic} partition {partition} offset {offset}"))
    }

    /// The lane of `topic`'s `partition`, started if it has none (or its last one ended).
    fn lane(&self, topic: &str, partition: i32) -> mpsc::Sender<Pending> {
        let mut lanes = self.lanes.lock().unwrap_or_else(|e| e.into_inner());
        let key = (topic.to_owned(), partition);
        if let Some(lane) = lanes.get(&key).filter(|l| !l.is_closed()) {
            return lane.clone();
        }
        let (lane, queue) = mpsc::channel(lane::QUEUE);
        tokio::spawn(Lane::new(self.cluster.clone(), topic.to_owned(), partition, queue).run());
        lanes.retain(|_, l| !l.is_closed());
        lanes.insert(key, lane.clone());
        lane
    }
}

impl Cluster {
    fn check_broken(&self) -> Result<(), PublishError> {
        match self.broken.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            Some(why) => Err(PublishError::new(Failure::Connection, why, true)),
            None => Ok(()),
        }
    }

    fn set_broken(&self, why: &str) {
        self.broken.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(|| why.to_owned());
    }

    /// Each partition's leader of `topic`: remembered, or asked for (always if `fresh`).
    pub async fn leaders(&self, topic: &str, fresh: bool) -> Result<Vec<i32>, PublishError> {
        if !fresh
            && let Some((leaders, at)) = self.topics.lock().unwrap_or_else(|e| e.into_inner()).get(topic)
            && at.elapsed() < METADATA_TTL
        {
            return Ok(leaders.clone());
        }
        let request = MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(topic.to_owned().into()))),
            ]))
            .with_allow_auto_topic_creation(false);
        let answer = within(self.dialer.budget, self.ask(&request)).await?;
        if answer.brokers.len() > MAX_BROKERS {
            let why = format!("the cluster claims {} brokers (at most {MAX_BROKERS})", answer.brokers.len());
            return Err(PublishError::new(Failure::BrokerRefused, why, true));
        }
        let mut brokers = self.brokers.lock().unwrap_or_else(|e| e.into_inner());
        for broker in &answer.brokers {
            let address = Address { host: broker.host.to_string(), port: broker.port as u16, tls: self.tls };
            let known = brokers.get(&broker.node_id.0).is_some_and(|(a, _)| *a == address);
            if !known && (1..=u16::MAX as i32).contains(&broker.port) {
                brokers.insert(broker.node_id.0, (address, None));
            }
        }
        drop(brokers);
        let found = answer.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic));
        let Some(found) = found else { return Err(missing(topic, "the broker did not describe it")) };
        match ResponseError::try_from_code(found.error_code) {
            None => {}
            Some(ResponseError::UnknownTopicOrPartition) => return Err(missing(topic, "no such topic")),
            Some(e) if is_auth(e) => {
                return Err(PublishError::new(Failure::BrokerAuth, format!("the topic {topic}: {e}"), false));
            }
            Some(e) => return Err(PublishError::new(Failure::Throttled, format!("the topic {topic}: {e}"), false)),
        }
        let count = found.partitions.len();
        if count == 0 || count > MAX_PARTITIONS {
            return Err(PublishError::new(Failure::BrokerRefused, format!("the topic has {count} partitions"), false));
        }
        let mut leaders = vec![-1; count];
        for p in &found.partitions {
            if let Some(slot) = usize::try_from(p.partition_index).ok().and_then(|i| leaders.get_mut(i)) {
                *slot = p.leader_id.0;
            }
        }
        self.topics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(topic.to_owned(), (leaders.clone(), Instant::now()));
        Ok(leaders)
    }

    /// Asks the bootstrap broker, connecting to it again if its connection broke.
    async fn ask<R: Versioned>(&self, request: &R) -> Result<R::Response, PublishError> {
        let kept = self.bootstrap.1.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let wire = match kept {
            Some(wire) => wire,
            None => {
                let wire = Wire::open(&self.dialer, &self.bootstrap.0, &self.credentials, self.mechanism).await?;
                let wire = Arc::new(wire);
                *self.bootstrap.1.lock().unwrap_or_else(|e| e.into_inner()) = Some(wire.clone());
                wire
            }
        };
        let answer = wire.call(request).await;
        if answer.as_ref().is_err_and(|e| e.broken) {
            let mut kept = self.bootstrap.1.lock().unwrap_or_else(|e| e.into_inner());
            if kept.as_ref().is_some_and(|w| Arc::ptr_eq(w, &wire)) {
                *kept = None;
            }
        }
        answer
    }

    /// The connection to broker `id`, opened now if there is none.
    pub async fn broker(&self, id: i32) -> Result<Arc<Wire>, PublishError> {
        let address = {
            let brokers = self.brokers.lock().unwrap_or_else(|e| e.into_inner());
            match brokers.get(&id) {
                Some((_, Some(wire))) => return Ok(wire.clone()),
                Some((address, None)) => address.clone(),
                None => return Err(PublishError::new(Failure::Throttled, format!("broker {id} is not known"), false)),
            }
        };
        let wire = Arc::new(Wire::open(&self.dialer, &address, &self.credentials, self.mechanism).await?);
        let mut brokers = self.brokers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((known, slot)) = brokers.get_mut(&id)
            && *known == address
        {
            return Ok(slot.get_or_insert(wire).clone());
        }
        Ok(wire)
    }

    /// Forgets the connection to broker `id` (it failed): the next batch opens another.
    pub fn forget(&self, id: i32, wire: &Arc<Wire>) {
        let mut brokers = self.brokers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, slot)) = brokers.get_mut(&id)
            && slot.as_ref().is_some_and(|w| Arc::ptr_eq(w, wire))
        {
            *slot = None;
        }
    }
}

/// Errors that mean Herald's credentials are not allowed what it asked.
fn is_auth(e: ResponseError) -> bool {
    matches!(
        e,
        ResponseError::TopicAuthorizationFailed
            | ResponseError::ClusterAuthorizationFailed
            | ResponseError::TransactionalIdAuthorizationFailed
            | ResponseError::SaslAuthenticationFailed
    )
}

fn missing(topic: &str, why: &str) -> PublishError {
    PublishError::new(Failure::DestinationMissing, format!("the topic {topic}: {why}"), false)
}

fn broken(why: &str) -> PublishError {
    PublishError::new(Failure::Connection, why, true)
}

async fn within<T>(budget: Duration, call: impl Future<Output = Result<T, PublishError>>) -> Result<T, PublishError> {
    tokio::time::timeout(budget, call)
        .await
        .unwrap_or_else(|_| Err(PublishError::new(Failure::Timeout, "the broker did not answer in time", true)))
}
