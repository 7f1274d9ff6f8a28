//! Amazon SQS, SNS and EventBridge (`sqs.rs`, `sns.rs`, `eventbridge.rs`). These are
//! HTTPS APIs, so an attempt is one request, signed with AWS Signature Version 4 (AWS's
//! own `aws-sigv4` crate) and sent through the webhook client: the destination guard, the
//! egress proxies, the endpoint's TLS settings and the bounded read of the answer all
//! apply, and no broker connection is kept. The attempt settles on the service's answer:
//! a 2xx that names the message's id delivers (for EventBridge, an entry that did not
//! fail); a 5xx is retried like a webhook's; any other refusal is classed by the
//! service's error code.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

mod eventbridge;
mod sns;
mod sqs;

use super::message::{Outbound, partition};
use super::{PublishError, outbound};
use crate::deliver::{Deliverer, Outgoing, Sent};
use crate::destinations::{Destination, Kind, is_fifo};
use crate::outcome::{AttemptResult, Failure};

/// SQS and SNS carry at most this many message attributes.
const MAX_ATTRIBUTES: usize = 10;
/// The longest message group id FIFO queues and topics take.
const MAX_GROUP_ID: usize = 128;

/// One request to a service, before it is signed.
pub(super) struct Call {
    /// The service's signing name (`sqs`, `sns`, `events`).
    service: &'static str,
    /// The JSON protocols' `X-Amz-Target` (the operation); none for SNS's query protocol.
    target: Option<&'static str>,
    content_type: &'static str,
    body: Vec<u8>,
    /// Reads the service's 2xx answer: the acknowledgement to record, or why it is none.
    acknowledged: fn(&str) -> Result<String, PublishError>,
}

/// A FIFO destination's message group (the partition key's value) and deduplication id
/// (the message's id: SQS and SNS drop a copy sent again within five minutes).
pub(super) struct Fifo {
    group: String,
    deduplication: String,
}

impl Deliverer {
    /// Publishes one attempt to an Amazon destination within the attempt's timeout.
    pub(in crate::deliver) async fn publish_to_aws(&self, destination: &Destination, out: &Outgoing<'_>) -> Sent {
        let started = Instant::now();
        let failed = |e: PublishError| Sent::failed(e.failure, e.why, started.elapsed());
        let mut call = match call(destination, out) {
            Ok(call) => call,
            Err(e) => return failed(e),
        };
        let request = match signed(destination, &mut call, SystemTime::now()) {
            Ok(request) => request,
            Err(e) => return failed(e),
        };
        let client = match self.client_for(out.target, true) {
            Ok(client) => client,
            Err(reason) => return Sent::failed(Failure::Tls, reason, started.elapsed()),
        };
        let sent = self.exchange(&client, request, started, started + out.timeout()).await;
        settle(&call, sent)
    }
}

/// The call that publishes `out` to `destination`.
fn call(destination: &Destination, out: &Outgoing<'_>) -> Result<Call, PublishError> {
    let message = outbound(destination, out)?;
    let fifo = is_fifo(&destination.kind).then(|| fifo(destination, out));
    match &destination.kind {
        Kind::Sqs { queue_url, .. } => sqs::send_message(queue_url, fifo, &message),
        Kind::Sns { topic_arn, .. } => sns::publish(topic_arn, fifo, &message),
        Kind::EventBridge { event_bus, source, .. } => {
            eventbridge::put_events(event_bus, source, &out.message.event_type, &message)
        }
        _ => Err(PublishError::new(Failure::Internal, "not an Amazon destination", false)),
    }
}

/// The message group the destination's partition key gives `out`'s message; a value SQS
/// would refuse as a group id (too long, or not printable ASCII) goes as its SHA-256.
fn fifo(destination: &Destination, out: &Outgoing<'_>) -> Fifo {
    let group = partition(destination.kind.partition_key().unwrap_or_default(), out.message);
    let usable = group.len() <= MAX_GROUP_ID && group.bytes().all(|b| b.is_ascii_graphic());
    let group = if usable { group } else { URL_SAFE_NO_PAD.encode(Sha256::digest(group.as_bytes())) };
    Fifo { group, deduplication: out.message.id.to_string() }
}

