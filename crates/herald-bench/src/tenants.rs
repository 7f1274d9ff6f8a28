//! What one tenant can do to another: scenarios in which one application (or one endpoint)
//! misbehaves within its rights — runaway jq, hundreds of idle long-polls, endless endpoint
//! churn through a portal token, an endpoint that never answers beside a healthy one — and
//! the figure that says whether its neighbours noticed. Each compares a measure with and
//! without the misbehaviour in one run, so only the ratio matters, not the machine's phase.

mod churn;
mod long_polls;

use serde_json::{Value, json};

use super::receiver::Behaviour;
use super::report::Percentiles;
use super::run::{AppSpec, Run};
use super::scenario::{secs, stream};

pub use churn::endpoint_churn;
pub use long_polls::{LONG_POLLS, long_polls};

/// A filter as users write them, true for every bench message (the event type and a
/// threshold, like `scripts::FILTER` but on the bench's payload, `{"seq":N,"pad":"…"}`).
pub const QUIET_FILTER: &str = r#".eventType == "bench.event" and .payload.seq >= 0"#;
/// A transform as users write them (like `scripts::TRANSFORM`): reshape the body, keeping
/// its size so that the delivery costs what the others do, and add a header.
pub const QUIET_TRANSFORM: &str = r#"{payload: {seq: .payload.seq, size: (.payload.pad | length), pad: .payload.pad},
  headers: ((.headers // {}) + {"x-event": .eventType})}"#;
/// A transform that runs until the sandbox's deadline kills its worker: every attempt holds
/// a worker for the whole deadline and then fails (`transform_error`).
pub const RUNAWAY_TRANSFORM: &str = "until(false; .)";

/// The quiet application's p50/p99 alone and beside a noisy one: both at `--rate`, each with
/// one fast endpoint; the quiet one's has a typical filter and transform, the noisy one's a
/// transform that never ends. The sandbox gives one application at most half its workers,
/// so the quiet one should keep the other half.
pub async fn scripts_noisy(run: &mut Run<'_>) -> anyhow::Result<Value> {
    let a = run.args;
    let quiet_spec = AppSpec::fast(1).with(json!({"filter": QUIET_FILTER, "transform": QUIET_TRANSFORM}));
    let quiet = run.setup(&[quiet_spec]).await?;
    let noisy = run.setup(&[AppSpec::fast(1).with(json!({"transform": RUNAWAY_TRANSFORM}))]).await?;
    // Its deliveries never arrive (each transform fails): not owed, like a silent endpoint's.
    let runaway = run.endpoints_of(noisy)[0];
    run.phase("quiet alone", &[(stream(quiet..quiet + 1, a.rate, a.duration), 0)], &[]).await;
    run.drain(secs(a.drain_stall)).await;
    run.phase(
        "quiet with noisy",
        &[(stream(quiet..quiet + 1, a.rate, a.duration), 1), (stream(noisy..noisy + 1, a.rate, a.duration), 2)],
        &[runaway],
    )
    .await;
    run.drain(secs(a.drain_stall)).await;
    let metrics = run.target.api.text("/metrics").await.ok();
    let sandbox_seconds =
        |app: usize| metrics.as_deref().and_then(|m| metric(m, "herald_sandbox_seconds_total", run.app_id(app)));
    Ok(json!({
        "quiet": compare(run, "withNoisy"),
        "noisyOffered": (a.rate * a.duration).round(),
        // How much worker time each application had: the noisy one's is bounded by its share.
        "quietSandboxSeconds": sandbox_seconds(quiet),
        "noisySandboxSeconds": sandbox_seconds(noisy),
        "noisyEndpointStats": endpoint_stats(run, noisy).await,
    }))
}

/// One application's fast endpoint alone, then another application's fast endpoint beside a
/// silent one (each attempt there holds one of the application's slots until the timeout),
/// each at `--rate`/2. The application's cap is shared between its endpoints, so the silent
/// one must not take all of it.
pub async fn endpoint_neighbour(run: &mut Run<'_>) -> anyhow::Result<Value> {
    let a = run.args;
    let alone = run.setup(&[AppSpec::fast(1)]).await?;
    let shared = run.setup(&[AppSpec::of(vec![Behaviour::Fast, Behaviour::Silent])]).await?;
    let silent = run.endpoints_of(shared)[1];
    let half = a.rate / 2.0;
    run.phase("fast alone", &[(stream(alone..alone + 1, half, a.duration), 0)], &[]).await;
    run.drain(secs(a.drain_stall)).await;
    run.phase("fast beside silent", &[(stream(shared..shared + 1, half, a.duration), 1)], &[silent]).await;
    run.drain(secs(a.drain_stall)).await;
    let (silent_requests, silent_most_in_flight) = run.receiver.silent_counts();
    Ok(json!({
        "fast": compare(run, "withSlowNeighbour"),
        // The silent endpoint's side: attempts it held, and most at once (its share of the cap).
        "silentAttempts": silent_requests,
        "silentMostInFlight": silent_most_in_flight,
        "silentEndpointStats": endpoint_stats(run, shared).await,
    }))
}

/// Latency groups 0 (alone) and 1 (with the neighbour) side by side, and their p99 ratio.
fn compare(run: &Run<'_>, with: &str) -> Value {
    let alone = Percentiles::of(&run.ledger.latency[0]);
    let together = Percentiles::of(&run.ledger.latency[1]);
    json!({
        "aloneP50Ms": alone.p50,
        "aloneP99Ms": alone.p99,
        format!("{with}P50Ms"): together.p50,
        format!("{with}P99Ms"): together.p99,
        "p99Ratio": if alone.p99 > 0.0 { together.p99 / alone.p99 } else { 0.0 },
    })
}

/// The delivery counts (`success`, `pending`, `sending`, `fail`) of the last endpoint of
/// application `app`; `null` when the server does not answer them.
async fn endpoint_stats(run: &Run<'_>, app: usize) -> Value {
    let api = &run.target.api;
    let app_id = run.app_id(app);
    let position = run.endpoints_of(app).len().saturating_sub(1);
    let Ok(list) = api.get(&format!("/api/v1/app/{app_id}/endpoint?limit=250&order=ascending")).await else {
        return Value::Null;
    };
    let Some(id) = list["data"][position]["id"].as_str() else { return Value::Null };
    api.get(&format!("/api/v1/app/{app_id}/endpoint/{id}/stats")).await.unwrap_or(Value::Null)
}

/// The value of `name{app="…"}` in a Prometheus text exposition.
fn metric(text: &str, name: &str, app: &str) -> Option<f64> {
    let series = format!("{name}{{app=\"{app}\"}} ");
    text.lines().find_map(|line| line.strip_prefix(series.as_str())?.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_series_is_read_by_name_and_application() {
        let text =
            "# HELP x\nherald_long_polls_waiting{app=\"app_1\"} 3\nherald_long_polls_waiting{app=\"app_2\"} 500\n";
        assert_eq!(metric(text, "herald_long_polls_waiting", "app_2"), Some(500.0));
        assert_eq!(metric(text, "herald_long_polls_waiting", "app_3"), None);
        assert_eq!(metric(text, "herald_long_polls", "app_1"), None, "a name is matched whole");
    }
}
