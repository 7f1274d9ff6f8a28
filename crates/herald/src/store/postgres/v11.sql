-- Payloads compressed at rest (`store::packing`), as SQLite stores them: a message's payload
-- is in `payload` as text, or in `packed` as a zstd frame, never both. PostgreSQL's own
-- writes keep payloads as text for now (`herald.send_message` and Herald's ingest alike);
-- the column lets both backends share their statements.
ALTER TABLE herald.message ADD COLUMN packed bytea;
