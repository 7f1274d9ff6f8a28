-- Idempotency keys: every eight consecutive runs share one filter (`sqlite/keys/`), so a
-- new key's lookup reads one cache line per eight runs instead of one per run. The runs a
-- group covers keep an empty filter of their own.
CREATE TABLE idempotency_groups (
    first_run  INTEGER PRIMARY KEY,
    last_run   INTEGER NOT NULL,
    filter     BLOB NOT NULL
) STRICT;
