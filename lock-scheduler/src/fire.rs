//! One fire time of one job, in its own task: claim the fire time in the lock server, wait
//! until the server's clock reaches it, take the lock, run the job (cancelled on a lost
//! lock, the hard timeout or the end of a shutdown's grace), hold until the at-least
//! instant, release, and record the outcome.
//!
//! The claim decides which replica runs the fire time (one per fire time, whatever the
//! replicas' clocks say); the lock keeps runs from overlapping; the at-least hold is
//! defence in depth. Once claimed, the fire time is placed on this process's monotonic
//! clock by the server's answer ([`Placed`]): the start, the lateness bound and the end of
//! the hold are monotonic instants, so a step of the replica's wall clock moves none of
//! them.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::FutureExt;
use jiff::Zoned;
use lock_core::records::{RunCause, RunOutcome, RunRecord};
use lock_core::{Backoff, LockGuard, LockOptions, WaitStrategy};
use tracing::Instrument;

use crate::job::{Job, JobContext, OnBusy};
use crate::observe;
use crate::plan::{instant_of, Plan};
use crate::state::{Control, Ended, Inner};

/// Where the fire time falls on this process's monotonic clock: `instant` is when the
/// deciding clock (the lock server's where it has one, else the scheduler's) read `wall`.
#[derive(Clone, Copy, Debug)]
struct Placed {
    instant: Instant,
    wall: SystemTime,
}

impl Placed {
    /// The monotonic instant at which the deciding clock reads `t`; `None` when that was
    /// longer ago than the monotonic clock counts (long past).
    fn instant_of(&self, t: SystemTime) -> Option<Instant> {
        match t.duration_since(self.wall) {
            Ok(ahead) => Some(self.instant + ahead),
            Err(behind) => self.instant.checked_sub(behind.duration()),
        }
    }

    /// Whether the deciding clock has passed `t` by now.
    fn passed(&self, t: SystemTime) -> bool {
        match self.instant_of(t) {
            Some(t) => t <= Instant::now(),
            None => true,
        }
    }
}

