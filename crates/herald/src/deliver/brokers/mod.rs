//! The sending side of an attempt to an event destination (`crate::destinations`): the
//! message (`message.rs`), one file per broker protocol (`redis.rs`, `nats.rs`, `amqp.rs`:
//! connect, publish, classify errors), Kafka's own producer (`kafka/`), the Amazon
//! services, which are HTTPS APIs sent through the webhook client (`aws/`), and here the
//! broker connections: one per destination
//! identity (type, broker, credentials, TLS settings and egress proxy), shared by every
//! attempt to it (each protocol's handle multiplexes), kept in a bounded cache where no
//! application holds more than its share. A connection that breaks is dropped and made
//! again on the next attempt, after a full-jitter backoff that grows with each failed try,
//! so a dead broker is not dialled by every waiting attempt at once. Brokers are reached
//! only through the destination guard (`GuardedConnector::open`): a name is resolved and
//! judged at every connection.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::time::Instant;

mod amqp;
mod aws;
mod kafka;
mod message;
mod nats;
mod redis;

use message::{Outbound, partition};

use super::clients::ClientCache;
use super::{ConnectError, GuardedConnector, Outgoing, ResolveError, Resolver, Sent};
use crate::catalog::Target;
use crate::destinations::{Address, Destination, Kind};
use crate::egress::EgressProxy;
use crate::outcome::{AttemptResult, Failure};
use crate::ssrf::Guard;

/// Connections kept at most, and per application.
const MAX_CONNECTIONS: usize = 256;
const MAX_CONNECTIONS_PER_APP: usize = 16;
/// The first reconnection waits up to this long; each failure doubles it, up to the cap.
const RECONNECT_BASE: Duration = Duration::from_millis(200);
const RECONNECT_CAP: Duration = Duration::from_secs(5);
/// For this long after Herald reconnects to a broker it had lost, a missing place is
/// retried, not dead-lettered: a restarted broker takes connections before it has
/// recovered its queues and streams (RabbitMQ answers NO_ROUTE meanwhile, for more than
/// 10 s after a kill on a loaded machine).
const RECOVERY_GRACE: Duration = Duration::from_secs(60);

/// A live connection of one protocol: a cheap handle every attempt clones.
#[derive(Clone)]
enum Connection {
    Redis(redis::Connection),
    Nats(nats::Connection),
    Amqp(amqp::Connection),
    Kafka(kafka::Connection),
}

/// Why an attempt failed, and whether its connection is broken (made again next time).
#[derive(Debug)]
pub(super) struct PublishError {
    pub failure: Failure,
    pub why: String,
    pub broken: bool,
}

impl PublishError {
    pub fn new(failure: Failure, why: impl Into<String>, broken: bool) -> Self {
        Self { failure, why: why.into(), broken }
    }
}

/// What a broker answered a published message with, recorded as the attempt's response.
pub(super) type Acknowledgement = String;

/// Opens guarded TCP (and TLS) streams to brokers.
#[derive(Clone)]
pub(super) struct Dialer {
    pub connector: GuardedConnector,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub budget: Duration,
}

impl Dialer {
    /// A TCP connection to `address` through the guard, within the set-up budget.
    pub async fn tcp(&self, address: &Address) -> Result<TcpStream, PublishError> {
        let opened = tokio::time::timeout(self.budget, self.connector.open(&address.host, address.port)).await;
        match opened {
            Err(_) => Err(PublishError::new(Failure::Timeout, "connecting to the broker took too long", true)),
            Ok(Err(e)) => Err(connect_failure(e)),
            Ok(Ok(stream)) => Ok(stream),
        }
    }

    /// The connection to `address`, over TLS if it asks for it (with the endpoint's CAs
    /// and client certificate, if it has them).
    pub async fn stream(&self, address: &Address) -> Result<Box<dyn Io>, PublishError> {
        let tcp = self.tcp(address).await?;
        if !address.tls {
            return Ok(Box::new(tcp));
        }
        self.tls(tcp, address).await
    }

