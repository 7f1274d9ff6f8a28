//! `herald check-config`: whether a configuration and the machine it meets can run Herald,
//! checked without starting it and without changing anything: the configuration itself,
//! the listen address, the store (the data directory and its secret files, or the
//! PostgreSQL database), the server key. It then prints the configuration in effect, key
//! by key, with every secret masked. A service manager can run it before `serve`.

use std::fmt::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use toml::Value;

use crate::config::{Config, Sources};

/// How long the database may take to answer.
const DATABASE_TIMEOUT: Duration = Duration::from_secs(5);
/// What a masked secret reads as.
const MASK: &str = "********";
/// Keys whose whole value is secret.
const SECRET_KEYS: [&str; 6] = [
    "auth.admin_token",
    "auth.secret_key",
    "auth.previous_secret_keys",
    "alerts.webhook_secret",
    "otel.exporter_otlp_headers",
    "otel.exporter_otlp_traces_headers",
];
/// Keys holding URLs whose password is secret.
const URL_KEYS: [&str; 3] = ["store.database_url", "delivery.proxy_url", "alerts.webhook_url"];

/// One check's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Ok(String),
    /// Not a failure: something `serve` will do or that is worth knowing.
    Note(String),
    Failed(String),
}

/// The report: each check, then the configuration in effect.
pub struct Report {
    pub checks: Vec<(&'static str, Verdict)>,
    pub effective: Option<String>,
}

impl Report {
    pub fn passed(&self) -> bool {
        !self.checks.iter().any(|(_, v)| matches!(v, Verdict::Failed(_)))
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        for (what, verdict) in &self.checks {
            let (mark, text) = match verdict {
                Verdict::Ok(t) => ("ok  ", t),
                Verdict::Note(t) => ("note", t),
                Verdict::Failed(t) => ("FAIL", t),
            };
            let _ = writeln!(out, "{mark}  {what}: {text}");
        }
        if let Some(effective) = &self.effective {
            let _ = writeln!(out, "\n# The configuration in effect (secrets masked):\n{effective}");
        }
        out
    }
}

/// Runs every check on the configuration `sources` describe.
pub async fn check(sources: &Sources) -> Report {
    let layers = match Config::layers(sources) {
        Ok(layers) => layers,
        Err(e) => {
            return Report { checks: vec![("configuration", Verdict::Failed(format!("{e:#}")))], effective: None };
        }
    };
    let effective = Some(toml::to_string_pretty(&masked(layers.clone())).unwrap_or_default());
    let config = match Config::from_layers(layers) {
        Ok(config) => config,
        Err(e) => return Report { checks: vec![("configuration", Verdict::Failed(format!("{e:#}")))], effective },
    };
    let mut checks = vec![("configuration", Verdict::Ok("valid".into())), ("listen", listen(&config))];
    match &config.store.database_url {
        Some(url) => {
            checks.push(("database", database(url).await));
            let key = match &config.auth.secret_key {
                Some(_) => Verdict::Ok("set (auth.secret_key)".into()),
                None => Verdict::Failed("auth.secret_key is required with PostgreSQL (HERALD_SECRET_KEY)".into()),
            };
            checks.push(("server key", key));
        }
        None => {
            let dir = &config.server.data_dir;
            checks.push(("data directory", data_dir(dir)));
            checks.push(("server key", secret(dir, "secret-key", config.auth.secret_key.is_some(), "auth.secret_key")));
            checks.push((
                "admin token",
                secret(dir, "admin-token", config.auth.admin_token.is_some(), "auth.admin_token"),
            ));
        }
    }
    Report { checks, effective }
}

/// Whether the listen address can be bound now.
fn listen(config: &Config) -> Verdict {
    let addr = config.server.listen;
    match std::net::TcpListener::bind(addr) {
        Ok(_) => Verdict::Ok(format!("{addr} is free")),
        Err(e) => {
            Verdict::Failed(format!("cannot listen on {addr}: {e} (is Herald, or something else, running there?)"))
        }
    }
}

/// The data directory: private to this user, or creatable.
fn data_dir(dir: &Path) -> Verdict {
    let Ok(meta) = std::fs::metadata(dir) else {
        let parent = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        return match std::fs::metadata(parent) {
            Ok(p) if p.is_dir() => {
                Verdict::Note(format!("{} does not exist; serve creates it (mode 0700)", dir.display()))
            }
            _ => Verdict::Failed(format!("{} does not exist, nor does its parent", dir.display())),
        };
    };
    if !meta.is_dir() {
        return Verdict::Failed(format!("{} is not a directory", dir.display()));
    }
    // SAFETY: getuid has no preconditions.
    if meta.uid() != unsafe { libc::getuid() } {
        return Verdict::Failed(format!("{} belongs to another user (uid {})", dir.display(), meta.uid()));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Verdict::Note(format!("{} has mode {mode:o}; serve tightens it to 0700", dir.display()));
    }
    let database = dir.join("herald.db");
    match std::fs::metadata(&database) {
        Ok(db) => Verdict::Ok(format!("{} (database {:.1} MB)", dir.display(), db.len() as f64 / 1e6)),
        Err(_) => Verdict::Ok(format!("{} (no database yet: serve creates it)", dir.display())),
    }
}

/// A secret Herald keeps in the data directory unless the configuration sets it.
fn secret(dir: &Path, file: &str, configured: bool, key: &str) -> Verdict {
    if configured {
        return Verdict::Ok(format!("set ({key})"));
    }
    let path = dir.join(file);
    match std::fs::metadata(&path) {
        Ok(meta) if meta.permissions().mode() & 0o077 != 0 => Verdict::Failed(format!(
            "{} can be read by other users (mode {:o}); serve refuses it",
            path.display(),
            meta.permissions().mode() & 0o777
        )),
        Ok(_) => Verdict::Ok(format!("{} (mode 0600)", path.display())),
        Err(_) => Verdict::Note(format!("not set; serve generates {} at first start", path.display())),
    }
}

/// Whether the database answers, its version, and how far Herald's schema is applied.
async fn database(url: &str) -> Verdict {
    let connecting = tokio::time::timeout(DATABASE_TIMEOUT, tokio_postgres::connect(url, tokio_postgres::NoTls));
    let (client, connection) = match connecting.await {
        Ok(Ok(pair)) => pair,
        Ok(Err(e)) => return Verdict::Failed(format!("cannot connect: {e}")),
        Err(_) => return Verdict::Failed(format!("no answer within {DATABASE_TIMEOUT:?}")),
    };
    let task = tokio::spawn(connection);
    let version = client.query_one("SHOW server_version", &[]).await.map(|r| r.get::<_, String>(0));
    let schema = client.query_one("SELECT max(version) FROM herald.schema_migrations", &[]).await;
    task.abort();
    match (version, schema) {
        (Ok(version), Ok(row)) => Verdict::Ok(format!(
            "PostgreSQL {version}, Herald schema version {}",
            row.get::<_, Option<i32>>(0).unwrap_or(0)
        )),
        (Ok(version), Err(_)) => Verdict::Note(format!("PostgreSQL {version}, no Herald schema yet: serve creates it")),
        (Err(e), _) => Verdict::Failed(format!("the database does not answer queries: {e}")),
    }
}

/// The layered configuration with every secret replaced by [`MASK`] (a URL keeps all but
/// its password).
fn masked(mut layers: Value) -> Value {
    for key in SECRET_KEYS {
        if let Some(value) = lookup(&mut layers, key).filter(|v| !is_empty(v)) {
            *value = Value::String(MASK.into());
        }
    }
    for key in URL_KEYS {
        if let Some(Value::String(text)) = lookup(&mut layers, key) {
            *text = masked_url(text);
        }
    }
    layers
}

fn lookup<'a>(root: &'a mut Value, dotted: &str) -> Option<&'a mut Value> {
    dotted.split('.').try_fold(root, |node, part| node.as_table_mut()?.get_mut(part))
}

