//! Tenant isolation of app-portal tokens and portal sessions, as a matrix generated from the
//! route table.
//!
//! The routes come from the router itself (`herald::web::route_table`, recorded as the
//! router is built), so a route added later joins the matrix by itself; the table and
//! Herald's OpenAPI document (`GET /api/v1/openapi.json`) agree, route for route, with no
//! exceptions (an API route is written once, in its handler's `#[utoipa::path]`). Two applications, A and B, each get one of
//! everything (an endpoint with a uid, a delivered message with an eventId, its attempt); the
//! portal token, and the dashboard session signed in with it, are A's.
//!
//! * Every operation whose path names an application (`{app_id}`), with every path parameter
//!   filled with B's ids, and again with B's uids (app uid, endpoint uid, message eventId),
//!   must answer 404, exactly like an id that does not exist.
//! * A's own application mixed with one id of B's (an endpoint, a message, an attempt, also as
//!   a query parameter) must answer what a never-created id of that kind answers.
//! * Routes outside any application are classified by hand in [`OUTSIDE_APPLICATIONS`] and
//!   [`DASHBOARD_OUTSIDE`]: admin-only ones refuse a portal token, the others show A's data
//!   only. A route of the router missing there fails the test, so each new route gets a
//!   decision.
//! * The dashboard's routes naming an application, with A's portal session and B's ids and
//!   uids, answer 404 pages, with and without a valid CSRF token on forms.
//!
//! No response to the portal token may contain anything of B's (ids, uids, secret, URL,
//! payload). Controls keep the 404s honest: the admin token gets a 2xx for the very same
//! requests (on a twin of B when the request changes something), so the route matched, the
//! ids resolve and the body is valid; A's token reads every route of its own application, by
//! id and by uid. "No side effect" is checked on what the admin token reads of B before and
//! after (the app, endpoints, secret, headers, stats, breaker, messages, attempts, delivery
//! states), and on B's receiver, which must get nothing but a sentinel message sent at the end.
//!
//! Problems are collected over the whole matrix and reported together, one line each.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use herald::ids::{AppId, AttemptId, EndpointId, MessageId};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::support::server::ADMIN_TOKEN;
use crate::support::{Receiver, Reply, TestServer, eventually};

/// The event type of every message here (event types are global, not per application).
const EVENT_TYPE: &str = "invoice.paid";

/// The keys of an OpenAPI path item that are operations.
const HTTP_METHODS: [&str; 8] = ["get", "head", "post", "put", "patch", "delete", "options", "trace"];

/// The path parameters that name something of one application.
const ID_PARAMS: [&str; 5] = ["app_id", "endpoint_id", "msg_id", "attempt_id", "task_id"];

// ---------------------------------------------------------------------------------------
// The route table
// ---------------------------------------------------------------------------------------

/// One operation of the OpenAPI document.
#[derive(Debug, Clone)]
struct Operation {
    method: Method,
    /// The path template, e.g. `/api/v1/app/{app_id}/msg/{msg_id}`.
    path: String,
    id: String,
    /// Query parameters that carry an id (like `endpoint_id` of the attempt list).
    id_queries: Vec<String>,
    has_body: bool,
}

impl Operation {
    /// Names of the path parameters, in order.
    fn params(&self) -> Vec<&str> {
        let mut names = vec![];
        let mut rest = self.path.as_str();
        while let Some(open) = rest.find('{') {
            let close = open + rest[open..].find('}').expect("a closed path parameter");
            names.push(&rest[open + 1..close]);
            rest = &rest[close + 1..];
        }
        names
    }

    fn is_app_scoped(&self) -> bool {
        self.params().contains(&"app_id")
    }

    fn key(&self) -> String {
        format!("{} {}", self.method, self.path)
    }
}

/// Whether a route of the table belongs to the dashboard (HTML pages and forms).
fn is_dashboard(path: &str) -> bool {
    !path.starts_with("/api/") && path != "/metrics"
}

/// Every API operation the router serves, with what the document says of it: reads first,
/// deletions last (deepest first), so a deletion that wrongly went through cannot hide the
/// routes after it.
fn operations(doc: &Value) -> Vec<Operation> {
    let mut found = vec![];
    for route in herald::web::route_table().into_iter().filter(|r| !is_dashboard(&r.path)) {
        let op = &doc["paths"][&route.path][route.method.as_str().to_lowercase()];
        let id_queries = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["in"] == "query")
            .filter_map(|p| p["name"].as_str())
            .filter(|name| ID_PARAMS.contains(name))
            .map(str::to_owned)
            .collect();
        found.push(Operation {
            method: route.method,
            path: route.path,
            id: op["operationId"].as_str().unwrap_or_default().to_owned(),
            id_queries,
            has_body: op.get("requestBody").is_some(),
        });
    }
    sorted(found)
}

/// The dashboard's routes, as operations (their bodies are forms).
fn dashboard_operations() -> Vec<Operation> {
    let routes = herald::web::route_table().into_iter().filter(|r| is_dashboard(&r.path));
    let found = routes
        .map(|r| Operation {
            has_body: r.method == Method::POST,
            method: r.method,
            path: r.path,
            id: String::new(),
            id_queries: vec![],
        })
        .collect();
    sorted(found)
}

