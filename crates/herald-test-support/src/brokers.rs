//! Throwaway message brokers for the event destination tests and benchmarks: the server
//! programs installed on this machine (Debian's redis-server and nats-server, …, tansu
//! from the Rust registry and the moto AWS emulator from pip), each on a free loopback
//! port with its data in a temporary directory, which can be killed (`SIGKILL`, nothing
//! flushed) and started again on the same port and data.

use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// How long a broker may take to answer on its port. RabbitMQ's boot on a 2-core machine
/// busy with the rest of the suite has taken more than a minute.
const START_LIMIT: Duration = Duration::from_secs(180);

/// How a broker is started, given its port and data directory.
type Args = Box<dyn Fn(u16, &Path) -> Vec<String> + Send + Sync>;

/// moto's server, with one race of its SQS fixed: moto 5.2 deletes a message by
/// rebuilding the queue's message list outside the lock its sends take, so a message sent
/// while another is deleted can vanish (seen as a lost message under load, with several
/// consumers deleting while Herald publishes). Here a delete holds that lock too.
const MOTO_SQS_DELETE_FIX: &str = "
import sys
from moto.sqs.models import Queue
from moto.server import main

unlocked_delete = Queue.delete_message

def delete_message(self, receipt_handle):
    with self._messages_lock:
        return unlocked_delete(self, receipt_handle)

Queue.delete_message = delete_message
main(sys.argv[1:])
";

/// A broker process on loopback.
pub struct Broker {
    program: PathBuf,
    args: Args,
    dir: tempfile::TempDir,
    port: u16,
    child: Option<Child>,
}

