//! The store conformance suite: the same cases run against every backend (River style).
//! A backend's test module instantiates them with `conformance_suite!(async fn → store)`.

use std::sync::Arc;

use crate::clock::{Millis, now_ms};
use crate::ids::{AppId, AttemptId, EndpointId, MessageId};
use crate::store::*;

pub(crate) fn app() -> App {
    App {
        id: AppId::generate(),
        uid: None,
        name: "conformance".into(),
        metadata: Default::default(),
        throttle_rate: None,
        max_concurrency: None,
        weight: None,
        portal_brand: None,
        proxy: None,
        created_at: now_ms(),
        updated_at: now_ms(),
    }
}

pub(crate) fn endpoint(app: &App) -> Endpoint {
    Endpoint {
        id: EndpointId::generate(),
        app_id: app.id.clone(),
        uid: None,
        url: "https://example.com/hook".into(),
        description: String::new(),
        disabled: false,
        event_types: None,
        channels: None,
        metadata: Default::default(),
        throttle_rate: None,
        headers: Default::default(),
        secrets: SealedSecrets(format!("v1.test.{}", crate::ids::random_token(16))),
        delivery: Default::default(),
        request: None,
        created_at: now_ms(),
        updated_at: now_ms(),
        // Stored and read back like every other field (the store never runs them).
        scripts: crate::store::Scripts { filter: Some(".payload.ok == true".into()), transform: Some(".".into()) },
        auth: crate::store::SealedAuth(format!("v1.test.{}", crate::ids::random_token(16))),
        version: 3,
        // Stored as opaque sealed text, like the credentials.
        destination: crate::store::SealedDestination(format!("v1.test.{}", crate::ids::random_token(16))),
    }
}

pub(crate) fn message(app: &App, event_id: Option<&str>) -> Message {
    Message {
        id: MessageId::generate(),
        app_id: app.id.clone(),
        event_type: "t".into(),
        event_id: event_id.map(str::to_owned),
        channels: None,
        payload: Some(Arc::from("{}")),
        created_at: now_ms(),
        trace: None,
    }
}

pub(crate) fn attempt(app: &App, msg: &MessageId, endpoint: &EndpointId, delivered: bool) -> Attempt {
    Attempt {
        id: AttemptId::generate(),
        msg_id: msg.clone(),
        endpoint_id: endpoint.clone(),
        app_id: app.id.clone(),
        created_at: now_ms(),
        url: "https://example.com/hook".into(),
        status_code: if delivered { 200 } else { 503 },
        duration_ms: 3,
        delivered,
        error_class: (!delivered).then(|| "http_status".into()),
        error: None,
        response: "body".into(),
        trigger: Trigger::Scheduled,
        attempt_no: 1,
        delivery_id: 0,
    }
}

/// An application with one endpoint and `n` messages committed unclaimed.
/// A successful attempt's outcome for one delivery.
pub(crate) fn delivered(app: &App, msg: &MessageId, endpoint: &EndpointId, delivery: i64) -> OutcomeRecord {
    OutcomeRecord {
        delivery_id: delivery,
        message_created_at: now_ms(),
        attempt: Some(attempt(app, msg, endpoint, true)),
        attempts: 1,
        next: NextState::Delivered,
    }
}

async fn seeded(store: &dyn Store, n: usize) -> (App, Endpoint, Vec<(MessageId, i64)>) {
    let app = app();
    store.insert_app(&app).await.unwrap();
    let ep = endpoint(&app);
    assert!(store.insert_endpoint(&ep, 1000).await.unwrap());
    let mut out = vec![];
    for _ in 0..n {
        let (m, delivery) = ingest_one(store, &app, &ep, None).await;
        out.push((m.id, delivery));
    }
    (app, ep, out)
}

/// A new message with one delivery, to `ep`, claimed at ingest by `owner` if given (held,
/// as the ingesting process holds it); the message and its delivery's id.
pub(crate) async fn ingest_one(store: &dyn Store, app: &App, ep: &Endpoint, owner: Option<&str>) -> (Message, i64) {
    let m = message(app, None);
    let new = NewMessage {
        message: m.clone(),
        deliveries: vec![NewDelivery { endpoint: ep.id.clone(), strict: false }],
        owner: owner.map(str::to_owned),
        idempotency: None,
    };
    let IngestResult::Created { deliveries } = store.ingest(new).await.unwrap() else { panic!("not created") };
    (m, deliveries[0])
}

pub async fn an_application_reads_back_as_written(store: &dyn Store) {
    let mut app = app();
    store.insert_app(&app).await.unwrap();
    assert_eq!(store.app(app.id.as_str()).await.unwrap().as_ref(), Some(&app));
    app.proxy =
        Some(AppProxy { url: "http://proxy.internal:3128".into(), credentials: SealedAuth("v1.k.sealed".into()) });
    let read_at = bump(&mut app.updated_at);
    assert!(store.update_app(&app, read_at).await.unwrap());
    assert_eq!(store.app(app.id.as_str()).await.unwrap().as_ref(), Some(&app));
    app.proxy = None;
    let read_at = bump(&mut app.updated_at);
    assert!(store.update_app(&app, read_at).await.unwrap());
    assert_eq!(store.app(app.id.as_str()).await.unwrap().as_ref(), Some(&app));
}

/// Moves a row's version on, returning the one it had (what its writer read).
fn bump(updated_at: &mut Millis) -> Millis {
    let read_at = *updated_at;
    *updated_at += 1;
    read_at
}

pub async fn a_write_from_a_stale_read_changes_nothing(store: &dyn Store) {
    let (app, ep, _) = seeded(store, 0).await;
    let stale = ep.updated_at;
    let (mut first, mut second) = (ep.clone(), ep.clone());
    first.url = "https://first.example.com/".into();
    first.updated_at = stale + 1;
    second.description = "second".into();
    second.updated_at = stale + 1;
    assert!(store.update_endpoint(&first, stale).await.unwrap(), "the first writer read the current version");
    assert!(!store.update_endpoint(&second, stale).await.unwrap(), "the second read a version that is gone");
    assert_eq!(store.endpoint(&app.id, ep.id.as_str()).await.unwrap(), Some(first));

    let mut a = store.app(app.id.as_str()).await.unwrap().unwrap();
    let stale = a.updated_at;
    a.name = "renamed".into();
    a.updated_at = stale + 1;
    assert!(store.update_app(&a, stale).await.unwrap());
    assert!(!store.update_app(&a, stale).await.unwrap());

    let mut et = EventType {
        name: "invoice.paid".into(),
        description: "one".into(),
        archived: false,
        deprecated: false,
        schemas: None,
        feature_flag: None,
        created_at: 1,
        updated_at: 1,
    };
    store.insert_event_type(&et).await.unwrap();
    et.description = "two".into();
    et.updated_at = 2;
    assert!(store.update_event_type(&et, 1).await.unwrap());
    assert!(!store.update_event_type(&et, 1).await.unwrap());
    assert_eq!(store.event_type("invoice.paid").await.unwrap().map(|e| e.description), Some("two".into()));
    et.name = "absent".into();
    assert!(!store.update_event_type(&et, 2).await.unwrap(), "nothing to update");

    let mut p = poller(&app);
    assert!(store.insert_poller(&p, 100).await.unwrap());
    let stale = p.updated_at;
    p.description = "changed".into();
    p.updated_at = stale + 1;
    assert!(store.update_poller(&p, stale).await.unwrap());
    assert!(!store.update_poller(&p, stale).await.unwrap());
}

