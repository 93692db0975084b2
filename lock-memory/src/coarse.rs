//! A cheap answer to "has this instant passed?" for the release path: the kernel's coarse
//! monotonic clock costs a few nanoseconds where a precise reading costs tens (more in
//! virtual machines). It lags the precise clock by at most one tick, so it decides only
//! when the instant is more than a safety margin away; otherwise the caller reads the
//! precise clock. The answer is therefore always the precise clock's answer.

use std::time::{Duration, Instant};

/// Maps coarse readings onto [`Instant`]s, within `margin`.
pub(crate) struct CoarseClock {
    /// `None` where no coarse clock is available: every question goes to the precise clock.
    anchor: Option<(Instant, Duration)>,
    margin: Duration,
}

impl CoarseClock {
    pub(crate) fn new() -> Self {
        let (Some(resolution), Some(coarse)) = (sys::resolution(), sys::now()) else {
            return CoarseClock {
                anchor: None,
                margin: Duration::ZERO,
            };
        };
        let precise = Instant::now();
        // A coarse reading lags the precise clock by up to one tick at the anchor and at
        // every later reading: the mapped value is within one tick of the truth either
        // way. Two ticks and a millisecond leave room for scheduling between the reads.
        let margin = resolution * 2 + Duration::from_millis(1);
        CoarseClock {
            anchor: (resolution <= Duration::from_millis(20)).then_some((precise, coarse)),
            margin,
        }
    }

    /// Whether `t` is still ahead of now: `Some` when the coarse clock settles it, `None`
    /// when `t` is too close to now to tell without the precise clock.
    pub(crate) fn is_ahead(&self, t: Instant) -> Option<bool> {
        let (anchor, anchor_coarse) = self.anchor?;
        let elapsed = sys::now()?.checked_sub(anchor_coarse)?;
        let mapped = anchor.checked_add(elapsed)?;
        if mapped.checked_add(self.margin).is_some_and(|late| late < t) {
            Some(true)
        } else if mapped
            .checked_sub(self.margin)
            .is_some_and(|early| early >= t)
        {
            Some(false)
        } else {
            None
        }
    }

    /// Whether `t` is still ahead of now, exactly as `Instant::now() < t` says.
    pub(crate) fn ahead(&self, t: Instant) -> bool {
        self.is_ahead(t).unwrap_or_else(|| Instant::now() < t)
    }
}

#[cfg(target_os = "linux")]
mod sys {
    use std::time::Duration;

    type ClockFn = unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> libc::c_int;

    fn read(f: ClockFn) -> Option<Duration> {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
        let rc = unsafe { f(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
        if rc != 0 {
            return None;
        }
        let secs = u64::try_from(ts.tv_sec).ok()?;
        let nanos = u32::try_from(ts.tv_nsec).ok()?;
        (nanos < 1_000_000_000).then(|| Duration::new(secs, nanos))
    }

    /// The coarse monotonic clock (same timebase as `Instant` on Linux).
    pub(super) fn now() -> Option<Duration> {
        read(libc::clock_gettime)
    }

    /// Its resolution (one scheduler tick).
    pub(super) fn resolution() -> Option<Duration> {
        read(libc::clock_getres)
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::time::Duration;

    pub(super) fn now() -> Option<Duration> {
        None
    }

    pub(super) fn resolution() -> Option<Duration> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agrees_with_the_precise_clock() {
        let clock = CoarseClock::new();
        let now = Instant::now();
        let far = now + Duration::from_secs(60);
        let long_ago = now.checked_sub(Duration::from_secs(60)).unwrap_or(now);
        assert!(clock.ahead(far));
        assert!(!clock.ahead(long_ago));
        assert!(!clock.ahead(now), "an instant already read is not ahead");
        if cfg!(target_os = "linux") {
            assert_eq!(
                clock.is_ahead(far),
                Some(true),
                "far instants need no precise read"
            );
            assert_eq!(clock.is_ahead(long_ago), Some(false));
            assert_eq!(clock.is_ahead(now + Duration::from_micros(10)), None);
        }
        let now = Instant::now();
        for offset_ms in [1u64, 10, 100, 1000, 60_000] {
            let offset = Duration::from_millis(offset_ms);
            for t in [now + offset, now.checked_sub(offset).unwrap_or(now)] {
                if let Some(answer) = clock.is_ahead(t) {
                    assert_eq!(answer, Instant::now() < t, "offset {offset:?}");
                }
            }
        }
    }
}