fn sorted(mut found: Vec<Operation>) -> Vec<Operation> {
    let order = [Method::GET, Method::HEAD, Method::POST, Method::PUT, Method::PATCH, Method::DELETE];
    let rank = |m: &Method| order.iter().position(|x| x == m).unwrap_or(order.len());
    found.sort_by_key(|op| (rank(&op.method), std::cmp::Reverse(op.path.len()), op.path.clone()));
    found
}

/// The router and the document served agree: every documented operation is served, and
/// every API route served (the metrics and the document itself included) is documented.
#[tokio::test]
async fn the_router_serves_exactly_the_documented_operations() {
    let server = TestServer::start().await;
    let (status, doc) = server.get("/api/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("the document has paths") {
        for method in item.as_object().unwrap().keys().filter(|m| HTTP_METHODS.contains(&m.as_str())) {
            documented.insert(format!("{} {path}", method.to_uppercase()));
        }
    }
    let served: BTreeSet<String> = herald::web::route_table()
        .into_iter()
        .filter(|r| !is_dashboard(&r.path))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    let missing: Vec<_> = documented.difference(&served).collect();
    assert!(missing.is_empty(), "documented but not served: {missing:?}");
    let undocumented: Vec<_> = served.difference(&documented).collect();
    assert!(undocumented.is_empty(), "served but not documented: {undocumented:?}");
    for route in ["GET /metrics", "GET /api/v1/openapi.json", "POST /api/v1/app/{app_id}/msg"] {
        assert!(documented.contains(route), "{route} is documented");
    }
    assert!(served.len() > 40, "the table holds the whole API: {}", served.len());
}

/// An API route cannot be added without its document: the dashboard's plain methods refuse
/// `/api/` paths.
#[test]
#[should_panic(expected = "an API route is added by `operations`")]
fn an_api_path_without_an_operation_is_refused_when_the_router_is_built() {
    async fn handler() {}
    let _ = herald::api::Routes::new().get("/api/v1/undocumented", handler);
}

/// A minimal valid body for each operation that takes one (the admin control proves it
/// valid: a 404 must not be a 422 in disguise).
fn body_for(op: &Operation, url: &str) -> Option<Value> {
    if !op.has_body {
        return None;
    }
    Some(match op.id.as_str() {
        "v1.application.create" => json!({"name": "probe"}),
        "v1.application.update" | "patch_application" => json!({"name": "renamed"}),
        "v1.endpoint.create" | "v1.endpoint.update" => json!({"url": url}),
        "patch_endpoint" => json!({"description": "changed"}),
        "v1.endpoint.rotate-secret" | "v1.authentication.app-portal-access" | "v1.authentication.expire-all" => {
            json!({})
        }
        "v1.endpoint.update-headers" => json!({"headers": {"x-probe": "1"}}),
        "v1.endpoint.patch-headers" => json!({"headers": {"x-probe": "2"}}),
        "v1.endpoint.recover" => json!({"since": (chrono::Utc::now() - chrono::Duration::hours(1)).to_rfc3339()}),
        "herald.dead-letters.replay" => json!({"dryRun": true}),
        "v1.endpoint.send-example" => json!({"eventType": "svix.ping"}),
        "herald.endpoint.transformation-simulate" => json!({"eventType": EVENT_TYPE, "payload": {"probe": true}}),
        "v1.message.create" => json!({"eventType": EVENT_TYPE, "payload": {"probe": true}}),
        "v1.event-type.create" => json!({"name": "probe.created", "description": "probe"}),
        "v1.event-type.update" | "patch_event_type" => json!({"description": "probe"}),
        "herald.poller.create" | "herald.poller.patch" => json!({"description": "probe"}),
        "herald.poller.seek" => json!({"after": "2000-01-01T00:00:00Z"}),
        other => panic!("no request body for {other} ({}): add a minimal valid one to `body_for`", op.key()),
    })
}

/// Query strings an operation needs to show anything: above 0 ms, every endpoint with enough
/// samples is slow.
fn query_for(op: &Operation) -> &'static str {
    match op.id.as_str() {
        "herald.stats.slow-endpoints" => "?p95ThresholdMs=0",
        _ => "",
    }
}

/// What fills each path parameter.
type Keys = BTreeMap<String, String>;

/// `template` with its parameters filled from `keys`.
fn fill(template: &str, keys: &Keys) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        let close = open + rest[open..].find('}').expect("a closed path parameter");
        let name = &rest[open + 1..close];
        let value =
            keys.get(name).unwrap_or_else(|| panic!("no value for {{{name}}} in {template}: extend `Tenant::keys`"));
        out.push_str(&rest[..open]);
        out.push_str(value);
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// A fresh id of the kind a parameter names, that exists nowhere.
fn ghost(param: &str) -> String {
    match param {
        "app_id" => AppId::generate().to_string(),
        "endpoint_id" => EndpointId::generate().to_string(),
        "msg_id" => MessageId::generate().to_string(),
        "attempt_id" => AttemptId::generate().to_string(),
        "task_id" => herald::ids::TaskId::generate().to_string(),
        "poller_id" => herald::ids::PollerId::generate().to_string(),
        other => panic!("no ghost id for {other}"),
    }
}

// ---------------------------------------------------------------------------------------
// Requests and answers
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Request {
    method: Method,
    path: String,
    body: Option<Value>,
}

