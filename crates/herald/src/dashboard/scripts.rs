//! "Try the filter and transform" on an endpoint's page: a message typed in the portal,
//! run through the API's simulation (`transformation::simulate`, with the viewer's
//! principal), and what would be sent shown under the form. Nothing is stored or sent.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use maud::{Markup, html};
use serde_json::json;

use super::endpoints::{Draft, Shown, endpoint_page};
use super::form::{Fields, body};
use super::view::csrf;
use super::{Page, Viewer};
use crate::api::transformation::{SimulateOut, simulate};
use crate::api::{AppState, VisibleEndpoint};

/// A message tried, as typed, and what the simulation made of it.
pub struct Trial {
    pub event_type: String,
    pub channels: String,
    pub payload: String,
    pub outcome: Result<SimulateOut, String>,
}

/// Runs a trial (`POST /app/{app}/endpoint/{ep}/simulate`) and shows the endpoint's page
/// with its outcome.
pub async fn try_it(
    State(state): State<AppState>,
    viewer: Viewer,
    Path((app_id, endpoint_id)): Path<(String, String)>,
    form: Bytes,
) -> Result<Page, Page> {
    let fields = Fields::checked(&viewer, &form)?;
    let scoped = VisibleEndpoint::resolve(&state, &viewer.principal, &app_id, &endpoint_id).await?;
    let (app, endpoint) = scoped.clone().into_parts();
    let mut trial = Trial {
        event_type: fields.get("event_type").unwrap_or_default().trim().to_owned(),
        channels: fields.get("channels").unwrap_or_default().to_owned(),
        payload: fields.get("payload").unwrap_or_default().to_owned(),
        outcome: Err(String::new()),
    };
    trial.outcome = match serde_json::from_str::<serde_json::Value>(&trial.payload) {
        Err(e) => Err(format!("The payload is not JSON: {e}")),
        Ok(payload) => {
            let input = json!({"eventType": trial.event_type, "payload": payload, "channels": fields.list("channels")});
            match body(input) {
                Ok(input) => simulate(State(state.clone()), scoped, input)
                    .await
                    .map(|answer| answer.0)
                    .map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    let shown = Shown { trial: Some(&trial), ..Default::default() };
    endpoint_page(&state, &viewer, &app, &endpoint, &Draft::of(&state, &endpoint), shown, StatusCode::OK).await
}

/// The trial form, and the last trial's outcome under it.
pub fn trial_form(base: &str, trial: Option<&Trial>, token: &str) -> Markup {
    let (event_type, channels, payload) = match trial {
        Some(t) => (t.event_type.as_str(), t.channels.as_str(), t.payload.as_str()),
        None => ("", "", "{}"),
    };
    html! {
        form.trial #try-it method="post" action={ (base) "/simulate" } {
            (csrf(token))
            label for="try-type" { "Event type" }
            input #try-type type="text" name="event_type" required value=(event_type) placeholder="invoice.paid";
            label for="try-channels" { "Channels (comma-separated)" }
            input #try-channels type="text" name="channels" value=(channels);
            label for="try-payload" { "Payload (JSON)" }
            textarea #try-payload name="payload" rows="4" spellcheck="false" { (payload) }
            button type="submit" { "Try it" }
        }
        @if let Some(trial) = trial { (outcome(&trial.outcome)) }
    }
}

fn outcome(outcome: &Result<SimulateOut, String>) -> Markup {
    html! {
        section #trial-outcome {
            @match outcome {
                Err(e) => p.error role="alert" { (e) },
                Ok(out) if !out.passed_filter => p { "Filtered out: " (out.reason.as_deref().unwrap_or_default()) },
                Ok(out) if out.skipped => p { "Skipped: " (out.reason.as_deref().unwrap_or_default()) },
                Ok(SimulateOut { error: Some(e), .. }) => p.error { "The delivery would fail (transform_error): " (e) },
                Ok(out) => {
                    p { "Would send: " code #trial-request {
                        (out.method.as_deref().unwrap_or_default()) " " (out.url.as_deref().unwrap_or_default()) } }
                    table.headers {
                        @for (name, value) in out.headers.iter().flatten() { tr { td { code { (name) } } td { code { (value) } } } }
                    }
                    pre #trial-body { (out.body.as_deref().unwrap_or_default()) }
                }
            }
        }
    }
}
