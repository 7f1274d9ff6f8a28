-- Herald's PostgreSQL schema, version 1. Everything lives in the `herald` schema.
-- Times are milliseconds since the Unix epoch (bigint), as in every Herald store.

CREATE TABLE herald.app (
    id            text PRIMARY KEY,
    uid           text UNIQUE,
    name          text NOT NULL,
    metadata      jsonb NOT NULL,
    throttle_rate integer,
    max_concurrency integer,
    weight        integer,
    created_at    bigint NOT NULL,
    updated_at    bigint NOT NULL
);

CREATE TABLE herald.endpoint (
    id            text PRIMARY KEY,
    app_id        text NOT NULL REFERENCES herald.app(id) ON DELETE CASCADE,
    uid           text,
    url           text NOT NULL,
    description   text NOT NULL,
    disabled      boolean NOT NULL,
    event_types   text[],
    channels      text[],
    metadata      jsonb NOT NULL,
    throttle_rate integer,
    headers       jsonb NOT NULL,
    secrets       text NOT NULL, -- sealed: v1.<key id>.<nonce+ciphertext>
    delivery      jsonb NOT NULL,
    request       jsonb,
    created_at    bigint NOT NULL,
    updated_at    bigint NOT NULL,
    UNIQUE (app_id, uid)
);
CREATE INDEX endpoint_app ON herald.endpoint (app_id, id);

CREATE TABLE herald.event_type (
    name          text PRIMARY KEY,
    description   text NOT NULL,
    archived      boolean NOT NULL,
    deprecated    boolean NOT NULL,
    schemas       jsonb,
    feature_flag  text,
    created_at    bigint NOT NULL,
    updated_at    bigint NOT NULL
);

CREATE TABLE herald.message (
    id            text PRIMARY KEY,
    app_id        text NOT NULL,
    event_type    text NOT NULL,
    event_id      text,
    channels      text[],
    payload       text,
    created_at    bigint NOT NULL
);
CREATE INDEX message_app ON herald.message (app_id, id);
CREATE UNIQUE INDEX message_event_id ON herald.message (app_id, event_id) WHERE event_id IS NOT NULL;

-- The small, hot, mutable row: one per (message, endpoint).
CREATE TABLE herald.delivery (
    id            bigserial PRIMARY KEY,
    msg_id        text NOT NULL,
    endpoint_id   text NOT NULL,
    app_id        text NOT NULL,
    state         smallint NOT NULL,  -- 0 pending, 1 delivered, 2 dead, 3 canceled
    attempts      integer NOT NULL,
    next_at       bigint NOT NULL,
    trigger       smallint NOT NULL,
    owner         text,               -- the node holding the claim (see herald.node)
    strict        boolean NOT NULL,   -- the endpoint takes its messages one at a time, in order
    created_at    bigint NOT NULL
);
CREATE UNIQUE INDEX delivery_msg ON herald.delivery (msg_id, endpoint_id);
CREATE INDEX delivery_endpoint ON herald.delivery (endpoint_id, msg_id);
CREATE INDEX delivery_due ON herald.delivery (next_at) WHERE state = 0 AND owner IS NULL AND NOT strict;
CREATE INDEX delivery_strict ON herald.delivery (endpoint_id, id) WHERE state = 0 AND strict;
CREATE INDEX delivery_pending ON herald.delivery (created_at, attempts) WHERE state = 0;
CREATE INDEX delivery_dead ON herald.delivery (endpoint_id, created_at) WHERE state = 2;
CREATE INDEX delivery_owner ON herald.delivery (owner) WHERE owner IS NOT NULL;

CREATE TABLE herald.attempt (
    id            text PRIMARY KEY,
    delivery_id   bigint NOT NULL,
    msg_id        text NOT NULL,
    endpoint_id   text NOT NULL,
    app_id        text NOT NULL,
    created_at    bigint NOT NULL,
    url           text NOT NULL,
    status_code   integer NOT NULL,
    duration_ms   bigint NOT NULL,
    delivered     boolean NOT NULL,
    error_class   text,
    error         text,
    response      text NOT NULL,
    trigger       smallint NOT NULL,
    attempt_no    integer NOT NULL
);
CREATE INDEX attempt_msg ON herald.attempt (msg_id, id);
CREATE INDEX attempt_endpoint ON herald.attempt (endpoint_id, id);

