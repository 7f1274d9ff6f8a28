-- Herald's PostgreSQL schema, version 5: pollers (Herald extension), an application's
-- messages read by named consumers that pull them, each keeping its own position.
CREATE TABLE herald.poller (
    id            text PRIMARY KEY,
    app_id        text NOT NULL,
    uid           text,
    description   text NOT NULL,
    event_types   text[],
    channels      text[],
    filter        text,
    metadata      jsonb NOT NULL,
    created_at    bigint NOT NULL,
    updated_at    bigint NOT NULL
);
CREATE INDEX poller_app ON herald.poller (app_id, id);
CREATE UNIQUE INDEX poller_uid ON herald.poller (app_id, uid) WHERE uid IS NOT NULL;
-- A consumer's position: the (transaction, message id) of the last message it acknowledged.
CREATE TABLE herald.poller_consumer (
    poller_id     text NOT NULL,
    name          text NOT NULL,
    tx            bigint NOT NULL,
    msg_id        text NOT NULL,
    updated_at    bigint NOT NULL,
    PRIMARY KEY (poller_id, name)
);
-- The transaction that inserted each message (Herald's, or a producer's calling
-- herald.send_message). Readers order by (tx, id) and read only below the oldest
-- transaction still running, so a message that commits late never lands behind a reader's
-- position. Messages from before this version count as transaction 0.
ALTER TABLE herald.message ADD COLUMN tx xid8 NOT NULL DEFAULT '0';
ALTER TABLE herald.message ALTER COLUMN tx SET DEFAULT pg_current_xact_id();
CREATE INDEX message_log ON herald.message (app_id, tx, id);
