//! App-portal tokens and idempotency records on SQLite.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use super::rows::{from_json, to_json};
use crate::clock::Millis;
use crate::ids::AppId;
use crate::ids::first_body_at;
use crate::store::sql::{self, sqlite};
use crate::store::{AccessStore, EndSessions, PortalToken, Purge, Session, StoreResult, StoredResponse};

use crate::store::sql::SESSION_COLUMNS;

fn session(r: &rusqlite::Row<'_>) -> rusqlite::Result<Session> {
    Ok(Session {
        hash: r.get(0)?,
        id: r.get(1)?,
        app_id: r.get::<_, Option<String>>(2)?.map(AppId::from_trusted),
        token_hash: r.get(3)?,
        created_at: r.get(4)?,
        expires_at: r.get(5)?,
    })
}

fn token_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<PortalToken> {
    Ok(PortalToken {
        hash: r.get(0)?,
        app_id: AppId::from_trusted(r.get(1)?),
        expires_at: r.get(2)?,
        created_at: r.get(3)?,
        sensitive: r.get(4)?,
        feature_flags: from_json(r, 5)?,
    })
}

#[async_trait]
impl AccessStore for SqliteStore {
    async fn insert_token(&self, token: &PortalToken) -> StoreResult<()> {
        let token = token.clone();
        self.writer
            .write(move |conn| {
                conn.execute(
                    sqlite(sql::INSERT_TOKEN),
                    params![
                        token.hash,
                        token.app_id.as_str(),
                        token.expires_at,
                        token.created_at,
                        token.sensitive,
                        to_json(&token.feature_flags)
                    ],
                )?;
                Ok(())
            })
            .await
    }

    async fn token(&self, hash: &str) -> StoreResult<Option<PortalToken>> {
        let hash = hash.to_owned();
        self.readers
            .read(move |conn| Ok(conn.prepare_cached(sqlite(sql::TOKEN))?.query_row([&hash], token_row).optional()?))
            .await
    }

    async fn revoke_token(&self, hash: &str) -> StoreResult<()> {
        let hash = hash.to_owned();
        self.writer
            .write(move |conn| {
                conn.execute(sqlite(sql::REVOKE_TOKEN), [&hash])?;
                Ok(())
            })
            .await
    }

    async fn expire_tokens(&self, app: &AppId, at: Millis) -> StoreResult<u64> {
        let app = app.clone();
        self.writer
            .write(move |conn| {
                let changed = conn.execute(sqlite(sql::EXPIRE_TOKENS), params![app.as_str(), at])?;
                Ok(changed as u64)
            })
            .await
    }

