//! Races between two processes' statements that the conformance suite, one call at a time,
//! cannot stage: each test holds one side's transaction open at the point of the race, waits
//! until the other side's statement is blocked on it (as PostgreSQL reports), then lets go.

use std::sync::Arc;
use std::time::{Duration, Instant};

use herald_test_support::pg_cluster::{self, TempCluster};

use super::held::Move;
use super::{PgOptions, PgStore};
use crate::clock::now_ms;
use crate::store::conformance::{app, delivered, endpoint, ingest_one};
use crate::store::*;

/// A store on a fresh database, and two connections of their own to the same database: one
/// to play another process, one to watch (a transaction sees one snapshot of the activity).
async fn store_and_connections() -> (Arc<PgStore>, [tokio_postgres::Client; 2], TempCluster) {
    let cluster = TempCluster::start().expect("starting a throwaway PostgreSQL");
    let url = cluster.create_database().await.unwrap();
    let store = PgStore::connect(&url, &PgOptions::for_tests(4, 8), &Arc::default()).await.unwrap();
    let patience = Duration::from_secs(30);
    let others =
        [pg_cluster::connect(&url, patience).await.unwrap(), pg_cluster::connect(&url, patience).await.unwrap()];
    (Arc::new(store), others, cluster)
}

/// Waits until some statement of this database waits for a lock another transaction holds.
async fn until_a_statement_waits_on_a_lock(db: &tokio_postgres::Client) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(Instant::now() < deadline, "no statement came to wait on the lock");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A message with one delivery, held by "holder" (as the process that ingested it holds it).
async fn held_by_holder(store: &PgStore) -> (App, Endpoint, Message, i64) {
    let app = app();
    store.insert_app(&app).await.unwrap();
    let ep = endpoint(&app);
    assert!(store.insert_endpoint(&ep, 1000).await.unwrap());
    let (m, delivery) = ingest_one(store, &app, &ep, Some("holder")).await;
    (app, ep, m, delivery)
}

/// A resend's first step, as another process runs it, its transaction left open: the held
/// delivery has become its row, still claimed by its holder.
async fn resend_step_one<'a>(
    db: &'a mut tokio_postgres::Client,
    m: &Message,
    ep: &Endpoint,
) -> tokio_postgres::Transaction<'a> {
    let step_one = db.transaction().await.unwrap();
    let moved = step_one.execute(&Move::resend().statement(), &[&m.id.as_str(), &ep.id.as_str()]).await.unwrap();
    assert_eq!(moved, 1, "the held delivery became its row");
    step_one
}

/// A resend's first step (the held delivery becomes its row, still the holder's) commits
/// while the holder's outcome waits on the held row: the outcome's statement began before
/// the row existed. The attempt must still be recorded and the claim given up, so the
/// resend's second step makes the delivery due again. (Found by the fault suite: dropped as
/// a lost claim, the attempt vanished and the row stayed claimed by a process that had let
/// it go, so the accepted resend was never attempted.)
#[tokio::test]
async fn an_outcome_waiting_on_a_resend_s_move_is_recorded_and_the_resend_goes() {
    let (store, [mut resender, watcher], _cluster) = store_and_connections().await;
    let (app, ep, m, delivery) = held_by_holder(&store).await;
    let step_one = resend_step_one(&mut resender, &m, &ep).await;
    let outcome = delivered(&app, &m.id, &ep.id, delivery);
    let holder = store.clone();
    let recording = tokio::spawn(async move { holder.record_outcomes("holder", vec![outcome]).await });
    until_a_statement_waits_on_a_lock(&watcher).await;
    step_one.commit().await.unwrap();
    assert_eq!(recording.await.unwrap().unwrap(), vec![Recorded::Applied]);

    let page = PageQuery { limit: 10, iterator: None, descending: true };
    let attempts = AttemptFilter {
        app: app.id.clone(),
        msg: Some(m.id.clone()),
        endpoint: None,
        status: None,
        status_code_class: None,
        messages: Default::default(),
        with_content: false,
    };
    assert_eq!(store.list_attempts(&attempts, &page).await.unwrap().len(), 1, "the attempt is recorded");
    let resend = Requeue::Resend { app: app.id.clone(), msg: m.id.clone(), endpoint: ep.id.clone() };
    assert_eq!(store.requeue(resend).await.unwrap(), 1);
    let again = store.claim("other", now_ms() + 1000, 10).await.unwrap();
    assert_eq!(again.len(), 1, "the resend is due and anyone's to claim");
    assert_eq!(again[0].trigger, Trigger::Manual);
}

/// The holder gives the delivery back (its endpoint changed, say) while a resend's first
/// step is under way. Its give-back must reach the row the step makes, or the delivery stays
/// claimed by a process that no longer has it.
#[tokio::test]
async fn a_give_back_racing_a_resend_s_move_leaves_the_delivery_claimable() {
    let (store, [mut resender, watcher], _cluster) = store_and_connections().await;
    let (app, ep, m, delivery) = held_by_holder(&store).await;
    let step_one = resend_step_one(&mut resender, &m, &ep).await;
    let holder = store.clone();
    let giving_back = tokio::spawn(async move { holder.release("holder", vec![delivery]).await });
    until_a_statement_waits_on_a_lock(&watcher).await;
    step_one.commit().await.unwrap();
    giving_back.await.unwrap().unwrap();

    let resend = Requeue::Resend { app: app.id.clone(), msg: m.id.clone(), endpoint: ep.id.clone() };
    assert_eq!(store.requeue(resend).await.unwrap(), 1);
    let again = store.claim("other", now_ms() + 1000, 10).await.unwrap();
    assert_eq!(again.len(), 1, "given back, the delivery is anyone's to claim");
    assert_eq!(again[0].trigger, Trigger::Manual);
}
