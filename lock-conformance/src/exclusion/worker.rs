//! The tasks that draw and perform each iteration of a run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::RngExt;

use super::config::Grants;
use super::report::ViolationKind;
use super::state::{Belief, Holding, State};
use lock_core::sync::lock;
use lock_core::{Error, LockGuard, LockOptions, Locker, Outcome, Result, WaitStrategy};

pub(super) struct Worker {
    pub(super) state: Arc<State>,
    pub(super) locker: Locker,
    pub(super) who: String,
    pub(super) rng: StdRng,
    pub(super) round_end: Instant,
}

/// What an iteration does.
pub(super) enum Step {
    Acquire,
    Cancelled(Duration),
    Run,
}

impl Worker {
    pub(super) async fn run(mut self) {
        while Instant::now() < self.round_end {
            self.state.count(|c| c.iterations += 1);
            self.iteration().await;
        }
    }

    pub(super) fn draw_ttl(&mut self) -> Duration {
        let (a, b) = (
            self.state.ttl_min.as_secs_f64(),
            self.state.ttl_max.as_secs_f64(),
        );
        let ttl = if b > a {
            (self.rng.random_range(a.ln()..=b.ln())).exp()
        } else {
            a
        };
        let ttl = Duration::from_secs_f64(ttl);
        self.state
            .caps
            .effective_ttl(ttl)
            .map_or(self.state.ttl_min, |t| t.get())
    }

    pub(super) fn upto(&mut self, max: Duration) -> Duration {
        max.mul_f64(self.rng.random_range(0.0..=1.0))
    }

    pub(super) async fn iteration(&mut self) {
        let key_idx = self.rng.random_range(0..self.state.keys.len());
        let key = self.state.keys[key_idx].clone();
        let ttl = self.draw_ttl();
        let watchdog = self.rng.random_bool(0.5);
        let ttl_max = self.state.ttl_max;
        let election = self.state.grants == Grants::Election;
        let step = match self.rng.random_range(0..10) {
            0..=5 => Step::Acquire,
            6 | 7 => Step::Cancelled(self.upto(ttl_max)),
            // A leadership is not a job's lock: candidates campaign instead.
            _ if election => Step::Acquire,
            _ => Step::Run,
        };
        if let Step::Run = step {
            return self.run_job(key_idx, ttl, watchdog).await;
        }
        let wait = if self.rng.random_bool(0.25) {
            WaitStrategy::Skip
        } else {
            WaitStrategy::Wait(self.upto(ttl_max * 2))
        };
        let permits = self.state.draw_permits(&mut self.rng);
        let opts = LockOptions::new()
            .ttl(ttl)
            .wait(wait)
            .watchdog(watchdog)
            .permits(permits);
        let proclaim = election && self.rng.random_bool(0.3);
        let acquire = async {
            if election {
                self.campaign(&key, &opts, proclaim).await
            } else {
                self.locker.acquire(&*key, &opts).await
            }
        };
        let result = match step {
            Step::Cancelled(after) => match tokio::time::timeout(after, acquire).await {
                Ok(result) => result,
                Err(_) => {
                    self.state.count(|c| c.cancelled += 1);
                    return;
                }
            },
            _ => acquire.await,
        };
        match result {
            Ok(guard) => {
                self.state.count(|c| c.acquired += 1);
                self.hold(key_idx, guard, ttl, watchdog).await;
            }
            Err(e) => self.acquire_failed(&key, e).await,
        }
    }

    /// A campaign in the election `key`, proclaiming a second value at once when
    /// `proclaim`; the leadership as the lock it is made of.
    async fn campaign(&self, key: &str, opts: &LockOptions, proclaim: bool) -> Result<LockGuard> {
        let election = self.locker.election(key)?;
        let mut leadership = election.campaign(self.who.as_bytes(), opts).await?;
        if proclaim {
            match leadership.proclaim(format!("{} again", self.who)).await {
                Ok(()) => self.state.count(|c| c.proclaims.0 += 1),
                // Lost meanwhile, or a server that did not answer: the hold finds out.
                Err(Error::NotHeld { .. }) => self.state.count(|c| c.proclaims.1 += 1),
                Err(e) if e.is_transient() => self.state.count(|c| c.proclaims.1 += 1),
                Err(e) => self.state.violation(
                    ViolationKind::UnexpectedError,
                    key,
                    format!("{}: proclaim failed with {e}", self.who),
                ),
            }
        }
        Ok(leadership.into_guard())
    }

