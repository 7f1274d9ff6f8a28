//! Event destinations (Herald extension): an endpoint that publishes its messages to a
//! message broker the customer owns instead of POSTing them to a URL. The endpoint keeps
//! every guarantee of an HTTP one (retries, breakers, fairness, dead letters, replay,
//! filters, transforms, metrics, spans): only the last step of an attempt differs.
//!
//! This module is what a destination is ([`Destination`]: its type's settings, the
//! broker's address and the credentials), how it is checked when set, the URL it reads
//! back as, and what reads show of it. Publishing is the sending side of an attempt, in
//! `deliver::brokers`: the message, the broker connections, one file per protocol.
//!
//! The whole destination, credentials included, is sealed at rest on the endpoint's row
//! (`sealing::Purpose::Destination`); reads show it without the secrets. The Amazon types'
//! own rules are in `aws.rs`, Kafka's in `kafka.rs`.

use serde::{Deserialize, Serialize};
use url::Url;

use crate::ssrf::Guard;

mod aws;
mod kafka;

pub use aws::is_fifo;
pub use kafka::SaslMechanism;

/// Longest stream, subject, exchange, routing key or credential accepted.
const MAX_NAME: usize = 255;
const MAX_SECRET: usize = 1024;
/// Largest `maxMessageBytes` accepted (the payload limit is far below it anyway).
const MAX_MESSAGE_BYTES: u32 = 64 * 1024 * 1024;

/// Where an endpoint's messages go, when not to an HTTP URL.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Destination {
    /// The destination's type and where on the broker messages go.
    #[serde(flatten)]
    pub kind: Kind,
    /// The broker's address as a URL: `redis://host:6379/0` (`rediss://` for TLS),
    /// `nats://host:4222` (`tls://` for TLS), `amqp://host:5672/vhost` (`amqps://`),
    /// `kafka://host:9092` (`kafkas://`; one bootstrap broker, the others are found); for
    /// the Amazon types the service's endpoint (`https://sqs.us-east-1.amazonaws.com`),
    /// which may be left out: the queue URL's origin for SQS, the region's public endpoint
    /// for SNS and EventBridge. No user or password in it: those go in `credentials`.
    #[serde(default)]
    pub broker: String,
    /// How Herald authenticates to the broker (write-only; kept when an update leaves
    /// it out). For the Amazon types an IAM access key: `username` is the access key id,
    /// `password` the secret access key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<BrokerCredentials>,
    /// Messages with a larger body fail permanently (`message_too_large`) without being
    /// published; the broker's own limit applies as well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<u32>,
}