/// The message's headers as String message attributes, as SQS and SNS take them: at most
/// ten, each named with letters, digits, `-`, `_` and `.`. Headers with empty values are
/// left out (the services refuse empty attributes).
fn attributes(message: &Outbound) -> Result<Vec<(&str, &str)>, PublishError> {
    let given: Vec<(&str, &str)> =
        message.headers.iter().filter(|(_, v)| !v.is_empty()).map(|(n, v)| (n.as_str(), v.as_str())).collect();
    if given.len() > MAX_ATTRIBUTES {
        let why = format!(
            "the message has {} headers and SQS and SNS carry at most {MAX_ATTRIBUTES} message attributes \
             (Herald's own take 6: the endpoint may add 4)",
            given.len()
        );
        return Err(PublishError::new(Failure::BrokerRefused, why, false));
    }
    if let Some((name, _)) =
        given.iter().find(|(n, _)| !n.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)))
    {
        let why = format!("the header {name} is not a valid message attribute name (letters, digits, '-', '_', '.')");
        return Err(PublishError::new(Failure::BrokerRefused, why, false));
    }
    Ok(given)
}

/// The size the services count against their limit: the body and every attribute's name,
/// type and value.
fn counted_size(body: &[u8], attributes: &[(&str, &str)]) -> usize {
    body.len() + attributes.iter().map(|(n, v)| n.len() + "String".len() + v.len()).sum::<usize>()
}

/// A `message_too_large` failure when `size` is over the service's `limit`.
fn within(size: usize, limit: usize, service: &str) -> Result<(), PublishError> {
    if size <= limit {
        return Ok(());
    }
    let why = format!("the message counts {size} bytes and {service} takes at most {limit}");
    Err(PublishError::new(Failure::MessageTooLarge, why, false))
}

/// The request for `call` (its body moved into it), signed for the destination's region
/// with its access key.
fn signed(destination: &Destination, call: &mut Call, now: SystemTime) -> Result<Request<Full<Bytes>>, PublishError> {
    let internal = |why: String| PublishError::new(Failure::Internal, why, false);
    let region = match &destination.kind {
        Kind::Sqs { region, .. } | Kind::Sns { region, .. } | Kind::EventBridge { region, .. } => region,
        _ => return Err(internal("not an Amazon destination".into())),
    };
    let credentials = destination.credentials.clone().unwrap_or_default();
    let (Some(key_id), Some(secret)) = (credentials.username, credentials.password) else {
        return Err(PublishError::new(Failure::BrokerAuth, "the destination has no access key", false));
    };
    let uri = format!("{}/", destination.broker.trim_end_matches('/'));
    let authority = uri.parse::<http::Uri>().ok().and_then(|u| u.authority().map(|a| a.to_string()));
    let authority = authority.ok_or_else(|| internal("the stored endpoint does not parse".into()))?;
    let mut headers = vec![("host", authority.as_str()), ("content-type", call.content_type)];
    headers.extend(call.target.map(|target| ("x-amz-target", target)));

    let identity: Identity = Credentials::new(key_id, secret, None, None, "herald-destination").into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(call.service)
        .time(now)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| internal(format!("signing: {e}")))?
        .into();
    let signable = SignableRequest::new("POST", &uri, headers.iter().copied(), SignableBody::Bytes(&call.body))
        .map_err(|e| internal(format!("signing: {e}")))?;
    let (instructions, _) = sign(signable, &params).map_err(|e| internal(format!("signing: {e}")))?.into_parts();
    let mut request = Request::builder().method("POST").uri(&uri);
    for (name, value) in &headers {
        request = request.header(*name, *value);
    }
    let body = Bytes::from(std::mem::take(&mut call.body));
    let mut request = request.body(Full::new(body)).map_err(|e| internal(format!("the request: {e}")))?;
    instructions.apply_to_request_http1x(&mut request);
    Ok(request)
}

