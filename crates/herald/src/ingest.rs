//! Accepting a message: route it to the matching endpoints, commit the message with one
//! delivery per endpoint in one (group-committed) transaction, and hand the deliveries to
//! the dispatcher straight from memory.

use std::sync::Arc;

use crate::catalog::Catalog;
use crate::dispatch::{Dispatcher, Job};
use crate::ids::EndpointId;
use crate::store::{IdempotencyRecord, IngestResult, Message, NewMessage, Store, StoreResult, Trigger};

pub struct Ingestor {
    store: Arc<dyn Store>,
    catalog: Arc<Catalog>,
    dispatcher: Arc<Dispatcher>,
    /// Whether this process delivers what it accepts (false for an API-only process).
    delivers: bool,
}

/// Which endpoints a message goes to.
pub enum Route<'a> {
    /// Every enabled endpoint whose filters match.
    Matching,
    /// Only this endpoint, filters aside (send-example).
    Only(&'a EndpointId),
}

impl Ingestor {
    pub fn new(store: Arc<dyn Store>, catalog: Arc<Catalog>, dispatcher: Arc<Dispatcher>, delivers: bool) -> Self {
        Self { store, catalog, dispatcher, delivers }
    }

    /// Commits `message` and its deliveries; returns once the commit is durable.
    pub async fn ingest(
        &self,
        message: Message,
        route: Route<'_>,
        idempotency: Option<IdempotencyRecord>,
    ) -> StoreResult<IngestResult> {
        let targets = self.catalog.targets_of(&message.app_id).await?;
        let endpoints: Vec<EndpointId> = targets
            .iter()
            .filter(|t| match route {
                Route::Matching => t.accepts(&message.event_type, message.channels.as_deref()),
                Route::Only(id) => &t.endpoint.id == id && !t.endpoint.disabled,
            })
            .map(|t| t.endpoint.id.clone())
            .collect();
        let count = endpoints.len();
        let in_memory = self.delivers && count > 0 && self.dispatcher.try_reserve(count);
        let message = Arc::new(message);
        let result = self
            .store
            .ingest(NewMessage {
                message: (*message).clone(),
                endpoints: endpoints.clone(),
                owner: in_memory.then(|| self.dispatcher.owner().to_string()),
                idempotency,
            })
            .await;
        match &result {
            Ok(IngestResult::Created { deliveries }) if in_memory => {
                let jobs = deliveries.iter().zip(endpoints).map(|(delivery_id, endpoint_id)| Job {
                    delivery_id: *delivery_id,
                    endpoint_id,
                    message: message.clone(),
                    attempts: 0,
                    trigger: Trigger::Scheduled,
                });
                self.dispatcher.submit(jobs);
            }
            Ok(IngestResult::Created { .. }) if count > 0 => self.dispatcher.poke(),
            _ if in_memory => self.dispatcher.unreserve(count),
            _ => {}
        }
        result
    }
}
