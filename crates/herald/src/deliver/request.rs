//! Building one signed attempt request: Standard Webhooks headers (and their `svix-`
//! twins), the attempt number, and the endpoint's own headers.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue, USER_AGENT};
use http::{Method, Request, Uri};
use http_body_util::Full;

use crate::catalog::Target;
use crate::clock::Millis;
use crate::outcome::Failure;
use crate::signing::signature_header;
use crate::store::Message;

/// Header names endpoint headers cannot use: those Herald sets itself, hop-by-hop headers,
/// and headers that name a host or route (they would let a receiver's settings steer
/// proxies and virtual hosts).
pub const RESERVED_HEADERS: &[&str] = &[
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "svix-id",
    "svix-timestamp",
    "svix-signature",
    "herald-attempt",
    "herald-sequence",
    "content-type",
    "content-length",
    "host",
    "user-agent",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "x-host",
    "x-original-host",
    "content-encoding",
];

/// Everything needed to send one attempt.
pub struct Outgoing<'a> {
    pub target: &'a Target,
    pub message: &'a Message,
    pub payload: &'a str,
    /// 1 for the first attempt of the delivery's current round.
    pub attempt_no: u32,
    /// The message's position in its endpoint's stream (increasing, stable across retries).
    pub sequence: i64,
    pub now: Millis,
}

impl Outgoing<'_> {
    pub fn timeout(&self) -> Duration {
        self.target.settings.timeout()
    }

    /// The request, or why none may be sent.
    /// The destination is judged later, when the connector resolves it.
    pub fn build(&self, user_agent: &str) -> Result<Request<Full<Bytes>>, (Failure, String)> {
        let url = self.target.url.as_ref().ok_or((Failure::Internal, "the stored URL does not parse".to_owned()))?;
        if self.target.signing_keys(self.now).next().is_none() {
            return Err((Failure::Internal, "the endpoint has no usable signing secret".to_owned()));
        }
        let uri: Uri = url.as_str().parse().map_err(|e| (Failure::Internal, format!("URL not usable: {e}")))?;
        let msg_id = self.message.id.as_str();
        let timestamp = self.now.div_euclid(1000);
        let body = Bytes::copy_from_slice(self.payload.as_bytes());
        let signature = signature_header(self.target.signing_keys(self.now), msg_id, timestamp, &body);
        let mut request = Request::builder().method(Method::POST).uri(uri);
        let headers = request.headers_mut().expect("a fresh builder has headers");
        for (name, value) in &self.target.endpoint.headers {
            let lower = name.to_ascii_lowercase();
            if RESERVED_HEADERS.contains(&lower.as_str()) {
                continue;
            }
            if let (Ok(name), Ok(value)) = (HeaderName::try_from(lower), HeaderValue::try_from(value.as_str())) {
                headers.insert(name, value);
            }
        }
        let text =
            |s: &str| HeaderValue::try_from(s).map_err(|e| (Failure::Internal, format!("bad header value: {e}")));
        let ts = text(&timestamp.to_string())?;
        let id = text(msg_id)?;
        let sig = text(&signature)?;
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(USER_AGENT, text(user_agent)?);
        headers.insert("webhook-id", id.clone());
        headers.insert("webhook-timestamp", ts.clone());
        headers.insert("webhook-signature", sig.clone());
        headers.insert("svix-id", id);
        headers.insert("svix-timestamp", ts);
        headers.insert("svix-signature", sig);
        headers.insert("herald-attempt", HeaderValue::from(self.attempt_no));
        headers.insert("herald-sequence", HeaderValue::from(self.sequence));
        request.body(Full::new(body)).map_err(|e| (Failure::Internal, format!("building the request: {e}")))
    }
}
