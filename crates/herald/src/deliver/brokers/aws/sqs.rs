//! Amazon SQS: `SendMessage` in SQS's JSON protocol, the body as the message body and the
//! headers as String message attributes; on a FIFO queue the message group and
//! deduplication id as well. Delivered on SQS's answer, which names the message's id.

use serde_json::{Map, Value, json};

use super::{Call, Fifo, PublishError, attributes, counted_size, within};
use crate::deliver::brokers::message::Outbound;
use crate::outcome::Failure;

/// SQS's largest message (body and attributes), 1 MiB since August 2025.
const MAX_MESSAGE: usize = 1024 * 1024;

pub(super) fn send_message(queue_url: &str, fifo: Option<Fifo>, message: &Outbound) -> Result<Call, PublishError> {
    let attributes = attributes(message)?;
    within(counted_size(&message.body, &attributes), MAX_MESSAGE, "SQS")?;
    let body = std::str::from_utf8(&message.body).map_err(|_| {
        PublishError::new(Failure::BrokerRefused, "SQS takes text bodies only (this one is not UTF-8)", false)
    })?;
    let attributes: Map<String, Value> = attributes
        .iter()
        .map(|(name, value)| (name.to_string(), json!({"DataType": "String", "StringValue": value})))
        .collect();
    let mut request = json!({"QueueUrl": queue_url, "MessageBody": body, "MessageAttributes": attributes});
    if let Some(fifo) = fifo {
        request["MessageGroupId"] = json!(fifo.group);
        request["MessageDeduplicationId"] = json!(fifo.deduplication);
    }
    Ok(Call {
        service: "sqs",
        target: Some("AmazonSQS.SendMessage"),
        content_type: "application/x-amz-json-1.0",
        body: serde_json::to_vec(&request).expect("JSON serializes"),
        acknowledged,
    })
}

/// `{"MessageId": …}` (and a FIFO queue's `SequenceNumber`).
fn acknowledged(answer: &str) -> Result<String, PublishError> {
    let answer: Value = serde_json::from_str(answer).unwrap_or_default();
    let Some(id) = answer["MessageId"].as_str() else {
        return Err(PublishError::new(Failure::BrokerRefused, "SQS answered without a MessageId", false));
    };
    Ok(match answer["SequenceNumber"].as_str() {
        Some(sequence) => format!("SendMessage MessageId={id} SequenceNumber={sequence}"),
        None => format!("SendMessage MessageId={id}"),
    })
}
