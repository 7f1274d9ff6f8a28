//! The work queue on PostgreSQL: claims with `FOR UPDATE SKIP LOCKED`, outcomes recorded
//! only while the claim holds, node leases (heartbeats, reaping), manual requeues.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;

use super::held::Move;
use super::rows::{self, MESSAGE_COLUMNS};
use super::{PgStore, db_err};
use crate::clock::{Millis, now_ms};
use crate::ids::{AppId, EndpointId, MessageId};
use crate::store::sql;
use crate::store::{
    ClaimedDelivery, DeadLetter, DeadLetterFilter, DeliveryState, NextState, OutcomeRecord, QueueStore, Recorded,
    Requeue, StoreResult, Trigger, keep_trying,
};
use crate::supervisor::spawn_task;

const NOTIFY_WORK: &str = "SELECT pg_notify('herald_work', '')";
const NOTIFY_CATALOG: &str = "SELECT pg_notify('herald_catalog', $1)";

/// Due, unclaimed deliveries of endpoints without strict ordering, oldest due first. A
/// claim's attempt starts after every resend accepted before it: the claim clears `resend`.
const CLAIM_DUE: &str = "WITH due AS (
         SELECT id FROM herald.delivery
         WHERE state = 0 AND owner IS NULL AND NOT strict AND next_at <= $2
         ORDER BY next_at LIMIT $3 FOR UPDATE SKIP LOCKED)
     UPDATE herald.delivery d SET owner = $1, resend = false FROM due WHERE d.id = due.id
     RETURNING d.id, d.msg_id, d.endpoint_id, d.attempts, d.next_at, d.trigger";

/// The head (oldest pending delivery) of each strictly ordered endpoint, if nobody holds it
/// and it is due: at most one delivery per such endpoint is ever out.
const CLAIM_HEADS: &str = "WITH heads AS (
         SELECT d.id FROM (SELECT min(id) AS id FROM herald.delivery WHERE state = 0 AND strict GROUP BY endpoint_id) h
         JOIN herald.delivery d ON d.id = h.id
         WHERE d.owner IS NULL AND d.next_at <= $2
         LIMIT $3 FOR UPDATE OF d SKIP LOCKED)
     UPDATE herald.delivery d SET owner = $1, resend = false FROM heads WHERE d.id = heads.id
     RETURNING d.id, d.msg_id, d.endpoint_id, d.attempts, d.next_at, d.trigger";

/// Gives back pending deliveries `owner` holds, on a connection of its own.
/// What giving a claim back sets, `now` being the number of the parameter holding the time.
/// A delivery a resend marked while it was held becomes that resend: due at once, with a
/// fresh retry budget, as a manual attempt; otherwise it stays as it was, only unclaimed.
fn released(now: usize) -> String {
    format!(
        "owner = NULL, resend = false, next_at = CASE WHEN resend THEN ${now} ELSE next_at END,
         attempts = CASE WHEN resend THEN 0 ELSE attempts END, trigger = CASE WHEN resend THEN 1 ELSE trigger END"
    )
}

async fn release_ids(pool: &deadpool_postgres::Pool, owner: &str, ids: &[i64]) -> StoreResult<u64> {
    let client = pool.get().await.map_err(super::pool_err)?;
    let rows = format!("UPDATE herald.delivery SET {} WHERE id = ANY ($1) AND owner = $2 AND state = 0", released(3));
    let held = Move::release("h.id = ANY ($1) AND h.owner = $2", "$3").statement();
    give_back(&client, &[&held, &rows], &[&ids, &owner, &now_ms()]).await
}

/// Runs statements that make deliveries claimable again (held ones, then rows, with the
/// same parameters) and, if they changed any, tells every process there is work. Held ones
/// first: a resend that moves a held delivery into its row (claim kept) between the two
/// finds it gone or has moved it before the rows' statement, whose fresh snapshot then
/// sees the row. The other order could miss it twice and leave it claimed by a process
/// that let it go.
async fn give_back(
    client: &tokio_postgres::Client,
    statements: &[&str],
    params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
) -> StoreResult<u64> {
    let mut released = 0;
    for sql in statements {
        released += client.execute(*sql, params).await.map_err(db_err)?;
    }
    if released > 0 {
        client.execute(NOTIFY_WORK, &[]).await.map_err(db_err)?;
    }
    Ok(released)
}