pub async fn an_endpoint_reads_back_as_written_and_its_tombstone_keeps_no_credentials(store: &dyn Store) {
    let (app, mut ep, _) = seeded(store, 0).await;
    assert_eq!(store.endpoint(&app.id, ep.id.as_str()).await.unwrap().as_ref(), Some(&ep));
    ep.scripts = crate::store::Scripts { filter: None, transform: Some("{payload: .payload.x}".into()) };
    ep.auth = crate::store::SealedAuth::default();
    let read_at = bump(&mut ep.updated_at);
    assert!(store.update_endpoint(&ep, read_at).await.unwrap());
    assert_eq!(store.endpoint(&app.id, ep.id.as_str()).await.unwrap().as_ref(), Some(&ep));
    ep.auth = crate::store::SealedAuth("v1.test.sealed".into());
    ep.destination = crate::store::SealedDestination("v1.test.other-broker".into());
    let read_at = bump(&mut ep.updated_at);
    assert!(store.update_endpoint(&ep, read_at).await.unwrap());
    assert_eq!(store.endpoint(&app.id, ep.id.as_str()).await.unwrap().as_ref(), Some(&ep));
    store.delete_endpoint(&app.id, &ep.id).await.unwrap();
    let kept = store.deleted_endpoint(&ep.id).await.unwrap().expect("a tombstone");
    let secrets = (kept.auth.0.as_str(), kept.headers.0.as_str(), kept.destination.0.as_str());
    assert_eq!((kept.scripts, secrets), (ep.scripts, ("", "", "")));
}

pub async fn an_application_holds_at_most_its_cap_of_endpoints_and_pollers(store: &dyn Store) {
    let (app, _, _) = seeded(store, 0).await;
    assert!(store.insert_endpoint(&endpoint(&app), 2).await.unwrap(), "the second of two");
    assert!(!store.insert_endpoint(&endpoint(&app), 2).await.unwrap(), "a third is refused");
    assert_eq!(store.app_endpoints(&app.id).await.unwrap().len(), 2);
    let other = self::app();
    store.insert_app(&other).await.unwrap();
    assert!(store.insert_endpoint(&endpoint(&other), 2).await.unwrap(), "another application's count is its own");

    let mut first = poller(&app);
    first.uid = None;
    assert!(store.insert_poller(&first, 1).await.unwrap());
    let mut second = poller(&app);
    second.uid = None;
    assert!(!store.insert_poller(&second, 1).await.unwrap());
}

pub async fn claims_are_exclusive(store: &dyn Store) {
    let (_, _, msgs) = seeded(store, 5).await;
    let due = now_ms() + 1000;
    let first = store.claim("a", due, 3).await.unwrap();
    let second = store.claim("b", due, 10).await.unwrap();
    assert_eq!(first.len(), 3);
    assert_eq!(second.len(), 2);
    let mut all: Vec<i64> = first.iter().chain(&second).map(|c| c.delivery_id).collect();
    all.sort();
    let mut expected: Vec<i64> = msgs.iter().map(|(_, d)| *d).collect();
    expected.sort();
    assert_eq!(all, expected, "each delivery claimed exactly once");
    assert!(store.claim("c", due, 10).await.unwrap().is_empty());
    assert_eq!(first[0].message.payload.as_deref(), Some("{}"), "claims carry the payload");
}

pub async fn only_the_claim_holder_records_an_outcome(store: &dyn Store) {
    let (app, ep, msgs) = seeded(store, 1).await;
    let (msg, delivery) = msgs[0].clone();
    store.claim("holder", now_ms() + 1000, 10).await.unwrap();
    let outcome = |delivered| OutcomeRecord {
        delivery_id: delivery,
        message_created_at: now_ms(),
        attempt: Some(attempt(&app, &msg, &ep.id, delivered)),
        attempts: 1,
        next: if delivered { NextState::Delivered } else { NextState::Dead },
    };
    assert_eq!(
        store.record_outcomes("stale", vec![outcome(false)]).await.unwrap()[0],
        Recorded::ClaimLost,
        "a stale worker changes nothing"
    );
    let filter = AttemptFilter {
        app: app.id.clone(),
        msg: Some(msg.clone()),
        endpoint: None,
        status: None,
        status_code_class: None,
        messages: Default::default(),
        with_content: true,
    };
    let page = PageQuery { limit: 10, iterator: None, descending: true };
    assert!(store.list_attempts(&filter, &page).await.unwrap().is_empty(), "and records no attempt");
    assert_eq!(store.record_outcomes("holder", vec![outcome(true)]).await.unwrap()[0], Recorded::Applied);
    let attempts = store.list_attempts(&filter, &page).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].response, "body");
    let views = store.message_deliveries(&msg, &page).await.unwrap();
    assert_eq!(views[0].state, DeliveryState::Delivered);
    // The claim ended with the delivery: a second outcome is refused.
    assert_eq!(store.record_outcomes("holder", vec![outcome(false)]).await.unwrap()[0], Recorded::ClaimLost);
}

pub async fn retries_keep_or_release_the_claim(store: &dyn Store) {
    let (app, ep, msgs) = seeded(store, 2).await;
    store.claim("me", now_ms() + 1000, 10).await.unwrap();
    let retry = |(msg, delivery): (MessageId, i64), keep| OutcomeRecord {
        delivery_id: delivery,
        message_created_at: now_ms(),
        attempt: Some(attempt(&app, &msg, &ep.id, false)),
        attempts: 1,
        next: NextState::Retry { at: now_ms() - 1, keep },
    };
    let applied = store.record_outcomes("me", vec![retry(msgs[0].clone(), true), retry(msgs[1].clone(), false)]);
    assert_eq!(applied.await.unwrap(), vec![Recorded::Applied; 2]);
    let reclaimed = store.claim("other", now_ms() + 1000, 10).await.unwrap();
    assert_eq!(reclaimed.len(), 1, "only the released retry is claimable");
    assert_eq!(reclaimed[0].delivery_id, msgs[1].1);
    assert_eq!(reclaimed[0].attempts, 1);
    assert_eq!(store.release_owner("me").await.unwrap(), 1);
    assert_eq!(store.claim("other", now_ms() + 1000, 10).await.unwrap().len(), 1);
}

