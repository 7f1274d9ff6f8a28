//! The Amazon destination types (SQS, SNS, EventBridge): what their settings must look
//! like, and the service endpoint a destination uses when it names none. These are HTTPS
//! APIs: the "broker" is the service's endpoint URL, and the credentials are an IAM access
//! key (`username` the access key id, `password` the secret access key).

use url::Url;

use super::{Kind, MAX_NAME, plain_name};

/// Longest queue name SQS takes (with `.fifo`), and topic name SNS takes.
const MAX_QUEUE_NAME: usize = 80;
const MAX_TOPIC_NAME: usize = 256;

/// The endpoint of the service in `region`, when the destination names none: the queue
/// URL's origin for SQS (a queue URL is on its service's endpoint), else the regional
/// public endpoint.
pub(super) fn default_broker(kind: &Kind) -> Option<String> {
    let (service, region) = match kind {
        Kind::Sqs { queue_url, .. } => {
            let url = Url::parse(queue_url).ok()?;
            return matches!(url.scheme(), "http" | "https").then(|| url.origin().ascii_serialization());
        }
        Kind::Sns { region, .. } => ("sns", region),
        Kind::EventBridge { region, .. } => ("events", region),
        _ => return None,
    };
    check_region(region).ok()?;
    Some(format!("https://{service}.{region}.amazonaws.com"))
}

/// Every problem with an Amazon type's settings, by field.
pub(super) fn problems(kind: &Kind, push: &mut dyn FnMut(&str, String)) {
    let region = match kind {
        Kind::Sqs { queue_url, region, .. } => {
            if let Err(why) = queue_name(queue_url) {
                push("queueUrl", why);
            }
            region
        }
        Kind::Sns { topic_arn, region, .. } => {
            if let Err(why) = topic_name(topic_arn) {
                push("topicArn", why);
            }
            region
        }
        Kind::EventBridge { event_bus, region, source } => {
            if let Err(why) = event_bus_name(event_bus) {
                push("eventBus", why);
            }
            if let Err(why) = plain_name(source) {
                push("source", why);
            } else if source.to_ascii_lowercase().starts_with("aws.") {
                push("source", "must not start with \"aws.\" (reserved for AWS services)".into());
            }
            region
        }
        _ => return,
    };
    if let Err(why) = check_region(region) {
        push("region", why);
    }
}

/// Whether messages go to a FIFO queue or topic (which need a message group and a
/// deduplication id).
pub fn is_fifo(kind: &Kind) -> bool {
    match kind {
        Kind::Sqs { queue_url, .. } => queue_url.trim_end_matches('/').ends_with(".fifo"),
        Kind::Sns { topic_arn, .. } => topic_arn.ends_with(".fifo"),
        _ => false,
    }
}

/// An AWS region name: `us-east-1`, `eu-central-2`, `us-gov-west-1`, …
fn check_region(region: &str) -> Result<(), String> {
    let parts: Vec<&str> = region.split('-').collect();
    let shaped = parts.len() >= 3
        && region.len() <= 32
        && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()))
        && parts.last().is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit()));
    if shaped { Ok(()) } else { Err("must be an AWS region name (us-east-1)".into()) }
}

/// The queue a queue URL names (`https://sqs.us-east-1.amazonaws.com/123456789012/orders`).
fn queue_name(queue_url: &str) -> Result<(), String> {
    let shape = || "must be a queue URL (https://sqs.us-east-1.amazonaws.com/123456789012/orders)".to_owned();
    if queue_url.len() > crate::ssrf::MAX_URL_LEN {
        return Err(shape());
    }
    let url = Url::parse(queue_url).map_err(|_| shape())?;
    if !matches!(url.scheme(), "http" | "https") || url.query().is_some() || url.fragment().is_some() {
        return Err(shape());
    }
    let segments: Vec<&str> = url.path().trim_matches('/').split('/').collect();
    let [account, name] = segments[..] else { return Err(shape()) };
    if account.is_empty() || !account.bytes().all(|b| b.is_ascii_digit()) {
        return Err(shape());
    }
    resource_name(name, MAX_QUEUE_NAME, "a queue")
}

