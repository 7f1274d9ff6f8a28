//! A poller's consumers (Herald extension): `GET …/poller/{poller}/consumer/{name}` reads the
//! next page of what the poller holds and acknowledges the previous one; `POST …/seek` moves
//! a consumer. Each named consumer keeps its own position server side, which moves only
//! forward when the consumer asks with the iterator it was given (at-least-once), or
//! anywhere with a seek.
//!
//! A long-poll (`wait_ms`) waits on its application's wake-ups only (`store::AppWakeups`),
//! and each wake-up reads on from where the request stopped, never from its start again:
//! the poller's filter runs at most once per message per request. Long-polls waiting at
//! once are capped per application and per token ([`WaitingPolls`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::DateTime;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use tokio::time::Instant;

use super::AppState;
use super::auth::Principal;
use super::error::{ApiError, ApiResult, ValidationItem};
use super::extract::JsonBody;
use super::scope::VisiblePoller;
use super::validate::Problems;
use crate::clock::to_rfc3339;
use crate::config::TenantLimits;
use crate::ids::{AppId, MessageId};
use crate::scripts::{self, Verdict};
use crate::store::{App, LOG_RECHECK, LogPosition, Message, Move, Poller};

/// Messages a page holds at most (and by default).
const MAX_LIMIT: usize = 250;
const DEFAULT_LIMIT: usize = 50;
/// The longest long-poll.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// Messages one request looks at at most, matching or not, over all its wake-ups: a poller
/// that matches little of a busy application answers with fewer (or none) and an iterator
/// past what it read.
const SCAN_BUDGET: usize = 2_000;

/// One message as a consumer reads it.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolledMessage {
    pub id: String,
    pub event_type: String,
    pub event_id: Option<String>,
    pub channels: Option<Vec<String>>,
    pub timestamp: String,
    #[schema(value_type = Object)]
    pub payload: Box<RawValue>,
}

/// A page of a consumer's messages.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PolledPage {
    pub data: Vec<PolledMessage>,
    /// Ask with this next: it acknowledges this page and reads on from its end.
    pub iterator: String,
    /// Whether the consumer has read everything committed so far.
    pub done: bool,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct ConsumerQuery {
    /// Messages at most (1–250, default 50).
    pub limit: Option<usize>,
    /// The iterator of the previous page: acknowledges it.
    pub iterator: Option<String>,
    /// When nothing is there yet, wait up to this long (at most 30,000 ms) and answer as
    /// soon as a message arrives.
    pub wait_ms: Option<u64>,
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub struct SeekIn {
    /// An RFC 3339 time (read on from the messages created then), or a message id (read on
    /// from the message after it).
    pub after: String,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SeekOut {
    pub iterator: String,
}

/// Long-polls waiting at once, per application and per portal token, within the
/// `[tenants]` caps. Each waiting request holds a [`Waiting`], which counts it until the
/// request ends, however it ends (an answer, or the client hanging up).
pub struct WaitingPolls {
    limits: TenantLimits,
    counts: Mutex<Counts>,
}

#[derive(Default)]
struct Counts {
    apps: HashMap<AppId, usize>,
    tokens: HashMap<String, usize>,
}

pub struct Waiting<'a> {
    polls: &'a WaitingPolls,
    app: AppId,
    token: Option<String>,
}

impl WaitingPolls {
    pub fn new(limits: TenantLimits) -> Self {
        Self { limits, counts: Mutex::default() }
    }

    /// Long-polls waiting now, per application (for `/metrics`).
    pub fn waiting(&self) -> Vec<(AppId, usize)> {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.apps.iter().map(|(app, n)| (app.clone(), *n)).collect()
    }

    /// Counts one more long-poll of `app` by `principal`, or refuses it (429) at a cap.
    fn enter(&self, app: &AppId, principal: &Principal) -> ApiResult<Waiting<'_>> {
        let token = match principal {
            Principal::Admin => None,
            Principal::App { token_hash, .. } => Some(token_hash.clone()),
        };
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        if counts.apps.get(app).copied().unwrap_or(0) >= self.limits.max_waiting_polls {
            return Err(ApiError::TooMany("this application has the most long-polls waiting at once"));
        }
        if let Some(token) = &token
            && counts.tokens.get(token).copied().unwrap_or(0) >= self.limits.max_waiting_polls_per_token
        {
            return Err(ApiError::TooMany("this token has the most long-polls waiting at once"));
        }
        *counts.apps.entry(app.clone()).or_default() += 1;
        if let Some(token) = &token {
            *counts.tokens.entry(token.clone()).or_default() += 1;
        }
        Ok(Waiting { polls: self, app: app.clone(), token })
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut counts = self.polls.counts.lock().unwrap_or_else(|p| p.into_inner());
        let counts = &mut *counts;
        leave(&mut counts.apps, &self.app);
        if let Some(token) = &self.token {
            leave(&mut counts.tokens, token);
        }
    }
}

/// One fewer for `key`; a key at zero is forgotten, so the maps hold only who is waiting.
fn leave<K: std::hash::Hash + Eq>(counts: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}

