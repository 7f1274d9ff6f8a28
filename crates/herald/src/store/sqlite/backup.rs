//! Backups of the embedded store: a consistent copy taken while Herald runs, and a restore
//! into a data directory no server is using.
//!
//! `backup` reads the database through a read-only connection of its own and writes it
//! with `VACUUM INTO`: one read transaction, so the copy is the database as of one commit
//! (every message answered 202 before it began is in it), whatever the server commits
//! meanwhile; WAL readers never block the server's writer. It needs no server, and no
//! second one: the same command works on a stopped data directory.
//!
//! The copy holds endpoint secrets and credentials sealed under the server key, never the
//! key itself: keep the key (`auth.secret_key`, or the data directory's `secret-key`)
//! apart from the backups. A restore needs both.

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rusqlite::{Connection, OpenFlags};

use super::MIGRATIONS;
use crate::data_dir::{DATABASE_FILES, DataDir};

/// What a backup holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contents {
    pub applications: i64,
    pub endpoints: i64,
    pub messages: i64,
    pub bytes: u64,
}

/// Writes a consistent copy of the database in `data_dir` to `to` (a new file, mode 0600).
pub fn backup(data_dir: &Path, to: &Path) -> anyhow::Result<Contents> {
    let database = data_dir.join(DATABASE_FILES[0]);
    if !database.is_file() {
        bail!("{} holds no Herald database", data_dir.display());
    }
    let conn = Connection::open_with_flags(&database, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .with_context(|| format!("opening {}", database.display()))?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    let partial = partial_path(to);
    // VACUUM INTO writes into a file that does not exist or is empty: an empty private one.
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&partial)
        .with_context(|| format!("creating {}", partial.display()))?;
    let written = conn
        .execute("VACUUM INTO ?1", [partial.to_string_lossy()])
        .context("writing the backup")
        .and_then(|_| check(&partial));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&partial);
        return Err(e);
    }
    // Only a complete copy takes the name: a backup interrupted midway is never mistaken
    // for one. An existing file of that name is never replaced.
    let named = std::fs::hard_link(&partial, to).with_context(|| format!("naming the backup {}", to.display()));
    std::fs::remove_file(&partial)?;
    named?;
    contents(to)
}

/// Replaces the database of `data_dir` (created if needed) with the backup `from`. Refused
/// while a server uses the directory, and, unless `force`, when it holds a database already.
pub fn restore(data_dir: &Path, from: &Path, force: bool) -> anyhow::Result<Contents> {
    let version = check(from)?;
    if version > MIGRATIONS.len() as i64 {
        bail!("{} was made by a newer Herald (schema {version}); restore it with that version", from.display());
    }
    let dir = DataDir::open(data_dir).map_err(|e| {
        e.context(format!("stop the Herald server using {} before restoring into it", data_dir.display()))
    })?;
    let database = dir.database();
    if std::fs::metadata(&database)?.len() > 0 && !force {
        bail!("{} holds a database already; --force replaces it", data_dir.display());
    }
    let partial = partial_path(&database);
    let _ = std::fs::remove_file(&partial);
    std::fs::copy(from, &partial).with_context(|| format!("copying {}", from.display()))?;
    std::fs::set_permissions(&partial, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    std::fs::File::open(&partial)?.sync_all()?;
    // The replaced database's log must not be replayed into the restored one.
    for stale in &DATABASE_FILES[1..] {
        let _ = std::fs::remove_file(dir.path().join(stale));
    }
    std::fs::rename(&partial, &database)?;
    std::fs::File::open(dir.path())?.sync_all()?;
    contents(&database)
}

/// `path` with `.partial` appended.
fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// That `path` is a sound Herald database; its schema version.
fn check(path: &Path) -> anyhow::Result<i64> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .with_context(|| format!("opening {}", path.display()))?;
    let verdict: String = conn
        .query_row("PRAGMA quick_check", [], |r| r.get(0))
        .with_context(|| format!("{} is not a SQLite database", path.display()))?;
    if verdict != "ok" {
        bail!("{} is damaged: {verdict}", path.display());
    }
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    let is_herald = conn
        .query_row("SELECT count(*) FROM sqlite_master WHERE name IN ('app', 'endpoint', 'message')", [], |r| {
            r.get::<_, i64>(0)
        })
        .map(|n| n == 3)?;
    if version < 1 || !is_herald {
        bail!("{} is not a Herald database", path.display());
    }
    Ok(version)
}

fn contents(path: &Path) -> anyhow::Result<Contents> {
    let conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)?;
    let count = |table: &str| conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0));
    Ok(Contents {
        applications: count("app")?,
        endpoints: count("endpoint")?,
        messages: count("message")?,
        bytes: std::fs::metadata(path)?.len(),
    })
}