    /// TLS over `tcp` to the broker at `address` (for protocols that say hello in plain
    /// text first).
    pub async fn tls(&self, tcp: TcpStream, address: &Address) -> Result<Box<dyn Io>, PublishError> {
        let config = self.tls.clone().ok_or_else(|| PublishError::new(Failure::Tls, "no TLS settings", true))?;
        let name = rustls::pki_types::ServerName::try_from(address.host.clone())
            .map_err(|e| PublishError::new(Failure::Tls, format!("the broker's name: {e}"), true))?;
        let handshake = tokio_rustls::TlsConnector::from(config).connect(name, tcp);
        match tokio::time::timeout(self.budget, handshake).await {
            Err(_) => Err(PublishError::new(Failure::Timeout, "the TLS handshake took too long", true)),
            Ok(Err(e)) => Err(PublishError::new(Failure::Tls, format!("TLS with the broker: {e}"), true)),
            Ok(Ok(stream)) => Ok(Box::new(stream)),
        }
    }
}

/// A broker connection's byte stream: plain TCP or TLS over it.
pub(super) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

fn connect_failure(e: ConnectError) -> PublishError {
    let failure = match &e {
        ConnectError::Resolve(ResolveError::Blocked(_)) => Failure::BlockedDestination,
        ConnectError::Resolve(ResolveError::NotFound(_)) => Failure::DnsNotFound,
        ConnectError::Resolve(ResolveError::Temporary(..)) => Failure::DnsTemporary,
        ConnectError::Timeout(_) => Failure::Timeout,
        ConnectError::Io(..) | ConnectError::NoHost | ConnectError::Proxy(_) => Failure::Connection,
    };
    PublishError::new(failure, format!("the broker: {e}"), true)
}

/// One destination identity's connection, and its reconnection backoff.
#[derive(Default)]
struct Slot {
    state: tokio::sync::Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    connection: Option<(u64, Connection)>,
    generation: u64,
    failures: u32,
    retry_at: Option<Instant>,
    /// Why the last try failed: attempts during the backoff fail the same way.
    last_failure: Option<(Failure, String)>,
    /// Until when the connection, made again after a lost one, is in `RECOVERY_GRACE`.
    recovering_until: Option<Instant>,
}

/// The broker connections of every event destination.
pub struct Publishers {
    resolver: Resolver,
    guard: Arc<Guard>,
    connect_budget: Duration,
    setup_budget: Duration,
    proxy: Option<EgressProxy>,
    plain_tls: Arc<rustls::ClientConfig>,
    slots: Mutex<ClientCache<[u8; 32], Arc<Slot>>>,
}

impl Publishers {
    pub fn new(
        resolver: Resolver,
        guard: Arc<Guard>,
        budgets: (Duration, Duration),
        proxy: Option<EgressProxy>,
        plain_tls: rustls::ClientConfig,
    ) -> Self {
        Self {
            resolver,
            guard,
            connect_budget: budgets.0,
            setup_budget: budgets.1,
            proxy,
            plain_tls: Arc::new(plain_tls),
            slots: Mutex::new(ClientCache::new(MAX_CONNECTIONS, MAX_CONNECTIONS_PER_APP)),
        }
    }

    /// Publishes one attempt to the target's destination within the attempt's timeout;
    /// delivered only on the broker's durable acknowledgement.
    pub async fn publish(&self, destination: &Destination, out: &Outgoing<'_>) -> Sent {
        let started = Instant::now();
        let outcome = tokio::time::timeout(out.timeout(), self.try_publish(destination, out)).await;
        let duration = started.elapsed();
        match outcome {
            Err(_) => Sent::failed(Failure::Timeout, "the broker did not acknowledge in time", duration),
            Ok(Err(e)) => Sent::failed(e.failure, e.why, duration),
            Ok(Ok(ack)) => Sent {
                result: AttemptResult::Response { status: 200, retry_after: None },
                duration,
                body: ack,
                error: None,
                url: None,
            },
        }
    }

