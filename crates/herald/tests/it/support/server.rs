//! A real Herald server on port 0 with its own data directory.

use std::net::SocketAddr;
use std::time::Duration;

use herald::{Config, Server};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub const ADMIN_TOKEN: &str = "test-admin-token";

/// Which store the suite runs against: SQLite, or PostgreSQL with
/// `HERALD_TEST_BACKEND=postgres` (scripts/test.sh runs the suite both ways).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

pub fn backend() -> Backend {
    match std::env::var("HERALD_TEST_BACKEND").as_deref() {
        Ok("postgres") => Backend::Postgres,
        _ => Backend::Sqlite,
    }
}

/// Where a test server keeps its state, surviving restarts: a data directory, and on
/// PostgreSQL a throwaway cluster with a fresh database.
pub struct Storage {
    pub dir: tempfile::TempDir,
    pub database_url: Option<String>,
    pub cluster: Option<herald_test_support::pg_cluster::TempCluster>,
    /// The server key every process on this storage seals endpoint secrets with.
    pub secret_key: String,
}

impl Storage {
    /// Everything the store holds, as text: on SQLite the raw bytes of every file in the
    /// data directory (database, WAL, shared memory, anything else); on PostgreSQL every
    /// row of every table of the `herald` schema. For checks that nothing secret rests in
    /// plaintext anywhere.
    pub async fn everything(&self) -> String {
        let mut text = String::new();
        for entry in std::fs::read_dir(self.dir.path()).unwrap().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_file()) {
                text.push_str(&String::from_utf8_lossy(&std::fs::read(entry.path()).unwrap_or_default()));
            }
        }
        if let Some(url) = &self.database_url {
            let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(connection);
            let tables = client
                .query("SELECT table_name::text FROM information_schema.tables WHERE table_schema = 'herald'", &[])
                .await
                .unwrap();
            for table in tables {
                let name: String = table.get(0);
                let sql = format!("SELECT coalesce(string_agg(t::text, E'\\n'), '') FROM herald.{name} t");
                text.push_str(&client.query_one(&sql, &[]).await.unwrap().get::<_, String>(0));
            }
        }
        text
    }

    /// Storage of the suite's backend.
    pub async fn new() -> Self {
        match backend() {
            Backend::Sqlite => Self::sqlite(),
            Backend::Postgres => Self::postgres().await,
        }
    }

    /// SQLite storage, whatever the suite's backend.
    pub fn sqlite() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            database_url: None,
            cluster: None,
            secret_key: herald::sealing::generate_key(),
        }
    }

    /// PostgreSQL storage, whatever the suite's backend (for PostgreSQL-only tests).
    pub async fn postgres() -> Self {
        let cluster = herald_test_support::pg_cluster::TempCluster::start().expect("starting a throwaway PostgreSQL");
        let url = cluster.create_database().await.unwrap();
        Self {
            dir: tempfile::tempdir().unwrap(),
            database_url: Some(url),
            cluster: Some(cluster),
            secret_key: herald::sealing::generate_key(),
        }
    }
}

pub struct TestServer {
    pub addr: SocketAddr,
    /// Keeps the storage alive for the whole test (when the server owns it).
    _storage: Option<Storage>,
    shutdown: CancellationToken,
    handle: Option<JoinHandle<anyhow::Result<()>>>,
    client: reqwest::Client,
}

