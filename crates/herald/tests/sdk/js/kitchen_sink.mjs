// The kitchen sink: every method of the official Svix JavaScript SDK, run against a real
// Herald (HERALD_URL, HERALD_TOKEN). The methods of the Svix operations Herald serves are
// exercised and their answers checked, webhooks included (verified with the SDK's own
// `Webhook`, and `v1a` signatures with Node's ed25519). The methods of operations Herald does
// not serve must fail cleanly: an `ApiException` with Herald's 404 or 405 JSON body, never a
// 2xx, a 5xx or an unparsable answer. Every SDK method must be called by the end, so a new
// SDK version's methods fail the run until they are sorted into one group or the other.
//
// The SDK is resolved from HERALD_TEST_NODE_MODULES (scripts/test.sh installs the pinned
// package.json there). Exits non-zero on the first failure.

import crypto from "node:crypto";
import http from "node:http";
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";

const require = createRequire(`${process.env.HERALD_TEST_NODE_MODULES}/`);
const { Svix, ApiException, Webhook, messageInRaw } = await import(pathToFileURL(require.resolve("svix")).href);

const SERVER = process.env.HERALD_URL;
const TOKEN = process.env.HERALD_TOKEN;

function check(condition, what, detail) {
  if (!condition) {
    throw new Error(`${what}${detail === undefined ? "" : `: ${JSON.stringify(detail)}`}`);
  }
}

function equal(actual, expected, what) {
  check(JSON.stringify(actual) === JSON.stringify(expected), what, { actual, expected });
}

