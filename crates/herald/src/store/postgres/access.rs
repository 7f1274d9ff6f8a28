//! App-portal tokens and idempotency records on PostgreSQL.

use async_trait::async_trait;

use super::{PgStore, db_err};
use crate::clock::Millis;
use crate::ids::AppId;
use crate::ids::first_body_at;
use crate::store::sql;
use crate::store::{AccessStore, EndSessions, PortalToken, Purge, Session, StoreResult, StoredResponse};

use crate::store::sql::SESSION_COLUMNS;

fn session(r: &tokio_postgres::Row) -> Session {
    Session {
        hash: r.get(0),
        id: r.get(1),
        app_id: r.get::<_, Option<String>>(2).map(AppId::from_trusted),
        token_hash: r.get(3),
        created_at: r.get(4),
        expires_at: r.get(5),
    }
}

fn token_row(r: &tokio_postgres::Row) -> PortalToken {
    PortalToken {
        hash: r.get(0),
        app_id: AppId::from_trusted(r.get(1)),
        expires_at: r.get(2),
        created_at: r.get(3),
        sensitive: r.get(4),
        feature_flags: serde_json::from_str(r.get(5)).unwrap_or_default(),
    }
}

#[async_trait]
impl AccessStore for PgStore {
    async fn insert_token(&self, token: &PortalToken) -> StoreResult<()> {
        let client = self.client().await?;
        client
            .execute(
                sql::INSERT_TOKEN,
                &[
                    &token.hash,
                    &token.app_id.as_str(),
                    &token.expires_at,
                    &token.created_at,
                    &token.sensitive,
                    &serde_json::to_string(&token.feature_flags).expect("a list of strings"),
                ],
            )
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn token(&self, hash: &str) -> StoreResult<Option<PortalToken>> {
        let client = self.client().await?;
        let row = client.query_opt(sql::TOKEN, &[&hash]).await.map_err(db_err)?;
        Ok(row.as_ref().map(token_row))
    }

    async fn revoke_token(&self, hash: &str) -> StoreResult<()> {
        let client = self.client().await?;
        client.execute(sql::REVOKE_TOKEN, &[&hash]).await.map_err(db_err)?;
        Ok(())
    }

    async fn expire_tokens(&self, app: &AppId, at: Millis) -> StoreResult<u64> {
        let client = self.client().await?;
        client.execute(sql::EXPIRE_TOKENS, &[&app.as_str(), &at]).await.map_err(db_err)
    }

    async fn app_tokens(&self, app: &AppId, now: Millis) -> StoreResult<Vec<PortalToken>> {
        let client = self.client().await?;
        let rows = client.query(sql::APP_TOKENS, &[&app.as_str(), &now]).await.map_err(db_err)?;
        Ok(rows.iter().map(token_row).collect())
    }

    async fn insert_session(&self, s: &Session) -> StoreResult<()> {
        let client = self.client().await?;
        client
            .execute(
                sql::INSERT_SESSION,
                &[&s.hash, &s.id, &s.app_id.as_ref().map(AppId::as_str), &s.token_hash, &s.created_at, &s.expires_at],
            )
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn session(&self, hash: &str) -> StoreResult<Option<Session>> {
        let client = self.client().await?;
        Ok(client.query_opt(sql::SESSION, &[&hash]).await.map_err(db_err)?.as_ref().map(session))
    }

    async fn list_sessions(&self, app: Option<&AppId>) -> StoreResult<Vec<Session>> {
        let client = self.client().await?;
        let sql = format!(
            "SELECT {SESSION_COLUMNS} FROM herald.session WHERE $1::text IS NULL OR app_id = $1 ORDER BY created_at DESC"
        );
        let rows = client.query(&sql, &[&app.map(AppId::as_str)]).await.map_err(db_err)?;
        Ok(rows.iter().map(session).collect())
    }

    async fn end_sessions(&self, which: EndSessions) -> StoreResult<u64> {
        let client = self.client().await?;
        let ended = match &which {
            EndSessions::Hash(hash) => client.execute(sql::END_SESSION_BY_HASH, &[hash]).await,
            EndSessions::Id(id) => client.execute(sql::END_SESSION_BY_ID, &[id]).await,
            EndSessions::App(app) => client.execute(sql::END_SESSIONS_OF_APP, &[&app.as_str()]).await,
            EndSessions::All => client.execute(sql::END_ALL_SESSIONS, &[]).await,
            EndSessions::ExpiredBefore(at) => client.execute(sql::END_EXPIRED_SESSIONS, &[at]).await,
        };
        ended.map_err(db_err)
    }

    async fn idempotent_response(&self, scope: &str, key: &str) -> StoreResult<Option<StoredResponse>> {
        let client = self.client().await?;
        let row = client.query_opt(STORED_RESPONSE, &[&scope, &key]).await.map_err(db_err)?;
        Ok(row.map(|r| StoredResponse { status: r.get::<_, i32>(0) as u16, body: r.get(1), created_at: r.get(2) }))
    }

    async fn save_idempotent_response(&self, scope: &str, key: &str, r: &StoredResponse) -> StoreResult<()> {
        let client = self.client().await?;
        client
            .execute(SAVE_RESPONSE, &[&scope, &key, &i32::from(r.status), &r.body, &r.created_at])
            .await
            .map_err(db_err)?;
        Ok(())
    }

    async fn purge(&self, what: Purge, before: Millis, limit: usize) -> StoreResult<u64> {
        let (sql, prefix) = match what {
            Purge::Payloads => (
                "UPDATE herald.message SET payload = NULL, packed = NULL WHERE id IN
                    (SELECT m.id FROM herald.message m WHERE m.id < $1 AND (m.payload IS NOT NULL OR m.packed IS NOT NULL)
                     AND NOT EXISTS (SELECT 1 FROM herald.deliveries d WHERE d.msg_id = m.id AND d.state = 0) LIMIT $2)",
                "msg_",
            ),
            Purge::Responses => (
                "UPDATE herald.attempt SET response = 'EXPUNGED' WHERE id IN
                    (SELECT id FROM herald.attempt WHERE id < $1 AND response <> 'EXPUNGED' LIMIT $2)",
                "atmpt_",
            ),
            Purge::Attempts => (
                "DELETE FROM herald.attempt WHERE id IN
                    (SELECT a.id FROM herald.attempt a WHERE a.id < $1
                     AND NOT EXISTS (SELECT 1 FROM herald.deliveries d WHERE d.id = a.delivery_id AND d.state = 0)
                     LIMIT $2)",
                "atmpt_",
            ),
        };
        let bound = format!("{prefix}{}", first_body_at(before));
        let client = self.client().await?;
        client.execute(sql, &[&bound, &(limit as i64)]).await.map_err(db_err)
    }

    async fn prune_idempotency(&self, before: Millis, limit: usize) -> StoreResult<u64> {
        let client = self.client().await?;
        let deleted = client.execute(PRUNE_IDEMPOTENCY, &[&before, &(limit as i64)]).await.map_err(db_err)?;
        Ok(deleted)
    }
}

const PRUNE_IDEMPOTENCY: &str = "DELETE FROM herald.idempotency WHERE (scope, key) IN
     (SELECT scope, key FROM herald.idempotency WHERE created_at < $1 LIMIT $2)";

const STORED_RESPONSE: &str = "SELECT status, body, created_at FROM herald.idempotency WHERE scope = $1 AND key = $2";
const SAVE_RESPONSE: &str = "INSERT INTO herald.idempotency (scope, key, status, body, created_at)
     VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING";
