//! `herald import svix`: copies a server speaking the Svix API (Svix itself, or another
//! Herald) into a running Herald, through both APIs, so whatever comes over has passed
//! Herald's own validation and either of Herald's stores can be behind it.
//!
//! It copies event types, then applications, then each application's endpoints with their
//! signing secrets (and, where the source shows them, the earlier secrets still signing
//! after a rotation) and headers. Applications and endpoints keep their ids (Herald's
//! create calls accept an explicit id from the admin token). Running it again changes only
//! what differs; one object's failure is reported and the rest go on.

mod client;
mod plan;
mod report;

use std::collections::HashMap;

use futures_util::StreamExt;
use http::Method;
use serde_json::Value;

pub use client::{Api, Refusal};
use plan::{Headers, Secrets, Step};
pub use report::Report;
use report::{Kind, Outcome};

/// Applications imported at once (each one's endpoints one after another).
const APPS_AT_ONCE: usize = 8;

pub struct Import {
    pub from: Api,
    pub to: Api,
    /// Read both sides and report what would change; write nothing.
    pub dry_run: bool,
}

impl Import {
    /// Runs the import, telling `report` about every object. An error means a list could
    /// not be read at all (a wrong address or token), before anything was written.
    pub async fn run(&self, report: &Report) -> anyhow::Result<()> {
        let (from, to) = (&self.from, &self.to);
        let types_query = "include_archived=true&with_content=true";
        let types = from.list("/api/v1/event-type", types_query).await.map_err(|e| read_error("source", e))?;
        let present =
            by(to.list("/api/v1/event-type", types_query).await.map_err(|e| read_error("destination", e))?, "name");
        let apps = from.list("/api/v1/app", "").await.map_err(|e| read_error("source", e))?;
        let present_apps = by(to.list("/api/v1/app", "").await.map_err(|e| read_error("destination", e))?, "id");

        report.expect(Kind::EventType, types.len());
        report.expect(Kind::Application, apps.len());
        for event_type in &types {
            let name = event_type["name"].as_str().unwrap_or_default();
            let step = plan::event_type(event_type, present.get(name));
            let name = segment(name);
            let path = format!("/api/v1/event-type/{name}");
            let outcome = self.apply(step, "/api/v1/event-type", &path).await;
            report.record(Kind::EventType, &format!("event type {name}"), outcome);
        }
        futures_util::stream::iter(&apps)
            .for_each_concurrent(APPS_AT_ONCE, |app| {
                self.application(app, present_apps.get(app["id"].as_str().unwrap_or_default()), report)
            })
            .await;
        Ok(())
    }

    /// One application, then its endpoints (each reported failed if the application did not
    /// come over).
    async fn application(&self, app: &Value, present: Option<&Value>, report: &Report) {
        let id = id_of(app);
        let what = match app["uid"].as_str() {
            Some(uid) => format!("application {id} ({uid})"),
            None => format!("application {id}"),
        };
        let path = format!("/api/v1/app/{id}");
        let outcome = self.apply(plan::application(app, present), "/api/v1/app", &path).await;
        let failed = matches!(outcome, Outcome::Failed(_));
        report.record(Kind::Application, &what, outcome);

        let endpoints = match self.from.list(&format!("{path}/endpoint"), "").await {
            Ok(endpoints) => endpoints,
            Err(e) => {
                report.expect(Kind::Endpoint, 1);
                return report.record(
                    Kind::Endpoint,
                    &format!("the endpoints of {what}"),
                    Outcome::Failed(format!("listing them: {e}")),
                );
            }
        };
        report.expect(Kind::Endpoint, endpoints.len());
        let present = match present {
            Some(_) => self.to.list(&format!("{path}/endpoint"), "").await.map(|list| by(list, "id")),
            None => Ok(HashMap::new()),
        };
        for endpoint in &endpoints {
            let what = format!("endpoint {} of {id}", id_of(endpoint));
            let outcome = match (&present, failed) {
                (_, true) => Outcome::Failed("its application did not come over".into()),
                (Err(e), _) => Outcome::Failed(format!("listing the destination's endpoints: {e}")),
                (Ok(present), _) => {
                    let current = present.get(endpoint["id"].as_str().unwrap_or_default());
                    self.endpoint(&id, endpoint, current, &what, report).await
                }
            };
            report.record(Kind::Endpoint, &what, outcome);
        }
    }

