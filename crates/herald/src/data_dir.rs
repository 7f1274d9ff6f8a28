//! The data directory of the embedded store: private to Herald's user, locked to one
//! process. The directory is 0700 and every file Herald keeps there 0600 (the database and
//! its `-wal` and `-shm` files, the lock, the generated admin token and server key); looser
//! modes left by an earlier version or by hand are tightened at start, with a warning. A
//! secret file that other users could read is refused: the secret may have leaked already,
//! and only its owner can tell.

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

/// The mode of the directory and of its files.
const DIR_MODE: u32 = 0o700;
const FILE_MODE: u32 = 0o600;
/// Permission bits for the group and for others.
const SHARED_BITS: u32 = 0o077;

/// The embedded database's files, as SQLite names them: the database, then its log and
/// shared memory.
pub const DATABASE_FILES: [&str; 3] = ["herald.db", "herald.db-wal", "herald.db-shm"];

/// An open data directory; holding it keeps the lock (a second Herald on the same
/// directory fails at once).
pub struct DataDir {
    path: PathBuf,
    _lock: File,
}

impl DataDir {
    /// Creates (0700) or tightens the directory, takes its lock, and readies the database
    /// file with mode 0600 (SQLite gives its `-wal` and `-shm` files the database's mode).
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(path)
            .with_context(|| format!("creating data directory {}", path.display()))?;
        tighten(path, DIR_MODE)?;
        let lock = lock(path)?;
        for name in DATABASE_FILES {
            tighten(&path.join(name), FILE_MODE)?;
        }
        create_private(&path.join(DATABASE_FILES[0]))?;
        Ok(Self { path: path.to_owned(), _lock: lock })
    }

    pub fn database(&self) -> PathBuf {
        self.path.join(DATABASE_FILES[0])
    }

    /// Reads a one-line secret file, creating it (0600) with `generate()` when it does not
    /// exist yet; tells whether it was generated. A file others may read is refused.
    pub fn secret(&self, name: &str, generate: impl FnOnce() -> String) -> anyhow::Result<(String, bool)> {
        let path = self.path.join(name);
        if path.exists() {
            let mode = std::fs::metadata(&path)?.permissions().mode() & 0o777;
            if mode & SHARED_BITS != 0 {
                bail!(
                    "{} can be read by other users (mode {mode:o}); the secret in it may have leaked. \
                     Replace it if so, then run `chmod 600 {}`",
                    path.display(),
                    path.display()
                );
            }
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            return Ok((text.trim().to_owned(), false));
        }
        let value = generate();
        let mut options = std::fs::OpenOptions::new();
        options.write(true).create_new(true).mode(FILE_MODE);
        let mut file = options.open(&path).with_context(|| format!("creating {}", path.display()))?;
        writeln!(file, "{value}")?;
        file.sync_all()?;
        Ok((value, true))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Takes the directory's lock file (0600).
fn lock(dir: &Path) -> anyhow::Result<File> {
    let path = dir.join("herald.lock");
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(FILE_MODE)
        .open(&path)
        .with_context(|| format!("creating {}", path.display()))?;
    tighten(&path, FILE_MODE)?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => {
            bail!("another Herald process is using the data directory {}", dir.display())
        }
        Err(std::fs::TryLockError::Error(e)) => Err(e).context("locking the data directory"),
    }
}

/// Creates an empty file with mode 0600 unless it exists.
fn create_private(path: &Path) -> anyhow::Result<()> {
    let created = std::fs::OpenOptions::new().write(true).create_new(true).mode(FILE_MODE).open(path);
    match created {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
    }
}

/// Takes the group's and others' permissions away from `path`, saying so. A file that is
/// not there (or went meanwhile: SQLite removes its `-wal` and `-shm` files when the last
/// connection of a previous process closes) needs nothing.
fn tighten(path: &Path, mode: u32) -> anyhow::Result<()> {
    let gone = |e: &std::io::Error| e.kind() == std::io::ErrorKind::NotFound;
    let current = match std::fs::metadata(path) {
        Ok(meta) => meta.permissions().mode() & 0o777,
        Err(e) if gone(&e) => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading the permissions of {}", path.display())),
    };
    if current & SHARED_BITS == 0 {
        return Ok(());
    }
    match std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)) {
        Err(e) if gone(&e) => return Ok(()),
        changed => changed.with_context(|| format!("restricting the permissions of {}", path.display()))?,
    }
    tracing::warn!(path = %path.display(), was = format!("{current:o}"), now = format!("{mode:o}"), "tightened permissions");
    Ok(())
}
