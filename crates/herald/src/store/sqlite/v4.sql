-- Herald's SQLite schema, version 4: the append-mostly hot path.
--
-- A message is one row that also names the deliveries made at its ingest (`dests`); an
-- attempt is one appended row. A delivery has a row of its own only when its state is more
-- than "made at ingest, then delivered at the first try": retries handed back to the store,
-- dead letters, cancellations, resends, strictly ordered deliveries, deliveries committed
-- unclaimed. The deliveries a process holds in memory from their ingest on are listed in
-- `held` until they settle. So the common commit touches right-hand pages only: the
-- message table and its id index, the attempt table and its id index, and `held`.
--
-- What queries need by application or endpoint is kept in index tables filled in bulk
-- off the commit path (`message_by_app`, `dest_by_endpoint`, `attempt_by_msg`,
-- `attempt_by_endpoint`); a query reads them up to their watermark and the short tail
-- beyond it from the tables themselves.

ALTER TABLE message RENAME TO message_v3;
ALTER TABLE delivery RENAME TO delivery_v3;
ALTER TABLE attempt RENAME TO attempt_v3;
DROP INDEX message_app;
DROP INDEX message_event_id;
DROP INDEX delivery_msg;
DROP INDEX delivery_endpoint;
DROP INDEX delivery_due;
DROP INDEX delivery_strict;
DROP INDEX delivery_pending;
DROP INDEX delivery_dead;
DROP INDEX attempt_msg;
DROP INDEX attempt_endpoint;

CREATE TABLE message (
    seq           INTEGER PRIMARY KEY,   -- commit order
    id            TEXT NOT NULL,
    app_id        TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    event_id      TEXT,
    channels      TEXT,
    payload       TEXT,                  -- NULL once expunged
    created_at    INTEGER NOT NULL,
    dests         TEXT NOT NULL          -- JSON array of the endpoints of the deliveries made at ingest
) STRICT;
CREATE UNIQUE INDEX message_id ON message(id);
CREATE UNIQUE INDEX message_event_id ON message(app_id, event_id) WHERE event_id IS NOT NULL;
INSERT INTO message (id, app_id, event_type, event_id, channels, payload, created_at, dests)
    SELECT id, app_id, event_type, event_id, channels, payload, created_at, '[]' FROM message_v3 ORDER BY id;

-- A delivery's id is its message's seq × 65536 + its place: the position in `dests` for the
-- deliveries made at ingest, 32768 up for later ones (resends to other endpoints).
CREATE TABLE delivery (
    id               INTEGER PRIMARY KEY,
    msg_seq          INTEGER NOT NULL,
    msg_id           TEXT NOT NULL,
    endpoint_id      TEXT NOT NULL,
    app_id           TEXT NOT NULL,
    state            INTEGER NOT NULL,  -- 0 pending, 1 delivered, 2 dead, 3 canceled
    attempts         INTEGER NOT NULL,  -- attempts made in the current round
    next_at          INTEGER NOT NULL,  -- when pending: due time; else time of the last change
    trigger          INTEGER NOT NULL,  -- 0 scheduled, 1 manual
    owner            TEXT,              -- the process holding the claim, if any
    strict           INTEGER NOT NULL,  -- 1: the endpoint takes its messages one at a time, in order
    resend           INTEGER NOT NULL,  -- a resend accepted while it was held (see record_outcome)
    created_at       INTEGER NOT NULL,  -- the message's
    last_status      INTEGER,           -- the last attempt's status code (0: no answer), error class, error
    last_error_class TEXT,
    last_error       TEXT
) STRICT;
CREATE INDEX delivery_msg ON delivery(msg_seq);
CREATE INDEX delivery_endpoint ON delivery(endpoint_id, msg_id);
CREATE INDEX delivery_due ON delivery(next_at) WHERE state = 0 AND owner IS NULL AND strict = 0;
CREATE INDEX delivery_strict ON delivery(endpoint_id, id) WHERE state = 0 AND strict = 1;
CREATE INDEX delivery_pending ON delivery(created_at, attempts) WHERE state = 0;
CREATE INDEX delivery_dead ON delivery(endpoint_id, created_at) WHERE state = 2;

