//! Versioned migrations, applied at start-up (and by `herald migrate`). A session-level
//! advisory lock serializes processes that start at the same time, so no migration is ever
//! applied twice or half-way.

use anyhow::Context;
use deadpool_postgres::Pool;

/// (version, SQL) in order. Applied versions are recorded in `herald.schema_migrations`.
const MIGRATIONS: &[(i32, &str)] = &[
    (1, include_str!("v1.sql")),
    (2, include_str!("v2.sql")),
    (3, include_str!("v3.sql")),
    (4, include_str!("v4.sql")),
    (5, include_str!("v5.sql")),
    (6, include_str!("v6.sql")),
    (7, include_str!("v7.sql")),
    (8, include_str!("v8.sql")),
    (9, include_str!("v9.sql")),
    (10, include_str!("v10.sql")),
    (11, include_str!("v11.sql")),
];

/// The schema version this build brings a database to.
pub const LATEST: i32 = MIGRATIONS[MIGRATIONS.len() - 1].0;

/// Any constant shared by every Herald: the key of the migration lock.
const LOCK_KEY: i64 = 0x6865_7261_6c64; // "herald"

pub async fn migrate(pool: &Pool) -> anyhow::Result<()> {
    let mut client = pool.get().await.context("connecting for migrations")?;
    client.execute("SELECT pg_advisory_lock($1)", &[&LOCK_KEY]).await?;
    let result = apply(&mut client).await;
    client.execute("SELECT pg_advisory_unlock($1)", &[&LOCK_KEY]).await?;
    result
}

async fn apply(client: &mut deadpool_postgres::Object) -> anyhow::Result<()> {
    client
        .batch_execute(
            "CREATE SCHEMA IF NOT EXISTS herald;
             CREATE TABLE IF NOT EXISTS herald.schema_migrations (
                 version integer PRIMARY KEY,
                 applied_at timestamptz NOT NULL DEFAULT now())",
        )
        .await
        .context("creating the migrations table")?;
    let applied: Vec<i32> =
        client.query("SELECT version FROM herald.schema_migrations", &[]).await?.iter().map(|r| r.get(0)).collect();
    let newest = MIGRATIONS.last().map_or(0, |(v, _)| *v);
    if let Some(unknown) = applied.iter().find(|v| **v > newest) {
        anyhow::bail!("the database has schema version {unknown}; this Herald knows up to {newest}");
    }
    for (version, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        let tx = client.transaction().await?;
        tx.batch_execute(sql).await.with_context(|| format!("applying migration {version}"))?;
        tx.execute("INSERT INTO herald.schema_migrations (version) VALUES ($1)", &[version]).await?;
        tx.commit().await?;
        tracing::info!(version, "applied database migration");
    }
    Ok(())
}
