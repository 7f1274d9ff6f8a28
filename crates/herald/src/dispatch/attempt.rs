//! One attempt of one delivery: find the endpoint, send, decide what the result means, and
//! hand the outcome to the batch writer (`outcomes`).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::OwnedSemaphorePermit;

use super::outcomes::Pending;
use super::{Dispatcher, Job};
use crate::breaker::{Breaker, BreakerState, Transition};
use crate::catalog::Target;
use crate::clock::now_ms;
use crate::deliver::{Outgoing, Sent};
use crate::ids::{AttemptId, EndpointId};
use crate::outcome::{AttemptResult, Decision, Failure, OutcomeClass, classify, decide, error_class};
use crate::store::{Attempt, BreakerEvent, BreakerEventKind, NextState, OutcomeRecord};
use crate::telemetry::{AttemptEnd, AttemptFacts, Traced};
use crate::traceparent::format_traceparent;

/// The record of this job's next attempt to `url`, answerless until filled in.
fn attempt_of(job: &Job, url: String) -> Attempt {
    Attempt {
        id: AttemptId::generate(),
        msg_id: job.message.id.clone(),
        endpoint_id: job.endpoint_id.clone(),
        app_id: job.message.app_id.clone(),
        created_at: now_ms(),
        url,
        status_code: 0,
        duration_ms: 0,
        delivered: false,
        error_class: None,
        error: None,
        response: String::new(),
        trigger: job.trigger,
        attempt_no: job.attempts + 1,
        delivery_id: job.delivery_id,
    }
}

/// A delivery its endpoint's transform dropped, and why.
struct Skipped(String);

/// What an attempt says of its endpoint, for the circuit breaker.
enum Verdict {
    /// The endpoint answered (or failed to): `delivered` or not, `slow` or not.
    Attempted { delivered: bool, slow: bool, now: crate::clock::Millis },
    /// Nothing: no attempt was made, or it failed on Herald's side (a half-open probe may
    /// go again).
    NotAboutEndpoint,
}

/// Saves of one breaker transition at most (each later one only if the state moved again).
const BREAKER_SAVE_TRIES: usize = 3;

impl Dispatcher {
    pub(super) async fn process(self: Arc<Self>, job: Job, permit: OwnedSemaphorePermit) {
        let target = self.catalog.target(&job.endpoint_id).await;
        // Paused (or cut off from the store) since the pump checked, the claim may be
        // another process's by now: send nothing.
        let lease_held = self.lease.may_start();
        let sent = match &target {
            Ok(Some(target)) if lease_held && !target.endpoint.disabled => match self.send(target, &job).await {
                Ok(sent) => Some(sent),
                Err(Skipped(why)) => {
                    drop(permit);
                    self.settle(&job, Verdict::NotAboutEndpoint).await;
                    let attempt = self.skipped(target, &job, why);
                    self.conclude(job, NextState::Canceled, Some(attempt));
                    return;
                }
            },
            _ => None,
        };
        drop(permit);
        let verdict = sent.as_ref().map_or(Verdict::NotAboutEndpoint, |sent| self.observe(&job, sent));
        if let Some(transition) = self.settle(&job, verdict).await {
            // Saved before the attempt task ends, so a graceful stop never loses it.
            self.breaker_changed(&job.endpoint_id, transition, false).await;
        }

        let (next, attempt) = match (target, sent) {
            // The job waits for a renewed lease, or is dropped if the lease was lost.
            _ if !lease_held => {
                self.retry_later(job, Duration::ZERO);
                return;
            }
            (Ok(Some(target)), Some(sent)) => self.judge(&target, &job, sent),
            // Disabled after the message was accepted: a dead letter, recoverable later.
            (Ok(Some(_)), None) => (NextState::Dead, None),
            (Ok(None), _) => (NextState::Canceled, None),
            (Err(e), _) => {
                tracing::warn!(error = %e, "loading the endpoint failed; trying the delivery again shortly");
                self.retry_later(job, Duration::from_secs(1));
                return;
            }
        };
        self.conclude(job, next, attempt);
    }

