//! The parent side of the jq sandbox: a pool of worker processes (see `worker`) shared by
//! every tenant, each worker used by one exchange at a time.
//!
//! Three rules keep one tenant from hurting another here:
//! - **Fair turns.** A tenant holds at most its share of the workers, and waiting tenants
//!   take turns at the free ones ([`super::turns`]).
//! - **A worker belongs to one exchange.** It goes back to the pool only after a complete
//!   answer. An exchange that fails, outlives its deadline, or is abandoned (its caller's
//!   future dropped between writing the request and reading the answer) takes its worker
//!   with it: the process is killed, so no later caller can read an answer meant for
//!   someone else. The exchange that lost it starts its replacement on its own turn (the
//!   next tenant does not wait for a process start); an abandoned one leaves that to
//!   whoever needs a worker next.
//! - **Bounded time.** Nothing here keeps a caller longer than its wait for a turn (others'
//!   deadlines, and the process start that follows a failed one), a process start, and its
//!   own deadline.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::oneshot;

use super::bounds;
use super::turns::{Turns, WaiterId};
use super::worker::{COMPILE, EVALUATE, FAILED, MAX_FRAME, NOTHING, OK, READY};
use crate::config::ScriptsConfig;
use crate::ids::AppId;
use crate::metrics::SandboxUsage;

/// Why an evaluation produced no output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EvalError {
    /// The expression failed on this input (its own error message).
    #[error("{0}")]
    Failed(String),
    #[error("the expression ran longer than {0:?} and was stopped")]
    Timeout(Duration),
    #[error("the expression exhausted the sandbox's memory or stack and was stopped")]
    Crashed,
    #[error("the jq sandbox could not be started: {0}")]
    Unavailable(String),
}

/// Why an expression cannot be set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    /// The expression's fault: too long, too deep, not valid jq, or too costly to compile.
    #[error("{0}")]
    Invalid(String),
    /// Herald's: the sandbox cannot run.
    #[error("the jq sandbox could not be started: {0}")]
    Unavailable(String),
}

/// What an evaluation yields: its first output as JSON text (object keys in the order the
/// expression made them), or nothing (`empty`).
pub type Evaluated = Result<Option<String>, EvalError>;

/// How long a new worker may take to start.
const STARTUP: Duration = Duration::from_secs(10);
/// How long compiling an expression may take at least (the evaluation deadline, if longer).
const COMPILE_BUDGET: Duration = Duration::from_secs(2);

pub struct Sandbox {
    program: PathBuf,
    config: ScriptsConfig,
    /// Longest output a worker answers with.
    max_output: usize,
    pool: Mutex<Pool>,
    next_waiter: AtomicU64,
    /// Per application: exchanges run, and the time workers spent on them.
    usage: Mutex<HashMap<AppId, SandboxUsage>>,
}

/// The pool's state, under one lock: whose turn it is, the idle workers, and how to wake
/// each waiting exchange.
struct Pool {
    turns: Turns<AppId>,
    /// Live workers nobody holds (at most as many as free turns).
    idle: Vec<Worker>,
    /// The waiting exchanges: sending wakes one that now holds a turn.
    waiters: HashMap<WaiterId, oneshot::Sender<()>>,
}

struct Worker {
    /// Killed when dropped (`kill_on_drop`): a worker nobody gives back dies.
    _child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

/// One exchange's turn at a worker. Dropping it gives the turn back, and with it the
/// worker if the exchange put one back (a worker taken out and not returned is killed).
struct Turn<'a> {
    sandbox: &'a Sandbox,
    tenant: AppId,
    worker: Option<Worker>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut pool = self.sandbox.pool();
        if let Some(worker) = self.worker.take() {
            pool.idle.push(worker);
        }
        pool.release(&self.tenant);
    }
}

impl Pool {
    /// Gives `tenant`'s turn back and wakes whoever gets it (a waiter whose caller left in
    /// the meantime passes it on when its guard notices; see [`Waiting`]).
    fn release(&mut self, tenant: &AppId) {
        if let Some((_, waiter)) = self.turns.release(tenant)
            && let Some(wake) = self.waiters.remove(&waiter)
        {
            // A failed send means the receiver is gone, and its guard (which runs under this
            // lock before the receiver drops) has not seen the grant yet: it will.
            let _ = wake.send(());
        }
    }
}

