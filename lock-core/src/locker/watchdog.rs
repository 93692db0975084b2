//! The Locker's watchdog: one schedule of renewals for all its guards, run by one task.
//!
//! A guard with the watchdog on enters the schedule when granted and leaves it when its
//! hold ends; granting and releasing cost one map insert and one removal, with no task
//! spawned and no timer armed per guard. One task per Locker sleeps until the earliest
//! renewal falls due and then starts it on a task of its own (so one slow server call does
//! not hold up the others); the renewal puts the guard back in the schedule for its next
//! turn. The task exits when the schedule is empty and starts again with the next entry,
//! on the runtime that schedules it (also after the runtime it ran on shut down).
//!
//! A Locker used from several runtimes renews on the runtime its task started on. When
//! that runtime ends, its task ends with it, and renewals of guards held on the other
//! runtimes wait for the next grant with the watchdog on, which starts the task again on
//! its own runtime: until then such a guard may reach its validity and be lost (never
//! held past it). A program with one runtime never sees this.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use tokio::sync::Notify;

use crate::sync::lock;

/// A hold the watchdog renews.
pub(crate) trait Renewable: Send + Sync + 'static {
    /// Renews once, and schedules the next renewal when the hold goes on.
    fn renew_due(self: Arc<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// A place in the schedule: removing it takes the entry out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Ticket(Instant, u64);

#[derive(Default)]
pub(crate) struct Watchdog {
    state: Mutex<State>,
    /// Wakes the task when an entry falls due before the time it sleeps until.
    wake: Notify,
}

#[derive(Default)]
struct State {
    due: BTreeMap<Ticket, Weak<dyn Renewable>>,
    next_id: u64,
    /// Whether a task runs the schedule.
    running: bool,
    /// Until when that task sleeps, when it does.
    sleeping_until: Option<Instant>,
}

impl Watchdog {
    /// Schedules `hold`'s renewal at `at`; `None` outside a tokio runtime (nothing would
    /// run it).
    pub(crate) fn schedule(
        self: &Arc<Self>,
        at: Instant,
        hold: Weak<dyn Renewable>,
    ) -> Option<Ticket> {
        let (ticket, start, wake) = {
            let mut state = lock(&self.state);
            let ticket = Ticket(at, state.next_id);
            state.next_id += 1;
            state.due.insert(ticket, hold);
            let start = !std::mem::replace(&mut state.running, true);
            let wake = !start && state.sleeping_until.is_some_and(|t| at < t);
            (ticket, start, wake)
        };
        if start {
            // The mark travels in the future from the start: a task dropped before it ran
            // (its runtime shutting down) clears it too.
            let running = Running {
                watchdog: self.clone(),
                armed: true,
            };
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(self.clone().run(running))),
                Err(_) => {
                    // No runtime to run it: the entry goes, and the mark with `running`.
                    self.cancel(ticket);
                    drop(running);
                    return None;
                }
            }
        } else if wake {
            self.wake.notify_one();
        }
        Some(ticket)
    }

    /// Takes `ticket`'s entry out of the schedule (nothing when it already ran).
    pub(crate) fn cancel(&self, ticket: Ticket) {
        lock(&self.state).due.remove(&ticket);
    }

    /// Entries in the schedule.
    pub(crate) fn len(&self) -> usize {
        lock(&self.state).due.len()
    }

    /// Runs the schedule until it is empty. `running` is dropped with the task, also when
    /// its runtime shuts down: the next entry then starts a task again.
    async fn run(self: Arc<Self>, mut running: Running) {
        loop {
            let now = Instant::now();
            let (ready, next) = {
                let mut state = lock(&self.state);
                let mut ready = Vec::new();
                while let Some(entry) = state.due.first_entry() {
                    if entry.key().0 > now {
                        break;
                    }
                    ready.push(entry.remove());
                }
                let next = state.due.keys().next().map(|t| t.0);
                state.sleeping_until = next;
                if next.is_none() && ready.is_empty() {
                    state.running = false;
                    running.armed = false;
                    return;
                }
                (ready, next)
            };
            for hold in ready.iter().filter_map(Weak::upgrade) {
                tokio::spawn(hold.renew_due());
            }
            let Some(next) = next else { continue };
            tokio::select! {
                _ = tokio::time::sleep_until(next.into()) => {}
                _ = self.wake.notified() => {}
            }
        }
    }
}

/// Marks the schedule without a task when the task is dropped before it saw the schedule
/// empty (its runtime shut down).
struct Running {
    watchdog: Arc<Watchdog>,
    armed: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.armed {
            let mut state = lock(&self.watchdog.state);
            state.running = false;
            state.sleeping_until = None;
        }
    }
}
