//! Redis Streams destinations against a real redis-server (`appendfsync always`, so an
//! entry Redis acknowledged survives a kill): the scenarios every type passes, read back
//! with `XRANGE`.

use std::collections::HashMap;

use herald_test_support::brokers::{Broker, free_port};
use redis::AsyncCommands;
use redis::streams::StreamRangeReply;
use serde_json::{Value, json};

use super::scenarios::{self, Fixture};
use super::{Consumed, tls_setup};

pub(super) const PASSWORD: &str = "broker-pa55";

pub(super) struct Redis(Broker);

impl Redis {
    /// A consumer's connection (made anew each time: the broker may have been restarted).
    async fn consumer(&self) -> Option<redis::aio::MultiplexedConnection> {
        let client = redis::Client::open(format!("redis://:{PASSWORD}@127.0.0.1:{}/0", self.0.port())).ok()?;
        client.get_multiplexed_async_connection().await.ok()
    }
}

impl Fixture for Redis {
    const AUTH_REFUSED: &'static str = "authentication failed";

    fn acknowledged(place: &str) -> String {
        format!("XADD {place} ")
    }

    async fn start() -> Self {
        Self(Broker::redis(Some(PASSWORD)).unwrap())
    }

    fn broker(&mut self) -> &mut Broker {
        &mut self.0
    }

    fn broker_port(&self) -> u16 {
        self.0.port()
    }

    /// A missing stream stays missing: `createStream` is what `exists` says.
    async fn destination(&self, place: &str, exists: bool) -> Value {
        json!({
            "type": "redisStreams",
            "broker": format!("redis://127.0.0.1:{}/0", self.0.port()),
            "stream": place,
            "createStream": exists,
            "credentials": {"password": PASSWORD},
        })
    }

    async fn read_all(&self, place: &str) -> Vec<Consumed> {
        let mut connection = self.consumer().await.expect("Redis answers");
        let mut entries = Vec::new();
        let mut from = "-".to_owned();
        loop {
            let page: StreamRangeReply = connection.xrange_count(place, &from, "+", 1000).await.unwrap();
            let Some(last) = page.ids.last() else { break };
            from = format!("({}", last.id);
            for entry in page.ids {
                let mut fields: HashMap<String, Vec<u8>> = entry
                    .map
                    .into_iter()
                    .map(|(name, value)| (name, redis::from_redis_value::<Vec<u8>>(value).unwrap()))
                    .collect();
                let body = fields.remove("body").expect("every entry has a body");
                let headers = fields.into_iter().map(|(k, v)| (k, String::from_utf8(v).unwrap())).collect();
                entries.push(Consumed { body, headers });
            }
        }
        entries
    }

    async fn count(&self, place: &str) -> Option<usize> {
        self.consumer().await?.xlen(place).await.ok()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_reach_the_stream_signed_and_none_is_lost_when_redis_is_killed() {
    scenarios::ten_thousand_messages_survive_a_broker_kill::<Redis>().await;
}

#[tokio::test]
async fn wrong_credentials_are_retried_until_corrected() {
    scenarios::wrong_credentials_are_retried_until_corrected::<Redis>().await;
}

#[tokio::test]
async fn a_missing_stream_and_an_oversized_message_are_dead_lettered_at_once() {
    scenarios::a_missing_place_and_an_oversized_message_are_dead_lettered_at_once::<Redis>().await;
}

#[tokio::test]
async fn filters_and_transforms_apply_before_publishing() {
    scenarios::filters_and_transforms_apply_before_publishing::<Redis>().await;
}

#[tokio::test]
async fn the_breaker_opens_on_a_dead_broker_and_closes_when_it_is_back() {
    scenarios::the_breaker_opens_on_a_dead_broker_and_closes_when_it_is_back::<Redis>().await;
}

#[tokio::test]
async fn a_stream_over_tls_takes_the_endpoints_client_certificate() {
    let tls = tls_setup();
    let tls_port = free_port().unwrap();
    let redis = Redis(Broker::redis_tls(Some(PASSWORD), tls.broker.clone(), tls_port).unwrap());
    let mut destination = redis.destination("orders", true).await;
    destination["broker"] = json!(format!("rediss://127.0.0.1:{tls_port}/0"));
    scenarios::tls_with_a_client_certificate(&redis, destination, &tls).await;
}
