-- Herald's SQLite schema, version 1. Applied once at start-up inside one transaction;
-- PRAGMA user_version records the version.

CREATE TABLE app (
    id            TEXT PRIMARY KEY,
    uid           TEXT UNIQUE,
    name          TEXT NOT NULL,
    metadata      TEXT NOT NULL,
    throttle_rate INTEGER,
    max_concurrency INTEGER,       -- Herald extension: attempts in flight at most
    weight        INTEGER,         -- Herald extension: share of contended capacity
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
) STRICT;

CREATE TABLE endpoint (
    id            TEXT PRIMARY KEY,
    app_id        TEXT NOT NULL REFERENCES app(id) ON DELETE CASCADE,
    uid           TEXT,
    url           TEXT NOT NULL,
    description   TEXT NOT NULL,
    disabled      INTEGER NOT NULL,
    event_types   TEXT,          -- JSON array or NULL (all event types)
    channels      TEXT,          -- JSON array or NULL (all channels)
    metadata      TEXT NOT NULL,
    throttle_rate INTEGER,
    headers       TEXT NOT NULL, -- JSON object
    secrets       TEXT NOT NULL, -- sealed: v1.<key id>.<nonce+ciphertext>
    delivery      TEXT NOT NULL, -- JSON delivery settings as given
    request       TEXT,          -- JSON request settings (postbacks), when given
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    UNIQUE (app_id, uid)
) STRICT;
CREATE INDEX endpoint_app ON endpoint(app_id, id);

CREATE TABLE event_type (
    name          TEXT PRIMARY KEY,
    description   TEXT NOT NULL,
    archived      INTEGER NOT NULL,
    deprecated    INTEGER NOT NULL,
    schemas       TEXT,
    feature_flag  TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
) STRICT;

-- Immutable once written (but for expunging the payload).
CREATE TABLE message (
    id            TEXT PRIMARY KEY,
    app_id        TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    event_id      TEXT,
    channels      TEXT,
    payload       TEXT,          -- NULL once expunged
    created_at    INTEGER NOT NULL
) STRICT;
CREATE INDEX message_app ON message(app_id, id);
CREATE UNIQUE INDEX message_event_id ON message(app_id, event_id) WHERE event_id IS NOT NULL;

-- The small, hot, mutable row: one per (message, endpoint).
CREATE TABLE delivery (
    id            INTEGER PRIMARY KEY,
    msg_id        TEXT NOT NULL,
    endpoint_id   TEXT NOT NULL,
    app_id        TEXT NOT NULL,
    state         INTEGER NOT NULL,  -- 0 pending, 1 delivered, 2 dead, 3 canceled
    attempts      INTEGER NOT NULL,  -- attempts made in the current round
    next_at       INTEGER NOT NULL,  -- when pending: due time; else time of the last change
    trigger       INTEGER NOT NULL,  -- 0 scheduled, 1 manual
    owner         TEXT,              -- the process holding the claim, if any
    strict        INTEGER NOT NULL,  -- 1: the endpoint takes its messages one at a time, in order
    created_at    INTEGER NOT NULL
) STRICT;
CREATE UNIQUE INDEX delivery_msg ON delivery(msg_id, endpoint_id);
CREATE INDEX delivery_endpoint ON delivery(endpoint_id, msg_id);
-- Only unclaimed pending work is indexed for claiming: freshly ingested deliveries are
-- claimed by the ingesting process at insert time and never enter this index.
CREATE INDEX delivery_due ON delivery(next_at) WHERE state = 0 AND owner IS NULL AND strict = 0;
-- The pending deliveries of strictly ordered endpoints, head first.
CREATE INDEX delivery_strict ON delivery(endpoint_id, id) WHERE state = 0 AND strict = 1;
-- Pending work by age, covering the health summary (counts by first try or retry, oldest).
CREATE INDEX delivery_pending ON delivery(created_at, attempts) WHERE state = 0;
-- Dead letters by endpoint and time (recover, counts, analysis).
CREATE INDEX delivery_dead ON delivery(endpoint_id, created_at) WHERE state = 2;

-- Append-only history of every HTTP try. Keyed by its (time-sortable) id with no rowid,
-- so an insert touches one B-tree fewer.
CREATE TABLE attempt (
    id            TEXT PRIMARY KEY,
    delivery_id   INTEGER NOT NULL,
    msg_id        TEXT NOT NULL,
    endpoint_id   TEXT NOT NULL,
    app_id        TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    url           TEXT NOT NULL,
    status_code   INTEGER NOT NULL,
    duration_ms   INTEGER NOT NULL,
    delivered     INTEGER NOT NULL,
    error_class   TEXT,
    error         TEXT,
    response      TEXT NOT NULL,
    trigger       INTEGER NOT NULL,
    attempt_no    INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX attempt_msg ON attempt(msg_id, id);
CREATE INDEX attempt_endpoint ON attempt(endpoint_id, id);

CREATE TABLE idempotency (
    scope         TEXT NOT NULL,
    key           TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    status        INTEGER NOT NULL,
    body          TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX idempotency_created ON idempotency(created_at);

CREATE TABLE portal_token (
    hash          TEXT PRIMARY KEY,
    app_id        TEXT NOT NULL,
    expires_at    INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    sensitive     INTEGER NOT NULL DEFAULT 0
) STRICT, WITHOUT ROWID;

-- Circuit breakers that are not plainly closed, so they survive a restart.
CREATE TABLE endpoint_health (
    endpoint_id   TEXT PRIMARY KEY,
    breaker       TEXT NOT NULL,     -- JSON
    updated_at    INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- Attempt durations per endpoint and hour, as mergeable histograms (JSON bucket counts).
CREATE TABLE latency (
    endpoint_id   TEXT NOT NULL,
    hour          INTEGER NOT NULL,
    histogram     TEXT NOT NULL,
    PRIMARY KEY (endpoint_id, hour)
) STRICT, WITHOUT ROWID;

-- Per-minute outcome counts for the health summary.
CREATE TABLE stats_minute (
    minute        INTEGER PRIMARY KEY,
    delivered     INTEGER NOT NULL,
    failed        INTEGER NOT NULL,
    delivery_ms   INTEGER NOT NULL   -- sum of message-to-delivery times of `delivered`
) STRICT;
