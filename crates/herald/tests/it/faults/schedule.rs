//! The seeded fault schedule: which faults, in which order, for how long. The same seed
//! gives the same schedule, so a failing run can be replayed.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::proxy::Mode;
use crate::support::server::Backend;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL a Herald process mid-delivery, restart it after the pause.
    Kill,
    /// SIGTERM under load: it must exit 0 within the grace period; restarted after.
    Term,
    /// SIGSTOP for twice the lease, then SIGCONT.
    Stop,
    /// PostgreSQL stopped (`-m fast` or `-m immediate`) and started again.
    PgRestart { immediate: bool },
    /// Every other connection to the database killed (`pg_terminate_backend`).
    PgTerminate,
    /// An exclusive lock on the delivery table (PostgreSQL) or an exclusive transaction
    /// (SQLite), held for the fault's duration.
    ExclusiveLock,
    /// Receivers flap between 500s and answers slower than the attempt timeout.
    Flap,
    /// 50 concurrent creations with one idempotency key, then one with another body (which
    /// gets the first answer).
    IdempotencyStorm,
    /// The proxy between Herald and the receivers adds latency, resets, or swallows.
    Proxy(Mode),
    /// The SQLite data directory (a small tmpfs) is filled up, then freed.
    DiskFull,
}

#[derive(Debug, Clone, Copy)]
pub struct Step {
    pub fault: Fault,
    /// How long the fault lasts before it is healed.
    pub hold: Duration,
    /// Quiet time after healing, before the next fault.
    pub gap: Duration,
}

/// Faults that apply to a backend (`disk`: whether the data directory is a tmpfs that can
/// be filled).
fn menu(backend: Backend, disk: bool) -> Vec<Fault> {
    let mut faults =
        vec![Fault::Kill, Fault::Term, Fault::Stop, Fault::ExclusiveLock, Fault::Flap, Fault::IdempotencyStorm];
    faults.extend([Fault::Proxy(Mode::Latency), Fault::Proxy(Mode::Reset), Fault::Proxy(Mode::Blackhole)]);
    if backend == Backend::Postgres {
        faults.extend([
            Fault::PgRestart { immediate: false },
            Fault::PgRestart { immediate: true },
            Fault::PgTerminate,
        ]);
    }
    if backend == Backend::Sqlite && disk {
        faults.push(Fault::DiskFull);
    }
    faults
}

/// Steps filling `total`: every fault of the menu once (in a seeded order), then seeded
/// picks until the time is used.
pub fn schedule(backend: Backend, disk: bool, seed: u64, total: Duration, lease: Duration) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut faults = menu(backend, disk);
    for i in (1..faults.len()).rev() {
        faults.swap(i, rng.random_range(0..=i));
    }
    let mut steps = Vec::new();
    let mut used = Duration::ZERO;
    let mut i = 0;
    while used < total {
        let fault = if i < faults.len() { faults[i] } else { faults[rng.random_range(0..faults.len())] };
        i += 1;
        let hold = match fault {
            Fault::Stop => 2 * lease,
            Fault::ExclusiveLock => Duration::from_secs(10),
            _ => Duration::from_millis(rng.random_range(1000..4000)),
        };
        let gap = Duration::from_millis(rng.random_range(500..2000));
        used += hold + gap;
        steps.push(Step { fault, hold, gap });
    }
    steps
}

#[test]
fn a_seed_gives_the_same_schedule_and_covers_every_fault() {
    let lease = Duration::from_secs(2);
    let a = schedule(Backend::Postgres, false, 7, Duration::from_secs(60), lease);
    let b = schedule(Backend::Postgres, false, 7, Duration::from_secs(60), lease);
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    for fault in menu(Backend::Postgres, false) {
        assert!(a.iter().any(|s| s.fault == fault), "{fault:?} is scheduled");
    }
    let sqlite = schedule(Backend::Sqlite, true, 7, Duration::from_secs(60), lease);
    assert!(sqlite.iter().all(|s| !matches!(s.fault, Fault::PgTerminate)));
    assert!(sqlite.iter().any(|s| s.fault == Fault::DiskFull));
}