impl Request {
    /// `op` with its parameters filled from `keys`; `url` is the endpoint URL of bodies.
    fn to(op: &Operation, keys: &Keys, url: &str) -> Self {
        let path = format!("{}{}", fill(&op.path, keys), query_for(op));
        Self { method: op.method.clone(), path, body: body_for(op, url) }
    }

    fn get(path: String) -> Self {
        Self { method: Method::GET, path, body: None }
    }

    fn with_query(mut self, name: &str, value: &str) -> Self {
        let separator = if self.path.contains('?') { '&' } else { '?' };
        self.path = format!("{}{separator}{name}={value}", self.path);
        self
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

/// Status and raw body (searched for anything of B's).
struct Answer {
    status: StatusCode,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }

    /// A 404 from a lookup that found nothing, not the router's "route not found".
    fn is_not_found(&self) -> bool {
        let body = self.json();
        self.status == StatusCode::NOT_FOUND && body["code"] == "not_found" && body["detail"] != "route not found"
    }

    /// The fingerprints of `tenant` that appear in this answer.
    fn leaks(&self, tenant: &Tenant) -> Vec<String> {
        tenant.fingerprints().into_iter().filter(|f| self.body.contains(f.as_str())).collect()
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let body: String = self.body.chars().take(300).collect();
        write!(f, "{} {body}", self.status.as_u16())
    }
}

/// Problems collected over a whole matrix, reported together.
#[derive(Default)]
struct Findings(Vec<String>);

impl Findings {
    fn check(&mut self, ok: bool, problem: impl FnOnce() -> String) {
        if !ok {
            self.0.push(problem());
        }
    }

    fn no_leaks(&mut self, request: &Request, answer: &Answer, tenant: &Tenant) {
        let leaks = answer.leaks(tenant);
        self.check(leaks.is_empty(), || format!("{request} showed B's {leaks:?} to A's token: {answer}"));
    }

    fn assert_none(self, what: &str) {
        assert!(self.0.is_empty(), "{what}: {} problem(s):\n  {}", self.0.len(), self.0.join("\n  "));
    }
}

// ---------------------------------------------------------------------------------------
// The two applications
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
enum Flavour {
    Ids,
    Uids,
}

impl fmt::Display for Flavour {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ids => "by id",
            Self::Uids => "by uid",
        })
    }
}

/// An application with one of everything: an endpoint, a delivered message, its attempt.
struct Tenant {
    label: String,
    app: String,
    endpoint: String,
    msg: String,
    attempt: String,
    /// A (finished, empty) bulk replay of this application's dead letters.
    task: String,
    /// A poller of this application (uid `{label}-poller`).
    poller: String,
    secret: String,
    url: String,
}

impl Tenant {
    async fn create(server: &TestServer, label: &str, receiver: &Receiver) -> Self {
        let (status, app) = server.post("/api/v1/app", json!({"name": label, "uid": format!("{label}-app")})).await;
        assert_eq!(status, StatusCode::CREATED, "{app}");
        let app = app["id"].as_str().unwrap().to_owned();
        let url = receiver.url(&format!("/{label}"));
        let endpoint = server.create_endpoint(&app, &url, json!({"uid": format!("{label}-endpoint")})).await;
        let endpoint = endpoint["id"].as_str().unwrap().to_owned();
        let message = json!({"eventType": EVENT_TYPE, "eventId": format!("{label}-event"),
            "payload": {"marker": format!("{label}-payload")}});
        let msg = server.send(&app, message).await;
        let (app_ref, msg_ref) = (&app, &msg);
        let attempt = eventually("the first attempt", || async move {
            server.attempts(app_ref, msg_ref).await.first().map(|a| a["id"].as_str().unwrap().to_owned())
        })
        .await;
        let secret = server.secret(&app, &endpoint).await;
        let (status, task) = server.post(&format!("/api/v1/app/{app}/dead-letters/replay"), json!({})).await;
        assert_eq!(status, StatusCode::ACCEPTED, "{task}");
        let task = task["taskId"].as_str().unwrap().to_owned();
        let (status, poller) =
            server.post(&format!("/api/v1/app/{app}/poller"), json!({"uid": format!("{label}-poller")})).await;
        assert_eq!(status, StatusCode::CREATED, "{poller}");
        let poller = poller["id"].as_str().unwrap().to_owned();
        let tenant = Self { label: label.to_owned(), app, endpoint, msg, attempt, task, poller, secret, url };
        tenant.settled(server).await;
        tenant
    }

    /// What fills each path parameter: ids, or the other keys Herald accepts for them.
    fn keys(&self, flavour: Flavour) -> Keys {
        let label = &self.label;
        let (app, endpoint, msg, poller) = match flavour {
            Flavour::Ids => (self.app.clone(), self.endpoint.clone(), self.msg.clone(), self.poller.clone()),
            Flavour::Uids => {
                let uid = |what: &str| format!("{label}-{what}");
                (uid("app"), uid("endpoint"), uid("event"), uid("poller"))
            }
        };
        [
            ("app_id", app),
            ("endpoint_id", endpoint),
            ("msg_id", msg),
            ("attempt_id", self.attempt.clone()),
            ("task_id", self.task.clone()),
            ("event_type_name", EVENT_TYPE.to_owned()),
            ("session_id", "ses_probe".to_owned()),
            ("poller_id", poller),
            ("consumer_id", "probe".to_owned()),
        ]
        .into_iter()
        .map(|(name, value)| (name.to_owned(), value))
        .collect()
    }

