//! Amazon SNS: `Publish` in SNS's query protocol (a form; the answer is XML), the body as
//! the message and the headers as String message attributes; on a FIFO topic the message
//! group and deduplication id as well. Delivered on SNS's answer, which names the
//! message's id.

use url::form_urlencoded;

use super::{Call, Fifo, PublishError, attributes, counted_size, within, xml_text};
use crate::deliver::brokers::message::Outbound;
use crate::outcome::Failure;

/// SNS's largest message (body and attributes).
const MAX_MESSAGE: usize = 256 * 1024;

pub(super) fn publish(topic_arn: &str, fifo: Option<Fifo>, message: &Outbound) -> Result<Call, PublishError> {
    let attributes = attributes(message)?;
    within(counted_size(&message.body, &attributes), MAX_MESSAGE, "SNS")?;
    let body = std::str::from_utf8(&message.body).map_err(|_| {
        PublishError::new(Failure::BrokerRefused, "SNS takes text messages only (this one is not UTF-8)", false)
    })?;
    let mut form = form_urlencoded::Serializer::new(String::new());
    form.append_pair("Action", "Publish").append_pair("Version", "2010-03-31");
    form.append_pair("TopicArn", topic_arn).append_pair("Message", body);
    for (i, (name, value)) in attributes.iter().enumerate() {
        let entry = format!("MessageAttributes.entry.{}", i + 1);
        form.append_pair(&format!("{entry}.Name"), name);
        form.append_pair(&format!("{entry}.Value.DataType"), "String");
        form.append_pair(&format!("{entry}.Value.StringValue"), value);
    }
    if let Some(fifo) = fifo {
        form.append_pair("MessageGroupId", &fifo.group).append_pair("MessageDeduplicationId", &fifo.deduplication);
    }
    Ok(Call {
        service: "sns",
        target: None,
        content_type: "application/x-www-form-urlencoded; charset=utf-8",
        body: form.finish().into_bytes(),
        acknowledged,
    })
}

/// `<PublishResponse><PublishResult><MessageId>…</MessageId>…`.
fn acknowledged(answer: &str) -> Result<String, PublishError> {
    match xml_text(answer, "MessageId") {
        Some(id) => Ok(format!("Publish MessageId={id}")),
        None => Err(PublishError::new(Failure::BrokerRefused, "SNS answered without a MessageId", false)),
    }
}
