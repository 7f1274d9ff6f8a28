//! The fault-injection harness: real `herald serve` processes on real storage, a producer
//! that logs every ingest as ok, failed or unknown, an operator who resends delivered
//! messages now and then, recording receivers, and a seeded schedule of faults. After the
//! faults it heals everything, retries the ingests whose outcome is unknown with their
//! idempotency keys, waits for the backlog to drain, and checks the invariants (see
//! `invariants.rs`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::proxy::{Mode, Proxy};
use super::schedule::{Fault, Step, schedule};
use crate::support::lock::StoreLock;
use crate::support::process::Process;
use crate::support::server::{ADMIN_TOKEN, Backend, Storage};
use crate::support::{Receiver, Reply};

/// The endpoints every message but a poisoned one must reach (a budget of retries no fault
/// of the schedule can exhaust).
pub const ENDPOINTS: [&str; 3] = ["/e0", "/e1", "/e2"];
/// The endpoint of the poisoned messages (every attempt panics inside Herald): each must
/// become a dead letter there, after a short budget.
pub const POISON_PATH: &str = "/poison";
/// An endpoint that answers 410 Gone: every `order.refunded` message sent to it must become
/// a dead letter at once.
pub const GONE_PATH: &str = "/gone";
/// Attempts in flight per application and process.
pub const APP_CAP: usize = 8;
pub const LEASE: Duration = Duration::from_secs(2);
/// The shutdown grace period: SIGTERM must end in exit 0 within it.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// Every endpoint's attempt timeout.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(1);
/// One message in this many is poison (every attempt of it panics inside Herald).
const POISON_EVERY: usize = 250;
/// One message in this many is an `order.refunded`, which also goes to the 410 endpoint.
const REFUND_EVERY: usize = 50;
/// How often the operator resends a delivered message, while the producer runs.
const RESEND_EVERY: Duration = Duration::from_millis(1500);

#[derive(Debug, Clone)]
pub struct Plan {
    pub backend: Backend,
    pub seed: u64,
    pub messages: usize,
    pub fault_time: Duration,
}

/// What the producer knows about each ingest, by idempotency key.
#[derive(Default)]
pub struct Ledger {
    /// Every message id a key was answered with (more than one would break I4).
    pub ids: HashMap<String, HashSet<String>>,
    /// When each message id was first accepted.
    pub accepted_at: HashMap<String, Instant>,
    /// Keys whose outcome is not a 202 yet: failed (an error answer) or unknown (no answer).
    pub open: HashMap<String, Value>,
    pub failed: u64,
    pub unknown: u64,
    /// Keys of poison messages.
    pub poison: HashSet<String>,
    /// Keys of `order.refunded` messages (they also go to the 410 endpoint).
    pub refunds: HashSet<String>,
    /// Every resend asked for: message id, receiver path, the wall-clock millisecond the
    /// request was sent, and whether Herald answered 202 (one without an answer may still
    /// have been carried out).
    pub resends: Vec<Resend>,
    /// Problems seen while the run went on (SIGTERM exit codes, idempotency storms).
    pub violations: Vec<String>,
}

/// A resend the operator asked for.
#[derive(Debug, Clone)]
pub struct Resend {
    pub msg: String,
    pub path: String,
    /// When the request was sent (wall-clock milliseconds).
    pub sent: i64,
    pub accepted: bool,
}

/// The Herald processes sharing the storage, by slot; `None` while one is down.
pub struct Herald {
    pub storage: Storage,
    /// Whether the SQLite data directory is a small tmpfs of its own (for DiskFull).
    pub disk: bool,
    slots: Vec<Option<Process>>,
    env: Vec<(String, String)>,
    /// Base URLs of the processes up now, for the producer.
    pub bases: Arc<Mutex<Vec<String>>>,
    /// The log of every process started, in order.
    logs: Vec<Arc<Mutex<String>>>,
}