    /// Strings that belong to this application alone.
    fn fingerprints(&self) -> Vec<String> {
        let label = &self.label;
        let mut all = vec![self.app.clone(), self.endpoint.clone(), self.msg.clone(), self.attempt.clone()];
        all.extend([self.task.clone(), self.poller.clone()]);
        all.extend([self.secret.clone(), self.url.clone()]);
        all.extend(["app", "endpoint", "event", "payload", "poller"].map(|what| format!("{label}-{what}")));
        all
    }

    /// Waits until every delivery of this application has finished, so its state holds still.
    async fn settled(&self, server: &TestServer) {
        let path = format!("/api/v1/app/{}/endpoint/{}/stats", self.app, self.endpoint);
        let path = &path;
        eventually("the deliveries to finish", || async move {
            let (_, stats) = server.get(path).await;
            (stats["pending"] == 0 && stats["sending"] == 0).then_some(())
        })
        .await;
    }

    /// What the admin token reads of this application: everything a stray call could change.
    /// Latency percentiles are left out of the health (a flush may be under way); the
    /// attempt lists show any new attempt.
    async fn snapshot(&self, server: &TestServer) -> BTreeMap<String, Value> {
        let (app, ep, msg) = (&self.app, &self.endpoint, &self.msg);
        let endpoint = format!("/api/v1/app/{app}/endpoint/{ep}");
        let paths = [
            format!("/api/v1/app/{app}"),
            format!("/api/v1/app/{app}/endpoint?limit=250"),
            endpoint.clone(),
            format!("{endpoint}/secret"),
            format!("{endpoint}/headers"),
            format!("{endpoint}/stats"),
            format!("{endpoint}/health"),
            format!("{endpoint}/msg?limit=250"),
            format!("/api/v1/app/{app}/msg?limit=250"),
            format!("/api/v1/app/{app}/msg/{msg}"),
            format!("/api/v1/app/{app}/msg/{msg}/endpoint"),
            format!("/api/v1/app/{app}/attempt/msg/{msg}?limit=250"),
            format!("/api/v1/app/{app}/attempt/endpoint/{ep}?limit=250"),
        ];
        let mut state = BTreeMap::new();
        for path in paths {
            let (status, mut body) = server.get(&path).await;
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
            if path.ends_with("/health") {
                let keep = ["state", "consecutiveFailures", "openedAt", "cooldownMs"];
                body = keep.iter().map(|k| (k.to_string(), body[k].clone())).collect();
            }
            state.insert(path, body);
        }
        state
    }
}

/// Reports every difference between two snapshots.
fn compare(findings: &mut Findings, what: &str, before: &BTreeMap<String, Value>, after: &BTreeMap<String, Value>) {
    for (path, was) in before {
        let now = &after[path];
        findings.check(was == now, || format!("{what} changed: GET {path}\n    before: {was}\n    after:  {now}"));
    }
}

/// A server with applications A and B, a portal token for A, and the route table.
struct World {
    server: TestServer,
    client: reqwest::Client,
    a: Tenant,
    b: Tenant,
    /// B's receiver: nothing may arrive there because of A's token.
    receiver_b: Receiver,
    _receiver_a: Receiver,
    /// Where twins' endpoints and created endpoints point.
    sink: Receiver,
    /// A's portal token.
    token: String,
    operations: Vec<Operation>,
}

impl World {
    async fn build() -> Self {
        let server = TestServer::start().await;
        let (status, et) =
            server.post("/api/v1/event-type", json!({"name": EVENT_TYPE, "description": "An invoice was paid"})).await;
        assert_eq!(status, StatusCode::CREATED, "{et}");
        // A little latency, so that percentiles are above 0 ms.
        let slightly_slow = || Receiver::start(|_, _| Reply::ok().after(Duration::from_millis(2)));
        let (receiver_a, receiver_b, sink) = (slightly_slow().await, slightly_slow().await, Receiver::ok().await);
        let a = Tenant::create(&server, "tenant-a", &receiver_a).await;
        let b = Tenant::create(&server, "victim", &receiver_b).await;
        let (status, doc) = server.get("/api/v1/openapi.json").await;
        assert_eq!(status, StatusCode::OK);
        let mut world = Self {
            server,
            client: reqwest::Client::new(),
            a,
            b,
            receiver_b,
            _receiver_a: receiver_a,
            sink,
            token: String::new(),
            operations: operations(&doc),
        };
        world.token = world.portal_token().await;
        world
    }

    /// A fresh portal token for A.
    async fn portal_token(&self) -> String {
        let (status, access) =
            self.server.post(&format!("/api/v1/auth/app-portal-access/{}", self.a.app), json!({})).await;
        assert_eq!(status, StatusCode::OK, "{access}");
        let token = access["token"].as_str().unwrap().to_owned();
        assert!(token.starts_with("appsk_"), "{token}");
        token
    }

