-- Herald's PostgreSQL schema, version 9: held deliveries. A delivery made at ingest and
-- claimed there by the ingesting process (not strictly ordered) is one small row of
-- `held` until its first outcome, instead of a `delivery` row that the outcome updates. The
-- outcome moves it into `delivery` in its settled state (a success: inserted once, never
-- updated), so the common path neither updates a row nor leaves a dead tuple behind in
-- `delivery` and its seven indexes; `held` stays as small as what is in flight, and its
-- pages stay in memory. Anything else that needs the delivery (a release, a resend, its
-- endpoint deleted) moves it into `delivery` first. Its id comes from `delivery`'s own
-- sequence, so the move keeps it.
CREATE TABLE herald.held (
    id            bigint PRIMARY KEY,
    msg_id        text NOT NULL,
    endpoint_id   text NOT NULL,
    app_id        text NOT NULL,
    owner         text NOT NULL,      -- the node holding the claim (see herald.node)
    created_at    bigint NOT NULL
);
CREATE INDEX held_msg ON herald.held (msg_id);

-- Every delivery as readers see it: the rows, and each held delivery as the pending,
-- never-attempted row it stands for.
CREATE VIEW herald.deliveries AS
    SELECT id, msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner, strict, created_at
    FROM herald.delivery
    UNION ALL
    SELECT id, msg_id, endpoint_id, app_id, 0::smallint, 0, created_at, 0::smallint, owner, false, created_at
    FROM herald.held;
