//! Memory for deliveries: the jobs this process holds (ready, parked, on a timer, in
//! flight) plus reservations for jobs about to arrive, within `queue.memory_limit`. A
//! counter, not part of the lanes: ingest reserves on its own path, without a message to
//! the lanes' owner, and whoever lets a job go gives its room back.

use std::sync::atomic::{AtomicUsize, Ordering};

pub struct Room {
    held: AtomicUsize,
    limit: usize,
}

impl Room {
    pub fn new(limit: usize) -> Self {
        Self { held: AtomicUsize::new(0), limit }
    }

    /// Reserves room for `n` jobs about to arrive; false when memory is full (the work
    /// then waits in the database).
    pub fn try_reserve(&self, n: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| (held + n <= self.limit).then_some(held + n))
            .is_ok()
    }

    /// Gives back the room of `n` jobs that left memory, or of reservations not used.
    pub fn release(&self, n: usize) {
        let _ = self.held.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| Some(held.saturating_sub(n)));
    }

    /// Room for this many more jobs.
    pub fn free(&self) -> usize {
        self.limit.saturating_sub(self.held.load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_bound_memory_and_released_room_is_free_again() {
        let room = Room::new(3);
        assert!(room.try_reserve(2));
        assert!(!room.try_reserve(2), "two more would pass the limit");
        assert!(room.try_reserve(1));
        assert_eq!(room.free(), 0);
        room.release(1);
        assert_eq!(room.free(), 1);
        room.release(10);
        assert_eq!(room.free(), 3, "giving back more than is held leaves nothing held");
    }

    #[test]
    fn concurrent_reservations_never_pass_the_limit() {
        let room = std::sync::Arc::new(Room::new(1_000));
        let takers: Vec<_> = (0..4)
            .map(|_| {
                let room = room.clone();
                std::thread::spawn(move || (0..1_000).filter(|_| room.try_reserve(1)).count())
            })
            .collect();
        let taken: usize = takers.into_iter().map(|t| t.join().unwrap()).sum();
        assert_eq!(taken, 1_000);
        assert_eq!(room.free(), 0);
    }
}