/// An ingest claimed by its process at insert time whose answer was lost: giving back that
/// message's deliveries makes them claimable; other owners and messages are untouched.
pub async fn an_uncertain_ingest_gives_its_deliveries_back(store: &dyn Store) {
    let (app, ep, _) = seeded(store, 0).await;
    let second = endpoint(&app);
    assert!(store.insert_endpoint(&second, 1000).await.unwrap());
    let ingest = |owner: &str| {
        let m = message(&app, None);
        let deliveries = [&ep, &second].map(|e| NewDelivery { endpoint: e.id.clone(), strict: false }).to_vec();
        (m.id.clone(), NewMessage { message: m, deliveries, owner: Some(owner.into()), idempotency: None })
    };
    let (lost, new) = ingest("me");
    store.ingest(new).await.unwrap();
    let (kept, new) = ingest("me");
    store.ingest(new).await.unwrap();
    assert!(store.claim("other", now_ms() + 1000, 10).await.unwrap().is_empty(), "claimed at insert time");
    assert_eq!(store.release_message("someone-else", &lost).await.unwrap(), 0, "only the owner's claims");
    assert_eq!(store.release_message("me", &lost).await.unwrap(), 2);
    let claimed = store.claim("other", now_ms() + 1000, 10).await.unwrap();
    assert_eq!(claimed.len(), 2);
    assert!(claimed.iter().all(|c| c.message.id == lost), "the other message stays with its owner");
    assert_eq!(store.release_message("me", &kept).await.unwrap(), 2);
    assert_eq!(store.release_message("me", &kept).await.unwrap(), 0, "nothing twice");
}

pub async fn release_all_frees_every_claim(store: &dyn Store) {
    if store.shared() {
        eprintln!("skipped: on a shared store other processes' claims end by lease expiry, not at start-up");
        return;
    }
    seeded(store, 3).await;
    store.claim("gone", now_ms() + 1000, 10).await.unwrap();
    assert_eq!(store.release_all().await.unwrap(), 3);
    assert_eq!(store.claim("new", now_ms() + 1000, 10).await.unwrap().len(), 3);
}

pub async fn future_work_is_not_claimed_early(store: &dyn Store) {
    let (app, ep, _) = seeded(store, 0).await;
    let m = message(&app, None);
    let new = NewMessage {
        message: m,
        deliveries: vec![NewDelivery { endpoint: ep.id.clone(), strict: false }],
        owner: None,
        idempotency: None,
    };
    store.ingest(new).await.unwrap();
    assert!(store.claim("x", now_ms() - 60_000, 10).await.unwrap().is_empty());
    assert_eq!(store.claim("x", now_ms() + 1000, 10).await.unwrap().len(), 1);
}

pub async fn recover_requeues_only_dead_letters_in_range(store: &dyn Store) {
    let (app, ep, msgs) = seeded(store, 2).await;
    store.claim("me", now_ms() + 1000, 10).await.unwrap();
    for (msg, delivery) in &msgs {
        let record = OutcomeRecord {
            delivery_id: *delivery,
            message_created_at: now_ms(),
            attempt: Some(attempt(&app, msg, &ep.id, false)),
            attempts: 1,
            next: NextState::Dead,
        };
        assert_eq!(store.record_outcomes("me", vec![record]).await.unwrap()[0], Recorded::Applied);
    }
    let none = Requeue::Recover { endpoint: ep.id.clone(), since: now_ms() + 60_000, until: i64::MAX };
    assert_eq!(store.requeue(none).await.unwrap(), 0);
    let all = Requeue::Recover { endpoint: ep.id.clone(), since: now_ms() - 60_000, until: i64::MAX };
    assert_eq!(store.requeue(all).await.unwrap(), 2);
    let claimed = store.claim("me", now_ms() + 1000, 10).await.unwrap();
    assert_eq!(claimed.len(), 2);
    assert!(claimed.iter().all(|c| c.trigger == Trigger::Manual && c.attempts == 0));
}

pub async fn dead_letters_are_listed_with_their_last_attempt_and_replayed_by_id(store: &dyn Store) {
    let (app, ep, msgs) = seeded(store, 3).await;
    store.claim("me", now_ms() + 1000, 10).await.unwrap();
    for (i, (msg, delivery)) in msgs.iter().enumerate() {
        let mut last = attempt(&app, msg, &ep.id, false);
        last.status_code = if i == 0 { 404 } else { 503 };
        let record = OutcomeRecord {
            delivery_id: *delivery,
            message_created_at: now_ms(),
            attempt: Some(last),
            attempts: 2,
            next: NextState::Dead,
        };
        assert_eq!(store.record_outcomes("me", vec![record]).await.unwrap()[0], Recorded::Applied);
    }
    let all =
        DeadLetterFilter { app: Some(app.id.clone()), dead_since: now_ms() - 60_000, limit: 100, ..Default::default() };
    let dead = store.dead_letters(&all).await.unwrap();
    assert_eq!(dead.len(), 3);
    assert!(dead.iter().all(|d| d.endpoint_id == ep.id && d.attempts == 2 && d.event_type == "t"));
    assert!(dead.iter().all(|d| d.error_class.as_deref() == Some("http_status")));
    let not_found = DeadLetterFilter { status_code: Some(404), ..all.clone() };
    let only = store.dead_letters(&not_found).await.unwrap();
    assert_eq!((only.len(), only[0].msg_id.clone()), (1, msgs[0].0.clone()));
    let other_app = DeadLetterFilter { app: Some(AppId::generate()), ..all.clone() };
    assert!(store.dead_letters(&other_app).await.unwrap().is_empty());
    let later = DeadLetterFilter { dead_since: now_ms() + 60_000, ..all.clone() };
    assert!(store.dead_letters(&later).await.unwrap().is_empty());

    let ids: Vec<i64> = store.dead_letters(&not_found).await.unwrap().iter().map(|d| d.delivery_id).collect();
    assert_eq!(store.requeue(Requeue::DeadLetters { ids: ids.clone() }).await.unwrap(), 1);
    assert_eq!(store.requeue(Requeue::DeadLetters { ids }).await.unwrap(), 0, "no longer a dead letter");
    assert_eq!(store.dead_letters(&all).await.unwrap().len(), 2);
    let claimed = store.claim("me", now_ms() + 1000, 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].trigger, Trigger::Manual);
}

pub async fn resend_creates_a_delivery_for_a_new_endpoint(store: &dyn Store) {
    let (app, _, msgs) = seeded(store, 1).await;
    let later = endpoint(&app);
    assert!(store.insert_endpoint(&later, 1000).await.unwrap());
    let resend = Requeue::Resend { app: app.id.clone(), msg: msgs[0].0.clone(), endpoint: later.id.clone() };
    assert_eq!(store.requeue(resend).await.unwrap(), 1);
    let page = PageQuery { limit: 10, iterator: None, descending: false };
    assert_eq!(store.message_deliveries(&msgs[0].0, &page).await.unwrap().len(), 2);
}