    /// Sends `request` with `token`. A 429 (portal tokens have a request rate limit; it
    /// answers before any handler runs) is waited out and sent again.
    async fn call(&self, token: &str, request: &Request) -> Answer {
        for _ in 0..60 {
            let mut builder =
                self.client.request(request.method.clone(), self.server.url(&request.path)).bearer_auth(token);
            if let Some(body) = &request.body {
                builder = builder.json(body);
            }
            let response = builder.send().await.expect("the server answers");
            let status = response.status();
            if status == StatusCode::TOO_MANY_REQUESTS {
                let header = response.headers().get(reqwest::header::RETRY_AFTER);
                let secs = header.and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(1);
                tokio::time::sleep(Duration::from_secs(secs)).await;
                continue;
            }
            return Answer { status, body: response.text().await.unwrap() };
        }
        panic!("{request} stayed rate-limited");
    }

    fn sink_url(&self) -> String {
        self.sink.url("/created")
    }

    /// The operations whose path names an application.
    fn scoped(&self) -> impl Iterator<Item = &Operation> {
        self.operations.iter().filter(|op| op.is_app_scoped())
    }

    /// Proves B's receiver got nothing since it had `seen` requests: a sentinel message sent
    /// now must be the only new delivery. (Anything queued by the matrix and not yet sent
    /// shows in the snapshots, as a pending delivery or a new attempt.)
    async fn only_the_sentinel_arrives(&self, findings: &mut Findings, seen: usize) {
        let sentinel =
            self.server.send(&self.b.app, json!({"eventType": EVENT_TYPE, "payload": {"sentinel": true}})).await;
        let got = self.receiver_b.wait_for(None, seen + 1).await;
        let ids: Vec<&str> = got[seen..].iter().map(|r| r.header("webhook-id")).collect();
        findings.check(ids == [sentinel.as_str()], || {
            format!("B's endpoint received {ids:?} after the matrix; only the sentinel {sentinel} was sent")
        });
    }
}

// ---------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------

/// Every route naming an application × A's token × B's ids (and uids) → 404, nothing of
/// B's in the answer, no effect on B.
#[tokio::test]
async fn a_portal_token_for_one_application_reaches_nothing_of_another() {
    let w = World::build().await;
    let mut findings = Findings::default();
    let flavours = [Flavour::Ids, Flavour::Uids];

    // The token works: A reads every route of its own application, by id and by uid, and
    // sees nothing of B's there either.
    let mut own_reads = 0;
    for op in w.scoped().filter(|op| op.method == Method::GET) {
        for flavour in flavours {
            let request = Request::to(op, &w.a.keys(flavour), &w.sink_url());
            let answer = w.call(&w.token, &request).await;
            findings.check(answer.status.is_success(), || format!("A's own {request} ({flavour}): {answer}"));
            findings.no_leaks(&request, &answer, &w.b);
            own_reads += 1;
        }
    }
    assert!(own_reads > 0, "no readable route of an application in the document");

    let before = w.b.snapshot(&w.server).await;
    let seen = w.receiver_b.requests().len();
    let mut covered = BTreeSet::new();
    for op in w.scoped() {
        for flavour in flavours {
            let request = Request::to(op, &w.b.keys(flavour), &w.sink_url());
            let answer = w.call(&w.token, &request).await;
            findings.no_leaks(&request, &answer, &w.b);
            if !answer.is_not_found() {
                // Would an application that does not exist get the same answer?
                let mut keys = w.b.keys(flavour);
                keys.insert("app_id".into(), ghost("app_id"));
                let missing = w.call(&w.token, &Request::to(op, &keys, &w.sink_url())).await;
                findings.0.push(format!(
                    "{request} ({flavour}) with A's token answered {answer}; expected 404 (an application that \
                     does not exist gets {})",
                    missing.status.as_u16()
                ));
            }
            covered.insert(op.key());
        }
    }
    let after = w.b.snapshot(&w.server).await;
    compare(&mut findings, "B", &before, &after);
    w.only_the_sentinel_arrives(&mut findings, seen).await;
    let still = w.call(&w.token, &Request::get(format!("/api/v1/app/{}", w.a.app))).await;
    findings.check(still.status == StatusCode::OK, || format!("A's token stopped working: {still}"));

    // The matrix covered every route of the router that names an application.
    let served: BTreeSet<String> = herald::web::route_table()
        .into_iter()
        .filter(|r| !is_dashboard(&r.path) && r.path.contains("{app_id}"))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(served.contains("GET /api/v1/app/{app_id}/msg/{msg_id}"), "{served:?}");
    let skipped: Vec<_> = served.difference(&covered).collect();
    assert!(skipped.is_empty(), "routes left out of the matrix: {skipped:?}");
    eprintln!("isolation matrix: {} app-scoped operations × 2 key flavours", covered.len());

    // Controls: the admin token gets a 2xx for the very same requests, so the 404s above are
    // not a missed route, a missing id or an invalid body. Reads go to B itself; requests
    // that change something go to a fresh twin of B each.
    let mut twins = 0;
    for op in w.scoped() {
        for flavour in flavours {
            let (request, answer) = if op.method == Method::GET {
                let request = Request::to(op, &w.b.keys(flavour), &w.sink_url());
                let answer = w.call(ADMIN_TOKEN, &request).await;
                (request, answer)
            } else {
                twins += 1;
                let twin = Tenant::create(&w.server, &format!("twin-{twins}"), &w.sink).await;
                let request = Request::to(op, &twin.keys(flavour), &w.sink_url());
                let answer = w.call(ADMIN_TOKEN, &request).await;
                (request, answer)
            };
            findings.check(answer.status.is_success(), || format!("control: admin {request} ({flavour}): {answer}"));
        }
    }
    findings.assert_none("a portal token of A against B's ids");
}

