//! Dashboard sessions over real HTTP: the cookie is a random session secret (never the
//! token, never stored), it expires, sign-out and the operator end it for good, it ends
//! with the portal token it signed in with, and it is `Secure` behind an https public URL.
//! The sign-in form itself is protected against login CSRF.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::support::server::{ADMIN_TOKEN, Storage, set_cookie, sign_in_answer};
use crate::support::{TestServer, eventually};

fn client() -> reqwest::Client {
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

/// The status of a dashboard page requested with `cookie` (303 to /login: not signed in).
async fn page(server: &TestServer, path: &str, cookie: &str) -> StatusCode {
    client().get(server.url(path)).header("cookie", cookie).send().await.unwrap().status()
}

async fn portal_token(server: &TestServer, app: &str) -> String {
    server.portal_token(app).await
}

/// The CSRF token in the forms of a page.
async fn csrf_of(server: &TestServer, path: &str, cookie: &str) -> String {
    let html = client().get(server.url(path)).header("cookie", cookie).send().await.unwrap().text().await.unwrap();
    let at = html.find("name=\"csrf\" value=\"").expect("a form with a CSRF token") + 19;
    html[at..].split('"').next().unwrap().to_owned()
}

#[tokio::test]
async fn the_session_cookie_is_a_random_secret_that_is_stored_only_as_a_hash() {
    let storage = Storage::new().await;
    let server = TestServer::start_on(&storage, |_| {}).await;
    let answer = sign_in_answer(&server.url(""), ADMIN_TOKEN, None).await;
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    let raw: Vec<String> =
        answer.headers().get_all("set-cookie").iter().map(|v| v.to_str().unwrap().to_owned()).collect();
    let session = raw.iter().find(|c| c.starts_with("herald_session=")).expect("a session cookie");
    assert!(!session.contains(ADMIN_TOKEN), "the cookie is not the admin token: {session}");
    for attribute in ["HttpOnly", "SameSite=Strict", "Max-Age=43200", "Path=/"] {
        assert!(session.contains(attribute), "{attribute} in {session}");
    }
    assert!(!session.contains("Secure"), "not Secure on an http public URL");
    let secret = set_cookie(&answer, "herald_session").unwrap();
    assert_eq!(page(&server, "/", &format!("herald_session={secret}")).await, StatusCode::OK);
    server.stop().await;
    let everything = storage.everything().await;
    assert!(!everything.contains(&secret), "the session secret rests nowhere");
    assert!(!everything.contains(ADMIN_TOKEN), "nor the admin token");
}

#[tokio::test]
async fn behind_an_https_public_url_the_cookie_is_secure() {
    let server = TestServer::start_with(|c| c.server.public_url = Some("https://herald.example.com".into())).await;
    let login = client().get(server.url("/login")).send().await.unwrap();
    let raw = login.headers().get("set-cookie").unwrap().to_str().unwrap().to_owned();
    assert!(raw.ends_with("; Secure"), "{raw}");
    let answer = sign_in_answer(&server.url(""), ADMIN_TOKEN, Some("https://herald.example.com")).await;
    assert_eq!(answer.status(), StatusCode::SEE_OTHER);
    let session = answer.headers().get("set-cookie").unwrap().to_str().unwrap().to_owned();
    assert!(session.starts_with("herald_session=") && session.ends_with("; Secure"), "{session}");
}

#[tokio::test]
async fn a_session_expires() {
    let server = TestServer::start_with(|c| c.auth.session_ttl = Duration::from_secs(1)).await;
    let cookie = server.sign_in(ADMIN_TOKEN).await;
    assert_eq!(page(&server, "/", &cookie).await, StatusCode::OK);
    eventually("the session expired", || async {
        (page(&server, "/", &cookie).await == StatusCode::SEE_OTHER).then_some(())
    })
    .await;
}

#[tokio::test]
async fn signing_out_ends_the_session_even_for_a_kept_cookie() {
    let server = TestServer::start().await;
    let cookie = server.sign_in(ADMIN_TOKEN).await;
    let csrf = csrf_of(&server, "/", &cookie).await;
    let out =
        client().post(server.url("/logout")).header("cookie", &cookie).form(&[("csrf", &csrf)]).send().await.unwrap();
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    assert_eq!(page(&server, "/", &cookie).await, StatusCode::SEE_OTHER, "the old cookie opens nothing");
}

#[tokio::test]
async fn the_operator_lists_and_revokes_sessions_and_portal_tokens_cannot() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let other = server.create_app("b").await;
    let operator = server.sign_in(ADMIN_TOKEN).await;
    let token = portal_token(&server, &app).await;
    let customer = server.sign_in(&token).await;
    let second = server.sign_in(&token).await;
    let third = server.sign_in(&portal_token(&server, &other).await).await;
    assert_eq!(page(&server, &format!("/app/{app}"), &customer).await, StatusCode::OK);

    let (status, list) = server.get("/api/v1/auth/session").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["data"].as_array().unwrap().len(), 4, "{list}");
    let (_, mine) = server.get(&format!("/api/v1/auth/session?app_id={app}")).await;
    let mine: Vec<&Value> = mine["data"].as_array().unwrap().iter().collect();
    assert_eq!(mine.len(), 2);
    assert!(mine.iter().all(|s| s["appId"] == app.as_str() && s["id"].as_str().unwrap().starts_with("ses_")));

    // A portal token manages no sessions, not even its own application's.
    let portal = |method: Method, path: String| {
        reqwest::Client::new().request(method, server.url(&path)).bearer_auth(&token).send()
    };
    assert_eq!(portal(Method::GET, "/api/v1/auth/session".into()).await.unwrap().status(), StatusCode::FORBIDDEN);
    let id = mine[0]["id"].as_str().unwrap();
    let refused = portal(Method::DELETE, format!("/api/v1/auth/session/{id}")).await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert_eq!(portal(Method::DELETE, "/api/v1/auth/session".into()).await.unwrap().status(), StatusCode::FORBIDDEN);
    assert_eq!(server.get("/api/v1/auth/session").await.1["data"].as_array().unwrap().len(), 4, "nothing ended");

    // One session, then one application's, then all.
    let (status, _) = server.call(Method::DELETE, &format!("/api/v1/auth/session/{id}"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = server.call(Method::DELETE, &format!("/api/v1/auth/session/{id}"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let own = format!("/app/{app}");
    let ended = [page(&server, &own, &customer).await, page(&server, &own, &second).await];
    assert_eq!(ended.iter().filter(|s| **s == StatusCode::SEE_OTHER).count(), 1, "exactly the revoked one ended");
    let (_, answer) = server.call(Method::DELETE, &format!("/api/v1/auth/session?app_id={app}"), None).await;
    assert_eq!(answer["ended"], 1);
    assert_eq!(page(&server, &own, &customer).await, StatusCode::SEE_OTHER);
    assert_eq!(page(&server, &own, &second).await, StatusCode::SEE_OTHER);
    let theirs = format!("/app/{other}");
    assert_eq!(page(&server, &theirs, &third).await, StatusCode::OK, "another application's session stays");
    let (_, answer) = server.call(Method::DELETE, "/api/v1/auth/session", None).await;
    assert_eq!(answer["ended"], 2);
    assert_eq!(page(&server, "/", &operator).await, StatusCode::SEE_OTHER);
    assert_eq!(page(&server, &theirs, &third).await, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn a_portal_session_ends_with_its_portal_token() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let token = portal_token(&server, &app).await;
    let cookie = server.sign_in(&token).await;
    assert_eq!(page(&server, &format!("/app/{app}"), &cookie).await, StatusCode::OK);
    let revoked = reqwest::Client::new().post(server.url("/api/v1/auth/logout")).bearer_auth(&token).send().await;
    assert_eq!(revoked.unwrap().status(), StatusCode::NO_CONTENT);
    assert_eq!(page(&server, &format!("/app/{app}"), &cookie).await, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn an_operator_session_ends_when_the_admin_token_changes() {
    let storage = Storage::new().await;
    let server = TestServer::start_on(&storage, |_| {}).await;
    let cookie = server.sign_in(ADMIN_TOKEN).await;
    server.stop().await;
    let server = TestServer::start_on(&storage, |c| c.auth.admin_token = Some("a-new-admin-token".into())).await;
    assert_eq!(page(&server, "/", &cookie).await, StatusCode::SEE_OTHER);
}

/// Regression (issue 16, finding 6): `POST /login` took any form, so a foreign page could
/// sign a victim's browser into the attacker's portal session.
#[tokio::test]
async fn a_sign_in_that_did_not_come_from_the_sign_in_page_is_refused() {
    let server = TestServer::start().await;
    let app = server.create_app("a").await;
    let attackers = portal_token(&server, &app).await;
    let post = |cookie: Option<String>, csrf: &str, origin: Option<&str>| {
        let mut request = client().post(server.url("/login")).form(&[("csrf", csrf), ("token", attackers.as_str())]);
        if let Some(cookie) = cookie {
            request = request.header("cookie", cookie);
        }
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    let login = client().get(server.url("/login")).send().await.unwrap();
    let genuine = set_cookie(&login, "herald_login").unwrap();
    let own_origin = format!("http://{}", server.addr);
    let refusals = [
        ("no sign-in cookie, no token", post(None, "", None).await.unwrap()),
        ("a token without its cookie", post(None, &genuine, None).await.unwrap()),
        ("a cookie with another token", post(Some(format!("herald_login={genuine}")), "guessed", None).await.unwrap()),
        (
            "a foreign origin",
            post(Some(format!("herald_login={genuine}")), &genuine, Some("https://evil.example")).await.unwrap(),
        ),
        ("an opaque origin", post(Some(format!("herald_login={genuine}")), &genuine, Some("null")).await.unwrap()),
    ];
    for (what, answer) in refusals {
        assert_eq!(answer.status(), StatusCode::FORBIDDEN, "{what}");
        assert!(set_cookie(&answer, "herald_session").is_none(), "{what}: no session");
    }
    let answer = post(Some(format!("herald_login={genuine}")), &genuine, Some(&own_origin)).await.unwrap();
    assert_eq!(answer.status(), StatusCode::SEE_OTHER, "the genuine form signs in");
}
