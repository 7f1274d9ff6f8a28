-- Herald's PostgreSQL schema, version 3: the history the dashboard's charts draw, the
-- breakers' history, and the portal's brand per application.

-- Messages accepted (flushed by each process every second), deliveries dead-lettered, and
-- the queue's depth (sampled once a minute: deliveries waiting for their first attempt and
-- for a retry), per minute, next to the delivered and failed counts. Kept seven days.
ALTER TABLE herald.stats_minute ADD COLUMN accepted bigint NOT NULL DEFAULT 0;
ALTER TABLE herald.stats_minute ADD COLUMN dead bigint NOT NULL DEFAULT 0;
ALTER TABLE herald.stats_minute ADD COLUMN pending bigint;
ALTER TABLE herald.stats_minute ADD COLUMN retrying bigint;

-- Attempts per endpoint and hour that succeeded or failed, written with the attempts
-- themselves. Kept seven days, like the latency histograms of the same hours.
CREATE TABLE herald.endpoint_hour (
    endpoint_id   text NOT NULL,
    hour          bigint NOT NULL,
    succeeded     bigint NOT NULL,
    failed        bigint NOT NULL,
    PRIMARY KEY (endpoint_id, hour)
);

-- Every circuit breaker transition, as the process that saw it recorded it. Kept seven days.
CREATE TABLE herald.breaker_event (
    endpoint_id   text NOT NULL,
    at            bigint NOT NULL,
    kind          text NOT NULL,     -- opened, reopened, closed, reset (endpoint changed), retryNow
    failures      integer NOT NULL,  -- consecutive failures when it happened
    cooldown_ms   bigint NOT NULL
);
CREATE INDEX breaker_event_endpoint ON herald.breaker_event(endpoint_id, at);

-- The portal's brand for one application (JSON; NULL: the server's), set by the operator.
ALTER TABLE herald.app ADD COLUMN portal_brand jsonb;