/// One fire time of one job, as its task sees it.
struct FireTime {
    inner: Arc<Inner>,
    control: Control,
    job: Arc<Job>,
    fire: Zoned,
    at: SystemTime,
    plan: Plan,
    cause: RunCause,
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
        RunRecord::new(
            self.job.name.clone(),
            self.at,
            self.inner.replica.to_string(),
            self.inner.clock.now(),
            outcome,
        )
        .started_at(started_at)
        .fence(fence)
        .detail(Some(detail).filter(|d| !d.is_empty()))
        .clock_offset_ms(self.inner.offset_ms())
        .pid(started_at.map(|_| std::process::id()))
        .cause(self.cause)
    }

    /// The key this fire time is claimed under: the job's, or for a trigger its own (so a
    /// trigger never moves the job's claim past a fire time still to come).
    fn claim_key(&self) -> String {
        match self.cause {
            RunCause::Trigger => trigger_key(&self.job.name),
            _ => self.job.name.clone(),
        }
    }

    /// Whether the job is paused (a trigger runs anyway; a control that cannot be read
    /// pauses nothing).
    async fn paused(&self) -> bool {
        if self.cause == RunCause::Trigger {
            return false;
        }
        let Some(records) = self.inner.locker.backend().run_records() else {
            return false;
        };
        matches!(records.control(&self.job.name).await, Ok(Some(c)) if c.paused)
    }

    /// Waits before the next try of a step the lock server failed, if the fire time's
    /// latest start leaves room for one; false when it does not (or the scheduler stops).
    async fn retry_after(&self, backoff: &mut Backoff) -> bool {
        let pause = backoff.next_delay();
        let latest = self.at + self.plan.lateness;
        if self.inner.server_now() + pause > latest || self.control.stopping() {
            return false;
        }
        let mut stop = self.control.state.stop.subscribe();
        futures::select_biased! {
            _ = stop.wait_for(|stopping| *stopping).fuse() => false,
            _ = tokio::time::sleep(pause).fuse() => true,
        }
    }

    /// Ends a fire time that did not run.
    async fn not_run(&self, outcome: RunOutcome, detail: impl Into<String>) -> Ended {
        let record = self.record(outcome, None, None, detail.into());
        observe::finish(&self.inner, &record, None).await;
        Ended {
            record: Some(record),
            ran_until: None,
        }
    }

    /// Claims the fire time in the lock server and places it on the monotonic clock by the
    /// server's answer; `Err` is how the fire time ended instead (claimed by another
    /// replica: no record, it runs there).
    async fn claim(&self) -> std::result::Result<Placed, Ended> {
        let key = self.claim_key();
        let mut backoff = retry_backoff();
        let (answer, sent, asked_at, answered) = loop {
            let sent = Instant::now();
            let asked_at = self.inner.clock.now();
            let claimed = self
                .inner
                .locker
                .claim_fire_time(&key, self.at, &self.inner.replica)
                .await;
            match claimed {
                Ok(answer) => break (answer, sent, asked_at, Instant::now()),
                Err(e) if e.is_transient() && self.retry_after(&mut backoff).await => {
                    tracing::debug!(job = self.job.name, error = %e.report(), "claim failed; retrying");
                }
                Err(e) => {
                    let (outcome, what) = if e.is_transient() {
                        (
                            RunOutcome::Unavailable,
                            "until the fire time's latest start",
                        )
                    } else {
                        (RunOutcome::Failed, "")
                    };
                    let detail = format!("could not claim the fire time {what}: {}", e.report());
                    return Err(self.not_run(outcome, detail).await);
                }
            }
        };
        if !answer.won {
            observe::claimed_elsewhere(&self.job.name, self.at, &answer.claim.replica);
            return Err(Ended {
                record: None,
                ran_until: None,
            });
        }
        Ok(match answer.server_time {
            // The server's time stands for the middle of the round trip.
            Some(server) => {
                let half = (answered - sent) / 2;
                observe::clock_offset(&self.inner, asked_at + half, server);
                Placed {
                    instant: sent + half,
                    wall: server,
                }
            }
            None => Placed {
                instant: answered,
                wall: self.inner.clock.now(),
            },
        })
    }

    /// Waits until the deciding clock reaches the fire time (a replica whose clock is fast
    /// claims early and starts on time); `Err` when the scheduler stopped meanwhile.
    async fn wait_for_the_fire_time(&self, placed: &Placed) -> std::result::Result<(), Ended> {
        let Some(start) = placed.instant_of(self.at).filter(|t| *t > Instant::now()) else {
            return Ok(());
        };
        let mut stop = self.control.state.stop.subscribe();
        let stopped = futures::select_biased! {
            _ = stop.wait_for(|stopping| *stopping).fuse() => true,
            _ = tokio::time::sleep_until(start.into()).fuse() => false,
        };
        if stopped {
            return Err(self
                .not_run(RunOutcome::SkippedBusy, SHUT_DOWN_WAITING)
                .await);
        }
        Ok(())
    }

    /// Takes the lock (one attempt, or the job's bounded wait, never past the lateness
    /// bound); `Err` is how the fire time ended instead.
    async fn lock(&self, placed: &Placed) -> std::result::Result<LockGuard, Ended> {
        let latest = self.at + self.plan.lateness;
        if placed.passed(latest) {
            return Err(self.missed(placed, "claimed").await);
        }
        let latest_start = placed.instant_of(latest).unwrap_or_else(Instant::now);
        let wait = match self.job.on_busy {
            OnBusy::Skip => WaitStrategy::Skip,
            OnBusy::Wait(bound) => WaitStrategy::Wait(
                bound.min(latest_start.saturating_duration_since(Instant::now())),
            ),
        };
        let opts = LockOptions::new()
            .ttl(self.plan.ttl)
            .watchdog(true)
            .wait(wait);
        let mut stop = self.control.state.stop.subscribe();
        let mut backoff = retry_backoff();
        let acquired = loop {
            let acquired = futures::select_biased! {
                _ = stop.wait_for(|stopping| *stopping).fuse() => None,
                acquired = self.inner.locker.acquire(self.job.name.as_str(), &opts).fuse() => Some(acquired),
            };
            match acquired {
                Some(Err(e))
                    if e.is_transient()
                        && !matches!(
                            e,
                            lock_core::Error::Locked { .. } | lock_core::Error::Timeout { .. }
                        ) =>
                {
                    if self.retry_after(&mut backoff).await {
                        continue;
                    }
                    let detail = format!(
                        "could not take the lock until the fire time's latest start: {}",
                        e.report()
                    );
                    return Err(self.not_run(RunOutcome::Unavailable, detail).await);
                }
                other => break other,
            }
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
                let detail = format!("could not take the lock: {}", e.report());
                return Err(self.not_run(RunOutcome::Failed, detail).await);
            }
        };
        if Instant::now() > latest_start {
            release(guard, &self.job.name).await;
            return Err(self.missed(placed, "the lock was won").await);
        }
        if self.control.stopping() {
            release(guard, &self.job.name).await;
            return Err(self
                .not_run(RunOutcome::SkippedBusy, SHUT_DOWN_WAITING)
                .await);
        }
        Ok(guard)
    }

    /// Ends a fire time found past its lateness bound when `what` happened.
    async fn missed(&self, placed: &Placed, what: &str) -> Ended {
        let late = placed
            .instant_of(self.at)
            .map(|at| at.elapsed())
            .unwrap_or(Duration::MAX);
        let detail = format!(
            "{what} {late:?} after the fire time (on the lock server's clock where it has \
             one), past the lateness bound"
        );
        self.not_run(RunOutcome::Missed, detail).await
    }

    /// Runs the task under `guard` until it ends, the lock is lost, the timeout passes or
    /// the grace period ends; the task's future is dropped before this returns.
    async fn run(&self, guard: &LockGuard, started_at: SystemTime) -> Ran {
        let output = Arc::new(std::sync::Mutex::new(None));
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
            cause: self.cause,
            output: output.clone(),
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
        let (outcome, detail) = futures::select_biased! {
            _ = lost.fuse() => (RunOutcome::LockLost, LOST.to_owned()),
            _ = cut.wait_for(|cut| *cut).fuse() => (RunOutcome::Cut, CUT.to_owned()),
            ended = run.fuse() => match ended {
                Ok(Ok(())) => (RunOutcome::Ok, String::new()),
                Ok(Err(e)) => (RunOutcome::Failed, e.to_string()),
                Err(panic) => (RunOutcome::Failed, panic_text(&*panic)),
            },
            _ = hard_timeout.fuse() => (RunOutcome::TimedOut, timed_out(self.job.timeout)),
        };
        let output = lock_core::sync::lock(&output).take();
        Ran {
            outcome,
            detail,
            output,
        }
    }

    /// Keeps the lock until `fire time + at_least` as the claim placed it on the monotonic
    /// clock, waited for with [`Clock::sleep_for`](crate::Clock::sleep_for) (a shutdown or
    /// the loss of the lock ends it sooner), then releases it. A step of the wall clock
    /// meanwhile neither stretches nor cuts it.
    async fn hold_then_release(&self, guard: LockGuard, placed: &Placed) {
        let left = placed
            .instant_of(self.at + self.plan.at_least)
            .map(|until| until.saturating_duration_since(Instant::now()))
            .unwrap_or_default();
        if !left.is_zero() {
            let mut stop = self.control.state.stop.subscribe();
            futures::select_biased! {
                // A shutdown ends the hold at once (see `Running::shutdown`).
                _ = stop.wait_for(|stopping| *stopping).fuse() => {}
                _ = guard.lost().fuse() => {}
                _ = self.inner.clock.sleep_for(left).fuse() => {}
            }
        }
        release(guard, &self.job.name).await;
    }

    /// The whole fire time: claim, wait for it, lock, run, record, hold, release.
    async fn go(self) -> Ended {
        if self.paused().await {
            tracing::info!(
                job = self.job.name,
                "the job is paused: the fire time is not run"
            );
            observe::paused(&self.job.name);
            return Ended {
                record: None,
                ran_until: None,
            };
        }
        let placed = match self.claim().await {
            Ok(placed) => placed,
            Err(ended) => return ended,
        };
        if let Err(ended) = self.wait_for_the_fire_time(&placed).await {
            return ended;
        }
        let guard = match self.lock(&placed).await {
            Ok(guard) => guard,
            Err(ended) => return ended,
        };
        tracing::Span::current().record("fence", guard.fence());
        let started = Instant::now();
        let started_at = self.inner.clock.now();
        // The journal shows the run from its start, on every replica: `running`, until the
        // end record below replaces it (same fire time and fence).
        let running = self.record(
            RunOutcome::Running,
            Some(started_at),
            Some(guard.fence()),
            String::new(),
        );
        observe::store(&self.inner, &running, false).await;
        let in_progress = observe::InProgress::start(&self.job.name);
        let Ran {
            outcome,
            detail,
            output,
        } = self.run(&guard, started_at).await;
        drop(in_progress);
        let elapsed = started.elapsed();
        let ran_until = Instant::now();
        let record = self
            .record(outcome, Some(started_at), Some(guard.fence()), detail)
            .output(output);
        observe::finish(&self.inner, &record, Some(elapsed)).await;
        match outcome {
            // Known gone: dropping the guard is all that is left to do.
            RunOutcome::LockLost => drop(guard),
            RunOutcome::Cut => release(guard, &self.job.name).await,
            _ => self.hold_then_release(guard, &placed).await,
        }
        Ended {
            record: Some(record),
            ran_until: Some(ran_until),
        }
    }
}

