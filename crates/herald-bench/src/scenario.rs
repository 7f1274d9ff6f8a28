//! The scenarios, each a short script over [`Run`]: what to create, which load to offer,
//! what to wait for and which figures to add to the report.

use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use anyhow::Context;

use super::load::{Producer, Stream};
use super::receiver::Behaviour;
use super::report::Percentiles;
use super::run::{AppSpec, Run};

/// `s` seconds, at least a millisecond.
pub fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.001))
}

/// A constant-rate stream to the applications `apps`, from the start of its phase.
pub fn stream(apps: std::ops::Range<usize>, rate: f64, duration: f64) -> Stream {
    Stream { apps: apps.collect(), rate, duration: secs(duration), offset: Duration::ZERO }
}

/// Constant rate to `--apps` applications with one endpoint each.
pub async fn steady(run: &mut Run<'_>) -> anyhow::Result<Value> {
    let a = run.args;
    let first = run.setup(&vec![AppSpec::fast(1); a.apps]).await?;
    run.phase("steady", &[(stream(first..first + a.apps, a.rate, a.duration), 0)], &[]).await;
    run.drain(secs(a.drain_stall)).await;
    Ok(Value::Null)
}

/// One message to ten endpoints.
pub async fn fanout(run: &mut Run<'_>) -> anyhow::Result<Value> {
    let a = run.args;
    let first = run.setup(&[AppSpec::fast(10)]).await?;
    run.phase("fanout", &[(stream(first..first + 1, a.rate, a.duration), 0)], &[]).await;
    run.drain(secs(a.drain_stall)).await;
    Ok(json!({"endpointsPerMessage": 10}))
}

/// The base rate, then ten times that for `--burst-seconds`, then the base rate again.
pub async fn burst(run: &mut Run<'_>) -> anyhow::Result<Value> {
    let a = run.args;
    let first = run.setup(&vec![AppSpec::fast(1); a.apps]).await?;
    let apps = first..first + a.apps;
    let before = stream(apps.clone(), a.rate, a.duration);
    let mut peak = stream(apps.clone(), a.rate * 10.0, a.burst_seconds);
    peak.offset = secs(a.duration);
    let mut after = stream(apps, a.rate, a.duration);
    after.offset = secs(a.duration + a.burst_seconds);
    let phase = run.phase("burst", &[(before, 0), (peak, 1), (after, 2)], &[]).await;
    let closed = run.drain(secs(a.drain_stall)).await;
    let drained_after = run.ledger.last_delivery.map(|t| (t - phase.last_scheduled).as_secs_f64());
    Ok(json!({"burstRate": a.rate * 10.0, "ingestFailures": phase.failures, "closed": closed,
              "lastDeliveryAfterLastSendSeconds": drained_after}))
}

/// The global pool of attempts in flight a spawned Herald gets in the noisy-neighbour
/// scenario: small enough that the noisy application's cap (16) is what keeps the healthy one
/// served. (Against a server started elsewhere, its own settings apply.)
pub const NOISY_GLOBAL_CAP: usize = 32;

/// A healthy application alone, then next to one whose endpoint never answers, every
/// attempt holding one of the bounded pool's slots until it times out.
pub async fn noisy_neighbour(run: &mut Run<'_>) -> anyhow::Result<Value> {
    let a = run.args;
    let healthy = run.setup(&[AppSpec::fast(1)]).await?;
    let noisy = run.setup(&[AppSpec::of(vec![Behaviour::Silent])]).await?;
    let silent_endpoint = run.endpoints_of(noisy)[0];
    let half = a.rate / 2.0;
    run.phase("healthy alone", &[(stream(healthy..healthy + 1, half, a.duration), 0)], &[]).await;
    run.drain(secs(a.drain_stall)).await;
    run.phase(
        "with noisy neighbour",
        &[(stream(healthy..healthy + 1, half, a.duration), 1), (stream(noisy..noisy + 1, half, a.duration), 2)],
        &[silent_endpoint],
    )
    .await;
    run.drain(secs(a.drain_stall)).await;
    let alone = Percentiles::of(&run.ledger.latency[0]);
    let together = Percentiles::of(&run.ledger.latency[1]);
    let (noisy_requests, noisy_most_in_flight) = run.receiver.silent_counts();
    Ok(json!({
        "healthyAloneP50Ms": alone.p50,
        "healthyAloneP99Ms": alone.p99,
        "healthyWithNoisyP50Ms": together.p50,
        "healthyWithNoisyP99Ms": together.p99,
        "p99Ratio": if alone.p99 > 0.0 { together.p99 / alone.p99 } else { 0.0 },
        // The noisy application's side: every attempt hangs until the sender's timeout.
        "noisyAttempts": noisy_requests,
        "noisyMostInFlight": noisy_most_in_flight,
        // Counted from the receipts, like every other delivery (its endpoint never answers).
        "noisyDelivered": run.ledger.optional_delivered,
        "globalInFlightCap": NOISY_GLOBAL_CAP,
    }))
}

/// Twenty applications with one endpoint each; two of the endpoints (10 %) answer after
/// 500 ms. The slow ones are offered what their application's in-flight cap can carry.
pub async fn slow_endpoints(run: &mut Run<'_>) -> anyhow::Result<Value> {
    let a = run.args;
    let fast = run.setup(&vec![AppSpec::fast(1); 18]).await?;
    let slow = run.setup(&vec![AppSpec::of(vec![Behaviour::Slow]); 2]).await?;
    let slow_rate = (a.rate / 10.0).min(40.0);
    run.phase(
        "slow endpoints",
        &[
            (stream(fast..fast + 18, a.rate - slow_rate, a.duration), 0),
            (stream(slow..slow + 2, slow_rate, a.duration), 1),
        ],
        &[],
    )
    .await;
    run.drain(secs(a.drain_stall)).await;
    Ok(json!({"slowEndpoints": 2, "fastEndpoints": 18, "slowRate": slow_rate}))
}