/// The resend race: a resend accepted while the delivery is held (its attempt possibly on
/// the wire) must not be swallowed by that attempt's success.
pub async fn a_resend_of_a_held_delivery_outlives_its_attempt(store: &dyn Store) {
    let (app, ep, msgs) = seeded(store, 1).await;
    let (msg, delivery) = msgs[0].clone();
    assert_eq!(store.claim("holder", now_ms() + 1000, 10).await.unwrap().len(), 1);
    let resend = Requeue::Resend { app: app.id.clone(), msg: msg.clone(), endpoint: ep.id.clone() };
    assert_eq!(store.requeue(resend).await.unwrap(), 1);
    assert!(store.claim("other", now_ms() + 1000, 10).await.unwrap().is_empty(), "still held");
    let success = delivered(&app, &msg, &ep.id, delivery);
    assert_eq!(store.record_outcomes("holder", vec![success]).await.unwrap(), vec![Recorded::Resent]);
    let page = PageQuery { limit: 10, iterator: None, descending: true };
    let filter = AttemptFilter {
        app: app.id.clone(),
        msg: Some(msg.clone()),
        endpoint: None,
        status: None,
        status_code_class: None,
        messages: Default::default(),
        with_content: false,
    };
    assert_eq!(store.list_attempts(&filter, &page).await.unwrap().len(), 1, "the attempt is recorded");
    let views = store.message_deliveries(&msg, &page).await.unwrap();
    assert_eq!((views[0].state, views[0].attempts), (DeliveryState::Pending, 0), "pending, fresh budget");
    let again = store.claim("other", now_ms() + 1000, 10).await.unwrap();
    assert_eq!(again.len(), 1, "claimable by anyone");
    assert_eq!(again[0].trigger, Trigger::Manual);
    // The claim cleared the mark: this attempt started after the request and settles it.
    let success = delivered(&app, &msg, &ep.id, delivery);
    assert_eq!(store.record_outcomes("other", vec![success]).await.unwrap(), vec![Recorded::Applied]);
    let views = store.message_deliveries(&msg, &page).await.unwrap();
    assert_eq!(views[0].state, DeliveryState::Delivered);
}

/// A resend of a delivery nobody holds (delivered, dead, or waiting in the store) makes it
/// due at once with a fresh budget.
pub async fn a_resend_of_a_settled_delivery_is_due_at_once(store: &dyn Store) {
    let (app, ep, msgs) = seeded(store, 1).await;
    let (msg, delivery) = msgs[0].clone();
    store.claim("me", now_ms() + 1000, 10).await.unwrap();
    let done = delivered(&app, &msg, &ep.id, delivery);
    assert_eq!(store.record_outcomes("me", vec![done]).await.unwrap(), vec![Recorded::Applied]);
    let resend = Requeue::Resend { app: app.id.clone(), msg: msg.clone(), endpoint: ep.id.clone() };
    assert_eq!(store.requeue(resend).await.unwrap(), 1);
    let claimed = store.claim("me", now_ms() + 1000, 10).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!((claimed[0].attempts, claimed[0].trigger), (0, Trigger::Manual));
}

pub async fn sessions_are_found_by_hash_and_ended_every_way(store: &dyn Store) {
    let (app, _, _) = seeded(store, 0).await;
    let session = |hash: &str, app_id: Option<AppId>, expires_at| Session {
        hash: hash.into(),
        id: format!("ses_{hash}"),
        app_id,
        token_hash: "t".into(),
        created_at: now_ms(),
        expires_at,
    };
    let later = now_ms() + 60_000;
    let operator = session("h1", None, later);
    let customer = session("h2", Some(app.id.clone()), later);
    let expired = session("h3", Some(app.id.clone()), now_ms() - 1);
    for s in [&operator, &customer, &expired] {
        store.insert_session(s).await.unwrap();
    }
    assert_eq!(store.session("h2").await.unwrap(), Some(customer.clone()));
    assert_eq!(store.session("nope").await.unwrap(), None);
    assert_eq!(store.list_sessions(None).await.unwrap().len(), 3);
    assert_eq!(store.list_sessions(Some(&app.id)).await.unwrap().len(), 2);
    assert_eq!(store.end_sessions(EndSessions::ExpiredBefore(now_ms())).await.unwrap(), 1);
    assert_eq!(store.end_sessions(EndSessions::Id("ses_h1".into())).await.unwrap(), 1);
    assert_eq!(store.session("h1").await.unwrap(), None);
    assert_eq!(store.end_sessions(EndSessions::App(app.id.clone())).await.unwrap(), 1);
    store.insert_session(&operator).await.unwrap();
    assert_eq!(store.end_sessions(EndSessions::Hash("h1".into())).await.unwrap(), 1);
    store.insert_session(&operator).await.unwrap();
    assert_eq!(store.end_sessions(EndSessions::All).await.unwrap(), 1);
    assert!(store.list_sessions(None).await.unwrap().is_empty());
}

/// A message to `ep` of `app` under `key`, whose kept answer is `body`.
fn keyed_message(app: &App, ep: &Endpoint, key: &str, body: &str) -> NewMessage {
    NewMessage {
        message: message(app, None),
        deliveries: vec![NewDelivery { endpoint: ep.id.clone(), strict: false }],
        owner: None,
        idempotency: Some(IdempotencyRecord {
            scope: format!("msg:{}", app.id),
            key: key.into(),
            response: StoredResponse { status: 202, body: body.into(), created_at: now_ms() },
        }),
    }
}