/// A's own application with one id of B's in it (path or query) answers exactly what a
/// never-created id answers: lookups below the application are scoped to it.
#[tokio::test]
async fn a_portal_token_cannot_reach_another_applications_resources_through_its_own() {
    let w = World::build().await;
    let mut findings = Findings::default();
    let before = w.b.snapshot(&w.server).await;
    let seen = w.receiver_b.requests().len();
    let (own, theirs) = (w.a.keys(Flavour::Ids), w.b.keys(Flavour::Ids));
    let mut probes = 0;
    for op in w.scoped() {
        let in_path = op.params().into_iter().filter(|p| ID_PARAMS.contains(p) && *p != "app_id").map(str::to_owned);
        for (param, in_query) in in_path.map(|p| (p, false)).chain(op.id_queries.iter().map(|q| (q.clone(), true))) {
            let with = |value: &str| {
                if in_query {
                    Request::to(op, &own, &w.sink_url()).with_query(&param, value)
                } else {
                    let mut keys = own.clone();
                    keys.insert(param.clone(), value.to_owned());
                    Request::to(op, &keys, &w.sink_url())
                }
            };
            let foreign = with(&theirs[param.as_str()]);
            let missing = with(&ghost(&param));
            let answer = w.call(&w.token, &foreign).await;
            let expected = w.call(&w.token, &missing).await;
            findings.no_leaks(&foreign, &answer, &w.b);
            findings.check(answer.status == expected.status, || {
                format!("{foreign} (B's {param}) answered {answer}; a {param} that does not exist gets {expected}")
            });
            findings.check(answer.status != StatusCode::NOT_FOUND || answer.is_not_found(), || {
                format!("{foreign}: the route did not match: {answer}")
            });
            probes += 1;
        }
    }
    assert!(probes > 0, "no route below an application takes another id");
    eprintln!("mixed matrix: {probes} probes");
    let after = w.b.snapshot(&w.server).await;
    compare(&mut findings, "B", &before, &after);
    w.only_the_sentinel_arrives(&mut findings, seen).await;
    findings.assert_none("A's application with B's ids");
}

/// A route outside any application: what a portal token gets, and for listings the kind of
/// id they show (A's must be there, B's never; the admin token sees B's).
struct Outside {
    method: &'static str,
    path: &'static str,
    portal: u16,
    lists: Option<&'static str>,
}

const fn outside(method: &'static str, path: &'static str, portal: u16) -> Outside {
    Outside { method, path, portal, lists: None }
}

/// Every API route outside an application, classified.
const OUTSIDE_APPLICATIONS: &[Outside] = &[
    outside("GET", "/api/v1/app", 403),
    outside("POST", "/api/v1/app", 403),
    outside("POST", "/api/v1/auth/logout", 204),
    outside("GET", "/api/v1/auth/session", 403),
    outside("DELETE", "/api/v1/auth/session", 403),
    outside("DELETE", "/api/v1/auth/session/{session_id}", 403),
    outside("GET", "/api/v1/event-type", 200),
    outside("POST", "/api/v1/event-type", 403),
    outside("GET", "/api/v1/event-type/{event_type_name}", 200),
    outside("PUT", "/api/v1/event-type/{event_type_name}", 403),
    outside("PATCH", "/api/v1/event-type/{event_type_name}", 403),
    outside("DELETE", "/api/v1/event-type/{event_type_name}", 403),
    outside("GET", "/api/v1/health", 204),
    outside("HEAD", "/api/v1/health", 204),
    outside("GET", "/api/v1/health/ping", 204),
    outside("HEAD", "/api/v1/health/ping", 204),
    Outside { method: "GET", path: "/api/v1/stats/slow-endpoints", portal: 200, lists: Some("endpoint_id") },
    outside("GET", "/api/v1/stats/summary", 403),
    outside("GET", "/api/v1/stats/dead-letters", 200),
    outside("GET", "/metrics", 403),
    outside("GET", "/api/v1/openapi.json", 200),
];

