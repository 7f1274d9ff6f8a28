//! Postbacks: requests whose URL is a template filled from the message, the way affiliate
//! trackers expect (`https://tracker.example/pb?clickid={click_id}&payout={payout}`).
//!
//! A macro `{name}` is a payload field (`{click_id}`, or a dotted path `{data.click_id}`) or
//! a built-in: `{message_id}`, `{event_type}`, `{timestamp}`, `{attempt}`, `{signature}`
//! (bare built-in names win over payload fields of the same name; the `herald.` namespace,
//! e.g. `{herald.attempt}`, names built-ins explicitly, and an unknown name there is an
//! error). Each value is percent-encoded for where it stands: a path segment or a query
//! component. Macros may not appear in the scheme, host or port: the template must start
//! with the endpoint `url`'s origin. A rendered path may not contain a `.` or `..` segment
//! (which a URL parser would resolve, climbing out of the template's path): a template with
//! one is refused, and a message whose values make one cannot fill the template.
//!
//! Templated requests are signed over `{id}.{timestamp}.{request-target}` (path and query
//! as sent) instead of the body. `{signature}` carries that signature in the URL; it is
//! computed over the request target with the signature's own value left empty.

use percent_encoding::{AsciiSet, CONTROLS, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use url::Url;

/// Bytes escaped in a path segment: everything but unreserved characters and the
/// sub-delimiters that cannot change the path's structure.
const PATH_SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'/')
    .add(b'%')
    .add(b'\\')
    .add(b'^')
    .add(b'|')
    .add(b'[')
    .add(b']')
    .add(b';')
    .add(b'=')
    .add(b'&')
    .add(b'+');
/// Bytes escaped in a query component: everything but unreserved characters.
const QUERY_COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// The endpoint's `request` extension.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RequestSettings {
    /// `GET`, `POST` or `PUT` (default `POST`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<PostbackMethod>,
    /// The URL of each request, filled from the message; same origin as `url`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_template: Option<String>,
    /// `json` (default for POST/PUT), `form`, or `none` (default for GET).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_format: Option<BodyFormat>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum PostbackMethod {
    Get,
    Post,
    Put,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum BodyFormat {
    Json,
    Form,
    None,
}

impl RequestSettings {
    pub fn method(&self) -> PostbackMethod {
        self.method.unwrap_or(PostbackMethod::Post)
    }

