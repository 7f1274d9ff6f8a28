//! How a delivery is kept on PostgreSQL (schema version 9). A delivery made at ingest and
//! claimed there is *held*: a row of `herald.held` naming its message, endpoint and holder.
//! Its first outcome moves it into `herald.delivery` in the state that outcome leaves it
//! (see `queue::RECORD_OUTCOMES`), and so does anything else that must change it: a
//! release, a resend, its endpoint's deletion. From then on its row is its record, exactly
//! as for a delivery that never was held.
//!
//! A delivery's state, then: its row's, if it has one; pending (never attempted) while it
//! is held. `herald.deliveries` is that union, for readers.

/// A move of held deliveries into `herald.delivery`: which ones, and what they become. Each
/// expression is SQL over `h` (the held row) and `using`.
pub struct Move<'a> {
    /// Tables the selection joins (`DELETE … USING`), or nothing.
    pub using: &'a str,
    /// The condition selecting the held rows to move.
    pub filter: &'a str,
    pub state: &'a str,
    pub attempts: &'a str,
    pub next_at: &'a str,
    /// Whether the holder keeps its claim (the row is pending and owned) or not.
    pub keep: &'a str,
}

impl Move<'_> {
    /// Giving held deliveries back to the queue: pending, unclaimed, never attempted, due at
    /// `now` (an expression).
    pub fn release<'a>(filter: &'a str, now: &'a str) -> Move<'a> {
        Move { using: "", filter, state: "0", attempts: "0", next_at: now, keep: "false" }
    }

    /// A resend's first step: the held delivery of message `$1` at endpoint `$2` becomes a
    /// pending row, still claimed by its holder, which the resend then marks like any other
    /// delivery held pending (`queue.rs`).
    pub fn resend() -> Move<'static> {
        Move {
            using: "",
            filter: "h.msg_id = $1 AND h.endpoint_id = $2",
            state: "0",
            attempts: "0",
            next_at: "h.created_at",
            keep: "true",
        }
    }

    /// The move as one statement; executing it answers how many deliveries moved.
    pub fn statement(&self) -> String {
        format!("WITH held_out AS ({}) {}", self.delete(), self.insert("held_out"))
    }

    /// The move as two CTEs for a larger statement: `held_out` (the held rows taken) and
    /// `held_in` (the rows made of them, returning `id` and `trigger`).
    pub fn ctes(&self) -> String {
        format!("held_out AS ({}), held_in AS ({} RETURNING id, trigger)", self.delete(), self.insert("held_out"))
    }

    fn delete(&self) -> String {
        let Move { using, filter, state, attempts, next_at, keep } = self;
        let using = if using.is_empty() { String::new() } else { format!(" USING {using}") };
        format!(
            "DELETE FROM herald.held h{using} WHERE {filter}
             RETURNING h.*, ({state})::int2 AS to_state, ({attempts})::int4 AS to_attempts,
                       ({next_at})::int8 AS to_next_at, ({keep})::bool AS to_keep"
        )
    }

    /// The rows: a pending one whose endpoint was deleted meanwhile is cancelled instead (the
    /// deletion cancelled the deliveries there were, and this one must not wait for a retry
    /// that will never be made), and a pending one is strictly ordered if its endpoint now
    /// is. Settled ones skip both lookups.
    fn insert(&self, from: &str) -> String {
        const ENDPOINT: &str = "FROM herald.endpoint e WHERE e.id = h.endpoint_id";
        format!(
            "INSERT INTO herald.delivery
                 (id, msg_id, endpoint_id, app_id, state, attempts, next_at, trigger, owner, strict, created_at)
             SELECT h.id, h.msg_id, h.endpoint_id, h.app_id,
                    CASE WHEN h.to_state <> 0 THEN h.to_state WHEN EXISTS (SELECT 1 {ENDPOINT}) THEN 0 ELSE 3 END,
                    h.to_attempts, h.to_next_at, 0,
                    CASE WHEN NOT h.to_keep THEN NULL WHEN EXISTS (SELECT 1 {ENDPOINT}) THEN h.owner END,
                    CASE WHEN h.to_state <> 0 THEN false
                         ELSE coalesce((SELECT coalesce(e.delivery->>'ordering', '') = 'strict' {ENDPOINT}), false) END,
                    h.created_at
             FROM {from} h"
        )
    }
}
