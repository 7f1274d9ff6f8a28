//! `--scenario endpoint-churn`: whether endpoints a customer creates and deletes leave
//! memory behind. Through a portal token, one application's endpoints come and go: each
//! cycle creates an endpoint, sends it one message (with the admin token: portal tokens
//! cannot send), waits until the receiver has it, and deletes the endpoint. The server's
//! resident memory is read after a warm-up and again after the measured cycles.

use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use herald::signing::SigningKey;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::super::load::Ack;
use super::super::probe::ProcessSample;
use super::super::receiver::{Behaviour, Receipt, Receiver};
use super::super::run::{AppSpec, Run};
use super::super::scenario::secs;
use super::super::target::Api;

/// Cycles before the first memory reading.
pub const WARM_UP: u64 = 1_000;
/// Measured cycles unless `--messages` says otherwise.
pub const CYCLES: u64 = 10_000;
/// Cycles under way at once. Each has an endpoint of its own while it runs, so the
/// application never has more than this many (well under Herald's cap of 1,000).
pub const CONCURRENCY: usize = 16;
/// A pause before each memory reading, for the last deletions' aftermath (cancelled
/// deliveries, forgotten breakers) to finish.
const SETTLE: Duration = Duration::from_millis(500);

pub async fn endpoint_churn(run: &mut Run<'_>) -> anyhow::Result<Value> {
    let cycles = run.args.messages.unwrap_or(CYCLES);
    let app = run.setup(&[AppSpec::of(vec![])]).await?;
    let app_id = run.app_id(app).to_owned();
    let admin = run.target.api.clone();
    let access = admin.create(&format!("/api/v1/auth/app-portal-access/{app_id}"), json!({})).await?;
    let token = access["token"].as_str().context("no portal token in the answer")?.to_owned();
    let churn = Churn { portal: Api { token, ..admin.clone() }, admin, app, app_id, base: run.next_endpoint() };
    run.start_measuring(Instant::now()).await;
    churn.cycles(run, 0..WARM_UP, 0).await?;
    tokio::time::sleep(SETTLE).await;
    let warm = run.target.sample();
    let started = Instant::now();
    churn.cycles(run, WARM_UP..WARM_UP + cycles, 1).await?;
    let seconds = started.elapsed().as_secs_f64();
    tokio::time::sleep(SETTLE).await;
    let churned = run.target.sample();
    let left = churn.portal.get(&format!("/api/v1/app/{}/endpoint?limit=250", churn.app_id)).await?;
    let rss = |s: Option<ProcessSample>| s.map(|s| s.rss);
    Ok(json!({
        "warmUpCycles": WARM_UP,
        "cycles": cycles,
        "concurrency": CONCURRENCY,
        "cyclesPerSecond": cycles as f64 / seconds,
        "rssAfterWarmUpBytes": rss(warm),
        "rssAfterCyclesBytes": rss(churned),
        "rssRatio": match (warm, churned) {
            (Some(w), Some(c)) if w.rss > 0 => Some(c.rss as f64 / w.rss as f64),
            _ => None,
        },
        "endpointsLeft": left["data"].as_array().map(Vec::len),
    }))
}

/// One application's churn: its ids, the two tokens, and the receiver indexes its endpoints
/// take (`base + cycle`, so that every endpoint has a path and signing secret of its own).
struct Churn {
    admin: Api,
    portal: Api,
    app: usize,
    app_id: String,
    base: u32,
}

impl Churn {
    /// Runs the cycles numbered `range`, [`CONCURRENCY`] at a time, and accounts for their
    /// messages in the run's ledger (latency group `group`). Fails at the first cycle whose
    /// message does not arrive within `--drain-stall` seconds, or whose call fails.
    async fn cycles(&self, run: &mut Run<'_>, range: Range<u64>, group: usize) -> anyhow::Result<()> {
        let (receiver, stall) = (&run.receiver, secs(run.args.drain_stall));
        let arrivals = Arrivals::default();
        let next = AtomicU64::new(range.start);
        let done = AtomicBool::new(false);
        let worker = |lane: usize| {
            let (arrivals, next, range) = (&arrivals, &next, range.clone());
            async move {
                let mut sent = vec![];
                loop {
                    let cycle = next.fetch_add(1, Ordering::SeqCst);
                    if cycle >= range.end {
                        return anyhow::Ok(sent);
                    }
                    sent.push(self.cycle(receiver, arrivals, lane, cycle, stall).await?);
                }
            }
        };
        let work = async {
            let sent = futures_util::future::try_join_all((0..CONCURRENCY).map(worker)).await;
            done.store(true, Ordering::SeqCst);
            sent
        };
        let (sent, receipts) = tokio::join!(work, arrivals.collect(receiver, &done));
        let sent: Vec<(Ack, u32)> = sent?.into_iter().flatten().collect();
        run.account(group, &sent);
        run.ledger.record(receipts);
        Ok(())
    }

