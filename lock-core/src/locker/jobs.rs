//! The helpers above `acquire`: [`Locker::run`] for scheduled jobs,
//! [`Locker::claim_fire_time`] for their fire times, and [`Locker::acquire_many`] for sets
//! of keys.

use futures::FutureExt as _;
use std::future::Future;
use std::time::{Instant, SystemTime};

use super::{LockGuard, Locker, Outcome};
use crate::claims::{check_claim, ClaimAnswer, FireClaim};
use crate::error::{Error, Result};
use crate::lease::LockKey;
use crate::options::{LockOptions, WaitStrategy};
use crate::validate_key;

impl Locker {
    /// Claims `fire_time` of `job` for `replica` in the lock server
    /// ([`FireClaims::claim`](crate::claims::FireClaims::claim)): won by exactly one call per
    /// job and fire time, whatever the callers' clocks; a fire time equal to or older than
    /// the one kept is never won. The fire time is kept in whole milliseconds.
    ///
    /// # Errors
    /// [`Error::InvalidKey`] for an invalid job name, replica or fire time, before any I/O;
    /// [`Error::Shutdown`]; [`Error::Unsupported`] on a backend that keeps no claims
    /// ([`Backend::fire_claims`](crate::Backend::fire_claims)); transient backend errors,
    /// after which the claim may or may not have been made.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the claim made or not; a claim made and not heard of
    /// means that fire time runs nowhere (never twice).
    pub async fn claim_fire_time(
        &self,
        job: &str,
        fire_time: SystemTime,
        replica: &str,
    ) -> Result<ClaimAnswer> {
        let fire_time = check_claim(job, fire_time, replica)?;
        if self.inner.is_shut_down() {
            return Err(Error::Shutdown);
        }
        self.fire_claims()?.claim(job, fire_time, replica).await
    }

    /// The fire-time claim the lock server keeps for `job`, if any.
    ///
    /// # Errors
    /// As [`claim_fire_time`](Self::claim_fire_time), but for the shutdown.
    ///
    /// # Cancel safety
    /// A read only: dropping the future changes nothing.
    pub async fn fire_claim(&self, job: &str) -> Result<Option<FireClaim>> {
        validate_key(job)?;
        self.fire_claims()?.current(job).await
    }

    fn fire_claims(&self) -> Result<&dyn crate::claims::FireClaims> {
        self.inner.proto().fire_claims().ok_or(Error::Unsupported {
            backend: self.inner.caps.name,
            operation: "fire-time claims (the scheduler's exactly-once fire times)",
        })
    }