/// An exchange waiting for its turn. If its caller goes away first, the guard takes it out
/// of the queue, or passes on a turn it was granted meanwhile.
struct Waiting<'a> {
    sandbox: &'a Sandbox,
    tenant: AppId,
    id: WaiterId,
    granted: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.granted {
            return;
        }
        let mut pool = self.sandbox.pool();
        if pool.waiters.remove(&self.id).is_some() {
            pool.turns.cancel(&self.tenant, self.id);
        } else {
            // Granted after the caller left: the turn goes to the next in line.
            pool.release(&self.tenant);
        }
    }
}

impl Sandbox {
    /// A pool whose workers run `program sandbox-worker` (the `herald` binary itself); a
    /// worker answers with at most `max_output` bytes.
    pub fn new(program: PathBuf, config: ScriptsConfig, max_output: usize) -> Self {
        let workers = config.workers.max(1);
        let share = config.max_workers_per_app.clamp(1, workers);
        let pool = Pool { turns: Turns::new(workers, share), idle: Vec::new(), waiters: HashMap::new() };
        Self {
            program,
            config,
            max_output: max_output.min(MAX_FRAME),
            pool: Mutex::new(pool),
            next_waiter: AtomicU64::new(0),
            usage: Mutex::default(),
        }
    }

    /// Runs `code` on `input` (JSON text) for `tenant`, within the configured deadline.
    pub async fn eval(&self, tenant: &AppId, code: &str, input: &[u8]) -> Evaluated {
        if code.len() > MAX_FRAME || input.len() > MAX_FRAME {
            return Err(EvalError::Failed("the input is too large for the sandbox".into()));
        }
        match self.exchange(tenant, EVALUATE, code, Some(input), self.config.timeout).await? {
            (OK, text) => {
                String::from_utf8(text).map(Some).map_err(|_| EvalError::Failed("the output is not UTF-8".into()))
            }
            (NOTHING, _) => Ok(None),
            (_, text) => Err(EvalError::Failed(String::from_utf8_lossy(&text).into_owned())),
        }
    }

    /// Whether `code` may be set as one of `tenant`'s expressions: within the bounds, and
    /// compiled by a worker (never in this process).
    pub async fn check(&self, tenant: &AppId, code: &str) -> Result<(), CheckError> {
        bounds::check(code).map_err(|e| CheckError::Invalid(e.to_string()))?;
        let budget = self.config.timeout.max(COMPILE_BUDGET);
        match self.exchange(tenant, COMPILE, code, None, budget).await {
            Ok((OK, _)) => Ok(()),
            Ok((_, text)) => Err(CheckError::Invalid(String::from_utf8_lossy(&text).into_owned())),
            Err(EvalError::Timeout(_)) => {
                Err(CheckError::Invalid(format!("is too costly: compiling it took longer than {budget:?}")))
            }
            Err(EvalError::Crashed) => {
                Err(CheckError::Invalid("is too complex: compiling it exhausted the sandbox's stack or memory".into()))
            }
            Err(EvalError::Unavailable(why)) => Err(CheckError::Unavailable(why)),
            Err(EvalError::Failed(why)) => Err(CheckError::Invalid(why)),
        }
    }

    /// One request and its answer on a worker of `tenant`'s turn, within `deadline`.
    async fn exchange(
        &self,
        tenant: &AppId,
        op: u8,
        code: &str,
        input: Option<&[u8]>,
        deadline: Duration,
    ) -> Result<(u8, Vec<u8>), EvalError> {
        let mut turn = self.turn(tenant).await;
        let mut worker = match turn.worker.take() {
            Some(worker) => worker,
            None => self.spawn().await.map_err(|e| EvalError::Unavailable(e.to_string()))?,
        };
        let started = std::time::Instant::now();
        let answer = tokio::time::timeout(deadline, worker.exchange(op, code, input)).await;
        self.used(tenant, started.elapsed());
        let failure = match answer {
            Ok(Ok(answer)) => {
                turn.worker = Some(worker);
                return Ok(answer);
            }
            Ok(Err(_)) => EvalError::Crashed,
            Err(_) => EvalError::Timeout(deadline),
        };
        // The worker may be mid-answer, or dead already: it is killed here, and the tenant
        // whose expression failed starts its replacement on its own turn, so the next
        // tenant finds a worker ready instead of waiting for a process to start.
        drop(worker);
        turn.worker = self.spawn().await.ok();
        Err(failure)
    }