    /// Sends one attempt, after the endpoint's transform (if any), as a span of the
    /// message's trace; `Err` when the transform dropped the delivery.
    async fn send(&self, target: &Target, job: &Job) -> Result<Sent, Skipped> {
        let method = job.target.method();
        let span = self.config.traces.attempt(&AttemptFacts {
            message: Traced { id: &job.message.id, trace: job.message.trace.as_ref() },
            app_id: job.message.app_id.as_str(),
            endpoint_id: job.endpoint_id.as_str(),
            number: job.attempts + 1,
            due: job.ready_at,
            method: &method,
            url: job.target.url.as_ref(),
        });
        // A trace id tells the receiver something about the sender: sent only on request.
        let traceparent =
            span.context().filter(|_| target.settings.propagate_trace_context).map(|c| format_traceparent(&c));
        let sent = span.scope(self.transform_and_send(target, job, traceparent.as_deref())).await;
        match &sent {
            Ok(sent) => span.attempted(&ended(sent)),
            Err(_) => span.skipped(),
        }
        sent
    }

    async fn transform_and_send(&self, target: &Target, job: &Job, traceparent: Option<&str>) -> Result<Sent, Skipped> {
        let Some(payload) = job.message.payload.clone() else {
            return Ok(Sent::failed(Failure::Internal, "the message payload was expunged", Duration::ZERO));
        };
        let started = std::time::Instant::now();
        let rewrite = match target.transform(&self.sandbox, &job.message).await {
            None => None,
            Some(Ok(Some(rewrite))) => Some(rewrite),
            Some(Ok(None)) => return Err(Skipped("the transform returned null".into())),
            Some(Err((failure, why))) => return Ok(Sent::failed(failure, why, started.elapsed())),
        };
        let out = Outgoing {
            target,
            message: &job.message,
            payload: &payload,
            rewrite: rewrite.as_ref(),
            attempt_no: job.attempts + 1,
            sequence: job.delivery_id,
            now: now_ms(),
            traceparent,
        };
        #[cfg(feature = "fault-injection")]
        let poisoned = self.config.faults.panic_on_event_type.as_deref() == Some(job.message.event_type.as_str());
        let attempt = async move {
            #[cfg(feature = "fault-injection")]
            if poisoned {
                panic!("injected fault: faults.panic_on_event_type");
            }
            self.deliverer.send(out).await
        };
        // A panic inside one attempt is our own failure for that delivery, nothing more.
        Ok(AssertUnwindSafe(attempt)
            .catch_unwind()
            .await
            .unwrap_or_else(|_| Sent::failed(Failure::Internal, "the attempt panicked", Duration::ZERO)))
    }

    /// The record of a delivery its transform dropped: no request was sent.
    fn skipped(&self, target: &Target, job: &Job, why: String) -> Attempt {
        Attempt {
            error_class: Some("skipped".into()),
            error: Some(why),
            ..attempt_of(job, target.endpoint.url.clone())
        }
    }

    /// Feeds an attempt into the endpoint's latency window and the metrics; returns what
    /// it says of the endpoint, for its circuit breaker.
    fn observe(&self, job: &Job, sent: &Sent) -> Verdict {
        let now = now_ms();
        let class = classify(&sent.result);
        self.metrics.attempt(job.app(), &job.endpoint_id, class, sent.duration.as_secs_f64());
        // Herald's own failures and refused destinations say nothing about the endpoint.
        let about_endpoint = !matches!(
            sent.result,
            AttemptResult::Failed(Failure::Internal | Failure::BlockedDestination | Failure::Transform)
        );
        if !about_endpoint {
            return Verdict::NotAboutEndpoint;
        }
        let slow = self.latency.record(&job.endpoint_id, now, sent.duration.as_secs_f64() * 1000.0);
        Verdict::Attempted { delivered: class == OutcomeClass::Delivered, slow, now }
    }

    /// Tells the lanes' owner the attempt's slot is free and what the attempt said of its
    /// endpoint (one message per attempt); returns the breaker's transition, if any.
    async fn settle(&self, job: &Job, verdict: Verdict) -> Option<Transition> {
        let (app, endpoint) = (job.app().clone(), job.endpoint_id.clone());
        let settle = move |lanes: &mut super::lanes::Lanes, _: &Dispatcher| {
            lanes.finished(&app, &endpoint);
            match verdict {
                Verdict::Attempted { delivered, slow, now } => lanes.record(&app, &endpoint, delivered, slow, now),
                Verdict::NotAboutEndpoint => {
                    lanes.release_probe(&app, &endpoint);
                    None
                }
            }
        };
        self.ask(settle).await.flatten()
    }

