//! One fire time of one job, in its own task: take the lock, run the job (cancelled on a
//! lost lock, the hard timeout or the end of a shutdown's grace), hold until the at-least
//! instant, release, and record the outcome.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use jiff::Zoned;
use lock_core::records::{RunOutcome, RunRecord};
use lock_core::{LockGuard, LockOptions, WaitStrategy};
use tracing::Instrument;

use crate::job::{Job, JobContext, OnBusy};
use crate::observe;
use crate::plan::{instant_of, Plan};
use crate::state::{Control, Ended, Inner};

/// One fire time of one job, as its task sees it.
struct FireTime {
    inner: Arc<Inner>,
    control: Control,
    job: Arc<Job>,
    fire: Zoned,
    at: SystemTime,
    plan: Plan,
}

impl FireTime {
    /// The record of this fire time ending now.
    fn record(
        &self,
        outcome: RunOutcome,
        started_at: Option<SystemTime>,
        fence: Option<u64>,
        detail: String,
    ) -> RunRecord {
        RunRecord {
            job: self.job.name.clone(),
            scheduled_at: self.at,
            replica: self.inner.replica.to_string(),
            started_at,
            ended_at: self.inner.clock.now(),
            outcome,
            fence,
            detail: Some(detail).filter(|d| !d.is_empty()),
        }
    }

    /// Ends a fire time that did not run.
    async fn not_run(&self, outcome: RunOutcome, detail: impl Into<String>) -> Ended {
        let record = self.record(outcome, None, None, detail.into());
        observe::finish(&self.inner, &record, None).await;
        Ended {
            record,
            ran_until: None,
        }
    }

    /// Takes the lock (one attempt, or the job's bounded wait, never past the lateness
    /// bound); `Err` is how the fire time ended instead.
    async fn lock(&self) -> std::result::Result<LockGuard, Ended> {
        let latest_start = self.at + self.plan.lateness;
        let wait = match self.job.on_busy {
            OnBusy::Skip => WaitStrategy::Skip,
            OnBusy::Wait(bound) => {
                let left = latest_start
                    .duration_since(self.inner.clock.now())
                    .unwrap_or_default();
                WaitStrategy::Wait(bound.min(left))
            }
        };
        let opts = LockOptions::new()
            .ttl(self.plan.ttl)
            .watchdog(true)
            .wait(wait);
        let mut stop = self.control.state.stop.subscribe();
        let acquired = tokio::select! {
            biased;
            _ = stop.wait_for(|stopping| *stopping) => None,
            acquired = self.inner.locker.acquire(self.job.name.as_str(), &opts) => Some(acquired),
        };
        let guard = match acquired {
            None => {
                return Err(self
                    .not_run(RunOutcome::SkippedBusy, SHUT_DOWN_WAITING)
                    .await)
            }
            Some(Ok(guard)) => guard,
            Some(Err(lock_core::Error::Locked { .. } | lock_core::Error::Timeout { .. })) => {
                return Err(self.not_run(RunOutcome::SkippedBusy, HELD_ELSEWHERE).await)
            }
            Some(Err(e)) => {
                let detail = format!("could not take the lock: {e}");
                return Err(self.not_run(RunOutcome::Failed, detail).await);
            }
        };
        let now = self.inner.clock.now();
        if now > latest_start {
            release(guard, &self.job.name).await;
            let late = now.duration_since(self.at).unwrap_or_default();
            let detail =
                format!("the lock was won {late:?} after the fire time, past the lateness bound");
            return Err(self.not_run(RunOutcome::Missed, detail).await);
        }
        if self.control.stopping() {
            release(guard, &self.job.name).await;
            return Err(self
                .not_run(RunOutcome::SkippedBusy, SHUT_DOWN_WAITING)
                .await);
        }
        Ok(guard)
    }

