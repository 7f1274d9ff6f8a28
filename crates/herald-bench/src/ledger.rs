//! The ledger: every accepted message × every endpoint it must reach, matched against what
//! the receiver got. It yields the delivery latencies (from each message's scheduled send
//! time) and the counts that must add up: sent = delivered + dead + missing.

use std::collections::HashMap;

use hdrhistogram::Histogram;
use tokio::time::Instant;

use super::load::Ack;
use super::receiver::Receipt;

struct Entry {
    scheduled: Instant,
    group: usize,
    /// The endpoints still owed this message.
    pending: Vec<u32>,
    /// Endpoints it goes to without being owed (they may never answer); counted if it arrives.
    optional: Vec<u32>,
}

pub struct Ledger {
    entries: HashMap<Box<str>, Entry>,
    /// Latency histograms (µs) per group, and acknowledgement latency.
    pub latency: Vec<Histogram<u64>>,
    pub ack_latency: Histogram<u64>,
    pub expected: u64,
    pub delivered: u64,
    /// Deliveries to endpoints that were not owed them (a noisy neighbour's).
    pub optional_delivered: u64,
    pub duplicates: u64,
    pub unexpected: u64,
    pub last_delivery: Option<Instant>,
}

/// A latency histogram in microseconds, up to an hour.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

impl Ledger {
    pub fn new(groups: usize) -> Self {
        Self {
            entries: HashMap::new(),
            latency: (0..groups).map(|_| histogram()).collect(),
            ack_latency: histogram(),
            expected: 0,
            delivered: 0,
            optional_delivered: 0,
            duplicates: 0,
            unexpected: 0,
            last_delivery: None,
        }
    }

    /// Records an accepted message, the endpoints it must reach, and those it goes to
    /// without being owed.
    pub fn expect(&mut self, ack: &Ack, group: usize, endpoints: &[u32], optional: &[u32]) {
        let _ = self.ack_latency.record(micros(ack.acked - ack.scheduled));
        self.expected += endpoints.len() as u64;
        let entry = Entry { scheduled: ack.scheduled, group, pending: endpoints.to_vec(), optional: optional.to_vec() };
        self.entries.insert(ack.msg_id.clone(), entry);
    }

    /// Matches receipts against what is owed.
    pub fn record(&mut self, receipts: Vec<Receipt>) {
        for receipt in receipts {
            let Some(entry) = self.entries.get_mut(&receipt.msg_id) else {
                self.unexpected += 1;
                continue;
            };
            if let Some(at) = entry.optional.iter().position(|e| *e == receipt.endpoint) {
                entry.optional.swap_remove(at);
                self.optional_delivered += 1;
                continue;
            }
            match entry.pending.iter().position(|e| *e == receipt.endpoint) {
                Some(at) => {
                    entry.pending.swap_remove(at);
                    self.delivered += 1;
                    let _ =
                        self.latency[entry.group].record(micros(receipt.at.saturating_duration_since(entry.scheduled)));
                    self.last_delivery = Some(self.last_delivery.map_or(receipt.at, |t| t.max(receipt.at)));
                }
                None => self.duplicates += 1,
            }
        }
    }

    pub fn outstanding(&self) -> u64 {
        self.expected - self.delivered
    }

    /// Owed deliveries per endpoint (to ask the server which of them are dead letters).
    pub fn outstanding_by_endpoint(&self) -> HashMap<u32, u64> {
        let mut out = HashMap::new();
        for entry in self.entries.values() {
            for endpoint in &entry.pending {
                *out.entry(*endpoint).or_default() += 1;
            }
        }
        out
    }
}

fn micros(d: std::time::Duration) -> u64 {
    (d.as_micros() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ack(id: &str, at: Instant) -> Ack {
        Ack { msg_id: id.into(), app: 0, scheduled: at, acked: at + Duration::from_millis(2) }
    }

    #[test]
    fn deliveries_close_the_ledger_and_duplicates_are_counted_apart() {
        let t0 = Instant::now();
        let mut ledger = Ledger::new(1);
        ledger.expect(&ack("m1", t0), 0, &[0, 1], &[]);
        ledger.expect(&ack("m2", t0), 0, &[0], &[7]);
        assert_eq!(ledger.outstanding(), 3);
        let receipt = |id: &str, endpoint| Receipt { msg_id: id.into(), endpoint, at: t0 + Duration::from_millis(5) };
        ledger.record(vec![receipt("m1", 0), receipt("m1", 0), receipt("m2", 0), receipt("zz", 0)]);
        assert_eq!((ledger.delivered, ledger.duplicates, ledger.unexpected), (2, 1, 1));
        assert_eq!(ledger.outstanding_by_endpoint(), HashMap::from([(1, 1)]));
        ledger.record(vec![receipt("m1", 1), receipt("m2", 7)]);
        assert_eq!(ledger.outstanding(), 0);
        assert_eq!((ledger.optional_delivered, ledger.unexpected), (1, 1), "an unowed delivery counted apart");
        assert!(ledger.latency[0].value_at_quantile(0.5) >= 5000);
    }
}