impl PgStore {
    async fn claim_with(
        &self,
        sql: &str,
        owner: &str,
        due_before: Millis,
        limit: usize,
    ) -> StoreResult<Vec<ClaimedDelivery>> {
        // One transaction: a connection lost between the claim and the read of its messages
        // must undo the claim, or the deliveries would stay claimed by a live process that
        // never learnt of them (stranded until it restarts).
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        let statement = tx.prepare_cached(sql).await.map_err(db_err)?;
        let claimed = tx.query(&statement, &[&owner, &due_before, &(limit as i64)]).await.map_err(db_err)?;
        if claimed.is_empty() {
            return Ok(vec![]);
        }
        let msg_ids: Vec<String> = claimed.iter().map(|r| r.get(1)).collect();
        let sql = format!("SELECT {MESSAGE_COLUMNS} FROM herald.message m WHERE m.id = ANY ($1)");
        let statement = tx.prepare_cached(&sql).await.map_err(db_err)?;
        let messages: HashMap<String, Arc<crate::store::Message>> = tx
            .query(&statement, &[&msg_ids])
            .await
            .map_err(db_err)?
            .iter()
            .map(|r| {
                let m = rows::message(r, true);
                (m.id.to_string(), Arc::new(m))
            })
            .collect();
        let mut out = Vec::with_capacity(claimed.len());
        let mut orphans = vec![];
        for row in claimed {
            let delivery_id: i64 = row.get(0);
            let Some(message) = messages.get(row.get::<_, &str>(1)).cloned() else {
                orphans.push(delivery_id);
                continue;
            };
            out.push(ClaimedDelivery {
                delivery_id,
                endpoint_id: EndpointId::from_trusted(row.get(2)),
                message,
                attempts: row.get::<_, i32>(3) as u32,
                next_at: row.get(4),
                trigger: Trigger::from_code(row.get::<_, i16>(5).into()),
            });
        }
        if !orphans.is_empty() {
            // Their messages are gone (the application was deleted): nothing to send.
            tx.execute("UPDATE herald.delivery SET state = 3, owner = NULL WHERE id = ANY ($1)", &[&orphans])
                .await
                .map_err(db_err)?;
        }
        if let Err(e) = tx.commit().await {
            // Whether the claim committed is unknown: give the rows back (a no-op if it did
            // not), or a live process would hold deliveries it never received.
            let (pool, owner) = (self.pool.clone(), owner.to_owned());
            let ids: Vec<i64> = out.iter().map(|d| d.delivery_id).collect();
            spawn_task(&self.liveness, "giving back an uncertain claim", async move {
                let _ = keep_trying("giving back an uncertain claim", || release_ids(&pool, &owner, &ids)).await;
            });
            return Err(db_err(e));
        }
        Ok(out)
    }
}

#[async_trait]
impl QueueStore for PgStore {
    async fn claim(&self, owner: &str, due_before: Millis, limit: usize) -> StoreResult<Vec<ClaimedDelivery>> {
        self.claim_with(CLAIM_DUE, owner, due_before, limit).await
    }

