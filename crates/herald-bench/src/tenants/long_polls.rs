//! `--scenario long-polls`: what idle long-polls cost everyone else. Application Y ingests
//! at `--rate` for `--duration` and drains, first alone, then while [`LONG_POLLS`] long-polls
//! wait on application X's poller (nothing is ever sent to X, so they only wait). The
//! server's CPU (and its database's) per delivered message is measured over each phase and
//! its drain; idle waiters should cost next to nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::super::probe::ProcessSample;
use super::super::run::{AppSpec, Run};
use super::super::scenario::{secs, stream};
use super::super::target::{Api, http_client};
use super::metric;

/// Long-polls waiting during the second phase. A spawned Herald gets a per-application cap
/// above it (`spawn_env`); the admin token they use has no cap of its own.
pub const LONG_POLLS: usize = 500;
/// How long each long-poll asks to wait (the most Herald allows).
const WAIT_MS: u64 = 30_000;
/// How long all of them may take to be waiting.
const SETTLE: Duration = Duration::from_secs(30);

pub async fn long_polls(run: &mut Run<'_>) -> anyhow::Result<Value> {
    let y = run.setup(&[AppSpec::fast(1)]).await?;
    let x = run.setup(&[AppSpec::of(vec![])]).await?;
    let x_id = run.app_id(x).to_owned();
    let poller = run.target.api.create(&format!("/api/v1/app/{x_id}/poller"), json!({})).await?;
    let poller_id = poller["id"].as_str().context("the poller has no id")?.to_owned();
    let without = measured(run, "without long-polls", y, 0).await;
    let polls = LongPolls::start(&run.target.api, &format!("/api/v1/app/{x_id}/poller/{poller_id}"));
    let waiting_before = polls.all_waiting(&run.target.api, &x_id).await?;
    let with = measured(run, "with long-polls", y, 1).await;
    let waiting_after = waiting(&run.target.api, &x_id).await;
    let (answered, refused) = polls.stop().await?;
    let ratio = |f: fn(&Cost) -> Option<f64>| match (f(&without), f(&with)) {
        (Some(a), Some(b)) if a > 0.0 => Some(b / a),
        _ => None,
    };
    Ok(json!({
        "longPolls": LONG_POLLS,
        "waitingAtStart": waiting_before,
        "waitingAtEnd": waiting_after,
        // Long-polls that ended (their 30 s ran out, or the server answered) and were re-issued.
        "longPollsAnswered": answered,
        "longPollsRefused": refused,
        "without": without.json(),
        "with": with.json(),
        "cpuRatio": ratio(Cost::total_us),
        "heraldCpuRatio": ratio(|c| c.herald_us),
    }))
}

/// What one phase (load and drain) cost the server, per delivered message.
struct Cost {
    delivered: u64,
    seconds: f64,
    herald_us: Option<f64>,
    database_us: Option<f64>,
}

impl Cost {
    fn total_us(&self) -> Option<f64> {
        Some(self.herald_us? + self.database_us.unwrap_or(0.0))
    }

    fn json(&self) -> Value {
        json!({"delivered": self.delivered, "seconds": self.seconds, "heraldCpuMicrosPerMessage": self.herald_us,
               "databaseCpuMicrosPerMessage": self.database_us, "cpuMicrosPerMessage": self.total_us()})
    }
}

/// Application `app` at `--rate` for `--duration`, drained; its cost sampled around both.
async fn measured(run: &mut Run<'_>, label: &str, app: usize, group: usize) -> Cost {
    let a = run.args;
    let (herald, database, delivered) = (run.target.sample(), run.target.database_sample(), run.ledger.delivered);
    let started = Instant::now();
    run.phase(label, &[(stream(app..app + 1, a.rate, a.duration), group)], &[]).await;
    run.drain(secs(a.drain_stall)).await;
    let delivered = run.ledger.delivered - delivered;
    let per_message = |before: Option<ProcessSample>, after: Option<ProcessSample>| match (before, after) {
        (Some(b), Some(a)) if delivered > 0 => Some((a.cpu_secs - b.cpu_secs) * 1e6 / delivered as f64),
        _ => None,
    };
    Cost {
        delivered,
        seconds: started.elapsed().as_secs_f64(),
        herald_us: per_message(herald, run.target.sample()),
        database_us: per_message(database, run.target.database_sample()),
    }
}