pub async fn idempotency_keys_replay_and_expire(store: &dyn Store) {
    let (app, ep, _) = seeded(store, 0).await;
    let new = || keyed_message(&app, &ep, "k1", "{\"id\":1}");
    let record = new().idempotency.expect("keyed");
    assert!(matches!(store.ingest(new()).await.unwrap(), IngestResult::Created { .. }));
    match store.ingest(new()).await.unwrap() {
        IngestResult::Replayed(stored) => {
            assert_eq!((stored.status, &stored.body), (record.response.status, &record.response.body))
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    assert_eq!(store.prune_idempotency(now_ms() - 60_000, 10).await.unwrap(), 0);
    assert_eq!(store.prune_idempotency(now_ms() + 1, 10).await.unwrap(), 1);
    assert!(store.idempotent_response(&record.scope, "k1").await.unwrap().is_none());
}

/// Ingests with one key at once (as a writer's batch takes them), bypassing the API's lock
/// per key: one creates its message, every other replays its answer.
pub async fn concurrent_ingests_with_one_key_create_one_message(store: &dyn Store) {
    let (app, ep, _) = seeded(store, 0).await;
    let record = keyed_message(&app, &ep, "together", "first").idempotency.expect("keyed");
    let ingests = (0..12).map(|_| store.ingest(keyed_message(&app, &ep, "together", "first")));
    let (mut created, mut replayed) = (0, 0);
    for result in futures_util::future::join_all(ingests).await {
        match result.unwrap() {
            IngestResult::Created { .. } => created += 1,
            IngestResult::Replayed(stored) => {
                assert_eq!((stored.status, &stored.body), (record.response.status, &record.response.body));
                replayed += 1;
            }
            other => panic!("expected a creation or a replay, got {other:?}"),
        }
    }
    assert_eq!((created, replayed), (1, 11));
    let page = PageQuery { limit: 20, iterator: None, descending: true };
    assert_eq!(store.list_messages(&app.id, &MessageFilter::default(), &page).await.unwrap().len(), 1);
}

pub async fn a_repeated_event_id_is_refused(store: &dyn Store) {
    let (app, ep, _) = seeded(store, 0).await;
    let new = |m: Message| NewMessage {
        message: m,
        deliveries: vec![NewDelivery { endpoint: ep.id.clone(), strict: false }],
        owner: None,
        idempotency: None,
    };
    store.ingest(new(message(&app, Some("evt")))).await.unwrap();
    assert_eq!(store.ingest(new(message(&app, Some("evt")))).await.unwrap(), IngestResult::DuplicateEventId);
    let other = self::app();
    store.insert_app(&other).await.unwrap();
    assert!(matches!(store.ingest(new(message(&other, Some("evt")))).await.unwrap(), IngestResult::Created { .. }));
}

pub async fn deleting_an_endpoint_cancels_its_pending_deliveries(store: &dyn Store) {
    let (app, ep, msgs) = seeded(store, 2).await;
    store.delete_endpoint(&app.id, &ep.id).await.unwrap();
    assert!(store.claim("x", now_ms() + 1000, 10).await.unwrap().is_empty());
    let stats = store.endpoint_stats(&ep.id, None, None).await.unwrap();
    assert_eq!(stats.canceled, msgs.len() as u64);
}

/// An attempt that was on the wire when its endpoint was deleted: its failure, recorded
/// after the deletion, leaves nothing pending or awaiting a retry (on SQLite a delivery held
/// in memory has no row for the deletion to cancel until this outcome makes one).
pub async fn an_outcome_recorded_after_its_endpoint_was_deleted_leaves_nothing_pending(store: &dyn Store) {
    let app = app();
    store.insert_app(&app).await.unwrap();
    let ep = endpoint(&app);
    assert!(store.insert_endpoint(&ep, 1000).await.unwrap());
    let mut outcomes = vec![];
    for keep in [true, false] {
        let (m, delivery) = ingest_one(store, &app, &ep, Some("holder")).await;
        outcomes.push(OutcomeRecord {
            delivery_id: delivery,
            message_created_at: m.created_at,
            attempt: Some(attempt(&app, &m.id, &ep.id, false)),
            attempts: 1,
            next: NextState::Retry { at: now_ms() + 600_000, keep },
        });
    }
    store.delete_endpoint(&app.id, &ep.id).await.unwrap();
    store.record_outcomes("holder", outcomes).await.unwrap();
    let summary = store.summary(now_ms()).await.unwrap();
    assert_eq!((summary.pending, summary.awaiting_retry, summary.oldest_pending_at), (0, 0, None));
    assert!(store.claim("x", now_ms() + 1_000_000, 10).await.unwrap().is_empty());
}

pub async fn expired_leases_pass_to_others_and_the_stale_owner_records_nothing(store: &dyn Store) {
    if !store.shared() {
        eprintln!("skipped: this backend serves one process, so no lease can expire under a live one");
        return;
    }
    let (app, ep, msgs) = seeded(store, 2).await;
    store.register_node("stale").await.unwrap();
    assert_eq!(store.claim("stale", now_ms() + 1000, 10).await.unwrap().len(), 2);
    // Wide margins: "alive" must stay younger than the lease even if this loaded machine
    // pauses the test for a second between registering it and reaping.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    store.register_node("alive").await.unwrap();
    assert_eq!(store.reap_expired(std::time::Duration::from_millis(1500)).await.unwrap(), 2);
    assert!(!store.heartbeat("stale").await.unwrap(), "the stale node learns it lost its lease");
    assert!(store.heartbeat("alive").await.unwrap());
    assert_eq!(store.claim("alive", now_ms() + 1000, 10).await.unwrap().len(), 2);
    let (msg, delivery) = msgs[0].clone();
    let late = OutcomeRecord {
        delivery_id: delivery,
        message_created_at: now_ms(),
        attempt: Some(attempt(&app, &msg, &ep.id, true)),
        attempts: 1,
        next: NextState::Delivered,
    };
    assert_eq!(store.record_outcomes("stale", vec![late]).await.unwrap(), vec![Recorded::ClaimLost]);
}

pub async fn strictly_ordered_endpoints_release_one_head_at_a_time(store: &dyn Store) {
    let (app, ep, _) = seeded(store, 0).await;
    let mut deliveries = vec![];
    for _ in 0..3 {
        let m = message(&app, None);
        let strict = vec![NewDelivery { endpoint: ep.id.clone(), strict: true }];
        // Even when the ingesting process asks to own them, strict deliveries wait their turn.
        let new =
            NewMessage { message: m.clone(), deliveries: strict, owner: Some("ingester".into()), idempotency: None };
        let IngestResult::Created { deliveries: ids } = store.ingest(new).await.unwrap() else { panic!("not created") };
        deliveries.push((m, ids[0]));
    }
    let due = now_ms() + 1000;
    assert!(store.claim("a", due, 10).await.unwrap().is_empty(), "strict deliveries are never claimed in bulk");
    let head = store.claim_heads("a", due, 10).await.unwrap();
    assert_eq!(head.iter().map(|c| c.delivery_id).collect::<Vec<_>>(), vec![deliveries[0].1]);
    assert!(store.claim_heads("b", due, 10).await.unwrap().is_empty(), "a held head blocks the endpoint");
    let retry = OutcomeRecord {
        delivery_id: deliveries[0].1,
        message_created_at: deliveries[0].0.created_at,
        attempt: Some(attempt(&app, &deliveries[0].0.id, &ep.id, false)),
        attempts: 1,
        next: NextState::Retry { at: now_ms() + 60_000, keep: false },
    };
    assert_eq!(store.record_outcomes("a", vec![retry]).await.unwrap()[0], Recorded::Applied);
    assert!(store.claim_heads("b", due, 10).await.unwrap().is_empty(), "a head waiting for its retry still blocks");
    let later = store.claim_heads("b", now_ms() + 120_000, 10).await.unwrap();
    assert_eq!(later[0].delivery_id, deliveries[0].1, "the same head comes back when due");
    let done = OutcomeRecord {
        delivery_id: deliveries[0].1,
        message_created_at: deliveries[0].0.created_at,
        attempt: Some(attempt(&app, &deliveries[0].0.id, &ep.id, true)),
        attempts: 2,
        next: NextState::Delivered,
    };
    assert_eq!(store.record_outcomes("b", vec![done]).await.unwrap()[0], Recorded::Applied);
    let next = store.claim_heads("b", due, 10).await.unwrap();
    assert_eq!(next.iter().map(|c| c.delivery_id).collect::<Vec<_>>(), vec![deliveries[1].1], "then the next in line");
}

pub async fn breakers_and_latency_survive_in_the_store(store: &dyn Store) {
    let (_, ep, _) = seeded(store, 0).await;
    let settings = crate::breaker::BreakerSettings { failure_threshold: 1, ..Default::default() };
    let mut breaker = crate::breaker::Breaker::new(&settings);
    breaker.record(false, false, 1_000, &settings);
    store.save_breaker(&ep.id, Some(&breaker)).await.unwrap();
    assert_eq!(store.breakers().await.unwrap(), vec![(ep.id.clone(), breaker.clone())]);
    store.save_breaker(&ep.id, None).await.unwrap();
    assert!(store.breakers().await.unwrap().is_empty());

    let histogram = |values: &[f64]| {
        let mut h = crate::latency::Histogram::default();
        values.iter().for_each(|v| h.record(*v));
        h
    };
    let other = EndpointId::generate();
    store
        .merge_latency(vec![(ep.id.clone(), 10, histogram(&[5.0, 7.0])), (other.clone(), 11, histogram(&[1.0]))])
        .await
        .unwrap();
    store.merge_latency(vec![(ep.id.clone(), 10, histogram(&[9.0]))]).await.unwrap();
    let mine = store.latency_since(10, Some(std::slice::from_ref(&ep.id))).await.unwrap();
    assert_eq!(mine.len(), 1);
    let both = [ep.id.clone(), other.clone()];
    assert_eq!(store.latency_since(10, Some(&both)).await.unwrap().len(), 2, "a list of endpoints");
    assert!(store.latency_since(10, Some(&[])).await.unwrap().is_empty(), "an empty list is none");
    assert_eq!((mine[0].1, mine[0].2.count()), (10, 3), "deltas of one hour are merged");
    assert_eq!(store.latency_since(11, None).await.unwrap().len(), 1, "older hours are left out");
    assert_eq!(store.prune_health(11 * 3_600_000).await.unwrap(), 1);
    assert!(store.latency_since(0, Some(std::slice::from_ref(&ep.id))).await.unwrap().is_empty());
}

pub async fn the_summary_counts_queue_states_and_the_last_hour(store: &dyn Store) {
    let (app, ep, msgs) = seeded(store, 4).await;
    let empty = store.summary(now_ms()).await.unwrap();
    assert_eq!((empty.pending, empty.awaiting_retry, empty.dead, empty.delivered_last_hour), (4, 0, 0, 0));
    assert!(empty.oldest_pending_at.is_some());
    store.claim("me", now_ms() + 1000, 10).await.unwrap();
    let record = |(msg, delivery): &(MessageId, i64), delivered: bool, next: NextState| OutcomeRecord {
        delivery_id: *delivery,
        message_created_at: now_ms() - 40,
        attempt: Some(attempt(&app, msg, &ep.id, delivered)),
        attempts: 1,
        next,
    };
    let outcomes = vec![
        record(&msgs[0], true, NextState::Delivered),
        record(&msgs[1], false, NextState::Retry { at: now_ms() + 60_000, keep: false }),
        record(&msgs[2], false, NextState::Dead),
    ];
    assert_eq!(store.record_outcomes("me", outcomes).await.unwrap(), vec![Recorded::Applied; 3]);
    let summary = store.summary(now_ms()).await.unwrap();
    assert_eq!((summary.pending, summary.awaiting_retry, summary.dead), (1, 1, 1));
    assert_eq!((summary.delivered_last_hour, summary.failed_last_hour), (1, 2));
    assert!((40..1000).contains(&summary.delivery_ms_last_hour), "{}", summary.delivery_ms_last_hour);
    let later = store.summary(now_ms() + 2 * 3_600_000).await.unwrap();
    assert_eq!((later.delivered_last_hour, later.failed_last_hour), (0, 0), "only the last hour counts");
}

pub async fn the_history_adds_up_per_minute_and_hour_and_logs_breakers(store: &dyn Store) {
    let (app, ep, msgs) = seeded(store, 3).await;
    let minute = now_ms().div_euclid(60_000);
    store.add_accepted(vec![(minute - 1, 2), (minute, 3)]).await.unwrap();
    store.add_accepted(vec![(minute, 1)]).await.unwrap();
    store.sample_queue(minute, 7, 2).await.unwrap();
    store.sample_queue(minute, 4, 1).await.unwrap();
    store.claim("me", now_ms() + 1000, 10).await.unwrap();
    let record = |(msg, delivery): &(MessageId, i64), delivered: bool, next: NextState| OutcomeRecord {
        delivery_id: *delivery,
        message_created_at: now_ms(),
        attempt: Some(attempt(&app, msg, &ep.id, delivered)),
        attempts: 1,
        next,
    };
    let outcomes = vec![
        record(&msgs[0], true, NextState::Delivered),
        record(&msgs[1], false, NextState::Retry { at: now_ms() + 60_000, keep: false }),
        record(&msgs[2], false, NextState::Dead),
    ];
    store.record_outcomes("me", outcomes).await.unwrap();
    let totals = store.minute_totals(minute - 1).await.unwrap();
    let earlier = totals.iter().find(|t| t.minute == minute - 1).unwrap();
    assert_eq!((earlier.accepted, earlier.queue), (2, None));
    let now = totals.iter().find(|t| t.minute == minute).expect("this minute");
    assert_eq!((now.accepted, now.delivered, now.failed, now.dead), (4, 1, 2, 1), "{now:?}");
    assert_eq!(now.queue, Some((7, 2)), "the deepest sample of the minute stays");
    assert!(store.minute_totals(minute + 1).await.unwrap().is_empty());

    let hour = now_ms().div_euclid(3_600_000);
    let other = EndpointId::generate();
    let hours = store.endpoint_hours(hour - 1, &[ep.id.clone(), other]).await.unwrap();
    assert_eq!(hours, vec![(ep.id.clone(), hour, HourCounts { succeeded: 1, failed: 2 })]);
    assert!(store.endpoint_hours(hour + 1, std::slice::from_ref(&ep.id)).await.unwrap().is_empty());

    let event = |at, kind| BreakerEvent { at, kind, failures: 3, cooldown_ms: 300_000 };
    store.log_breaker(&ep.id, &event(1_000, BreakerEventKind::Opened)).await.unwrap();
    store.log_breaker(&ep.id, &event(2_000, BreakerEventKind::RetryNow)).await.unwrap();
    store.log_breaker(&ep.id, &event(3_000, BreakerEventKind::Reset)).await.unwrap();
    let log = store.breaker_events(&ep.id, 0, 2).await.unwrap();
    assert_eq!(log, vec![event(3_000, BreakerEventKind::Reset), event(2_000, BreakerEventKind::RetryNow)]);
    assert_eq!(store.breaker_events(&ep.id, 1_500, 10).await.unwrap().len(), 2, "only from `since` on");
    store.prune_health(2_500).await.unwrap();
    assert_eq!(store.breaker_events(&ep.id, 0, 10).await.unwrap(), vec![event(3_000, BreakerEventKind::Reset)]);
}

pub async fn the_operator_finds_messages_applications_and_endpoints(store: &dyn Store) {
    let mut shop = app();
    shop.name = "Acme 100% Shop".into();
    shop.uid = Some("acme-shop".into());
    store.insert_app(&shop).await.unwrap();
    let mut ep = endpoint(&shop);
    ep.url = "https://hooks.acme.example/in_bound".into();
    assert!(store.insert_endpoint(&ep, 1000).await.unwrap());
    let other = app();
    store.insert_app(&other).await.unwrap();
    let mut found_ids = vec![];
    for (owner, event_id) in [(&shop, "evt-1"), (&other, "evt-1"), (&other, "evt-2")] {
        let m = message(owner, Some(event_id));
        let new = NewMessage { message: m.clone(), deliveries: vec![], owner: None, idempotency: None };
        store.ingest(new).await.unwrap();
        found_ids.push(m.id);
    }
    let by_event = store.find_messages("evt-1", 10).await.unwrap();
    let mut ids: Vec<_> = by_event.iter().map(|m| m.id.clone()).collect();
    ids.sort();
    assert_eq!(ids, vec![found_ids[0].clone(), found_ids[1].clone()], "both applications' evt-1");
    let by_id = store.find_messages(found_ids[2].as_str(), 10).await.unwrap();
    assert_eq!(by_id.iter().map(|m| &m.id).collect::<Vec<_>>(), vec![&found_ids[2]]);
    assert!(store.find_messages("nope", 10).await.unwrap().is_empty());

    let (apps, endpoints) = store.search_catalog("ACME", 10).await.unwrap();
    assert_eq!((apps.len(), endpoints.len()), (1, 1), "names and URLs match in any case");
    assert_eq!(store.search_catalog("acme-shop", 10).await.unwrap().0[0].id, shop.id, "a uid matches");
    assert_eq!(store.search_catalog("100%", 10).await.unwrap().0.len(), 1);
    assert!(store.search_catalog("10_%", 10).await.unwrap().0.is_empty(), "wildcards are literal");
    assert_eq!(store.search_catalog("in_bound", 10).await.unwrap().1.len(), 1);
}

pub async fn an_applications_portal_tokens_expire_together(store: &dyn Store) {
    let (app, _, _) = seeded(store, 0).await;
    let (other, _, _) = seeded(store, 0).await;
    let now = now_ms();
    let token = |app: &App, hash: &str, expires_at| PortalToken {
        hash: hash.into(),
        app_id: app.id.clone(),
        expires_at,
        created_at: now,
        sensitive: false,
        feature_flags: vec!["beta".into(), hash.into()],
    };
    for t in [token(&app, "a1", now + 60_000), token(&app, "a2", now + 120_000), token(&other, "b1", now + 60_000)] {
        store.insert_token(&t).await.unwrap();
    }
    assert_eq!(store.app_tokens(&app.id, now).await.unwrap().len(), 2);
    assert_eq!(store.expire_tokens(&app.id, now + 30_000).await.unwrap(), 2);
    let a2 = store.token("a2").await.unwrap().unwrap();
    assert_eq!((a2.expires_at, a2.feature_flags), (now + 30_000, vec!["beta".to_owned(), "a2".to_owned()]));
    assert_eq!(store.expire_tokens(&app.id, now + 90_000).await.unwrap(), 0, "never extended");
    assert!(store.app_tokens(&app.id, now + 30_000).await.unwrap().is_empty());
    assert_eq!(store.token("b1").await.unwrap().unwrap().expires_at, now + 60_000, "another application's stay");
}

/// Instantiates every case as a `#[tokio::test]` against the store `$make` builds.
fn poller(app: &App) -> Poller {
    Poller {
        id: crate::ids::PollerId::generate(),
        app_id: app.id.clone(),
        uid: Some("nightly-batch".into()),
        description: "the nightly batch".into(),
        event_types: Some(vec!["invoice.paid".into()]),
        channels: None,
        filter: Some(".payload.amount > 1".into()),
        metadata: Default::default(),
        created_at: now_ms(),
        updated_at: now_ms(),
    }
}

pub async fn a_poller_reads_back_as_written_and_its_consumers_keep_their_places(store: &dyn Store) {
    let app = app();
    store.insert_app(&app).await.unwrap();
    let mut p = poller(&app);
    assert!(store.insert_poller(&p, 100).await.unwrap());
    assert_eq!(store.poller(&app.id, p.id.as_str()).await.unwrap().as_ref(), Some(&p));
    assert_eq!(store.poller(&app.id, "nightly-batch").await.unwrap().as_ref(), Some(&p), "by uid");
    let mut twin = poller(&app);
    twin.id = crate::ids::PollerId::generate();
    assert!(
        matches!(store.insert_poller(&twin, 100).await, Err(StoreError::Conflict(_))),
        "a uid once per application"
    );
    p.description = "changed".into();
    p.channels = Some(vec!["eu".into()]);
    p.filter = None;
    let read_at = bump(&mut p.updated_at);
    assert!(store.update_poller(&p, read_at).await.unwrap());
    assert_eq!(store.poller(&app.id, p.id.as_str()).await.unwrap().as_ref(), Some(&p));
    assert_eq!(
        store.list_pollers(&app.id, &PageQuery { limit: 10, iterator: None, descending: false }).await.unwrap(),
        vec![p.clone()]
    );

    assert_eq!(store.consumer_position(&p.id, "a").await.unwrap(), None);
    let at = LogPosition { major: 7, minor: "msg_x".into() };
    assert!(store.move_consumer(&p.id, "a", &at, Move::Forward, 2).await.unwrap());
    assert!(store.move_consumer(&p.id, "b", &LogPosition::default(), Move::Forward, 2).await.unwrap());
    assert!(!store.move_consumer(&p.id, "c", &at, Move::Forward, 2).await.unwrap(), "a third consumer of two");
    assert_eq!(store.consumer_position(&p.id, "c").await.unwrap(), None);
    let kept = store.consumer_position(&p.id, "a").await.unwrap().unwrap();
    assert_eq!(kept.major, 7, "each consumer its own place");
    assert_eq!(store.consumer_position(&p.id, "b").await.unwrap().unwrap().major, 0);
    let back = LogPosition { major: 3, minor: "msg_x".into() };
    assert!(store.move_consumer(&p.id, "a", &back, Move::Forward, 2).await.unwrap());
    assert_eq!(
        store.consumer_position(&p.id, "a").await.unwrap().unwrap().major,
        7,
        "an acknowledgement never moves back"
    );
    assert!(store.move_consumer(&p.id, "a", &back, Move::To, 2).await.unwrap());
    assert_eq!(store.consumer_position(&p.id, "a").await.unwrap().unwrap().major, 3, "a seek does");
    let listed = store.consumers(&p.id, 10).await.unwrap();
    let mut names: Vec<&str> = listed.iter().map(|c| c.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["a", "b"]);
    assert!(listed.iter().all(|c| c.moved_at > 0));
    assert_eq!(store.consumers(&p.id, 1).await.unwrap().len(), 1, "bounded");
    store.delete_poller(&app.id, &p.id).await.unwrap();
    assert_eq!(store.poller(&app.id, p.id.as_str()).await.unwrap(), None);
    assert_eq!(store.consumer_position(&p.id, "a").await.unwrap(), None, "its consumers go with it");
}

pub async fn a_messages_trace_context_comes_back_wherever_it_is_read(store: &dyn Store) {
    let app = app();
    store.insert_app(&app).await.unwrap();
    let ep = endpoint(&app);
    assert!(store.insert_endpoint(&ep, 1000).await.unwrap());
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let traced = Message { trace: crate::traceparent::parse_traceparent(traceparent), ..message(&app, None) };
    for m in [&traced, &message(&app, None)] {
        let deliveries = vec![NewDelivery { endpoint: ep.id.clone(), strict: false }];
        let new = NewMessage { message: m.clone(), deliveries, owner: None, idempotency: None };
        store.ingest(new).await.unwrap();
    }
    let stored = |m: &Message| m.trace.as_ref().map(crate::traceparent::format_traceparent);
    let read = store.message(&app.id, traced.id.as_str()).await.unwrap().unwrap();
    assert_eq!(stored(&read).as_deref(), Some(traceparent));
    let claimed = store.claim("a", now_ms() + 1000, 10).await.unwrap();
    let by_id = |id: &MessageId| claimed.iter().find(|c| &c.message.id == id).unwrap().message.clone();
    assert_eq!(stored(&by_id(&traced.id)).as_deref(), Some(traceparent), "claims carry it to any process");
    let log = store.messages_after(&app.id, &LogPosition::default(), 10).await.unwrap();
    let traces: Vec<Option<String>> = log.iter().map(|(_, m)| stored(m)).collect();
    assert_eq!(traces, [Some(traceparent.to_owned()), None], "none stays none");
}

pub async fn an_applications_log_reads_in_commit_order_from_any_position(store: &dyn Store) {
    let (app, _, sent) = seeded(store, 5).await;
    let (other, _, _) = seeded(store, 2).await;
    let all = store.messages_after(&app.id, &LogPosition::default(), 100).await.unwrap();
    let ids: Vec<_> = all.iter().map(|(_, m)| m.id.clone()).collect();
    assert_eq!(ids, sent.iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(), "this application's, in order");
    assert!(all.iter().all(|(_, m)| m.payload.is_some()));
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0), "positions increase");
    let page = store.messages_after(&app.id, &all[1].0, 2).await.unwrap();
    assert_eq!(page.iter().map(|(_, m)| &m.id).collect::<Vec<_>>(), [&ids[2], &ids[3]], "after a position");
    assert!(store.messages_after(&app.id, &all[4].0, 10).await.unwrap().is_empty());
    assert_eq!(store.message_position(&app.id, &ids[2]).await.unwrap(), Some(all[2].0.clone()));
    assert_eq!(store.message_position(&other.id, &ids[2]).await.unwrap(), None, "another application's");
    let from_start = store.position_at(&app.id, 0).await.unwrap();
    let read = store.messages_after(&app.id, &from_start, 100).await.unwrap();
    assert_eq!(read.len(), 5, "a time before everything: from the start");
    let future = store.position_at(&app.id, now_ms() + 60_000).await.unwrap();
    assert!(store.messages_after(&app.id, &future, 100).await.unwrap().is_empty(), "a time after everything");
}