async function eventually(probe, what, timeoutMs = 30000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** The ApiException a call must end in, with its status. */
async function refused(status, call, what) {
  try {
    await call();
  } catch (e) {
    check(e instanceof ApiException, `${what}: an ApiException`, String(e));
    equal(e.code, status, `${what}: the status`);
    return e.body;
  }
  throw new Error(`${what}: expected HTTP ${status}, got a success`);
}

/** The SDK's verifier must throw. */
async function refusedToVerify(verify, what) {
  try {
    verify();
  } catch {
    return;
  }
  throw new Error(`${what} verified a signature it did not make`);
}

// ---------------------------------------------------------------- coverage

/** Every method of the SDK, as `group.method` paths, read from the client itself. */
function sdkMethods(api, prefix = "", found = []) {
  const proto = Object.getPrototypeOf(api);
  for (const name of Object.getOwnPropertyNames(proto)) {
    const descriptor = Object.getOwnPropertyDescriptor(proto, name);
    if (descriptor.get) sdkMethods(api[name], `${prefix}${name}.`, found);
    else if (name !== "constructor" && typeof descriptor.value === "function") found.push(prefix + name);
  }
  return found;
}

/** The client, recording each method called on it. */
function tracked(api, called, prefix = "") {
  return new Proxy(api, {
    get(target, name, receiver) {
      const value = Reflect.get(target, name, receiver);
      if (typeof name !== "string") return value;
      if (typeof value === "function") {
        return (...args) => {
          called.add(prefix + name);
          return value.apply(target, args);
        };
      }
      if (value && typeof value === "object" && "requestCtx" in value) return tracked(value, called, `${prefix}${name}.`);
      return value;
    },
  });
}

// ---------------------------------------------------------------- receiver

const received = [];
let healed = false;
const receiver = http.createServer((req, res) => {
  const chunks = [];
  req.on("data", (c) => chunks.push(c));
  req.on("end", () => {
    received.push({ path: req.url, headers: req.headers, body: Buffer.concat(chunks).toString("utf8") });
    res.writeHead(req.url === "/fail" && !healed ? 500 : 200, { "content-type": "text/plain" });
    res.end("ok");
  });
});
await new Promise((r) => receiver.listen(0, "127.0.0.1", r));
const hooks = `http://127.0.0.1:${receiver.address().port}`;
const arrived = (path, count = 1) => eventually(() => received.filter((r) => r.path === path).length >= count, `${count} webhook(s) at ${path}`);

/** Herald's extension fields, unknown to the SDK's models, sent raw. */
async function rawPatch(path, body) {
  const answer = await fetch(SERVER + path, {
    method: "PATCH",
    headers: { authorization: `Bearer ${TOKEN}`, "content-type": "application/json" },
    body: JSON.stringify(body),
  });
  equal(answer.status, 200, `PATCH ${path}`);
}

/** A fresh ed25519 pair as Svix writes it: `whsk_<seed || public>` and `whpk_<public>`. */
function ed25519Pair() {
  const { privateKey, publicKey } = crypto.generateKeyPairSync("ed25519");
  const jwk = privateKey.export({ format: "jwk" });
  const seed = Buffer.from(jwk.d, "base64url");
  const pub = Buffer.from(jwk.x, "base64url");
  return { secret: `whsk_${Buffer.concat([seed, pub]).toString("base64")}`, public: `whpk_${pub.toString("base64")}`, publicKey };
}

/** Checks a `v1a` signature of a delivery per the Standard Webhooks specification. */
function verifiesV1a(publicKey, request) {
  const content = `${request.headers["webhook-id"]}.${request.headers["webhook-timestamp"]}.${request.body}`;
  return request.headers["webhook-signature"]
    .split(" ")
    .filter((s) => s.startsWith("v1a,"))
    .some((s) => crypto.verify(null, Buffer.from(content), publicKey, Buffer.from(s.slice(4), "base64")));
}

// ---------------------------------------------------------------- served

async function served(svix, called) {
  await svix.health.get();

  // Event types.
  const example = { invoice: "inv_1" };
  await svix.eventType.create({ name: "invoice.paid", description: "paid", schemas: { 1: { type: "object", examples: [example] } } });
  await svix.eventType.upsert("invoice.failed", { description: "failed" });
  equal((await svix.eventType.get("invoice.paid")).description, "paid", "eventType.get");
  check((await svix.eventType.patch("invoice.failed", { deprecated: true })).deprecated, "eventType.patch");
  equal((await svix.eventType.list()).data.map((e) => e.name), ["invoice.failed", "invoice.paid"], "event types by name");
  const bad = await refused(422, () => svix.eventType.create({ name: "bad.schema", description: "x", schemas: { 1: { type: 7 } } }), "an invalid schema");
  equal(bad.detail[0].loc, ["body", "schemas"], "the invalid schema's loc");
  await svix.eventType.delete("invoice.failed");
  equal((await svix.eventType.list()).data.map((e) => e.name), ["invoice.paid"], "archived types leave the list");
  check((await svix.eventType.list({ includeArchived: true })).data.length === 2, "includeArchived");

  // Applications: idempotent creation, get-or-create, upsert, patch, Svix pagination.
  const app = await svix.application.create({ name: "JS app", uid: "js-app", metadata: { k: "v" } }, { idempotencyKey: "js-app-1" });
  check(app.id.startsWith("app_"), "application.create", app);
  equal((await svix.application.create({ name: "another" }, { idempotencyKey: "js-app-1" })).id, app.id, "an idempotency key replays the first answer");
  equal((await svix.application.getOrCreate({ name: "again", uid: "js-app" })).id, app.id, "getOrCreate");
  equal((await svix.application.get("js-app")).id, app.id, "application.get by uid");
  equal((await svix.application.upsert(app.id, { name: "JS app 2" })).name, "JS app 2", "application.upsert");
  equal((await svix.application.patch(app.id, { throttleRate: 50 })).throttleRate, 50, "application.patch");
  const spares = [];
  for (const name of ["s1", "s2", "s3"]) spares.push((await svix.application.create({ name })).id);
  const first = await svix.application.list({ limit: 2 });
  equal(first.data.map((a) => a.id), [app.id, spares[0]], "applications oldest first");
  equal(first.prevIterator, `-${app.id}`, "prevIterator on the first page");
  const second = await svix.application.list({ limit: 2, iterator: first.iterator });
  equal(second.data.map((a) => a.id), spares.slice(1), "the next page");
  check(second.done, "the last page is done");
  const back = await svix.application.list({ limit: 2, iterator: second.prevIterator });
  equal(back.data.map((a) => a.id), first.data.map((a) => a.id), "back with prevIterator, in display order");
  check(back.done, "nothing before the first page");
  for (const id of spares) await svix.application.delete(id);
  await refused(404, () => svix.application.get(spares[0]), "a deleted application");

  // Endpoints, headers, secrets (an asymmetric one too).
  const ep = await svix.endpoint.create(app.id, { url: `${hooks}/ok`, uid: "main", eventTypes: ["invoice.paid"], headers: { "X-Custom": "1" } });
  check(ep.id.startsWith("ep_"), "endpoint.create", ep);
  const unknown = await refused(422, () => svix.endpoint.create(app.id, { url: `${hooks}/x`, eventTypes: ["no.such"] }), "unknown event types");
  equal(unknown.detail[0].msg, "The following event types don't exist: no.such", "Svix's message");
  const failing = await svix.endpoint.create(app.id, { url: `${hooks}/fail`, eventTypes: ["invoice.paid"] });
  await rawPatch(`/api/v1/app/${app.id}/endpoint/${failing.id}`, { delivery: { retry: { strategy: "fixed", intervalMs: 100, maxAttempts: 2 } } });
  equal((await svix.endpoint.get(app.id, "main")).id, ep.id, "endpoint.get by uid");
  equal((await svix.endpoint.upsert(app.id, ep.id, { url: `${hooks}/ok`, description: "up", eventTypes: ["invoice.paid"] })).description, "up", "endpoint.upsert");
  equal((await svix.endpoint.patch(app.id, ep.id, { description: "patched" })).description, "patched", "endpoint.patch");
  equal((await svix.endpoint.list(app.id)).data.map((e) => e.id), [failing.id, ep.id], "endpoints newest first");
  await svix.endpoint.setHeaders(app.id, ep.id, { headers: { "X-Custom": "2", Authorization: "Bearer t" } });
  await svix.endpoint.patchHeaders(app.id, ep.id, { headers: { "X-Extra": "3" } });
  const headers = await svix.endpoint.getHeaders(app.id, ep.id);
  equal([headers.headers, headers.sensitive], [{ "X-Custom": "2", "X-Extra": "3" }, ["Authorization"]], "endpoint headers");
  await refused(422, () => svix.endpoint.setHeaders(app.id, ep.id, { headers: { "x-amz-date": "1" } }), "a reserved header");
  const hmac = (await svix.endpoint.getSecret(app.id, ep.id)).key;
  check(hmac.startsWith("whsec_"), "endpoint.getSecret", hmac);
  const pair = ed25519Pair();
  equal(await svix.endpoint.rotateSecret(app.id, ep.id, { key: pair.secret }), undefined, "rotateSecret answers no body");
  equal((await svix.endpoint.getSecret(app.id, ep.id)).key, pair.public, "the public half is shown");

  // Messages: signed webhooks (v1a by the new key, v1 by the previous one), raw payloads.
  const msg = await svix.message.create(app.id, { eventType: "invoice.paid", eventId: "evt-1", payload: { invoice: "inv_9" } });
  check(msg.id.startsWith("msg_"), "message.create", msg);
  await refused(409, () => svix.message.create(app.id, { eventType: "invoice.paid", eventId: "evt-1", payload: {} }), "a repeated eventId");
  await arrived("/ok");
  const delivered = received.find((r) => r.path === "/ok");
  check(verifiesV1a(pair.publicKey, delivered), "the v1a signature verifies", delivered.headers["webhook-signature"]);
  new Webhook(hmac).verify(delivered.body, delivered.headers); // throws unless a v1 signature matches
  const stranger = `whsec_${crypto.randomBytes(24).toString("base64")}`;
  await refusedToVerify(() => new Webhook(stranger).verify(delivered.body, delivered.headers), "another key");
  equal(JSON.parse(delivered.body), { invoice: "inv_9" }, "the payload delivered");
  equal(delivered.headers["x-custom"], "2", "the endpoint's header");
  const raw = await svix.message.create(app.id, messageInRaw("invoice.paid", "plain=text&n=1", "application/x-www-form-urlencoded"));
  await arrived("/ok", 2);
  equal(received.filter((r) => r.path === "/ok")[1].body, "plain=text&n=1", "a raw payload is the body");
  equal((await svix.message.get(app.id, msg.id)).eventType, "invoice.paid", "message.get");
  equal((await svix.message.list(app.id)).data.map((m) => m.id), [raw.id, msg.id], "messages newest first");

  // Attempts.
  const attempts = await eventually(async () => {
    const page = await svix.messageAttempt.listByMsg(app.id, msg.id, { endpointId: ep.id });
    return page.data.length > 0 && page.data;
  }, "an attempt");
  equal(attempts[0].responseStatusCode, 200, "the attempt's status");
  equal((await svix.messageAttempt.get(app.id, msg.id, attempts[0].id)).id, attempts[0].id, "messageAttempt.get");
  check((await svix.messageAttempt.listByEndpoint(app.id, ep.id)).data.some((a) => a.msgId === msg.id), "listByEndpoint");
  check((await svix.messageAttempt.listAttemptedMessages(app.id, ep.id)).data.some((m) => m.id === msg.id), "listAttemptedMessages");
  await svix.messageAttempt.resend(app.id, msg.id, ep.id);
  await arrived("/ok", 3);
  await svix.messageAttempt.expungeContent(app.id, msg.id, attempts[0].id);
  equal((await svix.messageAttempt.get(app.id, msg.id, attempts[0].id)).response, "EXPUNGED", "an expunged response");

  // Endpoint operations: stats, send-example (the ping exactly), recover.
  const since = new Date(Date.now() - 3600 * 1000);
  await eventually(async () => (await svix.endpoint.getStats(app.id, ep.id, { since })).success >= 2, "stats");
  await svix.endpoint.sendExample(app.id, ep.id, { eventType: "svix.ping" });
  await svix.endpoint.sendExample(app.id, ep.id, { eventType: "invoice.paid" });
  await eventually(() => received.some((r) => r.body === '{"success":true}'), "the ping");
  await eventually(() => received.some((r) => r.body === JSON.stringify(example)), "the schema example");
  await eventually(async () => {
    const destinations = await svix.messageAttempt.listAttemptedDestinations(app.id, msg.id);
    return destinations.data.find((d) => d.id === failing.id)?.status === 2;
  }, "the dead letter");
  healed = true;
  const task = await svix.endpoint.recover(app.id, failing.id, { since });
  equal(task.task, "endpoint.recover", "endpoint.recover");
  await arrived("/fail", 3);

  // Deleted endpoints stay among a message's destinations; expunged payloads read as Svix's.
  await svix.endpoint.delete(app.id, failing.id);
  await refused(404, () => svix.endpoint.get(app.id, failing.id), "a deleted endpoint");
  const destinations = await svix.messageAttempt.listAttemptedDestinations(app.id, msg.id);
  equal(destinations.data.map((d) => d.id), [ep.id, failing.id], "destinations in creation order, the deleted one included");
  await svix.message.expungeContent(app.id, msg.id);
  equal((await svix.message.get(app.id, msg.id, { withContent: true })).payload, { expired: true }, "an expunged payload");
  await refused(400, () => svix.messageAttempt.resend(app.id, msg.id, ep.id), "resending an expunged message");

  // Portal access: scoped, read-only on its application, ended by logout.
  const access = await svix.authentication.appPortalAccess(app.id, {});
  const portal = tracked(new Svix(access.token, { serverUrl: SERVER }), called);
  equal((await portal.application.get(app.id)).id, app.id, "the portal token reads its application");
  await refused(403, () => portal.application.patch(app.id, { name: "mine" }), "the portal token changes its application");
  await portal.authentication.logout();
  await refused(401, () => portal.application.get(app.id), "a logged-out token");
  const inline = await refused(422, () => svix.authentication.appPortalAccess("ghost", { application: { name: "Ghost" } }), "inline app without uid");
  equal(inline.detail[0].type, "application_uid_missing", "the inline application's error");

  await svix.endpoint.delete(app.id, ep.id);
  await svix.application.delete(app.id);
  return app.id;
}

// ---------------------------------------------------------------- not served

/** Methods of Svix operations Herald does not serve, with arguments that serialize. */
function notServed(svix, appId) {
  const since = new Date();
  const a = appId;
  return {
    "authentication.expireAll": () => svix.authentication.expireAll(a, {}),
    "authentication.streamPortalAccess": () => svix.authentication.streamPortalAccess("strm_x", {}),
    "authentication.streamLogout": () => svix.authentication.streamLogout(),
    "authentication.streamExpireAll": () => svix.authentication.streamExpireAll("strm_x", {}),
    "authentication.rotateStreamPollerToken": () => svix.authentication.rotateStreamPollerToken("strm_x", "sink_x", {}),
    "authentication.getStreamPollerToken": () => svix.authentication.getStreamPollerToken("strm_x", "sink_x"),
    "autoconfigSubscription.create": () => svix.autoconfigSubscription.create({}),
    "autoconfigSubscription.rotate": () => svix.autoconfigSubscription.rotate("x", {}),
    "backgroundTask.list": () => svix.backgroundTask.list(),
    "backgroundTask.get": () => svix.backgroundTask.get("qtask_x"),
    "connector.list": () => svix.connector.list(),
    "connector.create": () => svix.connector.create({ name: "c", transformation: "x" }),
    "connector.get": () => svix.connector.get("x"),
    "connector.upsert": () => svix.connector.upsert("x", { name: "c", transformation: "x" }),
    "connector.delete": () => svix.connector.delete("x"),
    "connector.patch": () => svix.connector.patch("x", {}),
    "destination.list": () => svix.destination.list(a),
    "destination.create": () => svix.destination.create(a, {}),
    "destination.get": () => svix.destination.get(a, "x"),
    "destination.upsert": () => svix.destination.upsert(a, "x", {}),
    "destination.delete": () => svix.destination.delete(a, "x"),
    "destination.patch": () => svix.destination.patch(a, "x", {}),
    "destination.transformation.get": () => svix.destination.transformation.get(a, "x"),
    "destination.transformation.patch": () => svix.destination.transformation.patch(a, "x", {}),
    "endpoint.replayMissing": () => svix.endpoint.replayMissing(a, "ep_x", { since }),
    "endpoint.bulkReplay": () => svix.endpoint.bulkReplay(a, "ep_x", { since }),
    "endpoint.transformationPartialUpdate": () => svix.endpoint.transformationPartialUpdate(a, "ep_x", {}),
    "endpoint.transformation.get": () => svix.endpoint.transformation.get(a, "ep_x"),
    "endpoint.transformation.patch": () => svix.endpoint.transformation.patch(a, "ep_x", {}),
    "environment.export": () => svix.environment.export(),
    "environment.import": () => svix.environment.import({}),
    "eventType.importOpenapi": () => svix.eventType.importOpenapi({}),
    "ingest.authentication.consumerPortalAccess": () => svix.ingest.authentication.consumerPortalAccess("src_x", {}),
    "ingest.endpoint.list": () => svix.ingest.endpoint.list("src_x"),
    "ingest.endpoint.create": () => svix.ingest.endpoint.create("src_x", { url: "https://x.example.com/" }),
    "ingest.endpoint.get": () => svix.ingest.endpoint.get("src_x", "x"),
    "ingest.endpoint.upsert": () => svix.ingest.endpoint.upsert("src_x", "x", { url: "https://x.example.com/" }),
    "ingest.endpoint.delete": () => svix.ingest.endpoint.delete("src_x", "x"),
    "ingest.endpoint.getSecret": () => svix.ingest.endpoint.getSecret("src_x", "x"),
    "ingest.endpoint.rotateSecret": () => svix.ingest.endpoint.rotateSecret("src_x", "x", {}),
    "ingest.endpoint.getHeaders": () => svix.ingest.endpoint.getHeaders("src_x", "x"),
    "ingest.endpoint.setHeaders": () => svix.ingest.endpoint.setHeaders("src_x", "x", { headers: {} }),
    "ingest.endpoint.transformation.get": () => svix.ingest.endpoint.transformation.get("src_x", "x"),
    "ingest.endpoint.transformation.patch": () => svix.ingest.endpoint.transformation.patch("src_x", "x", {}),
    "ingest.source.list": () => svix.ingest.source.list(),
    "ingest.source.create": () => svix.ingest.source.create({ name: "s", type: "generic-webhook" }),
    "ingest.source.get": () => svix.ingest.source.get("src_x"),
    "ingest.source.upsert": () => svix.ingest.source.upsert("src_x", { name: "s", type: "generic-webhook" }),
    "ingest.source.delete": () => svix.ingest.source.delete("src_x"),
    "ingest.source.rotateToken": () => svix.ingest.source.rotateToken("src_x"),
    "integration.list": () => svix.integration.list(a),
    "integration.create": () => svix.integration.create(a, { name: "i" }),
    "integration.get": () => svix.integration.get(a, "integ_x"),
    "integration.update": () => svix.integration.update(a, "integ_x", { name: "i" }),
    "integration.delete": () => svix.integration.delete(a, "integ_x"),
    "integration.rotateKey": () => svix.integration.rotateKey(a, "integ_x"),
    "message.precheck": () => svix.message.precheck(a, { eventType: "invoice.paid" }),
    "message.bulkExpungeContent": () => svix.message.bulkExpungeContent(a, {}),
    "message.expungeAllContents": () => svix.message.expungeAllContents(a),
    "message.poller.poll": () => svix.message.poller.poll(a, "sink_x"),
    "message.poller.consumerSeek": () => svix.message.poller.consumerSeek(a, "sink_x", "c", { after: since }),
    "message.poller.consumerPoll": () => svix.message.poller.consumerPoll(a, "sink_x", "c"),
    "operationalWebhook.endpoint.list": () => svix.operationalWebhook.endpoint.list(),
    "operationalWebhook.endpoint.create": () => svix.operationalWebhook.endpoint.create({ url: "https://x.example.com/" }),
    "operationalWebhook.endpoint.get": () => svix.operationalWebhook.endpoint.get("ep_x"),
    "operationalWebhook.endpoint.upsert": () => svix.operationalWebhook.endpoint.upsert("ep_x", { url: "https://x.example.com/" }),
    "operationalWebhook.endpoint.delete": () => svix.operationalWebhook.endpoint.delete("ep_x"),
    "operationalWebhook.endpoint.getSecret": () => svix.operationalWebhook.endpoint.getSecret("ep_x"),
    "operationalWebhook.endpoint.rotateSecret": () => svix.operationalWebhook.endpoint.rotateSecret("ep_x", {}),
    "operationalWebhook.endpoint.getHeaders": () => svix.operationalWebhook.endpoint.getHeaders("ep_x"),
    "operationalWebhook.endpoint.setHeaders": () => svix.operationalWebhook.endpoint.setHeaders("ep_x", { headers: {} }),
    "statistics.aggregateEventTypes": () => svix.statistics.aggregateEventTypes(),
    "statistics.aggregateAppStats": () => svix.statistics.aggregateAppStats({ since, until: since }),
    "streaming.sinkHeadersGet": () => svix.streaming.sinkHeadersGet("strm_x", "sink_x"),
    "streaming.sinkHeadersPatch": () => svix.streaming.sinkHeadersPatch("strm_x", "sink_x", { headers: {} }),
    "streaming.eventType.list": () => svix.streaming.eventType.list(),
    "streaming.eventType.create": () => svix.streaming.eventType.create({ name: "e" }),
    "streaming.eventType.get": () => svix.streaming.eventType.get("e"),
    "streaming.eventType.upsert": () => svix.streaming.eventType.upsert("e", {}),
    "streaming.eventType.delete": () => svix.streaming.eventType.delete("e"),
    "streaming.eventType.patch": () => svix.streaming.eventType.patch("e", {}),
    "streaming.events.get": () => svix.streaming.events.get("strm_x", "sink_x"),
    "streaming.events.create": () => svix.streaming.events.create("strm_x", { events: [] }),
    "streaming.sink.list": () => svix.streaming.sink.list("strm_x"),
    "streaming.sink.create": () => svix.streaming.sink.create("strm_x", { type: "poller", config: {} }),
    "streaming.sink.get": () => svix.streaming.sink.get("strm_x", "sink_x"),
    "streaming.sink.upsert": () => svix.streaming.sink.upsert("strm_x", "sink_x", { type: "poller", config: {} }),
    "streaming.sink.delete": () => svix.streaming.sink.delete("strm_x", "sink_x"),
    "streaming.sink.patch": () => svix.streaming.sink.patch("strm_x", "sink_x", {}),
    "streaming.sink.getSecret": () => svix.streaming.sink.getSecret("strm_x", "sink_x"),
    "streaming.sink.rotateSecret": () => svix.streaming.sink.rotateSecret("strm_x", "sink_x", {}),
    "streaming.sink.transformation.get": () => svix.streaming.sink.transformation.get("strm_x", "sink_x"),
    "streaming.sink.transformation.patch": () => svix.streaming.sink.transformation.patch("strm_x", "sink_x", {}),
    "streaming.stream.list": () => svix.streaming.stream.list(),
    "streaming.stream.create": () => svix.streaming.stream.create({ name: "s" }),
    "streaming.stream.get": () => svix.streaming.stream.get("strm_x"),
    "streaming.stream.upsert": () => svix.streaming.stream.upsert("strm_x", { name: "s" }),
    "streaming.stream.delete": () => svix.streaming.stream.delete("strm_x"),
    "streaming.stream.patch": () => svix.streaming.stream.patch("strm_x", {}),
  };
}

async function notServedFailCleanly(svix, appId) {
  for (const [method, call] of Object.entries(notServed(svix, appId))) {
    try {
      await call();
    } catch (e) {
      check(e instanceof ApiException, `${method}: an ApiException, not ${e}`);
      check(e.code === 404 || e.code === 405, `${method}: 404 or 405`, { code: e.code, body: e.body });
      const codes = { 404: "not_found", 405: "method_not_allowed" };
      equal(e.body.code, codes[e.code], `${method}: Herald's error body`);
      continue;
    }
    throw new Error(`${method}: Herald does not serve it, yet it succeeded`);
  }
}

// ---------------------------------------------------------------- main

const called = new Set();
const plain = new Svix(TOKEN, { serverUrl: SERVER });
const svix = tracked(plain, called);
try {
  const appId = await served(svix, called);
  await notServedFailCleanly(svix, appId);
  const missing = sdkMethods(plain).filter((m) => !called.has(m));
  check(missing.length === 0, "every SDK method is called", missing);
  console.log(`ALL ${called.size} SDK METHODS CHECKED`);
} finally {
  receiver.close();
}