/// The topic a topic ARN names (`arn:aws:sns:us-east-1:123456789012:orders`).
fn topic_name(arn: &str) -> Result<(), String> {
    let shape = || "must be a topic ARN (arn:aws:sns:us-east-1:123456789012:orders)".to_owned();
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    let ["arn", partition, "sns", region, account, name] = parts[..] else { return Err(shape()) };
    if partition.is_empty() || check_region(region).is_err() || account.len() != 12 {
        return Err(shape());
    }
    if !account.bytes().all(|b| b.is_ascii_digit()) {
        return Err(shape());
    }
    resource_name(name, MAX_TOPIC_NAME, "a topic")
}

/// An event bus: its name (`default`, `orders`) or its ARN.
fn event_bus_name(bus: &str) -> Result<(), String> {
    if bus.starts_with("arn:") {
        let (_, name) = bus.split_once(":event-bus/").ok_or("an event bus ARN ends in :event-bus/<name>")?;
        return event_bus_name(name);
    }
    if bus.is_empty() || bus.len() > MAX_NAME {
        return Err(format!("must be 1 to {MAX_NAME} bytes"));
    }
    if !bus.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-/".contains(&b)) {
        return Err("must be letters, digits, '.', '_', '-' and '/' (an event bus name or ARN)".into());
    }
    Ok(())
}

/// A queue or topic name: letters, digits, `-` and `_`, with an optional `.fifo` suffix.
fn resource_name(name: &str, max: usize, what: &str) -> Result<(), String> {
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    if name.len() > max || stem.is_empty() {
        return Err(format!("{what}'s name is 1 to {max} characters"));
    }
    if !stem.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(format!("{what}'s name is letters, digits, '-' and '_' (and .fifo at the end)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::destinations::PartitionKey;

    #[test]
    fn queue_urls_topic_arns_and_regions_are_checked() {
        assert!(queue_name("https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo").is_ok());
        assert!(queue_name("http://127.0.0.1:4566/000000000000/orders/").is_ok());
        for refused in [
            "https://sqs.eu-west-1.amazonaws.com/orders",
            "https://sqs.eu-west-1.amazonaws.com/12x/orders",
            "https://sqs.eu-west-1.amazonaws.com/123/or ders",
            "ftp://sqs.eu-west-1.amazonaws.com/123/orders",
            "https://sqs.eu-west-1.amazonaws.com/123/orders?x=1",
        ] {
            assert!(queue_name(refused).is_err(), "{refused}");
        }
        assert!(topic_name("arn:aws:sns:us-east-1:123456789012:orders").is_ok());
        assert!(topic_name("arn:aws:sns:us-east-1:1234:orders").is_err());
        assert!(topic_name("arn:aws:sqs:us-east-1:123456789012:orders").is_err());
        for region in ["us-east-1", "us-gov-west-1", "ap-southeast-4"] {
            assert!(check_region(region).is_ok(), "{region}");
        }
        for region in ["", "us-east", "US-EAST-1", "us-east-1a", "us--1"] {
            assert!(check_region(region).is_err(), "{region}");
        }
        assert!(event_bus_name("arn:aws:events:us-east-1:123456789012:event-bus/orders").is_ok());
        assert!(event_bus_name("orders bus").is_err());
    }

    #[test]
    fn a_destination_without_an_endpoint_uses_its_services_public_one() {
        let sqs = Kind::Sqs {
            queue_url: "http://127.0.0.1:5000/123456789012/orders".into(),
            region: "us-east-1".into(),
            partition_key: PartitionKey::default(),
        };
        assert_eq!(default_broker(&sqs).as_deref(), Some("http://127.0.0.1:5000"));
        let bus = Kind::EventBridge { event_bus: "orders".into(), region: "eu-west-3".into(), source: "shop".into() };
        assert_eq!(default_broker(&bus).as_deref(), Some("https://events.eu-west-3.amazonaws.com"));
        assert!(is_fifo(&Kind::Sns {
            topic_arn: "arn:aws:sns:us-east-1:123456789012:orders.fifo".into(),
            region: "us-east-1".into(),
            partition_key: PartitionKey::Channel,
        }));
    }
}