    async fn claim_heads(&self, owner: &str, due_before: Millis, limit: usize) -> StoreResult<Vec<ClaimedDelivery>> {
        self.claim_with(CLAIM_HEADS, owner, due_before, limit).await
    }
    /// One statement (so one round trip, and its own transaction): the deliveries still
    /// held by `owner` take their next state, and only their attempts are appended and
    /// counted in the per-minute and per-endpoint-hour totals. A resend accepted while the
    /// attempt was under way (`resend`) overrides the outcome's next state: the delivery
    /// goes back, unclaimed, for a manual attempt of its own.
    ///
    /// A second statement runs only for outcomes the first found no delivery for. A
    /// resend moves a held delivery into its row with the holder's claim kept; if that
    /// move commits while the first statement waits on the held row, the statement's
    /// snapshot (taken before) cannot see the new row, and the outcome would be dropped as
    /// a lost claim: its attempt unrecorded and the row held by a process that let it go,
    /// so the resend would never go. The second statement's fresh snapshot sees the row;
    /// a claim truly lost (reaped, released) stays lost, as it is no longer `owner`'s.
    async fn record_outcomes(&self, owner: &str, outcomes: Vec<OutcomeRecord>) -> StoreResult<Vec<Recorded>> {
        let client = self.client().await?;
        let now = now_ms();
        let mut applied = apply_outcomes(&client, &RECORD_OUTCOMES, owner, now, &outcomes).await?;
        let missed: Vec<&OutcomeRecord> = outcomes.iter().filter(|o| !applied.contains_key(&o.delivery_id)).collect();
        if !missed.is_empty() {
            applied.extend(apply_outcomes(&client, &RECORD_ROW_OUTCOMES_ALONE, owner, now, missed).await?);
        }
        let outcome_of = |o: &OutcomeRecord| applied.get(&o.delivery_id).copied().unwrap_or(Recorded::ClaimLost);
        let released = outcomes.iter().any(|o| match outcome_of(o) {
            Recorded::Resent => true,
            Recorded::Applied => matches!(o.next, NextState::Retry { keep: false, .. }),
            Recorded::ClaimLost => false,
        });
        if released {
            // A wake-up, not data: after the commit is soon enough (the probe would find it too).
            client.execute(NOTIFY_WORK, &[]).await.map_err(db_err)?;
        }
        Ok(outcomes.iter().map(outcome_of).collect())
    }

    async fn release(&self, owner: &str, deliveries: Vec<i64>) -> StoreResult<()> {
        release_ids(&self.pool, owner, &deliveries).await.map(|_| ())
    }

    async fn release_message(&self, owner: &str, msg: &MessageId) -> StoreResult<u64> {
        let rows = format!("UPDATE herald.delivery SET {} WHERE msg_id = $1 AND owner = $2 AND state = 0", released(3));
        let held = Move::release("h.msg_id = $1 AND h.owner = $2", "$3").statement();
        let client = self.client().await?;
        give_back(&client, &[&held, &rows], &[&msg.as_str(), &owner, &now_ms()]).await
    }

