//! The server under test: a Herald the bench starts itself (`--spawn`), or any running
//! Svix-compatible server (`--url`, `--token`), plus the small API client used to set up
//! applications and endpoints and to read delivery stats.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use super::probe::ProcessSample;
use herald::ids::random_token;

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// A keep-alive HTTP/1.1 client with room for `connections` idle connections.
pub fn http_client(connections: usize) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).pool_max_idle_per_host(connections).build(connector)
}

/// Talks to the server's API.
#[derive(Clone)]
pub struct Api {
    pub client: HttpClient,
    pub base: String,
    pub token: String,
    /// Messages carry a fresh `idempotency-key` (see `BenchArgs::idempotency_keys`).
    pub idempotency_keys: bool,
}

impl Api {
    pub async fn call(&self, method: http::Method, path: &str, body: Option<Value>) -> anyhow::Result<(u16, Value)> {
        let (status, bytes) = self.exchange(method, path, body).await?;
        Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    }

    /// GETs a text answer (`/metrics`) and insists on 200.
    pub async fn text(&self, path: &str) -> anyhow::Result<String> {
        let (status, bytes) = self.exchange(http::Method::GET, path, None).await?;
        if status != 200 {
            bail!("GET {path} answered {status}");
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    async fn exchange(&self, method: http::Method, path: &str, body: Option<Value>) -> anyhow::Result<(u16, Bytes)> {
        let payload = body.map(|b| b.to_string()).unwrap_or_default();
        let request = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("authorization", format!("Bearer {}", self.token))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(payload)))?;
        let response = self.client.request(request).await.with_context(|| format!("calling {path}"))?;
        let status = response.status().as_u16();
        Ok((status, response.into_body().collect().await?.to_bytes()))
    }

    /// POSTs and insists on a 2xx answer.
    pub async fn create(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        let (status, answer) = self.call(http::Method::POST, path, Some(body)).await?;
        if !(200..300).contains(&status) {
            bail!("POST {path} answered {status}: {answer}");
        }
        Ok(answer)
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let (status, answer) = self.call(http::Method::GET, path, None).await?;
        if status != 200 {
            bail!("GET {path} answered {status}: {answer}");
        }
        Ok(answer)
    }
}

/// The PostgreSQL database a spawned Herald runs on.
pub struct Database {
    pub url: String,
    /// A cluster the bench started itself (its processes are measured with Herald's).
    pub cluster: Option<herald_test_support::pg_cluster::TempCluster>,
}

impl Database {
    /// How far the cluster's write-ahead log has been written, in bytes
    /// (`pg_current_wal_insert_lsn`). Two readings give the WAL a run generated exactly;
    /// `pg_stat_wal`, which the harness reads, lags by whatever statistics the backends have
    /// not yet flushed (up to a second while busy). `None` if the database cannot be asked.
    pub async fn wal_position(&self) -> Option<u64> {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls).await.ok()?;
        tokio::spawn(connection);
        let sql = "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint";
        let position: i64 = client.query_one(sql, &[]).await.ok()?.get(0);
        u64::try_from(position).ok()
    }
}

/// The server being measured.
pub struct Target {
    pub api: Api,
    /// The server's process, when known (for CPU, memory and I/O figures).
    pub pid: Option<u32>,
    pub database: Option<Database>,
    /// Where the server keeps its data (for the fsync probe).
    pub data_dir: Option<PathBuf>,
    child: Option<Child>,
    scratch: Option<PathBuf>,
}

/// How to start Herald for a run.
pub struct SpawnOptions<'a> {
    pub binary: &'a Path,
    pub database: Option<Database>,
    /// Extra `HERALD_*` settings for the spawned server.
    pub env: Vec<(String, String)>,
    pub connections: usize,
}

impl Target {
    /// Starts `herald serve` on a fresh data directory and a free port.
    pub fn spawn(options: SpawnOptions<'_>) -> anyhow::Result<Self> {
        let scratch = std::env::temp_dir().join(format!("herald-bench-{}", random_token(8)));
        std::fs::create_dir_all(&scratch)?;
        let token = format!("bench_{}", random_token(16));
        let mut command = Command::new(options.binary);
        command
            .arg("serve")
            .env("HERALD_DATA_DIR", &scratch)
            .env("HERALD_LISTEN", "127.0.0.1:0")
            .env("HERALD_ADMIN_TOKEN", &token)
            .env("HERALD_ALLOWED_NETWORKS", "127.0.0.1/32")
            .env("RUST_LOG", "herald::server=info,warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(database) = &options.database {
            command.env("HERALD_DATABASE_URL", &database.url).env("HERALD_SECRET_KEY", herald::sealing::generate_key());
        }
        for (key, value) in &options.env {
            command.env(key, value);
        }
        let mut child = command.spawn().context("starting herald serve")?;
        let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
        let addr = loop {
            let Some(line) = lines.next() else { bail!("herald serve exited before listening") };
            let line = line?;
            if let Some(at) = line.find("addr=") {
                break line[at + 5..].split_whitespace().next().unwrap_or_default().to_owned();
            }
        };
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                eprintln!("[herald] {line}");
            }
        });
        Ok(Self {
            api: Api {
                client: http_client(options.connections),
                base: format!("http://{addr}"),
                token,
                idempotency_keys: false,
            },
            pid: Some(child.id()),
            database: options.database,
            data_dir: Some(scratch.clone()),
            child: Some(child),
            scratch: Some(scratch),
        })
    }

    /// A server that is already running.
    pub fn connect(url: &str, token: &str, pid: Option<u32>, connections: usize) -> Self {
        Self {
            api: Api {
                client: http_client(connections),
                base: url.trim_end_matches('/').to_owned(),
                token: token.into(),
                idempotency_keys: false,
            },
            pid,
            database: None,
            data_dir: None,
            child: None,
            scratch: None,
        }
    }

    pub fn sample(&self) -> Option<ProcessSample> {
        self.pid.and_then(ProcessSample::read)
    }

    /// The WAL position of the PostgreSQL database a spawned Herald runs on (see
    /// [`Database::wal_position`]); `None` on SQLite or a server given by `--url`.
    pub async fn wal_position(&self) -> Option<u64> {
        self.database.as_ref()?.wal_position().await
    }

    /// The spawned PostgreSQL cluster's processes, summed.
    pub fn database_sample(&self) -> Option<ProcessSample> {
        let cluster = self.database.as_ref()?.cluster.as_ref()?;
        ProcessSample::tree(cluster.pid())
    }

    /// Stops a spawned server (SIGTERM, then SIGKILL after 30 s) and removes its data.
    pub fn stop(mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: signalling our own child process.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while std::time::Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = self.scratch.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
