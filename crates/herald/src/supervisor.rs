//! Failure is loud. Every long-running task of a process is spawned through this module and
//! watched: a loop that panics, or ends while it was meant to run on, fails the whole
//! process ([`Liveness`]). A failed process answers its health check with 503 at once,
//! refuses new messages, gives back what it holds, and exits non-zero, so that a service
//! manager restarts it; what it had accepted is in the store and is taken up again.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, OnceLock};

use futures_util::FutureExt;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Whether the process is sound: once a task fails, it is not, for good.
#[derive(Debug, Default)]
pub struct Liveness {
    failure: OnceLock<String>,
    failed: Notify,
}

impl Liveness {
    /// Records the process's first failure (later ones are logged only).
    pub fn fail(&self, reason: String) {
        tracing::error!(%reason, "a background task failed; this process is unhealthy and stops");
        if self.failure.set(reason).is_ok() {
            self.failed.notify_waiters();
        }
    }

    /// Why the process failed, if it did.
    pub fn failure(&self) -> Option<&str> {
        self.failure.get().map(String::as_str)
    }

    /// Resolves (with the reason) once the process has failed.
    pub async fn failed(&self) -> String {
        loop {
            let notified = self.failed.notified();
            if let Some(reason) = self.failure() {
                return reason.to_owned();
            }
            notified.await;
        }
    }
}

/// When a stopping process must be gone: set once, as the stop begins, and read by each
/// part that stops after it (the HTTP server, the dispatcher, the runtime), so that all of
/// their steps together fit in the grace period, not each in one of its own.
#[derive(Debug, Clone, Default)]
pub struct StopDeadline(Arc<OnceLock<tokio::time::Instant>>);

impl StopDeadline {
    /// The end of a grace period kept for the exit itself (the runtime's shutdown, the
    /// kernel's teardown), after every step of the stop.
    pub const EXIT_MARGIN: std::time::Duration = std::time::Duration::from_millis(200);

    /// Starts the clock: the deadline is `grace` from now, less the exit's margin (a
    /// second call keeps the first).
    pub fn start(&self, grace: std::time::Duration) -> tokio::time::Instant {
        *self.0.get_or_init(|| tokio::time::Instant::now() + grace.saturating_sub(Self::EXIT_MARGIN))
    }

    /// The deadline, if the stop has begun.
    pub fn get(&self) -> Option<tokio::time::Instant> {
        self.0.get().copied()
    }
}

/// Spawns a loop that must run until `stop` is cancelled: if it panics, or returns while
/// `stop` is not cancelled, the process fails.
pub fn spawn_loop<F>(liveness: &Arc<Liveness>, name: &'static str, stop: CancellationToken, task: F) -> JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let liveness = liveness.clone();
    tokio::spawn(async move {
        match AssertUnwindSafe(task).catch_unwind().await {
            Ok(()) if stop.is_cancelled() => {}
            Ok(()) => liveness.fail(format!("{name} stopped on its own")),
            Err(panic) => liveness.fail(format!("{name} panicked: {}", panic_message(&*panic))),
        }
    })
}

/// Spawns a task that may end whenever its work is done: only a panic fails the process.
pub fn spawn_task<F>(liveness: &Arc<Liveness>, name: &'static str, task: F) -> JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let liveness = liveness.clone();
    tokio::spawn(async move {
        if let Err(panic) = AssertUnwindSafe(task).catch_unwind().await {
            liveness.fail(format!("{name} panicked: {}", panic_message(&*panic)));
        }
    })
}

/// Runs `body` on a thread of its own; a panic fails the process.
pub fn spawn_thread(liveness: &Arc<Liveness>, name: &'static str, body: impl FnOnce() + Send + 'static) {
    let liveness = liveness.clone();
    std::thread::Builder::new()
        .name(name.replace(' ', "-"))
        .spawn(move || {
            if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(body)) {
                liveness.fail(format!("{name} panicked: {}", panic_message(&*panic)));
            }
        })
        .expect("spawning a thread");
}

/// The message a panic carried, if it is text.
pub fn panic_message(panic: &(dyn Any + Send)) -> &str {
    panic.downcast_ref::<&str>().copied().or_else(|| panic.downcast_ref::<String>().map(String::as_str)).unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_loop_that_panics_or_ends_early_fails_the_process() {
        let liveness = Arc::new(Liveness::default());
        let stop = CancellationToken::new();
        spawn_loop(&liveness, "the quiet loop", stop.clone(), async {}).await.unwrap();
        assert_eq!(liveness.failure(), Some("the quiet loop stopped on its own"));
        let second = Arc::new(Liveness::default());
        spawn_loop(&second, "the pump", stop.clone(), async { panic!("boom") }).await.unwrap();
        assert_eq!(second.failed().await, "the pump panicked: boom");
    }

    #[tokio::test]
    async fn a_loop_that_ends_when_told_and_a_finished_task_are_fine() {
        let liveness = Arc::new(Liveness::default());
        let stop = CancellationToken::new();
        stop.cancel();
        spawn_loop(&liveness, "the loader", stop, async {}).await.unwrap();
        spawn_task(&liveness, "a one-shot", async {}).await.unwrap();
        assert_eq!(liveness.failure(), None);
        spawn_task(&liveness, "a one-shot", async { panic!("{}", String::from("formatted")) }).await.unwrap();
        assert_eq!(liveness.failure(), Some("a one-shot panicked: formatted"));
    }
}