CREATE TEMP TABLE delivery_ids AS
    SELECT d.id AS old, m.seq * 65536 + 32768 + ROW_NUMBER() OVER (PARTITION BY d.msg_id ORDER BY d.id) - 1 AS new
    FROM delivery_v3 d JOIN message m ON m.id = d.msg_id;
INSERT INTO delivery (id, msg_seq, msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner, strict,
                      resend, created_at, last_status, last_error_class, last_error)
    SELECT i.new, m.seq, d.msg_id, d.endpoint_id, d.app_id, d.state, d.attempts, d.next_at, d.trigger, d.owner,
           d.strict, d.resend, d.created_at, a.status_code, a.error_class, a.error
    FROM delivery_v3 d
    JOIN delivery_ids i ON i.old = d.id
    JOIN message m ON m.id = d.msg_id
    LEFT JOIN attempt_v3 a ON a.id = (SELECT max(id) FROM attempt_v3 WHERE delivery_id = d.id);

CREATE TABLE attempt (
    seq           INTEGER PRIMARY KEY,
    id            TEXT NOT NULL,
    delivery_id   INTEGER NOT NULL,
    msg_seq       INTEGER NOT NULL,
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
) STRICT;
CREATE UNIQUE INDEX attempt_id ON attempt(id);
INSERT INTO attempt (id, delivery_id, msg_seq, msg_id, endpoint_id, app_id, created_at, url, status_code,
                     duration_ms, delivered, error_class, error, response, trigger, attempt_no)
    SELECT a.id, i.new, m.seq, a.msg_id, a.endpoint_id, a.app_id, a.created_at, a.url, a.status_code, a.duration_ms,
           a.delivered, a.error_class, a.error, a.response, a.trigger, a.attempt_no
    FROM attempt_v3 a JOIN delivery_ids i ON i.old = a.delivery_id JOIN message m ON m.id = a.msg_id
    ORDER BY a.id;
DROP TABLE delivery_ids;
DROP TABLE attempt_v3;
DROP TABLE delivery_v3;
DROP TABLE message_v3;

-- The deliveries made at ingest that the process holds in memory and that have not settled
-- yet (a delivery leaves when it is delivered at its first try, or gets a row of its own).
-- What a crashed process held is found here at the next start.
CREATE TABLE held (id INTEGER PRIMARY KEY, owner TEXT NOT NULL) STRICT;

-- Index tables, filled in bulk up to their watermark.
CREATE TABLE watermark (name TEXT PRIMARY KEY, seq INTEGER NOT NULL) STRICT;
CREATE TABLE message_by_app (
    app_id TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (app_id, id)
) STRICT, WITHOUT ROWID;
CREATE TABLE dest_by_endpoint (
    endpoint_id TEXT NOT NULL, msg_id TEXT NOT NULL, delivery_id INTEGER NOT NULL, PRIMARY KEY (endpoint_id, msg_id)
) STRICT, WITHOUT ROWID;
CREATE TABLE attempt_by_msg (
    msg_seq INTEGER NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (msg_seq, id)
) STRICT, WITHOUT ROWID;
CREATE TABLE attempt_by_endpoint (
    endpoint_id TEXT NOT NULL, id TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (endpoint_id, id)
) STRICT, WITHOUT ROWID;
INSERT INTO message_by_app SELECT app_id, id, seq FROM message ORDER BY app_id, id;
INSERT INTO attempt_by_msg SELECT msg_seq, id, seq FROM attempt ORDER BY msg_seq, id;
INSERT INTO attempt_by_endpoint SELECT endpoint_id, id, seq FROM attempt ORDER BY endpoint_id, id;
INSERT INTO watermark VALUES ('message', (SELECT coalesce(max(seq), 0) FROM message)),
                             ('attempt', (SELECT coalesce(max(seq), 0) FROM attempt));
