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

use crate::store::{StoreResult, StoredResponse};

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
const GROUP_BITS_PER_KEY: usize = 14;

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
        let filter = last.then(|| Filter::of(&writing.entries));
        let last_seq = writing.entries.iter().map(|e| e.1).max().unwrap_or(0);
        // Adding keys to a filter twice changes nothing, so a failed chunk's retry may.
        let group = last.then(|| forming_with(&mut self.forming, writing.run, &writing.entries));
        let completes = group.is_some_and(|g| g.runs + 1 >= GROUP);
        conn.execute_batch("BEGIN IMMEDIATE")?;
        let done = (|| -> StoreResult<()> {
            let mut insert = conn.prepare_cached("INSERT INTO idempotency_run (run, hash, seq) VALUES (?, ?, ?)")?;
            for (h, seq) in &writing.entries[writing.written..end] {
                insert.execute(params![writing.run, h, seq])?;
            }
            if let Some(filter) = &filter {
                conn.prepare_cached("INSERT INTO idempotency_runs (run, last_seq, filter) VALUES (?, ?, ?)")?
                    .execute(params![writing.run, last_seq, filter.to_bytes()])?;
            }
            if let Some(group) = group.filter(|_| completes) {
                conn.prepare_cached("INSERT INTO idempotency_groups (first_run, last_run, filter) VALUES (?, ?, ?)")?
                    .execute(params![group.first, writing.run, group.filter.to_bytes()])?;
                conn.prepare_cached("UPDATE idempotency_runs SET filter = x'' WHERE run BETWEEN ? AND ?")?
                    .execute(params![group.first, writing.run])?;
            }
            Ok(conn.execute_batch("COMMIT")?)
        })();
        if done.is_err() && !conn.is_autocommit() {
            let _ = conn.execute_batch("ROLLBACK");
        }
        done?;
        writing.written = end;
        writing.failures = 0;
        writing.retry_at = None;
        let Some(filter) = filter else { return Ok(true) };
        let run = writing.run;
        self.runs.push(Run { id: run, last_seq, filter: Some(filter) });
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

/// A blocked Bloom filter: each key sets `PROBES` bits of one 512-bit block, so a lookup
/// reads one cache line. Ten bits per key: about 1 % false positives.
struct Filter {
    blocks: Vec<[u64; 8]>,
}

const BITS_PER_KEY: usize = 10;
const PROBES: u32 = 7;

impl Filter {
    /// A run's filter.
    fn of(entries: &[(i64, i64)]) -> Self {
        let mut filter = Self::sized(entries.len(), BITS_PER_KEY);
        entries.iter().for_each(|(h, _)| filter.insert(*h));
        filter
    }

    /// An empty filter for `keys` keys at `bits_per_key`.
    fn sized(keys: usize, bits_per_key: usize) -> Self {
        let blocks = keys.saturating_mul(bits_per_key).div_ceil(512).max(1);
        Self { blocks: vec![[0; 8]; blocks] }
    }

    fn insert(&mut self, h: i64) {
        let (block, bits) = self.place(h);
        for (word, bit) in bits {
            self.blocks[block][word] |= bit;
        }
    }

    fn may_hold(&self, h: i64) -> bool {
        let (block, bits) = self.place(h);
        let block = &self.blocks[block];
        bits.into_iter().all(|(word, bit)| block[word] & bit != 0)
    }

