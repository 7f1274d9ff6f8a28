//! Building one signed attempt request: Standard Webhooks headers (and their `svix-`
//! twins), the attempt number, and the endpoint's own headers.

use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue, USER_AGENT};
use http::{Method, Request, Uri};
use http_body_util::Full;

use serde_json::Value;
use url::Url;

use crate::catalog::Target;
use crate::clock::Millis;
use crate::outcome::Failure;
use crate::postback::{BodyFormat, PostbackMethod, RenderError, Template, Values, form_body, request_target};
use crate::signing::signature_header;
use crate::store::Message;

/// Header names endpoint headers cannot use: those Herald sets itself, hop-by-hop and
/// framing headers, headers that name a host or route (they would let a receiver's settings
/// steer proxies and virtual hosts), and the rest of the names Svix refuses (caching and
/// content metadata).
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "user-agent",
    "content-type",
    "content-length",
    "content-encoding",
    "content-language",
    "content-location",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "trailers",
    "upgrade",
    "expect",
    "age",
    "cache-control",
    "clear-site-data",
    "expires",
    "pragma",
    "warning",
    "forwarded",
    "x-forwarded-for",
    "x-forwarded-host",
    "x-forwarded-proto",
    "x-real-ip",
    "x-host",
    "x-original-host",
];

/// Prefixes endpoint headers cannot use: Herald's and Svix's own (`webhook-*`, `svix-*`,
/// `herald-*`), and those cloud load balancers and CDNs reserve, as Svix refuses them.
const RESERVED_PREFIXES: &[&str] = &[
    "webhook-", "svix-", "x-svix-", "herald-", "x-amz-", "x-amzn-", "x-google", "x-goog-", "x-gfe", "x-azure-", "x-fd-",
];

/// Whether an endpoint may not set this header (name in lower case).
pub fn is_reserved_header(name: &str) -> bool {
    RESERVED_HEADERS.contains(&name) || RESERVED_PREFIXES.iter().any(|prefix| name.starts_with(prefix))
}

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

/// A request ready to send, and the URL to record for it.
pub struct Built {
    pub request: Request<Full<Bytes>>,
    /// For templated requests: the rendered URL with payload values left as their macros
    /// (click ids and payouts are not copied into the attempt log).
    pub recorded_url: Option<String>,
}

impl Outgoing<'_> {
    pub fn timeout(&self) -> Duration {
        self.target.settings.timeout()
    }

    /// The request, or why none may be sent. The destination is judged later, when the
    /// connector resolves it.
    pub fn build(&self, user_agent: &str) -> Result<Built, (Failure, String)> {
        let base = self.target.url.as_ref().ok_or((Failure::Internal, "the stored URL does not parse".to_owned()))?;
        if self.target.signing_keys(self.now).next().is_none() {
            return Err((Failure::Internal, "the endpoint has no usable signing secret".to_owned()));
        }
        let settings = self.target.endpoint.request.clone().unwrap_or_default();
        let template = self.target.template.as_ref().map_err(|e| (Failure::Template, e.clone()))?;
        let msg_id = self.message.id.as_str();
        let timestamp = self.now.div_euclid(1000);
        // Plain JSON deliveries send the payload as stored; only templates and form bodies
        // need it parsed (kept off the common path).
        let parsed = template.is_some() || settings.body_format() == BodyFormat::Form;
        let payload: Value =
            if parsed { serde_json::from_str(self.payload).unwrap_or(Value::Null) } else { Value::Null };
        let values = Values {
            message_id: msg_id,
            event_type: &self.message.event_type,
            timestamp,
            attempt: self.attempt_no,
            payload: &payload,
        };
        let (url, signed, recorded_url) = match template {
            None => (base.clone(), None, None),
            Some(template) => {
                let (url, signature) = self.render(template, &values, msg_id, timestamp)?;
                (url, Some(signature), Some(template.recorded(&values)))
            }
        };
        let body = match settings.body_format() {
            BodyFormat::Json => Bytes::copy_from_slice(self.payload.as_bytes()),
            BodyFormat::Form => Bytes::from(form_body(&payload)),
            BodyFormat::None => Bytes::new(),
        };
        // Templated requests sign their request target; plain ones their body.
        let signature = match signed {
            Some(signature) => signature,
            None => signature_header(self.target.signing_keys(self.now), msg_id, timestamp, &body),
        };
        let uri: Uri = url.as_str().parse().map_err(|e| (Failure::Internal, format!("URL not usable: {e}")))?;
        let method = match settings.method() {
            PostbackMethod::Get => Method::GET,
            PostbackMethod::Post => Method::POST,
            PostbackMethod::Put => Method::PUT,
        };
        let own = self.target.headers.as_ref().ok_or_else(|| {
            (Failure::Internal, "the endpoint's headers cannot be opened with the configured server key".to_owned())
        })?;
        let mut request = Request::builder().method(method).uri(uri);
        let headers = request.headers_mut().expect("a fresh builder has headers");
        for (name, value) in own {
            headers.insert(name.clone(), value.clone());
        }
        let text =
            |s: &str| HeaderValue::try_from(s).map_err(|e| (Failure::Internal, format!("bad header value: {e}")));
        let ts = text(&timestamp.to_string())?;
        let id = text(msg_id)?;
        let sig = text(&signature)?;
        match settings.body_format() {
            BodyFormat::Json => {
                headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            }
            BodyFormat::Form => {
                headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/x-www-form-urlencoded"));
            }
            BodyFormat::None => {}
        }
        headers.insert(USER_AGENT, text(user_agent)?);
        headers.insert("webhook-id", id.clone());
        headers.insert("webhook-timestamp", ts.clone());
        headers.insert("webhook-signature", sig.clone());
        headers.insert("svix-id", id);
        headers.insert("svix-timestamp", ts);
        headers.insert("svix-signature", sig);
        headers.insert("herald-attempt", HeaderValue::from(self.attempt_no));
        headers.insert("herald-sequence", HeaderValue::from(self.sequence));
        let request =
            request.body(Full::new(body)).map_err(|e| (Failure::Internal, format!("building the request: {e}")))?;
        Ok(Built { request, recorded_url })
    }

    /// Renders a template and signs its request target; `{signature}` is filled with the
    /// signature of the target rendered with it empty.
    fn render(
        &self,
        template: &Template,
        values: &Values<'_>,
        msg_id: &str,
        timestamp: i64,
    ) -> Result<(Url, String), (Failure, String)> {
        let failed = |e: RenderError| (Failure::Template, e.to_string());
        let unsigned = template.render(values, None).map_err(failed)?;
        let unsigned = Url::parse(&unsigned).map_err(|e| (Failure::Template, format!("rendered URL: {e}")))?;
        let target = request_target(&unsigned);
        let signature = signature_header(self.target.signing_keys(self.now), msg_id, timestamp, target.as_bytes());
        let url = if template.uses_signature() {
            let first = signature.split(' ').next().unwrap_or_default();
            let signed = template.render(values, Some(first)).map_err(failed)?;
            Url::parse(&signed).map_err(|e| (Failure::Template, format!("rendered URL: {e}")))?
        } else {
            unsigned
        };
        let base = self.target.url.as_ref().expect("checked by build");
        if url.origin() != base.origin() {
            return Err(failed(RenderError::OtherOrigin));
        }
        Ok((url, signature))
    }
}
