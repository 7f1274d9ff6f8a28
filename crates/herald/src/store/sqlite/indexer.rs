//! The index tables (schema version 4): what queries need by application, endpoint or
//! message, filled in bulk off the commit path. The writer runs [`catch_up`] between
//! batches every so often; each table is complete up to its watermark (a message or attempt
//! seq), and queries read the rows beyond it from the tables themselves ([`tail`]). Sorted
//! bulk inserts touch each index page once per pass, where one insert per message in the
//! commit dirtied a page per tenant and commit.

use rusqlite::{Connection, OptionalExtension, params};

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
pub fn catch_up(conn: &Connection) -> StoreResult<()> {
    let behind = |name: &str| -> StoreResult<bool> { Ok(newest(conn, name)? > watermark(conn, name)?) };
    if !behind("message")? && !behind("attempt")? {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let done = index(conn).and_then(|()| Ok(conn.execute_batch("COMMIT")?));
    // A failed COMMIT may leave the transaction open: the writer's next batch must not
    // find it so.
    if done.is_err() && !conn.is_autocommit() {
        let _ = conn.execute_batch("ROLLBACK");
    }
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