/// The long-polls: each on its own connection, re-issued as soon as it returns, until stopped.
struct LongPolls {
    tasks: JoinSet<()>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    in_flight: AtomicU64,
    answered: AtomicU64,
    refused: AtomicU64,
}

impl LongPolls {
    /// Starts them on the poller at `poller` (its API path), consumers `c0` … `c499`.
    fn start(api: &Api, poller: &str) -> Self {
        // Every waiting request holds a connection, so the pool needs room for all of them.
        let api = Api { client: http_client(LONG_POLLS + 20), ..api.clone() };
        let counts = Arc::new(Counts::default());
        let mut tasks = JoinSet::new();
        for i in 0..LONG_POLLS {
            tasks.spawn(poll(api.clone(), format!("{poller}/consumer/c{i}"), counts.clone()));
        }
        Self { tasks, counts }
    }

    /// Waits until the server counts every long-poll as waiting (Herald's `/metrics`), or,
    /// against a server without that gauge, until every request has been sent and a second
    /// has passed; returns the server's count when it has one.
    async fn all_waiting(&self, api: &Api, app_id: &str) -> anyhow::Result<Option<u64>> {
        let deadline = Instant::now() + SETTLE;
        loop {
            let sent = self.counts.in_flight.load(Ordering::SeqCst);
            match waiting(api, app_id).await {
                Some(n) if n >= LONG_POLLS as u64 => return Ok(Some(n)),
                None if sent >= LONG_POLLS as u64 => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    return Ok(None);
                }
                n if Instant::now() >= deadline => bail!(
                    "only {} of {LONG_POLLS} long-polls waiting after {SETTLE:?} ({sent} sent, {} refused)",
                    n.unwrap_or(0),
                    self.counts.refused.load(Ordering::SeqCst)
                ),
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// Hangs up every long-poll; returns how many were answered and refused. A poll task
    /// never ends by itself, so one that did panicked: that fails the scenario.
    async fn stop(mut self) -> anyhow::Result<(u64, u64)> {
        self.tasks.abort_all();
        while let Some(ended) = self.tasks.join_next().await {
            if let Err(e) = ended
                && e.is_panic()
            {
                bail!("a long-poll task panicked: {e}");
            }
        }
        Ok((self.counts.answered.load(Ordering::SeqCst), self.counts.refused.load(Ordering::SeqCst)))
    }
}

/// One consumer's long-polls, each acknowledging the (empty) page before it, as a consumer
/// does. A refusal (a cap's 429) is retried after a pause rather than in a tight loop.
async fn poll(api: Api, consumer: String, counts: Arc<Counts>) {
    let mut iterator = None::<String>;
    loop {
        let query = iterator.as_deref().map_or_else(String::new, |i| format!("&iterator={i}"));
        counts.in_flight.fetch_add(1, Ordering::SeqCst);
        let answer = api.call(http::Method::GET, &format!("{consumer}?wait_ms={WAIT_MS}{query}"), None).await;
        counts.in_flight.fetch_sub(1, Ordering::SeqCst);
        match answer {
            Ok((200, page)) => {
                counts.answered.fetch_add(1, Ordering::SeqCst);
                iterator = page["iterator"].as_str().map(str::to_owned).or(iterator);
            }
            _ => {
                counts.refused.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

/// Long-polls the server counts as waiting on `app_id` (Herald's `/metrics`; 0 when it has
/// none listed for the application), or `None` without that gauge.
async fn waiting(api: &Api, app_id: &str) -> Option<u64> {
    let text = api.text("/metrics").await.ok()?;
    if !text.contains("herald_long_polls_waiting") {
        return None;
    }
    Some(metric(&text, "herald_long_polls_waiting", app_id).unwrap_or(0.0) as u64)
}