    /// Runs `job` only if `key` is won, and says what happened.
    ///
    /// The job is cancelled (dropped) as soon as the lock is known lost or
    /// `opts.job_timeout` passes; after it completes or times out the lock is released.
    /// A lock not won (taken with `Skip`, or the wait deadline passed) is
    /// [`Outcome::Skipped`].
    ///
    /// The lock is acquired as by [`acquire`](Self::acquire) with `opts`; `job` is not
    /// polled before the lock is won, and `opts.job_timeout` counts from the grant. "Known
    /// lost" is [`LockGuard::lost`]: a renewal refused, the validity passed without a renewal
    /// (with the watchdog off, that is the TTL passing), or the Locker shut down; the outcome
    /// is then [`Outcome::LockLost`] and the guard is dropped (which sends a release in the
    /// background, unless the shutdown already released it). When the job completes and the
    /// loss is found at the same time, the loss wins. A release after the job that fails
    /// (for example because the lock expired just then) is logged, not reported: the
    /// outcome stays [`Outcome::Ran`].
    ///
    /// With `opts.at_least`, the lock is kept until that long after the grant (on the
    /// monotonic clock) even when the job ends sooner, so a process starting the same job
    /// a little later finds it held; a loss of the lock ends that hold.
    ///
    /// # Errors
    /// Invalid input, and backend failures while acquiring (other than a wait timeout).
    /// That is: [`Error::InvalidKey`](crate::Error::InvalidKey) / [`Error::InvalidTtl`](crate::Error::InvalidTtl) before any I/O,
    /// [`Error::Shutdown`](crate::Error::Shutdown), non-transient backend errors, and the last transient error when
    /// the wait deadline passed while the server failed. [`Error::Locked`](crate::Error::Locked) and
    /// [`Error::Timeout`](crate::Error::Timeout) become [`Outcome::Skipped`].
    ///
    /// # Cancel safety
    /// Dropping the future while it waits for the lock is as for [`acquire`](Self::acquire):
    /// no lock held, no waiter queued. Dropping it while the job runs drops the job (at the
    /// await it is suspended on) and the guard, whose drop releases the lock in the
    /// background (see [`LockGuard`]); dropping it during the release after the job lets
    /// that release continue in the background.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{LockOptions, Outcome};
    ///
    /// // On every replica: the first to win the key runs the report, the others skip it.
    /// let opts = LockOptions::new()
    ///     .skip()
    ///     .ttl(Duration::from_secs(30))
    ///     .job_timeout(Duration::from_secs(600));
    /// match locker.run("jobs/report", &opts, async { /* build the report */ 42 }).await? {
    ///     Outcome::Ran(value) => println!("ran: {value}"),
    ///     Outcome::Skipped => println!("another replica has it"),
    ///     Outcome::TimedOut => println!("cancelled after 10 minutes"),
    ///     Outcome::LockLost => println!("lock lost: cancelled"),
    ///     // ClaimedElsewhere comes from `run_scheduled` only; the enum may grow.
    ///     _ => {}
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn run<K, F, T>(&self, key: &K, opts: &LockOptions, job: F) -> Result<Outcome<T>>
    where
        K: LockKey + ?Sized,
        F: Future<Output = T>,
    {
        self.run_until(key, opts, job, None).await
    }

    /// Runs `job` for fire time `fire_time` of the job named `key`, once across every
    /// process that asks for the same fire time: the fire time is claimed first
    /// ([`claim_fire_time`](Self::claim_fire_time), for `replica`), and only the claim's
    /// winner runs it, as [`run`](Self::run) does, after the lock server's clock reached
    /// `fire_time` (a caller whose clock is fast waits; on a server without a clock, the
    /// caller's clock decides). A claim already made is [`Outcome::ClaimedElsewhere`].
    /// `opts.at_least` counts from the fire time (as the server's clock placed it, on the
    /// monotonic clock).
    ///
    /// # Errors
    /// As [`claim_fire_time`](Self::claim_fire_time) and [`run`](Self::run).
    ///
    /// # Cancel safety
    /// Dropping the future before the claim's answer may leave the fire time claimed and
    /// not run (never run twice); after it, as for [`run`](Self::run).
    pub async fn run_scheduled<K, F, T>(
        &self,
        key: &K,
        fire_time: SystemTime,
        replica: &str,
        opts: &LockOptions,
        job: F,
    ) -> Result<Outcome<T>>
    where
        K: LockKey + ?Sized,
        F: Future<Output = T>,
    {
        let sent = Instant::now();
        let answer = self
            .claim_fire_time(key.as_key(), fire_time, replica)
            .await?;
        if !answer.won {
            return Ok(Outcome::ClaimedElsewhere);
        }
        // The fire time on the monotonic clock, as the server's clock places it (its time
        // stands for the middle of the round trip), else as ours does.
        let (at, wall) = match answer.server_time {
            Some(server) => (sent + sent.elapsed() / 2, server),
            None => (Instant::now(), SystemTime::now()),
        };
        let fire = match fire_time.duration_since(wall) {
            Ok(ahead) => at + ahead,
            Err(behind) => at.checked_sub(behind.duration()).unwrap_or(at),
        };
        tokio::time::sleep_until(fire.into()).await;
        self.run_until(key, opts, job, Some(fire)).await
    }