    async fn release_owner(&self, owner: &str) -> StoreResult<u64> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(db_err)?;
        let rows = format!("UPDATE herald.delivery SET {} WHERE owner = $1", released(2));
        let held = Move::release("h.owner = $1", "$2").statement();
        let mut released = 0;
        for sql in [held, rows] {
            released += tx.execute(&sql, &[&owner, &now_ms()]).await.map_err(db_err)?;
        }
        tx.execute("DELETE FROM herald.node WHERE id = $1", &[&owner]).await.map_err(db_err)?;
        tx.execute(NOTIFY_WORK, &[]).await.map_err(db_err)?;
        tx.commit().await.map_err(db_err)?;
        Ok(released)
    }

    /// Never used on a shared database: other processes' claims are theirs until their
    /// leases expire (see `reap_expired`).
    async fn release_all(&self) -> StoreResult<u64> {
        Ok(0)
    }

    async fn register_node(&self, owner: &str) -> StoreResult<()> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO herald.node (id, heartbeat_at) VALUES ($1, now())
                 ON CONFLICT (id) DO UPDATE SET heartbeat_at = now()",
                &[&owner],
            )
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn heartbeat(&self, owner: &str) -> StoreResult<bool> {
        let client = self.client().await?;
        let renewed = client
            .execute("UPDATE herald.node SET heartbeat_at = now() WHERE id = $1", &[&owner])
            .await
            .map_err(db_err)?;
        Ok(renewed == 1)
    }

    async fn reap_expired(&self, lease: Duration) -> StoreResult<u64> {
        let client = self.client().await?;
        let seconds = lease.as_secs_f64();
        let dead: Vec<String> = client
            .query(
                // For a lease after the database (re)started, nobody could renew: no lease
                // counts as expired until every process had one full lease to reconnect.
                "DELETE FROM herald.node
                 WHERE heartbeat_at < now() - make_interval(secs => $1)
                   AND pg_postmaster_start_time() < now() - make_interval(secs => $1)
                 RETURNING id",
                &[&seconds],
            )
            .await
            .map_err(db_err)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        if dead.is_empty() {
            return Ok(0);
        }
        let rows = format!("UPDATE herald.delivery SET {} WHERE owner = ANY ($1)", released(2));
        let held = Move::release("h.owner = ANY ($1)", "$2").statement();
        let released = give_back(&client, &[&held, &rows], &[&dead, &now_ms()]).await?;
        if released > 0 {
            tracing::warn!(released, "released the deliveries of processes whose lease expired");
        }
        Ok(released)
    }

    async fn release_orphans(&self) -> StoreResult<u64> {
        let rows = format!(
            "UPDATE herald.delivery d SET {}
             WHERE d.state = 0 AND d.owner IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM herald.node n WHERE n.id = d.owner)",
            released(1)
        );
        let held = Move::release("NOT EXISTS (SELECT 1 FROM herald.node n WHERE n.id = h.owner)", "$1").statement();
        let client = self.client().await?;
        let released = give_back(&client, &[&held, &rows], &[&now_ms()]).await?;
        if released > 0 {
            tracing::warn!(released, "released deliveries claimed under names no process holds");
        }
        Ok(released)
    }

    async fn requeue(&self, request: Requeue) -> StoreResult<u64> {
        let client = self.client().await?;
        let now = now_ms();
        let changed = match &request {
            // Held pending by a dispatcher, its attempt may be on the wire already: mark it,
            // so that attempt's outcome requeues it (see `record_outcomes`). Otherwise it is
            // pending again at once, with a fresh retry budget. One statement: an outcome
            // committed meanwhile is seen (the update re-reads the row it waited for).
            Requeue::Resend { app, msg, endpoint } => {
                // A held delivery becomes a row first, still held by its holder, so the
                // update below marks it like any other delivery held pending.
                client
                    .execute(&Move::resend().statement(), &[&msg.as_str(), &endpoint.as_str()])
                    .await
                    .map_err(db_err)?;
                let changed = client
                    .execute(
                        "UPDATE herald.delivery SET resend = (state = 0 AND owner IS NOT NULL),
                             attempts = CASE WHEN state = 0 AND owner IS NOT NULL THEN attempts ELSE 0 END,
                             next_at = CASE WHEN state = 0 AND owner IS NOT NULL THEN next_at ELSE $1 END,
                             trigger = CASE WHEN state = 0 AND owner IS NOT NULL THEN trigger ELSE 1 END,
                             owner = CASE WHEN state = 0 THEN owner ELSE NULL END,
                             state = 0
                         WHERE msg_id = $2 AND endpoint_id = $3",
                        &[&now, &msg.as_str(), &endpoint.as_str()],
                    )
                    .await
                    .map_err(db_err)?;
                if changed > 0 {
                    // The process holding it may have it waiting for a retry: tell it, so it
                    // gives the claim back and the resend goes at once.
                    let change = format!("resend:{app}:{endpoint}:{msg}");
                    client.execute(NOTIFY_CATALOG, &[&change]).await.map_err(db_err)?;
                    changed
                } else {
                    client
                        .execute(
                            "INSERT INTO herald.delivery
                                 (msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner, strict, created_at)
                             SELECT m.id, e.id, m.app_id, 0, 0, $2, 1, NULL,
                                    coalesce(e.delivery->>'ordering', '') = 'strict', m.created_at
                             FROM herald.message m JOIN herald.endpoint e ON e.id = $1
                             WHERE m.id = $3 AND m.app_id = $4",
                            &[&endpoint.as_str(), &now, &msg.as_str(), &app.as_str()],
                        )
                        .await
                        .map_err(db_err)?
                }
            }
            Requeue::Recover { endpoint, since, until } => {
                client.execute(sql::RECOVER, &[&now, &endpoint.as_str(), since, until]).await.map_err(db_err)?
            }
            Requeue::DeadLetters { ids } => client
                .execute(
                    "UPDATE herald.delivery SET state = 0, attempts = 0, next_at = $1, trigger = 1, owner = NULL
                     WHERE id = ANY($2) AND state = 2",
                    &[&now, ids],
                )
                .await
                .map_err(db_err)?,
        };
        if changed > 0 {
            client.execute(NOTIFY_WORK, &[]).await.map_err(db_err)?;
        }
        Ok(changed)
    }

    async fn dead_letters(&self, f: &DeadLetterFilter) -> StoreResult<Vec<DeadLetter>> {
        let client = self.client().await?;
        let (app, endpoint) = (f.app.as_ref().map(|a| a.as_str()), f.endpoint.as_ref().map(|e| e.as_str()));
        let status = f.status_code.map(i32::from);
        let rows = client
            .query(
                DEAD_LETTERS,
                &[
                    &f.dead_since,
                    &f.dead_until,
                    &app,
                    &endpoint,
                    &status,
                    &f.error_class,
                    &f.event_type,
                    &(f.limit as i64),
                ],
            )
            .await
            .map_err(db_err)?;
        Ok(rows
            .iter()
            .map(|r| DeadLetter {
                delivery_id: r.get(0),
                app_id: AppId::from_trusted(r.get(1)),
                endpoint_id: EndpointId::from_trusted(r.get(2)),
                msg_id: MessageId::from_trusted(r.get(3)),
                event_type: r.get(4),
                dead_at: r.get(5),
                attempts: r.get::<_, i32>(6) as u32,
                status_code: r.get::<_, i32>(7) as u16,
                error_class: r.get(8),
                error: r.get(9),
            })
            .collect())
    }
}