/// Messages the backlog scenario queues unless `--messages` says otherwise.
pub const BACKLOG_MESSAGES: u64 = 1_000_000;

/// `--messages` deliveries queued while the receiver holds every request, then drained.
pub async fn backlog(run: &mut Run<'_>) -> anyhow::Result<Value> {
    let a = run.args;
    // Long attempt timeouts (a Herald extension; other servers ignore it) so held requests
    // do not turn into retries while the backlog builds.
    let spec = AppSpec::fast(1).with(json!({"delivery": {"timeoutMs": 300_000}}));
    let first = run.setup(&vec![spec; a.apps]).await?;
    run.receiver.pause();
    let duration = a.messages.unwrap_or(BACKLOG_MESSAGES) as f64 / a.rate;
    run.phase("backlog", &[(stream(first..first + a.apps, a.rate, duration), 0)], &[]).await;
    let with_backlog = run.target.sample();
    let summary_ms = summary_cost(&run.target.api).await;
    let resumed = Instant::now();
    run.receiver.resume();
    let closed = run.drain(secs(a.drain_stall)).await;
    let drain_secs = run.ledger.last_delivery.map(|t| (t - resumed).as_secs_f64());
    Ok(json!({
        "backlogMessages": run.messages,
        "rssWithBacklogBytes": with_backlog.map(|s| s.rss),
        "peakRssDuringBacklogBytes": with_backlog.map(|s| s.peak_rss),
        "summaryCallMsWithBacklog": summary_ms,
        "drainSeconds": drain_secs,
        "drainRate": drain_secs.map(|s| run.messages as f64 / s),
        "closed": closed,
    }))
}

/// The slowest of five `GET /api/v1/stats/summary` calls, in ms (a Herald extension: `None`
/// when the server does not have it).
async fn summary_cost(api: &super::target::Api) -> Option<f64> {
    let mut slowest: f64 = 0.0;
    for _ in 0..5 {
        let started = Instant::now();
        api.get("/api/v1/stats/summary").await.ok()?;
        slowest = slowest.max(started.elapsed().as_secs_f64() * 1000.0);
    }
    Some(slowest)
}

/// Steps of +15 % while every step's deliveries arrive within a second (or a fifth of the
/// step) of its last send and nothing is refused; reports the highest such rate.
pub async fn ramp(run: &mut Run<'_>) -> anyhow::Result<Value> {
    let a = run.args;
    let first = run.setup(&vec![AppSpec::fast(1); a.apps]).await?;
    let mut rate = a.rate;
    let mut steps = vec![];
    let mut sustained = 0.0;
    for step in 0..40 {
        let label = format!("ramp step {step} ({rate:.0}/s)");
        let delivered_before = run.ledger.delivered;
        let phase = run.phase(&label, &[(stream(first..first + a.apps, rate, a.duration), 0)], &[]).await;
        let grace = secs((a.duration * 0.2).max(1.0));
        let deadline = phase.last_scheduled + grace;
        // The phase returns once every message was answered, which under overload is
        // already past the deadline: check at least once.
        let kept_up = loop {
            run.ledger.record(run.receiver.take_receipts());
            if run.ledger.outstanding() == 0 {
                // Everything arrived; in time only if the last of it came before the deadline.
                break run.ledger.last_delivery.is_some_and(|t| t <= deadline);
            }
            if Instant::now() >= deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let delivered = run.ledger.delivered - delivered_before;
        let elapsed = (Instant::now() - phase.start).as_secs_f64();
        let passed = kept_up && phase.failures == 0;
        steps.push(json!({"offered": rate, "delivered": delivered, "deliveredPerSecond": delivered as f64 / elapsed,
                          "failures": phase.failures, "passed": passed}));
        eprintln!("{label}: {}", if passed { "kept up" } else { "fell behind" });
        if !passed {
            break;
        }
        sustained = rate;
        rate *= 1.15;
    }
    run.drain(secs(a.drain_stall)).await;
    Ok(json!({"maxSustainedRate": sustained, "steps": steps}))
}

/// Producers enqueue with `herald.send_message(…)` in their own transactions (the
/// transactional outbox) at a constant rate, instead of calling the API.
pub async fn outbox(run: &mut Run<'_>) -> anyhow::Result<Value> {
    let a = run.args;
    let url = run
        .target
        .database
        .as_ref()
        .map(|d| d.url.clone())
        .context("the outbox scenario needs PostgreSQL: --spawn --postgres, or --spawn --database-url URL")?;
    let config: tokio_postgres::Config = url.parse()?;
    let manager = deadpool_postgres::Manager::new(config, tokio_postgres::NoTls);
    let pool = deadpool_postgres::Pool::builder(manager).max_size(a.concurrency).build()?;
    run.producer = Producer::Outbox(pool);
    let first = run.setup(&vec![AppSpec::fast(1); a.apps]).await?;
    run.phase("outbox", &[(stream(first..first + a.apps, a.rate, a.duration), 0)], &[]).await;
    run.drain(secs(a.drain_stall)).await;
    Ok(json!({"producer": "herald.send_message"}))
}