/// A destination's type and its place on the broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "camelCase")]
#[schema(as = DestinationKind)]
pub enum Kind {
    /// Redis Streams: each message is an `XADD` entry; delivered once Redis answers with
    /// the entry's id.
    #[serde(rename_all = "camelCase")]
    RedisStreams {
        stream: String,
        /// Create the stream if it does not exist; by default a missing stream is a
        /// `destination_missing` failure (`XADD … NOMKSTREAM`), so a typo is not a stream
        /// nobody reads.
        #[serde(default)]
        create_stream: bool,
        /// Trim the stream to about this many entries at each add (`MAXLEN ~`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_len: Option<u64>,
    },
    /// NATS JetStream: each message is published to `subject` with its headers;
    /// delivered once the stream that takes the subject acknowledges it (JetStream's
    /// publish ack). No stream taking the subject is a `destination_missing` failure.
    #[serde(rename_all = "camelCase")]
    NatsJetStream { subject: String },
    /// RabbitMQ (AMQP 0-9-1): each message is published, persistent and mandatory, to
    /// `exchange` (`""`, the default exchange, routes by queue name) with `routingKey`;
    /// delivered once the broker confirms it (publisher confirms). A message no queue takes
    /// comes back unroutable: a `destination_missing` failure, as is a missing exchange.
    #[serde(rename_all = "camelCase")]
    Rabbitmq {
        #[serde(default)]
        exchange: String,
        routing_key: String,
    },
    /// Amazon SQS: each message is sent (`SendMessage`) to `queueUrl`, its headers as
    /// message attributes; delivered on SQS's answer. A FIFO queue (`….fifo`) gets the
    /// `partitionKey`'s value as the message group and the message id as the
    /// deduplication id.
    #[serde(rename_all = "camelCase")]
    Sqs {
        queue_url: String,
        region: String,
        #[serde(default)]
        partition_key: PartitionKey,
    },
    /// Amazon SNS: each message is published (`Publish`) to `topicArn`, its headers as
    /// message attributes; delivered on SNS's answer. FIFO topics as for SQS.
    #[serde(rename_all = "camelCase")]
    Sns {
        topic_arn: String,
        region: String,
        #[serde(default)]
        partition_key: PartitionKey,
    },
    /// Amazon EventBridge: each message is one event (`PutEvents`) on `eventBus`, from
    /// `source`, its detail type the event type and its detail `{"headers": {…}, "body":
    /// "…"}` (the body exactly as signed); delivered when the entry is accepted (a failed
    /// entry fails the attempt with its error code).
    #[serde(rename_all = "camelCase")]
    EventBridge {
        event_bus: String,
        region: String,
        #[serde(default = "default_source")]
        source: String,
    },
    /// Apache Kafka: each message is one record on `topic`, its headers as record headers
    /// and the `partitionKey`'s value as the record key (so Kafka's partitioner keeps one
    /// key's records on one partition, in order); produced by an idempotent producer with
    /// `acks=all`, delivered once every in-sync replica has it. A missing topic is a
    /// `destination_missing` failure (Herald never creates topics). With credentials,
    /// Herald authenticates with SASL `saslMechanism`.
    #[serde(rename_all = "camelCase")]
    Kafka {
        topic: String,
        #[serde(default)]
        partition_key: PartitionKey,
        #[serde(default)]
        sasl_mechanism: SaslMechanism,
    },
}

fn default_source() -> String {
    "herald".into()
}

/// What a partitioned destination (a Kafka topic, an SQS FIFO queue, an SNS FIFO topic)
/// groups messages by: the broker keeps each group's messages in the order Herald
/// publishes them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum PartitionKey {
    /// The message's id (`webhook-id`): no two messages share a group.
    MessageId,
    /// The message's `eventId`, or its id when it has none.
    EventId,
    /// The message's first channel, or the application when it has none.
    Channel,
    /// The application: all of the endpoint's messages in one group.
    #[default]
    Application,
}

impl Kind {
    /// The type's name, as the API spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::RedisStreams { .. } => "redisStreams",
            Self::NatsJetStream { .. } => "natsJetStream",
            Self::Rabbitmq { .. } => "rabbitmq",
            Self::Sqs { .. } => "sqs",
            Self::Sns { .. } => "sns",
            Self::EventBridge { .. } => "eventBridge",
            Self::Kafka { .. } => "kafka",
        }
    }

    /// The partition key of the types that have one.
    pub fn partition_key(&self) -> Option<PartitionKey> {
        match self {
            Self::Sqs { partition_key, .. } | Self::Sns { partition_key, .. } | Self::Kafka { partition_key, .. } => {
                Some(*partition_key)
            }
            _ => None,
        }
    }

    /// Whether the destination is an HTTPS API (the Amazon types), reached through the
    /// webhook client rather than a broker connection.
    pub fn is_http_api(&self) -> bool {
        matches!(self, Self::Sqs { .. } | Self::Sns { .. } | Self::EventBridge { .. })
    }

    /// The broker URL schemes of this type: (plain, TLS).
    fn schemes(&self) -> (&'static str, &'static str) {
        match self {
            Self::RedisStreams { .. } => ("redis", "rediss"),
            Self::NatsJetStream { .. } => ("nats", "tls"),
            Self::Rabbitmq { .. } => ("amqp", "amqps"),
            Self::Kafka { .. } => ("kafka", "kafkas"),
            Self::Sqs { .. } | Self::Sns { .. } | Self::EventBridge { .. } => ("http", "https"),
        }
    }

    /// The broker's port when its URL names none.
    fn default_port(&self, tls: bool) -> u16 {
        match self {
            Self::RedisStreams { .. } => 6379,
            Self::NatsJetStream { .. } => 4222,
            Self::Rabbitmq { .. } if tls => 5671,
            Self::Rabbitmq { .. } => 5672,
            Self::Kafka { .. } if tls => 9093,
            Self::Kafka { .. } => 9092,
            _ if tls => 443,
            _ => 80,
        }
    }
}

