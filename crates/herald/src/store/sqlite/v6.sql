-- Endpoint filters and transforms (jq; JSON {"filter", "transform"}, NULL: neither), kept
-- with deleted endpoints' tombstones like the rest of their settings.
ALTER TABLE endpoint ADD COLUMN scripts TEXT;
ALTER TABLE deleted_endpoint ADD COLUMN scripts TEXT;
-- The credentials presented to an endpoint's receiver (sealed; empty: none). Tombstones
-- keep none, like headers and secrets.
ALTER TABLE endpoint ADD COLUMN auth TEXT NOT NULL DEFAULT '';
ALTER TABLE deleted_endpoint ADD COLUMN auth TEXT NOT NULL DEFAULT '';
-- An application's egress proxy over the server's (operator only): its URL without
-- credentials, and those sealed. NULL: the server's.
ALTER TABLE app ADD COLUMN proxy_url TEXT;
ALTER TABLE app ADD COLUMN proxy_credentials TEXT;