/// The attempt as the service's answer makes it.
fn settle(call: &Call, sent: Sent) -> Sent {
    let AttemptResult::Response { status, .. } = sent.result else { return sent };
    match status {
        200..=299 => match (call.acknowledged)(&sent.body) {
            Ok(acknowledgement) => Sent { body: acknowledgement, ..sent },
            Err(e) => Sent::failed(e.failure, e.why, sent.duration),
        },
        // The service's own trouble: retried, as a webhook's 5xx is.
        500..=599 => sent,
        _ => {
            let (code, text) = error(&sent.body);
            let why = format!("{code}: {text} (HTTP {status})");
            Sent::failed(class(&code, &text, status), why, sent.duration)
        }
    }
}

/// The error code and message of a refusal, from a JSON protocol's answer
/// (`{"__type": "…#QueueDoesNotExist", "message": …}`) or a query protocol's XML
/// (`<Code>NotFound</Code><Message>…</Message>`).
fn error(answer: &str) -> (String, String) {
    if let Ok(json) = serde_json::from_str::<Value>(answer) {
        let field = |names: &[&str]| names.iter().find_map(|n| json[n].as_str()).unwrap_or_default().to_owned();
        let code = field(&["__type", "code", "Code"]);
        let code = code.rsplit('#').next().unwrap_or_default().to_owned();
        return (code, field(&["message", "Message"]));
    }
    (xml_text(answer, "Code").unwrap_or_default(), xml_text(answer, "Message").unwrap_or_default())
}

/// The text of the first `<tag>…</tag>` in an answer (the services' XML has no attributes
/// on the elements Herald reads).
fn xml_text(answer: &str, tag: &str) -> Option<String> {
    let start = answer.find(&format!("<{tag}>"))? + tag.len() + 2;
    let end = start + answer[start..].find(&format!("</{tag}>"))?;
    let text = &answer[start..end];
    Some(
        text.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&apos;", "'")
            .replace("&amp;", "&"),
    )
}

/// Herald's class for a service's error code.
fn class(code: &str, text: &str, status: u16) -> Failure {
    match code {
        "SignatureDoesNotMatch"
        | "InvalidClientTokenId"
        | "UnrecognizedClientException"
        | "IncompleteSignature"
        | "InvalidSignatureException"
        | "MissingAuthenticationToken"
        | "ExpiredToken"
        | "ExpiredTokenException"
        | "RequestExpired"
        | "SignatureExpired"
        | "AccessDenied"
        | "AccessDeniedException"
        | "AuthorizationError"
        | "NotAuthorizedForSourceException"
        | "KMSAccessDeniedException"
        | "KMS.AccessDeniedException" => Failure::BrokerAuth,
        "QueueDoesNotExist" | "AWS.SimpleQueueService.NonExistentQueue" | "NotFound" | "ResourceNotFoundException" => {
            Failure::DestinationMissing
        }
        "Throttling"
        | "ThrottlingException"
        | "ThrottledException"
        | "RequestThrottled"
        | "TooManyRequestsException"
        | "KMSThrottlingException"
        | "KMS.ThrottlingException"
        | "InternalFailure"
        | "InternalException"
        | "ServiceUnavailable" => Failure::Throttled,
        _ if status == 429 => Failure::Throttled,
        _ if text.contains("too long") || text.contains("must be shorter") || text.contains("too large") => {
            Failure::MessageTooLarge
        }
        _ => Failure::BrokerRefused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_classed_by_their_code() {
        let json =
            r#"{"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "The specified queue does not exist."}"#;
        assert_eq!(error(json), ("QueueDoesNotExist".into(), "The specified queue does not exist.".into()));
        let xml = "<ErrorResponse><Error><Type>Sender</Type><Code>SignatureDoesNotMatch</Code>\
                   <Message>The request signature we calculated does not match &amp; more</Message></Error></ErrorResponse>";
        let (code, text) = error(xml);
        assert_eq!(
            (code.as_str(), text.as_str()),
            ("SignatureDoesNotMatch", "The request signature we calculated does not match & more")
        );
        assert_eq!(class(&code, &text, 403), Failure::BrokerAuth);
        assert_eq!(class("NotFound", "Topic does not exist", 404), Failure::DestinationMissing);
        assert_eq!(class("InvalidParameter", "Invalid parameter: Message too long", 400), Failure::MessageTooLarge);
        assert_eq!(class("Whatever", "", 429), Failure::Throttled);
        assert_eq!(class("InvalidParameterValue", "bad group", 400), Failure::BrokerRefused);
    }
}
