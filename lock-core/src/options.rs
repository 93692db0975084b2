//! How to acquire: TTL, waiting strategy, watchdog, job timeout.

use std::time::Duration;

use crate::permits::Permits;

/// How long [`Locker::acquire`](crate::Locker::acquire) waits when the lock is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitStrategy {
    /// One attempt: fail with [`Error::Locked`](crate::Error::Locked) if the lock is taken.
    Skip,
    /// Wait up to this long, then fail with [`Error::Timeout`](crate::Error::Timeout) (or
    /// with the last transient error when the server was unreachable).
    Wait(Duration),
    /// Wait until the lock is granted or the future is dropped.
    WaitForever,
}

/// Options of one acquisition. Build with [`LockOptions::new`] and the setters; the fields
/// can be read, and new ones may come (`#[non_exhaustive]`), so a struct literal cannot be
/// written outside this crate.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "setters return the changed value; it does nothing until used"]
pub struct LockOptions {
    /// Time to live of the lock on the server (default 30 s); rounded up to the backend's
    /// minimum and granularity, refused when zero or above its maximum.
    pub ttl: Duration,
    /// What to do when the lock is taken (default: wait up to 30 s).
    pub wait: WaitStrategy,
    /// Whether the guard renews the lock every `ttl / 3` while held (default on).
    pub watchdog: bool,
    /// Hard limit for the future given to [`Locker::run`](crate::Locker::run) (default none).
    pub job_timeout: Option<Duration>,
    /// How long [`Locker::run`](crate::Locker::run) keeps the lock at least, counted on the
    /// monotonic clock from the grant (from the fire time for
    /// [`Locker::run_scheduled`](crate::Locker::run_scheduled)), however soon the job ends
    /// (default none: released when the job ends).
    pub at_least: Option<Duration>,
    /// The `key_label` of this acquisition's metrics and its guard's (default none: the
    /// series then have no key label). See [`metrics_label`](Self::metrics_label).
    pub metrics_label: Option<&'static str>,
    /// What each grant claims of its key (default [`Permits::LOCK`]: a lock). See
    /// [`permits`](Self::permits).
    pub permits: Permits,
    /// Whether a release of the grant is announced to the key's observers in every process
    /// ([`LeaderValues::announce`](crate::election::LeaderValues::announce)): set by
    /// [`Election::campaign`](crate::Election::campaign) for leaderships.
    pub(crate) announce: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: Duration::from_secs(30),
            wait: WaitStrategy::Wait(Duration::from_secs(30)),
            watchdog: true,
            job_timeout: None,
            at_least: None,
            metrics_label: None,
            permits: Permits::LOCK,
            announce: false,
        }
    }
}

impl LockOptions {
    /// The defaults: 30 s TTL, wait up to 30 s, watchdog on, no job timeout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the TTL.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the wait strategy.
    pub fn wait(mut self, wait: WaitStrategy) -> Self {
        self.wait = wait;
        self
    }

    /// One attempt only.
    pub fn skip(self) -> Self {
        self.wait(WaitStrategy::Skip)
    }

    /// Wait up to `timeout`.
    pub fn wait_for(self, timeout: Duration) -> Self {
        self.wait(WaitStrategy::Wait(timeout))
    }

    /// Wait without limit.
    pub fn wait_forever(self) -> Self {
        self.wait(WaitStrategy::WaitForever)
    }

    /// Turns the renewal watchdog on or off.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// Sets the hard timeout of [`Locker::run`](crate::Locker::run).
    pub fn job_timeout(mut self, timeout: Duration) -> Self {
        self.job_timeout = Some(timeout);
        self
    }

    /// Sets the at-least hold of [`Locker::run`](crate::Locker::run): the lock is kept
    /// until `hold` after the grant (after the fire time for
    /// [`Locker::run_scheduled`](crate::Locker::run_scheduled)) even when the job ends
    /// sooner, so a replica starting a little later finds it held.
    pub fn at_least(mut self, hold: Duration) -> Self {
        self.at_least = Some(hold);
        self
    }

    /// Names the kind of lock in the metrics (see [`crate::metrics`]): the series of this
    /// acquisition and of its guard get the label `key_label="<label>"`.
    ///
    /// Rule: the key itself is never a label (keys may be unbounded or sensitive); a
    /// `&'static str` keeps the set of values, and so of series, fixed by the program.
    /// Give the same label to keys of one kind (`"jobs"`, `"stock"`), or set it in the
    /// defaults of a Locker built [`with_options`](crate::Locker::with_options).
    ///
    /// # Examples
    ///
    /// ```
    /// use lock_core::LockOptions;
    ///
    /// let opts = LockOptions::new().metrics_label("jobs");
    /// assert_eq!(opts.metrics_label, Some("jobs"));
    /// ```
    pub fn metrics_label(mut self, label: &'static str) -> Self {
        self.metrics_label = Some(label);
        self
    }

    /// Claims `permits` of the key with each grant instead of the whole key: a semaphore
    /// ([`Permits::new`]`(k, n)`: at most `n` permits held at once across every holder), or
    /// a side of a reader-writer key ([`Permits::read`], [`Permits::write`]). Everything
    /// else is as for a lock: the same waiting, watchdog, `lost()`, release and fencing
    /// (every grant's fence is greater than every earlier grant's on the key).
    ///
    /// A backend that cannot bound the holders of several permits refuses such a claim
    /// before any I/O ([`Capabilities::max_permits`](crate::Capabilities::max_permits),
    /// [`Error::Unsupported`](crate::Error::Unsupported)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// use lock_core::{LockOptions, Permits};
    ///
    /// // At most 5 callers of the payment API at once, across every process.
    /// let opts = LockOptions::new().permits(Permits::new(1, 5)?);
    /// let permit = locker.acquire("api/payments", &opts).await?;
    /// // ... call the API ...
    /// permit.release().await?;
    ///
    /// // Many readers, one writer.
    /// let reader = locker
    ///     .acquire("config", &LockOptions::new().permits(Permits::read()))
    ///     .await?;
    /// reader.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn permits(mut self, permits: Permits) -> Self {
        self.permits = permits;
        self
    }
}

/// Exponential backoff with full jitter: attempt `n` sleeps a uniform random time in
/// `[0, min(cap, base * 2^n))`, so contenders spread out instead of retrying in step. The
/// one retry pacing of distlock: the Locker's waits and backends' reconnect loops use it.
#[derive(Clone, Copy, Debug)]
#[must_use = "setters return the changed value; it does nothing until used"]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    /// A backoff starting at `base` and growing to at most `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Backoff {
            base,
            cap,
            attempt: 0,
        }
    }

    /// Starts over from `base` (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }

    /// The next pause: uniform in `[0, min(cap, base * 2^n))` for the `n`-th call since the
    /// last reset.
    pub fn next_delay(&mut self) -> Duration {
        let exp = self
            .base
            .saturating_mul(1u32.checked_shl(self.attempt).unwrap_or(u32::MAX))
            .min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        let nanos = exp.as_nanos() as u64;
        if nanos == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(rand::random::<u64>() % nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_stays_under_its_cap_and_grows() {
        let mut b = Backoff::new(Duration::from_millis(1), Duration::from_millis(100));
        let mut max_seen = Duration::ZERO;
        for i in 0..200 {
            let d = b.next_delay();
            let bound = Duration::from_millis(1u64 << i.min(7)).min(Duration::from_millis(100));
            assert!(d < bound, "attempt {i}: {d:?} >= {bound:?}");
            max_seen = max_seen.max(d);
        }
        assert!(
            max_seen > Duration::from_millis(10),
            "full jitter reaches high"
        );
    }
}
