//! Group commit for ingest on PostgreSQL. Concurrent ingests wait here a moment and are
//! committed together: one transaction, a handful of multi-row statements (`UNNEST`), one
//! WAL flush, however many messages. Several batches may be committing at once.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::{Semaphore, mpsc, oneshot};

use super::db_err;
use crate::store::{IdempotencyRecord, IngestResult, NewMessage, StoreError, StoreResult, StoredResponse};
use crate::supervisor::{Liveness, spawn_task};
use crate::traceparent::format_traceparent;

/// Batches committing at the same time.
const CONCURRENT_BATCHES: usize = 4;

/// A message to commit, its payload packed (`store::packing`) when that is on, and where
/// its result goes.
type Request = (Ingest, oneshot::Sender<StoreResult<IngestResult>>);

/// A message to commit, with its payload's packed form when it is stored packed (packed by
/// the request's own task, not the batch's).
pub struct Ingest {
    pub new: NewMessage,
    pub packed: Option<Vec<u8>>,
}

pub struct Batcher {
    tx: mpsc::UnboundedSender<Request>,
}

impl Batcher {
    /// Starts the batcher; it runs until the store is dropped (a panic fails the process).
    pub fn start(pool: Pool, max: usize, linger: Duration, liveness: &Arc<Liveness>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        spawn_task(liveness, "the ingest batcher", run(pool, rx, max, linger, liveness.clone()));
        Self { tx }
    }

    pub async fn submit(&self, ingest: Ingest) -> StoreResult<IngestResult> {
        let (reply, rx) = oneshot::channel();
        let gone = || StoreError::Unavailable("the ingest batcher has stopped".into());
        self.tx.send((ingest, reply)).map_err(|_| gone())?;
        rx.await.map_err(|_| gone())?
    }
}

async fn run(pool: Pool, mut rx: mpsc::UnboundedReceiver<Request>, max: usize, linger: Duration, live: Arc<Liveness>) {
    let slots = Arc::new(Semaphore::new(CONCURRENT_BATCHES));
    while let Some(first) = rx.recv().await {
        let permit = slots.clone().acquire_owned().await.expect("never closed");
        let mut batch = vec![first];
        let deadline = tokio::time::Instant::now() + linger;
        while batch.len() < max {
            match rx.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(request)) => batch.push(request),
                    _ => break,
                },
            }
        }
        let pool = pool.clone();
        spawn_task(&live, "an ingest batch's commit", async move {
            let (news, replies): (Vec<Ingest>, Vec<_>) = batch.into_iter().unzip();
            match commit(&pool, &news).await {
                Ok(results) => replies.into_iter().zip(results).for_each(|(reply, r)| drop(reply.send(Ok(r)))),
                Err(e) => {
                    let message = e.to_string();
                    for reply in replies {
                        let _ = reply.send(Err(StoreError::Unavailable(message.clone())));
                    }
                }
            }
            drop(permit);
        });
    }
}

/// Commits a batch; returns one result per message, in order. Without idempotency keys it
/// is one statement (its own transaction, one round trip); keys need a transaction that
/// claims them first.
async fn commit(pool: &Pool, ingests: &[Ingest]) -> StoreResult<Vec<IngestResult>> {
    if ingests.iter().all(|i| i.new.idempotency.is_none()) {
        return commit_plain(pool, ingests).await;
    }
    let news: Vec<&NewMessage> = ingests.iter().map(|i| &i.new).collect();
    let mut client = pool.get().await.map_err(super::pool_err)?;
    let tx = client.transaction().await.map_err(db_err)?;
    let mut results: Vec<Option<IngestResult>> = vec![None; news.len()];
    claim_keys(&tx, &news, &mut results).await?;
    let fresh: Vec<&Ingest> = ingests.iter().zip(&results).filter(|(_, r)| r.is_none()).map(|(i, _)| i).collect();
    let created = insert_messages(&tx, &fresh).await?;
    let created_news = fresh.iter().map(|i| &i.new).filter(|n| created.contains(n.message.id.as_str()));
    let delivery_ids = insert_deliveries(&tx, created_news).await?;
    let mut orphaned_keys: (Vec<&str>, Vec<&str>) = (vec![], vec![]);
    for (n, result) in news.iter().zip(results.iter_mut()).filter(|(_, r)| r.is_none()) {
        if !created.contains(n.message.id.as_str()) {
            *result = Some(IngestResult::DuplicateEventId);
            // The key was claimed for a message that was not created: give it back.
            if let Some(record) = &n.idempotency {
                orphaned_keys.0.push(&record.scope);
                orphaned_keys.1.push(&record.key);
            }
            continue;
        }
        let deliveries =
            n.deliveries.iter().map(|d| delivery_ids[&(n.message.id.to_string(), d.endpoint.to_string())]).collect();
        *result = Some(IngestResult::Created { deliveries });
    }
    if !orphaned_keys.0.is_empty() {
        tx.execute(
            "DELETE FROM herald.idempotency WHERE (scope, key) IN (SELECT * FROM UNNEST($1::text[], $2::text[]))",
            &[&orphaned_keys.0, &orphaned_keys.1],
        )
        .await
        .map_err(db_err)?;
    }
    let unclaimed = fresh.iter().map(|i| &i.new).any(|n| n.deliveries.iter().any(|d| n.owner.is_none() || d.strict));
    if unclaimed {
        tx.execute("SELECT pg_notify('herald_work', '')", &[]).await.map_err(db_err)?;
    }
    tx.commit().await.map_err(db_err)?;
    Ok(results.into_iter().map(|r| r.expect("every message has a result")).collect())
}

