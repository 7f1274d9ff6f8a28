//! Endpoint filters and transforms, written in jq (the jaq implementation). A *filter*
//! decides at ingest whether an endpoint gets a message at all; a *transform* rewrites the
//! request an attempt sends (body, headers, method, path and query; never the origin), or
//! drops the delivery. Both are bounded in length and nesting ([`bounds`]), then compiled
//! and run only in worker processes with a deadline and a memory cap ([`sandbox`],
//! [`worker`], [`engine`]), shared fairly between applications, so a runaway expression
//! fails its own delivery (or its own request) and nothing else.

pub mod bounds;
pub mod engine;
pub mod sandbox;
mod turns;
pub mod worker;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};
use std::collections::BTreeMap;

use serde_json::value::RawValue;
use serde_json::{Map, Value};
use url::Url;

pub use sandbox::{CheckError, EvalError, Evaluated, Sandbox};

use crate::headers::is_reserved_header;
use crate::store::Message;

/// What a filter or transform sees: the message and the endpoint's request as it stands.
/// `payload` is the message's JSON as received.
pub fn input(message: &Message, headers: &[(HeaderName, HeaderValue)], method: &str, url: &str) -> Vec<u8> {
    let headers: Map<String, Value> = headers
        .iter()
        .map(|(name, value)| (name.to_string(), Value::String(String::from_utf8_lossy(value.as_bytes()).into())))
        .collect();
    let payload = message.payload.as_deref().unwrap_or("null");
    let head = serde_json::json!({
        "eventType": message.event_type,
        "channels": message.channels,
        "headers": headers,
        "method": method,
        "url": url,
    });
    // The payload is spliced in as received: no parse and re-serialisation per evaluation.
    let mut text = serde_json::to_vec(&head).expect("JSON values serialise");
    text.pop();
    text.extend_from_slice(br#","payload":"#);
    text.extend_from_slice(payload.as_bytes());
    text.push(b'}');
    text
}

/// A filter's verdict: the endpoint gets the message only if the first output is `true`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// Filtered out, and why (the output it gave instead of `true`, or its error).
    Drop(String),
    /// No verdict: the sandbox cannot run (Herald's problem, not the expression's).
    Unavailable(String),
}

impl Verdict {
    pub fn of(evaluated: Evaluated) -> Self {
        match evaluated.as_ref().map(Option::as_deref) {
            Ok(Some("true")) => Self::Pass,
            Ok(Some("false")) => Self::Drop("the filter yielded false".into()),
            // The output's kind only: its value may be a payload field kept from some readers.
            Ok(Some(other)) => Self::Drop(format!("the filter yielded {}, not true", kind_of(other))),
            Ok(None) => Self::Drop("the filter yielded nothing".into()),
            Err(e @ EvalError::Unavailable(_)) => Self::Unavailable(e.to_string()),
            Err(e) => Self::Drop(format!("the filter failed: {e}")),
        }
    }
}

/// The request a transform asked for: the original with its changes applied.
#[derive(Debug, Clone)]
pub struct Rewrite {
    pub method: Method,
    pub url: Url,
    /// The endpoint's headers as the transform left them (Herald's own are added after).
    pub headers: Vec<(HeaderName, HeaderValue)>,
    pub body: Bytes,
}

/// The keys a transform's output may change.
const REWRITE_KEYS: [&str; 4] = ["payload", "headers", "method", "url"];
/// Keys of the input a transform's output may keep, ignored (so `.` sends the request
/// unchanged).
const READ_ONLY_KEYS: [&str; 2] = ["eventType", "channels"];
/// Methods a transform may choose.
const METHODS: [&str; 5] = ["POST", "PUT", "PATCH", "GET", "DELETE"];

/// Reads a transform's output: `Ok(None)` when it drops the delivery (`null` or no
/// output), the rewritten request, or why the output is not a request Herald may send.
pub fn rewrite(output: Option<String>, original: &Rewrite) -> Result<Option<Rewrite>, String> {
    let Some(output) = output.filter(|o| o.trim() != "null") else { return Ok(None) };
    // The payload's text is kept as the expression wrote it (key order included).
    let object: BTreeMap<String, Box<RawValue>> = serde_json::from_str(&output)
        .map_err(|_| format!("a transform must yield an object or null, not {}", kind_of(&output)))?;
    let changed = |k: &&String| !READ_ONLY_KEYS.contains(&k.as_str());
    if let Some(key) = object.keys().filter(changed).find(|k| !REWRITE_KEYS.contains(&k.as_str())) {
        return Err(format!("unknown key `{key}` (a transform may set {})", REWRITE_KEYS.join(", ")));
    }
    let field = |key: &str| -> Result<Option<Value>, String> {
        object.get(key).map(|raw| serde_json::from_str(raw.get()).map_err(|e| e.to_string())).transpose()
    };
    let mut out = original.clone();
    if let Some(payload) = object.get("payload") {
        out.body = Bytes::copy_from_slice(payload.get().as_bytes());
    }
    if let Some(method) = field("method")? {
        let method = method.as_str().map(str::to_ascii_uppercase).unwrap_or_default();
        if !METHODS.contains(&method.as_str()) {
            return Err(format!("`method` must be one of {}", METHODS.join(", ")));
        }
        out.method = method.parse().expect("a listed method parses");
    }
    if let Some(url) = field("url")? {
        let url = url.as_str().ok_or("`url` must be a string")?;
        let url = Url::parse(url).map_err(|e| format!("`url` does not parse: {e}"))?;
        if url.origin() != original.url.origin() {
            return Err("`url` may change the path and query, not the scheme, host or port".into());
        }
        out.url = url;
    }
    if let Some(headers) = field("headers")? {
        out.headers = rewrite_headers(&headers)?;
    }
    Ok(Some(out))
}

