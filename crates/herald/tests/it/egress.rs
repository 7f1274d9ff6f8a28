//! The egress proxy (`delivery.proxy_url`): every attempt tunnels through a CONNECT proxy
//! (a small one on loopback that counts what it is asked), with the proxy's credentials;
//! the proxy is asked for the address Herald resolved and vetted, never the name; a
//! destination the guard refuses never reaches it.

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};

use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::dns::{Answer, StubDns};
use crate::support::{Receiver, Reply, TestServer, eventually};

/// A CONNECT proxy: records each request head, then tunnels.
struct ConnectProxy {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
}

impl ConnectProxy {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = heads.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(tunnel(client, seen.clone()));
            }
        });
        Self { port, heads }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

async fn tunnel(mut client: TcpStream, seen: Arc<Mutex<Vec<String>>>) {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let Ok(byte) = client.read_u8().await else { return };
        head.push(byte);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    seen.lock().unwrap().push(head.clone());
    let target = head.split_whitespace().nth(1).unwrap_or_default().to_owned();
    let Ok(mut upstream) = TcpStream::connect(&target).await else { return };
    if client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

#[tokio::test]
async fn attempts_tunnel_through_the_proxy_to_the_vetted_address_only() {
    let receiver = Receiver::start_at("127.0.0.2", |_, _| crate::support::Reply::ok()).await;
    let proxy = ConnectProxy::start().await;
    let dns = StubDns::start(|name, _| match name {
        "hooks.egress.test" => Some(vec![Answer::A(Ipv4Addr::new(127, 0, 0, 2))]),
        "inside.egress.test" => Some(vec![Answer::A(Ipv4Addr::new(127, 0, 0, 1))]),
        _ => None,
    })
    .await;
    let proxy_url = format!("http://egress:p%40ss@127.0.0.1:{}", proxy.port);
    let server = TestServer::start_with(|c| {
        c.delivery.allowed_networks = vec!["127.0.0.2/32".parse().unwrap()];
        c.delivery.dns_servers = vec![dns.addr];
        c.delivery.proxy = herald::egress::EgressProxy::from_url(&url::Url::parse(&proxy_url).unwrap());
    })
    .await;
    let app = server.create_app("shop").await;
    let port = receiver.addr.port();
    let one_attempt = json!({"delivery": {"retry": {"strategy": "fixed", "intervalMs": 1000, "maxAttempts": 1}}});
    server.create_endpoint(&app, &format!("http://hooks.egress.test:{port}/in"), json!({})).await;
    let inside = server.create_endpoint(&app, &format!("http://inside.egress.test:{port}/in"), one_attempt).await;
    let msg = server.send(&app, json!({"eventType": "e", "payload": {"n": 1}})).await;

    let got = receiver.wait_for(None, 1).await;
    assert_eq!(got[0].header("host"), format!("hooks.egress.test:{port}"), "the original host, as sent");
    assert_eq!(got[0].header("webhook-id"), msg);
    let inside_id = inside["id"].as_str().unwrap();
    let status = eventually("the inside delivery to fail", || async {
        server.delivery_status(&app, &msg, inside_id).await.filter(|s| *s == 2)
    })
    .await;
    assert_eq!(status, 2);
    let attempts = server.attempts(&app, &msg).await;
    let refused = attempts.iter().find(|a| a["endpointId"] == inside_id).unwrap();
    assert_eq!(refused["errorClass"], "blocked_destination", "{refused}");

    let heads = proxy.heads();
    assert_eq!(heads.len(), 1, "one tunnel, for the allowed destination only: {heads:?}");
    assert!(
        heads[0].starts_with(&format!("CONNECT 127.0.0.2:{port} HTTP/1.1\r\n")),
        "the vetted address: {}",
        heads[0]
    );
    let credentials = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "egress:p@ss");
    assert!(heads[0].contains(&format!("Proxy-Authorization: Basic {credentials}\r\n")), "{}", heads[0]);
}