/// Routes without an application: admin-only ones refuse a portal token, listings show A's
/// data and never B's, and nothing changes.
#[tokio::test]
async fn routes_outside_applications_refuse_a_portal_token_or_show_only_its_own_data() {
    let w = World::build().await;
    // Enough samples for both endpoints to be listed as slow (above 0 ms).
    for tenant in [&w.a, &w.b] {
        for i in 0..herald::latency::MIN_SAMPLES {
            w.server.send(&tenant.app, json!({"eventType": EVENT_TYPE, "payload": {"i": i}})).await;
        }
    }
    let (a_ep, b_ep) = (&w.a.endpoint, &w.b.endpoint);
    let server = &w.server;
    eventually("both endpoints to be slow above 0 ms", || async move {
        let (_, slow) = server.get("/api/v1/stats/slow-endpoints?p95ThresholdMs=0").await;
        let text = slow.to_string();
        (text.contains(a_ep.as_str()) && text.contains(b_ep.as_str())).then_some(())
    })
    .await;
    w.a.settled(&w.server).await;
    w.b.settled(&w.server).await;

    let mut findings = Findings::default();
    let before = w.b.snapshot(&w.server).await;
    let catalogue = "/api/v1/event-type?include_archived=true&with_content=true&limit=250";
    let (_, types_before) = w.server.get(catalogue).await;
    let (_, apps_before) = w.server.get("/api/v1/app?limit=250").await;
    let seen = w.receiver_b.requests().len();

    let documented: Vec<&Operation> = w.operations.iter().filter(|op| !op.is_app_scoped()).collect();
    let unclassified: Vec<String> = documented
        .iter()
        .filter(|op| !OUTSIDE_APPLICATIONS.iter().any(|o| o.method == op.method.as_str() && o.path == op.path))
        .map(|op| op.key())
        .collect();
    assert!(
        unclassified.is_empty(),
        "routes outside applications to classify in OUTSIDE_APPLICATIONS: {unclassified:?}"
    );

    for route in OUTSIDE_APPLICATIONS {
        let op = documented.iter().find(|op| op.method.as_str() == route.method && op.path == route.path);
        let op = op.map_or_else(
            || Operation {
                method: Method::from_bytes(route.method.as_bytes()).unwrap(),
                path: route.path.to_owned(),
                id: String::new(),
                id_queries: vec![],
                has_body: false,
            },
            |op| (*op).clone(),
        );
        let request = Request::to(&op, &w.b.keys(Flavour::Ids), &w.sink_url());
        // A fresh token each time: logout revokes the one it is called with.
        let answer = w.call(&w.portal_token().await, &request).await;
        findings.check(answer.status.as_u16() == route.portal, || {
            format!("{request} with A's token answered {answer}; expected {}", route.portal)
        });
        findings.no_leaks(&request, &answer, &w.b);
        if let Some(kind) = route.lists {
            let (mine, theirs) = (&w.a.keys(Flavour::Ids)[kind], &w.b.keys(Flavour::Ids)[kind]);
            findings
                .check(answer.body.contains(mine.as_str()), || format!("{request} left out A's own {mine}: {answer}"));
            let admin = w.call(ADMIN_TOKEN, &request).await;
            findings.check(admin.body.contains(theirs.as_str()), || {
                format!("control: admin {request} does not list B's {theirs}: {admin}")
            });
        }
    }

    let after = w.b.snapshot(&w.server).await;
    compare(&mut findings, "B", &before, &after);
    let (_, types_after) = w.server.get(catalogue).await;
    findings.check(types_before == types_after, || format!("event types changed: {types_before} → {types_after}"));
    let (_, apps_after) = w.server.get("/api/v1/app?limit=250").await;
    findings.check(apps_before == apps_after, || format!("applications changed: {apps_before} → {apps_after}"));
    w.only_the_sentinel_arrives(&mut findings, seen).await;
    let still = w.call(&w.token, &Request::get(format!("/api/v1/app/{}", w.a.app))).await;
    findings.check(still.status == StatusCode::OK, || format!("logout revoked more than its own token: {still}"));
    findings.assert_none("routes outside applications with A's token");
}

/// Dashboard routes outside any application: what A's portal session gets (`POST /login`
/// without the sign-in page's token is refused; `POST /logout` ends the session, so it runs
/// last).
const DASHBOARD_OUTSIDE: &[(&str, &str, u16)] = &[
    ("GET", "/", 303),
    ("GET", "/login", 200),
    ("POST", "/login", 403),
    ("GET", "/portal", 200),
    ("GET", "/assets/style.css", 200),
    ("GET", "/assets/portal.js", 200),
    ("GET", "/assets/live.js", 200),
    ("GET", "/assets/icon.svg", 200),
    ("GET", "/apps", 403),
    ("GET", "/search", 403),
    ("GET", "/dead-letters", 403),
    ("POST", "/logout", 303),
];

/// The form fields of a dashboard form, besides its CSRF token.
fn form_for(path: &str) -> Vec<(&'static str, &'static str)> {
    if path.ends_with("/recover") {
        vec![("since", "2000-01-01T00:00:00Z")]
    } else if path.ends_with("/replay") || path.ends_with("/delete") {
        vec![("confirmed", "true")]
    } else if path.ends_with("/endpoint/new") || path.ends_with("/settings") {
        vec![("url", "http://127.0.0.1:9/twin")]
    } else if path.ends_with("/enabled") {
        vec![("enabled", "true")]
    } else if path.ends_with("/headers") {
        vec![("name", "x-twin"), ("value", "v")]
    } else {
        vec![]
    }
}

/// A dashboard session and the CSRF token of its forms.
struct Session {
    cookie: String,
    csrf: String,
}

impl Session {
    async fn sign_in(server: &TestServer, token: &str, home: &str) -> Self {
        let cookie = server.sign_in(token).await;
        let html = reqwest::Client::new().get(server.url(home)).header("cookie", &cookie).send().await.unwrap();
        let html = html.text().await.unwrap();
        let at = html.find("name=\"csrf\" value=\"").expect("a form on the page") + 19;
        Self { csrf: html[at..].split('"').next().unwrap().to_owned(), cookie }
    }

