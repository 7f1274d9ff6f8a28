//! Idempotency keys on SQLite, found without a B-tree of random keys (schema version 12).
//!
//! An SDK's key is a random UUID: a unique index on it dirtied one random leaf page per
//! keyed message, about 10 KB written and a fifth more CPU per message. Here the records
//! are only appended (`idempotency`, by `seq`), and their keys are found log-structured:
//!
//! - **fresh**: the `(hash, seq)` of every record past the last run, in memory. It is
//!   rebuilt at open from the records themselves, so a crash loses nothing.
//! - **runs**: when `fresh` holds `run_keys` keys, the writer writes them, sorted by hash,
//!   as one run of `idempotency_run` (appended at its right edge, a few bytes per key), a
//!   chunk per pause between batches. A run is used once its last chunk has committed
//!   with its row in `idempotency_runs`, which keeps its filter.
//! - **filters**: one blocked Bloom filter per run, in memory (10 bits per key), so a key a
//!   run does not hold costs one cache line, not a B-tree descent.
//! - **groups** (schema version 13): once `GROUP` consecutive runs are written, one filter
//!   of them all (14 bits per key, filled as each was written) replaces theirs, in the same
//!   transaction as the last one's rows. A full index (about 80 runs at 1,000 keyed messages
//!   a second over the 12-hour TTL) is then ten groups: a new key reads ten cache lines, not
//!   eighty, and a false hit (one per 500 groups) costs a query per run of its group. Groups
//!   form from the runs a process writes; runs written before a restart keep their filters.
//!
//! A hash names candidates only: every hit is checked against the record's own scope and
//! key, so a collision or an entry whose transaction rolled back finds nothing. Records are
//! numbered here, never reused, so a run's `last_seq` divides the records exactly: those
//! at or below it are in a run, the rest are rebuilt into `fresh` at open.
//! Expiry deletes the oldest records; a run whose records are all gone is dropped.
//!
//! Everything here runs on the writer's thread (lookups too), under one uncontended lock.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rusqlite::{Connection, OptionalExtension, params};
use sha2::{Digest, Sha256};

use super::writer::own_transaction;
use crate::store::{StoreResult, StoredResponse};

mod filter;
use filter::Filter;

/// Rows of a run written per pause between batches (a few milliseconds of the writer).
const CHUNK: usize = 4_096;
/// After a chunk fails (a full disk, say), the next try waits this long, doubling with each
/// failure up to `LAST_RETRY`: the writer pauses between batches every few milliseconds,
/// and a failure that repeats should cost neither its time nor a line of log each time.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(60);
/// Consecutive runs that share one filter once they are all written.
const GROUP: usize = 8;
/// A group's filter has more bits per key than a run's: a false hit there costs a query in
/// each of its runs, so it must be rarer (14 bits: about 0.2 % of keys, against 1 %).
pub(super) const GROUP_BITS_PER_KEY: usize = 14;

/// The key index, shared between the store (whose operations run on the writer thread) and
/// the writer, which writes runs between batches.
#[derive(Clone)]
pub struct Keys(Arc<Mutex<KeyIndex>>);

pub struct KeyIndex {
    /// `(hash, seq)` of the records past the last run and the one being written.
    fresh: BTreeSet<(i64, i64)>,
    /// The run being written, sorted, and how many of its rows have committed.
    writing: Option<Writing>,
    /// Oldest first.
    runs: Vec<Run>,
    /// Filters of `GROUP` consecutive runs each, oldest first.
    groups: Vec<Group>,
    /// The group that the runs written since the last one are forming.
    forming: Option<Forming>,
    next_seq: i64,
    next_run: i64,
    run_keys: usize,
}

struct Writing {
    run: i64,
    entries: Vec<(i64, i64)>,
    written: usize,
    /// Chunks that failed in a row, and when the next may be tried.
    failures: u32,
    retry_at: Option<Instant>,
}

struct Run {
    id: i64,
    last_seq: i64,
    /// `None` once a group's filter stands for the run's.
    filter: Option<Filter>,
}

struct Group {
    first: i64,
    last: i64,
    filter: Filter,
}

struct Forming {
    first: i64,
    /// Runs whose keys are in `filter` and are registered.
    runs: usize,
    filter: Filter,
}

