#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// docs.rs marks each item with the Cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod clock;
pub mod control;
mod error;
mod fire;
mod history;
mod job;
mod leader;
mod mode;
mod observe;
mod plan;
mod runner;
mod schedule;
mod scheduler;
mod state;

pub use clock::{Clock, ManualClock, OffsetClock, Sleep, SystemClock, MAX_SLEEP_STEP};
pub use error::{Error, Result};
pub use history::{
    duration_stats, fire_times, per_fire_time, DurationStats, FireTimeLine, LineState,
};
pub use job::{CatchUp, Job, JobContext, OnBusy};
pub use mode::{LeaderMode, DEFAULT_LEADER_TTL};
pub use observe::metric_names;
pub use plan::Plan;
pub use schedule::Schedule;
pub use scheduler::{
    default_replica, Running, Scheduler, SchedulerBuilder, DEFAULT_CONTROL_POLL, DEFAULT_KEEP,
};
pub use state::ShutdownReport;

pub use jiff;
pub use lock_core::records::{JobControl, Retention, RunCause, RunOutcome, RunRecord};
pub use lock_core::BoxError;
