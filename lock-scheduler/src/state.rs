//! The state the scheduler's handle, its runner and its observers share: the scheduler
//! itself ([`Inner`]), the control of a started one ([`Control`]), and what a graceful
//! shutdown reports. Below every other module of the crate but the leaves (job, clock):
//! the public API (`scheduler`) and the tasks (`runner`) both build on it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use jiff::tz::TimeZone;
use lock_core::records::RunRecord;
use lock_core::Locker;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::clock::Clock;
use crate::job::Job;

/// A scheduler's configuration and jobs, shared by its handle and its tasks.
pub(crate) struct Inner {
    pub(crate) locker: Locker,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) replica: Arc<str>,
    pub(crate) zone: TimeZone,
    pub(crate) keep: lock_core::records::Retention,
    /// How often the trigger of each job is read.
    pub(crate) control_poll: std::time::Duration,
    /// End records the lock server did not take (it was unreachable): written, oldest
    /// first, after the next record it takes.
    pub(crate) pending: Mutex<std::collections::VecDeque<RunRecord>>,
    pub(crate) jobs: Mutex<BTreeMap<String, Arc<Job>>>,
    pub(crate) started: Mutex<Option<Control>>,
    /// This replica's clock minus the lock server's, as the last claim answered (`None`
    /// until one did, and on a server without a clock): the job loops wait for fire times
    /// on the server's clock by it, so a replica whose clock is fast does not claim a fire
    /// time before the earlier ones were claimed.
    pub(crate) offset: Mutex<Option<jiff::SignedDuration>>,
    /// Leader mode, when set: only the elected replica fires.
    pub(crate) leader: Option<crate::mode::LeaderMode>,
    /// The term this replica leads in, while it leads (leader mode).
    pub(crate) leading: tokio::sync::watch::Sender<Option<u64>>,
}

impl Inner {
    /// Now on the lock server's clock, as far as this replica knows it.
    pub(crate) fn server_now(&self) -> std::time::SystemTime {
        self.server_time_of(self.clock.now())
    }

    /// The lock server's reading when this replica's clock reads `ours`.
    pub(crate) fn server_time_of(&self, ours: std::time::SystemTime) -> std::time::SystemTime {
        let offset = *lock_core::sync::lock(&self.offset);
        crate::clock::shift(
            ours,
            jiff::SignedDuration::ZERO.saturating_sub(offset.unwrap_or_default()),
        )
    }

    /// The offset in whole milliseconds, for the run records.
    pub(crate) fn offset_ms(&self) -> Option<i64> {
        lock_core::sync::lock(&self.offset).map(|d| {
            i64::try_from(d.as_millis()).unwrap_or(if d.is_negative() {
                i64::MIN
            } else {
                i64::MAX
            })
        })
    }

    /// When this replica's clock reads the server's `at`.
    pub(crate) fn ours(&self, at: std::time::SystemTime) -> std::time::SystemTime {
        let offset = *lock_core::sync::lock(&self.offset);
        crate::clock::shift(at, offset.unwrap_or_default())
    }
}

/// The state of a started scheduler, shared by its tasks.
#[derive(Clone)]
pub(crate) struct Control {
    pub(crate) state: Arc<ControlState>,
}

pub(crate) struct ControlState {
    /// Stop firing (also what [`JobContext::shutting_down`] waits for).
    pub(crate) stop: watch::Sender<bool>,
    /// Cancel the runs still going (the grace period ended).
    pub(crate) cut: watch::Sender<bool>,
    /// The timer tasks, one per job.
    pub(crate) loops: Mutex<JoinSet<()>>,
    /// The tasks of fire times, each ending with its record.
    pub(crate) runs: Mutex<JoinSet<Ended>>,
}

/// How a fire-time task ended.
pub(crate) struct Ended {
    /// How it ended; `None` for a fire time another replica claimed.
    pub(crate) record: Option<RunRecord>,
    /// When the run ended (monotonic), for runs that started.
    pub(crate) ran_until: Option<Instant>,
}

impl Control {
    /// Whether the scheduler was told to stop firing.
    pub(crate) fn stopping(&self) -> bool {
        *self.state.stop.borrow()
    }
}

/// What a graceful [`shutdown`](crate::Running::shutdown) did with the runs under way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Runs under way when the shutdown began that ended within the grace period, as
    /// recorded (any outcome but `Cut`).
    pub finished: Vec<RunRecord>,
    /// Runs still going when the grace period ended: cancelled, recorded
    /// [`Cut`](crate::RunOutcome::Cut).
    pub cut: Vec<RunRecord>,
}