impl Keys {
    /// Loads the runs and rebuilds `fresh` from the records past them; records past the
    /// runs beyond `run_keys` (a database from before version 12) are written as runs now.
    pub fn load(conn: &Connection, run_keys: usize) -> StoreResult<Self> {
        let run_keys = run_keys.max(1);
        let mut groups = Vec::new();
        let mut stmt = conn.prepare("SELECT first_run, last_run, filter FROM idempotency_groups ORDER BY first_run")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let filter = Filter::from_bytes(&row.get::<_, Vec<u8>>(2)?);
            groups.push(Group { first: row.get(0)?, last: row.get(1)?, filter });
        }
        let mut runs = Vec::new();
        let mut stmt = conn.prepare("SELECT run, last_seq, filter FROM idempotency_runs ORDER BY run")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let id = row.get(0)?;
            let grouped = groups.iter().any(|g: &Group| (g.first..=g.last).contains(&id));
            let filter = (!grouped).then(|| row.get::<_, Vec<u8>>(2).map(|bytes| Filter::from_bytes(&bytes)));
            runs.push(Run { id, last_seq: row.get(1)?, filter: filter.transpose()? });
        }
        let next_run = runs.last().map_or(1, |r| r.id + 1);
        // Rows of a run whose last chunk never committed.
        conn.execute("DELETE FROM idempotency_run WHERE run >= ?", [next_run])?;
        let past = runs.last().map_or(0, |r| r.last_seq);
        let next_seq = conn.query_row("SELECT COALESCE(MAX(seq), 0) + 1 FROM idempotency", [], |r| r.get(0))?;
        let mut index = KeyIndex {
            fresh: BTreeSet::new(),
            writing: None,
            runs,
            groups,
            forming: None,
            next_seq,
            next_run,
            run_keys,
        };
        // A run's worth at a time, so memory stays bounded whatever is there.
        let mut read = conn.prepare("SELECT seq, scope, key FROM idempotency WHERE seq > ? ORDER BY seq LIMIT ?")?;
        let mut cursor = past;
        loop {
            let rows: Vec<(i64, String, String)> = read
                .query_map(params![cursor, (run_keys - index.fresh.len()) as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?))
                })?
                .collect::<Result<_, _>>()?;
            let Some(last) = rows.last() else { break };
            cursor = last.0;
            index.fresh.extend(rows.iter().map(|(seq, scope, key)| (hash(scope, key), *seq)));
            if index.fresh.len() < run_keys {
                break;
            }
            index.start_run();
            while index.write_chunk(conn, usize::MAX)? {}
        }
        Ok(Self(Arc::new(Mutex::new(index))))
    }

    /// An index of nothing, for a writer over a database without the tables (tests).
    #[cfg(test)]
    pub fn empty() -> Self {
        let index = KeyIndex {
            fresh: BTreeSet::new(),
            writing: None,
            runs: Vec::new(),
            groups: Vec::new(),
            forming: None,
            next_seq: 1,
            next_run: 1,
            run_keys: usize::MAX,
        };
        Self(Arc::new(Mutex::new(index)))
    }

    pub fn lock(&self) -> MutexGuard<'_, KeyIndex> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Between batches: writes the next chunk of a run (starting one when `fresh` is
    /// full), in its own transaction. A failure leaves the chunk to be written again, after
    /// a wait that doubles with each failure in a row (`FIRST_RETRY`, `LAST_RETRY`).
    pub fn write_some(&self, conn: &Connection) {
        let mut index = self.lock();
        if index.writing.is_none() && index.fresh.len() >= index.run_keys {
            index.start_run();
        }
        let Some(writing) = &index.writing else { return };
        if writing.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        let failures = writing.failures;
        match index.write_chunk(conn, CHUNK) {
            Ok(_) if failures > 0 => tracing::info!(failures, "a run of idempotency keys is written again"),
            Ok(_) => {}
            Err(e) => {
                let writing = index.writing.as_mut().expect("a failed chunk leaves its run");
                writing.failures += 1;
                let wait = FIRST_RETRY.saturating_mul(1 << (writing.failures - 1).min(6)).min(LAST_RETRY);
                writing.retry_at = Some(Instant::now() + wait);
                tracing::warn!(error = %e, failures = writing.failures, retry_in_s = wait.as_secs(),
                    "writing a run of idempotency keys failed; its keys stay in memory");
            }
        }
    }
}

impl KeyIndex {
    /// The record kept for `key` of `scope`, if one is.
    pub fn find(&self, conn: &Connection, scope: &str, key: &str) -> StoreResult<Option<StoredResponse>> {
        self.find_hashed(conn, hash(scope, key), scope, key)
    }