CREATE TABLE herald.idempotency (
    scope         text NOT NULL,
    key           text NOT NULL,
    fingerprint   text NOT NULL,
    status        integer NOT NULL,
    body          text NOT NULL,
    created_at    bigint NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_created ON herald.idempotency (created_at);

CREATE TABLE herald.portal_token (
    hash          text PRIMARY KEY,
    app_id        text NOT NULL,
    expires_at    bigint NOT NULL,
    created_at    bigint NOT NULL,
    sensitive     boolean NOT NULL DEFAULT false
);

-- Circuit breakers that are not plainly closed, so they survive a restart.
CREATE TABLE herald.endpoint_health (
    endpoint_id   text PRIMARY KEY,
    breaker       jsonb NOT NULL,
    updated_at    bigint NOT NULL
);

-- Attempt durations per endpoint and hour, as mergeable histograms (bucket counts).
CREATE TABLE herald.latency (
    endpoint_id   text NOT NULL,
    hour          bigint NOT NULL,
    histogram     jsonb NOT NULL,
    PRIMARY KEY (endpoint_id, hour)
);

-- Per-minute outcome counts for the health summary.
CREATE TABLE herald.stats_minute (
    minute        bigint PRIMARY KEY,
    delivered     bigint NOT NULL,
    failed        bigint NOT NULL,
    delivery_ms   bigint NOT NULL
);

-- Processes holding claims; a claim is valid while its node's heartbeat is fresh.
CREATE TABLE herald.node (
    id            text PRIMARY KEY,
    heartbeat_at  timestamptz NOT NULL
);

-- Settings the SQL functions read (written by Herald at start-up).
CREATE TABLE herald.setting (
    name          text PRIMARY KEY,
    value         text NOT NULL
);

-- Milliseconds since the epoch, from the transaction-independent clock.
CREATE FUNCTION herald.now_ms() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;

-- A prefixed, time-sortable id in Herald's format: 48 bits of milliseconds and 80 random
-- bits, as 22 base62 digits.
CREATE FUNCTION herald.new_id(prefix text) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    alphabet constant text := '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
    n numeric;
    out text := '';
BEGIN
    n := herald.now_ms()::numeric * 1208925819614629174706176             -- * 2^80
       + floor(random() * 549755813888)::numeric * 1099511627776          -- 39 random bits << 40
       + floor(random() * 1099511627776)::numeric;                        -- 40 random bits
    FOR i IN 1..22 LOOP
        out := substr(alphabet, (n % 62)::int + 1, 1) || out;
        n := floor(n / 62);
    END LOOP;
    RETURN prefix || out;
END
$$;

-- The transactional outbox: call inside your own transaction. The message (with one delivery
-- per matching endpoint) commits or rolls back with it, and is then delivered exactly as if
-- it had been posted to the API. Returns the message id.
CREATE FUNCTION herald.send_message(
    app text,
    event_type text,
    payload jsonb,
    event_id text DEFAULT NULL,
    channels text[] DEFAULT NULL
) RETURNS text LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_app text;
    v_msg text;
    v_body text := send_message.payload::text;
    v_now bigint := herald.now_ms();
    v_max bigint := coalesce((SELECT s.value::bigint FROM herald.setting s WHERE s.name = 'max_payload_bytes'), 262144);
BEGIN
    SELECT a.id INTO v_app FROM herald.app a
    WHERE a.id = send_message.app OR a.uid = send_message.app
    ORDER BY a.id = send_message.app DESC LIMIT 1;
    IF v_app IS NULL THEN
        RAISE EXCEPTION 'herald: application % not found', send_message.app USING ERRCODE = 'no_data_found';
    END IF;
    IF send_message.event_type IS NULL OR send_message.event_type !~ '^[a-zA-Z0-9._-]+$'
       OR length(send_message.event_type) > 256 THEN
        RAISE EXCEPTION 'herald: invalid event type %', send_message.event_type USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF send_message.event_id IS NOT NULL
       AND (send_message.event_id !~ '^[a-zA-Z0-9._-]+$' OR length(send_message.event_id) > 256) THEN
        RAISE EXCEPTION 'herald: invalid event id %', send_message.event_id USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF send_message.payload IS NULL OR jsonb_typeof(send_message.payload) <> 'object' THEN
        RAISE EXCEPTION 'herald: the payload must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF octet_length(v_body) > v_max THEN
        RAISE EXCEPTION 'herald: the payload is % bytes; the limit is %', octet_length(v_body), v_max
            USING ERRCODE = 'program_limit_exceeded';
    END IF;
    v_msg := herald.new_id('msg_');
    -- A repeated event id violates herald.message_event_id, as the API's 409 does.
    INSERT INTO herald.message (id, app_id, event_type, event_id, channels, payload, created_at)
    VALUES (v_msg, v_app, send_message.event_type, send_message.event_id, send_message.channels, v_body, v_now);
    INSERT INTO herald.delivery (msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner, strict, created_at)
    SELECT v_msg, e.id, v_app, 0, 0, v_now, 0, NULL, coalesce(e.delivery->>'ordering', '') = 'strict', v_now
    FROM herald.endpoint e
    WHERE e.app_id = v_app
      AND NOT e.disabled
      AND (e.event_types IS NULL OR cardinality(e.event_types) = 0 OR send_message.event_type = ANY (e.event_types))
      AND (e.channels IS NULL OR cardinality(e.channels) = 0
           OR (send_message.channels IS NOT NULL AND e.channels && send_message.channels));
    -- No NOTIFY here: a transaction that notifies takes a database-wide lock until its
    -- commit is flushed, which would serialize every producer's commits. Workers find
    -- outbox messages by polling (queue.poll_interval_ms), an index-only probe.
    RETURN v_msg;
END
$$;
