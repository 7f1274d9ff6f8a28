-- Herald's SQLite schema, version 3: the history the dashboard's charts draw, the
-- breakers' history, and the portal's brand per application.

-- Messages accepted (flushed by each process every second), deliveries dead-lettered, and
-- the queue's depth (sampled once a minute: deliveries waiting for their first attempt and
-- for a retry), per minute, next to the delivered and failed counts. Kept seven days.
ALTER TABLE stats_minute ADD COLUMN accepted INTEGER NOT NULL DEFAULT 0;
ALTER TABLE stats_minute ADD COLUMN dead INTEGER NOT NULL DEFAULT 0;
ALTER TABLE stats_minute ADD COLUMN pending INTEGER;
ALTER TABLE stats_minute ADD COLUMN retrying INTEGER;

-- Attempts per endpoint and hour that succeeded or failed, written with the attempts
-- themselves. Kept seven days, like the latency histograms of the same hours.
CREATE TABLE endpoint_hour (
    endpoint_id   TEXT NOT NULL,
    hour          INTEGER NOT NULL,
    succeeded     INTEGER NOT NULL,
    failed        INTEGER NOT NULL,
    PRIMARY KEY (endpoint_id, hour)
) STRICT, WITHOUT ROWID;

-- Every circuit breaker transition, as the process that saw it recorded it. Kept seven days.
CREATE TABLE breaker_event (
    endpoint_id   TEXT NOT NULL,
    at            INTEGER NOT NULL,
    kind          TEXT NOT NULL,     -- opened, reopened, closed, reset (endpoint changed), retryNow
    failures      INTEGER NOT NULL,  -- consecutive failures when it happened
    cooldown_ms   INTEGER NOT NULL
) STRICT;
CREATE INDEX breaker_event_endpoint ON breaker_event(endpoint_id, at);

-- The portal's brand for one application (JSON; NULL: the server's), set by the operator.
ALTER TABLE app ADD COLUMN portal_brand TEXT;