    /// [`find`](Self::find) with the key's [`hash`] computed already (off the writer).
    pub fn find_hashed(
        &self,
        conn: &Connection,
        h: i64,
        scope: &str,
        key: &str,
    ) -> StoreResult<Option<StoredResponse>> {
        for (_, seq) in self.fresh.range((h, i64::MIN)..=(h, i64::MAX)) {
            if let Some(found) = record(conn, *seq, scope, key)? {
                return Ok(Some(found));
            }
        }
        if let Some(writing) = &self.writing {
            let start = writing.entries.partition_point(|e| e.0 < h);
            for (_, seq) in writing.entries[start..].iter().take_while(|e| e.0 == h) {
                if let Some(found) = record(conn, *seq, scope, key)? {
                    return Ok(Some(found));
                }
            }
        }
        for run in self.runs.iter().rev().filter(|run| run.filter.as_ref().is_some_and(|f| f.may_hold(h))) {
            if let Some(found) = in_run(conn, run.id, h, scope, key)? {
                return Ok(Some(found));
            }
        }
        for group in self.groups.iter().rev().filter(|group| group.filter.may_hold(h)) {
            let first = self.runs.partition_point(|run| run.id < group.first);
            for run in self.runs[first..].iter().take_while(|run| run.id <= group.last) {
                if let Some(found) = in_run(conn, run.id, h, scope, key)? {
                    return Ok(Some(found));
                }
            }
        }
        Ok(None)
    }

    /// Keeps `response` as the answer to `key` of `scope`, unless one is kept already (the
    /// first answer stays).
    pub fn save(&mut self, conn: &Connection, scope: &str, key: &str, response: &StoredResponse) -> StoreResult<()> {
        let h = hash(scope, key);
        if self.find_hashed(conn, h, scope, key)?.is_some() {
            return Ok(());
        }
        self.append(conn, h, scope, key, response)
    }

    /// Keeps `response` as the answer to a key that [`find_hashed`](Self::find_hashed) has
    /// just not found in this transaction (on the writer, so nothing came between).
    pub fn append(
        &mut self,
        conn: &Connection,
        h: i64,
        scope: &str,
        key: &str,
        response: &StoredResponse,
    ) -> StoreResult<()> {
        let seq = self.next_seq;
        self.next_seq += 1;
        conn.prepare_cached(
            "INSERT INTO idempotency (seq, scope, key, status, body, created_at) VALUES (?, ?, ?, ?, ?, ?)",
        )?
        .execute(params![seq, scope, key, response.status, response.body, response.created_at])?;
        // Entered even if the transaction later rolls back: `find` checks the record.
        self.fresh.insert((h, seq));
        Ok(())
    }

    /// After the oldest records were deleted: forgets the runs none of whose records is
    /// left, and deletes up to `limit` rows of forgotten runs.
    pub fn drop_expired(&mut self, conn: &Connection, limit: usize) -> StoreResult<()> {
        let oldest: Option<i64> = conn.query_row("SELECT MIN(seq) FROM idempotency", [], |r| r.get(0))?;
        let oldest = oldest.unwrap_or(self.next_seq);
        let dead = self.runs.iter().take_while(|run| run.last_seq < oldest).count();
        if dead > 0 {
            let last_dead = self.runs[dead - 1].id;
            conn.prepare_cached("DELETE FROM idempotency_runs WHERE run <= ?")?.execute([last_dead])?;
            conn.prepare_cached("DELETE FROM idempotency_groups WHERE last_run <= ?")?.execute([last_dead])?;
            // Forgetting keys that expired is right even if this transaction rolls back.
            self.runs.drain(..dead);
            self.groups.retain(|group| group.last > last_dead);
        }
        let first_live = self.runs.first().map_or(self.writing.as_ref().map_or(self.next_run, |w| w.run), |r| r.id);
        conn.prepare_cached(
            "DELETE FROM idempotency_run WHERE (run, hash, seq) IN
                (SELECT run, hash, seq FROM idempotency_run WHERE run < ?1 LIMIT ?2)",
        )?
        .execute(params![first_live, limit as i64])?;
        Ok(())
    }

    fn start_run(&mut self) {
        let entries: Vec<(i64, i64)> = std::mem::take(&mut self.fresh).into_iter().collect();
        self.writing = Some(Writing { run: self.next_run, entries, written: 0, failures: 0, retry_at: None });
        self.next_run += 1;
    }

