-- Herald's PostgreSQL schema, version 4: endpoint filters and transforms (jq; NULL:
-- neither), kept with deleted endpoints' tombstones like the rest of their settings.
ALTER TABLE herald.endpoint ADD COLUMN scripts jsonb;
ALTER TABLE herald.deleted_endpoint ADD COLUMN scripts jsonb;
