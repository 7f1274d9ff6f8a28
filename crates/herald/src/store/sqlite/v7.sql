-- Pollers (Herald extension): an application's messages, filtered like an endpoint's, read
-- by named consumers that pull them, each keeping its own position (a message seq).
CREATE TABLE poller (
    id            TEXT PRIMARY KEY,
    app_id        TEXT NOT NULL,
    uid           TEXT,
    description   TEXT NOT NULL,
    event_types   TEXT,                 -- JSON array; NULL: every event type
    channels      TEXT,                 -- JSON array; NULL: every channel
    filter        TEXT,                 -- jq; NULL: none
    metadata      TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL
) STRICT;
CREATE INDEX poller_app ON poller(app_id, id);
CREATE UNIQUE INDEX poller_uid ON poller(app_id, uid) WHERE uid IS NOT NULL;
CREATE TABLE poller_consumer (
    poller_id     TEXT NOT NULL,
    name          TEXT NOT NULL,
    position      INTEGER NOT NULL,     -- the seq of the last message it acknowledged
    updated_at    INTEGER NOT NULL,
    PRIMARY KEY (poller_id, name)
) STRICT, WITHOUT ROWID;
-- An application's messages in commit order (seq), filled by the indexer with the other
-- index tables up to the message watermark; readers take the rest from `message`.
CREATE TABLE message_seq_by_app (
    app_id TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (app_id, seq)
) STRICT, WITHOUT ROWID;
INSERT INTO message_seq_by_app
    SELECT app_id, seq FROM message WHERE seq <= (SELECT seq FROM watermark WHERE name = 'message')
    ORDER BY app_id, seq;
