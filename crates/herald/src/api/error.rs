//! API errors: the caller's mistakes map to 4xx with a stable machine-readable body
//! (`{"code","detail"}`, or Svix's 422 `{"detail":[{loc,msg,type}]}`); anything unexpected
//! is a 5xx whose body reveals nothing (the cause goes to the log).

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::store::StoreError;

/// One problem with a request field, in Svix's 422 format.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ValidationItem {
    pub loc: Vec<String>,
    pub msg: String,
    #[serde(rename = "type")]
    pub kind: String,
}

impl ValidationItem {
    /// A `value_error` at `body.<path>` (path segments separated by dots).
    pub fn body(path: &str, msg: impl Into<String>) -> Self {
        let mut loc = vec!["body".to_owned()];
        loc.extend(path.split('.').filter(|s| !s.is_empty()).map(str::to_owned));
        Self { loc, msg: msg.into(), kind: "value_error".into() }
    }

    /// A problem with a query parameter.
    pub fn query(name: &str, msg: impl Into<String>) -> Self {
        Self { loc: vec!["query".into(), name.into()], msg: msg.into(), kind: "value_error".into() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("authentication required")]
    Unauthorized,
    #[error("forbidden: {0}")]
    Forbidden(&'static str),
    #[error("{0} not found")]
    NotFound(&'static str),
    /// A route that exists, asked with a method it does not serve.
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("conflict: {0}")]
    Conflict(String),
    /// A conditional write lost a race with another write of the same row (see
    /// `optimistic`): the handler reads again. Never reaches a caller.
    #[error("the {0} changed since it was read")]
    Stale(&'static str),
    #[error("invalid request")]
    Validation(Vec<ValidationItem>),
    #[error("bad request: {0}")]
    BadRequest(String),
    /// A request Svix answers with 400 `generic_error` (a query string that does not parse).
    #[error("bad request: {0}")]
    GenericError(String),
    /// A 400 with Svix's own code (`invalid_range`, `limit_reached`, `invalid_scheme`, …).
    #[error("{0}: {1}")]
    Refused(&'static str, String),
    #[error("payload too large: {0}")]
    PayloadTooLarge(String),
    /// The request body did not arrive in time.
    #[error("request timeout: {0}")]
    RequestTimeout(String),
    /// What was asked for is no longer kept (a poller consumer behind the retention window).
    #[error("gone: {0}")]
    Gone(String),
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// The process is stopping after one of its tasks failed.
    #[error("the process is stopping after a failure")]
    Stopping,
    #[error("too many requests")]
    RateLimited(std::time::Duration),
    /// A cap on what a caller may hold at once (long-polls waiting), saying which.
    #[error("too many at once: {0}")]
    TooMany(&'static str),
    #[error("too many failed authentications")]
    TooManyFailedAuthentications(std::time::Duration),
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct HttpErrorOut {
    pub code: String,
    pub detail: String,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct HttpValidationError {
    pub detail: Vec<ValidationItem>,
}

impl ApiError {
    pub fn invalid(path: &str, msg: impl Into<String>) -> Self {
        Self::Validation(vec![ValidationItem::body(path, msg)])
    }

    pub fn status(&self) -> StatusCode {
        match self {
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::Conflict(_) | Self::Stale(_) => StatusCode::CONFLICT,
            Self::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::BadRequest(_) | Self::GenericError(_) | Self::Refused(..) => StatusCode::BAD_REQUEST,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            Self::Gone(_) => StatusCode::GONE,
            Self::Unavailable(_) | Self::Stopping => StatusCode::SERVICE_UNAVAILABLE,
            Self::RateLimited(_) | Self::TooManyFailedAuthentications(_) | Self::TooMany(_) => {
                StatusCode::TOO_MANY_REQUESTS
            }
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Conflict(what) => Self::Conflict(what.to_owned()),
            StoreError::Unavailable(why) => Self::Unavailable(why),
            StoreError::Other(e) => Self::Internal(e),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status();
        let retry_after_secs = match &self {
            Self::Unavailable(_) | Self::Stopping | Self::TooMany(_) => Some(1),
            Self::RateLimited(wait) | Self::TooManyFailedAuthentications(wait) => {
                Some(wait.as_millis().div_ceil(1000).max(1) as u64)
            }
            _ => None,
        };
        let (code, detail) = match self {
            Self::Validation(items) => {
                return (status, Json(HttpValidationError { detail: items })).into_response();
            }
            Self::Unauthorized => ("authentication_failed", "Invalid token".to_owned()),
            Self::Forbidden(why) => ("forbidden", why.to_owned()),
            Self::NotFound(what) => ("not_found", format!("{what} not found")),
            Self::MethodNotAllowed => ("method_not_allowed", "this route does not serve this method".into()),
            Self::Conflict(why) => ("conflict", why),
            Self::Stale(what) => ("conflict", format!("the {what} changed while this request was applied; try again")),
            Self::BadRequest(why) => ("bad_request", why),
            Self::GenericError(why) => ("generic_error", why),
            Self::Refused(code, why) => (code, why),
            Self::PayloadTooLarge(why) => ("payload_too_large", why),
            Self::RequestTimeout(why) => ("request_timeout", why),
            Self::Gone(why) => ("position_expired", why),
            Self::RateLimited(_) => ("rate_limited", "this token sent too many requests; retry after the delay".into()),
            Self::TooMany(why) => ("rate_limited", format!("{why}; retry after the delay")),
            Self::TooManyFailedAuthentications(_) => {
                ("rate_limited", "too many failed authentications from this address; retry after the delay".into())
            }
            Self::Unavailable(why) => {
                tracing::warn!(reason = %why, "answering 503: storage unavailable");
                ("unavailable", format!("storage is temporarily unavailable ({why}); retry later"))
            }
            Self::Stopping => (
                "unavailable",
                "this Herald process is stopping after an internal failure; retry (it restarts, or another answers)"
                    .to_owned(),
            ),
            Self::Internal(e) => {
                tracing::error!(error = ?e, "internal error while handling a request");
                ("internal", "internal server error".to_owned())
            }
        };
        let mut response = (status, Json(HttpErrorOut { code: code.into(), detail })).into_response();
        if let Some(secs) = retry_after_secs {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

pub type ApiResult<T> = Result<T, ApiError>;
