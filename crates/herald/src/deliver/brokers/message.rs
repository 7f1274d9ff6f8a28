//! The message an attempt publishes: the payload (or the transform's output) as the body,
//! and as headers (or the broker's equivalent) the endpoint's own headers, then the
//! Standard Webhooks ones (`webhook-id`, `webhook-timestamp`, `webhook-signature`, signed
//! over the body exactly as for HTTP), the event type and the attempt number. A consumer
//! verifies and deduplicates it as it would a webhook.

use bytes::Bytes;

use crate::deliver::Outgoing;
use crate::destinations::PartitionKey;
use crate::outcome::Failure;
use crate::signing::signature_header;
use crate::store::Message;

/// One message, ready for any broker.
#[derive(Debug, Clone)]
pub struct Outbound {
    pub body: Bytes,
    /// (name, value), lower-case names, Herald's own last.
    pub headers: Vec<(String, String)>,
}

impl Outbound {
    /// The message `out` describes, or why none may be published.
    pub fn of(out: &Outgoing<'_>) -> Result<Self, (Failure, String)> {
        let target = out.target;
        if target.signing_keys(out.now).next().is_none() {
            return Err((Failure::Internal, "the endpoint has no usable signing secret".into()));
        }
        let own = target.headers.as_ref().ok_or_else(|| {
            (Failure::Internal, "the endpoint's headers cannot be opened with the configured server key".to_owned())
        })?;
        let (body, own): (Bytes, Vec<_>) = match out.rewrite {
            Some(rewrite) => (rewrite.body.clone(), rewrite.headers.iter().chain(target.sensitive_headers()).collect()),
            None => (Bytes::copy_from_slice(out.payload.as_bytes()), own.iter().collect()),
        };
        let id = out.message.id.to_string();
        let timestamp = out.now.div_euclid(1000);
        let signature = signature_header(target.signing_keys(out.now), &id, timestamp, &body);
        let mut headers: Vec<(String, String)> = own
            .into_iter()
            .filter_map(|(name, value)| Some((name.as_str().to_owned(), value.to_str().ok()?.to_owned())))
            .collect();
        headers.extend([
            ("content-type".to_owned(), "application/json".to_owned()),
            ("webhook-id".to_owned(), id),
            ("webhook-timestamp".to_owned(), timestamp.to_string()),
            ("webhook-signature".to_owned(), signature),
            ("herald-event-type".to_owned(), out.message.event_type.clone()),
            ("herald-attempt".to_owned(), out.attempt_no.to_string()),
        ]);
        Ok(Self { body, headers })
    }
}

/// The value the destination's partition key gives `message`: the key of its Kafka record,
/// the message group of its SQS or SNS FIFO message.
pub fn partition(key: PartitionKey, message: &Message) -> String {
    let app = || message.app_id.to_string();
    match key {
        PartitionKey::MessageId => message.id.to_string(),
        PartitionKey::EventId => message.event_id.clone().unwrap_or_else(|| message.id.to_string()),
        PartitionKey::Channel => message.channels.as_ref().and_then(|c| c.first().cloned()).unwrap_or_else(app),
        PartitionKey::Application => app(),
    }
}
