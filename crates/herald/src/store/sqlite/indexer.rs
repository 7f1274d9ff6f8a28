//! The index tables (schema version 4): what queries need by application, endpoint or
//! message, filled in bulk off the commit path. The writer runs [`catch_up`] between
//! batches every so often; each table is complete up to its watermark (a message or attempt
//! seq), and queries read the rows beyond it from the tables themselves ([`tail`]). Sorted
//! bulk inserts touch each index page once per pass, where one insert per message in the
//! commit dirtied a page per tenant and commit.

use rusqlite::{Connection, OptionalExtension, params};

use super::writer::own_transaction;
use crate::store::StoreResult;

/// The seq up to which the index tables of `name` ("message" or "attempt") are filled.
pub fn watermark(conn: &Connection, name: &str) -> StoreResult<i64> {
    Ok(conn
        .prepare_cached("SELECT seq FROM watermark WHERE name = ?")?
        .query_row([name], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

/// Fills the index tables up to the newest message and attempt, in one transaction (run by
/// the writer thread, the only one that adds rows, so what it reads first stays true).
///
/// The pass commits without waiting for the disk (`synchronous = NORMAL` for its own
/// transaction; the writer's connection is `FULL` before and after). Nothing is
/// acknowledged on it: it is rebuilt from the tables if a power cut loses it, and the log is
/// written in order, so the next batch's synced commit makes it durable too. The writer,
/// which every ingest waits on, no longer waits for an fsync per pass.
pub fn catch_up(conn: &Connection) -> StoreResult<()> {
    let behind = |name: &str| -> StoreResult<bool> { Ok(newest(conn, name)? > watermark(conn, name)?) };
    if !behind("message")? && !behind("attempt")? {
        return Ok(());
    }
    conn.execute_batch("PRAGMA synchronous = NORMAL")?;
    let done = own_transaction(conn, || index(conn));
    // Every ingest's acknowledgement rests on this: a writer that cannot restore it stops.
    conn.execute_batch("PRAGMA synchronous = FULL").expect("restoring synchronous = FULL on the writer");
    done
}

/// The most rows of each table one pass indexes: passes stay short (the writer waits for
/// them), and a backlog is caught up over a few.
const PASS: i64 = 2_000;

/// Each watermark's table and the statements that index its rows `?1 < seq <= ?2`, each
/// inserting in its index's order.
const INDEXES: [(&str, &[&str]); 2] = [
    (
        "message",
        &[
            "INSERT INTO message_by_app SELECT app_id, id, seq FROM message WHERE seq > ?1 AND seq <= ?2
             ORDER BY app_id, id",
            "INSERT INTO message_seq_by_app SELECT app_id, seq FROM message WHERE seq > ?1 AND seq <= ?2
             ORDER BY app_id, seq",
            "INSERT OR IGNORE INTO dest_by_endpoint
             SELECT j.value, m.id, m.seq * 65536 + j.key FROM message m, json_each(m.dests) j
             WHERE m.seq > ?1 AND m.seq <= ?2 ORDER BY 1, 2",
        ],
    ),
    (
        "attempt",
        &[
            "INSERT INTO attempt_by_msg SELECT msg_seq, id, seq FROM attempt WHERE seq > ?1 AND seq <= ?2
             ORDER BY msg_seq, id",
            "INSERT INTO attempt_by_endpoint SELECT endpoint_id, id, seq FROM attempt WHERE seq > ?1 AND seq <= ?2
             ORDER BY endpoint_id, id",
        ],
    ),
];

pub(super) fn index(conn: &Connection) -> StoreResult<()> {
    for (name, statements) in INDEXES {
        let (from, to) = (watermark(conn, name)?, newest(conn, name)?);
        let to = to.min(from + PASS);
        if to > from {
            for sql in statements {
                conn.prepare_cached(sql)?.execute(params![from, to])?;
            }
            set(conn, name, to)?;
        }
    }
    Ok(())
}

fn newest(conn: &Connection, table: &str) -> StoreResult<i64> {
    let sql = format!("SELECT coalesce(max(seq), 0) FROM {table}");
    Ok(conn.prepare_cached(&sql)?.query_row([], |r| r.get(0))?)
}

fn set(conn: &Connection, name: &str, seq: i64) -> StoreResult<()> {
    conn.prepare_cached("INSERT INTO watermark VALUES (?1, ?2) ON CONFLICT (name) DO UPDATE SET seq = excluded.seq")?
        .execute(params![name, seq])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use super::*;
    use crate::config::Config;
    use crate::store::sqlite::SqliteStore;

    /// A migrated database's writing connection as the store sets it up, with one message
    /// (to `ep_1`) not yet indexed.
    fn writer_with_a_message(path: &Path) -> Connection {
        drop(SqliteStore::open(path, &Config::defaults().store, &Arc::default()).unwrap());
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(
            "PRAGMA synchronous = FULL;
             INSERT INTO message (id, app_id, event_type, created_at, dests)
             VALUES ('msg_1', 'app_1', 'user.created', 0, '[\"ep_1\"]');",
        )
        .unwrap();
        conn
    }

    fn synchronous(conn: &Connection) -> i64 {
        conn.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap()
    }

    fn count(conn: &Connection, table: &str) -> i64 {
        conn.query_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0)).unwrap()
    }

    #[test]
    fn a_pass_indexes_without_leaving_the_writer_unsynced() {
        let dir = tempfile::tempdir().unwrap();
        let conn = writer_with_a_message(&dir.path().join("herald.db"));
        catch_up(&conn).unwrap();
        assert_eq!(synchronous(&conn), 2, "the writer's commits are FULL again after a pass");
        assert!(conn.is_autocommit());
        assert_eq!((count(&conn, "message_by_app"), count(&conn, "dest_by_endpoint")), (1, 1));
        assert_eq!(watermark(&conn, "message").unwrap(), 1);
    }

    #[test]
    fn a_failed_pass_leaves_no_transaction_and_the_writer_synced() {
        let dir = tempfile::tempdir().unwrap();
        let conn = writer_with_a_message(&dir.path().join("herald.db"));
        conn.execute_batch(
            "CREATE TRIGGER refuse BEFORE INSERT ON message_seq_by_app BEGIN SELECT RAISE(ABORT, 'disk full'); END;",
        )
        .unwrap();
        assert!(catch_up(&conn).is_err());
        assert_eq!(synchronous(&conn), 2);
        assert!(conn.is_autocommit(), "the failed pass was rolled back");
        assert_eq!((count(&conn, "message_by_app"), watermark(&conn, "message").unwrap()), (0, 0));
        conn.execute_batch("DROP TRIGGER refuse").unwrap();
        catch_up(&conn).unwrap();
        assert_eq!((count(&conn, "message_seq_by_app"), watermark(&conn, "message").unwrap()), (1, 1));
    }
}