impl Herald {
    fn start(storage: Storage, processes: usize, disk: bool) -> Self {
        let env = vec![
            ("HERALD_FAULTS__PANIC_ON_EVENT_TYPE".to_owned(), "poison".to_owned()),
            ("HERALD_QUEUE__LEASE_MS".to_owned(), LEASE.as_millis().to_string()),
            ("HERALD_QUEUE__SHUTDOWN_GRACE_MS".to_owned(), SHUTDOWN_GRACE.as_millis().to_string()),
            ("HERALD_AUTH__ADMIN_REQUESTS_PER_SECOND".to_owned(), "0".to_owned()),
            // SQLite writes its idempotency keys as runs every 256 keys, not every 524,288:
            // the kills then land while runs are written and registered, too.
            ("HERALD_STORE__IDEMPOTENCY_RUN_KEYS".to_owned(), "256".to_owned()),
        ];
        let mut herald = Self { storage, disk, slots: Vec::new(), env, bases: Arc::default(), logs: Vec::new() };
        for _ in 0..processes {
            herald.slots.push(None);
        }
        for slot in 0..processes {
            herald.up(slot);
        }
        herald
    }

    fn up(&mut self, slot: usize) {
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let process = Process::start_with(&self.storage, &env);
        self.logs.push(process.log());
        self.slots[slot] = Some(process);
        self.publish();
    }

    fn publish(&self) {
        *self.bases.lock().unwrap() = self.slots.iter().flatten().map(|p| p.base.clone()).collect();
    }

    fn down(&mut self, slot: usize) -> Option<Process> {
        let process = self.slots[slot].take();
        self.publish();
        process
    }

    pub fn any_base(&self) -> String {
        self.bases.lock().unwrap().first().cloned().expect("a Herald process is up")
    }

    pub fn processes(&self) -> usize {
        self.slots.len()
    }

    /// Every process's log so far, in the order they were started.
    pub fn logs(&self) -> Vec<String> {
        self.logs.iter().map(|log| log.lock().unwrap().clone()).collect()
    }

    /// The log lines of every process that contain `needle`.
    fn lines_with(&self, needle: &str) -> Vec<String> {
        let logs = self.logs();
        logs.iter().flat_map(|log| log.lines()).filter(|line| line.contains(needle)).map(str::to_owned).collect()
    }

    /// The (message, endpoint id) pairs whose attempt outcome a process logged as not
    /// recorded because its claim had passed to another process (its lease had lapsed).
    pub fn lost_claims(&self) -> HashSet<(String, String)> {
        let field = |line: &str, name: &str| {
            let at = line.find(&format!(" {name}="))? + name.len() + 2;
            Some(line[at..].split_whitespace().next()?.to_owned())
        };
        let lines = self.lines_with("claim lost");
        lines.iter().filter_map(|line| Some((field(line, "msg")?, field(line, "endpoint")?))).collect()
    }

    /// When (wall-clock milliseconds) a process found its lease lost: it stalled longer
    /// than the lease (a pause nobody injected, such as a starved CPU), and others took
    /// over what it held.
    pub fn lease_losses(&self) -> Vec<i64> {
        let lines = self.lines_with("lease lost");
        lines.iter().filter_map(|line| herald::clock::parse_time(line.split_whitespace().next()?)).collect()
    }

    /// Restarts every slot that is down.
    fn heal(&mut self) {
        for slot in 0..self.slots.len() {
            if self.slots[slot].is_none() {
                self.up(slot);
            }
        }
    }

    pub fn shut_down(mut self) {
        for slot in 0..self.slots.len() {
            if let Some(process) = self.down(slot) {
                process.kill();
            }
        }
        if self.disk {
            let _ = std::process::Command::new("umount").arg("-l").arg(self.storage.dir.path()).status();
        }
    }
}

