//! Where configuration values come from and how they layer: the embedded defaults, an
//! optional TOML file, `HERALD_*` variables (and the standard `OTEL_*` ones), then flags.
//!
//! Written by hand rather than with figment (weighed in issue 33): the layering is one
//! TOML merge per source, and an environment value is read as the TOML literal it would be
//! in the file (a plain string otherwise), so `HERALD_QUEUE__MEMORY_LIMIT=5000` and
//! `memory_limit = 5000` cannot differ; figment types environment values by its own rules,
//! and would add several crates to save a few dozen lines.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use toml::Value;

use super::raw::Raw;
use super::{Config, DEFAULT_TOML, otel};

/// Short environment variable names and the key each sets.
const ENV_ALIASES: &[(&str, &str)] = &[
    ("HERALD_LISTEN", "server.listen"),
    ("HERALD_DATA_DIR", "server.data_dir"),
    ("HERALD_ADMIN_TOKEN", "auth.admin_token"),
    ("HERALD_SECRET_KEY", "auth.secret_key"),
    ("HERALD_ALLOWED_NETWORKS", "delivery.allowed_networks"),
    ("HERALD_DATABASE_URL", "store.database_url"),
    ("HERALD_ROLE", "server.role"),
];

/// Where configuration values come from, lowest precedence first.
#[derive(Debug, Default)]
pub struct Sources {
    /// An optional TOML file.
    pub file: Option<PathBuf>,
    /// Environment variables (pass `std::env::vars()`; tests pass their own).
    pub env: Vec<(String, String)>,
    /// `key.path = value` overrides from command-line flags.
    pub overrides: Vec<(String, Value)>,
}

impl Config {
    /// The embedded defaults alone (used by tests, which then adjust fields directly).
    pub fn defaults() -> Self {
        Self::load(&Sources::default()).expect("the embedded default configuration is valid")
    }

    /// Layers defaults, file, environment and overrides, then validates.
    pub fn load(sources: &Sources) -> anyhow::Result<Self> {
        Self::from_layers(Self::layers(sources)?)
    }

    /// Validates configuration already layered (see [`Config::layers`]).
    pub fn from_layers(merged: Value) -> anyhow::Result<Self> {
        let raw: Raw = merged.try_into().context("invalid configuration")?;
        raw.validate()
    }

    /// Defaults, file, environment and overrides layered into one TOML table, before
    /// validation: what is in effect, key by key (`herald check-config` prints it).
    pub fn layers(sources: &Sources) -> anyhow::Result<Value> {
        let mut merged: Value = toml::from_str(DEFAULT_TOML).context("embedded default configuration")?;
        if let Some(path) = &sources.file {
            merge(&mut merged, read_file(path)?);
        }
        let env = otel::env_overrides(&sources.env)?.into_iter().chain(env_overrides(&sources.env)?);
        for (key, value) in env {
            set_path(&mut merged, &key, value)?;
        }
        for (key, value) in &sources.overrides {
            set_path(&mut merged, key, value.clone())?;
        }
        Ok(merged)
    }
}

fn read_file(path: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("parsing config file {}", path.display()))
}

/// Deep-merges `over` into `base` (tables merge, everything else replaces).
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Table(base), Value::Table(over)) => {
            for (key, value) in over {
                match base.get_mut(&key) {
                    Some(existing) => merge(existing, value),
                    None => {
                        base.insert(key, value);
                    }
                }
            }
        }
        (base, over) => *base = over,
    }
}

fn set_path(root: &mut Value, dotted: &str, value: Value) -> anyhow::Result<()> {
    let mut node = root;
    let mut parts = dotted.split('.').peekable();
    while let Some(part) = parts.next() {
        let Value::Table(table) = node else { bail!("configuration key {dotted} does not name a table") };
        if parts.peek().is_none() {
            let merged = match table.remove(part) {
                Some(mut existing @ Value::Table(_)) => {
                    merge(&mut existing, value);
                    existing
                }
                _ => value,
            };
            table.insert(part.to_owned(), merged);
            return Ok(());
        }
        node = table.entry(part.to_owned()).or_insert_with(|| Value::Table(Default::default()));
    }
    Ok(())
}

/// Turns `HERALD_*` variables into (key path, value) pairs.
fn env_overrides(env: &[(String, String)]) -> anyhow::Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    for (name, raw) in env {
        if let Some((_, key)) = ENV_ALIASES.iter().find(|(alias, _)| alias == name) {
            let value = if *key == "delivery.allowed_networks" {
                let list = raw.split(',').map(str::trim).filter(|s| !s.is_empty());
                Value::Array(list.map(|s| Value::String(s.to_owned())).collect())
            } else {
                Value::String(raw.clone())
            };
            out.push((key.to_string(), value));
        } else if let Some(rest) = name.strip_prefix("HERALD_")
            && rest.contains("__")
        {
            let key = rest.split("__").map(str::to_ascii_lowercase).collect::<Vec<_>>().join(".");
            out.push((key, parse_env_value(raw)));
        }
    }
    Ok(out)
}

/// Reads an environment value as a TOML literal when it is one (numbers, booleans, arrays,
/// inline tables), else as a plain string.
fn parse_env_value(raw: &str) -> Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| Value::String(raw.to_owned()))
}