/// Attempt rows as one array per column, for a single multi-row INSERT.
#[derive(Default)]
struct AttemptColumns {
    id: Vec<String>,
    delivery: Vec<i64>,
    msg: Vec<String>,
    endpoint: Vec<String>,
    app: Vec<String>,
    created: Vec<i64>,
    url: Vec<String>,
    status: Vec<i32>,
    duration: Vec<i64>,
    delivered: Vec<bool>,
    class: Vec<Option<String>>,
    error: Vec<Option<String>>,
    response: Vec<String>,
    trigger: Vec<i16>,
    number: Vec<i32>,
    /// For the totals: when the message was accepted, and whether the outcome killed it.
    message_created: Vec<Millis>,
    dead: Vec<bool>,
}

impl AttemptColumns {
    fn push(&mut self, delivery_id: i64, a: &crate::store::Attempt, message_created_at: Millis, dead: bool) {
        self.message_created.push(message_created_at);
        self.dead.push(dead);
        self.id.push(a.id.to_string());
        self.delivery.push(delivery_id);
        self.msg.push(a.msg_id.to_string());
        self.endpoint.push(a.endpoint_id.to_string());
        self.app.push(a.app_id.to_string());
        self.created.push(a.created_at);
        self.url.push(a.url.clone());
        self.status.push(i32::from(a.status_code));
        self.duration.push(a.duration_ms as i64);
        self.delivered.push(a.delivered);
        self.class.push(a.error_class.clone());
        self.error.push(a.error.clone());
        self.response.push(a.response.clone());
        self.trigger.push(a.trigger.code() as i16);
        self.number.push(a.attempt_no as i32);
    }
}