/// The iterator text of a position (opaque to consumers).
fn iterator_of(at: &LogPosition) -> String {
    URL_SAFE_NO_PAD.encode(format!("{}.{}", at.major, at.minor))
}

fn position_of(iterator: &str) -> ApiResult<LogPosition> {
    let bad = || ApiError::invalid("iterator", "is not an iterator this poller gave");
    let text = URL_SAFE_NO_PAD.decode(iterator).ok().and_then(|raw| String::from_utf8(raw).ok()).ok_or_else(bad)?;
    let (major, minor) = text.split_once('.').ok_or_else(bad)?;
    Ok(LogPosition { major: major.parse().map_err(|_| bad())?, minor: minor.to_owned() })
}

fn check_consumer(name: &str) -> ApiResult<()> {
    let mut problems = Problems::default();
    problems.slug("consumer_id", name, 64);
    problems.finish()
}

/// A new consumer beyond the poller's cap.
fn too_many_consumers(cap: usize) -> ApiError {
    let loc = vec!["path".into(), "consumer_id".into()];
    let msg = format!("this poller has {cap} consumers, the most it may have (tenants.max_consumers_per_poller)");
    ApiError::Validation(vec![ValidationItem { loc, msg, kind: "value_error".into() }])
}

#[utoipa::path(get, path = "/api/v1/app/{app_id}/poller/{poller_id}/consumer/{consumer_id}",
    operation_id = "herald.poller.consume", tag = "Poller",
    params(("app_id" = String, Path), ("poller_id" = String, Path), ("consumer_id" = String, Path), ConsumerQuery),
    responses((status = 200, body = PolledPage), (status = 410, body = super::error::HttpErrorOut),
        (status = 429, body = super::error::HttpErrorOut)))]
pub async fn consume(
    State(state): State<AppState>,
    principal: Principal,
    poller: VisiblePoller,
    Path((_, _, consumer)): Path<(String, String, String)>,
    Query(query): Query<ConsumerQuery>,
) -> ApiResult<Json<PolledPage>> {
    let (app, poller) = poller.into_parts();
    // Everything is checked before anything moves: a refused request leaves the consumer.
    check_consumer(&consumer)?;
    let limit = query.limit.unwrap_or(DEFAULT_LIMIT);
    if !(1..=MAX_LIMIT).contains(&limit) {
        return Err(ApiError::invalid("limit", format!("must be between 1 and {MAX_LIMIT}")));
    }
    let wait = Duration::from_millis(query.wait_ms.unwrap_or(0));
    if wait > MAX_WAIT {
        return Err(ApiError::invalid("wait_ms", "must be at most 30000"));
    }
    let iterator = query.iterator.as_deref().map(position_of).transpose()?;
    // An iterator acknowledges the page before it: the consumer's position moves there (it
    // never moves back; an older iterator reads again from where it points).
    let start = match iterator {
        Some(at) => {
            let cap = state.settings.tenants.max_consumers_per_poller;
            if !state.store.move_consumer(&poller.id, &consumer, &at, Move::Forward, cap).await? {
                return Err(too_many_consumers(cap));
            }
            at
        }
        None => state.store.consumer_position(&poller.id, &consumer).await?.unwrap_or_default(),
    };
    let mut scan = Scan { data: Vec::new(), at: start, scanned: 0, limit, done: false };
    long_poll(&state, &principal, &app, &poller, &mut scan, Instant::now() + wait).await?;
    Ok(Json(scan.page()))
}

/// Reads into `scan` until it holds something, or until `deadline`, waiting between reads
/// for the application's wake-ups (and on a shared store, its log head moving).
async fn long_poll(
    state: &AppState,
    principal: &Principal,
    app: &App,
    poller: &Poller,
    scan: &mut Scan,
    deadline: Instant,
) -> ApiResult<()> {
    let watch = state.store.signals().messages.watch(&app.id);
    let mut waiting = None;
    loop {
        // Listening before reading, so a message committed in between still wakes it.
        let woken = watch.notify.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        scan.done = scan.read_more(state, principal, app, poller).await?;
        if !scan.done || !scan.data.is_empty() || Instant::now() >= deadline {
            return Ok(());
        }
        if waiting.is_none() {
            waiting = Some(state.long_polls.enter(&app.id, principal)?);
        }
        loop {
            let recheck = if state.store.shared() { LOG_RECHECK } else { MAX_WAIT };
            tokio::select! {
                () = woken.as_mut() => break,
                () = tokio::time::sleep_until(deadline.min(Instant::now() + recheck)) => {}
            }
            if Instant::now() >= deadline {
                return Ok(());
            }
            if state.store.shared() && watch.recheck(state.store.as_ref(), &app.id).await? {
                break;
            }
        }
    }
}

/// One request's read of a poller: what it holds so far, where reading stopped, and how
/// much of the budget it used.
struct Scan {
    data: Vec<PolledMessage>,
    at: LogPosition,
    scanned: usize,
    limit: usize,
    /// Whether the last read reached the end of what is committed.
    done: bool,
}

