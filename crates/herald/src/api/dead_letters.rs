//! Dead letters (Herald extensions): the analysis per endpoint with a pattern and a hint,
//! and filtered bulk replay across an application's endpoints as a background task, with
//! a dry-run count first.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};

use super::auth::Principal;
use super::error::{ApiError, ApiResult};
use super::extract::{JsonBody, QueryMap, body_time};
use super::routes::Routes;
use super::{AppState, VisibleApp, VisibleEndpoint};
use crate::clock::{Millis, now_ms, to_rfc3339};
use crate::dead_letters::{EndpointDeadLetters, analyse};
use crate::ids::AppId;
use crate::replay::ReplayTask;
use crate::store::DeadLetterFilter;
use utoipa_axum::routes;

/// Dead letters read at most for one analysis or replay.
const MAX_ROWS: usize = 100_000;

pub fn routes() -> Routes {
    Routes::new()
        .operations(routes!(dead_letter_stats))
        .operations(routes!(replay))
        .operations(routes!(replay_progress))
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterStatsOut {
    pub hours: u32,
    pub data: Vec<EndpointDeadLetters>,
}

/// Dead letters of the last `hours` (default 24, at most 720) per endpoint, most first.
/// The admin token sees every application (or `appId`); a portal token its own.
#[utoipa::path(get, path = "/api/v1/stats/dead-letters", operation_id = "herald.stats.dead-letters", tag = "Stats",
    params(("hours" = Option<u32>, Query), ("appId" = Option<String>, Query)),
    responses((status = 200, body = DeadLetterStatsOut)))]
pub async fn dead_letter_stats(
    State(state): State<AppState>,
    principal: Principal,
    query: QueryMap,
) -> ApiResult<Json<DeadLetterStatsOut>> {
    let hours: u32 = query.get("hours")?.unwrap_or(24);
    if !(1..=720).contains(&hours) {
        return Err(ApiError::invalid("hours", "must be between 1 and 720"));
    }
    let app = match (&principal, query.get::<String>("appId")?) {
        (Principal::App { app_id, .. }, _) => Some(app_id.clone()),
        (Principal::Admin, Some(id)) => Some(VisibleApp::resolve(&state, &principal, &id).await?.id.clone()),
        (Principal::Admin, None) => None,
    };
    let filter = DeadLetterFilter {
        app,
        dead_since: now_ms() - Millis::from(hours) * 3_600_000,
        limit: MAX_ROWS,
        ..Default::default()
    };
    let letters = state.store.dead_letters(&filter).await?;
    Ok(Json(DeadLetterStatsOut { hours, data: analyse(&letters) }))
}

#[derive(Deserialize, Default, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplayIn {
    /// Only this endpoint (id or uid).
    pub endpoint_id: Option<String>,
    /// The last attempt's status code (0: no response).
    pub status_code: Option<u16>,
    /// The last attempt's error class (`http_status`, `timeout`, …).
    pub error_class: Option<String>,
    pub event_type: Option<String>,
    /// RFC 3339: dead since (default: any time).
    pub since: Option<String>,
    /// RFC 3339: dead before (default: now).
    pub until: Option<String>,
    /// Only count what would be replayed.
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplayOut {
    /// Absent for a dry run.
    pub task_id: Option<String>,
    /// "dryRun", "running", "finished" or "failed".
    pub status: String,
    /// Dead letters matching the filter.
    pub total: u64,
    /// Put back in the queue so far.
    pub replayed: u64,
    pub started_at: Option<String>,
    pub finished_at: Option<String>,
}

impl ReplayOut {
    fn of(task: &ReplayTask) -> Self {
        Self {
            task_id: Some(task.id.to_string()),
            status: task.status().into(),
            total: task.total,
            replayed: task.replayed(),
            started_at: Some(to_rfc3339(task.started_at)),
            finished_at: task.finished_at().map(to_rfc3339),
        }
    }
}

/// Replays the application's dead letters that match the filter, in the background (202),
/// or counts them (`dryRun`, 200). Replays are manual attempts with a fresh retry budget.
#[utoipa::path(post, path = "/api/v1/app/{app_id}/dead-letters/replay", operation_id = "herald.dead-letters.replay",
    tag = "Message", request_body = ReplayIn, params(("app_id" = String, Path)),
    responses((status = 202, body = ReplayOut), (status = 200, body = ReplayOut)))]
pub async fn replay(
    State(state): State<AppState>,
    principal: Principal,
    app: VisibleApp,
    body: JsonBody<ReplayIn>,
) -> ApiResult<(StatusCode, Json<ReplayOut>)> {
    let filter = replay_filter(&state, &principal, &app.id, &body.value).await?;
    let ids: Vec<i64> = state.store.dead_letters(&filter).await?.iter().map(|d| d.delivery_id).collect();
    if body.value.dry_run {
        let out = ReplayOut {
            task_id: None,
            status: "dryRun".into(),
            total: ids.len() as u64,
            replayed: 0,
            started_at: None,
            finished_at: None,
        };
        return Ok((StatusCode::OK, Json(out)));
    }
    let task = state.replays.start(state.store.clone(), state.dispatcher.clone(), app.id.clone(), ids);
    Ok((StatusCode::ACCEPTED, Json(ReplayOut::of(&task))))
}

async fn replay_filter(
    state: &AppState,
    principal: &Principal,
    app: &AppId,
    input: &ReplayIn,
) -> ApiResult<DeadLetterFilter> {
    let endpoint = match &input.endpoint_id {
        Some(id) => Some(VisibleEndpoint::resolve(state, principal, app.as_str(), id).await?.endpoint().id.clone()),
        None => None,
    };
    Ok(DeadLetterFilter {
        app: Some(app.clone()),
        endpoint,
        dead_since: body_time("since", input.since.as_deref())?.unwrap_or(0),
        dead_until: body_time("until", input.until.as_deref())?,
        status_code: input.status_code,
        error_class: input.error_class.clone(),
        event_type: input.event_type.clone(),
        limit: MAX_ROWS,
    })
}

/// The progress of a bulk replay.
#[utoipa::path(get, path = "/api/v1/app/{app_id}/dead-letters/replay/{task_id}",
    operation_id = "herald.dead-letters.replay-progress", tag = "Message",
    params(("app_id" = String, Path), ("task_id" = String, Path)), responses((status = 200, body = ReplayOut)))]
pub async fn replay_progress(
    State(state): State<AppState>,
    app: VisibleApp,
    Path((_, task_id)): Path<(String, String)>,
) -> ApiResult<Json<ReplayOut>> {
    let task = state.replays.get(&app.id, &task_id).ok_or(ApiError::NotFound("task"))?;
    Ok(Json(ReplayOut::of(&task)))
}
