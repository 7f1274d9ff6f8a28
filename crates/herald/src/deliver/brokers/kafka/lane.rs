//! One partition's lane: the messages waiting for a partition go out together as one
//! record batch, one batch in flight at a time (so the partition keeps Herald's order),
//! each batch numbered from the partition's next sequence. An answer that is lost, or a
//! leader that moved, sends the same batch again with the same numbers until its
//! deadline: the broker writes it once. A lane with nothing to do for a minute ends.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType};
use rand::Rng;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::super::PublishError;
use super::super::message::Outbound;
use super::{Cluster, is_auth, missing};
use crate::outcome::Failure;

/// Messages that may wait for one partition.
pub const QUEUE: usize = 1024;
/// A batch holds at most this many records, or bytes (a larger record goes alone).
const MAX_RECORDS: usize = 500;
const MAX_BYTES: usize = 512 * 1024;
/// A lane with nothing to send for this long ends.
const IDLE: Duration = Duration::from_secs(60);
/// The longest throttle a broker's answer can impose on the next batch.
const MAX_THROTTLE: Duration = Duration::from_secs(30);

/// A message waiting for its partition, and where its outcome goes: the partition and
/// offset it was written at.
pub struct Pending {
    pub key: String,
    pub message: Outbound,
    pub deadline: Instant,
    pub reply: oneshot::Sender<Result<(i32, i64), PublishError>>,
}

impl Pending {
    fn size(&self) -> usize {
        self.key.len()
            + self.message.body.len()
            + self.message.headers.iter().map(|(n, v)| n.len() + v.len()).sum::<usize>()
    }
}

pub struct Lane {
    cluster: Arc<Cluster>,
    topic: String,
    partition: i32,
    queue: mpsc::Receiver<Pending>,
    /// The message taken from the queue that did not fit in the last batch.
    carried: Option<Pending>,
    sequence: i32,
}

impl Lane {
    pub fn new(cluster: Arc<Cluster>, topic: String, partition: i32, queue: mpsc::Receiver<Pending>) -> Self {
        Self { cluster, topic, partition, queue, carried: None, sequence: 0 }
    }

    pub async fn run(mut self) {
        while let Some(batch) = self.next_batch().await {
            match self.send(&batch).await {
                Ok((base, throttle)) => {
                    for (i, pending) in batch.into_iter().enumerate() {
                        let offset = if base < 0 { base } else { base + i as i64 };
                        let _ = pending.reply.send(Ok((self.partition, offset)));
                    }
                    tokio::time::sleep(throttle).await;
                }
                // A batch the broker finds too large is sent again one record at a time.
                Err(e) if e.failure == Failure::MessageTooLarge && batch.len() > 1 => {
                    for pending in batch {
                        let outcome = self.send(std::slice::from_ref(&pending)).await;
                        let _ = pending.reply.send(outcome.map(|(base, _)| (self.partition, base)));
                    }
                }
                Err(e) => {
                    for pending in batch {
                        let _ = pending.reply.send(Err(PublishError::new(e.failure.clone(), e.why.clone(), e.broken)));
                    }
                }
            }
        }
    }

    /// What is waiting, up to a batch; `None` once the lane is idle or its producer gone.
    /// A message whose attempt has given up waiting is not sent.
    async fn next_batch(&mut self) -> Option<Vec<Pending>> {
        loop {
            let first = match self.carried.take() {
                Some(pending) => pending,
                None => tokio::time::timeout(IDLE, self.queue.recv()).await.ok()??,
            };
            let mut bytes = first.size();
            let mut batch = vec![first];
            while batch.len() < MAX_RECORDS {
                let Ok(next) = self.queue.try_recv() else { break };
                if bytes + next.size() > MAX_BYTES {
                    self.carried = Some(next);
                    break;
                }
                bytes += next.size();
                batch.push(next);
            }
            batch.retain(|p| !p.reply.is_closed());
            if !batch.is_empty() {
                return Some(batch);
            }
        }
    }

    /// Writes `batch` to the partition: its base offset, and how long the broker asks
    /// Herald to wait before the next.
    async fn send(&mut self, batch: &[Pending]) -> Result<(i64, Duration), PublishError> {
        self.cluster.check_broken()?;
        if self.sequence as i64 + batch.len() as i64 > i32::MAX as i64 {
            let why = "the producer id's sequence numbers are used up: a new one is taken";
            self.cluster.set_broken(why);
            return Err(PublishError::new(Failure::Connection, why, true));
        }
        let records = self.encode(batch)?;
        let deadline = batch.iter().map(|p| p.deadline).min().unwrap_or_else(Instant::now);
        // Whether a try may have written the batch without Herald hearing so.
        let mut maybe_written = false;
        let mut fresh = false;
        for tries in 0u32.. {
            let last = match self.try_once(&records, deadline, fresh).await {
                Try::Written(base, throttle) => {
                    self.sequence += batch.len() as i32;
                    return Ok((base, throttle));
                }
                Try::Refused(e) => return Err(e),
                Try::Again(e, may_have_written) => {
                    maybe_written |= may_have_written;
                    e
                }
            };
            fresh = true;
            let ceiling = Duration::from_millis(50).saturating_mul(1 << tries.min(5)).min(Duration::from_secs(1));
            let wait = Duration::from_millis(rand::rng().random_range(0..=ceiling.as_millis() as u64));
            if Instant::now() + wait >= deadline {
                if maybe_written {
                    // Its fate is unknown, so the next batch's number is too: a new
                    // producer id starts again from 0.
                    self.cluster.set_broken(&last.why);
                }
                return Err(PublishError::new(last.failure, last.why, maybe_written || last.broken));
            }
            tokio::time::sleep(wait).await;
        }
        unreachable!("the loop returns")
    }

