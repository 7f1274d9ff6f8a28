-- Herald's PostgreSQL schema, version 7: Svix's deprecated endpoint `version`, a number the
-- API lets callers set (at least 1) and reads back; nothing else reads it.
ALTER TABLE herald.endpoint ADD COLUMN version integer NOT NULL DEFAULT 1;
ALTER TABLE herald.deleted_endpoint ADD COLUMN version integer NOT NULL DEFAULT 1;
-- The feature flags a portal token was issued with (a JSON array): event types gated by a
-- flag the token lacks are hidden from it, as in Svix.
ALTER TABLE herald.portal_token ADD COLUMN feature_flags text NOT NULL DEFAULT '[]';