/// What Herald presents to the broker.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BrokerCredentials {
    /// The user name (for the Amazon types, the access key id; `accessKeyId` is taken
    /// too).
    #[serde(default, alias = "accessKeyId", skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// The password (for the Amazon types, the secret access key; `secretAccessKey` is
    /// taken too).
    #[serde(default, alias = "secretAccessKey", skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

impl std::fmt::Debug for BrokerCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerCredentials")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl std::fmt::Debug for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Destination")
            .field("kind", &self.kind)
            .field("broker", &self.broker)
            .field("credentials", &self.credentials)
            .finish()
    }
}

/// A destination as reads show it: everything but the secrets.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DestinationOut {
    #[serde(flatten)]
    pub kind: Kind,
    pub broker: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsOut>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_message_bytes: Option<u32>,
}

/// The credentials as reads show them: the user name, and whether a password is set.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CredentialsOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    pub password_set: bool,
}

/// Where an attempt connects: the broker's host and port, whether over TLS.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Address {
    pub host: String,
    pub port: u16,
    pub tls: bool,
}

impl Destination {
    /// The destination with what it may leave out filled in (an Amazon type's endpoint).
    pub fn with_defaults(mut self) -> Self {
        if self.broker.is_empty()
            && let Some(broker) = aws::default_broker(&self.kind)
        {
            self.broker = broker;
        }
        self
    }

    /// The destination as reads show it.
    pub fn shown(&self) -> DestinationOut {
        DestinationOut {
            kind: self.kind.clone(),
            broker: self.broker.clone(),
            credentials: self
                .credentials
                .as_ref()
                .map(|c| CredentialsOut { username: c.username.clone(), password_set: c.password.is_some() }),
            max_message_bytes: self.max_message_bytes,
        }
    }

    /// The broker's address as stored (checked when set, so it parses).
    fn broker_url(&self) -> Option<Url> {
        Url::parse(&self.broker).ok()
    }

    /// Where to connect.
    pub fn address(&self) -> Option<Address> {
        let url = self.broker_url()?;
        let tls = url.scheme() == self.kind.schemes().1;
        let host = url.host_str()?.trim_start_matches('[').trim_end_matches(']').to_owned();
        Some(Address { host, port: url.port().unwrap_or(self.kind.default_port(tls)), tls })
    }

    /// The URL the endpoint reads back as (`url` in the Svix API): the broker's, with the
    /// place on it as a query (`redis://host:6379/0?stream=orders`,
    /// `nats://host:4222?subject=orders.paid`); for SQS the queue URL.
    pub fn read_back_url(&self) -> String {
        if let Kind::Sqs { queue_url, .. } = &self.kind {
            return queue_url.clone();
        }
        let Some(mut url) = self.broker_url() else { return self.broker.clone() };
        if url.port().is_none() {
            let _ = url.set_port(Some(self.kind.default_port(url.scheme() == self.kind.schemes().1)));
        }
        match &self.kind {
            Kind::RedisStreams { stream, .. } => url.query_pairs_mut().append_pair("stream", stream),
            Kind::NatsJetStream { subject } => url.query_pairs_mut().append_pair("subject", subject),
            Kind::Rabbitmq { exchange, routing_key } => {
                url.query_pairs_mut().append_pair("exchange", exchange).append_pair("routingKey", routing_key);
                return url.to_string();
            }
            Kind::Sqs { queue_url, .. } => url.query_pairs_mut().append_pair("queueUrl", queue_url),
            Kind::Sns { topic_arn, .. } => url.query_pairs_mut().append_pair("topicArn", topic_arn),
            Kind::EventBridge { event_bus, .. } => url.query_pairs_mut().append_pair("eventBus", event_bus),
            Kind::Kafka { topic, .. } => url.query_pairs_mut().append_pair("topic", topic),
        };
        url.to_string()
    }