#[tokio::test]
async fn an_application_may_have_its_own_proxy_set_by_the_operator_only() {
    let receiver = Receiver::ok().await;
    let (server_proxy, own_proxy) = (ConnectProxy::start().await, ConnectProxy::start().await);
    let server_url = format!("http://127.0.0.1:{}", server_proxy.port);
    let server =
        TestServer::start_with(|c| c.delivery.proxy = herald::egress::EgressProxy::parse(&server_url).ok()).await;
    let (status, special) = server
        .post(
            "/api/v1/app",
            json!({"name": "fixed", "proxyUrl": format!("http://team:s3cr%3At@127.0.0.1:{}", own_proxy.port)}),
        )
        .await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{special}");
    assert_eq!(special["proxyUrl"], format!("http://127.0.0.1:{}", own_proxy.port), "never the credentials");
    let special = special["id"].as_str().unwrap().to_owned();
    let plain = server.create_app("plain").await;
    for app in [&special, &plain] {
        server.create_endpoint(app, &receiver.url(&format!("/{app}")), json!({})).await;
        server.send(app, json!({"eventType": "e", "payload": {}})).await;
    }
    receiver.wait_for(None, 2).await;
    let (own, shared) = (own_proxy.heads(), server_proxy.heads());
    assert_eq!((own.len(), shared.len()), (1, 1), "each application through its proxy: {own:?} {shared:?}");
    let credentials = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, "team:s3cr:t");
    assert!(own[0].contains(&format!("Proxy-Authorization: Basic {credentials}\r\n")), "{}", own[0]);
    assert!(!shared[0].contains("Proxy-Authorization"), "{}", shared[0]);

    // The operator's setting: a portal token may not touch it; a bad one is a 422; null removes it.
    let path = format!("/api/v1/app/{special}");
    let (_, access) = server.post(&format!("/api/v1/auth/app-portal-access/{special}"), json!({})).await;
    let answer = server
        .request_as(access["token"].as_str().unwrap(), reqwest::Method::PATCH, &path)
        .json(&json!({"proxyUrl": null}))
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), reqwest::StatusCode::FORBIDDEN);
    let (status, body) = server.call(reqwest::Method::PATCH, &path, Some(json!({"proxyUrl": "socks5://p:1"}))).await;
    assert_eq!(status, reqwest::StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["detail"][0]["loc"], json!(["body", "proxyUrl"]));
    let (_, patched) = server.call(reqwest::Method::PATCH, &path, Some(json!({"proxyUrl": null}))).await;
    assert!(patched.get("proxyUrl").is_none(), "{patched}");
    server.send(&special, json!({"eventType": "e", "payload": {}})).await;
    receiver.wait_for(None, 3).await;
    // Through the server's proxy again: its client's tunnel to the receiver is kept alive and
    // reused, so no new CONNECT shows; the application's own proxy sees nothing more.
    assert_eq!(own_proxy.heads().len(), 1, "not through the removed proxy");
}

#[tokio::test]
async fn a_proxy_that_refuses_the_tunnel_fails_the_attempt_as_a_connection_error() {
    let receiver = Receiver::ok().await;
    let refusing = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = refusing.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = refusing.accept().await {
            let mut head = [0u8; 1024];
            let _ = client.read(&mut head).await;
            let _ = client.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n").await;
        }
    });
    let proxy_url = format!("http://127.0.0.1:{port}");
    let server =
        TestServer::start_with(|c| c.delivery.proxy = herald::egress::EgressProxy::parse(&proxy_url).ok()).await;
    let app = server.create_app("shop").await;
    let endpoint = server.create_endpoint(&app, &receiver.url("/in"), json!({})).await;
    let msg = server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    let attempt = eventually("an attempt", || async { server.attempts(&app, &msg).await.into_iter().next() }).await;
    assert_eq!(attempt["errorClass"], "connection", "{attempt}");
    assert!(attempt["error"].as_str().unwrap().contains("refused the tunnel"), "{attempt}");
    let status = server.delivery_status(&app, &msg, endpoint["id"].as_str().unwrap()).await;
    assert_eq!(status, Some(3), "retried, not a dead letter");
    assert!(receiver.requests().is_empty());
}

#[tokio::test]
async fn an_oauth2_token_is_fetched_through_the_applications_proxy() {
    let tokens = Receiver::start(|_, _| {
        let body = json!({"access_token": "via-proxy", "token_type": "Bearer", "expires_in": 3600});
        Reply::ok().header("content-type", "application/json").body(&body.to_string())
    })
    .await;
    let receiver = Receiver::ok().await;
    let proxy = ConnectProxy::start().await;
    let server = TestServer::start().await;
    let app = json!({"name": "fixed", "proxyUrl": format!("http://127.0.0.1:{}", proxy.port)});
    let (status, app) = server.post("/api/v1/app", app).await;
    assert_eq!(status, reqwest::StatusCode::CREATED, "{app}");
    let app = app["id"].as_str().unwrap().to_owned();
    let grant = json!({"type": "oauth2", "tokenUrl": tokens.url("/token"), "clientId": "c", "clientSecret": "s"});
    server.create_endpoint(&app, &receiver.url("/hook"), json!({"auth": grant})).await;
    server.send(&app, json!({"eventType": "e", "payload": {}})).await;
    assert_eq!(receiver.wait_for(Some("/hook"), 1).await[0].header("authorization"), "Bearer via-proxy");
    let mut connects: Vec<String> = proxy.heads().iter().map(|h| h.lines().next().unwrap().to_owned()).collect();
    connects.sort();
    let mut want = [tokens.addr, receiver.addr].map(|a| format!("CONNECT {a} HTTP/1.1"));
    want.sort();
    assert_eq!(connects, want, "the token request and the delivery, each through the proxy");
}
