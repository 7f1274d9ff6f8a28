//! The parent side of the jq sandbox: a small pool of worker processes (see `worker`),
//! each used by one evaluation at a time. An evaluation that outlives its deadline gets
//! its worker killed; one whose worker dies (memory or stack exhausted) fails; either way
//! the next evaluation on that slot starts a fresh worker. Nothing here can stall a caller
//! for longer than the deadline plus a process start.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Mutex;

use super::worker::{FAILED, MAX_FRAME, NOTHING, OK, READY};
use crate::config::ScriptsConfig;

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

/// What an evaluation yields: its first output as JSON text (object keys in the order the
/// expression made them), or nothing (`empty`).
pub type Evaluated = Result<Option<String>, EvalError>;

/// How long a new worker may take to start.
const STARTUP: Duration = Duration::from_secs(10);

pub struct Sandbox {
    program: PathBuf,
    config: ScriptsConfig,
    slots: Vec<Mutex<Option<Worker>>>,
    next: AtomicUsize,
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Sandbox {
    /// A pool whose workers run `program sandbox-worker` (the `herald` binary itself).
    pub fn new(program: PathBuf, config: ScriptsConfig) -> Self {
        let slots = (0..config.workers.max(1)).map(|_| Mutex::new(None)).collect();
        Self { program, config, slots, next: AtomicUsize::new(0) }
    }

    /// Runs `code` on `input` (JSON text) within the configured deadline.
    pub async fn eval(&self, code: &str, input: &[u8]) -> Evaluated {
        if code.len() > MAX_FRAME || input.len() > MAX_FRAME {
            return Err(EvalError::Failed("the input is too large for the sandbox".into()));
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        // A free worker if there is one, else wait for this caller's turn on one.
        let n = self.slots.len();
        let mut slot = match (0..n).find_map(|i| self.slots[(start + i) % n].try_lock().ok()) {
            Some(slot) => slot,
            None => self.slots[start % n].lock().await,
        };
        if slot.is_none() {
            *slot = Some(self.spawn().await.map_err(|e| EvalError::Unavailable(e.to_string()))?);
        }
        let worker = slot.as_mut().expect("just filled");
        let answer = tokio::time::timeout(self.config.timeout, worker.exchange(code, input)).await;
        let failed = match answer {
            Ok(Ok((OK, text))) => {
                return String::from_utf8(text)
                    .map(Some)
                    .map_err(|_| EvalError::Failed("the output is not UTF-8".into()));
            }
            Ok(Ok((NOTHING, _))) => return Ok(None),
            Ok(Ok((_, text))) => return Err(EvalError::Failed(String::from_utf8_lossy(&text).into_owned())),
            Ok(Err(_)) => EvalError::Crashed,
            Err(_) => EvalError::Timeout(self.config.timeout),
        };
        if let Some(mut worker) = slot.take() {
            let _ = worker.child.start_kill();
            // Reaped in the background: the caller does not wait for the exit.
            tokio::spawn(async move { worker.child.wait().await });
        }
        Err(failed)
    }

    /// Starts a worker and waits until it is ready (its start-up is not the expression's
    /// time).
    async fn spawn(&self) -> std::io::Result<Worker> {
        let mut child = Command::new(&self.program)
            .arg("sandbox-worker")
            .arg("--memory-bytes")
            .arg(self.config.memory_bytes.to_string())
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
            Ok(Ok(READY)) => Ok(Worker { child, stdin, stdout }),
            Ok(Ok(_)) => Err(std::io::Error::other("the worker answered something else than ready")),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(std::io::Error::other(format!("the worker was not ready within {STARTUP:?}"))),
        }
    }
}

impl Worker {
    async fn exchange(&mut self, code: &str, input: &[u8]) -> std::io::Result<(u8, Vec<u8>)> {
        let mut request = Vec::with_capacity(8 + code.len() + input.len());
        request.extend_from_slice(&(code.len() as u32).to_le_bytes());
        request.extend_from_slice(code.as_bytes());
        request.extend_from_slice(&(input.len() as u32).to_le_bytes());
        request.extend_from_slice(input);
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