    async fn try_publish(
        &self,
        destination: &Destination,
        out: &Outgoing<'_>,
    ) -> Result<Acknowledgement, PublishError> {
        let message = outbound(destination, out)?;
        let slot = self.slot(out.target, destination);
        let (generation, connection) = self.connection(&slot, out.target, destination).await?;
        let mut published = match (&connection, &destination.kind) {
            (Connection::Redis(c), Kind::RedisStreams { stream, create_stream, max_len }) => {
                redis::publish(c.clone(), stream, *create_stream, *max_len, &message).await
            }
            (Connection::Nats(c), Kind::NatsJetStream { subject }) => c.publish(subject, &message).await,
            (Connection::Amqp(c), Kind::Rabbitmq { exchange, routing_key }) => {
                c.publish(exchange, routing_key, &message).await
            }
            (Connection::Kafka(c), Kind::Kafka { topic, partition_key, .. }) => {
                // `maxMessageBytes` bounds the body (checked above); Kafka's own limit, the
                // whole record's, is its default unless the destination allows more.
                let max = kafka::DEFAULT_MAX_MESSAGE.max(destination.max_message_bytes.unwrap_or(0) as usize);
                // Settled a little before the attempt's own timeout, so its outcome is known.
                let deadline = Instant::now() + out.timeout().mul_f32(0.9);
                c.publish(topic, partition(*partition_key, out.message), &message, max, deadline).await
            }
            _ => Err(PublishError::new(Failure::Internal, "the connection is of another type", true)),
        };
        if let Err(e) = &mut published {
            let mut state = slot.state.lock().await;
            if e.broken && state.connection.as_ref().is_some_and(|(g, _)| *g == generation) {
                state.connection = None;
            }
            // Not a refusal that closed the connection's channel (a missing RabbitMQ
            // exchange): retrying it would close its neighbours' channel again and again.
            if e.failure == Failure::DestinationMissing
                && !e.broken
                && state.recovering_until.is_some_and(|t| t > Instant::now())
            {
                e.failure = Failure::Throttled;
                e.why += " (the broker was just reconnected and may still be recovering it: retried)";
            }
        }
        published
    }

    /// The slot of the target's destination identity.
    fn slot(&self, target: &Target, destination: &Destination) -> Arc<Slot> {
        let key = identity(target, destination);
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.get_or_make(&target.endpoint.app_id, &key, Default::default)
    }

    /// The slot's connection, made now if there is none and its backoff has passed.
    async fn connection(
        &self,
        slot: &Slot,
        target: &Target,
        destination: &Destination,
    ) -> Result<(u64, Connection), PublishError> {
        let mut state = slot.state.lock().await;
        if let Some(live) = &state.connection {
            return Ok(live.clone());
        }
        if let Some(at) = state.retry_at
            && at > Instant::now()
        {
            let (failure, last) = state.last_failure.clone().unwrap_or((Failure::Connection, String::new()));
            let wait = (at - Instant::now()).as_millis();
            let why = format!("{last} (reconnecting in {wait} ms, after {} failed tries)", state.failures);
            return Err(PublishError::new(failure, why, false));
        }
        match self.connect(target, destination).await {
            Ok(connection) => {
                let after_loss = state.generation > 0 || state.failures > 0;
                state.recovering_until = after_loss.then(|| Instant::now() + RECOVERY_GRACE);
                state.generation += 1;
                state.failures = 0;
                state.retry_at = None;
                state.last_failure = None;
                state.connection = Some((state.generation, connection));
                Ok(state.connection.clone().expect("just set"))
            }
            Err(e) => {
                state.failures = state.failures.saturating_add(1);
                state.retry_at = Some(Instant::now() + reconnect_delay(state.failures));
                state.last_failure = Some((e.failure.clone(), e.why.clone()));
                Err(e)
            }
        }
    }