/// Large payloads are packed at rest where the backend packs them (`store::packing`): every
/// read gives back the very text that was sent, and expunging or purging one leaves nothing.
pub async fn a_large_payload_reads_back_unchanged_and_is_expunged_and_purged(store: &dyn Store) {
    let app = app();
    store.insert_app(&app).await.unwrap();
    let ep = endpoint(&app);
    assert!(store.insert_endpoint(&ep, 1000).await.unwrap());
    let large: Arc<str> = Arc::from(format!(
        r#"{{"type":"invoice.paid","lines":[{}]}}"#,
        (0..40)
            .map(|i| format!(r#"{{"id":"il_{i:06}","amount":{},"currency":"eur"}}"#, i * 131))
            .collect::<Vec<_>>()
            .join(",")
    ));
    let mut sent = Vec::new();
    for payload in [large.clone(), Arc::from(r#"{"small":true}"#), large.clone()] {
        let m = Message { payload: Some(payload), ..message(&app, None) };
        let deliveries = vec![NewDelivery { endpoint: ep.id.clone(), strict: false }];
        store.ingest(NewMessage { message: m.clone(), deliveries, owner: None, idempotency: None }).await.unwrap();
        sent.push(m);
    }
    let payloads = |read: Vec<&Message>| read.iter().map(|m| m.payload.clone()).collect::<Vec<_>>();
    let expected: Vec<_> = sent.iter().map(|m| m.payload.clone()).collect();
    let by_id = store.message(&app.id, sent[0].id.as_str()).await.unwrap().unwrap();
    assert_eq!(by_id.payload, expected[0], "read by id");
    let page = PageQuery { limit: 10, iterator: None, descending: false };
    let listed = store.list_messages(&app.id, &Default::default(), &page).await.unwrap();
    assert_eq!(payloads(listed.iter().collect()), expected, "listed");
    let log = store.messages_after(&app.id, &LogPosition::default(), 10).await.unwrap();
    assert_eq!(payloads(log.iter().map(|(_, m)| m).collect()), expected, "read by a poller");
    let claimed = store.claim("a", now_ms() + 1000, 10).await.unwrap();
    let mut claimed_payloads: Vec<_> =
        claimed.iter().map(|c| (c.message.id.clone(), c.message.payload.clone())).collect();
    claimed_payloads.sort();
    let mut expected_claims: Vec<_> = sent.iter().map(|m| (m.id.clone(), m.payload.clone())).collect();
    expected_claims.sort();
    assert_eq!(claimed_payloads, expected_claims, "claimed for delivery");

    assert!(store.expunge_message(&app.id, &sent[0].id).await.unwrap());
    let expunged = store.message(&app.id, sent[0].id.as_str()).await.unwrap().unwrap();
    assert_eq!(expunged.payload, None, "expunged");
    let outcomes = claimed.iter().map(|c| delivered(&app, &c.message.id, &ep.id, c.delivery_id)).collect();
    store.record_outcomes("a", outcomes).await.unwrap();
    assert_eq!(store.purge(Purge::Payloads, now_ms() + 60_000, 100).await.unwrap(), 2, "the other two purged");
    let purged = store.message(&app.id, sent[2].id.as_str()).await.unwrap().unwrap();
    assert_eq!(purged.payload, None, "purged");
}

#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!(@cases $make;
            an_application_reads_back_as_written,
            an_endpoint_reads_back_as_written_and_its_tombstone_keeps_no_credentials,
            a_write_from_a_stale_read_changes_nothing,
            an_application_holds_at_most_its_cap_of_endpoints_and_pollers,
            claims_are_exclusive,
            only_the_claim_holder_records_an_outcome,
            retries_keep_or_release_the_claim,
            an_uncertain_ingest_gives_its_deliveries_back,
            release_all_frees_every_claim,
            future_work_is_not_claimed_early,
            recover_requeues_only_dead_letters_in_range,
            dead_letters_are_listed_with_their_last_attempt_and_replayed_by_id,
            resend_creates_a_delivery_for_a_new_endpoint,
            a_resend_of_a_held_delivery_outlives_its_attempt,
            a_resend_of_a_settled_delivery_is_due_at_once,
            sessions_are_found_by_hash_and_ended_every_way,
            idempotency_keys_replay_and_expire,
            concurrent_ingests_with_one_key_create_one_message,
            a_repeated_event_id_is_refused,
            deleting_an_endpoint_cancels_its_pending_deliveries,
            an_outcome_recorded_after_its_endpoint_was_deleted_leaves_nothing_pending,
            expired_leases_pass_to_others_and_the_stale_owner_records_nothing,
            strictly_ordered_endpoints_release_one_head_at_a_time,
            breakers_and_latency_survive_in_the_store,
            the_summary_counts_queue_states_and_the_last_hour,
            the_history_adds_up_per_minute_and_hour_and_logs_breakers,
            the_operator_finds_messages_applications_and_endpoints,
            an_applications_portal_tokens_expire_together,
            a_poller_reads_back_as_written_and_its_consumers_keep_their_places,
            an_applications_log_reads_in_commit_order_from_any_position,
            a_messages_trace_context_comes_back_wherever_it_is_read,
            a_large_payload_reads_back_unchanged_and_is_expunged_and_purged,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                let fixture = $make.await;
                $crate::store::conformance::$case(fixture.store()).await;
            }
        )*
    };
}
