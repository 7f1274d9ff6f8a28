//! Request extraction with Svix-shaped errors: JSON bodies (422 naming the field, 413 for
//! oversized bodies, 400 for malformed JSON) and query parameters (repeated or
//! comma-separated lists, RFC 3339 times, 422 naming the parameter).

use std::collections::HashMap;
use std::str::FromStr;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;

use super::AppState;
use super::error::{ApiError, ValidationItem};
use crate::clock::{Millis, parse_time};
use crate::serving::BodyTimedOut;

/// A JSON body parsed into `T`, with Svix-shaped errors (depth cap, 413, 422 naming the field).
pub struct JsonBody<T> {
    pub value: T,
}

impl<T: DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let raw = read_body(req.into_body(), state.limits.body_bytes).await?;
        Ok(Self { value: parse_json(&raw)? })
    }
}

/// Reads a whole request body of at most `limit` bytes: 413 beyond it, 408 when it did not
/// arrive within `http.body_read_timeout` (see `serving`), 400 when the client broke off.
pub async fn read_body(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        while let Some(error) = cause {
            if let Some(timed_out) = error.downcast_ref::<BodyTimedOut>() {
                return ApiError::RequestTimeout(timed_out.to_string());
            }
            if error.is::<http_body_util::LengthLimitError>() {
                return ApiError::PayloadTooLarge(format!("the request body exceeds {limit} bytes"));
            }
            cause = error.source();
        }
        ApiError::BadRequest("the request body could not be read".into())
    })
}

/// An RFC 3339 time given in a body field, in milliseconds (422 naming the field otherwise).
pub fn body_time(field: &str, raw: Option<&str>) -> Result<Option<Millis>, ApiError> {
    raw.map(|r| parse_time(r).ok_or_else(|| ApiError::invalid(field, "is not a valid timestamp (RFC 3339)")))
        .transpose()
}

/// Deepest nesting of arrays and objects accepted in a request body.
pub const MAX_JSON_DEPTH: usize = 64;

/// Parses JSON, mapping syntax errors to 400 and shape errors to 422 with the field's path.
/// Bodies nested deeper than [`MAX_JSON_DEPTH`] are refused before parsing.
pub fn parse_json<T: DeserializeOwned>(raw: &[u8]) -> Result<T, ApiError> {
    if json_depth(raw) > MAX_JSON_DEPTH {
        return Err(ApiError::BadRequest(format!("the body is nested deeper than {MAX_JSON_DEPTH} levels")));
    }
    // The common case in one pass; a refusal is parsed again to say where it went wrong.
    if let Ok(value) = serde_json::from_slice(raw) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(raw);
    serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let inner = err.inner();
        if inner.is_syntax() || inner.is_eof() {
            return ApiError::BadRequest(format!("the body is not valid JSON: {inner}"));
        }
        let mut loc = vec!["body".to_owned()];
        for segment in err.path().iter() {
            match segment {
                Segment::Seq { index } => loc.push(index.to_string()),
                Segment::Map { key } | Segment::Enum { variant: key } => loc.push(key.clone()),
                Segment::Unknown => {}
            }
        }
        let msg = strip_position(&inner.to_string());
        if let Some(field) = msg.strip_prefix("missing field `").and_then(|s| s.split('`').next()) {
            loc.push(field.to_owned());
        }
        let kind = if msg.starts_with("missing field") { "missing" } else { "type_error" };
        ApiError::Validation(vec![ValidationItem { loc, msg, kind: kind.into() }])
    })
}

/// The deepest nesting of `[` and `{` in JSON text (strings skipped), in one pass.
fn json_depth(raw: &[u8]) -> usize {
    let (mut depth, mut deepest, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for &b in raw {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// serde_json appends " at line 1 column 7", which means nothing to API users.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(at) => msg[..at].to_owned(),
        None => msg.to_owned(),
    }
}

/// Query parameters, read by name with typed accessors.
pub struct QueryMap(HashMap<String, Vec<String>>);

impl<S: Send + Sync> FromRequestParts<S> for QueryMap {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, ApiError> {
        let mut map: HashMap<String, Vec<String>> = HashMap::new();
        for (key, value) in url::form_urlencoded::parse(parts.uri.query().unwrap_or("").as_bytes()) {
            map.entry(key.into_owned()).or_default().push(value.into_owned());
        }
        Ok(Self(map))
    }
}

impl QueryMap {
    fn raw(&self, name: &str) -> Option<&str> {
        self.0.get(name).and_then(|values| values.last()).map(String::as_str)
    }

    /// A parameter parsed with `FromStr`. One that does not parse is a 400 (Svix's
    /// `generic_error`: its query strings are deserialized as a whole).
    pub fn get<T: FromStr>(&self, name: &str) -> Result<Option<T>, ApiError> {
        match self.raw(name) {
            None | Some("") => Ok(None),
            Some(raw) => raw.parse().map(Some).map_err(|_| {
                ApiError::GenericError(format!("Failed to deserialize query string: {name}: invalid value {raw:?}"))
            }),
        }
    }

    pub fn flag(&self, name: &str, default: bool) -> Result<bool, ApiError> {
        Ok(self.get(name)?.unwrap_or(default))
    }

    /// A timestamp (RFC 3339, or Svix's other forms: see `clock::parse_time`), in
    /// milliseconds; one that does not parse is a 400, as in Svix.
    pub fn time(&self, name: &str) -> Result<Option<Millis>, ApiError> {
        match self.raw(name) {
            None | Some("") => Ok(None),
            Some(raw) => parse_time(raw).map(Some).ok_or_else(|| {
                ApiError::GenericError(format!(
                    "Failed to deserialize query string: {name}: {raw:?} is not a timestamp"
                ))
            }),
        }
    }

    /// A list given as repeated parameters, comma-separated values, or both.
    pub fn list(&self, name: &str) -> Vec<String> {
        let names = [name.to_owned(), format!("{name}[]")];
        names
            .iter()
            .filter_map(|n| self.0.get(n))
            .flatten()
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }
}

/// The caller's W3C `traceparent` header, if it sent one (the only header a traced
/// request needs: taking it alone spares every request a copy of all its headers).
pub struct TraceParent(pub Option<axum::http::HeaderValue>);

impl<S: Send + Sync> FromRequestParts<S> for TraceParent {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(Self(parts.headers.get("traceparent").cloned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_counts_nesting_outside_strings() {
        assert_eq!(json_depth(br#"{"a": [1, {"b": 2}]}"#), 3);
        assert_eq!(json_depth(br#"{"a": "[[[[{{{{\"[["}"#), 1);
        assert_eq!(json_depth(b"42"), 0);
    }

    #[test]
    fn deeply_nested_bodies_are_refused_with_400() {
        let deep = format!("{}{}", "[".repeat(MAX_JSON_DEPTH + 1), "]".repeat(MAX_JSON_DEPTH + 1));
        assert!(matches!(parse_json::<serde_json::Value>(deep.as_bytes()), Err(ApiError::BadRequest(_))));
        let fine = format!("{}{}", "[".repeat(MAX_JSON_DEPTH), "]".repeat(MAX_JSON_DEPTH));
        assert!(parse_json::<serde_json::Value>(fine.as_bytes()).is_ok());
    }
}