    /// Reports a breaker transition, logs it and saves the breaker's state. Saves of one
    /// endpoint may race (two attempts finishing together); each save re-checks afterwards
    /// and saves again if the state moved meanwhile, so the last state is the one stored.
    /// `reset` when the transition is a close because the endpoint changed.
    pub(super) async fn breaker_changed(&self, endpoint: &EndpointId, transition: Transition, reset: bool) {
        let (metric, kind) = match transition {
            Transition::Opened => ("open", BreakerEventKind::Opened),
            Transition::Reopened => ("reopen", BreakerEventKind::Reopened),
            Transition::Closed if reset => ("closed", BreakerEventKind::Reset),
            Transition::Closed => ("closed", BreakerEventKind::Closed),
        };
        self.metrics.circuit_transition(metric);
        let persisted = |b: Option<Breaker>| b.filter(|b| b.state != BreakerState::Closed);
        let key = |b: &Option<Breaker>| b.as_ref().map(|b| (b.state, b.opened_at, b.cooldown_ms));
        let current = self.breaker(endpoint).await;
        self.log_breaker(endpoint, kind, current.as_ref()).await;
        let mut saved = persisted(current);
        tracing::warn!(%endpoint, transition = metric, cooldown_ms = saved.as_ref().map(|b| b.cooldown_ms), "circuit breaker");
        for _ in 0..BREAKER_SAVE_TRIES {
            if let Err(e) = self.store.save_breaker(endpoint, saved.as_ref()).await {
                tracing::warn!(error = %e, "saving a circuit breaker failed");
                return;
            }
            let now = persisted(self.breaker(endpoint).await);
            if key(&now) == key(&saved) {
                return;
            }
            saved = now;
        }
    }

    /// Appends a transition to the endpoint's breaker log (its history page); a failure to
    /// log is only a warning.
    pub(super) async fn log_breaker(&self, endpoint: &EndpointId, kind: BreakerEventKind, breaker: Option<&Breaker>) {
        let event = BreakerEvent {
            at: now_ms(),
            kind,
            failures: breaker.map_or(0, |b| b.consecutive_failures),
            cooldown_ms: breaker.map_or(0, |b| b.cooldown_ms),
        };
        if let Err(e) = self.store.log_breaker(endpoint, &event).await {
            tracing::warn!(error = %e, "logging a circuit breaker transition failed");
        }
    }

    /// Turns an attempt's result into the delivery's next state and the attempt record.
    fn judge(&self, target: &Target, job: &Job, sent: Sent) -> (NextState, Option<Attempt>) {
        let attempts = job.attempts + 1;
        let decision = decide(&target.settings.retry_rules(), attempts, &sent.result, &mut rand::rng());
        let now = now_ms();
        let next = match decision {
            Decision::Delivered => NextState::Delivered,
            Decision::Dead(_) => NextState::Dead,
            Decision::Retry { after } => {
                NextState::Retry { at: now + after.as_millis() as i64, keep: after <= self.config.queue.retry_horizon }
            }
        };
        let status_code = match sent.result {
            AttemptResult::Response { status, .. } => status,
            AttemptResult::Failed(_) => 0,
        };
        let attempt = Attempt {
            created_at: now,
            status_code,
            duration_ms: sent.duration.as_millis() as u64,
            delivered: decision == Decision::Delivered,
            error_class: error_class(&sent.result).map(str::to_owned),
            error: sent.error,
            response: sent.body,
            ..attempt_of(job, sent.url.unwrap_or_else(|| target.endpoint.url.clone()))
        };
        (next, Some(attempt))
    }

    /// Hands the outcome to the batch writer (`outcomes`), which records it and then
    /// keeps or lets go of the job.
    pub(super) fn conclude(&self, job: Job, next: NextState, attempt: Option<Attempt>) {
        let attempts = if attempt.is_some() { job.attempts + 1 } else { job.attempts };
        let record = OutcomeRecord {
            delivery_id: job.delivery_id,
            message_created_at: job.message.created_at,
            attempt,
            attempts,
            next,
        };
        if let Err(unsent) = self.outcomes.send(Pending { job, record }) {
            // Only after shutdown: the claim is dropped at the next start.
            tracing::error!(delivery = unsent.0.record.delivery_id, "outcome writer gone; outcome not recorded");
        }
    }

    /// Puts a job back without consuming an attempt.
    fn retry_later(&self, job: Job, after: Duration) {
        self.hold([(job, now_ms() + after.as_millis() as i64)]);
    }
}

/// How an attempt ended, as its span records it.
fn ended(sent: &Sent) -> AttemptEnd {
    let status = match sent.result {
        AttemptResult::Response { status, .. } => Some(status),
        AttemptResult::Failed(_) => None,
    };
    AttemptEnd { duration: sent.duration, status, error_class: error_class(&sent.result) }
}
