//! The Locker's watchdog: one schedule of renewals for all its guards, run by one task.
//!
//! A guard with the watchdog on enters the schedule when granted and leaves it when its
//! hold ends; granting and releasing cost one map insert and one removal, with no task
//! spawned and no timer armed per guard. One task per Locker sleeps until the earliest
//! renewal falls due and then starts it on a task of its own (so one slow server call does
//! not hold up the others); the renewal puts the guard back in the schedule for its next
//! turn. The task exits when the schedule is empty and starts again with the next entry.
//!
//! The task and the renewals it starts run on the process's renewal runtime
//! ([`renewal_runtime`]): one thread with a current-thread tokio runtime, started with the
//! first renewal scheduled anywhere in the process and never stopped. So renewal does not
//! depend on which runtime a guard was granted on: a Locker shared by several runtimes
//! (a runtime per subsystem, `#[tokio::test]`s, a blocking wrapper) keeps renewing every
//! guard while one of them idles or after it was dropped, and a renewal in flight never
//! holds a guard's operation lock on a runtime that nobody drives.

use futures::FutureExt as _;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::sync::lock;

/// How often a guard is renewed: every third of its TTL, so that two renewals in a row
/// can fail (or one can take a third of the TTL to answer) before the validity passes.
pub(crate) fn renewal_period(ttl: Duration) -> Duration {
    ttl / 3
}

/// A hold the watchdog renews.
pub(crate) trait Renewable: Send + Sync + 'static {
    /// Renews once if `turn` is still the hold's place in the schedule (a turn superseded
    /// by a reschedule, such as an `extend`'s, does nothing), and schedules the next
    /// renewal when the hold goes on.
    fn renew_due(self: Arc<Self>, turn: Ticket) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// The process's renewal runtime: a thread named `distlock-renewal` running a
/// current-thread tokio runtime (timers and I/O enabled) for as long as the process lives,
/// started on first use. `None` when the thread or the runtime cannot be made.
pub(crate) fn renewal_runtime() -> Option<&'static tokio::runtime::Handle> {
    static RUNTIME: OnceLock<Option<tokio::runtime::Handle>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .thread_name("distlock-renewal")
                .build()
                .map_err(|e| tracing::error!(error = %e, "cannot build the renewal runtime"))
                .ok()?;
            let handle = runtime.handle().clone();
            std::thread::Builder::new()
                .name("distlock-renewal".into())
                .spawn(move || runtime.block_on(std::future::pending::<()>()))
                .map_err(|e| tracing::error!(error = %e, "cannot start the renewal thread"))
                .ok()?;
            Some(handle)
        })
        .as_ref()
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
    /// Schedules `hold`'s renewal at `at`, to run on the [`renewal_runtime`]; `None` when
    /// that runtime could not be started (nothing would run it).
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
            match renewal_runtime() {
                Some(runtime) => drop(runtime.spawn(self.clone().run(running))),
                None => {
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

    /// Runs the schedule until it is empty. `running` is dropped with the task, so the
    /// next entry starts a task again.
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
                    let turn = *entry.key();
                    ready.push((turn, entry.remove()));
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
            for (turn, hold) in ready {
                if let Some(hold) = hold.upgrade() {
                    tokio::spawn(hold.renew_due(turn));
                }
            }
            let Some(next) = next else { continue };
            futures::select! {
                _ = tokio::time::sleep_until(next.into()).fuse() => {}
                _ = self.wake.notified().fuse() => {}
            }
        }
    }
}

/// Marks the schedule without a task when the task is dropped before it saw the schedule
/// empty.
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
