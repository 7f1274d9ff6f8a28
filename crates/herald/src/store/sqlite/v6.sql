-- Endpoint filters and transforms (jq; JSON {"filter", "transform"}, NULL: neither), kept
-- with deleted endpoints' tombstones like the rest of their settings.
ALTER TABLE endpoint ADD COLUMN scripts TEXT;
ALTER TABLE deleted_endpoint ADD COLUMN scripts TEXT;