    /// Every problem with the destination, by field (under `destination.`), judged by the
    /// destination guard like an HTTP URL.
    pub fn problems(&self, guard: &Guard) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut push = |field: &str, why: String| out.push((format!("destination.{field}"), why));
        if let Err(why) = self.check_broker(guard) {
            push("broker", why);
        }
        match &self.kind {
            Kind::RedisStreams { stream, max_len, .. } => {
                if let Err(why) = plain_name(stream) {
                    push("stream", why);
                }
                if *max_len == Some(0) {
                    push("maxLen", "must be at least 1".into());
                }
            }
            Kind::NatsJetStream { subject } => {
                if let Err(why) = nats_subject(subject) {
                    push("subject", why);
                }
            }
            Kind::Rabbitmq { exchange, routing_key } => {
                if !exchange.is_empty()
                    && let Err(why) = plain_name(exchange)
                {
                    push("exchange", why);
                }
                if routing_key.len() > MAX_NAME || routing_key.chars().any(char::is_control) {
                    push("routingKey", format!("must be at most {MAX_NAME} bytes, without control characters"));
                } else if exchange.is_empty() && routing_key.is_empty() {
                    push("routingKey", "names the queue when the exchange is the default one (\"\")".into());
                }
            }
            Kind::Sqs { .. } | Kind::Sns { .. } | Kind::EventBridge { .. } => aws::problems(&self.kind, &mut push),
            Kind::Kafka { topic, .. } => {
                if let Err(why) = kafka::topic(topic) {
                    push("topic", why);
                }
            }
        }
        if let Some(c) = &self.credentials {
            for (field, part) in [("credentials.username", &c.username), ("credentials.password", &c.password)] {
                if part.as_ref().is_some_and(|p| p.len() > MAX_SECRET || p.chars().any(char::is_control)) {
                    push(field, format!("must be at most {MAX_SECRET} bytes, without control characters"));
                }
            }
            if c.username.is_some() && c.password.is_none() {
                push("credentials.password", "is needed with a username".into());
            }
        }
        let key = self.credentials.as_ref().is_some_and(|c| c.username.is_some() && c.password.is_some());
        if self.kind.is_http_api() && !key {
            push("credentials", "an IAM access key: username (the access key id) and password (the secret)".into());
        }
        if self.max_message_bytes.is_some_and(|m| m == 0 || m > MAX_MESSAGE_BYTES) {
            push("maxMessageBytes", format!("must be between 1 and {MAX_MESSAGE_BYTES}"));
        }
        out
    }

    fn check_broker(&self, guard: &Guard) -> Result<(), String> {
        if self.broker.len() > crate::ssrf::MAX_URL_LEN {
            return Err(format!("is longer than {} bytes", crate::ssrf::MAX_URL_LEN));
        }
        if self.broker.chars().any(|c| c.is_whitespace() || c.is_control() || c == '\\') {
            return Err("contains whitespace, a control character or a backslash".into());
        }
        let url = Url::parse(&self.broker).map_err(|e| format!("is not a valid URL: {e}"))?;
        let (plain, tls) = self.kind.schemes();
        if url.scheme() != plain && url.scheme() != tls {
            return Err(format!("a {} broker's URL starts with {plain}:// or {tls}://", self.kind.name()));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err("takes no query or fragment".into());
        }
        guard.check_authority(&url).map_err(|problem| match problem {
            crate::ssrf::UrlProblem::Userinfo => "must not carry a user name or password (use credentials)".into(),
            other => other.to_string(),
        })?;
        match &self.kind {
            Kind::RedisStreams { .. } => redis_db(&url).map(drop),
            Kind::NatsJetStream { .. } if !matches!(url.path(), "" | "/") => {
                Err("names no path (nats://host:4222)".into())
            }
            Kind::NatsJetStream { .. } => Ok(()),
            Kind::Rabbitmq { .. } => amqp_vhost(&url).map(drop),
            Kind::Kafka { .. } if !matches!(url.path(), "" | "/") => Err("names no path (kafka://host:9092)".into()),
            _ if !matches!(url.path(), "" | "/") => Err("names no path (https://sqs.us-east-1.amazonaws.com)".into()),
            _ => Ok(()),
        }
    }

    /// The RabbitMQ virtual host the broker URL names (`/` when none does).
    pub fn amqp_vhost(&self) -> String {
        self.broker_url().and_then(|url| amqp_vhost(&url).ok()).unwrap_or_else(|| "/".into())
    }

    /// The Redis database the broker URL names (0 when none does).
    pub fn redis_db(&self) -> i64 {
        self.broker_url().and_then(|url| redis_db(&url).ok()).unwrap_or(0)
    }
}

