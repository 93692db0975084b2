//! Cluster-wide control of a job: pause, resume and trigger, kept in the lock server
//! ([`JobControl`]) so that every replica acts on them at once, without a restart or a
//! file edit. [`pause`], [`resume`] and [`trigger`] write it; each replica reads the pause
//! at every fire time and polls for triggers (`trigger_poll`).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::FutureExt as _;
use lock_core::records::{JobControl, RunCause, RunRecords};
use lock_core::Locker;

use crate::error::{Error, Result};
use crate::job::Job;
use crate::plan::Plan;
use crate::state::{Control, Inner};

fn records(locker: &Locker) -> Result<&dyn RunRecords> {
    locker.backend().run_records().ok_or(Error::RecordsNotKept {
        backend: locker.capabilities().name,
    })
}

/// Reads, changes and writes the job's control. Two operators changing one job at the
/// same instant: the last write wins (the control is one value).
async fn change(
    locker: &Locker,
    job: &str,
    by: &str,
    f: impl FnOnce(JobControl, SystemTime) -> JobControl,
) -> Result<JobControl> {
    lock_core::validate_key(job)?;
    let records = records(locker)?;
    let now = SystemTime::now();
    let current = records
        .control(job)
        .await?
        .unwrap_or_else(|| JobControl::new(by, now));
    let mut next = f(current, now);
    next.changed_by = by.to_owned();
    next.changed_at = now;
    records.set_control(job, &next).await?;
    Ok(next)
}

/// Pauses `job` on every replica: from the next fire time each replica reads, none starts
/// a run of it (a run under way goes on; a [`trigger`] still runs). `by` names who asked.
///
/// # Errors
/// [`Error::RecordsNotKept`] on a backend without a journal; [`Error::Lock`] when the
/// server failed (the pause may or may not be written).
///
/// # Cancel safety
/// A dropped call may or may not have written the pause.
pub async fn pause(locker: &Locker, job: &str, by: &str) -> Result<JobControl> {
    change(locker, job, by, |c, _| c.paused(true)).await
}

/// Ends a [`pause`] of `job` on every replica; its next fire time runs.
///
/// # Errors
/// As [`pause`].
///
/// # Cancel safety
/// As [`pause`].
pub async fn resume(locker: &Locker, job: &str, by: &str) -> Result<JobControl> {
    change(locker, job, by, |c, _| c.paused(false)).await
}

/// Asks for one run of `job` now, outside its schedule: one replica that runs the job
/// (and polls within its [`control_poll`](crate::SchedulerBuilder::control_poll)) claims
/// the trigger and runs it once, under the job's lock (skipped if a run holds it),
/// recorded with [`RunCause::Trigger`] at the trigger's instant. Returns that instant
/// (later than the previous trigger's, whatever the clocks).
///
/// # Errors
/// As [`pause`].
///
/// # Cancel safety
/// A dropped call may or may not have written the trigger.
pub async fn trigger(locker: &Locker, job: &str, by: &str) -> Result<SystemTime> {
    let control = change(locker, job, by, |c, now| {
        let at = match c.trigger {
            Some(previous) if previous >= now => previous + Duration::from_millis(1),
            _ => now,
        };
        // Whole milliseconds, as claims keep them.
        let ms = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let at =
            SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX));
        c.trigger(Some(at))
    })
    .await?;
    Ok(control.trigger.expect("just set"))
}

/// How long after its instant a trigger may still start: what finding it takes (two
/// polls) and a margin for a slow server.
fn trigger_lateness(inner: &Inner) -> Duration {
    inner.control_poll * 2 + Duration::from_secs(10)
}

/// Polls `job`'s control every [`control_poll`](crate::SchedulerBuilder::control_poll)
/// and runs each new trigger as a fire time of its own (claimed under `fire::trigger_key`),
/// until the scheduler stops. A trigger older than its lateness when first seen is not
/// run.
pub(crate) async fn poll_triggers(inner: Arc<Inner>, control: Control, job: Arc<Job>) {
    let Some(records) = inner.locker.backend().run_records() else {
        return;
    };
    let zone = job.zone.clone().unwrap_or_else(|| inner.zone.clone());
    let mut stop = control.state.stop.subscribe();
    let mut seen: Option<SystemTime> = None;
    loop {
        if let Ok(Some(c)) = records.control(&job.name).await {
            if let Some(at) = c.trigger.filter(|at| seen.is_none_or(|s| *at > s)) {
                seen = Some(at);
                let lateness = trigger_lateness(&inner);
                if inner.server_now() <= at + lateness {
                    // No at-least hold: the trigger's claim, not the lock, keeps it once.
                    let mut plan = Plan::new(&job, &zone, at);
                    plan.at_least = Duration::ZERO;
                    plan.lateness = lateness;
                    if let Ok(fire) = jiff::Timestamp::try_from(at) {
                        let fire = fire.to_zoned(zone.clone());
                        tracing::info!(job = job.name, by = c.changed_by, "triggered");
                        control.spawn_fire(&inner, &job, fire, plan, RunCause::Trigger);
                    }
                }
            }
        }
        futures::select_biased! {
            _ = stop.wait_for(|stopping| *stopping).fuse() => return,
            _ = tokio::time::sleep(inner.control_poll).fuse() => {}
        }
    }
}