/// What kind of JSON value `text` is (reasons name it, never quote it: the value may be a
/// payload field that redaction keeps from some readers).
fn kind_of(text: &str) -> &'static str {
    match text.trim_start().as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

fn rewrite_headers(headers: &Value) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let headers = headers.as_object().ok_or("`headers` must be an object of strings")?;
    let mut out = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let lower = name.to_ascii_lowercase();
        if is_reserved_header(&lower) {
            return Err(format!("the header `{name}` is Herald's to set"));
        }
        let value = value.as_str().ok_or_else(|| format!("the header `{name}` must be a string"))?;
        let name = HeaderName::try_from(lower).map_err(|_| format!("`{name}` is not a header name"))?;
        let value = HeaderValue::try_from(value).map_err(|_| format!("the header `{name}` has a bad value"))?;
        out.push((name, value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{AppId, MessageId};
    use serde_json::json;

    fn original() -> Rewrite {
        Rewrite {
            method: Method::POST,
            url: Url::parse("https://hooks.example.com/in?x=1").unwrap(),
            headers: vec![(HeaderName::from_static("x-team"), HeaderValue::from_static("blue"))],
            body: Bytes::from_static(b"{}"),
        }
    }

    #[test]
    fn the_input_carries_the_payload_as_received() {
        let message = Message {
            id: MessageId::generate(),
            app_id: AppId::generate(),
            event_type: "invoice.paid".into(),
            event_id: None,
            channels: Some(vec!["eu".into()]),
            payload: Some(r#"{"amount": 1.50}"#.into()),
            created_at: 0,
            trace: None,
        };
        let text = input(&message, &original().headers, "POST", "https://h/x");
        let value: Value = serde_json::from_slice(&text).unwrap();
        assert_eq!(value["eventType"], "invoice.paid");
        assert_eq!(value["channels"], json!(["eu"]));
        assert_eq!(value["headers"], json!({"x-team": "blue"}));
        assert_eq!(value["payload"]["amount"], json!(1.5));
    }

    #[test]
    fn verdicts() {
        assert_eq!(Verdict::of(Ok(Some("true".into()))), Verdict::Pass);
        assert_eq!(Verdict::of(Ok(Some("false".into()))), Verdict::Drop("the filter yielded false".into()));
        let secret = Verdict::of(Ok(Some(r#""clk-4242""#.into())));
        assert_eq!(secret, Verdict::Drop("the filter yielded a string, not true".into()), "never the value");
        assert!(matches!(Verdict::of(Ok(None)), Verdict::Drop(_)));
        assert!(matches!(Verdict::of(Err(EvalError::Crashed)), Verdict::Drop(_)));
        assert!(matches!(Verdict::of(Err(EvalError::Unavailable("no".into()))), Verdict::Unavailable(_)));
    }

    fn out(value: Value) -> Option<String> {
        Some(value.to_string())
    }

    #[test]
    fn a_transform_rewrites_within_the_origin() {
        let output = r#"{"payload": {"z": 1, "a": 2}, "method": "put", "url": "https://hooks.example.com/v2?y=2",
                         "headers": {"X-Team": "red", "x-new": "1"}, "eventType": "ignored"}"#;
        let r = rewrite(Some(output.into()), &original()).unwrap().unwrap();
        assert_eq!(r.method, Method::PUT);
        assert_eq!(r.url.as_str(), "https://hooks.example.com/v2?y=2");
        assert_eq!(&r.body[..], br#"{"z": 1, "a": 2}"#, "the payload as the expression wrote it");
        assert_eq!(r.headers.len(), 2);
        assert_eq!(r.headers[0].1, "red");
    }

    #[test]
    fn a_transform_may_drop_but_not_escape() {
        assert!(rewrite(out(Value::Null), &original()).unwrap().is_none());
        assert!(rewrite(None, &original()).unwrap().is_none());
        let other_host = json!({"url": "https://evil.example.net/in"});
        assert!(rewrite(out(other_host), &original()).unwrap_err().contains("not the scheme, host or port"));
        let other_scheme = json!({"url": "http://hooks.example.com/in"});
        assert!(rewrite(out(other_scheme), &original()).is_err());
        let signature = json!({"headers": {"webhook-signature": "v1,forged"}});
        assert!(rewrite(out(signature), &original()).unwrap_err().contains("Herald's to set"));
        assert!(rewrite(out(json!({"host": "x"})), &original()).unwrap_err().contains("unknown key"));
        assert!(rewrite(out(json!("text")), &original()).is_err());
        assert!(rewrite(out(json!({"method": "CONNECT"})), &original()).is_err());
    }
}