    async fn connect(&self, target: &Target, destination: &Destination) -> Result<Connection, PublishError> {
        let address = destination
            .address()
            .ok_or_else(|| PublishError::new(Failure::Internal, "the stored broker address does not parse", false))?;
        let tls = match &target.tls {
            Err(why) => return Err(PublishError::new(Failure::Tls, why.clone(), false)),
            Ok(Some(endpoint)) => Some(Arc::new(endpoint.config.clone())),
            Ok(None) => Some(self.plain_tls.clone()),
        };
        let proxy = target.proxy.clone().or_else(|| self.proxy.clone());
        let dialer = Dialer {
            connector: GuardedConnector::new(self.resolver.clone(), self.guard.clone(), self.connect_budget, proxy),
            tls,
            budget: self.setup_budget,
        };
        let credentials = destination.credentials.clone().unwrap_or_default();
        match &destination.kind {
            Kind::RedisStreams { .. } => {
                redis::connect(&dialer, &address, &credentials, destination.redis_db()).await.map(Connection::Redis)
            }
            Kind::NatsJetStream { .. } => nats::connect(&dialer, &address, &credentials).await.map(Connection::Nats),
            Kind::Rabbitmq { .. } => {
                amqp::connect(&dialer, &address, &credentials, destination.amqp_vhost()).await.map(Connection::Amqp)
            }
            Kind::Kafka { sasl_mechanism, .. } => {
                kafka::connect(&dialer, &address, &credentials, *sasl_mechanism).await.map(Connection::Kafka)
            }
            Kind::Sqs { .. } | Kind::Sns { .. } | Kind::EventBridge { .. } => {
                Err(PublishError::new(Failure::Internal, "an Amazon destination keeps no connection", false))
            }
        }
    }
}

/// The message `out` publishes, if it is within the destination's `maxMessageBytes`.
fn outbound(destination: &Destination, out: &Outgoing<'_>) -> Result<Outbound, PublishError> {
    let message = Outbound::of(out).map_err(|(failure, why)| PublishError::new(failure, why, false))?;
    if let Some(max) = destination.max_message_bytes
        && message.body.len() > max as usize
    {
        let why = format!("the message is {} bytes, more than the destination's {max}", message.body.len());
        return Err(PublishError::new(Failure::MessageTooLarge, why, false));
    }
    Ok(message)
}

/// What sets a connection apart: the destination's type, broker and credentials, and the
/// endpoint's TLS settings and proxy. Hashed, so no secret is kept as a key.
fn identity(target: &Target, destination: &Destination) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(destination.kind.name());
    h.update([0]);
    h.update(&destination.broker);
    h.update([0]);
    h.update(serde_json::to_vec(&destination.credentials).unwrap_or_default());
    h.update([0]);
    if let Ok(Some(tls)) = &target.tls {
        h.update(tls.fingerprint);
    }
    h.update([0]);
    let mut proxy = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&target.proxy, &mut proxy);
    h.update(std::hash::Hasher::finish(&proxy).to_le_bytes());
    h.finalize().into()
}

/// Full jitter over an exponential ceiling: uniformly up to 200 ms × 2^(failures − 1),
/// capped at 5 s.
fn reconnect_delay(failures: u32) -> Duration {
    let ceiling = RECONNECT_BASE.saturating_mul(1 << failures.saturating_sub(1).min(16)).min(RECONNECT_CAP);
    Duration::from_millis(rand::rng().random_range(0..=ceiling.as_millis() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reconnection_waits_grow_and_are_capped() {
        for _ in 0..100 {
            assert!(reconnect_delay(1) <= RECONNECT_BASE);
            assert!(reconnect_delay(3) <= RECONNECT_BASE * 4);
            assert!(reconnect_delay(60) <= RECONNECT_CAP);
        }
    }
}
