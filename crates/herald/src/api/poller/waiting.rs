//! The caps on long-polls waiting at once (`[tenants] max_waiting_polls` per application,
//! `max_waiting_polls_per_token` per portal token).

use std::collections::HashMap;
use std::sync::Mutex;

use crate::api::auth::Principal;
use crate::api::error::{ApiError, ApiResult};
use crate::config::TenantLimits;
use crate::ids::AppId;

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
    pub(super) fn enter(&self, app: &AppId, principal: &Principal) -> ApiResult<Waiting<'_>> {
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
