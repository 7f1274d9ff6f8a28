//! The credentials part of the endpoint settings form: HTTP Basic or an OAuth2 grant, and a
//! client certificate for mutual TLS. Write-only: what is set shows as a summary (kind,
//! token URL and client id, certificate subject and expiry), never as values; fields left
//! blank keep what is set.

use maud::{Markup, html};
use serde_json::{Value, json};

use super::endpoints::Draft;
use super::form::Fields;
use crate::api::ApiError;

/// The form's credentials as API fields of `body` (`auth`, `tls`), where given.
pub fn apply(fields: &Fields, body: &mut Value) -> Result<(), ApiError> {
    let basic = fields.given("auth_username");
    let oauth2 = fields.given("auth_token_url");
    if fields.get("auth_remove") == Some("true") {
        body["auth"] = Value::Null;
    } else if basic.is_some() && oauth2.is_some() {
        return Err(ApiError::invalid("auth", "fill in HTTP Basic or OAuth2, not both"));
    } else if let Some(username) = basic {
        let password = fields.get("auth_password").unwrap_or_default();
        body["auth"] = json!({"type": "basic", "username": username, "password": password});
    } else if let Some(token_url) = oauth2 {
        let scopes: Vec<&str> =
            fields.get("auth_scopes").unwrap_or_default().split([' ', ',']).filter(|s| !s.is_empty()).collect();
        body["auth"] = json!({
            "type": "oauth2",
            "tokenUrl": token_url.trim(),
            "clientId": fields.get("auth_client_id").unwrap_or_default(),
            "clientSecret": fields.get("auth_client_secret").unwrap_or_default(),
            "scopes": scopes,
            "audience": fields.given("auth_audience"),
            "clientAuthMethod": fields.given("auth_client_auth_method").unwrap_or("client_secret_basic"),
        });
    }
    if fields.get("tls_remove") == Some("true") {
        body["tls"] = Value::Null;
    } else if fields.given("tls_ca").is_some()
        && (fields.given("tls_cert").is_none() || fields.given("tls_key").is_none())
    {
        return Err(ApiError::invalid("tls.clientCertificatePem", "paste the certificate and its key with the CAs"));
    } else if fields.given("tls_cert").is_some() || fields.given("tls_key").is_some() {
        body["tls"] = json!({
            "clientCertificatePem": fields.get("tls_cert").unwrap_or_default(),
            "clientKeyPem": fields.get("tls_key").unwrap_or_default(),
            "caPem": fields.given("tls_ca"),
        });
    }
    Ok(())
}

/// The credentials fieldsets of the settings form.
pub fn fieldsets(draft: &Draft) -> Markup {
    let auth = draft.credentials.auth.as_ref();
    let tls = draft.credentials.tls.as_ref();
    html! {
        fieldset.auth {
            legend { "Authentication to your receiver (write-only: secrets are never shown again)" }
            @if let Some(auth) = auth {
                p.muted #auth-state {
                    @match auth.kind {
                        "oauth2" => {
                            "OAuth2 client credentials are set: token URL " code { (auth.token_url.as_deref().unwrap_or_default()) }
                            ", client " code { (auth.client_id.as_deref().unwrap_or_default()) } ". "
                        }
                        "basic" => { "HTTP Basic credentials are set. " }
                        _ => { "Credentials are set, but cannot be read with the server's key. " }
                    }
                    "Fill in new ones to replace them."
                }
                label { input type="checkbox" name="auth_remove" value="true"; " Remove them" }
            }
            (draft.problem("auth"))
            h3 { "HTTP Basic" }
            (secret_input(draft, "auth_username", "Username", "text", "auth.username"))
            (secret_input(draft, "auth_password", "Password", "password", "auth.password"))
            h3 { "or OAuth2 client credentials (a bearer token from your token URL; filling these in replaces the whole grant)" }
            (secret_input(draft, "auth_token_url", "Token URL", "url", "auth.tokenUrl"))
            (secret_input(draft, "auth_client_id", "Client id", "text", "auth.clientId"))
            (secret_input(draft, "auth_client_secret", "Client secret", "password", "auth.clientSecret"))
            (secret_input(draft, "auth_scopes", "Scopes (space-separated; optional)", "text", "auth.scopes"))
            (secret_input(draft, "auth_audience", "Audience (optional)", "text", "auth.audience"))
            label for="auth_client_auth_method" { "How the client id and secret are sent to the token URL" }
            select #auth_client_auth_method name="auth_client_auth_method" {
                option value="client_secret_basic" selected { "HTTP Basic (client_secret_basic)" }
                option value="client_secret_post" { "In the form body (client_secret_post)" }
            }
            (draft.problem("auth.clientAuthMethod"))
        }
        fieldset.tls {
            legend { "Client certificate for mutual TLS (write-only: the key is never shown again)" }
            @if let Some(tls) = tls {
                p.muted #tls-state {
                    @match &tls.client_certificate {
                        Some(cert) => { "A client certificate is set: " code { (cert.subject) } ", expires " (cert.expires_at) ". " }
                        None => { "A client certificate is set. " }
                    }
                    @if !tls.ca.is_empty() {
                        "Trusted for this endpoint: "
                        @for (i, ca) in tls.ca.iter().enumerate() { @if i > 0 { ", " } code { (ca.subject) } }
                        ". "
                    }
                    "Paste new ones to replace them."
                }
                label { input type="checkbox" name="tls_remove" value="true"; " Remove it" }
            }
            label for="tls_cert" { "Certificate (PEM, then any intermediates)" }
            textarea #tls_cert name="tls_cert" rows="3" spellcheck="false" placeholder="-----BEGIN CERTIFICATE-----" {}
            (draft.problem("tls.clientCertificatePem"))
            label for="tls_key" { "Private key (PEM, unencrypted)" }
            textarea #tls_key name="tls_key" rows="3" spellcheck="false" autocomplete="off" placeholder="-----BEGIN PRIVATE KEY-----" {}
            (draft.problem("tls.clientKeyPem"))
            label for="tls_ca" { "CA certificates to trust for your receiver (PEM; empty: the public roots)" }
            textarea #tls_ca name="tls_ca" rows="2" spellcheck="false" {}
            (draft.problem("tls.caPem"))
        }
    }
}

/// A write-only input (never filled in again), its label, and the API's refusal of its
/// field. Passwords are never autofilled from the browser's store either.
fn secret_input(draft: &Draft, id: &str, label: &str, kind: &str, field: &str) -> Markup {
    let autocomplete = if kind == "password" { "new-password" } else { "off" };
    html! {
        label for=(id) { (label) }
        input id=(id) type=(kind) name=(id) autocomplete=(autocomplete);
        (draft.problem(field))
    }
}
