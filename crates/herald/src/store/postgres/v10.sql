-- Herald's PostgreSQL schema, version 10: every text column compares bytes (COLLATE "C").
-- Herald's ids, keys and names are compared for equality and ordered for pagination; a
-- database created with a language locale (en_US.UTF-8 and the like) would otherwise make
-- every B-tree comparison on them go through the locale's collation rules (strcoll), the
-- largest single item of the database's CPU in the hot path's index inserts, and would order
-- ids unlike their bytes (unlike SQLite and unlike Herald itself). Changing a column's
-- collation does not rewrite the table; its indexes are rebuilt, once per table here. A
-- column added by a later version declares COLLATE "C" itself (a test checks every one).
DROP VIEW herald.deliveries;

DO $$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT c.table_name,
               string_agg(format('ALTER COLUMN %I TYPE %s COLLATE "C"', c.column_name,
                                 CASE c.udt_name WHEN 'text' THEN 'text' ELSE 'text[]' END), ', ') AS changes
        FROM information_schema.columns c
        JOIN information_schema.tables USING (table_schema, table_name)
        WHERE c.table_schema = 'herald' AND table_type = 'BASE TABLE'
          AND c.udt_name IN ('text', '_text') AND c.collation_name IS DISTINCT FROM 'C'
        GROUP BY c.table_name
    LOOP
        EXECUTE format('ALTER TABLE herald.%I %s', t.table_name, t.changes);
    END LOOP;
END
$$;

-- As version 9 made it: every delivery as readers see it.
CREATE VIEW herald.deliveries AS
    SELECT id, msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner, strict, created_at
    FROM herald.delivery
    UNION ALL
    SELECT id, msg_id, endpoint_id, app_id, 0::smallint, 0, created_at, 0::smallint, owner, false, created_at
    FROM herald.held;
