//! One request's read of a poller: the scan from a position through the application's
//! message log (event types, channels, the filter in the sandbox, masking), and the
//! long-poll around it, which waits on the application's wake-ups and reads on from where
//! the scan stopped.

use std::time::Duration;

use serde_json::value::RawValue;
use tokio::time::Instant;

use super::consumer::{PolledMessage, PolledPage};
use super::iterator::iterator_of;
use crate::api::AppState;
use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::clock::to_rfc3339;
use crate::scripts::{self, Verdict};
use crate::store::{App, LOG_RECHECK, LogPosition, Message, Poller};

/// The longest long-poll.
pub(super) const MAX_WAIT: Duration = Duration::from_secs(30);
/// Messages one request looks at at most, matching or not, over all its wake-ups: a poller
/// that matches little of a busy application answers with fewer (or none) and an iterator
/// past what it read.
const SCAN_BUDGET: usize = 2_000;

/// Reads into `scan` until it holds something, or until `deadline`, waiting between reads
/// for the application's wake-ups (and on a shared store, its log head moving).
pub(super) async fn long_poll(
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
pub(super) struct Scan {
    data: Vec<PolledMessage>,
    at: LogPosition,
    scanned: usize,
    limit: usize,
    /// Whether the last read reached the end of what is committed.
    done: bool,
}

impl Scan {
    /// A scan from `start` for a page of at most `limit` messages.
    pub(super) fn new(start: LogPosition, limit: usize) -> Self {
        Self { data: Vec::new(), at: start, scanned: 0, limit, done: false }
    }

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

    pub(super) fn page(self) -> PolledPage {
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