    pub(super) async fn acquire_failed(&mut self, key: &str, e: Error) {
        match e {
            Error::Locked { .. } | Error::Timeout { .. } => {
                self.state.count(|c| c.refused += 1);
            }
            e if e.is_transient() => {
                self.state.count(|c| c.transient += 1);
                // Do not spin on an unreachable server.
                let pause = self.upto(self.state.ttl_min);
                tokio::time::sleep(pause).await;
            }
            e => self.state.violation(
                ViolationKind::UnexpectedError,
                key,
                format!(
                    "{}: acquire failed with a non-transient error: {e}",
                    self.who
                ),
            ),
        }
    }

    /// Holds `guard` for a random time, writing several times and maybe extending, then
    /// ends it by release or by drop.
    pub(super) async fn hold(
        &mut self,
        key: usize,
        guard: LockGuard,
        ttl: Duration,
        watchdog: bool,
    ) {
        let guard = Arc::new(guard);
        let me = Holding {
            id: self.state.next_id.fetch_add(1, Ordering::SeqCst),
            who: format!(
                "{} [{}, ttl {:?}, watchdog {}]",
                self.who,
                guard.permits(),
                guard.ttl(),
                if watchdog { "on" } else { "off" }
            ),
            permits: guard.permits(),
            key,
            fence: Some(guard.fence()),
            since: Instant::now(),
            belief: Belief::Guard(Arc::downgrade(&guard)),
        };
        let hold = match (watchdog, self.rng.random_range(0..10)) {
            // Past the TTL with the watchdog off: the writes must stop at the validity.
            (false, 0..=2) => ttl.mul_f64(self.rng.random_range(1.2..2.0)),
            // Across several renewals.
            (true, 0..=2) => ttl.mul_f64(self.rng.random_range(1.0..3.0)),
            _ => ttl.mul_f64(self.rng.random_range(0.0..0.9)),
        };
        let writes = self.rng.random_range(2..=5u32);
        let gap = hold / writes;
        self.state.write(&me);
        for _ in 1..writes {
            tokio::time::sleep(gap).await;
            if self.rng.random_bool(0.15) && !guard.is_lost() {
                let new_ttl = self.draw_ttl();
                match guard.extend(new_ttl).await {
                    Ok(()) => self.state.count(|c| c.extends.0 += 1),
                    Err(e) => {
                        self.state.count(|c| c.extends.1 += 1);
                        if !e.is_transient() && !matches!(e, Error::NotHeld { .. }) {
                            self.state.violation(
                                ViolationKind::UnexpectedError,
                                &self.state.keys[key],
                                format!("{}: extend failed with {e}", self.who),
                            );
                        }
                    }
                }
            }
            if !self.state.write(&me) {
                break;
            }
        }
        self.state.leave(&me);
        let by_release = self.rng.random_bool(0.5);
        match Arc::try_unwrap(guard) {
            Ok(guard) if by_release => {
                self.state.count(|c| c.ends.0 += 1);
                match guard.release().await {
                    Ok(()) | Err(Error::NotHeld { .. }) => {}
                    Err(e) if e.is_transient() => {}
                    Err(e) => self.state.violation(
                        ViolationKind::UnexpectedError,
                        &self.state.keys[key],
                        format!("{}: release failed with {e}", self.who),
                    ),
                }
            }
            other => {
                self.state.count(|c| c.ends.1 += 1);
                drop(other);
            }
        }
    }

