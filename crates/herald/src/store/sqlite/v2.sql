-- Herald's SQLite schema, version 2 (applied after version 1, in one transaction).

-- A resend accepted while a dispatcher held the delivery pending (its attempt may already
-- be on the wire): the outcome of that attempt puts the delivery back for a manual attempt
-- instead of settling it. Cleared by every claim (a claim's attempt starts after it).
ALTER TABLE delivery ADD COLUMN resend INTEGER NOT NULL DEFAULT 0;

-- Endpoint headers are sealed like secrets from this version on: the column holds
-- `v1.<key id>.<…>`; rows written before are sealed at the first start (see the catalog).

-- A repeated idempotency key replays the first answer whatever the new body is (as Svix
-- does): the request's fingerprint is no longer kept.
ALTER TABLE idempotency DROP COLUMN fingerprint;

-- Dashboard sessions. The cookie holds a random session secret; only its hash is stored.
CREATE TABLE session (
    hash          TEXT PRIMARY KEY,  -- SHA-256 (hex) of the cookie's secret
    id            TEXT NOT NULL UNIQUE, -- the name it is listed and revoked by (ses_…)
    app_id        TEXT,              -- NULL: an operator session
    token_hash    TEXT NOT NULL,     -- SHA-256 (hex) of the token it signed in with
    created_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL
) STRICT, WITHOUT ROWID;
CREATE INDEX session_expires ON session(expires_at);

-- Endpoints deleted since, as a message's attempted destinations still show them (as Svix
-- does): the endpoint's row without its secrets and headers.
CREATE TABLE deleted_endpoint (
    id            TEXT PRIMARY KEY,
    app_id        TEXT NOT NULL,
    uid           TEXT,
    url           TEXT NOT NULL,
    description   TEXT NOT NULL,
    disabled      INTEGER NOT NULL,
    event_types   TEXT,
    channels      TEXT,
    metadata      TEXT NOT NULL,
    throttle_rate INTEGER,
    headers       TEXT NOT NULL,  -- always empty
    secrets       TEXT NOT NULL,  -- always empty
    delivery      TEXT NOT NULL,
    request       TEXT,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
) STRICT;
CREATE INDEX deleted_endpoint_app ON deleted_endpoint(app_id);
