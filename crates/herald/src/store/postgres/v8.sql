-- Herald's PostgreSQL schema, version 8: event destinations (Herald extension), the broker
-- an endpoint publishes to instead of POSTing to its URL, with the broker's credentials,
-- sealed under the server key (empty text: the endpoint delivers over HTTP). Tombstones
-- keep it empty, like other secrets.
ALTER TABLE herald.endpoint ADD COLUMN destination text NOT NULL DEFAULT '';
ALTER TABLE herald.deleted_endpoint ADD COLUMN destination text NOT NULL DEFAULT '';