/// Runs `statement` ([`RECORD_OUTCOMES`] or [`RECORD_ROW_OUTCOMES_ALONE`]) for `outcomes`:
/// each delivery it settled, and whether a resend took it back.
async fn apply_outcomes<'a>(
    client: &deadpool_postgres::Client,
    statement: &str,
    owner: &str,
    now: Millis,
    outcomes: impl IntoIterator<Item = &'a OutcomeRecord>,
) -> StoreResult<HashMap<i64, Recorded>> {
    let (mut ids, mut states, mut attempts, mut next, mut keep) = (vec![], vec![], vec![], vec![], vec![]);
    let mut c = AttemptColumns::default();
    for o in outcomes {
        let (state, at, kept) = match o.next {
            NextState::Delivered => (DeliveryState::Delivered, now, false),
            NextState::Retry { at, keep } => (DeliveryState::Pending, at, keep),
            NextState::Dead => (DeliveryState::Dead, now, false),
            NextState::Canceled => (DeliveryState::Canceled, now, false),
        };
        ids.push(o.delivery_id);
        states.push(state.code() as i16);
        attempts.push(o.attempts as i32);
        next.push(at);
        keep.push(kept);
        if let Some(a) = &o.attempt {
            c.push(o.delivery_id, a, o.message_created_at, matches!(o.next, NextState::Dead));
        }
    }
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 24] = [
        &ids,
        &states,
        &attempts,
        &next,
        &keep,
        &owner,
        &now,
        &c.delivery,
        &c.id,
        &c.msg,
        &c.endpoint,
        &c.app,
        &c.created,
        &c.url,
        &c.status,
        &c.duration,
        &c.delivered,
        &c.class,
        &c.error,
        &c.response,
        &c.trigger,
        &c.number,
        &c.message_created,
        &c.dead,
    ];
    // Every expression reads the row as it was; `trigger` comes back 1 only for a resend.
    let statement = client.prepare_cached(statement).await.map_err(db_err)?;
    let rows = client.query(&statement, &params).await.map_err(db_err)?;
    Ok(rows
        .iter()
        .map(|r| (r.get(0), if r.get::<_, i16>(1) == 1 { Recorded::Resent } else { Recorded::Applied }))
        .collect())
}

/// The outcomes of a batch in one statement: the held deliveries `$6` holds move into rows
/// in their next state (`held.rs`), the rows it still holds are updated, then, for those
/// alone, their attempts are appended and counted in the per-minute totals and the
/// per-endpoint-hour counts (rows locked in key order, so two processes never deadlock).
static RECORD_OUTCOMES: LazyLock<String> = LazyLock::new(|| {
    let held = Move {
        using: "UNNEST($1::int8[], $2::int2[], $3::int4[], $4::int8[], $5::bool[]) AS x(id, state, attempts, next_at, keep)",
        filter: "h.id = x.id AND h.owner = $6",
        state: "x.state",
        attempts: "x.attempts",
        next_at: "x.next_at",
        keep: "x.keep",
    };
    format!("WITH {}, {RECORD_ROW_OUTCOMES}", held.ctes())
});

/// [`RECORD_OUTCOMES`] for rows alone, no held delivery moved (see `record_outcomes`).
static RECORD_ROW_OUTCOMES_ALONE: LazyLock<String> = LazyLock::new(|| {
    format!("WITH held_in AS (SELECT NULL::int8 AS id, NULL::int2 AS trigger WHERE false), {RECORD_ROW_OUTCOMES}")
});