fn is_empty(value: &Value) -> bool {
    match value {
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// A URL without its password; a connection string that is no URL (`host=… password=…`)
/// loses its password too.
fn masked_url(text: &str) -> String {
    if let Ok(mut url) = url::Url::parse(text) {
        if url.password().is_some() {
            let _ = url.set_password(Some(MASK));
        }
        return url.into();
    }
    text.split(' ')
        .map(|part| if part.starts_with("password=") { format!("password={MASK}") } else { part.to_owned() })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_masked_and_urls_keep_all_but_their_password() {
        let layers: Value = toml::from_str(
            r#"[auth]
               admin_token = "hrld_topsecret"
               secret_key = ""
               previous_secret_keys = ["old-key"]
               [store]
               database_url = "postgres://herald:hunter2@db.internal/herald"
               [delivery]
               proxy_url = "host=proxy password=pw2 user=u"
               [otel]
               exporter_otlp_headers = "x-api-key=abc"
            "#,
        )
        .unwrap();
        let text = toml::to_string(&masked(layers)).unwrap();
        for secret in ["topsecret", "old-key", "hunter2", "pw2", "abc"] {
            assert!(!text.contains(secret), "{secret} in {text}");
        }
        assert!(text.contains("postgres://herald:********@db.internal/herald"), "{text}");
        assert!(text.contains(r#"secret_key = """#), "an unset secret stays visibly unset: {text}");
    }
}