    /// One cycle. Concurrent cycles share the application, so each lane's endpoint listens
    /// on a channel of its own and its message is sent on it: a message reaches only the
    /// endpoint of its own cycle.
    async fn cycle(
        &self,
        receiver: &Receiver,
        arrivals: &Arrivals,
        lane: usize,
        cycle: u64,
        stall: Duration,
    ) -> anyhow::Result<(Ack, u32)> {
        let endpoint = self.base + cycle as u32;
        let channel = format!("lane-{lane}");
        let secret = SigningKey::generate().to_secret_string();
        receiver.set_secret(endpoint as usize, &secret);
        let url = receiver.url(Behaviour::Fast, endpoint as usize);
        let endpoints = format!("/api/v1/app/{}/endpoint", self.app_id);
        let created =
            self.portal.create(&endpoints, json!({"url": url, "secret": secret, "channels": [channel]})).await?;
        let endpoint_id = created["id"].as_str().context("the endpoint has no id")?.to_owned();
        let scheduled = Instant::now();
        let message = json!({"eventType": "bench.event", "channels": [channel], "payload": {"cycle": cycle}});
        let sent = self.admin.create(&format!("/api/v1/app/{}/msg?with_content=false", self.app_id), message).await?;
        let acked = Instant::now();
        let msg_id: Box<str> = sent["id"].as_str().context("the message has no id")?.into();
        if !arrivals.wait(&msg_id, stall).await {
            bail!("cycle {cycle}: message {msg_id} did not arrive within {stall:?}");
        }
        let (status, answer) =
            self.portal.call(http::Method::DELETE, &format!("{endpoints}/{endpoint_id}"), None).await?;
        ensure!((200..300).contains(&status), "cycle {cycle}: deleting {endpoint_id} answered {status}: {answer}");
        Ok((Ack { msg_id, app: self.app, scheduled, acked }, endpoint))
    }
}

/// Hands each receipt to the cycle waiting for its message, or keeps it until that cycle
/// asks (a delivery can arrive before the cycle has read its message's id).
#[derive(Default)]
struct Arrivals(Mutex<Book>);

#[derive(Default)]
struct Book {
    waiting: HashMap<Box<str>, oneshot::Sender<()>>,
    arrived: HashSet<Box<str>>,
}

impl Book {
    /// Wakes the cycle waiting for `msg_id`, or notes it for the cycle to find.
    fn arrive(&mut self, msg_id: &str) {
        match self.waiting.remove(msg_id) {
            // A waiter that gave up is gone: its cycle has failed already.
            Some(waiter) => {
                let _ = waiter.send(());
            }
            None => {
                self.arrived.insert(msg_id.into());
            }
        }
    }
}

impl Arrivals {
    /// Takes the receiver's receipts every millisecond until `done`, waking their cycles;
    /// returns them all, for the ledger.
    async fn collect(&self, receiver: &Receiver, done: &AtomicBool) -> Vec<Receipt> {
        let mut all = vec![];
        loop {
            // Read before taking, so that receipts of the last cycles are taken too.
            let finished = done.load(Ordering::SeqCst);
            let receipts = receiver.take_receipts();
            {
                let mut book = self.0.lock().unwrap();
                for receipt in &receipts {
                    book.arrive(&receipt.msg_id);
                }
            }
            all.extend(receipts);
            if finished {
                return all;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Whether message `msg_id` arrived within `limit`.
    async fn wait(&self, msg_id: &str, limit: Duration) -> bool {
        let arrived = {
            let mut book = self.0.lock().unwrap();
            if book.arrived.remove(msg_id) {
                return true;
            }
            let (waiter, arrived) = oneshot::channel();
            book.waiting.insert(msg_id.into(), waiter);
            arrived
        };
        matches!(tokio::time::timeout(limit, arrived).await, Ok(Ok(())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_delivery_wakes_its_cycle_whether_it_comes_before_or_after_the_wait() {
        let arrivals = Arrivals::default();
        arrivals.0.lock().unwrap().arrive("msg_early");
        assert!(arrivals.wait("msg_early", Duration::ZERO).await, "noted before the cycle asked");
        let (waited, ()) = tokio::join!(arrivals.wait("msg_late", Duration::from_secs(5)), async {
            while !arrivals.0.lock().unwrap().waiting.contains_key("msg_late") {
                tokio::task::yield_now().await;
            }
            arrivals.0.lock().unwrap().arrive("msg_late");
        });
        assert!(waited, "woken when it arrives");
        assert!(!arrivals.wait("msg_never", Duration::from_millis(10)).await, "a message that never comes times out");
    }
}
