//! The Kafka destination type: what its topic must look like, and how Herald
//! authenticates. The broker URL names one bootstrap broker (`kafka://host:9092`,
//! `kafkas://host:9093` for TLS); the cluster's other brokers are learnt from it, and each
//! passes the destination guard when Herald connects to it.

use serde::{Deserialize, Serialize};

/// Longest topic name Kafka takes.
const MAX_TOPIC: usize = 249;

/// The SASL mechanism Herald authenticates with, when the destination has credentials.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub enum SaslMechanism {
    /// The password never crosses the wire (RFC 7677, with SHA-512).
    #[default]
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    /// The password itself, so only over TLS (`kafkas://`) unless the network is trusted.
    #[serde(rename = "PLAIN")]
    Plain,
}

impl SaslMechanism {
    /// The mechanism's name, as Kafka spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::ScramSha512 => "SCRAM-SHA-512",
            Self::ScramSha256 => "SCRAM-SHA-256",
            Self::Plain => "PLAIN",
        }
    }
}

/// A topic name as Kafka takes it: 1 to 249 of `[A-Za-z0-9._-]`, not `.` or `..`.
pub(super) fn topic(topic: &str) -> Result<(), String> {
    let legal = topic.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if topic.is_empty() || topic.len() > MAX_TOPIC || !legal || topic == "." || topic == ".." {
        return Err(format!("must be 1 to {MAX_TOPIC} letters, digits, '.', '_' or '-' (orders.paid)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::destinations::{Destination, Kind, PartitionKey};
    use crate::ssrf::Guard;

    fn kafka(broker: &str, topic: &str) -> Destination {
        Destination {
            kind: Kind::Kafka {
                topic: topic.into(),
                partition_key: PartitionKey::default(),
                sasl_mechanism: SaslMechanism::default(),
            },
            broker: broker.into(),
            credentials: None,
            max_message_bytes: None,
        }
    }

    #[test]
    fn a_kafka_destination_names_a_legal_topic_on_one_bootstrap_broker() {
        let guard = Guard::new(vec![]);
        assert!(kafka("kafka://kafka.example", "orders.paid").problems(&guard).is_empty());
        assert_eq!(kafka("kafka://kafka.example", "orders").read_back_url(), "kafka://kafka.example:9092?topic=orders");
        assert_eq!(kafka("kafkas://kafka.example", "orders").address().unwrap().port, 9093);
        for refused in ["", ".", "..", "orders paid", "orders/paid", "ordres*", &"o".repeat(250)] {
            let problems = kafka("kafka://kafka.example", refused).problems(&guard);
            assert_eq!(problems.len(), 1, "{refused}: {problems:?}");
            assert_eq!(problems[0].0, "destination.topic");
        }
        assert!(kafka("kafka://kafka.example/x", "orders").problems(&guard)[0].1.contains("no path"));
        assert!(kafka("amqp://kafka.example", "orders").problems(&guard)[0].1.contains("kafka:// or kafkas://"));
        assert!(kafka("kafka://127.0.0.1:9092", "orders").problems(&guard)[0].1.starts_with("destination"));
        let mechanism: SaslMechanism = serde_json::from_str("\"SCRAM-SHA-256\"").unwrap();
        assert_eq!(mechanism.name(), "SCRAM-SHA-256");
        assert!(serde_json::from_str::<SaslMechanism>("\"GSSAPI\"").is_err());
    }
}