    async fn app_tokens(&self, app: &AppId, now: Millis) -> StoreResult<Vec<PortalToken>> {
        let app = app.clone();
        self.readers
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(sqlite(sql::APP_TOKENS))?;
                let found = stmt.query_map(params![app.as_str(), now], token_row)?.collect::<Result<_, _>>()?;
                Ok(found)
            })
            .await
    }

    async fn insert_session(&self, session: &Session) -> StoreResult<()> {
        let s = session.clone();
        self.writer
            .write(move |conn| {
                conn.execute(
                    sqlite(sql::INSERT_SESSION),
                    params![
                        s.hash,
                        s.id,
                        s.app_id.as_ref().map(AppId::as_str),
                        s.token_hash,
                        s.created_at,
                        s.expires_at
                    ],
                )?;
                Ok(())
            })
            .await
    }

    async fn session(&self, hash: &str) -> StoreResult<Option<Session>> {
        let hash = hash.to_owned();
        self.readers
            .read(move |conn| Ok(conn.prepare_cached(sqlite(sql::SESSION))?.query_row([&hash], session).optional()?))
            .await
    }

    async fn list_sessions(&self, app: Option<&AppId>) -> StoreResult<Vec<Session>> {
        let app = app.map(|a| a.to_string());
        self.readers
            .read(move |conn| {
                let sql = format!(
                    "SELECT {SESSION_COLUMNS} FROM session WHERE ?1 IS NULL OR app_id = ?1 ORDER BY created_at DESC"
                );
                let rows = conn.prepare_cached(&sql)?.query_map([&app], session)?.collect::<Result<_, _>>()?;
                Ok(rows)
            })
            .await
    }

    async fn end_sessions(&self, which: EndSessions) -> StoreResult<u64> {
        self.writer
            .write(move |conn| {
                let ended = match &which {
                    EndSessions::Hash(hash) => conn.execute(sqlite(sql::END_SESSION_BY_HASH), [hash])?,
                    EndSessions::Id(id) => conn.execute(sqlite(sql::END_SESSION_BY_ID), [id])?,
                    EndSessions::App(app) => conn.execute(sqlite(sql::END_SESSIONS_OF_APP), [app.as_str()])?,
                    EndSessions::All => conn.execute(sqlite(sql::END_ALL_SESSIONS), [])?,
                    EndSessions::ExpiredBefore(at) => conn.execute(sqlite(sql::END_EXPIRED_SESSIONS), [at])?,
                };
                Ok(ended as u64)
            })
            .await
    }

    async fn idempotent_response(&self, scope: &str, key: &str) -> StoreResult<Option<StoredResponse>> {
        // On the writer: it owns the key index (and the lookup is rare: a keyed request the
        // handler refused, or a keyed POST other than a message's).
        let (scope, key, keys) = (scope.to_owned(), key.to_owned(), self.keys.clone());
        self.writer.write(move |conn| keys.lock().find(conn, &scope, &key)).await
    }

    async fn save_idempotent_response(&self, scope: &str, key: &str, response: &StoredResponse) -> StoreResult<()> {
        let (scope, key, response, keys) = (scope.to_owned(), key.to_owned(), response.clone(), self.keys.clone());
        self.writer.write(move |conn| keys.lock().save(conn, &scope, &key, &response)).await
    }

    async fn purge(&self, what: Purge, before: Millis, limit: usize) -> StoreResult<u64> {
        let (sql, prefix) = match what {
            // Only once nothing is left to deliver: no pending row, nothing held.
            Purge::Payloads => (
                "UPDATE message SET payload = NULL, packed = NULL WHERE seq IN
                    (SELECT m.seq FROM message m WHERE m.id < ?1 AND (m.payload IS NOT NULL OR m.packed IS NOT NULL)
                     AND NOT EXISTS (SELECT 1 FROM delivery d WHERE d.msg_seq = m.seq AND d.state = 0)
                     AND NOT EXISTS (SELECT 1 FROM held h WHERE h.id >= m.seq * 65536 AND h.id < (m.seq + 1) * 65536)
                     LIMIT ?2)",
                "msg_",
            ),
            Purge::Responses => (
                "UPDATE attempt SET response = 'EXPUNGED' WHERE seq IN
                    (SELECT seq FROM attempt WHERE id < ?1 AND response <> 'EXPUNGED' LIMIT ?2)",
                "atmpt_",
            ),
            Purge::Attempts => (
                "DELETE FROM attempt WHERE seq IN
                    (SELECT a.seq FROM attempt a WHERE a.id < ?1
                     AND NOT EXISTS (SELECT 1 FROM delivery d WHERE d.id = a.delivery_id AND d.state = 0) LIMIT ?2)
                 RETURNING msg_seq, endpoint_id, id",
                "atmpt_",
            ),
        };
        let bound = format!("{prefix}{}", first_body_at(before));
        self.writer
            .write(move |conn| {
                if what != Purge::Attempts {
                    return Ok(conn.prepare_cached(sql)?.execute(params![bound, limit as i64])? as u64);
                }
                // The index tables forget the attempts too.
                let gone: Vec<(i64, String, String)> = conn
                    .prepare_cached(sql)?
                    .query_map(params![bound, limit as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                    .collect::<Result<_, _>>()?;
                let mut by_msg = conn.prepare_cached("DELETE FROM attempt_by_msg WHERE msg_seq = ? AND id = ?")?;
                let mut by_endpoint =
                    conn.prepare_cached("DELETE FROM attempt_by_endpoint WHERE endpoint_id = ? AND id = ?")?;
                for (msg_seq, endpoint, id) in &gone {
                    by_msg.execute(params![msg_seq, id])?;
                    by_endpoint.execute(params![endpoint, id])?;
                }
                Ok(gone.len() as u64)
            })
            .await
    }

    async fn prune_idempotency(&self, before: Millis, limit: usize) -> StoreResult<u64> {
        let keys = self.keys.clone();
        self.writer
            .write(move |conn| {
                let deleted = conn.execute(PRUNE_IDEMPOTENCY, params![before, limit as i64])?;
                keys.lock().drop_expired(conn, limit)?;
                Ok(deleted as u64)
            })
            .await
    }
}

/// The oldest `?2` records, those of them made before `?1`: creation order is append order
/// (give or take the writer's batching), so the walk stops where the live records begin.
const PRUNE_IDEMPOTENCY: &str = "DELETE FROM idempotency WHERE created_at < ?1 AND seq IN
     (SELECT seq FROM idempotency ORDER BY seq LIMIT ?2)";
