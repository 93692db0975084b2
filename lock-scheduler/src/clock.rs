//! Wall-clock time as the scheduler sees it: [`Clock`], the system's ([`SystemClock`]), the
//! system's shifted by an offset ([`OffsetClock`], for simulations), and one a test moves by
//! hand ([`ManualClock`]).
//!
//! Only the schedule reads this clock: when a fire time is due (to claim it), and how late
//! it is where the lock server has no clock of its own. Once a fire time is claimed, its
//! start, lateness bound and at-least hold are placed on the monotonic clock by the
//! server's answer and waited for with [`Clock::sleep_for`] (tokio's monotonic clock for
//! every real clock), as are the job's hard timeout, the shutdown grace period, lock TTLs
//! and renewals: a wall-clock step cannot stretch a hold or cut a job short.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use jiff::SignedDuration;
use tokio::sync::watch;

/// A boxed future that [`Clock::sleep_until`] returns.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The wall clock of a scheduler.
///
/// Rules an implementation keeps: [`now`](Self::now) is the wall-clock instant;
/// [`sleep_until`](Self::sleep_until) resolves once `now() >= at` (at once if it already
/// is), and notices a clock that jumped forward meanwhile within a bounded time.
pub trait Clock: Send + Sync + 'static {
    /// The current wall-clock instant.
    fn now(&self) -> SystemTime;

    /// A future that resolves once [`now`](Self::now) has reached `at`.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind.
    fn sleep_until(&self, at: SystemTime) -> Sleep;

    /// A future that resolves once `duration` has passed: on tokio's monotonic clock by
    /// default, so a step of the wall clock neither stretches nor cuts it. A clock for tests
    /// ([`ManualClock`]) counts it in its own time.
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind.
    fn sleep_for(&self, duration: Duration) -> Sleep {
        Box::pin(tokio::time::sleep(duration))
    }
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> SystemTime {
        (**self).now()
    }

    fn sleep_until(&self, at: SystemTime) -> Sleep {
        (**self).sleep_until(at)
    }

    fn sleep_for(&self, duration: Duration) -> Sleep {
        (**self).sleep_for(duration)
    }
}

/// The longest single sleep of [`SystemClock`]: after it the wall clock is read again, so
/// a step of the wall clock (NTP, a suspended machine waking) is noticed within this long.
pub const MAX_SLEEP_STEP: Duration = Duration::from_secs(1);

/// The host's wall clock ([`SystemTime::now`]), the default.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }

    fn sleep_until(&self, at: SystemTime) -> Sleep {
        Box::pin(sleep_on_system_clock(at, SignedDuration::ZERO))
    }
}

/// The host's wall clock shifted by a signed offset: `now()` is `SystemTime::now() +
/// offset`.
///
/// For tests and simulations ("a replica whose clock runs 1 s behind"): a scheduler built
/// with [`SchedulerBuilder::clock_offset`](crate::SchedulerBuilder::clock_offset) behaves
/// as one on a host whose clock is that far off.
#[derive(Clone, Copy, Debug)]
pub struct OffsetClock {
    offset: SignedDuration,
}

impl OffsetClock {
    /// The system clock shifted by `offset` (negative: behind).
    pub fn new(offset: SignedDuration) -> Self {
        OffsetClock { offset }
    }

    /// The offset from the system clock.
    pub fn offset(&self) -> SignedDuration {
        self.offset
    }
}

impl Clock for OffsetClock {
    fn now(&self) -> SystemTime {
        shift(SystemTime::now(), self.offset)
    }

    fn sleep_until(&self, at: SystemTime) -> Sleep {
        Box::pin(sleep_on_system_clock(at, self.offset))
    }
}

/// `t + offset`, saturating at the ends of `SystemTime`'s range.
pub(crate) fn shift(t: SystemTime, offset: SignedDuration) -> SystemTime {
    let magnitude = offset.unsigned_abs();
    if offset.is_negative() {
        t.checked_sub(magnitude).unwrap_or(t)
    } else {
        t.checked_add(magnitude).unwrap_or(t)
    }
}

async fn sleep_on_system_clock(at: SystemTime, offset: SignedDuration) {
    loop {
        let now = shift(SystemTime::now(), offset);
        let Ok(left) = at.duration_since(now) else {
            return;
        };
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left.min(MAX_SLEEP_STEP)).await;
    }
}

/// A wall clock that moves only when told to: for tests of schedules, DST transitions,
/// lateness and clocks out of step between replicas.
///
/// Clones share the same time. [`offset`](Self::offset) makes a view of it that reads a
/// fixed offset away (a second replica whose clock is behind); moving any view moves them
/// all. Sleepers wake as soon as the time is [`set`](Self::set) or
/// [`advance`](Self::advance)d past their instant.
///
/// # Examples
///
/// ```
/// use std::time::{Duration, SystemTime, UNIX_EPOCH};
/// use lock_scheduler::{Clock, ManualClock};
/// use lock_scheduler::jiff::SignedDuration;
///
/// let clock = ManualClock::new(UNIX_EPOCH + Duration::from_secs(1_000));
/// let behind = clock.offset(SignedDuration::from_secs(-5));
/// clock.advance(Duration::from_secs(10));
/// assert_eq!(clock.now(), UNIX_EPOCH + Duration::from_secs(1_010));
/// assert_eq!(behind.now(), UNIX_EPOCH + Duration::from_secs(1_005));
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock {
    time: Arc<watch::Sender<SystemTime>>,
    offset: SignedDuration,
}

impl ManualClock {
    /// A clock that reads `start` until moved.
    pub fn new(start: SystemTime) -> Self {
        ManualClock {
            time: Arc::new(watch::Sender::new(start)),
            offset: SignedDuration::ZERO,
        }
    }

    /// A clock that reads the instant `rfc3339` (`"2026-03-29T00:59:00Z"`) until moved.
    ///
    /// # Panics
    /// When `rfc3339` is not such an instant (this is a constructor for tests).
    pub fn at(rfc3339: &str) -> Self {
        let ts: jiff::Timestamp = rfc3339
            .parse()
            .unwrap_or_else(|e| panic!("ManualClock::at({rfc3339:?}): {e}"));
        Self::new(SystemTime::from(ts))
    }

    /// A view of the same time that reads `offset` away from this one (negative: behind).
    pub fn offset(&self, offset: SignedDuration) -> ManualClock {
        ManualClock {
            time: self.time.clone(),
            offset: self.offset.saturating_add(offset),
        }
    }

    /// Sets this view's reading to `t` (every view moves by the same amount). Setting a
    /// time earlier than now moves the clock back.
    pub fn set(&self, t: SystemTime) {
        self.time
            .send_replace(shift(t, SignedDuration::ZERO.saturating_sub(self.offset)));
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        self.time
            .send_modify(|t| *t = t.checked_add(by).unwrap_or(*t));
    }
}

impl Clock for ManualClock {
    fn now(&self) -> SystemTime {
        shift(*self.time.borrow(), self.offset)
    }

    fn sleep_until(&self, at: SystemTime) -> Sleep {
        let mut rx = self.time.subscribe();
        let offset = self.offset;
        Box::pin(async move {
            // The sender lives as long as any view; a closed channel cannot happen while
            // this future holds a view's receiver, but end the sleep rather than hang.
            let _ = rx.wait_for(|t| shift(*t, offset) >= at).await;
        })
    }

    /// Until this clock has been moved `duration` past its reading now.
    fn sleep_for(&self, duration: Duration) -> Sleep {
        let now = self.now();
        self.sleep_until(now.checked_add(duration).unwrap_or(now))
    }
}