    /// Waits for `tenant`'s turn at a worker (with an idle worker, if one is alive).
    async fn turn(&self, tenant: &AppId) -> Turn<'_> {
        let id = self.next_waiter.fetch_add(1, Ordering::Relaxed);
        let woken = {
            let mut pool = self.pool();
            if pool.turns.take(tenant, id) {
                let worker = pool.idle.pop();
                return Turn { sandbox: self, tenant: tenant.clone(), worker };
            }
            let (wake, woken) = oneshot::channel();
            pool.waiters.insert(id, wake);
            woken
        };
        let mut waiting = Waiting { sandbox: self, tenant: tenant.clone(), id, granted: false };
        // The sender lives in the pool until it is used, and the pool outlives this call.
        let _ = woken.await;
        waiting.granted = true;
        let worker = self.pool().idle.pop();
        Turn { sandbox: self, tenant: tenant.clone(), worker }
    }

    /// Each application's use of the sandbox so far.
    pub fn usage(&self) -> Vec<(AppId, SandboxUsage)> {
        let usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        usage.iter().map(|(app, u)| (app.clone(), *u)).collect()
    }

    /// The application is gone: its counts go with it.
    pub fn forget(&self, tenant: &AppId) {
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).remove(tenant);
    }

    fn used(&self, tenant: &AppId, time: Duration) {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        let entry = match usage.get_mut(tenant) {
            Some(entry) => entry,
            None => usage.entry(tenant.clone()).or_default(),
        };
        entry.exchanges += 1;
        entry.seconds += time.as_secs_f64();
    }

    fn pool(&self) -> MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Starts a worker and waits until it is ready (its start-up is not the expression's
    /// time).
    async fn spawn(&self) -> std::io::Result<Worker> {
        let mut child = Command::new(&self.program)
            .arg("sandbox-worker")
            .arg("--memory-bytes")
            .arg(self.config.memory_bytes.to_string())
            .arg("--max-output-bytes")
            .arg(self.max_output.to_string())
            // Nothing of Herald's environment (tokens, database URLs) reaches `$ENV`.
            .env_clear()
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        match tokio::time::timeout(STARTUP, stdout.read_u8()).await {
            Ok(Ok(READY)) => Ok(Worker { _child: child, stdin, stdout }),
            Ok(Ok(_)) => Err(std::io::Error::other("the worker answered something else than ready")),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(std::io::Error::other(format!("the worker was not ready within {STARTUP:?}"))),
        }
    }
}

impl Worker {
    async fn exchange(&mut self, op: u8, code: &str, input: Option<&[u8]>) -> std::io::Result<(u8, Vec<u8>)> {
        let input_len = input.map_or(0, |i| 4 + i.len());
        let mut request = Vec::with_capacity(5 + code.len() + input_len);
        request.push(op);
        request.extend_from_slice(&(code.len() as u32).to_le_bytes());
        request.extend_from_slice(code.as_bytes());
        if let Some(input) = input {
            request.extend_from_slice(&(input.len() as u32).to_le_bytes());
            request.extend_from_slice(input);
        }
        self.stdin.write_all(&request).await?;
        self.stdin.flush().await?;
        let status = self.stdout.read_u8().await?;
        if ![OK, NOTHING, FAILED].contains(&status) {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
        let len = self.stdout.read_u32_le().await? as usize;
        if len > MAX_FRAME {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
        let mut text = vec![0; len];
        self.stdout.read_exact(&mut text).await?;
        Ok((status, text))
    }
}