/// The claim key of a job's triggers: apart from its fire times' claims, so a trigger
/// never moves the job's claim past a fire time still to come (claims only move forward).
pub(crate) fn trigger_key(job: &str) -> String {
    format!("{job}\u{1f}trigger")
}

/// How a run ended, as [`FireTime::run`] saw it.
struct Ran {
    outcome: RunOutcome,
    detail: String,
    output: Option<String>,
}

/// The pacing of a step the lock server failed, tried again while the fire time's latest
/// start allows: lock-core's backoff (full jitter, so replicas do not retry in step) from
/// 250 ms, growing to 4 s.
fn retry_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(250), Duration::from_secs(4))
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
    cause: RunCause,
) -> impl std::future::Future<Output = Ended> + Send + 'static {
    let span = tracing::info_span!(
        "scheduled_run",
        job = %job.name,
        scheduled_at = %fire,
        replica = %inner.replica,
        fence = tracing::field::Empty,
        cause = cause.as_str(),
    );
    let at = instant_of(&fire);
    FireTime {
        inner,
        control,
        job,
        fire,
        at,
        plan,
        cause,
    }
    .go()
    .instrument(span)
}

async fn release(guard: LockGuard, job: &str) {
    if let Err(e) = guard.release().await {
        tracing::debug!(job, error = %e.report(), "release after the run");
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
