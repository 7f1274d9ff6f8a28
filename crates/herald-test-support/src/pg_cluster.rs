//! A throwaway PostgreSQL cluster: `initdb` and `postgres` from the server binaries on this
//! machine, on a free port, in a temporary directory that is removed afterwards. The test
//! suite and `herald-bench --spawn --postgres` use it; the product never does.
//!
//! `initdb` runs once per machine into a template in the system temporary directory (which
//! the server's user can reach, unlike root's home); each cluster is a copy of it.
//! PostgreSQL refuses to run as root, so as root the server runs as the `postgres` user.

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// Server settings: loopback only, room for several Herald processes, and the usual
/// production WAL tuning (durability untouched: fsync, synchronous_commit and
/// full_page_writes stay on).
const SETTINGS: &[&str] = &[
    "listen_addresses=127.0.0.1",
    "max_connections=300",
    "shared_buffers=256MB",
    "wal_buffers=16MB",
    "wal_compression=on",
    "max_wal_size=4GB",
    "checkpoint_timeout=15min",
];

/// `n` random lowercase letters and digits, for names that must not clash.
fn unique(n: usize) -> String {
    use rand::Rng;
    const CHARS: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..n).map(|_| CHARS[rng.random_range(0..CHARS.len())] as char).collect()
}

pub struct TempCluster {
    dir: PathBuf,
    port: u16,
    child: Child,
}

/// The user the server runs as (and owns its files), when we are root.
struct RunAs {
    uid: u32,
    gid: u32,
}

impl TempCluster {
    pub fn start() -> anyhow::Result<Self> {
        let bin = server_binaries()?;
        let run_as = run_as()?;
        let template = template(&bin, run_as.as_ref())?;
        let dir = std::env::temp_dir().join(format!("herald-pg-{}", unique(8)));
        let copied = Command::new("cp").arg("-a").arg(&template).arg(&dir).status()?;
        if !copied.success() {
            bail!("copying the PostgreSQL template to {}", dir.display());
        }
        let port = free_port()?;
        let log = File::create(dir.join("server.log"))?;
        let mut command = Command::new(bin.join("postgres"));
        command
            .arg("-D")
            .arg(&dir)
            .args(["-p", &port.to_string()])
            .args(SETTINGS.iter().flat_map(|setting| ["-c", setting]))
            .arg("-c")
            .arg(format!("unix_socket_directories={}", dir.display()))
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(user) = &run_as {
            command.uid(user.uid).gid(user.gid);
        }
        let child = command.spawn().context("starting postgres")?;
        let cluster = Self { dir, port, child };
        cluster.wait_ready()?;
        Ok(cluster)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The URL of a database of this cluster.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// Creates a fresh database and returns its URL.
    pub async fn create_database(&self) -> anyhow::Result<String> {
        let name = format!("herald_{}", unique(6));
        // The port answers a moment before the server accepts connections ("the database
        // system is starting up").
        let client = connect(&self.url("postgres"), Duration::from_secs(10)).await?;
        client.batch_execute(&format!("CREATE DATABASE {name}")).await?;
        Ok(self.url(&name))
    }

    /// Stops the server (fast shutdown) and waits for it, for outage tests; `restart`
    /// brings it back on the same port and data.
    pub fn stop(&mut self, mode: &str) -> anyhow::Result<()> {
        let signal = match mode {
            "immediate" => libc::SIGQUIT,
            "smart" => libc::SIGTERM,
            _ => libc::SIGINT,
        };
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.child.id() as i32, signal) };
        self.child.wait()?;
        Ok(())
    }

    pub fn restart(&mut self) -> anyhow::Result<()> {
        let bin = server_binaries()?;
        let log = File::options().append(true).open(self.dir.join("server.log"))?;
        let mut command = Command::new(bin.join("postgres"));
        command
            .arg("-D")
            .arg(&self.dir)
            .args(["-p", &self.port.to_string()])
            .args(SETTINGS.iter().flat_map(|setting| ["-c", setting]))
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.display()))
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(user) = run_as()? {
            command.uid(user.uid).gid(user.gid);
        }
        self.child = command.spawn().context("restarting postgres")?;
        self.wait_ready()
    }

    fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
                && self.dir.join("postmaster.pid").exists()
            {
                // The port answers a moment before the server accepts queries.
                std::thread::sleep(Duration::from_millis(100));
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        bail!("PostgreSQL did not start within 30 s:\n{log}")
    }
}

