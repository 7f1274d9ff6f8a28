-- Idempotency keys found log-structured (`sqlite/keys.rs`), not through a unique index of
-- random keys: records are only appended, the keys past the last run are kept in memory,
-- and older ones are in runs, each written sorted by the key's hash in one go.
DROP INDEX idempotency_key;
CREATE TABLE idempotency_run (
    run   INTEGER NOT NULL,
    hash  INTEGER NOT NULL,
    seq   INTEGER NOT NULL,
    PRIMARY KEY (run, hash, seq)
) WITHOUT ROWID;
-- A run is used once its row is here, with its Bloom filter.
CREATE TABLE idempotency_runs (
    run       INTEGER PRIMARY KEY,
    last_seq  INTEGER NOT NULL,
    filter    BLOB NOT NULL
) STRICT;
