//! Accepting a message: route it to the matching endpoints, commit the message with one
//! delivery per endpoint in one (group-committed) transaction, and hand the deliveries to
//! the dispatcher straight from memory.

use std::sync::Arc;

use crate::catalog::{Catalog, Target};
use crate::clock::now_ms;
use crate::dispatch::{Dispatcher, Job};
use crate::endpoint_settings::Ordering;
use crate::history::Recorder;
use crate::ids::EndpointId;
use crate::scripts::{Sandbox, Verdict};
use crate::store::{
    IdempotencyRecord, IngestResult, Message, NewDelivery, NewMessage, Store, StoreError, StoreResult, Trigger,
    keep_trying,
};
use crate::supervisor::spawn_task;
use crate::telemetry::{Traced, Traces};

pub struct Ingestor {
    store: Arc<dyn Store>,
    catalog: Arc<Catalog>,
    dispatcher: Arc<Dispatcher>,
    /// Whether this process delivers what it accepts (false for an API-only process).
    delivers: bool,
    /// Counts what is accepted, for the charts.
    history: Arc<Recorder>,
    /// Runs endpoint filters.
    sandbox: Arc<Sandbox>,
    /// Each commit is a span of its message's trace.
    traces: Traces,
}

/// Which endpoints a message goes to.
pub enum Route<'a> {
    /// Every enabled endpoint whose filters match.
    Matching,
    /// Only this endpoint, filters aside (send-example).
    Only(&'a EndpointId),
}

impl Ingestor {
    pub fn new(
        store: Arc<dyn Store>,
        catalog: Arc<Catalog>,
        dispatcher: Arc<Dispatcher>,
        delivers: bool,
        history: Arc<Recorder>,
        sandbox: Arc<Sandbox>,
        traces: Traces,
    ) -> Self {
        Self { store, catalog, dispatcher, delivers, history, sandbox, traces }
    }

    /// Commits `message` and its deliveries; returns once the commit is durable.
    pub async fn ingest(
        &self,
        message: Message,
        route: Route<'_>,
        idempotency: Option<IdempotencyRecord>,
    ) -> StoreResult<IngestResult> {
        let targets = self.catalog.targets_of(&message.app_id).await?;
        let chosen: Vec<&Arc<Target>> = targets
            .iter()
            .filter(|t| match route {
                Route::Matching => t.accepts(&message.event_type, message.channels.as_deref()),
                Route::Only(id) => &t.endpoint.id == id && !t.endpoint.disabled,
            })
            .collect();
        let chosen: Vec<Arc<Target>> = chosen.into_iter().cloned().collect();
        // Payload filters are the routing rule's last word (send-example goes around them).
        let chosen = match route {
            Route::Matching => self.filtered(&message, chosen).await?,
            Route::Only(_) => chosen,
        };
        let deliveries: Vec<NewDelivery> = chosen
            .iter()
            .map(|t| NewDelivery { endpoint: t.endpoint.id.clone(), strict: t.settings.ordering == Ordering::Strict })
            .collect();
        // Strictly ordered deliveries wait for their turn in the store; the rest go
        // straight to the dispatcher when it has room.
        let immediate = deliveries.iter().filter(|d| !d.strict).count();
        let strict = deliveries.len() - immediate;
        let in_memory = self.delivers && immediate > 0 && self.dispatcher.try_reserve(immediate);
        let message = Arc::new(message);
        let owner = self.dispatcher.owner();
        let span = self.traces.commit(Traced { id: &message.id, trace: message.trace.as_ref() }, deliveries.len());
        let new = NewMessage {
            message: (*message).clone(),
            deliveries,
            owner: in_memory.then(|| owner.to_string()),
            idempotency,
        };
        // The commit and the hand-off run in their own task: if the caller goes away (the
        // client hung up mid-request), a committed message must still reach the dispatcher,
        // or its deliveries would stay claimed by this process with nobody working on them.
        let (store, dispatcher, history) = (self.store.clone(), self.dispatcher.clone(), self.history.clone());
        let live = self.dispatcher.liveness().clone();
        let (answer, answered) = tokio::sync::oneshot::channel();
        spawn_task(&live.clone(), "an ingest's commit", async move {
            let result = span.scope(store.ingest(new)).await;
            span.committed(result.as_ref().err().map(ToString::to_string));
            match &result {
                Ok(IngestResult::Created { deliveries }) => {
                    history.accepted(now_ms());
                    if in_memory {
                        let jobs =
                            deliveries.iter().zip(&chosen).filter(|(_, t)| t.settings.ordering != Ordering::Strict);
                        dispatcher.submit(jobs.map(|(delivery_id, target)| Job {
                            delivery_id: *delivery_id,
                            endpoint_id: target.endpoint.id.clone(),
                            message: message.clone(),
                            attempts: 0,
                            trigger: Trigger::Scheduled,
                            target: target.clone(),
                            owner: owner.clone(),
                            ready_at: now_ms(),
                        }));
                    }
                    if strict > 0 || (immediate > 0 && !in_memory) {
                        dispatcher.poke();
                    }
                }
                Ok(_) if in_memory => dispatcher.unreserve(immediate),
                Err(_) if in_memory => {
                    dispatcher.unreserve(immediate);
                    let release = release_uncertain(store, dispatcher, owner, message.id.clone());
                    spawn_task(&live, "giving back an uncertain ingest", release);
                }
                _ => {}
            }
            let _ = answer.send(result);
        });
        answered.await.map_err(|_| StoreError::Other(anyhow::anyhow!("the ingest task failed")))?
    }

    /// The targets whose filter (if any) lets `message` through, evaluated side by side.
    /// Without a sandbox to run them the message is refused (503), never routed short.
    async fn filtered(&self, message: &Message, targets: Vec<Arc<Target>>) -> StoreResult<Vec<Arc<Target>>> {
        if targets.iter().all(|t| t.endpoint.scripts.filter.is_none()) {
            return Ok(targets);
        }
        let verdicts = futures_util::future::join_all(targets.iter().map(|t| t.filter(&self.sandbox, message))).await;
        let mut kept = Vec::with_capacity(targets.len());
        for (target, verdict) in targets.into_iter().zip(verdicts) {
            match verdict {
                Verdict::Pass => kept.push(target),
                Verdict::Drop(why) => {
                    tracing::debug!(msg = %message.id, endpoint = %target.endpoint.id, why, "filtered out");
                }
                Verdict::Unavailable(e) => return Err(StoreError::Unavailable(e)),
            }
        }
        Ok(kept)
    }
}

/// An ingest failed without a clear answer (a connection lost at the commit): the message
/// may be stored with its deliveries claimed by this process, which never received them.
/// Gives them back to the queue, trying until the store answers, so that they are claimed
/// and sent like any other work instead of waiting for this process to stop.
async fn release_uncertain(
    store: Arc<dyn Store>,
    dispatcher: Arc<Dispatcher>,
    owner: Arc<str>,
    msg: crate::ids::MessageId,
) {
    let released = keep_trying("giving back an uncertain ingest's deliveries", || store.release_message(&owner, &msg));
    if let Ok(released @ 1..) = released.await {
        tracing::warn!(%msg, released, "an ingest whose answer was lost had committed; its deliveries are queued");
        dispatcher.poke();
    }
}
