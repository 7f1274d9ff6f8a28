//! Posted forms as the dashboard's write paths read them: every field, repeated names kept
//! (a subscription is one checkbox per event type), the CSRF token checked first. A form
//! becomes the JSON body of the API call it stands for, so the portal and the API share
//! one handler and cannot disagree.

use axum::body::Bytes;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::{Page, Viewer};
use crate::api::ApiError;
use crate::api::extract::JsonBody;

pub struct Fields(Vec<(String, String)>);

impl Fields {
    /// Parses an `application/x-www-form-urlencoded` body and checks its CSRF token.
    pub fn checked(viewer: &Viewer, body: &Bytes) -> Result<Self, Page> {
        let fields = Self(url::form_urlencoded::parse(body).into_owned().collect());
        viewer.check_csrf(fields.get("csrf").unwrap_or_default())?;
        Ok(fields)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The trimmed value, if not empty.
    pub fn given(&self, name: &str) -> Option<&str> {
        self.get(name).map(str::trim).filter(|v| !v.is_empty())
    }

    /// Every value of a repeated field (checkboxes).
    pub fn all(&self, name: &str) -> Vec<String> {
        self.0.iter().filter(|(n, _)| n == name).map(|(_, v)| v.clone()).collect()
    }

    /// A comma-separated list, or `None` when empty.
    pub fn list(&self, name: &str) -> Option<Vec<String>> {
        let items: Vec<String> =
            self.get(name)?.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect();
        (!items.is_empty()).then_some(items)
    }
}

/// The API body a form stands for, deserialised as the API would.
pub fn body<T: DeserializeOwned>(json: Value) -> Result<JsonBody<T>, ApiError> {
    serde_json::from_value(json)
        .map(|value| JsonBody { value })
        .map_err(|e| ApiError::BadRequest(format!("the form does not fit the API: {e}")))
}

/// What a refused write says, field by field (`None` for a field-less refusal).
pub fn problems(error: &ApiError) -> Vec<(Option<String>, String)> {
    match error {
        // The field is the path under `body`, dotted (`auth.username`).
        ApiError::Validation(items) => {
            items.iter().map(|item| (item.loc.get(1..).map(|path| path.join(".")), item.msg.clone())).collect()
        }
        ApiError::Refused(_, msg) | ApiError::BadRequest(msg) | ApiError::Conflict(msg) => vec![(None, msg.clone())],
        ApiError::Forbidden(why) => vec![(None, (*why).to_owned())],
        _ => vec![],
    }
}
