-- Idempotency records in the order they were made: a new record is appended, and only the
-- small (scope, key) index takes a random page. Expiry walks the oldest rows (creation
-- order is append order), so no index on the creation time.
ALTER TABLE idempotency RENAME TO idempotency_old;
CREATE TABLE idempotency (
    seq           INTEGER PRIMARY KEY,
    scope         TEXT NOT NULL,
    key           TEXT NOT NULL,
    status        INTEGER NOT NULL,
    body          TEXT NOT NULL,
    created_at    INTEGER NOT NULL
) STRICT;
INSERT INTO idempotency (scope, key, status, body, created_at)
    SELECT scope, key, status, body, created_at FROM idempotency_old ORDER BY created_at;
DROP TABLE idempotency_old;
CREATE UNIQUE INDEX idempotency_key ON idempotency(scope, key);