/// Mounts a 256 MiB tmpfs on `dir` so that it can be filled up; false where mounting is not
/// allowed (not root, or a container without the capability): the DiskFull fault is then
/// skipped, and the report says so.
fn small_disk(dir: &std::path::Path) -> bool {
    std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256m", "tmpfs"])
        .arg(dir)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Each 2xx answer's time, by (webhook-id, receiver path).
pub type Acks = HashMap<(String, String), Vec<Instant>>;

/// The receivers (one server, a path per endpoint, behind a proxy that can misbehave) and
/// what they acknowledged with a 2xx.
pub struct Receivers {
    pub receiver: Receiver,
    pub proxy: Proxy,
    pub flapping: Arc<AtomicBool>,
    /// (webhook-id, path) answered 2xx, and when (once per time).
    pub acked: Arc<Mutex<Acks>>,
    /// (webhook-id, path) answered 2xx only after the attempt timeout (while flapping).
    /// Herald normally hung up first; a process paused meanwhile (SIGSTOP) may find the
    /// answer waiting when it resumes and rightly count the delivery as made.
    pub late: Arc<Mutex<HashSet<(String, String)>>>,
}

async fn receivers() -> Receivers {
    let flapping = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Acks>> = Arc::default();
    let late: Arc<Mutex<HashSet<(String, String)>>> = Arc::default();
    let (flag, log, late_log) = (flapping.clone(), acked.clone(), late.clone());
    let turn = Arc::new(AtomicU64::new(0));
    let receiver = Receiver::start(move |r, _| {
        if r.path == GONE_PATH {
            return Reply::status(410);
        }
        if flag.load(Ordering::SeqCst) {
            // Alternate 500s and answers slower than the attempt timeout.
            return if turn.fetch_add(1, Ordering::SeqCst).is_multiple_of(2) {
                Reply::status(500)
            } else {
                // Herald hangs up at its 1 s timeout, counted from before this request
                // arrived: counting it for 950 ms never overlaps the next attempt.
                late_log.lock().unwrap().insert((r.header("webhook-id").to_owned(), r.path.clone()));
                Reply::ok().after(Duration::from_millis(1500)).counted_for(Duration::from_millis(950))
            };
        }
        log.lock()
            .unwrap()
            .entry((r.header("webhook-id").to_owned(), r.path.clone()))
            .or_default()
            .push(Instant::now());
        Reply::ok()
    })
    .await;
    let proxy = Proxy::start(receiver.addr).await;
    Receivers { receiver, proxy, flapping, acked, late }
}

/// Everything a finished run leaves for the checks.
pub struct Run {
    pub plan: Plan,
    pub herald: Herald,
    pub receivers: Receivers,
    pub ledger: Arc<Mutex<Ledger>>,
    pub app: String,
    /// Endpoint id by receiver path, and its signing secret.
    pub endpoints: Vec<(String, String, String)>,
    pub last_fault_healed: Instant,
    /// How long after healing the last ingest refused during the faults was accepted.
    pub reingested: Duration,
    /// Ingests still refused a minute after healing (a violation; the plan is reported, with
    /// its processes' logs, rather than abandoned).
    pub still_refused: usize,
    pub faults: Vec<Injected>,
}

/// A fault as it happened.
pub struct Injected {
    pub fault: Fault,
    pub started: Instant,
    pub healed: Instant,
}

pub async fn run(plan: Plan) -> Run {
    let storage = match plan.backend {
        Backend::Sqlite => Storage::sqlite(),
        Backend::Postgres => Storage::postgres().await,
    };
    let disk = plan.backend == Backend::Sqlite && small_disk(storage.dir.path());
    if plan.backend == Backend::Sqlite && !disk {
        eprintln!("DiskFull skipped: a tmpfs cannot be mounted here");
    }
    let processes = if plan.backend == Backend::Postgres { 2 } else { 1 };
    let mut herald = Herald::start(storage, processes, disk);
    let receivers = receivers().await;
    let client = reqwest::Client::builder().timeout(Duration::from_secs(5)).no_proxy().build().unwrap();
    let (app, endpoints) = setup(&client, &herald.any_base(), &receivers).await;

    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    let operator_done = Arc::new(AtomicBool::new(false));
    let producing =
        tokio::spawn(produce(plan.clone(), client.clone(), herald.bases.clone(), app.clone(), ledger.clone()));
    let operator = tokio::spawn(resend_delivered(Operator {
        rng: StdRng::seed_from_u64(plan.seed ^ 0x5eed_0fa1),
        client: client.clone(),
        bases: herald.bases.clone(),
        app: app.clone(),
        endpoints: endpoints.clone(),
        ledger: ledger.clone(),
        acked: receivers.acked.clone(),
        done: operator_done.clone(),
    }));
    let resending =
        tokio::spawn(resend_while(producing, client.clone(), herald.bases.clone(), app.clone(), ledger.clone()));
    let mut faults = Vec::new();
    for step in schedule(plan.backend, disk, plan.seed, plan.fault_time, LEASE) {
        let started = Instant::now();
        inject(&mut herald, &receivers, &client, &app, &ledger, step, plan.seed).await;
        faults.push(Injected { fault: step.fault, started, healed: Instant::now() });
        tokio::time::sleep(step.gap).await;
    }
    herald.heal();
    receivers.flapping.store(false, Ordering::SeqCst);
    receivers.proxy.set(Mode::Pass);
    let last_fault_healed = Instant::now();
    resending.await.unwrap();
    // Stopped between requests, not aborted: a resend aborted in flight may still be carried
    // out by Herald, and an unbooked resend would look like a duplicate without a reason.
    operator_done.store(true, Ordering::SeqCst);
    operator.await.unwrap();
    let still_refused = resend_until_accepted(&client, &herald.bases, &app, &ledger).await;
    let reingested = last_fault_healed.elapsed();
    Run { plan, herald, receivers, ledger, app, endpoints, last_fault_healed, reingested, still_refused, faults }
}

/// An application (cap 8 per process) with its endpoints: the three every message must
/// reach (short attempt timeouts, quick retries, enough of them to outlast any fault of the
/// schedule, a breaker that reopens soon), the poison endpoint (two quick attempts), and the
/// 410 endpoint (refunds only).
async fn setup(client: &reqwest::Client, base: &str, receivers: &Receivers) -> (String, Vec<(String, String, String)>) {
    let post =
        |path: String, body: Value| client.post(format!("{base}{path}")).bearer_auth(ADMIN_TOKEN).json(&body).send();
    for name in ["order.paid", "order.refunded", "poison"] {
        let created = post("/api/v1/event-type".into(), json!({"name": name, "description": name})).await.unwrap();
        assert!(created.status().is_success(), "event type {name}: {}", created.status());
    }
    let app: Value = post("/api/v1/app".into(), json!({"name": "faults", "maxConcurrency": APP_CAP}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let app = app["id"].as_str().unwrap().to_owned();
    // 4 quick retries, then one every 3 s for about 80 s: the longest run of receiver
    // faults the schedule makes is far shorter, and the breaker parks without using any.
    let mut delays = vec![200, 400, 800, 1600];
    delays.extend([3000; 26]);
    let breaker = json!({"failureThreshold": 10, "cooldownMs": 1000, "maxCooldownMs": 4000});
    let lasting = json!({
        "timeoutMs": ATTEMPT_TIMEOUT.as_millis() as u64,
        "retry": {"strategy": "schedule", "jitterPercent": 20, "delaysMs": delays},
        "circuitBreaker": breaker.clone(),
    });
    // Its breaker never opens: every delivery there dies at its first answer, instead of
    // waiting behind a breaker that would (rightly) park a dead endpoint.
    let brief = json!({
        "timeoutMs": ATTEMPT_TIMEOUT.as_millis() as u64,
        "retry": {"strategy": "schedule", "jitterPercent": 0, "delaysMs": [200]},
        "circuitBreaker": {"failureThreshold": 10000},
    });
    let paths = ENDPOINTS.iter().map(|p| (*p, lasting.clone(), json!(["order.paid", "order.refunded"])));
    let others = [(POISON_PATH, brief.clone(), json!(["poison"])), (GONE_PATH, brief, json!(["order.refunded"]))];
    let mut endpoints = Vec::new();
    for (path, delivery, types) in paths.chain(others) {
        let url = format!("http://{}{path}", receivers.proxy.addr);
        let body = json!({"url": url, "delivery": delivery, "eventTypes": types});
        let endpoint: Value = post(format!("/api/v1/app/{app}/endpoint"), body).await.unwrap().json().await.unwrap();
        let id = endpoint["id"].as_str().unwrap().to_owned();
        let secret: Value = client
            .get(format!("{base}/api/v1/app/{app}/endpoint/{id}/secret"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        endpoints.push((path.to_owned(), id, secret["key"].as_str().unwrap().to_owned()));
    }
    (app, endpoints)
}

/// Sends the plan's messages spread over the fault time, each under its own idempotency
/// key, to whichever process is up. Open model: each ingest goes out at its time whatever
/// the earlier ones are doing, so a stalled Herald does not leave a lagging producer behind.
async fn produce(
    plan: Plan,
    client: reqwest::Client,
    bases: Arc<Mutex<Vec<String>>>,
    app: String,
    ledger: Arc<Mutex<Ledger>>,
) {
    let interval = plan.fault_time.div_f64(plan.messages as f64);
    let mut tick = tokio::time::interval(interval);
    let mut rng = StdRng::seed_from_u64(plan.seed ^ 0x9e37_79b9);
    let mut sending = tokio::task::JoinSet::new();
    for i in 0..plan.messages {
        tick.tick().await;
        let key = format!("key-{}-{i}", plan.seed);
        let event_type = match i {
            i if i % POISON_EVERY == POISON_EVERY - 1 => "poison",
            i if i % REFUND_EVERY == REFUND_EVERY / 2 => "order.refunded",
            _ => "order.paid",
        };
        let body = json!({"eventType": event_type, "payload": {"i": i, "pad": "x".repeat(64)}});
        match event_type {
            "poison" => ledger.lock().unwrap().poison.insert(key.clone()),
            "order.refunded" => ledger.lock().unwrap().refunds.insert(key.clone()),
            _ => false,
        };
        let base = {
            let bases = bases.lock().unwrap();
            if bases.is_empty() { None } else { Some(bases[rng.random_range(0..bases.len())].clone()) }
        };
        let (client, app, ledger) = (client.clone(), app.clone(), ledger.clone());
        sending.spawn(async move {
            let outcome = match base {
                Some(base) => ingest(&client, &base, &app, &key, &body).await,
                None => Ingest::Failed,
            };
            record(&ledger, &key, body, outcome);
        });
    }
    sending.join_all().await;
}

pub enum Ingest {
    Accepted(String),
    Failed,
    Unknown,
}

/// Creates a message under an idempotency key.
async fn post_message(
    client: &reqwest::Client,
    base: &str,
    app: &str,
    key: &str,
    body: &Value,
) -> reqwest::Result<reqwest::Response> {
    client
        .post(format!("{base}/api/v1/app/{app}/msg"))
        .bearer_auth(ADMIN_TOKEN)
        .header("idempotency-key", key)
        .json(body)
        .send()
        .await
}

async fn ingest(client: &reqwest::Client, base: &str, app: &str, key: &str, body: &Value) -> Ingest {
    match post_message(client, base, app, key, body).await {
        Ok(response) if response.status() == reqwest::StatusCode::ACCEPTED => match response.json::<Value>().await {
            Ok(message) => Ingest::Accepted(message["id"].as_str().unwrap_or_default().to_owned()),
            Err(_) => Ingest::Unknown,
        },
        Ok(_) => Ingest::Failed,
        Err(_) => Ingest::Unknown,
    }
}

/// Books an ingest's outcome; `failed` and `unknown` count keys, not tries.
fn record(ledger: &Mutex<Ledger>, key: &str, body: Value, outcome: Ingest) {
    let mut ledger = ledger.lock().unwrap();
    match outcome {
        Ingest::Accepted(id) => {
            ledger.accepted_at.entry(id.clone()).or_insert_with(Instant::now);
            ledger.ids.entry(key.to_owned()).or_default().insert(id);
            ledger.open.remove(key);
        }
        Ingest::Failed | Ingest::Unknown if ledger.open.contains_key(key) => {}
        Ingest::Failed => {
            ledger.failed += 1;
            ledger.open.insert(key.to_owned(), body);
        }
        Ingest::Unknown => {
            ledger.unknown += 1;
            ledger.open.insert(key.to_owned(), body);
        }
    }
}

/// The operator at work while the producer runs: every so often, resend the message accepted
/// last (likely in flight or waiting: the case a resend must not be swallowed in) to one of
/// the endpoints, or, every other time, one already acknowledged. Each accepted resend is
/// booked with the time it was sent: I7 wants an attempt that started after each accepted
/// one, and I3 takes any of them (an unanswered one may have been carried out) as the
/// reason for one more send.
struct Operator {
    rng: StdRng,
    client: reqwest::Client,
    bases: Arc<Mutex<Vec<String>>>,
    app: String,
    endpoints: Vec<(String, String, String)>,
    ledger: Arc<Mutex<Ledger>>,
    acked: Arc<Mutex<Acks>>,
    /// Set when the operator should stop before its next request.
    done: Arc<AtomicBool>,
}

async fn resend_delivered(operator: Operator) {
    let Operator { mut rng, client, bases, app, endpoints, ledger, acked, done } = operator;
    for turn in 0u64.. {
        tokio::time::sleep(RESEND_EVERY).await;
        if done.load(Ordering::SeqCst) {
            return;
        }
        let path = ENDPOINTS[rng.random_range(0..ENDPOINTS.len())];
        let msg = if turn % 2 == 0 {
            let book = ledger.lock().unwrap();
            let poison: HashSet<&String> = book.poison.iter().filter_map(|k| book.ids.get(k)).flatten().collect();
            let latest = book.accepted_at.iter().filter(|(id, _)| !poison.contains(id)).max_by_key(|(_, at)| **at);
            latest.map(|(id, _)| id.clone())
        } else {
            let acked = acked.lock().unwrap();
            let done: Vec<&String> = acked.keys().filter(|(_, p)| p == path).map(|(id, _)| id).collect();
            (!done.is_empty()).then(|| done[rng.random_range(0..done.len())].clone())
        };
        let (Some(msg), Some(base)) = (msg, bases.lock().unwrap().first().cloned()) else { continue };
        let endpoint = &endpoints.iter().find(|(p, _, _)| p == path).expect("an endpoint per path").1;
        let sent = herald::clock::now_ms();
        let url = format!("{base}/api/v1/app/{app}/msg/{msg}/endpoint/{endpoint}/resend");
        let answer = client.post(url).bearer_auth(ADMIN_TOKEN).json(&json!({})).send().await;
        let accepted = answer.is_ok_and(|a| a.status() == reqwest::StatusCode::ACCEPTED);
        ledger.lock().unwrap().resends.push(Resend { msg, path: path.to_owned(), sent, accepted });
    }
}

/// Sends every ingest without a 202 again with its key, as a client would, once a second
/// until `producing` is done.
async fn resend_while(
    producing: tokio::task::JoinHandle<()>,
    client: reqwest::Client,
    bases: Arc<Mutex<Vec<String>>>,
    app: String,
    ledger: Arc<Mutex<Ledger>>,
) {
    while !producing.is_finished() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        resend_open(&client, &bases, &app, &ledger, RESEND_PER_SECOND).await;
    }
    producing.await.unwrap();
}

/// After healing: resends until every ingest is accepted, for at most a minute; how many
/// were still refused then.
async fn resend_until_accepted(
    client: &reqwest::Client,
    bases: &Mutex<Vec<String>>,
    app: &str,
    ledger: &Mutex<Ledger>,
) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let open = ledger.lock().unwrap().open.len();
        if open == 0 || Instant::now() >= deadline {
            return open;
        }
        resend_open(client, bases, app, ledger, usize::MAX).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Open ingests resent at most per second while the faults go on (each pass then ends
/// within one client timeout even when Herald is stalled).
const RESEND_PER_SECOND: usize = 64;

/// One pass over up to `most` open ingests, all at once, each to any process that is up.
async fn resend_open(
    client: &reqwest::Client,
    bases: &Mutex<Vec<String>>,
    app: &str,
    ledger: &Mutex<Ledger>,
    most: usize,
) {
    use futures_util::StreamExt;
    let open: Vec<(String, Value)> =
        ledger.lock().unwrap().open.iter().take(most).map(|(k, v)| (k.clone(), v.clone())).collect();
    let sends = open.into_iter().map(|(key, body)| async move {
        let base = bases.lock().unwrap().first().cloned();
        let outcome = match base {
            Some(base) => ingest(client, &base, app, &key, &body).await,
            None => Ingest::Failed,
        };
        record(ledger, &key, body, outcome);
    });
    futures_util::stream::iter(sends).buffer_unordered(64).collect::<Vec<()>>().await;
}

async fn inject(
    herald: &mut Herald,
    receivers: &Receivers,
    client: &reqwest::Client,
    app: &str,
    ledger: &Arc<Mutex<Ledger>>,
    step: Step,
    seed: u64,
) {
    let slot = (seed as usize + step.hold.as_millis() as usize) % herald.processes();
    match step.fault {
        Fault::Kill => {
            if let Some(process) = herald.down(slot) {
                process.kill();
            }
            tokio::time::sleep(step.hold).await;
            herald.up(slot);
        }
        Fault::Term => {
            if let Some(process) = herald.down(slot) {
                let (status, took, log) = tokio::task::spawn_blocking(move || process.terminate()).await.unwrap();
                if !status.success() || took > SHUTDOWN_GRACE {
                    let grace = SHUTDOWN_GRACE;
                    // Herald logs when each step of its stop ended: where the time went.
                    let steps: Vec<&str> = log.lines().filter(|l| l.contains("stopped")).collect();
                    let problem = format!(
                        "SIGTERM: {status} after {took:?}; expected exit 0 within the grace ({grace:?}); {steps:?}"
                    );
                    ledger.lock().unwrap().violations.push(problem);
                }
            }
            tokio::time::sleep(step.hold).await;
            herald.up(slot);
        }
        Fault::Stop => {
            if let Some(process) = herald.slots[slot].as_ref() {
                process.signal(libc::SIGSTOP);
                tokio::time::sleep(step.hold).await;
                process.signal(libc::SIGCONT);
            }
        }
        Fault::PgRestart { immediate } => {
            let cluster = herald.storage.cluster.as_mut().expect("PostgreSQL");
            cluster.stop(if immediate { "immediate" } else { "fast" }).unwrap();
            tokio::time::sleep(step.hold).await;
            herald.storage.cluster.as_mut().unwrap().restart().unwrap();
        }
        Fault::PgTerminate => {
            let url = herald.storage.database_url.clone().unwrap();
            let db = connect(&url).await;
            db.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE datname = current_database() AND pid <> pg_backend_pid()",
                &[],
            )
            .await
            .unwrap();
            tokio::time::sleep(step.hold).await;
        }
        Fault::ExclusiveLock => hold_exclusive_lock(&herald.storage, step.hold).await,
        Fault::Flap => {
            receivers.flapping.store(true, Ordering::SeqCst);
            tokio::time::sleep(step.hold).await;
            receivers.flapping.store(false, Ordering::SeqCst);
        }
        Fault::IdempotencyStorm => {
            idempotency_storm(client, &herald.any_base(), app, ledger, seed).await;
            // Its share of the fault time, so that the faults last as long as the producer.
            tokio::time::sleep(step.hold).await;
        }
        Fault::Proxy(mode) => {
            receivers.proxy.set(mode);
            tokio::time::sleep(step.hold).await;
            receivers.proxy.set(Mode::Pass);
        }
        Fault::DiskFull => {
            let filler = herald.storage.dir.path().join("filler");
            let path = filler.clone();
            tokio::task::spawn_blocking(move || fill(&path)).await.unwrap();
            disk_full_refusals(client, &herald.any_base(), app, ledger, seed).await;
            tokio::time::sleep(step.hold).await;
            std::fs::remove_file(&filler).unwrap();
        }
    }
}

/// With the disk full, posts large messages until one is refused. Writes that fit in pages
/// SQLite already holds (a recycled WAL of up to 64 MiB) still succeed, so it takes up to
/// 100 MiB. A refusal must be a 503 that says the disk is full; none at all means the
/// fault did not fire, and the run says so.
async fn disk_full_refusals(client: &reqwest::Client, base: &str, app: &str, ledger: &Arc<Mutex<Ledger>>, seed: u64) {
    const PAD: usize = 200 * 1024;
    const MOST: usize = 500;
    for n in 0..MOST {
        let key = format!("disk-{seed}-{n}-{}", rand::random::<u32>());
        let body = json!({"eventType": "order.paid", "payload": {"disk": "full", "pad": "y".repeat(PAD)}});
        match post_message(client, base, app, &key, &body).await {
            Ok(r) if r.status() == reqwest::StatusCode::ACCEPTED => {
                let id = r.json::<Value>().await.ok().and_then(|m| m["id"].as_str().map(str::to_owned));
                record(ledger, &key, body, id.map_or(Ingest::Unknown, Ingest::Accepted));
            }
            Ok(r) => {
                let status = r.status();
                let text = r.text().await.unwrap_or_default();
                let mut book = ledger.lock().unwrap();
                book.open.insert(key, body);
                let says_full = text.contains("the disk holding the database is full");
                if status != reqwest::StatusCode::SERVICE_UNAVAILABLE || !says_full {
                    book.violations.push(format!("disk full: refused with {status} {text}, not a 503 saying so"));
                }
                return;
            }
            Err(_) => record(ledger, &key, body, Ingest::Unknown),
        }
    }
    let problem = format!("disk full: the fault did not fire ({MOST} messages of {} KiB accepted)", PAD / 1024);
    ledger.lock().unwrap().violations.push(problem);
}

/// Writes to `path` until the disk is full.
fn fill(path: &std::path::Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 1 << 20];
    while file.write_all(&block).is_ok() {}
    let _ = file.sync_all();
}

async fn hold_exclusive_lock(storage: &Storage, hold: Duration) {
    let lock = StoreLock::take(storage).await;
    tokio::time::sleep(hold).await;
    lock.release().await;
}

/// 50 concurrent creations with one key and body give one message; the key with another
/// body then gets that first answer again (as Svix does), nothing else. (The storm waits
/// until Herald answers its health check, so that an earlier fault's tail is not taken for
/// its answer.)
async fn idempotency_storm(client: &reqwest::Client, base: &str, app: &str, ledger: &Arc<Mutex<Ledger>>, seed: u64) {
    let healthy = || async {
        let answer = client.get(format!("{base}/api/v1/health")).send().await.ok()?;
        (answer.status() == reqwest::StatusCode::NO_CONTENT).then_some(())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while healthy().await.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let key = format!("storm-{seed}-{}", rand::random::<u32>());
    let body = json!({"eventType": "order.paid", "payload": {"storm": key}});
    let sends = (0..50).map(|_| ingest(client, base, app, &key, &body));
    let outcomes = futures_util::future::join_all(sends).await;
    let ids: HashSet<String> =
        outcomes.into_iter().filter_map(|o| if let Ingest::Accepted(id) = o { Some(id) } else { None }).collect();
    {
        let mut book = ledger.lock().unwrap();
        if ids.len() > 1 {
            book.violations.push(format!("I4: 50 concurrent ingests with key {key} made {} messages", ids.len()));
        }
        if let Some(id) = ids.into_iter().next() {
            book.accepted_at.entry(id.clone()).or_insert_with(Instant::now);
            book.ids.insert(key.clone(), HashSet::from([id]));
        } else {
            book.open.insert(key.clone(), body);
        }
    }
    let other = json!({"eventType": "order.paid", "payload": {"storm": "a different body"}});
    let first = ledger.lock().unwrap().ids.get(&key).and_then(|ids| ids.iter().next().cloned());
    let answer = match ingest(client, base, app, &key, &other).await {
        Ingest::Accepted(id) if Some(&id) == first.as_ref() => return,
        Ingest::Accepted(id) => format!("202 with another message {id}"),
        Ingest::Failed => "an error".to_owned(),
        Ingest::Unknown => "no answer".to_owned(),
    };
    let problem = format!("a reused key with another body answered {answer}, not the first answer ({first:?})");
    ledger.lock().unwrap().violations.push(problem);
}

/// The harness's own connection to the database, once it accepts connections again (after
/// an immediate stop it first replays its log).
async fn connect(url: &str) -> tokio_postgres::Client {
    herald_test_support::pg_cluster::connect(url, Duration::from_secs(60)).await.expect("the database came back")
}