/// The configuration every test server starts from: loopback delivery allowed, quick polls.
pub fn test_config(storage: &Storage) -> Config {
    let mut config = Config::defaults();
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    config.server.data_dir = storage.dir.path().to_owned();
    config.store.database_url = storage.database_url.clone();
    config.queue.lease = Duration::from_secs(3);
    config.auth.admin_token = Some(ADMIN_TOKEN.to_owned());
    config.auth.secret_key = Some(storage.secret_key.clone());
    config.delivery.allowed_networks = vec!["127.0.0.0/8".parse().unwrap()];
    config.queue.poll_interval = Duration::from_millis(50);
    config.queue.shutdown_grace = Duration::from_secs(10);
    // In-process servers are the test binary: their jq sandbox runs the real herald.
    config.scripts.worker_program = Some(env!("CARGO_BIN_EXE_herald").into());
    config
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// Starts a server after `tweak` adjusted the test configuration.
    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> Self {
        let storage = Storage::new().await;
        let mut server = Self::start_on(&storage, tweak).await;
        server._storage = Some(storage);
        server
    }

    /// Starts a server on existing storage (to test restarts).
    pub async fn start_on(storage: &Storage, tweak: impl FnOnce(&mut Config)) -> Self {
        let mut config = test_config(storage);
        tweak(&mut config);
        let server = Server::build(config).await.expect("the server builds");
        let addr = server.local_addr();
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(server.run_until_stopped(shutdown.clone()));
        Self { addr, _storage: None, shutdown, handle: Some(handle), client: reqwest::Client::new() }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// A request with the admin token (named so at every call: a token added to it would be
    /// a second `Authorization` header, which Herald refuses).
    pub fn request_as_admin(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, self.url(path)).bearer_auth(ADMIN_TOKEN)
    }

    /// A request with `token` alone.
    pub fn request_as(&self, token: &str, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, self.url(path)).bearer_auth(token)
    }

    /// Sends `body` (if any) and returns the status and the JSON answer (`null` if none).
    pub async fn call(&self, method: Method, path: &str, body: Option<Value>) -> (StatusCode, Value) {
        let mut req = self.request_as_admin(method, path);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let resp = req.send().await.expect("the server answers");
        let status = resp.status();
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, path, Some(body)).await
    }

    /// Creates an application and returns its id.
    pub async fn create_app(&self, name: &str) -> String {
        let (status, app) = self.post("/api/v1/app", json!({"name": name})).await;
        assert_eq!(status, StatusCode::CREATED, "{app}");
        app["id"].as_str().unwrap().to_owned()
    }

    /// A portal token of `app` (an app-portal access made with the admin token).
    pub async fn portal_token(&self, app: &str) -> String {
        let (status, access) = self.post(&format!("/api/v1/auth/app-portal-access/{app}"), json!({})).await;
        assert_eq!(status, StatusCode::OK, "{access}");
        access["token"].as_str().unwrap().to_owned()
    }

    /// Creates an application with another admin token (a generated one) and returns its id.
    pub async fn create_app_with_token(&self, token: &str) -> String {
        let answer = self.client.post(self.url("/api/v1/app")).bearer_auth(token.trim()).json(&json!({"name": "a"}));
        let answer = answer.send().await.expect("the server answers");
        assert_eq!(answer.status(), StatusCode::CREATED);
        answer.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned()
    }

    /// Creates an endpoint (extra fields merged into the body) and returns its JSON.
    pub async fn create_endpoint(&self, app: &str, url: &str, extra: Value) -> Value {
        let mut body = json!({"url": url});
        body.as_object_mut().unwrap().extend(extra.as_object().cloned().unwrap_or_default());
        let (status, endpoint) = self.post(&format!("/api/v1/app/{app}/endpoint"), body).await;
        assert_eq!(status, StatusCode::CREATED, "{endpoint}");
        endpoint
    }

    /// The signing secret of an endpoint.
    pub async fn secret(&self, app: &str, endpoint: &str) -> String {
        let (_, secret) = self.get(&format!("/api/v1/app/{app}/endpoint/{endpoint}/secret")).await;
        secret["key"].as_str().unwrap().to_owned()
    }

    /// Posts a message and returns its id.
    pub async fn send(&self, app: &str, body: Value) -> String {
        let (status, msg) = self.post(&format!("/api/v1/app/{app}/msg"), body).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{msg}");
        msg["id"].as_str().unwrap().to_owned()
    }

    /// Every attempt of a message, oldest first.
    pub async fn attempts(&self, app: &str, msg: &str) -> Vec<Value> {
        let (status, list) = self.get(&format!("/api/v1/app/{app}/attempt/msg/{msg}?limit=250")).await;
        assert_eq!(status, StatusCode::OK, "{list}");
        let mut data = list["data"].as_array().unwrap().clone();
        data.reverse();
        data
    }

    /// The delivery status (Svix `status`) of a message at an endpoint.
    pub async fn delivery_status(&self, app: &str, msg: &str, endpoint: &str) -> Option<i64> {
        let (_, list) = self.get(&format!("/api/v1/app/{app}/msg/{msg}/endpoint")).await;
        list["data"].as_array()?.iter().find(|d| d["id"] == endpoint).and_then(|d| d["status"].as_i64())
    }

    /// Stops the server gracefully and waits until it has exited.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(handle) = self.handle.take() {
            handle.await.expect("the server task").expect("the server stops cleanly");
        }
    }

    /// Signs in to the dashboard; see [`sign_in`].
    pub async fn sign_in(&self, token: &str) -> String {
        sign_in(&self.url(""), token).await
    }

    /// Requests a graceful stop without waiting for it.
    pub fn begin_stop(&self) -> CancellationToken {
        self.shutdown.cancel();
        self.shutdown.clone()
    }

    /// Waits for a stop begun with `begin_stop`.
    pub async fn stopped(mut self) -> anyhow::Result<()> {
        self.handle.take().unwrap().await.unwrap()
    }
}

/// Posts the dashboard's sign-in form at `base` the way its page does (the page's sign-in
/// token and cookie), with `token` and, if given, an `Origin`; the raw answer.
pub async fn sign_in_answer(base: &str, token: &str, origin: Option<&str>) -> reqwest::Response {
    let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
    let page = client.get(format!("{base}/login")).send().await.unwrap();
    let login = set_cookie(&page, "herald_login").expect("the sign-in page sets its cookie");
    let mut form = client
        .post(format!("{base}/login"))
        .header("cookie", format!("herald_login={login}"))
        .form(&[("csrf", login.as_str()), ("token", token)]);
    if let Some(origin) = origin {
        form = form.header("origin", origin);
    }
    form.send().await.unwrap()
}

/// Signs in to the dashboard at `base` and returns the `Cookie` header value of the session.
pub async fn sign_in(base: &str, token: &str) -> String {
    let answer = sign_in_answer(base, token, None).await;
    assert_eq!(answer.status(), StatusCode::SEE_OTHER, "signed in");
    format!("herald_session={}", set_cookie(&answer, "herald_session").expect("a session cookie"))
}

/// The value a response's `Set-Cookie` gives the cookie `name`, if it sets one.
pub fn set_cookie(response: &reqwest::Response, name: &str) -> Option<String> {
    response.headers().get_all("set-cookie").iter().filter_map(|v| v.to_str().ok()).find_map(|v| {
        let (key, rest) = v.split_once('=')?;
        (key == name).then(|| rest.split(';').next().unwrap_or_default().to_owned())
    })
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}