    pub fn body_format(&self) -> BodyFormat {
        self.body_format.unwrap_or(match self.method() {
            PostbackMethod::Get => BodyFormat::None,
            _ => BodyFormat::Json,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builtin {
    MessageId,
    EventType,
    Timestamp,
    Attempt,
    Signature,
}

impl Builtin {
    fn named(name: &str) -> Option<Self> {
        Some(match name {
            "message_id" => Self::MessageId,
            "event_type" => Self::EventType,
            "timestamp" => Self::Timestamp,
            "attempt" => Self::Attempt,
            "signature" => Self::Signature,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Builtin(Builtin),
    /// A payload path: `["data", "click_id"]`.
    Field(Vec<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Position {
    Path,
    Query,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(String),
    Macro { source: Source, position: Position },
}

/// A parsed URL template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

/// Why a template cannot be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    #[error("a `{{` is never closed")]
    Unclosed,
    #[error("`{0}` is not a valid macro name (letters, digits and `_`, dotted for nested fields)")]
    BadName(String),
    #[error("`{{herald.{0}}}` is not a built-in (message_id, event_type, timestamp, attempt, signature)")]
    UnknownBuiltin(String),
    #[error("macros cannot appear in the scheme, host or port")]
    MacroInOrigin,
    #[error("macros cannot appear in the fragment")]
    MacroInFragment,
    #[error("the template must keep the scheme, host and port of `url` ({0})")]
    OtherOrigin(String),
    #[error("the path may not have `.` or `..` segments")]
    DotSegment,
}

/// Why a message cannot fill a template (the delivery becomes a dead letter).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenderError {
    #[error("the payload has no field `{0}` (or it is null, an object or a list)")]
    Missing(String),
    #[error("the rendered URL does not keep the endpoint's origin")]
    OtherOrigin,
    #[error("a value makes a `.` or `..` path segment, which would leave the template's path")]
    DotSegment,
}

/// What a message offers a template.
pub struct Values<'a> {
    pub message_id: &'a str,
    pub event_type: &'a str,
    pub timestamp: i64,
    pub attempt: u32,
    pub payload: &'a Value,
}

impl Template {
    /// Parses `template` and checks it against the endpoint's `url`.
    pub fn parse(template: &str, url: &Url) -> Result<Self, TemplateError> {
        let origin = url.origin().ascii_serialization();
        let rest = template.strip_prefix(origin.as_str()).filter(|r| r.is_empty() || r.starts_with(['/', '?']));
        let Some(rest) = rest else {
            let literal_origin = template.split('{').next().unwrap_or_default();
            return Err(if literal_origin.len() < origin.len() && origin.starts_with(literal_origin) {
                TemplateError::MacroInOrigin
            } else {
                TemplateError::OtherOrigin(origin)
            });
        };
        let mut parts = vec![Part::Literal(origin)];
        let mut position = Position::Path;
        let mut text = rest;
        while let Some(open) = text.find('{') {
            let literal = &text[..open];
            if literal.contains('#') {
                return Err(TemplateError::MacroInFragment);
            }
            if literal.contains('?') {
                position = Position::Query;
            }
            parts.push(Part::Literal(literal.to_owned()));
            let close = text[open..].find('}').ok_or(TemplateError::Unclosed)? + open;
            parts.push(Part::Macro { source: source(&text[open + 1..close])?, position });
            text = &text[close + 1..];
        }
        parts.push(Part::Literal(text.to_owned()));
        let template = Self { parts };
        if template.has_dot_segment(|| "x".to_owned()) {
            return Err(TemplateError::DotSegment);
        }
        Ok(template)
    }

    /// Whether the path, with its macros filled in turn by `fill`, has a `.` or `..` segment
    /// (also percent-encoded: URL parsers read `%2e` as a dot).
    fn has_dot_segment(&self, mut fill: impl FnMut() -> String) -> bool {
        let mut path = String::new();
        for part in &self.parts[1..] {
            match part {
                Part::Literal(text) => path.push_str(text),
                Part::Macro { position: Position::Query, .. } => break,
                Part::Macro { .. } => path.push_str(&fill()),
            }
        }
        let path = path.split(['?', '#']).next().unwrap_or_default().to_ascii_lowercase().replace("%2e", ".");
        path.split('/').any(|segment| segment == "." || segment == "..")
    }

    /// Whether the template carries the signature in the URL.
    pub fn uses_signature(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Macro { source: Source::Builtin(Builtin::Signature), .. }))
    }

    /// The URL for one attempt. `signature` fills `{signature}` (empty when `None`).
    pub fn render(&self, values: &Values<'_>, signature: Option<&str>) -> Result<String, RenderError> {
        let mut out = String::new();
        let mut filled = Vec::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Macro { source, position } => {
                    let raw = match source {
                        Source::Builtin(b) => builtin(*b, values, signature),
                        Source::Field(path) => field(values.payload, path)?,
                    };
                    let set = if *position == Position::Path { PATH_SEGMENT } else { QUERY_COMPONENT };
                    let encoded: String = utf8_percent_encode(&raw, set).collect();
                    out.push_str(&encoded);
                    filled.push(encoded);
                }
            }
        }
        let mut values = filled.into_iter();
        if self.has_dot_segment(|| values.next().unwrap_or_default()) {
            return Err(RenderError::DotSegment);
        }
        Ok(out)
    }

    /// The URL to record for an attempt: built-ins filled in, payload fields and the
    /// signature left as their macros, so click ids and payouts stay out of the log.
    pub fn recorded(&self, values: &Values<'_>) -> String {
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.push_str(text),
                Part::Macro { source: Source::Builtin(Builtin::Signature), .. } => out.push_str("{signature}"),
                Part::Macro { source: Source::Builtin(b), .. } => {
                    out.extend(utf8_percent_encode(&builtin(*b, values, None), QUERY_COMPONENT));
                }
                Part::Macro { source: Source::Field(path), .. } => {
                    out.push('{');
                    out.push_str(&path.join("."));
                    out.push('}');
                }
            }
        }
        out
    }
}