/// Inserts a batch's messages (`$1`–`$9`, one array per column), returning the ids of those
/// created (a repeated event id creates nothing). A macro, so that statements can embed it.
macro_rules! insert_messages_sql {
    () => {
        "INSERT INTO herald.message (id, app_id, event_type, event_id, channels, payload, created_at, trace, packed)
         SELECT id, app_id, event_type, event_id,
                CASE WHEN ch IS NULL THEN NULL ELSE ARRAY(SELECT jsonb_array_elements_text(ch::jsonb)) END,
                payload, created_at, trace, packed
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::int8[], $8::text[],
                     $9::bytea[])
              AS t(id, app_id, event_type, event_id, ch, payload, created_at, trace, packed)
         ON CONFLICT DO NOTHING
         RETURNING id"
    };
}

/// The inserts of a batch's deliveries, as two CTEs (`d` and `h`, each returning message,
/// endpoint and delivery id) over `UNNEST` of six arrays from parameter `$p` on (message,
/// endpoint, application, owner, strict, time), for the messages `created` admits (an SQL
/// condition, `AND …`, or nothing). A delivery claimed at ingest is held (see `held.rs`),
/// with an id from the delivery rows' own sequence; one nobody claimed (strictly ordered,
/// or an ingest that did not fit in memory) is a pending row.
fn deliveries_ctes(p: usize, created: &str) -> String {
    let t = format!(
        "UNNEST(${p}::text[], ${}::text[], ${}::text[], ${}::text[], ${}::bool[], ${}::int8[])
         AS t(msg_id, endpoint_id, app_id, owner, strict, created_at)",
        p + 1,
        p + 2,
        p + 3,
        p + 4,
        p + 5
    );
    format!(
        "d AS (
             INSERT INTO herald.delivery
                 (msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner, strict, created_at)
             SELECT msg_id, endpoint_id, app_id, 0, 0, created_at, 0, NULL, strict, created_at FROM {t}
             WHERE owner IS NULL{created}
             RETURNING msg_id, endpoint_id, id
         ), h AS (
             INSERT INTO herald.held (id, msg_id, endpoint_id, app_id, owner, created_at)
             SELECT nextval('herald.delivery_id_seq'), msg_id, endpoint_id, app_id, owner, created_at FROM {t}
             WHERE owner IS NOT NULL{created}
             RETURNING msg_id, endpoint_id, id
         )"
    )
}

/// A batch's messages, and the deliveries of those created (a repeated event id creates
/// nothing), in one statement.
static INGEST_PLAIN: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH m AS ({}), {}
         SELECT id, NULL::text, NULL::int8 FROM m
         UNION ALL SELECT msg_id, endpoint_id, id FROM d UNION ALL SELECT msg_id, endpoint_id, id FROM h",
        insert_messages_sql!(),
        deliveries_ctes(10, " AND msg_id IN (SELECT id FROM m)")
    )
});

/// A batch's deliveries alone (their messages inserted before, in the same transaction).
static INSERT_DELIVERIES: LazyLock<String> = LazyLock::new(|| {
    format!(
        "WITH {} SELECT msg_id, endpoint_id, id FROM d UNION ALL SELECT msg_id, endpoint_id, id FROM h",
        deliveries_ctes(1, "")
    )
});