    async fn try_once(&self, records: &Bytes, deadline: Instant, fresh: bool) -> Try {
        let leaders = match self.cluster.leaders(&self.topic, fresh).await {
            Ok(leaders) => leaders,
            Err(e) if e.failure == Failure::DestinationMissing || e.failure == Failure::BrokerAuth => {
                return Try::Refused(e);
            }
            Err(e) => return Try::Again(e, false),
        };
        let Some(&leader) = leaders.get(self.partition as usize).filter(|l| **l >= 0) else {
            let why = format!("partition {} of {} has no leader", self.partition, self.topic);
            return Try::Again(PublishError::new(Failure::Throttled, why, false), false);
        };
        let wire = match self.cluster.broker(leader).await {
            Ok(wire) => wire,
            Err(e) => return Try::Again(e, false),
        };
        let remaining = deadline.saturating_duration_since(Instant::now());
        let request = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(remaining.as_millis() as i32)
            .with_topic_data(vec![
                TopicProduceData::default().with_name(TopicName(self.topic.clone().into())).with_partition_data(vec![
                    PartitionProduceData::default().with_index(self.partition).with_records(Some(records.clone())),
                ]),
            ]);
        let answer = match tokio::time::timeout(remaining, wire.call(&request)).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => {
                self.cluster.forget(leader, &wire);
                return Try::Again(e, true);
            }
            Err(_) => {
                self.cluster.forget(leader, &wire);
                let why = "the partition's leader did not answer in time";
                return Try::Again(PublishError::new(Failure::Timeout, why, true), true);
            }
        };
        let throttle = Duration::from_millis(answer.throttle_time_ms.max(0) as u64).min(MAX_THROTTLE);
        let partition =
            answer.responses.iter().flat_map(|t| &t.partition_responses).find(|p| p.index == self.partition);
        let Some(partition) = partition else {
            return Try::Again(
                PublishError::new(Failure::BrokerRefused, "the broker's answer names no partition", true),
                true,
            );
        };
        let Some(error) = ResponseError::try_from_code(partition.error_code) else {
            return Try::Written(partition.base_offset, throttle);
        };
        let detail = partition.error_message.as_ref().map(|m| format!(": {}", m.as_str())).unwrap_or_default();
        let why = format!("{} partition {}: {error}{detail}", self.topic, self.partition);
        self.judge(error, why, throttle)
    }

    /// What an error the partition answered with means for the batch.
    fn judge(&self, error: ResponseError, why: String, throttle: Duration) -> Try {
        use ResponseError as E;
        match error {
            E::DuplicateSequenceNumber => Try::Written(-1, throttle),
            E::MessageTooLarge | E::RecordListTooLarge => {
                Try::Refused(PublishError::new(Failure::MessageTooLarge, why, false))
            }
            E::UnknownTopicOrPartition => Try::Again(missing(&self.topic, &why), false),
            e if is_auth(e) => Try::Refused(PublishError::new(Failure::BrokerAuth, why, false)),
            E::OutOfOrderSequenceNumber
            | E::InvalidProducerEpoch
            | E::UnknownProducerId
            | E::ProducerFenced
            | E::InvalidProducerIdMapping => {
                self.cluster.set_broken(&why);
                Try::Refused(PublishError::new(Failure::Connection, why, true))
            }
            E::NotEnoughReplicasAfterAppend | E::RequestTimedOut | E::KafkaStorageError | E::NetworkException => {
                Try::Again(PublishError::new(Failure::Throttled, why, false), true)
            }
            e if e.is_retriable() => Try::Again(PublishError::new(Failure::Throttled, why, false), false),
            _ => Try::Refused(PublishError::new(Failure::BrokerRefused, why, false)),
        }
    }

    /// The batch as Kafka's record batch (v2), numbered from the lane's next sequence.
    fn encode(&self, batch: &[Pending]) -> Result<Bytes, PublishError> {
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().as_millis() as i64;
        let (producer_id, producer_epoch) = self.cluster.producer;
        let records: Vec<Record> = batch
            .iter()
            .enumerate()
            .map(|(i, p)| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id,
                producer_epoch,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: self.sequence + i as i32,
                timestamp: now,
                key: Some(Bytes::from(p.key.clone())),
                value: Some(p.message.body.clone()),
                headers: p
                    .message
                    .headers
                    .iter()
                    .map(|(n, v)| (StrBytes::from_string(n.clone()), Some(Bytes::from(v.clone()))))
                    .collect(),
            })
            .collect();
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        RecordBatchEncoder::encode(&mut buf, &records, &options)
            .map_err(|e| PublishError::new(Failure::Internal, format!("encoding the record batch: {e}"), false))?;
        Ok(buf.freeze())
    }
}

/// What one try of a batch came to.
enum Try {
    /// Written at this base offset (-1: already written by an earlier try).
    Written(i64, Duration),
    /// Refused for good: the batch was not written.
    Refused(PublishError),
    /// Worth trying again; whether this try may have written it.
    Again(PublishError, bool),
}