/// [`RECORD_OUTCOMES`] after the held deliveries' move: the rows' part and the totals.
const RECORD_ROW_OUTCOMES: &str = "
    u AS (
        UPDATE herald.delivery d SET state = CASE WHEN d.resend THEN 0 ELSE u.state END,
            attempts = CASE WHEN d.resend THEN 0 ELSE u.attempts END,
            next_at = CASE WHEN d.resend THEN $7 ELSE u.next_at END,
            trigger = CASE WHEN d.resend THEN 1 ELSE 0 END,
            owner = CASE WHEN u.keep AND NOT d.resend THEN d.owner ELSE NULL END,
            resend = false
        FROM UNNEST($1::int8[], $2::int2[], $3::int4[], $4::int8[], $5::bool[]) AS u(id, state, attempts, next_at, keep)
        WHERE d.id = u.id AND d.owner = $6
        RETURNING d.id, d.trigger
    ), settled AS (
        SELECT id, trigger FROM u UNION ALL SELECT id, trigger FROM held_in
    ), o AS (
        SELECT t.* FROM UNNEST($8::int8[], $9::text[], $10::text[], $11::text[], $12::text[], $13::int8[],
                $14::text[], $15::int4[], $16::int8[], $17::bool[], $18::text[], $19::text[], $20::text[],
                $21::int2[], $22::int4[], $23::int8[], $24::bool[])
            AS t(delivery_id, id, msg_id, endpoint_id, app_id, created_at, url, status_code, duration_ms,
                 delivered, error_class, error, response, trigger, attempt_no, message_created_at, dead)
        WHERE t.delivery_id IN (SELECT id FROM settled)
    ), a AS (
        INSERT INTO herald.attempt (id, delivery_id, msg_id, endpoint_id, app_id, created_at, url, status_code,
            duration_ms, delivered, error_class, error, response, trigger, attempt_no)
        SELECT id, delivery_id, msg_id, endpoint_id, app_id, created_at, url, status_code, duration_ms, delivered,
            error_class, error, response, trigger, attempt_no FROM o
    ), m AS (
        INSERT INTO herald.stats_minute (minute, delivered, failed, delivery_ms, dead)
        SELECT created_at / 60000, count(*) FILTER (WHERE delivered), count(*) FILTER (WHERE NOT delivered),
               coalesce(sum(greatest(created_at - message_created_at, 0)) FILTER (WHERE delivered), 0),
               count(*) FILTER (WHERE dead)
        FROM o GROUP BY 1 ORDER BY 1
        ON CONFLICT (minute) DO UPDATE SET delivered = herald.stats_minute.delivered + excluded.delivered,
            failed = herald.stats_minute.failed + excluded.failed,
            delivery_ms = herald.stats_minute.delivery_ms + excluded.delivery_ms,
            dead = herald.stats_minute.dead + excluded.dead
    ), h AS (
        INSERT INTO herald.endpoint_hour (endpoint_id, hour, succeeded, failed)
        SELECT endpoint_id, created_at / 3600000, count(*) FILTER (WHERE delivered), count(*) FILTER (WHERE NOT delivered)
        FROM o GROUP BY 1, 2 ORDER BY 1, 2
        ON CONFLICT (endpoint_id, hour) DO UPDATE SET
            succeeded = herald.endpoint_hour.succeeded + excluded.succeeded,
            failed = herald.endpoint_hour.failed + excluded.failed
    )
    SELECT id, trigger FROM settled";

/// Dead letters with their last attempt; a dead delivery's `next_at` is when it died.
const DEAD_LETTERS: &str = "
    SELECT d.id, d.app_id, d.endpoint_id, d.msg_id, m.event_type, d.next_at, d.attempts,
           coalesce(a.status_code, 0)::int, a.error_class, a.error
    FROM herald.delivery d
    JOIN herald.message m ON m.id = d.msg_id
    LEFT JOIN LATERAL (SELECT status_code, error_class, error FROM herald.attempt
                       WHERE msg_id = d.msg_id AND endpoint_id = d.endpoint_id
                       ORDER BY id DESC LIMIT 1) a ON true
    WHERE d.state = 2 AND d.next_at >= $1 AND ($2::bigint IS NULL OR d.next_at < $2)
      AND ($3::text IS NULL OR d.app_id = $3) AND ($4::text IS NULL OR d.endpoint_id = $4)
      AND ($5::int IS NULL OR coalesce(a.status_code, 0) = $5) AND ($6::text IS NULL OR a.error_class = $6)
      AND ($7::text IS NULL OR m.event_type = $7)
    ORDER BY d.next_at DESC
    LIMIT $8";