/// What a broker serves TLS with (PEM files): its certificate and key, and the CA whose
/// client certificates it requires.
#[derive(Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl Broker {
    /// Starts `program` (found on PATH or in the system directories) with `args`, and waits
    /// for its port to answer.
    fn start(program: &str, args: Args) -> anyhow::Result<Self> {
        Self::start_with(program, args, |_| Ok(()))
    }

    /// As [`Broker::start`], preparing the data directory with `prepare` first.
    fn start_with(program: &str, args: Args, prepare: impl Fn(&Path) -> anyhow::Result<()>) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        prepare(dir.path())?;
        Self::start_in(program, args, dir, free_port()?)
    }

    /// As [`Broker::start`], on `port`.
    fn start_on(program: &str, args: Args, port: u16) -> anyhow::Result<Self> {
        Self::start_in(program, args, tempfile::tempdir()?, port)
    }

    fn start_in(program: &str, args: Args, dir: tempfile::TempDir, port: u16) -> anyhow::Result<Self> {
        let program = find(program)?;
        let mut broker = Self { program, args, dir, port, child: None };
        broker.restart()?;
        Ok(broker)
    }

    /// Redis, persisting every write before it answers (`appendfsync always`), so a
    /// broker killed mid-run keeps every entry it acknowledged; with `password`, clients
    /// must `AUTH` as the default user.
    pub fn redis(password: Option<&str>) -> anyhow::Result<Self> {
        Self::redis_with(password, None)
    }

    /// Redis as [`Broker::redis`], also serving TLS on `tls_port` and requiring a client
    /// certificate there.
    pub fn redis_tls(password: Option<&str>, tls: TlsFiles, tls_port: u16) -> anyhow::Result<Self> {
        Self::redis_with(password, Some((tls, tls_port)))
    }

    fn redis_with(password: Option<&str>, tls: Option<(TlsFiles, u16)>) -> anyhow::Result<Self> {
        let password = password.map(str::to_owned);
        Self::start(
            "redis-server",
            Box::new(move |port, dir| {
                let mut args: Vec<String> = [
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--dir",
                    &dir.to_string_lossy(),
                    "--appendonly",
                    "yes",
                    "--appendfsync",
                    "always",
                    "--save",
                    "",
                    "--daemonize",
                    "no",
                    "--protected-mode",
                    "no",
                    "--logfile",
                    "broker.log",
                ]
                .map(str::to_owned)
                .into();
                if let Some(password) = &password {
                    args.extend(["--requirepass".to_owned(), password.clone()]);
                }
                if let Some((tls, port)) = &tls {
                    args.extend(["--tls-port".to_owned(), port.to_string()]);
                    for (flag, file) in
                        [("--tls-cert-file", &tls.cert), ("--tls-key-file", &tls.key), ("--tls-ca-cert-file", &tls.ca)]
                    {
                        args.extend([flag.to_owned(), file.to_string_lossy().into_owned()]);
                    }
                }
                args
            }),
        )
    }

    /// NATS with JetStream, its streams stored in files under the data directory (so a
    /// broker killed mid-run keeps the messages it acknowledged), and one user.
    pub fn nats(user: &str, password: &str) -> anyhow::Result<Self> {
        Self::nats_with(user, password, None)
    }

    /// NATS as [`Broker::nats`], speaking TLS only and requiring a client certificate.
    pub fn nats_tls(user: &str, password: &str, tls: TlsFiles) -> anyhow::Result<Self> {
        Self::nats_with(user, password, Some(tls))
    }

    fn nats_with(user: &str, password: &str, tls: Option<TlsFiles>) -> anyhow::Result<Self> {
        let (user, password) = (user.to_owned(), password.to_owned());
        Self::start(
            "nats-server",
            Box::new(move |port, dir| {
                let args = ["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd", &dir.to_string_lossy()];
                let mut args: Vec<String> = args.map(str::to_owned).into();
                args.extend(["--user", &user, "--pass", &password, "-l", "broker.log"].map(str::to_owned));
                if let Some(tls) = &tls {
                    args.extend(["--tlsverify".to_owned()]);
                    for (flag, file) in [("--tlscert", &tls.cert), ("--tlskey", &tls.key), ("--tlscacert", &tls.ca)] {
                        args.extend([flag.to_owned(), file.to_string_lossy().into_owned()]);
                    }
                }
                args
            }),
        )
    }

    /// RabbitMQ, its node named after its port, its data under the data directory; as the
    /// `rabbitmq` user when run as root (the Debian package's user, who must own the data).
    /// `user` is made at the first start (`default_user`), with every permission on `/`.
    pub fn rabbitmq(user: &str, password: &str) -> anyhow::Result<Self> {
        Self::rabbitmq_with(user, password, None)
    }

    /// RabbitMQ as [`Broker::rabbitmq`], also serving AMQP over TLS on `tls_port` and
    /// requiring a client certificate there (the files must be readable by the `rabbitmq`
    /// user).
    pub fn rabbitmq_tls(user: &str, password: &str, tls: TlsFiles, tls_port: u16) -> anyhow::Result<Self> {
        Self::rabbitmq_with(user, password, Some((tls, tls_port)))
    }

    fn rabbitmq_with(user: &str, password: &str, tls: Option<(TlsFiles, u16)>) -> anyhow::Result<Self> {
        let mut config = format!("default_user = {user}\ndefault_pass = {password}\n");
        if let Some((tls, port)) = tls {
            let file = |path: PathBuf| path.to_string_lossy().into_owned();
            config += &format!(
                "listeners.ssl.default = {port}\nssl_options.cacertfile = {}\nssl_options.certfile = {}\n\
                 ssl_options.keyfile = {}\nssl_options.verify = verify_peer\nssl_options.fail_if_no_peer_cert = true\n",
                file(tls.ca),
                file(tls.cert),
                file(tls.key),
            );
        }
        let server = PathBuf::from("/usr/lib/rabbitmq/bin/rabbitmq-server");
        if !server.is_file() {
            bail!("rabbitmq-server is not installed (scripts/test.sh installs the brokers)");
        }
        let dist_port = free_port()?;
        let as_root = unsafe { libc::geteuid() } == 0;
        let program = if as_root { "runuser" } else { "env" };
        let broker = Self::start_with(
            program,
            Box::new(move |port, dir| {
                let dir = dir.to_string_lossy();
                let mut args: Vec<String> =
                    if as_root { ["-u", "rabbitmq", "--", "env"].map(str::to_owned).into() } else { Vec::new() };
                args.extend([
                    format!("HOME={dir}"),
                    format!("RABBITMQ_NODENAME=rabbit-{port}@localhost"),
                    "RABBITMQ_NODE_IP_ADDRESS=127.0.0.1".to_owned(),
                    format!("RABBITMQ_NODE_PORT={port}"),
                    format!("RABBITMQ_DIST_PORT={dist_port}"),
                    format!("RABBITMQ_MNESIA_BASE={dir}/mnesia"),
                    format!("RABBITMQ_LOG_BASE={dir}/log"),
                    format!("RABBITMQ_ENABLED_PLUGINS_FILE={dir}/enabled_plugins"),
                    format!("RABBITMQ_CONFIG_FILE={dir}/rabbitmq"),
                    server.to_string_lossy().into_owned(),
                ]);
                args
            }),
            move |dir| {
                std::fs::write(dir.join("rabbitmq.conf"), &config)?;
                if as_root {
                    let owner = Command::new("id").args(["-u", "rabbitmq"]).output()?;
                    let uid: u32 =
                        String::from_utf8_lossy(&owner.stdout).trim().parse().context("the rabbitmq user")?;
                    std::os::unix::fs::chown(dir, Some(uid), None)?;
                }
                Ok(())
            },
        )?;
        Ok(broker)
    }

    /// The moto server (the AWS emulator: SQS, SNS, EventBridge, IAM), its state in memory,
    /// checking every request's signature against the IAM users it knows after the first
    /// `unauthenticated` requests (which make the first user). Run by `python`, a Python
    /// with `moto[server]`, with `MOTO_SQS_DELETE_FIX` applied.
    pub fn moto(python: &str, unauthenticated: u32) -> anyhow::Result<Self> {
        let python = python.to_owned();
        Self::start(
            "env",
            Box::new(move |port, _| {
                let args = ["-c", MOTO_SQS_DELETE_FIX, "-H", "127.0.0.1", "-p", &port.to_string()];
                [format!("INITIAL_NO_AUTH_ACTION_COUNT={unauthenticated}"), python.clone()]
                    .into_iter()
                    .chain(args.map(str::to_owned))
                    .collect()
            }),
        )
    }

    /// tansu (a Kafka-protocol broker) on its SQLite storage engine in the data directory
    /// (so a broker killed mid-run keeps every batch it acknowledged), requiring SASL:
    /// `user` may log in with SCRAM-SHA-512 or SCRAM-SHA-256. tansu makes no user while
    /// it requires authentication, so the user is made on a first run without it. With
    /// `advertised`, it tells clients to reach it on that port (a TLS terminator's: see
    /// [`Broker::tls_terminator`]).
    pub fn tansu(user: &str, password: &str, advertised: Option<u16>) -> anyhow::Result<Self> {
        let args = |authentication: bool, advertised: Option<u16>| -> Args {
            Box::new(move |port, _| {
                let listener = format!("tcp://127.0.0.1:{port}");
                let advertised = format!("tcp://127.0.0.1:{}", advertised.unwrap_or(port));
                let mut args: Vec<String> =
                    ["broker", "--listener-url", &listener, "--advertised-listener-url", &advertised]
                        .map(str::to_owned)
                        .into();
                args.extend(["--storage-engine".to_owned(), "sqlite://tansu.db".to_owned()]);
                if authentication {
                    args.push("--authentication".to_owned());
                }
                args
            })
        };
        let mut broker = Self::start("tansu", args(false, None))?;
        for mechanism in ["scram512", "scram256"] {
            let made = Command::new(&broker.program)
                .args(["user", "create", "--broker", &format!("tcp://127.0.0.1:{}", broker.port)])
                .args(["--mechanism", mechanism, user, password])
                .output()?;
            if !made.status.success() {
                bail!("tansu user create: {}", String::from_utf8_lossy(&made.stderr));
            }
        }
        broker.stop();
        // tansu 0.6 reads each fetched record's headers with a query that scans the whole
        // header table (it has no index), so reading a topic takes time quadratic in its
        // records: ten thousand take minutes. The index makes them a fraction of a second.
        rusqlite::Connection::open(broker.dir.path().join("tansu.db"))?
            .execute_batch("create index if not exists header_by_record on header (topition, offset_id)")?;
        broker.args = args(true, advertised);
        broker.restart()?;
        Ok(broker)
    }

    /// TLS on `port` in front of the plain TCP service on `to` (socat with OpenSSL): it
    /// presents `tls.cert` and requires a client certificate signed by `tls.ca`. For
    /// brokers that cannot serve TLS themselves: tansu 0.6's command line refuses its own
    /// `--cert` together with `--key`.
    pub fn tls_terminator(to: u16, tls: &TlsFiles, port: u16) -> anyhow::Result<Self> {
        let tls = tls.clone();
        Self::start_on(
            "socat",
            Box::new(move |port, _| {
                let (cert, key, ca) = (tls.cert.display(), tls.key.display(), tls.ca.display());
                vec![
                    format!(
                        "OPENSSL-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork,cert={cert},key={key},cafile={ca},verify=1"
                    ),
                    format!("TCP:127.0.0.1:{to}"),
                ]
            }),
            port,
        )
    }

    /// A TCP forwarder (socat) from a port of its own to `to` on loopback: killed, the
    /// service behind it is unreachable (connections refused, the open ones reset) without
    /// losing its state; restarted, it is back.
    pub fn forwarder(to: u16) -> anyhow::Result<Self> {
        Self::start(
            "socat",
            Box::new(move |port, _| {
                vec![format!("TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr,fork"), format!("TCP:127.0.0.1:{to}")]
            }),
        )
    }

    /// The last `lines` lines of every `.log` file under the data directory: what a
    /// failing test shows of the broker's side.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        let mut pending = vec![self.dir.path().to_path_buf()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    pending.push(path);
                } else if path.extension().is_some_and(|e| e == "log") {
                    let text = std::fs::read_to_string(&path).unwrap_or_default();
                    let all: Vec<&str> = text.lines().collect();
                    out += &format!("== {}\n{}\n", path.display(), all[all.len().saturating_sub(lines)..].join("\n"));
                }
            }
        }
        out
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the broker without warning (`SIGKILL`, its whole process group) and waits for
    /// it to be gone and its port closed.
    pub fn kill(&mut self) {
        self.signal(libc::SIGKILL);
    }

    /// Stops the broker cleanly (`SIGTERM`, so it saves what it keeps) and waits for it to
    /// be gone and its port closed.
    pub fn stop(&mut self) {
        self.signal(libc::SIGTERM);
    }

    fn signal(&mut self, signal: libc::c_int) {
        if let Some(mut child) = self.child.take() {
            // The broker is its process group's leader (`process_group(0)`): its children
            // (a server started through `runuser` and a script) get the signal too.
            unsafe { libc::kill(-(child.id() as i32), signal) };
            let _ = child.wait();
            let deadline = Instant::now() + Duration::from_secs(30);
            while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
        }
    }

    /// Starts the broker (again) on its port and data, and waits for the port to answer.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        let log = File::options().create(true).append(true).open(self.dir.path().join("process.log"))?;
        let child = Command::new(&self.program)
            .args((self.args)(self.port, self.dir.path()))
            .current_dir(self.dir.path())
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.program.display()))?;
        self.child = Some(child);
        let deadline = Instant::now() + START_LIMIT;
        while Instant::now() < deadline {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if let Some(child) = &mut self.child
                && let Some(status) = child.try_wait()?
            {
                bail!("{} exited ({status}):\n{}", self.program.display(), self.logs());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        bail!("{} did not listen within {START_LIMIT:?}:\n{}", self.program.display(), self.logs())
    }

    /// What the broker wrote to its logs, for failure messages: its output, its own log
    /// file, and the files in its `log` directory (RabbitMQ's).
    pub fn logs(&self) -> String {
        let own = ["process.log", "broker.log"].map(|name| self.dir.path().join(name));
        let in_log_dir = std::fs::read_dir(self.dir.path().join("log"))
            .into_iter()
            .flatten()
            .filter_map(|entry| Some(entry.ok()?.path()));
        own.into_iter()
            .chain(in_log_dir)
            .filter_map(|path| Some(format!("--- {}\n{}", path.display(), std::fs::read_to_string(&path).ok()?)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A free loopback port.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The program's path: on PATH, or in the system directories Debian installs servers to.
fn find(program: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/bin", "/sbin", "/usr/local/bin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
        .with_context(|| format!("{program} is not installed (scripts/test.sh installs the brokers)"))
}