    async fn call_once(&self, server: &TestServer, op: &Operation, keys: &Keys) -> (Request, Answer) {
        let client = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap();
        let path = fill(&op.path, keys);
        let mut builder = client.request(op.method.clone(), server.url(&path)).header("cookie", &self.cookie);
        if op.has_body {
            let mut form = form_for(&op.path);
            form.push(("csrf", self.csrf.as_str()));
            builder = builder.form(&form);
        }
        let response = builder.send().await.expect("the server answers");
        let answer = Answer { status: response.status(), body: response.text().await.unwrap() };
        (Request { method: op.method.clone(), path, body: None }, answer)
    }

    /// [`Session::call`], waiting out a 429 (the session's token is over its request
    /// budget; it answers before any handler runs) and sending again.
    async fn call(&self, server: &TestServer, op: &Operation, keys: &Keys) -> (Request, Answer) {
        for _ in 0..60 {
            let (request, answer) = self.call_once(server, op, keys).await;
            if answer.status != StatusCode::TOO_MANY_REQUESTS {
                return (request, answer);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        panic!("{} {} stayed rate-limited", op.method, op.path);
    }
}

/// Every dashboard route naming an application × A's portal session × B's ids (and uids)
/// → a 404 page, with a valid CSRF token on forms; A's own application with one id of B's
/// → what a never-created id gets; routes outside applications as classified; nothing of
/// B's on any page, no effect on B.
#[tokio::test]
async fn a_portal_session_reaches_nothing_of_another_application_in_the_dashboard() {
    let w = World::build().await;
    let mut findings = Findings::default();
    let operations = dashboard_operations();
    let session = Session::sign_in(&w.server, &w.token, &format!("/app/{}", w.a.app)).await;
    let before = w.b.snapshot(&w.server).await;
    let seen = w.receiver_b.requests().len();
    let scoped: Vec<&Operation> = operations.iter().filter(|op| op.is_app_scoped()).collect();
    assert!(scoped.iter().any(|op| op.method == Method::POST), "the dashboard's forms are in the table");
    for op in &scoped {
        for flavour in [Flavour::Ids, Flavour::Uids] {
            let (request, answer) = session.call(&w.server, op, &w.b.keys(flavour)).await;
            findings.check(answer.status == StatusCode::NOT_FOUND, || {
                format!("{request} ({flavour}) with A's session answered {answer}; expected a 404 page")
            });
            findings.no_leaks(&request, &answer, &w.b);
        }
        let (own, theirs) = (w.a.keys(Flavour::Ids), w.b.keys(Flavour::Ids));
        for param in op.params().into_iter().filter(|p| *p != "app_id") {
            let mut foreign = own.clone();
            foreign.insert(param.to_owned(), theirs[param].clone());
            let mut missing = own.clone();
            missing.insert(param.to_owned(), ghost(param));
            let (request, answer) = session.call(&w.server, op, &foreign).await;
            let (_, expected) = session.call(&w.server, op, &missing).await;
            findings.no_leaks(&request, &answer, &w.b);
            findings.check(answer.status == expected.status, || {
                format!("{request} (B's {param}) answered {answer}; a {param} that does not exist gets {expected}")
            });
        }
    }
    let outside: Vec<&Operation> = operations.iter().filter(|op| !op.is_app_scoped()).collect();
    let unclassified: Vec<String> = outside
        .iter()
        .filter(|op| !DASHBOARD_OUTSIDE.iter().any(|(m, p, _)| *m == op.method.as_str() && *p == op.path))
        .map(|op| op.key())
        .collect();
    assert!(unclassified.is_empty(), "dashboard routes to classify in DASHBOARD_OUTSIDE: {unclassified:?}");
    for (method, path, status) in DASHBOARD_OUTSIDE {
        let op = outside.iter().find(|op| op.method.as_str() == *method && op.path == *path);
        let op = op.unwrap_or_else(|| panic!("DASHBOARD_OUTSIDE names {method} {path}, which is not served"));
        let (request, answer) = session.call(&w.server, op, &w.a.keys(Flavour::Ids)).await;
        findings.check(answer.status.as_u16() == *status, || {
            format!("{request} with A's session answered {answer}; expected {status}")
        });
        findings.no_leaks(&request, &answer, &w.b);
    }
    let after = w.b.snapshot(&w.server).await;
    compare(&mut findings, "B", &before, &after);
    w.only_the_sentinel_arrives(&mut findings, seen).await;

    // Controls: an operator session gets the same requests answered (a page, or a form's
    // redirect), so the 404s above are not a missed route, a missing id or an invalid form.
    let operator = Session::sign_in(&w.server, ADMIN_TOKEN, "/").await;
    let mut twins = 0;
    for op in &scoped {
        for flavour in [Flavour::Ids, Flavour::Uids] {
            let keys = if op.method == Method::GET {
                w.b.keys(flavour)
            } else {
                twins += 1;
                Tenant::create(&w.server, &format!("dash-twin-{twins}"), &w.sink).await.keys(flavour)
            };
            let (request, answer) = operator.call(&w.server, op, &keys).await;
            let ok = answer.status == StatusCode::OK || answer.status == StatusCode::SEE_OTHER;
            findings.check(ok, || format!("control: operator {request} ({flavour}): {answer}"));
        }
    }
    findings.assert_none("A's portal session against B's ids in the dashboard");
}