impl Drop for TempCluster {
    fn drop(&mut self) {
        // SAFETY: signalling our own child; SIGQUIT is PostgreSQL's immediate shutdown.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGQUIT) };
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The directory holding `initdb` and `postgres`: from PATH, `pg_config --bindir`, or
/// Debian's usual place.
fn server_binaries() -> anyhow::Result<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find(|dir| dir.join("initdb").exists() && dir.join("postgres").exists());
    if let Some(dir) = on_path {
        return Ok(dir);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if dir.join("initdb").exists() {
            return Ok(dir);
        }
    }
    let mut debian: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|d| d.join("initdb").exists())
        .collect();
    debian.sort();
    debian.pop().context(
        "PostgreSQL server binaries (initdb, postgres) were not found on PATH, via pg_config or in \
         /usr/lib/postgresql: install them, e.g. `apt-get install postgresql`",
    )
}

fn run_as() -> anyhow::Result<Option<RunAs>> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    let entry = passwd.lines().find(|l| l.starts_with("postgres:")).context(
        "PostgreSQL refuses to run as root and there is no `postgres` user to run it as: \
         create one (`useradd --system postgres`)",
    )?;
    let fields: Vec<&str> = entry.split(':').collect();
    Ok(Some(RunAs { uid: fields[2].parse()?, gid: fields[3].parse()? }))
}

/// The initialised cluster every test cluster is copied from, created once per machine
/// (a lock file keeps concurrent test processes from racing).
fn template(bin: &Path, run_as: Option<&RunAs>) -> anyhow::Result<PathBuf> {
    let cache = std::env::temp_dir().join("herald-pg");
    std::fs::create_dir_all(&cache)?;
    let version = Command::new(bin.join("postgres")).arg("--version").output()?;
    let version: String =
        String::from_utf8_lossy(&version.stdout).chars().filter(|c| c.is_ascii_alphanumeric() || *c == '.').collect();
    let template = cache.join(format!("pg-template-{version}"));
    let lock = File::create(cache.join("pg-template.lock"))?;
    lock.lock()?;
    if !template.join("PG_VERSION").exists() {
        let staging = cache.join(format!("pg-template-staging-{}", unique(6)));
        std::fs::create_dir_all(&staging)?;
        if let Some(user) = run_as {
            std::os::unix::fs::chown(&staging, Some(user.uid), Some(user.gid))?;
        }
        let mut initdb = Command::new(bin.join("initdb"));
        initdb.arg("-D").arg(&staging).args(["-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8"]);
        if let Some(user) = run_as {
            initdb.uid(user.uid).gid(user.gid);
        }
        let out = initdb.output().context("running initdb")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let _ = std::fs::remove_dir_all(&template);
        std::fs::rename(&staging, &template)?;
    }
    // The copies must stay private to the server's user, as initdb made them.
    Ok(template)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Connects to `url`, trying for up to `patience` while the server is starting up, down,
/// or replaying its log after an immediate stop.
pub async fn connect(url: &str, patience: Duration) -> anyhow::Result<tokio_postgres::Client> {
    let deadline = Instant::now() + patience;
    loop {
        match tokio_postgres::connect(url, tokio_postgres::NoTls).await {
            Ok((client, connection)) => {
                tokio::spawn(connection);
                return Ok(client);
            }
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            Err(e) => return Err(e).with_context(|| format!("no connection to {url} within {patience:?}")),
        }
    }
}