    /// One `Locker::run` with a random job length and hard timeout.
    pub(super) async fn run_job(&mut self, key: usize, ttl: Duration, watchdog: bool) {
        let job_len = ttl.mul_f64(self.rng.random_range(0.0..2.0));
        let job_timeout = self
            .rng
            .random_bool(0.5)
            .then(|| ttl.mul_f64(self.rng.random_range(0.25..2.0)));
        // The job's belief bound below counts from before the acquire: after a long wait
        // the job no longer counts as believing (its writes are skipped), but its outcome
        // is still checked.
        let wait = match self.rng.random_range(0..3) {
            0 => WaitStrategy::Skip,
            1 => WaitStrategy::Wait(self.upto(ttl / 4)),
            _ => WaitStrategy::Wait(self.upto(self.state.ttl_max * 2)),
        };
        let permits = self.state.draw_permits(&mut self.rng);
        let mut opts = LockOptions::new()
            .ttl(ttl)
            .wait(wait)
            .watchdog(watchdog)
            .permits(permits);
        if let Some(t) = job_timeout {
            opts = opts.job_timeout(t);
        }
        let alive = Arc::new(AtomicBool::new(false));
        let started: Arc<Mutex<Option<Instant>>> = Arc::default();
        let before = Instant::now();
        // The guard's validity counts from before its grant request, sent after `before`,
        // minus the backend's drift allowance: half the TTL is a safe lower bound.
        let me = Holding {
            id: self.state.next_id.fetch_add(1, Ordering::SeqCst),
            who: format!(
                "{} [run job, {permits}, ttl {ttl:?}, watchdog {}]",
                self.who,
                if watchdog { "on" } else { "off" }
            ),
            permits,
            key,
            fence: None,
            since: before,
            belief: Belief::Job {
                alive: alive.clone(),
                until: before + ttl / 2,
            },
        };
        let writes = self.rng.random_range(2..=5u32);
        let job = {
            let (state, alive, started) = (self.state.clone(), alive.clone(), started.clone());
            async move {
                let _alive = Alive::set(alive);
                let t0 = Instant::now();
                *lock(&started) = Some(t0);
                for _ in 0..writes {
                    state.write(&me);
                    tokio::time::sleep(job_len / writes).await;
                }
                state.leave(&me);
                t0.elapsed()
            }
        };
        let result = self.locker.run(&*self.state.keys[key], &opts, job).await;
        let returned = Instant::now();
        let key_name = self.state.keys[key].clone();
        if alive.load(Ordering::SeqCst) {
            self.state.violation(
                ViolationKind::RunOutcome,
                &key_name,
                format!(
                    "{}: run returned {result:?} but its job was not dropped",
                    self.who
                ),
            );
        }
        let ran_for = lock(&started).map(|t| returned.saturating_duration_since(t));
        let slack = Duration::from_millis(50) + self.state.ttl_min / 2;
        match result {
            Ok(Outcome::Ran(took)) => {
                self.state.count(|c| c.runs[0] += 1);
                if let Some(t) = job_timeout.filter(|t| took > *t + slack) {
                    self.state.violation(
                        ViolationKind::RunOutcome,
                        &key_name,
                        format!(
                            "{}: the job ran {took:?}, past its hard timeout {t:?}",
                            self.who
                        ),
                    );
                }
                // A session-bound lock has no TTL to run past: it is held until released.
                if !watchdog && !self.state.caps.session_bound && took > ttl + slack {
                    self.state.violation(
                        ViolationKind::RunOutcome,
                        &key_name,
                        format!(
                            "{}: with the watchdog off the job ran {took:?}, past its lock's \
                             TTL {ttl:?}, and was not cancelled",
                            self.who
                        ),
                    );
                }
            }
            Ok(Outcome::Skipped) => self.state.count(|c| c.runs[1] += 1),
            Ok(Outcome::TimedOut) => {
                self.state.count(|c| c.runs[2] += 1);
                let early = match (job_timeout, ran_for) {
                    (None, _) => Some("without a hard timeout".to_owned()),
                    (Some(t), Some(r)) if r + Duration::from_millis(2) < t => {
                        Some(format!("after {r:?}, before its hard timeout {t:?}"))
                    }
                    _ => None,
                };
                if let Some(why) = early {
                    self.state.violation(
                        ViolationKind::RunOutcome,
                        &key_name,
                        format!("{}: run reported TimedOut {why}", self.who),
                    );
                }
            }
            Ok(Outcome::LockLost) => self.state.count(|c| c.runs[3] += 1),
            // `run` claims no fire time (ClaimedElsewhere), and gives no other outcome.
            Ok(other) => self.state.violation(
                ViolationKind::RunOutcome,
                &key_name,
                format!("{}: run, which claims nothing, said {other:?}", self.who),
            ),
            Err(e) => self.acquire_failed(&key_name, e).await,
        }
    }
}

/// Marks a job alive while it exists (set on its first poll, cleared when it is dropped).
pub(super) struct Alive(pub(super) Arc<AtomicBool>);

impl Alive {
    pub(super) fn set(flag: Arc<AtomicBool>) -> Self {
        flag.store(true, Ordering::SeqCst);
        Alive(flag)
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::SeqCst);
    }
}