fn source(name: &str) -> Result<Source, TemplateError> {
    let valid = |segment: &str| !segment.is_empty() && segment.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let segments: Vec<&str> = name.split('.').collect();
    if !segments.iter().all(|s| valid(s)) {
        return Err(TemplateError::BadName(name.to_owned()));
    }
    if let Some(builtin) = name.strip_prefix("herald.") {
        return Builtin::named(builtin)
            .map(Source::Builtin)
            .ok_or_else(|| TemplateError::UnknownBuiltin(builtin.into()));
    }
    Ok(match Builtin::named(name) {
        Some(builtin) => Source::Builtin(builtin),
        None => Source::Field(segments.into_iter().map(str::to_owned).collect()),
    })
}

fn builtin(b: Builtin, values: &Values<'_>, signature: Option<&str>) -> String {
    match b {
        Builtin::MessageId => values.message_id.to_owned(),
        Builtin::EventType => values.event_type.to_owned(),
        Builtin::Timestamp => values.timestamp.to_string(),
        Builtin::Attempt => values.attempt.to_string(),
        Builtin::Signature => signature.unwrap_or_default().to_owned(),
    }
}

/// A scalar at `path` in the payload, as text.
fn field(payload: &Value, path: &[String]) -> Result<String, RenderError> {
    let value = path.iter().try_fold(payload, |v, key| v.get(key.as_str()));
    match value {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(Value::Bool(b)) => Ok(b.to_string()),
        _ => Err(RenderError::Missing(path.join("."))),
    }
}

/// The request target (path and query) of a rendered URL: what templated requests sign.
pub fn request_target(url: &Url) -> String {
    match url.query() {
        Some(query) => format!("{}?{query}", url.path()),
        None => url.path().to_owned(),
    }
}