    /// Runs the task under `guard` until it ends, the lock is lost, the timeout passes or
    /// the grace period ends; the task's future is dropped before this returns.
    async fn run(&self, guard: &LockGuard) -> (RunOutcome, String, SystemTime) {
        let started_at = self.inner.clock.now();
        let deadline = self.job.timeout.map(|t| Instant::now() + t);
        let lost = guard.lost().boxed().shared();
        let ctx = JobContext {
            job: Arc::from(self.job.name.as_str()),
            scheduled: self.fire.clone(),
            fence: guard.fence(),
            replica: self.inner.replica.clone(),
            started_at,
            deadline,
            lost: lost.clone(),
            shutting_down: self.control.state.stop.subscribe(),
        };
        let task = self.job.task.as_ref().expect("checked by Scheduler::add");
        // A panic is the job's failure, whether the task panics when called or when polled.
        let run = match std::panic::catch_unwind(AssertUnwindSafe(|| task(ctx))) {
            Ok(future) => AssertUnwindSafe(future).catch_unwind().boxed(),
            Err(panic) => futures::future::ready(Err(panic)).boxed(),
        };
        let mut cut = self.control.state.cut.subscribe();
        let hard_timeout = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        // The run's future lives only inside this select: it is dropped, cancelled where it
        // is suspended, as soon as one branch wins. A loss found with the end wins.
        let (outcome, detail) = tokio::select! {
            biased;
            _ = lost => (RunOutcome::LockLost, LOST.to_owned()),
            _ = cut.wait_for(|cut| *cut) => (RunOutcome::Cut, CUT.to_owned()),
            ended = run => match ended {
                Ok(Ok(())) => (RunOutcome::Ok, String::new()),
                Ok(Err(e)) => (RunOutcome::Failed, e.to_string()),
                Err(panic) => (RunOutcome::Failed, panic_text(&*panic)),
            },
            _ = hard_timeout => (RunOutcome::TimedOut, timed_out(self.job.timeout)),
        };
        (outcome, detail, started_at)
    }

    /// Keeps the lock until `fire time + at_least` on the scheduler's clock (a shutdown or
    /// the loss of the lock ends it sooner), then releases it.
    async fn hold_then_release(&self, guard: LockGuard) {
        let until = self.at + self.plan.at_least;
        if self.inner.clock.now() < until {
            let mut stop = self.control.state.stop.subscribe();
            tokio::select! {
                biased;
                // A shutdown ends the hold at once (see `Running::shutdown`).
                _ = stop.wait_for(|stopping| *stopping) => {}
                _ = guard.lost() => {}
                _ = self.inner.clock.sleep_until(until) => {}
            }
        }
        release(guard, &self.job.name).await;
    }

    /// The whole fire time: lock, run, record, hold, release.
    async fn go(self) -> Ended {
        let guard = match self.lock().await {
            Ok(guard) => guard,
            Err(ended) => return ended,
        };
        tracing::Span::current().record("fence", guard.fence());
        let started = Instant::now();
        let (outcome, detail, started_at) = self.run(&guard).await;
        let elapsed = started.elapsed();
        let ran_until = Instant::now();
        let record = self.record(outcome, Some(started_at), Some(guard.fence()), detail);
        observe::finish(&self.inner, &record, Some(elapsed)).await;
        match outcome {
            // Known gone: dropping the guard is all that is left to do.
            RunOutcome::LockLost => drop(guard),
            RunOutcome::Cut => release(guard, &self.job.name).await,
            _ => self.hold_then_release(guard).await,
        }
        Ended {
            record,
            ran_until: Some(ran_until),
        }
    }
}

const SHUT_DOWN_WAITING: &str = "the scheduler shut down while waiting for the lock";
const HELD_ELSEWHERE: &str = "the lock was held elsewhere";
const LOST: &str = "the lock was lost while the job ran; the job was cancelled";
const CUT: &str = "the shutdown's grace period ended while the job ran; the job was cancelled";

fn timed_out(timeout: Option<Duration>) -> String {
    format!(
        "the job passed its timeout of {:?} and was cancelled",
        timeout.unwrap_or_default()
    )
}

/// The task of one fire time, in its tracing span.
pub(crate) fn run_fire(
    inner: Arc<Inner>,
    control: Control,
    job: Arc<Job>,
    fire: Zoned,
    plan: Plan,
) -> impl std::future::Future<Output = Ended> + Send + 'static {
    let span = tracing::info_span!(
        "scheduled_run",
        job = %job.name,
        scheduled_at = %fire,
        replica = %inner.replica,
        fence = tracing::field::Empty,
    );
    let at = instant_of(&fire);
    FireTime {
        inner,
        control,
        job,
        fire,
        at,
        plan,
    }
    .go()
    .instrument(span)
}

async fn release(guard: LockGuard, job: &str) {
    if let Err(e) = guard.release().await {
        tracing::debug!(job, error = %e, "release after the run");
    }
}

fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    let text = if let Some(s) = panic.downcast_ref::<&str>() {
        s
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s
    } else {
        "(not a string)"
    };
    format!("the job panicked: {text}")
}
