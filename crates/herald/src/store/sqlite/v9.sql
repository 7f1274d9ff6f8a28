-- Svix's deprecated endpoint `version`: a number the API lets callers set (at least 1) and
-- reads back; nothing else reads it.
ALTER TABLE endpoint ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
ALTER TABLE deleted_endpoint ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
