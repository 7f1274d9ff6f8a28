//! Amazon EventBridge: `PutEvents` with one entry. Its detail type is the event type and
//! its detail `{"headers": {…}, "body": "…"}`: the headers (`webhook-id`,
//! `webhook-signature`, …) and the body as the exact text that was signed, since
//! EventBridge re-serializes a JSON detail and a consumer verifies the text. Rules match
//! on `detail-type`, `source` and `detail.headers`. Delivered when the entry is accepted:
//! PutEvents answers 200 even when an entry fails, so the entry's error code decides.

use serde_json::{Map, Value, json};

use super::{Call, PublishError, class, within};
use crate::deliver::brokers::message::Outbound;
use crate::outcome::Failure;

/// EventBridge's largest entry (detail, detail type, source and time).
const MAX_ENTRY: usize = 256 * 1024;
/// What the entry's time counts towards its size.
const TIME_SIZE: usize = 14;

pub(super) fn put_events(
    event_bus: &str,
    source: &str,
    event_type: &str,
    message: &Outbound,
) -> Result<Call, PublishError> {
    let body = std::str::from_utf8(&message.body).map_err(|_| {
        PublishError::new(Failure::BrokerRefused, "EventBridge takes text details only (this body is not UTF-8)", false)
    })?;
    let headers: Map<String, Value> = message.headers.iter().map(|(n, v)| (n.clone(), json!(v))).collect();
    let detail = json!({"headers": headers, "body": body}).to_string();
    within(detail.len() + event_type.len() + source.len() + TIME_SIZE, MAX_ENTRY, "EventBridge")?;
    let entry = json!({"Source": source, "DetailType": event_type, "Detail": detail, "EventBusName": event_bus});
    Ok(Call {
        service: "events",
        target: Some("AWSEvents.PutEvents"),
        content_type: "application/x-amz-json-1.1",
        body: serde_json::to_vec(&json!({"Entries": [entry]})).expect("JSON serializes"),
        acknowledged,
    })
}

/// `{"FailedEntryCount": n, "Entries": [{"EventId": …} | {"ErrorCode": …, "ErrorMessage": …}]}`.
fn acknowledged(answer: &str) -> Result<String, PublishError> {
    let answer: Value = serde_json::from_str(answer).unwrap_or_default();
    let entry = &answer["Entries"][0];
    if let Some(id) = entry["EventId"].as_str()
        && answer["FailedEntryCount"].as_u64() == Some(0)
    {
        return Ok(format!("PutEvents EventId={id}"));
    }
    let Some(code) = entry["ErrorCode"].as_str() else {
        return Err(PublishError::new(Failure::BrokerRefused, format!("EventBridge answered {answer}"), false));
    };
    let text = entry["ErrorMessage"].as_str().unwrap_or_default();
    let why = format!("the entry failed: {code}: {text} (FailedEntryCount {})", answer["FailedEntryCount"]);
    Err(PublishError::new(class(code, text, 200), why, false))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_entry_fails_the_attempt_with_its_code() {
        let throttled = r#"{"FailedEntryCount": 1, "Entries": [{"ErrorCode": "ThrottlingException", "ErrorMessage": "Rate exceeded"}]}"#;
        let e = acknowledged(throttled).unwrap_err();
        assert_eq!(e.failure, Failure::Throttled);
        assert!(e.why.contains("ThrottlingException: Rate exceeded"), "{}", e.why);
        let malformed = r#"{"FailedEntryCount": 1, "Entries": [{"ErrorCode": "MalformedDetail", "ErrorMessage": "Detail is malformed."}]}"#;
        assert_eq!(acknowledged(malformed).unwrap_err().failure, Failure::BrokerRefused);
        let accepted = r#"{"FailedEntryCount": 0, "Entries": [{"EventId": "11710aed-b79e-4468-a20b-bb3c0c3b4860"}]}"#;
        assert_eq!(acknowledged(accepted).unwrap(), "PutEvents EventId=11710aed-b79e-4468-a20b-bb3c0c3b4860");
        assert_eq!(acknowledged("{}").unwrap_err().failure, Failure::BrokerRefused);
    }
}
