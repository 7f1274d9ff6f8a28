//! Building one signed attempt request: Standard Webhooks headers (and their `svix-`
//! twins), the attempt number, and the endpoint's own headers.

use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderValue;
use http::{Method, Request, Uri};
use http_body_util::Full;

use serde_json::Value;
use url::Url;

use crate::catalog::Target;
use crate::clock::Millis;
use crate::outcome::Failure;
use crate::postback::{BodyFormat, RenderError, Template, Values, form_body, request_target};
use crate::scripts::Rewrite;
use crate::signing::signature_header;
use crate::store::Message;

/// The headers Herald sets on every attempt, besides the endpoint's own.
pub struct Standard<'a> {
    pub body_format: BodyFormat,
    pub user_agent: &'a str,
    pub msg_id: &'a str,
    pub timestamp: i64,
    pub signature: &'a str,
    pub attempt_no: u32,
    pub sequence: i64,
}

impl Standard<'_> {
    /// (name, value) in the order they are set; the dashboard shows an attempt's request
    /// from the same list, so what it shows is what is sent.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let content_type = match self.body_format {
            BodyFormat::Json => Some("application/json"),
            BodyFormat::Form => Some("application/x-www-form-urlencoded"),
            BodyFormat::None => None,
        };
        let (id, ts, sig) = (self.msg_id.to_owned(), self.timestamp.to_string(), self.signature.to_owned());
        let mut headers: Vec<(&'static str, String)> =
            content_type.map(|t| ("content-type", t.to_owned())).into_iter().collect();
        headers.extend([
            ("user-agent", self.user_agent.to_owned()),
            ("webhook-id", id.clone()),
            ("webhook-timestamp", ts.clone()),
            ("webhook-signature", sig.clone()),
            ("svix-id", id),
            ("svix-timestamp", ts),
            ("svix-signature", sig),
            ("herald-attempt", self.attempt_no.to_string()),
            ("herald-sequence", self.sequence.to_string()),
        ]);
        headers
    }
}

/// Everything needed to send one attempt.
pub struct Outgoing<'a> {
    pub target: &'a Target,
    pub message: &'a Message,
    pub payload: &'a str,
    /// The request the endpoint's transform made of it, if it has one: its method, URL,
    /// headers and body replace the plain ones (Herald's own headers still go on top).
    pub rewrite: Option<&'a Rewrite>,
    /// 1 for the first attempt of the delivery's current round.
    pub attempt_no: u32,
    /// The message's position in its endpoint's stream (increasing, stable across retries).
    pub sequence: i64,
    pub now: Millis,
    /// The attempt's span as a W3C `traceparent`, for endpoints that asked for it.
    pub traceparent: Option<&'a str>,
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
        if let Some(rewrite) = self.rewrite {
            if template.is_some() {
                return Err((Failure::Transform, "a transform cannot be combined with a URL template".to_owned()));
            }
            return self.build_rewritten(rewrite, user_agent);
        }
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
        let method = self.target.method();
        let own = self.target.headers.as_ref().ok_or_else(|| {
            (Failure::Internal, "the endpoint's headers cannot be opened with the configured server key".to_owned())
        })?;
        let request = self.assemble(method, uri, own, settings.body_format(), &signature, user_agent, body)?;
        Ok(Built { request, recorded_url })
    }

    /// A transformed request: signed over the body it actually carries.
    fn build_rewritten(&self, rewrite: &Rewrite, user_agent: &str) -> Result<Built, (Failure, String)> {
        let msg_id = self.message.id.as_str();
        let timestamp = self.now.div_euclid(1000);
        let signature = signature_header(self.target.signing_keys(self.now), msg_id, timestamp, &rewrite.body);
        let uri: Uri =
            rewrite.url.as_str().parse().map_err(|e| (Failure::Transform, format!("URL not usable: {e}")))?;
        let (method, body) = (rewrite.method.clone(), rewrite.body.clone());
        // The endpoint's credentials, which the transform never saw, go on as set.
        let own: Vec<_> = rewrite.headers.iter().chain(self.target.sensitive_headers()).cloned().collect();
        let request = self.assemble(method, uri, &own, BodyFormat::Json, &signature, user_agent, body)?;
        Ok(Built { request, recorded_url: Some(rewrite.url.to_string()) })
    }

    /// The request with the endpoint's headers, then Herald's own on top.
    #[allow(clippy::too_many_arguments)]
    fn assemble(
        &self,
        method: Method,
        uri: Uri,
        own: &[(http::HeaderName, HeaderValue)],
        body_format: BodyFormat,
        signature: &str,
        user_agent: &str,
        body: Bytes,
    ) -> Result<Request<Full<Bytes>>, (Failure, String)> {
        let mut request = Request::builder().method(method).uri(uri);
        let headers = request.headers_mut().expect("a fresh builder has headers");
        for (name, value) in own {
            headers.insert(name.clone(), value.clone());
        }
        let standard = Standard {
            body_format,
            user_agent,
            msg_id: self.message.id.as_str(),
            timestamp: self.now.div_euclid(1000),
            signature,
            attempt_no: self.attempt_no,
            sequence: self.sequence,
        };
        for (name, value) in standard.headers() {
            let value =
                HeaderValue::try_from(value).map_err(|e| (Failure::Internal, format!("bad header value: {e}")))?;
            headers.insert(name, value);
        }
        if let Some(traceparent) = self.traceparent {
            let value =
                HeaderValue::from_str(traceparent).map_err(|e| (Failure::Internal, format!("bad traceparent: {e}")))?;
            headers.insert("traceparent", value);
        }
        request.body(Full::new(body)).map_err(|e| (Failure::Internal, format!("building the request: {e}")))
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