    /// [`run`](Self::run), the at-least hold counted from `from` (else from the grant).
    async fn run_until<K, F, T>(
        &self,
        key: &K,
        opts: &LockOptions,
        job: F,
        from: Option<Instant>,
    ) -> Result<Outcome<T>>
    where
        K: LockKey + ?Sized,
        F: Future<Output = T>,
    {
        let guard = match self.acquire(key, opts).await {
            Ok(guard) => guard,
            Err(Error::Locked { .. } | Error::Timeout { .. }) => return Ok(Outcome::Skipped),
            Err(e) => return Err(e),
        };
        let hold_until = opts
            .at_least
            .map(|hold| from.unwrap_or_else(|| guard.granted_at()) + hold);
        let key = key.as_key();
        let lost = guard.lost();
        let hard_timeout = async {
            match opts.job_timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        let outcome = futures::select_biased! {
            _ = lost.fuse() => {
                tracing::warn!(key, "lock lost while the job ran; job cancelled");
                return Ok(Outcome::LockLost);
            }
            value = job.fuse() => Outcome::Ran(value),
            _ = hard_timeout.fuse() => {
                tracing::warn!(key, "job passed its hard timeout; job cancelled");
                Outcome::TimedOut
            }
        };
        if let Some(until) = hold_until {
            // A loss ends the hold: nothing is left to keep.
            futures::select! {
                _ = guard.lost().fuse() => {}
                _ = tokio::time::sleep_until(until.into()).fuse() => {}
            }
        }
        if let Err(e) = guard.release().await {
            tracing::warn!(key, error = %e.report(), "release after the job failed");
        }
        Ok(outcome)
    }

    /// Acquires every key of `keys` or none: keys are deduplicated and taken in sorted
    /// order, so two callers with overlapping sets can never deadlock. The wait deadline of
    /// `opts` covers the whole set. Guards come back in sorted key order.
    ///
    /// Every key is validated before any lock is taken. Each key is acquired as by
    /// [`acquire`](Self::acquire) with `opts`, its wait bounded by what is left of the
    /// set's deadline; with [`WaitStrategy::Skip`] each key gets one attempt. An empty
    /// `keys` is `Ok` with no guard.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire); locks taken before the failure are released first.
    /// They are released one after another in reverse order, and their release errors are
    /// ignored. An [`Error::Timeout`](crate::Error::Timeout) reports the time waited for the whole set.
    ///
    /// # Cancel safety
    /// Dropping the future drops the guards taken so far, which release in the background.
    /// The same holds while it releases them after a failure: a release cut off goes on in
    /// the background, and the key being acquired when the future is dropped is left as by
    /// a dropped [`acquire`](Self::acquire).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::LockOptions;
    ///
    /// // A transfer locks both accounts; another transfer locking them the other way
    /// // round takes them in the same (sorted) order, so neither waits for the other forever.
    /// let opts = LockOptions::new().wait_for(Duration::from_secs(5));
    /// let guards = locker.acquire_many(&["accounts/b", "accounts/a"], &opts).await?;
    /// assert_eq!(guards[0].key(), "accounts/a");
    /// // ... move the money ...
    /// for guard in guards {
    ///     guard.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn acquire_many<S: AsRef<str>>(
        &self,
        keys: &[S],
        opts: &LockOptions,
    ) -> Result<Vec<LockGuard>> {
        let mut sorted: Vec<&str> = keys.iter().map(|k| k.as_ref()).collect();
        for key in &sorted {
            validate_key(key)?;
        }
        sorted.sort_unstable();
        sorted.dedup();
        let started = Instant::now();
        let mut guards = Vec::with_capacity(sorted.len());
        for key in sorted {
            let mut each = opts.clone();
            if let WaitStrategy::Wait(total) = opts.wait {
                each.wait = WaitStrategy::Wait(total.saturating_sub(started.elapsed()));
            }
            match self.acquire(key, &each).await {
                Ok(guard) => guards.push(guard),
                Err(e) => {
                    for guard in guards.drain(..).rev() {
                        let _ = guard.release().await;
                    }
                    return Err(match e {
                        Error::Timeout { key, .. } => Error::Timeout {
                            key,
                            waited: started.elapsed(),
                        },
                        other => other,
                    });
                }
            }
        }
        Ok(guards)
    }
}