/// The top-level scalar fields of a payload as a form body.
pub fn form_body(payload: &Value) -> String {
    let mut form = url::form_urlencoded::Serializer::new(String::new());
    if let Value::Object(map) = payload {
        for (key, value) in map {
            match value {
                Value::String(s) => {
                    form.append_pair(key, s);
                }
                Value::Number(_) | Value::Bool(_) => {
                    form.append_pair(key, &value.to_string());
                }
                _ => {}
            }
        }
    }
    form.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn url() -> Url {
        Url::parse("https://tracker.example/").unwrap()
    }

    fn render(template: &str, payload: Value) -> Result<String, RenderError> {
        let values = Values {
            message_id: "msg_1",
            event_type: "conversion",
            timestamp: 1700000000,
            attempt: 2,
            payload: &payload,
        };
        Template::parse(template, &url()).unwrap().render(&values, Some("v1,abc+/="))
    }

    #[test]
    fn macros_fill_path_segments_and_query_values_with_their_own_escaping() {
        let out = render(
            "https://tracker.example/pb/{campaign}/x?clickid={click_id}&payout={payout}&id={message_id}&n={attempt}",
            json!({"campaign": "summer sale/2", "click_id": "a&b=c d", "payout": 12.5}),
        );
        assert_eq!(
            out.unwrap(),
            "https://tracker.example/pb/summer%20sale%2F2/x?clickid=a%26b%3Dc%20d&payout=12.5&id=msg_1&n=2"
        );
    }

    #[test]
    fn non_ascii_and_reserved_characters_are_percent_encoded() {
        let out = render("https://tracker.example/p?q={v}&t={timestamp}&e={event_type}", json!({"v": "é#?+~"}));
        assert_eq!(out.unwrap(), "https://tracker.example/p?q=%C3%A9%23%3F%2B~&t=1700000000&e=conversion");
        let path = render("https://tracker.example/{v}", json!({"v": "ü;x"})).unwrap();
        assert_eq!(path, "https://tracker.example/%C3%BC%3Bx");
    }

    /// Regression (issue 16, finding 8): `..` rendered into a path segment climbed out of
    /// the template's path once the URL was parsed.
    #[test]
    fn values_that_make_dot_segments_cannot_fill_a_path() {
        for value in ["..", ".", "%2e%2E", ".%2e"] {
            let out = render("https://tracker.example/pb/{v}/x?n={attempt}", json!({"v": value}));
            let escaped = value.contains('%');
            assert!(escaped || out == Err(RenderError::DotSegment), "{value}: {out:?}");
            if escaped {
                assert!(out.unwrap().contains("%25"), "a literal % is escaped, so no dot segment can form");
            }
        }
        let split = render("https://tracker.example/{a}{b}/x", json!({"a": ".", "b": "."}));
        assert_eq!(split, Err(RenderError::DotSegment));
        let dotted = Template::parse("https://tracker.example/pb/.{v}/x", &url()).unwrap();
        let values = Values { message_id: "m", event_type: ".", timestamp: 0, attempt: 1, payload: &json!({"v": "."}) };
        assert_eq!(dotted.render(&values, None), Err(RenderError::DotSegment));
        assert_eq!(
            render("https://tracker.example/pb/{event_type}", json!({})).unwrap(),
            "https://tracker.example/pb/conversion"
        );
        let by_event = Template::parse("https://tracker.example/pb/{event_type}/x", &url()).unwrap();
        assert_eq!(by_event.render(&values, None), Err(RenderError::DotSegment), "an event type named `.`");
        // Dots that make no dot segment, and dot values in the query, are fine.
        let fine = render("https://tracker.example/pb/{v}?q={w}", json!({"v": "...", "w": ".."})).unwrap();
        assert_eq!(fine, "https://tracker.example/pb/...?q=..");
        assert_eq!(render("https://tracker.example/a{v}", json!({"v": ".."})).unwrap(), "https://tracker.example/a..");
        // A template whose own path has one is refused.
        for template in
            ["https://tracker.example/a/../{v}", "https://tracker.example/./{v}", "https://tracker.example/%2E%2e/x"]
        {
            assert_eq!(Template::parse(template, &url()), Err(TemplateError::DotSegment), "{template}");
        }
    }

    #[test]
    fn dotted_paths_reach_nested_fields_and_missing_ones_are_errors() {
        let nested = json!({"data": {"click_id": "c9", "list": [1], "nothing": null}});
        assert_eq!(
            render("https://tracker.example/?c={data.click_id}", nested.clone()).unwrap(),
            "https://tracker.example/?c=c9"
        );
        for missing in ["{data.absent}", "{data.list}", "{data.nothing}", "{data}", "{absent.deeper}"] {
            let err = render(&format!("https://tracker.example/?c={missing}"), nested.clone()).unwrap_err();
            assert!(matches!(err, RenderError::Missing(_)), "{missing}");
        }
    }

    #[test]
    fn builtins_shadow_fields_and_the_herald_namespace_is_checked() {
        let out =
            render("https://tracker.example/?a={attempt}&b={herald.attempt}&s={signature}", json!({"attempt": 9}));
        assert_eq!(out.unwrap(), "https://tracker.example/?a=2&b=2&s=v1%2Cabc%2B%2F%3D");
        let err = Template::parse("https://tracker.example/?x={herald.clickid}", &url()).unwrap_err();
        assert_eq!(err, TemplateError::UnknownBuiltin("clickid".into()));
    }

    #[test]
    fn templates_keep_the_endpoint_origin_and_well_formed_macros() {
        let parse = |t: &str| Template::parse(t, &url());
        assert_eq!(parse("https://{host}/pb").unwrap_err(), TemplateError::MacroInOrigin);
        assert!(matches!(parse("https://evil.example/pb").unwrap_err(), TemplateError::OtherOrigin(_)));
        assert!(matches!(parse("http://tracker.example/pb").unwrap_err(), TemplateError::OtherOrigin(_)));
        assert!(matches!(parse("https://tracker.example:8443/pb").unwrap_err(), TemplateError::OtherOrigin(_)));
        assert!(matches!(parse("https://tracker.example.evil/pb").unwrap_err(), TemplateError::OtherOrigin(_)));
        assert_eq!(parse("https://tracker.example/?a={b").unwrap_err(), TemplateError::Unclosed);
        assert!(matches!(parse("https://tracker.example/?a={}").unwrap_err(), TemplateError::BadName(_)));
        assert!(matches!(parse("https://tracker.example/?a={x y}").unwrap_err(), TemplateError::BadName(_)));
        assert_eq!(parse("https://tracker.example/#f={x}").unwrap_err(), TemplateError::MacroInFragment);
        let template = parse("https://tracker.example/pb?c={click_id}&n={attempt}&s={signature}").unwrap();
        let payload = json!({"click_id": "secret"});
        let values = Values { message_id: "m", event_type: "e", timestamp: 1, attempt: 3, payload: &payload };
        assert_eq!(template.recorded(&values), "https://tracker.example/pb?c={click_id}&n=3&s={signature}");
    }

    #[test]
    fn form_bodies_carry_top_level_scalars() {
        assert_eq!(form_body(&json!({"a": "x y", "n": 3, "nested": {"b": 1}})), "a=x+y&n=3");
    }
}