/// A batch without idempotency keys: the messages and their deliveries in one statement.
async fn commit_plain(pool: &Pool, ingests: &[Ingest]) -> StoreResult<Vec<IngestResult>> {
    let client = pool.get().await.map_err(super::pool_err)?;
    let all: Vec<&Ingest> = ingests.iter().collect();
    let m = MessageColumns::of(&all);
    let d = DeliveryColumns::of(ingests.iter().map(|i| &i.new));
    let statement = client.prepare_cached(&INGEST_PLAIN).await.map_err(db_err)?;
    let rows = client
        .query(
            &statement,
            &[
                &m.ids,
                &m.apps,
                &m.types,
                &m.event_ids,
                &m.channels,
                &m.payloads,
                &m.created,
                &m.traces,
                &m.packed,
                &d.msg,
                &d.endpoint,
                &d.app,
                &d.owner,
                &d.strict,
                &d.at,
            ],
        )
        .await
        .map_err(db_err)?;
    let mut created = HashSet::new();
    let mut ids = HashMap::new();
    for row in &rows {
        let msg: String = row.get(0);
        match row.get::<_, Option<String>>(1) {
            None => {
                created.insert(msg);
            }
            Some(endpoint) => {
                ids.insert((msg, endpoint), row.get::<_, i64>(2));
            }
        }
    }
    let news = ingests.iter().map(|i| &i.new);
    let unclaimed = news
        .clone()
        .any(|n| created.contains(n.message.id.as_str()) && n.deliveries.iter().any(|d| n.owner.is_none() || d.strict));
    if unclaimed {
        // A wake-up for the other processes; after the commit is soon enough.
        client.execute("SELECT pg_notify('herald_work', '')", &[]).await.map_err(db_err)?;
    }
    Ok(news
        .map(|n| {
            if !created.contains(n.message.id.as_str()) {
                return IngestResult::DuplicateEventId;
            }
            let deliveries =
                n.deliveries.iter().map(|d| ids[&(n.message.id.to_string(), d.endpoint.to_string())]).collect();
            IngestResult::Created { deliveries }
        })
        .collect())
}

/// The message columns of a batch, for `UNNEST`; a packed payload goes in `packed`, and its
/// text column is NULL.
struct MessageColumns<'a> {
    ids: Vec<&'a str>,
    apps: Vec<&'a str>,
    types: Vec<&'a str>,
    event_ids: Vec<Option<&'a str>>,
    channels: Vec<Option<String>>,
    payloads: Vec<Option<&'a str>>,
    created: Vec<i64>,
    traces: Vec<Option<String>>,
    packed: Vec<Option<&'a [u8]>>,
}

impl<'a> MessageColumns<'a> {
    fn of(fresh: &[&'a Ingest]) -> Self {
        let messages = || fresh.iter().map(|i| &i.new.message);
        Self {
            ids: messages().map(|m| m.id.as_str()).collect(),
            apps: messages().map(|m| m.app_id.as_str()).collect(),
            types: messages().map(|m| m.event_type.as_str()).collect(),
            event_ids: messages().map(|m| m.event_id.as_deref()).collect(),
            channels: messages()
                .map(|m| m.channels.as_ref().map(|c| serde_json::to_string(c).expect("strings")))
                .collect(),
            payloads: fresh.iter().map(|i| i.new.message.payload.as_deref().filter(|_| i.packed.is_none())).collect(),
            created: messages().map(|m| m.created_at).collect(),
            traces: messages().map(|m| m.trace.as_ref().map(format_traceparent)).collect(),
            packed: fresh.iter().map(|i| i.packed.as_deref()).collect(),
        }
    }
}

/// The delivery columns of a batch (one per message and endpoint), for `UNNEST`.
#[derive(Default)]
struct DeliveryColumns {
    msg: Vec<String>,
    endpoint: Vec<String>,
    app: Vec<String>,
    owner: Vec<Option<String>>,
    strict: Vec<bool>,
    at: Vec<i64>,
}

impl DeliveryColumns {
    fn of<'a>(news: impl Iterator<Item = &'a NewMessage>) -> Self {
        let mut c = Self::default();
        for n in news {
            for d in &n.deliveries {
                c.msg.push(n.message.id.to_string());
                c.endpoint.push(d.endpoint.to_string());
                c.app.push(n.message.app_id.to_string());
                // Strictly ordered deliveries are never claimed here: they go out head first.
                c.owner.push(if d.strict { None } else { n.owner.clone() });
                c.strict.push(d.strict);
                c.at.push(n.message.created_at);
            }
        }
        c
    }
}

