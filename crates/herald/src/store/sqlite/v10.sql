-- Event destinations (Herald extension): the broker an endpoint publishes to instead of
-- POSTing to its URL, with the broker's credentials, sealed under the server key (empty
-- text: the endpoint delivers over HTTP). Tombstones keep it empty, like other secrets.
ALTER TABLE endpoint ADD COLUMN destination TEXT NOT NULL DEFAULT '';
ALTER TABLE deleted_endpoint ADD COLUMN destination TEXT NOT NULL DEFAULT '';