    /// The block of `h` (from its high half) and its bits there (from a mix of the rest).
    fn place(&self, h: i64) -> (usize, [(usize, u64); PROBES as usize]) {
        let h = h as u64;
        let block = (((h >> 32) * self.blocks.len() as u64) >> 32) as usize;
        let mut x = h;
        let bits = std::array::from_fn(|_| {
            x = x.wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) ^ (h >> 17);
            let bit = (x >> 55) as usize; // 0..512
            (bit / 64, 1u64 << (bit % 64))
        });
        (block, bits)
    }

    fn to_bytes(&self) -> Vec<u8> {
        self.blocks.iter().flatten().flat_map(|w| w.to_le_bytes()).collect()
    }

    fn from_bytes(bytes: &[u8]) -> Self {
        let words: Vec<u64> =
            bytes.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().expect("eight bytes"))).collect();
        let mut blocks: Vec<[u64; 8]> = words.chunks_exact(8).map(|c| c.try_into().expect("eight words")).collect();
        if blocks.is_empty() {
            blocks.push([!0; 8]); // damaged: holds everything, so nothing is missed
        }
        Self { blocks }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(n: i64, salt: &str) -> Vec<(i64, i64)> {
        let mut e: Vec<_> = (0..n).map(|i| (hash(salt, &i.to_string()), i)).collect();
        e.sort();
        e
    }

    #[test]
    fn a_filter_holds_every_key_put_in_and_few_others_and_reads_back_from_its_bytes() {
        let put = entries(50_000, "in");
        let filter = Filter::from_bytes(&Filter::of(&put).to_bytes());
        assert!(put.iter().all(|(h, _)| filter.may_hold(*h)), "no false negatives");
        let others = entries(100_000, "out");
        let false_positives = others.iter().filter(|(h, _)| filter.may_hold(*h)).count();
        assert!(false_positives < 2_000, "{false_positives} of 100,000 keys not put in were held");
        assert!(false_positives > 0, "a filter that holds nothing else at 10 bits per key is not one");
    }

    #[test]
    fn a_group_filter_holds_every_key_put_in_and_fewer_others_than_a_run_filter() {
        let put = entries(50_000, "in");
        let mut filter = Filter::sized(put.len(), GROUP_BITS_PER_KEY);
        put.iter().for_each(|(h, _)| filter.insert(*h));
        let filter = Filter::from_bytes(&filter.to_bytes());
        assert!(put.iter().all(|(h, _)| filter.may_hold(*h)), "no false negatives");
        let false_positives = entries(100_000, "out").iter().filter(|(h, _)| filter.may_hold(*h)).count();
        assert!((1..400).contains(&false_positives), "{false_positives} of 100,000 keys not put in were held");
    }

    #[test]
    fn a_damaged_filter_holds_everything() {
        let filter = Filter::from_bytes(&[1, 2, 3]);
        assert!(entries(100, "x").iter().all(|(h, _)| filter.may_hold(*h)));
    }

    use std::path::Path;
    use std::time::{Duration, Instant};

    use crate::config::Config;
    use crate::store::AccessStore;
    use crate::store::sqlite::SqliteStore;

    fn open(path: &Path, run_keys: usize) -> SqliteStore {
        let mut config = Config::defaults().store;
        config.idempotency_run_keys = run_keys;
        SqliteStore::open(path, &config, &Arc::default()).unwrap()
    }

    fn count(path: &Path, sql: &str) -> i64 {
        Connection::open(path).unwrap().query_row(sql, [], |r| r.get(0)).unwrap()
    }

    /// Waits (up to 20 s) for the writer to have registered `runs` runs.
    fn wait_for_runs(path: &Path, runs: i64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while count(path, "SELECT count(*) FROM idempotency_runs") < runs {
            assert!(Instant::now() < deadline, "the writer did not write {runs} runs");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn answer(n: usize, created_at: i64) -> StoredResponse {
        StoredResponse { status: 202, body: format!("answer {n}"), created_at }
    }

    async fn save(store: &SqliteStore, keys: std::ops::Range<usize>, created_at: i64) {
        for n in keys {
            store
                .save_idempotent_response("admin\nPOST /api/v1/app", &format!("key-{n}"), &answer(n, created_at))
                .await
                .unwrap();
        }
    }

    async fn found(store: &SqliteStore, n: usize) -> Option<String> {
        let stored = store.idempotent_response("admin\nPOST /api/v1/app", &format!("key-{n}")).await.unwrap();
        stored.map(|s| s.body)
    }

    async fn all_found(store: &SqliteStore, keys: std::ops::Range<usize>) {
        for n in keys {
            assert_eq!(found(store, n).await, Some(format!("answer {n}")), "key {n}");
        }
    }

    /// A temporary directory and the database path in it.
    fn database() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("herald.db");
        (dir, path)
    }

    #[tokio::test]
    async fn keys_are_found_in_memory_in_runs_and_after_a_restart_and_the_first_answer_stays() {
        let (_dir, path) = database();
        let store = open(&path, 100);
        save(&store, 0..350, 1).await;
        wait_for_runs(&path, 3);
        assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), 300);
        let unique_index = "SELECT count(*) FROM sqlite_master WHERE tbl_name = 'idempotency' AND type = 'index'";
        assert_eq!(count(&path, unique_index), 0, "no index of random keys");
        // A second answer for a kept key does not replace the first, in memory or in a run.
        store.save_idempotent_response("admin\nPOST /api/v1/app", "key-7", &answer(999, 1)).await.unwrap();
        store.save_idempotent_response("admin\nPOST /api/v1/app", "key-340", &answer(999, 1)).await.unwrap();
        assert_eq!(count(&path, "SELECT count(*) FROM idempotency"), 350);
        all_found(&store, 0..350).await;
        assert_eq!(found(&store, 350).await, None);
        let other_scope = store.idempotent_response("admin\nPOST /api/v1/other", "key-1").await.unwrap();
        assert!(other_scope.is_none(), "a key belongs to its scope");
        drop(store);
        // Rows of a run whose last chunk never committed are cleared at open.
        Connection::open(&path).unwrap().execute_batch("INSERT INTO idempotency_run VALUES (4, 1, 1)").unwrap();
        let store = open(&path, 100);
        assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), 300);
        all_found(&store, 0..350).await;
        save(&store, 350..400, 1).await;
        wait_for_runs(&path, 4);
        assert_eq!(found(&store, 399).await, Some("answer 399".into()));
    }

    #[tokio::test]
    async fn records_kept_before_runs_existed_are_written_as_runs_at_open() {
        let (_dir, path) = database();
        save(&open(&path, 1_000), 0..250, 1).await;
        // As a database of version 11 had them: records only.
        Connection::open(&path)
            .unwrap()
            .execute_batch("DELETE FROM idempotency_runs; DELETE FROM idempotency_run")
            .unwrap();
        let store = open(&path, 100);
        assert_eq!(count(&path, "SELECT count(*) FROM idempotency_runs"), 2, "two full runs, fifty in memory");
        all_found(&store, 0..250).await;
    }

    /// A run that cannot be written (a full disk, here a trigger that refuses its rows) is
    /// not tried again before its wait, which doubles; its keys are found meanwhile, and it
    /// is written whole once the write succeeds.
    #[test]
    fn a_run_that_fails_to_write_waits_longer_after_each_failure_and_is_written_later() {
        let (_dir, path) = database();
        drop(open(&path, 4));
        let conn = Connection::open(&path).unwrap();
        let keys = Keys::load(&conn, 4).unwrap();
        for n in 0..4 {
            keys.lock().save(&conn, "scope", &format!("key-{n}"), &answer(n, 1)).unwrap();
        }
        conn.execute_batch(
            "CREATE TRIGGER refuse BEFORE INSERT ON idempotency_run BEGIN SELECT RAISE(FAIL, 'disk full'); END",
        )
        .unwrap();
        let retry = |keys: &Keys| {
            let index = keys.lock();
            let writing = index.writing.as_ref().expect("the run is still to be written");
            (writing.failures, writing.retry_at.unwrap().saturating_duration_since(Instant::now()))
        };
        keys.write_some(&conn);
        let (failures, wait) = retry(&keys);
        assert!(failures == 1 && wait > FIRST_RETRY / 2 && wait <= FIRST_RETRY, "{failures} {wait:?}");
        keys.lock().writing.as_mut().unwrap().retry_at = Some(Instant::now());
        keys.write_some(&conn);
        let (failures, wait) = retry(&keys);
        assert!(failures == 2 && wait > FIRST_RETRY && wait <= 2 * FIRST_RETRY, "{failures} {wait:?}");
        conn.execute_batch("DROP TRIGGER refuse").unwrap();
        keys.write_some(&conn);
        assert_eq!(retry(&keys).0, 2, "not tried again before its wait");
        assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), 0);
        assert_eq!(keys.lock().find(&conn, "scope", "key-3").unwrap(), Some(answer(3, 1)), "found meanwhile");
        keys.lock().writing.as_mut().unwrap().retry_at = Some(Instant::now());
        keys.write_some(&conn);
        assert!(keys.lock().writing.is_none() && keys.lock().runs.len() == 1, "written whole");
        assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), 4);
        assert_eq!(keys.lock().find(&conn, "scope", "key-0").unwrap(), Some(answer(0, 1)));
    }

    #[tokio::test]
    async fn expired_keys_take_their_runs_with_them() {
        let (_dir, path) = database();
        let store = open(&path, 10);
        save(&store, 0..30, 1_000).await;
        wait_for_runs(&path, 3);
        save(&store, 30..35, 5_000).await;
        assert_eq!(store.prune_idempotency(2_000, 1_000).await.unwrap(), 30);
        assert_eq!(count(&path, "SELECT count(*) FROM idempotency_runs"), 0);
        assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), 0);
        assert_eq!(found(&store, 3).await, None, "expired");
        assert_eq!(found(&store, 33).await, Some("answer 33".into()));
        // A key that expired may be used again.
        save(&store, 3..4, 6_000).await;
        assert_eq!(found(&store, 3).await, Some("answer 3".into()));
    }

    const EMPTY_FILTERS: &str = "SELECT count(*) FROM idempotency_runs WHERE length(filter) = 0";

    #[tokio::test]
    async fn eight_runs_share_one_filter_through_which_their_keys_are_found_until_they_expire() {
        let (_dir, path) = database();
        let store = open(&path, 10);
        save(&store, 0..100, 1_000).await;
        wait_for_runs(&path, 10);
        let group = "SELECT first_run || '-' || last_run FROM idempotency_groups";
        let groups: Vec<String> = Connection::open(&path)
            .unwrap()
            .prepare(group)
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(groups, ["1-8"]);
        assert_eq!(count(&path, EMPTY_FILTERS), 8, "the group's runs keep no filter of their own");
        all_found(&store, 0..100).await;
        assert_eq!(found(&store, 100).await, None);
        drop(store);
        let store = open(&path, 10);
        all_found(&store, 0..100).await;
        assert_eq!(found(&store, 100).await, None);
        save(&store, 100..105, 5_000).await;
        assert_eq!(store.prune_idempotency(2_000, 1_000).await.unwrap(), 100);
        assert_eq!(count(&path, "SELECT count(*) FROM idempotency_groups"), 0, "expired with its runs");
        assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), 0);
        assert_eq!(found(&store, 5).await, None, "expired");
        all_found(&store, 100..105).await;
    }

    /// The group's row, its runs' emptied filters and its last run's rows commit together:
    /// a group that cannot be written (a full disk, here a trigger) leaves its last run to
    /// be written again, its keys found meanwhile, and nothing half-done.
    #[test]
    fn a_group_is_written_with_its_last_run_or_not_at_all_and_read_back_at_open() {
        let (_dir, path) = database();
        drop(open(&path, 1));
        let conn = Connection::open(&path).unwrap();
        let keys = Keys::load(&conn, 1).unwrap();
        let key = |n: usize| format!("key-{n}");
        let save_and_write = |n: usize| {
            keys.lock().save(&conn, "scope", &key(n), &answer(n, 1)).unwrap();
            keys.write_some(&conn);
        };
        (0..GROUP - 1).for_each(save_and_write);
        conn.execute_batch(
            "CREATE TRIGGER refuse BEFORE INSERT ON idempotency_groups BEGIN SELECT RAISE(FAIL, 'disk full'); END",
        )
        .unwrap();
        save_and_write(GROUP - 1);
        assert_eq!(count(&path, "SELECT count(*) FROM idempotency_runs"), GROUP as i64 - 1, "rolled back");
        assert_eq!(count(&path, "SELECT count(*) FROM idempotency_run"), GROUP as i64 - 1);
        assert_eq!(count(&path, EMPTY_FILTERS), 0);
        assert_eq!(keys.lock().find(&conn, "scope", &key(GROUP - 1)).unwrap(), Some(answer(GROUP - 1, 1)));
        conn.execute_batch("DROP TRIGGER refuse").unwrap();
        keys.lock().writing.as_mut().unwrap().retry_at = Some(Instant::now());
        keys.write_some(&conn);
        assert_eq!(count(&path, "SELECT count(*) FROM idempotency_groups"), 1);
        assert_eq!(count(&path, EMPTY_FILTERS), GROUP as i64);
        drop(keys);
        let keys = Keys::load(&conn, 1).unwrap();
        let index = keys.lock();
        assert_eq!((index.groups.len(), index.runs.len()), (1, GROUP));
        assert!(index.runs.iter().all(|run| run.filter.is_none()), "the group's filter stands for theirs");
        for n in 0..GROUP {
            assert_eq!(index.find(&conn, "scope", &key(n)).unwrap(), Some(answer(n, 1)), "key {n}");
        }
        assert_eq!(index.find(&conn, "scope", &key(GROUP)).unwrap(), None);
    }

    #[test]
    fn the_hash_separates_the_scope_from_the_key() {
        assert_ne!(hash("ab", "c"), hash("a", "bc"));
        assert_eq!(hash("a", "b"), hash("a", "b"));
    }
}
