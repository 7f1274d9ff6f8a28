-- Herald's PostgreSQL schema, version 4: endpoint filters and transforms (jq; NULL:
-- neither), kept with deleted endpoints' tombstones like the rest of their settings.
ALTER TABLE herald.endpoint ADD COLUMN scripts jsonb;
ALTER TABLE herald.deleted_endpoint ADD COLUMN scripts jsonb;
-- The credentials presented to an endpoint's receiver (sealed; empty: none). Tombstones
-- keep none, like headers and secrets.
ALTER TABLE herald.endpoint ADD COLUMN auth text NOT NULL DEFAULT '';
ALTER TABLE herald.deleted_endpoint ADD COLUMN auth text NOT NULL DEFAULT '';
-- An application's egress proxy over the server's (operator only): its URL without
-- credentials, and those sealed. NULL: the server's.
ALTER TABLE herald.app ADD COLUMN proxy_url text;
ALTER TABLE herald.app ADD COLUMN proxy_credentials text;