impl Scan {
    /// Reads on from where the scan stopped; true when it reached the end of what is
    /// committed, false when it stopped at the page's size or the scan budget.
    async fn read_more(
        &mut self,
        state: &AppState,
        principal: &Principal,
        app: &App,
        poller: &Poller,
    ) -> ApiResult<bool> {
        let mask = state.mask_for(principal);
        let batch_size = (self.limit * 2).clamp(50, 500);
        loop {
            let batch = state.store.messages_after(&app.id, &self.at, batch_size).await?;
            let exhausted = batch.len() < batch_size;
            for (position, message) in batch {
                let Some(payload) = message.payload.as_deref() else {
                    // Past the retention window: say where reading can resume.
                    if self.data.is_empty() {
                        return Err(expired(state, app, &position).await);
                    }
                    return Ok(false);
                };
                self.scanned += 1;
                if holds(state, poller, &message).await? {
                    let shown =
                        mask.and_then(|r| r.mask(&message.event_type, payload)).unwrap_or_else(|| payload.to_owned());
                    self.data.push(PolledMessage {
                        id: message.id.to_string(),
                        event_type: message.event_type.clone(),
                        event_id: message.event_id.clone(),
                        channels: message.channels.clone(),
                        timestamp: to_rfc3339(message.created_at),
                        payload: RawValue::from_string(shown).map_err(|e| ApiError::Internal(e.into()))?,
                    });
                }
                self.at = position;
                if self.data.len() == self.limit || self.scanned >= SCAN_BUDGET {
                    return Ok(false);
                }
            }
            if exhausted {
                return Ok(true);
            }
        }
    }

    fn page(self) -> PolledPage {
        PolledPage { iterator: iterator_of(&self.at), done: self.done, data: self.data }
    }
}

/// Whether the poller holds `message` (its event types, channels and filter).
async fn holds(state: &AppState, poller: &Poller, message: &Message) -> ApiResult<bool> {
    let types_ok = poller.event_types.as_ref().is_none_or(|types| types.contains(&message.event_type));
    let channels_ok = poller
        .channels
        .as_ref()
        .is_none_or(|wanted| message.channels.as_ref().is_some_and(|have| have.iter().any(|c| wanted.contains(c))));
    if !types_ok || !channels_ok {
        return Ok(false);
    }
    let Some(code) = &poller.filter else { return Ok(true) };
    let input = scripts::input(message, &[], "GET", "");
    match Verdict::of(state.sandbox.eval(&poller.app_id, code, &input).await) {
        Verdict::Pass => Ok(true),
        Verdict::Drop(_) => Ok(false),
        Verdict::Unavailable(why) => Err(ApiError::Unavailable(why)),
    }
}

/// The answer to a consumer whose next message is past the retention window: where the
/// retained messages begin.
async fn expired(state: &AppState, app: &App, first_gone: &LogPosition) -> ApiError {
    let mut at = first_gone.clone();
    loop {
        match state.store.messages_after(&app.id, &at, 500).await {
            Ok(batch) if batch.is_empty() => break,
            Ok(batch) => match batch.iter().position(|(_, m)| m.payload.is_some()) {
                Some(0) => break,
                Some(i) => {
                    at = batch[i - 1].0.clone();
                    break;
                }
                None => at = batch.last().expect("not empty").0.clone(),
            },
            Err(e) => return e.into(),
        }
    }
    ApiError::Gone(format!(
        "the messages after this position are past the retention window; resume with iterator {}",
        iterator_of(&at)
    ))
}

#[utoipa::path(post, path = "/api/v1/app/{app_id}/poller/{poller_id}/consumer/{consumer_id}/seek",
    operation_id = "herald.poller.seek", tag = "Poller", request_body = SeekIn,
    params(("app_id" = String, Path), ("poller_id" = String, Path), ("consumer_id" = String, Path)),
    responses((status = 200, body = SeekOut)))]
pub async fn seek(
    State(state): State<AppState>,
    poller: VisiblePoller,
    Path((_, _, consumer)): Path<(String, String, String)>,
    body: JsonBody<SeekIn>,
) -> ApiResult<Json<SeekOut>> {
    let (app, poller) = poller.into_parts();
    check_consumer(&consumer)?;
    let after = body.value.after;
    let at = if let Ok(time) = DateTime::parse_from_rfc3339(&after) {
        state.store.position_at(&app.id, time.timestamp_millis()).await?
    } else {
        let id = MessageId::parse(&after)
            .ok_or_else(|| ApiError::invalid("after", "must be an RFC 3339 time or a message id"))?;
        state.store.message_position(&app.id, &id).await?.ok_or(ApiError::NotFound("message"))?
    };
    let cap = state.settings.tenants.max_consumers_per_poller;
    if !state.store.move_consumer(&poller.id, &consumer, &at, Move::To, cap).await? {
        return Err(too_many_consumers(cap));
    }
    Ok(Json(SeekOut { iterator: iterator_of(&at) }))
}
