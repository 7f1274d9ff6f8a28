//! Wake-ups per application for long-polls: a consumer waiting for new messages of one
//! application is woken by that application's commits only, never by another's.
//!
//! The store notifies an application when it commits messages of it in this process. On a
//! shared database commits elsewhere (other processes, producers' own transactions) send
//! nothing, so waiting long-polls also look at the log's head: once a second per
//! application, however many wait ([`AppWakeups::recheck`]), and all of them wake only if
//! it moved.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{LogPosition, PollStore, StoreResult};
use crate::ids::AppId;

/// How often an application's log head is looked at, at most, for its waiting long-polls.
pub const RECHECK: Duration = Duration::from_secs(1);

#[derive(Default)]
pub struct AppWakeups {
    apps: Mutex<HashMap<AppId, Weak<AppWatch>>>,
    /// Live watches: while there is none, a commit costs one atomic load here.
    live: Arc<AtomicUsize>,
}

/// What the waiting long-polls of one application share.
pub struct AppWatch {
    pub notify: Notify,
    /// The log head seen last, and when it was looked at (shared stores).
    head: tokio::sync::Mutex<(Option<LogPosition>, Option<Instant>)>,
    live: Arc<AtomicUsize>,
}

impl Drop for AppWatch {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}

impl AppWakeups {
    /// The watch of `app`, shared with its other waiting long-polls (it lives while one of
    /// them holds it).
    pub fn watch(&self, app: &AppId) -> Arc<AppWatch> {
        let mut apps = self.apps.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(watch) = apps.get(app).and_then(Weak::upgrade) {
            return watch;
        }
        if apps.len() >= 2 * self.live.load(Ordering::Relaxed) + 64 {
            apps.retain(|_, watch| watch.strong_count() > 0);
        }
        self.live.fetch_add(1, Ordering::Relaxed);
        let watch = Arc::new(AppWatch {
            notify: Notify::new(),
            head: tokio::sync::Mutex::new((None, None)),
            live: self.live.clone(),
        });
        apps.insert(app.clone(), Arc::downgrade(&watch));
        watch
    }

    /// `app` committed messages in this process: its waiting long-polls look again.
    pub fn notify(&self, app: &AppId) {
        if self.live.load(Ordering::Relaxed) == 0 {
            return;
        }
        let watch = self.apps.lock().unwrap_or_else(|p| p.into_inner()).get(app).and_then(Weak::upgrade);
        if let Some(watch) = watch {
            watch.notify.notify_waiters();
        }
    }
}

impl AppWatch {
    /// For a shared store: looks at `app`'s log head if nobody of this application did in
    /// the last [`RECHECK`], and wakes every waiting long-poll of it if the head moved.
    /// Returns whether this call saw it move.
    pub async fn recheck(&self, store: &dyn PollStore, app: &AppId) -> StoreResult<bool> {
        let mut seen = self.head.lock().await;
        if seen.1.is_some_and(|at| at.elapsed() < RECHECK) {
            return Ok(false);
        }
        let head = store.log_head(app).await?;
        seen.1 = Some(Instant::now());
        if head == seen.0 {
            return Ok(false);
        }
        seen.0 = head;
        self.notify.notify_waiters();
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_commit_wakes_its_own_applications_long_polls_only() {
        let wakeups = AppWakeups::default();
        let (a, b) = (AppId::generate(), AppId::generate());
        let (watch_a, watch_b) = (wakeups.watch(&a), wakeups.watch(&b));
        assert!(Arc::ptr_eq(&watch_a, &wakeups.watch(&a)), "one watch per application");
        let (woken_a, woken_b) = (watch_a.notify.notified(), watch_b.notify.notified());
        tokio::pin!(woken_a, woken_b);
        wakeups.notify(&b);
        assert!(futures_util::poll!(woken_a.as_mut()).is_pending(), "another application's commit");
        assert!(futures_util::poll!(woken_b.as_mut()).is_ready());
    }

    #[test]
    fn watches_nobody_holds_are_forgotten() {
        let wakeups = AppWakeups::default();
        for _ in 0..1000 {
            drop(wakeups.watch(&AppId::generate()));
        }
        assert_eq!(wakeups.live.load(Ordering::Relaxed), 0);
        assert!(wakeups.apps.lock().unwrap().len() <= 64, "the registry does not grow with every application");
        wakeups.notify(&AppId::generate()); // nothing to wake, nothing locked
    }
}