/// The database number in a Redis URL's path (`/0`; none: 0).
fn redis_db(url: &Url) -> Result<i64, String> {
    match url.path().trim_start_matches('/') {
        "" => Ok(0),
        db => db.parse::<u16>().map(i64::from).map_err(|_| "names its database by number (redis://host:6379/0)".into()),
    }
}

/// The virtual host in an AMQP URL's path: `/` when empty, else the one percent-encoded
/// segment after the slash (`amqp://host/%2F` is `/`, `amqp://host/orders` is `orders`).
fn amqp_vhost(url: &Url) -> Result<String, String> {
    let path = url.path().strip_prefix('/').unwrap_or_default();
    if path.is_empty() {
        return Ok("/".into());
    }
    if path.contains('/') {
        return Err("names one virtual host (amqp://host:5672/vhost; %2F for \"/\")".into());
    }
    let vhost = percent_encoding::percent_decode_str(path).decode_utf8().map_err(|_| "a virtual host is UTF-8")?;
    plain_name(&vhost).map(|()| vhost.into_owned())
}

/// A subject to publish to: dot-separated tokens, none empty, no wildcards (`*`, `>`).
fn nats_subject(subject: &str) -> Result<(), String> {
    plain_name(subject)?;
    if subject.split('.').any(|token| token.is_empty() || token == "*" || token == ">") {
        return Err("must be dot-separated names, none empty and no wildcard (orders.paid)".into());
    }
    Ok(())
}

