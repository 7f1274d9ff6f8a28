//! One side of an import: a server speaking the Svix API, reached with its token. Answers
//! are JSON; a refusal is a [`Refusal`] that says why in the server's own words. Rate
//! limits (429) and brief outages (502–504, a dropped connection) are waited out a few
//! times before they count as a refusal.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::Value;

use crate::operator_client::{OperatorClient, operator_client};

/// Longest one request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Largest answer read (a page of 250 event types with their schemas fits many times).
const ANSWER_LIMIT: usize = 64 * 1024 * 1024;
/// Tries of a request the server asked to slow down or could not serve for a moment.
const TRIES: u32 = 5;
/// The longest wait between tries, whatever `Retry-After` says.
const LONGEST_WAIT: Duration = Duration::from_secs(10);
/// Items per page asked of list routes (Svix's most).
const PAGE: usize = 250;

/// Why a request did not do what it asked: the status (none: no answer) and the server's
/// reason.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub status: Option<u16>,
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            Some(status) => write!(f, "{status}: {}", self.reason),
            None => f.write_str(&self.reason),
        }
    }
}

impl Refusal {
    fn new(status: Option<u16>, reason: impl Into<String>) -> Self {
        Self { status, reason: reason.into() }
    }

    /// The server's reason from a Svix error body: `detail` as text, or each validation
    /// item as `location: message`.
    fn from_answer(status: StatusCode, body: &[u8]) -> Self {
        let reason = match serde_json::from_slice::<Value>(body).ok().and_then(|v| v.get("detail").cloned()) {
            Some(Value::String(text)) => text,
            Some(Value::Array(items)) => items.iter().map(validation_item).collect::<Vec<_>>().join("; "),
            _ => String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned(),
        };
        Self::new(Some(status.as_u16()), reason)
    }
}

fn validation_item(item: &Value) -> String {
    let loc = item["loc"].as_array().map(|parts| {
        parts
            .iter()
            .filter(|p| p.as_str() != Some("body"))
            .map(|p| p.to_string().trim_matches('"').to_owned())
            .collect::<Vec<_>>()
            .join(".")
    });
    let msg = item["msg"].as_str().unwrap_or("invalid");
    match loc {
        Some(loc) if !loc.is_empty() => format!("{loc}: {msg}"),
        _ => msg.to_owned(),
    }
}

/// A server and the token the import uses with it.
#[derive(Clone)]
pub struct Api {
    base: String,
    token: String,
    client: OperatorClient,
}

impl Api {
    /// `base` is the server's address (`https://api.svix.com`, `http://127.0.0.1:8071`).
    pub fn new(base: &str, token: &str) -> anyhow::Result<Self> {
        let parsed = url::Url::parse(base).map_err(|e| anyhow::anyhow!("{base}: not a URL ({e})"))?;
        anyhow::ensure!(matches!(parsed.scheme(), "http" | "https"), "{base}: only http and https servers");
        Ok(Self { base: base.trim_end_matches('/').to_owned(), token: token.to_owned(), client: operator_client() })
    }

    pub async fn get(&self, path: &str) -> Result<Value, Refusal> {
        self.send(Method::GET, path, None).await
    }

    /// Every item of a list route, following its iterators; `query` adds to `limit` and
    /// `iterator` (`include_archived=true`).
    pub async fn list(&self, path: &str, query: &str) -> Result<Vec<Value>, Refusal> {
        let mut items = Vec::new();
        let mut iterator: Option<String> = None;
        loop {
            let mut url = format!("{path}?limit={PAGE}");
            if !query.is_empty() {
                url = format!("{url}&{query}");
            }
            if let Some(at) = &iterator {
                url = format!(
                    "{url}&iterator={}",
                    percent_encoding::utf8_percent_encode(at, percent_encoding::NON_ALPHANUMERIC)
                );
            }
            let page = self.get(&url).await?;
            let data = page["data"]
                .as_array()
                .ok_or_else(|| Refusal::new(None, format!("{path}: the answer has no data list")))?;
            items.extend(data.iter().cloned());
            let next = page["iterator"].as_str().map(str::to_owned);
            if page["done"].as_bool().unwrap_or(true) || data.is_empty() || next.is_none() || next == iterator {
                return Ok(items);
            }
            iterator = next;
        }
    }

    /// A request with a JSON body (none for GET and DELETE); the answer's JSON (`null` for
    /// 204), or why it was refused.
    pub async fn send(&self, method: Method, path: &str, body: Option<&Value>) -> Result<Value, Refusal> {
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let mut tries = 0;
        loop {
            tries += 1;
            let wait = match self.exchange(method.clone(), path, body.clone()).await {
                Ok((status, answer)) if status.is_success() => {
                    return if answer.body.is_empty() {
                        Ok(Value::Null)
                    } else {
                        serde_json::from_slice(&answer.body)
                            .map_err(|e| Refusal::new(Some(status.as_u16()), format!("the answer is not JSON: {e}")))
                    };
                }
                Ok((status, answer)) => {
                    let refusal = Refusal::from_answer(status, &answer.body);
                    if !passing(status) || tries == TRIES {
                        return Err(refusal);
                    }
                    answer.retry_after.unwrap_or(backoff(tries))
                }
                Err(refusal) if tries == TRIES => return Err(refusal),
                Err(_) => backoff(tries),
            };
            tokio::time::sleep(wait.min(LONGEST_WAIT)).await;
        }
    }

    async fn exchange(&self, method: Method, path: &str, body: Bytes) -> Result<(StatusCode, Answer), Refusal> {
        let request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header(header::AUTHORIZATION, format!("Bearer {}", self.token))
            .header(header::ACCEPT, "application/json")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::USER_AGENT, concat!("herald-import/", env!("CARGO_PKG_VERSION")))
            .body(Full::new(body))
            .map_err(|e| Refusal::new(None, format!("{path}: {e}")))?;
        let exchange = async {
            let response =
                self.client.request(request).await.map_err(|e| Refusal::new(None, format!("{}: {e}", self.base)))?;
            let status = response.status();
            let retry_after = response
                .headers()
                .get(header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            let body = Limited::new(response.into_body(), ANSWER_LIMIT)
                .collect()
                .await
                .map_err(|e| Refusal::new(Some(status.as_u16()), format!("reading the answer: {e}")))?
                .to_bytes();
            Ok((status, Answer { body, retry_after }))
        };
        tokio::time::timeout(REQUEST_TIMEOUT, exchange).await.unwrap_or_else(|_| {
            Err(Refusal::new(None, format!("{}: no answer within {} s", self.base, REQUEST_TIMEOUT.as_secs())))
        })
    }
}

struct Answer {
    body: Bytes,
    retry_after: Option<Duration>,
}

/// Statuses that say "not now" rather than "no".
fn passing(status: StatusCode) -> bool {
    matches!(status.as_u16(), 429 | 502 | 503 | 504)
}

fn backoff(tries: u32) -> Duration {
    Duration::from_millis(250 << tries.min(5))
}