    /// Writes up to `most` rows of the run being written in one transaction, registering
    /// the run with its last rows (and, if it completes a group, the group); returns
    /// whether rows are left.
    fn write_chunk(&mut self, conn: &Connection, most: usize) -> StoreResult<bool> {
        let Some(writing) = &mut self.writing else { return Ok(false) };
        let end = writing.entries.len().min(writing.written.saturating_add(most));
        let last = end == writing.entries.len();
        let last_seq = writing.entries.iter().map(|e| e.1).max().unwrap_or(0);
        // Adding keys to a filter twice changes nothing, so a failed chunk's retry may.
        let group = last.then(|| forming_with(&mut self.forming, writing.run, &writing.entries));
        let completes = group.is_some_and(|g| g.runs + 1 >= GROUP);
        // The run that completes a group needs no filter of its own.
        let filter = (last && !completes).then(|| Filter::of(&writing.entries));
        own_transaction(conn, || {
            let mut insert = conn.prepare_cached("INSERT INTO idempotency_run (run, hash, seq) VALUES (?, ?, ?)")?;
            for (h, seq) in &writing.entries[writing.written..end] {
                insert.execute(params![writing.run, h, seq])?;
            }
            if last {
                let bytes = filter.as_ref().map(Filter::to_bytes).unwrap_or_default();
                conn.prepare_cached("INSERT INTO idempotency_runs (run, last_seq, filter) VALUES (?, ?, ?)")?
                    .execute(params![writing.run, last_seq, bytes])?;
            }
            if let Some(group) = group.filter(|_| completes) {
                conn.prepare_cached("INSERT INTO idempotency_groups (first_run, last_run, filter) VALUES (?, ?, ?)")?
                    .execute(params![group.first, writing.run, group.filter.to_bytes()])?;
                conn.prepare_cached("UPDATE idempotency_runs SET filter = x'' WHERE run BETWEEN ? AND ?")?
                    .execute(params![group.first, writing.run - 1])?;
            }
            Ok(())
        })?;
        writing.written = end;
        writing.failures = 0;
        writing.retry_at = None;
        if !last {
            return Ok(true);
        }
        let run = writing.run;
        self.runs.push(Run { id: run, last_seq, filter });
        self.writing = None;
        let forming = self.forming.as_mut().expect("a written run joins the forming group");
        forming.runs += 1;
        if completes {
            let Forming { first, filter, .. } = self.forming.take().expect("just completed");
            let start = self.runs.partition_point(|r| r.id < first);
            self.runs[start..].iter_mut().for_each(|r| r.filter = None);
            self.groups.push(Group { first, last: run, filter });
        }
        Ok(false)
    }
}

/// The group forming, started at `run` if none is, with `entries`' keys added.
fn forming_with<'a>(forming: &'a mut Option<Forming>, run: i64, entries: &[(i64, i64)]) -> &'a Forming {
    let group = forming.get_or_insert_with(|| Forming {
        first: run,
        runs: 0,
        filter: Filter::sized(GROUP.saturating_mul(entries.len()), GROUP_BITS_PER_KEY),
    });
    entries.iter().for_each(|(h, _)| group.filter.insert(*h));
    group
}

/// The record for `key` of `scope` that run `run` holds under `h`, if any.
fn in_run(conn: &Connection, run: i64, h: i64, scope: &str, key: &str) -> StoreResult<Option<StoredResponse>> {
    let seqs: Vec<i64> = conn
        .prepare_cached("SELECT seq FROM idempotency_run WHERE run = ? AND hash = ?")?
        .query_map(params![run, h], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    for seq in seqs {
        if let Some(found) = record(conn, seq, scope, key)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// The record `seq`, if it is still there and is the one for `key` of `scope`.
fn record(conn: &Connection, seq: i64, scope: &str, key: &str) -> StoreResult<Option<StoredResponse>> {
    Ok(conn
        .prepare_cached("SELECT status, body, created_at FROM idempotency WHERE seq = ? AND scope = ? AND key = ?")?
        .query_row(params![seq, scope, key], |row| {
            Ok(StoredResponse { status: row.get(0)?, body: row.get(1)?, created_at: row.get(2)? })
        })
        .optional()?)
}

/// The first eight bytes of SHA-256 over the scope and the key: stable across versions and
/// restarts (it is stored), and not one a tenant can aim collisions at.
pub fn hash(scope: &str, key: &str) -> i64 {
    let digest = Sha256::new().chain_update(scope).chain_update([0]).chain_update(key).finalize();
    i64::from_le_bytes(digest[..8].try_into().expect("eight bytes"))
}

#[cfg(test)]
mod tests;
