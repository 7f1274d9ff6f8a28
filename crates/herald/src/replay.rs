//! Bulk replays of dead letters as background tasks: the matching deliveries are put back
//! in the queue in chunks (as manual attempts, through the normal pipeline), and the task's
//! progress can be read while it runs. Tasks live in the memory of the process that
//! started them and are forgotten an hour after they finish.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::clock::{Millis, now_ms};
use crate::dispatch::Dispatcher;
use crate::ids::{AppId, TaskId};
use crate::store::{QueueStore, Requeue};
use crate::supervisor::spawn_task;

/// Deliveries requeued per store call.
const CHUNK: usize = 200;
/// How long a finished task stays readable.
const KEEP_FINISHED_MS: Millis = 3_600_000;

pub struct ReplayTask {
    pub id: TaskId,
    pub app_id: AppId,
    pub total: u64,
    pub started_at: Millis,
    replayed: AtomicU64,
    finished_at: Mutex<Option<Millis>>,
    failed: AtomicBool,
}

impl ReplayTask {
    /// Dead letters put back so far (those still dead letters when their chunk ran).
    pub fn replayed(&self) -> u64 {
        self.replayed.load(Ordering::Relaxed)
    }

    pub fn finished_at(&self) -> Option<Millis> {
        *self.finished_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// "running", "finished" or "failed".
    pub fn status(&self) -> &'static str {
        match (self.finished_at(), self.failed.load(Ordering::Relaxed)) {
            (None, _) => "running",
            (Some(_), false) => "finished",
            (Some(_), true) => "failed",
        }
    }
}

#[derive(Default)]
pub struct ReplayTasks {
    tasks: Mutex<HashMap<String, Arc<ReplayTask>>>,
}

impl ReplayTasks {
    /// Starts replaying `deliveries` (dead letters of `app`); returns the task at once.
    pub fn start(
        &self,
        store: Arc<dyn QueueStore>,
        dispatcher: Arc<Dispatcher>,
        app: AppId,
        deliveries: Vec<i64>,
    ) -> Arc<ReplayTask> {
        let task = Arc::new(ReplayTask {
            id: TaskId::generate(),
            app_id: app,
            total: deliveries.len() as u64,
            started_at: now_ms(),
            replayed: AtomicU64::new(0),
            finished_at: Mutex::new(None),
            failed: AtomicBool::new(false),
        });
        {
            let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
            let now = now_ms();
            tasks.retain(|_, t| t.finished_at().is_none_or(|at| now - at < KEEP_FINISHED_MS));
            tasks.insert(task.id.to_string(), task.clone());
        }
        let live = dispatcher.liveness().clone();
        spawn_task(&live, "a bulk replay", run(task.clone(), store, dispatcher, deliveries));
        task
    }

    /// A task of `app` by id.
    pub fn get(&self, app: &AppId, id: &str) -> Option<Arc<ReplayTask>> {
        let tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.get(id).filter(|t| &t.app_id == app).cloned()
    }
}

/// Ends a replay's record however its task ends: a task that did not get to the end (it
/// panicked, failing the process) shows as failed, never as running forever.
struct Finished(Arc<ReplayTask>, bool);

impl Drop for Finished {
    fn drop(&mut self) {
        if !self.1 {
            self.0.failed.store(true, Ordering::Relaxed);
        }
        self.0.finished_at.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert_with(now_ms);
    }
}

async fn run(task: Arc<ReplayTask>, store: Arc<dyn QueueStore>, dispatcher: Arc<Dispatcher>, deliveries: Vec<i64>) {
    let mut finished = Finished(task.clone(), false);
    for chunk in deliveries.chunks(CHUNK) {
        match store.requeue(Requeue::DeadLetters { ids: chunk.to_vec() }).await {
            Ok(n) => {
                task.replayed.fetch_add(n, Ordering::Relaxed);
                dispatcher.poke();
            }
            Err(e) => {
                tracing::warn!(task = %task.id, error = %e, "a bulk replay stopped");
                task.failed.store(true, Ordering::Relaxed);
                break;
            }
        }
    }
    finished.1 = true;
}