    async fn endpoint(
        &self,
        app: &str,
        source: &Value,
        present: Option<&Value>,
        what: &str,
        report: &Report,
    ) -> Outcome {
        let path = format!("/api/v1/app/{app}/endpoint/{}", id_of(source));
        let read = async {
            let secrets = self.from.get(&format!("{path}/secret")).await?;
            let secrets = Secrets::read(&secrets, chrono::Utc::now())
                .ok_or_else(|| Refusal { status: None, reason: "the source shows no signing secret".into() })?;
            Ok::<_, Refusal>((secrets, Headers::read(&self.from.get(&format!("{path}/headers")).await?)))
        };
        let (secrets, headers) = match read.await {
            Ok(read) => read,
            Err(e) => return Outcome::Failed(format!("reading it from the source: {e}")),
        };
        let (outcome, current_headers) = match present {
            None => (self.create_endpoint(app, source, &secrets, &headers).await, Headers::default()),
            Some(current) => match self.update_endpoint(&path, source, current, &secrets, &headers).await {
                Ok((outcome, current_headers)) => (outcome, current_headers),
                Err(e) => (Outcome::Failed(e.to_string()), Headers::default()),
            },
        };
        if !matches!(outcome, Outcome::Failed(_)) {
            for name in headers.missing_in(&current_headers) {
                report.gap(what, &format!(
                    "header {name}: the source never shows a sensitive header's value; set it with PATCH {path}/headers"
                ));
            }
        }
        outcome
    }

    /// Creates the endpoint with the oldest secret still signing, then rotates to each
    /// later one, so every secret signs until it would have at the source.
    async fn create_endpoint(&self, app: &str, source: &Value, secrets: &Secrets, headers: &Headers) -> Outcome {
        let Step::Create(mut body) = plan::endpoint(source, None) else { unreachable!("nothing present: a creation") };
        let (first, rotations) = secrets.creation();
        body["secret"] = Value::String(first);
        if !headers.values.is_empty() {
            body["headers"] = Value::Object(headers.values.clone());
        }
        if self.dry_run {
            return Outcome::Created;
        }
        if let Err(e) = self.to.send(Method::POST, &format!("/api/v1/app/{app}/endpoint"), Some(&body)).await {
            return Outcome::Failed(e.to_string());
        }
        let rotate = format!("/api/v1/app/{app}/endpoint/{}/secret/rotate", id_of(source));
        for (key, grace) in rotations {
            let body = serde_json::json!({ "key": key, "gracePeriodSeconds": grace });
            if let Err(e) = self.to.send(Method::POST, &rotate, Some(&body)).await {
                return Outcome::Failed(format!("created, but its later signing secrets did not follow: {e}"));
            }
        }
        Outcome::Created
    }

    /// Brings an endpoint the destination has up to the source's fields, current secret
    /// and headers; also answers the destination's headers, to tell what is missing.
    async fn update_endpoint(
        &self,
        path: &str,
        source: &Value,
        current: &Value,
        secrets: &Secrets,
        headers: &Headers,
    ) -> Result<(Outcome, Headers), Refusal> {
        let step = plan::endpoint(source, Some(current));
        let mut changed = step.changed();
        let current_key = self.to.get(&format!("{path}/secret")).await?;
        let rotate = current_key["key"].as_str() != Some(secrets.current.as_str());
        let current_headers = Headers::read(&self.to.get(&format!("{path}/headers")).await?);
        let headers_patch = headers.patch_over(&current_headers);
        changed.extend(rotate.then(|| "secret".to_owned()));
        changed.extend(headers_patch.is_some().then(|| "headers".to_owned()));
        if changed.is_empty() {
            return Ok((Outcome::Unchanged, current_headers));
        }
        if !self.dry_run {
            if let Step::Update(patch) = &step {
                self.to.send(Method::PATCH, path, Some(patch)).await?;
            }
            if rotate {
                let body = serde_json::json!({ "key": secrets.current });
                self.to.send(Method::POST, &format!("{path}/secret/rotate"), Some(&body)).await?;
            }
            if let Some(patch) = &headers_patch {
                self.to.send(Method::PATCH, &format!("{path}/headers"), Some(patch)).await?;
            }
        }
        Ok((Outcome::Updated(changed), current_headers))
    }

    /// Carries out an event type's or application's step: `POST create` or `PATCH path`.
    async fn apply(&self, step: Step, create: &str, path: &str) -> Outcome {
        let changed = step.changed();
        let (method, path, body) = match step {
            Step::Unchanged => return Outcome::Unchanged,
            Step::Create(body) => (Method::POST, create, body),
            Step::Update(body) => (Method::PATCH, path, body),
        };
        let done = if method == Method::POST { Outcome::Created } else { Outcome::Updated(changed) };
        if self.dry_run {
            return done;
        }
        match self.to.send(method, path, Some(&body)).await {
            Ok(_) => done,
            Err(e) => Outcome::Failed(e.to_string()),
        }
    }
}

/// An object's id, as a path segment: whatever a source answers cannot reach another route.
fn id_of(object: &Value) -> String {
    segment(object["id"].as_str().unwrap_or_default())
}

fn segment(text: &str) -> String {
    const KEEP: &percent_encoding::AsciiSet =
        &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.');
    percent_encoding::utf8_percent_encode(text, KEEP).to_string()
}

/// A list's items by the text of `key`.
fn by(items: Vec<Value>, key: &str) -> HashMap<String, Value> {
    items.into_iter().filter_map(|item| Some((item[key].as_str()?.to_owned(), item))).collect()
}

fn read_error(side: &str, e: Refusal) -> anyhow::Error {
    anyhow::anyhow!("reading the {side}'s lists failed, nothing was written: {e}")
}