/// A stream, queue or exchange name: non-empty, bounded, printable, no spaces.
fn plain_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(format!("must be 1 to {MAX_NAME} bytes"));
    }
    if name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("must not contain whitespace or control characters".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn redis(broker: &str) -> Destination {
        Destination {
            kind: Kind::RedisStreams { stream: "orders".into(), create_stream: false, max_len: None },
            broker: broker.into(),
            credentials: None,
            max_message_bytes: None,
        }
    }

    #[test]
    fn a_broker_reads_back_with_its_place_and_port() {
        assert_eq!(redis("redis://broker.example/2").read_back_url(), "redis://broker.example:6379/2?stream=orders");
        let address = redis("rediss://broker.example:7000").address().unwrap();
        assert_eq!(address, Address { host: "broker.example".into(), port: 7000, tls: true });
    }

    #[test]
    fn broker_addresses_pass_the_destination_guard() {
        let guard = Guard::new(vec![]);
        let field =
            |d: Destination| d.problems(&guard).into_iter().map(|(f, w)| format!("{f}: {w}")).collect::<Vec<_>>();
        assert!(field(redis("redis://broker.example:6379/0")).is_empty());
        for refused in
            ["redis://127.0.0.1:6379", "redis://[::1]:6379", "redis://169.254.169.254:6379", "redis://localhost:6379"]
        {
            let problems = field(redis(refused));
            assert!(
                problems.iter().any(|p| p.starts_with("destination.broker: destination")),
                "{refused}: {problems:?}"
            );
        }
        assert!(field(redis("redis://u:p@broker.example:6379"))[0].contains("use credentials"));
        assert!(field(redis("http://broker.example"))[0].contains("redis:// or rediss://"));
        assert!(field(redis("redis://broker.example:6379/zero"))[0].contains("by number"));
        assert!(field(redis("redis://broker.example:25"))[0].contains("port 25"));
    }

    #[test]
    fn a_nats_subject_is_a_plain_subject() {
        let guard = Guard::new(vec![]);
        let nats = |subject: &str, broker: &str| Destination {
            kind: Kind::NatsJetStream { subject: subject.into() },
            broker: broker.into(),
            credentials: None,
            max_message_bytes: None,
        };
        assert!(nats("orders.paid", "nats://broker.example").problems(&guard).is_empty());
        assert_eq!(
            nats("orders.paid", "tls://broker.example").read_back_url(),
            "tls://broker.example:4222?subject=orders.paid"
        );
        for refused in ["orders.*", "orders.>", "orders..paid", ".orders", "orders paid", ""] {
            let problems = nats(refused, "nats://broker.example").problems(&guard);
            assert_eq!(problems.len(), 1, "{refused}: {problems:?}");
            assert_eq!(problems[0].0, "destination.subject");
        }
        assert!(nats("orders", "nats://broker.example/x").problems(&guard)[0].1.contains("no path"));
        assert!(nats("orders", "redis://broker.example").problems(&guard)[0].1.contains("nats:// or tls://"));
    }

    #[test]
    fn a_rabbitmq_broker_names_its_virtual_host() {
        let guard = Guard::new(vec![]);
        let rabbit = |broker: &str, exchange: &str, routing_key: &str| Destination {
            kind: Kind::Rabbitmq { exchange: exchange.into(), routing_key: routing_key.into() },
            broker: broker.into(),
            credentials: None,
            max_message_bytes: None,
        };
        for (broker, vhost) in [
            ("amqp://mq.example", "/"),
            ("amqp://mq.example/", "/"),
            ("amqp://mq.example/%2F", "/"),
            ("amqps://mq.example/shop", "shop"),
        ] {
            assert_eq!(rabbit(broker, "", "orders").amqp_vhost(), vhost, "{broker}");
        }
        let secure = rabbit("amqps://mq.example/shop", "events", "order.paid");
        assert_eq!(secure.address().unwrap().port, 5671);
        assert_eq!(secure.read_back_url(), "amqps://mq.example:5671/shop?exchange=events&routingKey=order.paid");
        assert!(rabbit("amqp://mq.example/a/b", "", "q").problems(&guard)[0].1.contains("one virtual host"));
        assert_eq!(rabbit("amqp://mq.example", "", "").problems(&guard)[0].0, "destination.routingKey");
        assert!(rabbit("amqp://mq.example", "fanout", "").problems(&guard).is_empty());
    }

    #[test]
    fn reads_show_no_secret() {
        let mut d = redis("redis://broker.example");
        d.credentials = Some(BrokerCredentials { username: Some("herald".into()), password: Some("s3cret".into()) });
        let shown = serde_json::to_string(&d.shown()).unwrap();
        assert!(!shown.contains("s3cret") && shown.contains("\"passwordSet\":true"), "{shown}");
        assert!(!format!("{d:?}").contains("s3cret"));
    }
}