/// Claims the batch's idempotency keys before anything else: inserting a key takes its
/// index entry's lock, so a concurrent batch (of this or another process) with the same key
/// waits for this one and then finds it taken. Keys taken before, or twice in this batch,
/// make their message a replay of the first response.
async fn claim_keys(
    tx: &deadpool_postgres::Transaction<'_>,
    news: &[&NewMessage],
    results: &mut [Option<IngestResult>],
) -> StoreResult<()> {
    let keyed: Vec<(usize, &IdempotencyRecord)> =
        news.iter().enumerate().filter_map(|(i, n)| n.idempotency.as_ref().map(|r| (i, r))).collect();
    if keyed.is_empty() {
        return Ok(());
    }
    let scopes: Vec<&str> = keyed.iter().map(|(_, r)| r.scope.as_str()).collect();
    let keys: Vec<&str> = keyed.iter().map(|(_, r)| r.key.as_str()).collect();
    let statuses: Vec<i32> = keyed.iter().map(|(_, r)| i32::from(r.response.status)).collect();
    let bodies: Vec<&str> = keyed.iter().map(|(_, r)| r.response.body.as_str()).collect();
    let ats: Vec<i64> = keyed.iter().map(|(_, r)| r.response.created_at).collect();
    let mut mine: HashSet<(String, String)> = tx
        .query(
            &tx.prepare_cached(
                "INSERT INTO herald.idempotency (scope, key, status, body, created_at)
             SELECT * FROM UNNEST($1::text[], $2::text[], $3::int4[], $4::text[], $5::int8[])
             ON CONFLICT DO NOTHING
             RETURNING scope, key",
            )
            .await
            .map_err(db_err)?,
            &[&scopes, &keys, &statuses, &bodies, &ats],
        )
        .await
        .map_err(db_err)?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    // The first item with a key this batch inserted owns it; every other item with a key
    // is a replay.
    let taken: Vec<(usize, &IdempotencyRecord)> =
        keyed.into_iter().filter(|(_, r)| !mine.remove(&(r.scope.clone(), r.key.clone()))).collect();
    if taken.is_empty() {
        return Ok(());
    }
    let scopes: Vec<&str> = taken.iter().map(|(_, r)| r.scope.as_str()).collect();
    let keys: Vec<&str> = taken.iter().map(|(_, r)| r.key.as_str()).collect();
    let stored: HashMap<(String, String), StoredResponse> = tx
        .query(
            &tx.prepare_cached(
                "SELECT i.scope, i.key, i.status, i.body, i.created_at
             FROM herald.idempotency i JOIN UNNEST($1::text[], $2::text[]) AS k(scope, key)
               ON i.scope = k.scope AND i.key = k.key",
            )
            .await
            .map_err(db_err)?,
            &[&scopes, &keys],
        )
        .await
        .map_err(db_err)?
        .iter()
        .map(|r| {
            let response = StoredResponse { status: r.get::<_, i32>(2) as u16, body: r.get(3), created_at: r.get(4) };
            ((r.get(0), r.get(1)), response)
        })
        .collect();
    for (i, record) in taken {
        let first = stored.get(&(record.scope.clone(), record.key.clone())).cloned();
        results[i] = Some(IngestResult::Replayed(first.unwrap_or_else(|| record.response.clone())));
    }
    Ok(())
}

/// Inserts the messages; returns the ids of those created (a repeated event id creates
/// nothing).
async fn insert_messages(tx: &deadpool_postgres::Transaction<'_>, fresh: &[&Ingest]) -> StoreResult<HashSet<String>> {
    let m = MessageColumns::of(fresh);
    let rows = tx
        .query(
            &tx.prepare_cached(insert_messages_sql!()).await.map_err(db_err)?,
            &[&m.ids, &m.apps, &m.types, &m.event_ids, &m.channels, &m.payloads, &m.created, &m.traces, &m.packed],
        )
        .await
        .map_err(db_err)?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// Inserts one delivery per (message, endpoint), held or a row; returns their ids.
async fn insert_deliveries<'a>(
    tx: &deadpool_postgres::Transaction<'_>,
    created: impl Iterator<Item = &'a NewMessage>,
) -> StoreResult<HashMap<(String, String), i64>> {
    let d = DeliveryColumns::of(created);
    let rows = tx
        .query(
            &tx.prepare_cached(&INSERT_DELIVERIES).await.map_err(db_err)?,
            &[&d.msg, &d.endpoint, &d.app, &d.owner, &d.strict, &d.at],
        )
        .await
        .map_err(db_err)?;
    Ok(rows.iter().map(|r| ((r.get(0), r.get(1)), r.get(2))).collect())
}
