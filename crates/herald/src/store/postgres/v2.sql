-- Herald's PostgreSQL schema, version 2.

-- A resend accepted while a dispatcher held the delivery pending (its attempt may already
-- be on the wire): the outcome of that attempt puts the delivery back for a manual attempt
-- instead of settling it. Cleared by every claim (a claim's attempt starts after it).
ALTER TABLE herald.delivery ADD COLUMN resend boolean NOT NULL DEFAULT false;

-- Endpoint headers are sealed like secrets from this version on: the column holds
-- `v1.<key id>.<…>`; rows written before are sealed at the first start (see the catalog).
ALTER TABLE herald.endpoint ALTER COLUMN headers TYPE text USING headers::text;

-- A repeated idempotency key replays the first answer whatever the new body is (as Svix
-- does): the request's fingerprint is no longer kept.
ALTER TABLE herald.idempotency DROP COLUMN fingerprint;

-- Dashboard sessions. The cookie holds a random session secret; only its hash is stored.
CREATE TABLE herald.session (
    hash          text PRIMARY KEY,  -- SHA-256 (hex) of the cookie's secret
    id            text NOT NULL UNIQUE, -- the name it is listed and revoked by (ses_…)
    app_id        text,              -- NULL: an operator session
    token_hash    text NOT NULL,     -- SHA-256 (hex) of the token it signed in with
    created_at    bigint NOT NULL,
    expires_at    bigint NOT NULL
);
CREATE INDEX session_expires ON herald.session (expires_at);

-- Endpoints deleted since, as a message's attempted destinations still show them (as Svix
-- does): the endpoint's row without its secrets and headers.
CREATE TABLE herald.deleted_endpoint (
    id            text PRIMARY KEY,
    app_id        text NOT NULL,
    uid           text,
    url           text NOT NULL,
    description   text NOT NULL,
    disabled      boolean NOT NULL,
    event_types   text[],
    channels      text[],
    metadata      jsonb NOT NULL,
    throttle_rate integer,
    headers       text NOT NULL,  -- always empty
    secrets       text NOT NULL,  -- always empty
    delivery      jsonb NOT NULL,
    request       jsonb,
    created_at    bigint NOT NULL,
    updated_at    bigint NOT NULL
);
CREATE INDEX deleted_endpoint_app ON herald.deleted_endpoint (app_id);
