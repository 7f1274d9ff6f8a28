//! The owner of the lanes: one task holds [`Lanes`] and every change to them arrives as a
//! message, applied in the order sent. The same task is the pump: whenever a global slot
//! is free and the lease allows, it takes the next job from the lanes and spawns its
//! attempt. Nothing else touches the lanes, so there is no lock for the pump, ingest, the
//! loader, the outcome writer, the lease and the API to contend for.
//!
//! A message is a closure over the lanes (and the dispatcher, for the room and the lease):
//! [`Dispatcher::tell`] sends one and goes on, [`Dispatcher::ask`] waits for its answer.
//! Reads from the API (a breaker, in-flight counts) are answers too, computed between two
//! pops.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::lanes::Lanes;
use super::{Dispatcher, LEASE_RECHECK, sleep_until_ms};
use crate::clock::now_ms;

/// A change to (or a read of) the lanes, run by their owner.
pub(super) type Message = Box<dyn FnOnce(&mut Lanes, &Dispatcher) + Send>;

pub(super) type Inbox = mpsc::UnboundedReceiver<Message>;

/// Where messages to the owner go.
pub(super) struct Mailbox(mpsc::UnboundedSender<Message>);

pub(super) fn mailbox() -> (Mailbox, Inbox) {
    let (tx, rx) = mpsc::unbounded_channel();
    (Mailbox(tx), rx)
}

impl Dispatcher {
    /// Sends a change to the lanes' owner. Once the owner has stopped (the process is
    /// ending), changes are dropped: what the lanes held is given back through the store.
    pub(super) fn tell(&self, change: impl FnOnce(&mut Lanes, &Dispatcher) + Send + 'static) {
        let _ = self.mailbox.0.send(Box::new(change));
    }

    /// Wakes the owner to look again without changing the lanes (the lease was renewed).
    pub(super) fn nudge(&self) {
        self.tell(|_, _| {});
    }

    /// Asks the lanes' owner for `read`'s answer; `None` once the owner has stopped.
    pub(super) async fn ask<R: Send + 'static>(
        &self,
        read: impl FnOnce(&mut Lanes, &Dispatcher) -> R + Send + 'static,
    ) -> Option<R> {
        let (answer, answered) = oneshot::channel();
        self.tell(move |lanes, dispatcher| {
            let _ = answer.send(read(lanes, dispatcher));
        });
        answered.await.ok()
    }
}

/// Owns the lanes until `stop`: applies every message, and while `pumping` starts an
/// attempt for each job the lanes give whenever a slot is free. After `pumping` ends it
/// keeps applying messages (attempts still finishing report to it) until `stop`.
pub(super) async fn run(
    dispatcher: Arc<Dispatcher>,
    mut lanes: Lanes,
    mut inbox: Inbox,
    pumping: CancellationToken,
    stop: CancellationToken,
) {
    loop {
        while let Ok(message) = inbox.try_recv() {
            message(&mut lanes, &dispatcher);
        }
        let pumping_now = !pumping.is_cancelled();
        let wait = if pumping_now { pump(&dispatcher, &mut lanes) } else { Wait::Messages };
        let (due, recheck) = match wait {
            Wait::Slot | Wait::Messages => (None, None),
            Wait::Due(due) => (due, None),
            Wait::Lease => (None, Some(LEASE_RECHECK)),
        };
        tokio::select! {
            message = inbox.recv() => match message {
                Some(message) => message(&mut lanes, &dispatcher),
                None => return,
            },
            // A finishing attempt says so in a message; this is the backstop for one that
            // gave its slot back some other way.
            _ = dispatcher.slots.acquire(), if matches!(wait, Wait::Slot) => {}
            () = sleep_until_ms(due) => {}
            () = sleep_for(recheck) => {}
            () = pumping.cancelled(), if !pumping.is_cancelled() => {}
            () = stop.cancelled() => return,
        }
    }
}

/// What the owner waits for besides messages.
enum Wait {
    /// A free slot: every one is taken.
    Slot,
    /// Only messages: pumping ended.
    Messages,
    /// The next timer of the lanes (a retry, a parked endpoint's wake-up), if any.
    Due(Option<crate::clock::Millis>),
    /// The lease to be renewed.
    Lease,
}

/// Starts an attempt for every job the lanes give while slots are free.
fn pump(dispatcher: &Arc<Dispatcher>, lanes: &mut Lanes) -> Wait {
    // Past the lease's sure end (a store outage, a pause), the claims may be another
    // process's already: start nothing until the lease is renewed.
    if !dispatcher.lease.may_start() {
        return Wait::Lease;
    }
    loop {
        let Ok(permit) = dispatcher.slots.clone().try_acquire_owned() else { return Wait::Slot };
        let now = now_ms();
        lanes.promote(now);
        let Some(job) = lanes.pop(now) else { return Wait::Due(lanes.next_due()) };
        #[cfg(feature = "fault-injection")]
        if dispatcher.config.faults.panic_pump_on_event_type.as_deref() == Some(&*job.message.event_type) {
            panic!("injected fault: faults.panic_pump_on_event_type");
        }
        let attempt = dispatcher.clone();
        // Boxed: an attempt's future is kilobytes, and a task's future is moved by value
        // several times as it is spawned and finished; a box is moved as a pointer.
        dispatcher.attempts.spawn(Box::pin(async move { attempt.process(job, permit).await }));
    }
}

async fn sleep_for(wait: Option<Duration>) {
    match wait {
        Some(wait) => tokio::time::sleep(wait).await,
        None => std::future::pending().await,
    }
}
