//! What one fire time uses ([`Plan`]): the at-least hold, the lateness bound and the TTL,
//! each the job's own or a default derived from the gap to the next fire time.

use std::time::{Duration, SystemTime};

use jiff::tz::TimeZone;
use jiff::Zoned;

use crate::job::Job;
use crate::schedule::Schedule;

/// The longest default `at_least` hold.
const MAX_DEFAULT_AT_LEAST: Duration = Duration::from_secs(60);
/// The shortest default lateness bound.
const MIN_DEFAULT_LATENESS: Duration = Duration::from_millis(500);
/// The bounds of the default TTL.
const MIN_DEFAULT_TTL: Duration = Duration::from_secs(1);
const MAX_DEFAULT_TTL: Duration = Duration::from_secs(30);
/// The gap assumed after a fire time with no next one.
const LAST_GAP: Duration = Duration::from_secs(24 * 3600);

/// What one fire time uses: the job's own at-least hold, lateness bound and TTL, or the
/// defaults derived from the gap to the next fire time.
///
/// The defaults: `at_least` half the gap, at most 1 min; `lateness` half of `at_least`,
/// at least 500 ms but below a non-zero `at_least` (at most three quarters of it); the TTL
/// half the gap, from 1 s to 30 s. An `at_least`, given or not, is capped at nine tenths
/// of the gap, so a hold never blocks the next fire time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "setters return the changed value; it does nothing until used"]
pub struct Plan {
    /// The gap to the next fire time (a day when there is none).
    pub gap: Duration,
    /// How long the lock is kept after the fire time, however soon the run ends.
    pub at_least: Duration,
    /// How late after the fire time a run may still start.
    pub lateness: Duration,
    /// The lock's TTL.
    pub ttl: Duration,
}

impl Plan {
    /// The plan of fire time `fire` of `schedule` in `zone`, with the job's own
    /// `at_least`, `lateness` and `ttl` where given (the one rule the scheduler and the
    /// `distlock` command's checks both use).
    pub fn for_fire_time(
        schedule: &Schedule,
        zone: &TimeZone,
        fire: SystemTime,
        at_least: Option<Duration>,
        lateness: Option<Duration>,
        ttl: Option<Duration>,
    ) -> Plan {
        let gap = schedule
            .next_after(fire, zone)
            .and_then(|next| SystemTime::from(next.timestamp()).duration_since(fire).ok())
            .unwrap_or(LAST_GAP);
        let at_least = at_least
            .unwrap_or_else(|| (gap / 2).min(MAX_DEFAULT_AT_LEAST))
            .min(gap.mul_f64(0.9));
        let lateness = lateness.unwrap_or_else(|| {
            let lateness = (at_least / 2).max(MIN_DEFAULT_LATENESS);
            if at_least.is_zero() {
                // No hold to stay below.
                lateness
            } else {
                lateness.min(at_least.mul_f64(0.75))
            }
        });
        let ttl = ttl.unwrap_or_else(|| (gap / 2).clamp(MIN_DEFAULT_TTL, MAX_DEFAULT_TTL));
        Plan {
            gap,
            at_least,
            lateness,
            ttl,
        }
    }

    pub(crate) fn new(job: &Job, zone: &TimeZone, fire: SystemTime) -> Plan {
        Self::for_fire_time(
            &job.schedule,
            zone,
            fire,
            job.at_least,
            job.lateness,
            job.ttl,
        )
    }
}

pub(crate) fn instant_of(z: &Zoned) -> SystemTime {
    SystemTime::from(z.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::BoxError;

    fn plan(job: Job) -> Plan {
        let job = job.run(|_ctx| async { Ok::<_, BoxError>(()) });
        Plan::new(
            &job,
            &TimeZone::UTC,
            // A fire time on every period used here (a whole hour).
            SystemTime::UNIX_EPOCH + Duration::from_secs(3600 * 300_000),
        )
    }

    fn every(period: Duration) -> Job {
        Job::every("j", period).unwrap()
    }

    /// The defaults follow the gap: at_least half of it (at most a minute), lateness half
    /// of at_least (at least 500 ms, below at_least), TTL half the gap between 1 s and 30 s.
    #[test]
    fn defaults_follow_the_gap() {
        let p = plan(every(Duration::from_secs(10)));
        assert_eq!(
            (p.at_least, p.lateness, p.ttl),
            (
                Duration::from_secs(5),
                Duration::from_millis(2500),
                Duration::from_secs(5)
            )
        );
        let p = plan(every(Duration::from_secs(3600)));
        assert_eq!(
            (p.at_least, p.lateness, p.ttl),
            (
                Duration::from_secs(60),
                Duration::from_secs(30),
                Duration::from_secs(30)
            )
        );
        // Lateness stays below at_least: three quarters of it when 500 ms is not below.
        let p = plan(every(Duration::from_secs(1)));
        assert_eq!(
            (p.at_least, p.lateness, p.ttl),
            (
                Duration::from_millis(500),
                Duration::from_millis(375),
                Duration::from_secs(1)
            )
        );
    }

    /// A cron gap is measured from the fire time to the next one.
    #[test]
    fn cron_gaps_are_measured_per_fire_time() {
        let p = plan(Job::cron("j", "*/2 * * * * *").unwrap());
        assert_eq!(p.at_least, Duration::from_secs(1));
        assert_eq!(p.lateness, Duration::from_millis(500));
    }

    /// An at_least set by hand is kept, but never past nine tenths of the gap, so it never
    /// blocks the next fire time.
    #[test]
    fn at_least_never_reaches_the_next_fire_time() {
        let minute = Duration::from_secs(60);
        let p = plan(every(minute).at_least(Duration::from_secs(50)));
        assert_eq!(p.at_least, Duration::from_secs(50));
        let p = plan(every(minute).at_least(Duration::from_secs(120)));
        assert_eq!(p.at_least, Duration::from_secs(54));
        let p = plan(
            every(minute)
                .lateness(Duration::from_secs(7))
                .ttl(Duration::from_secs(9)),
        );
        assert_eq!(
            (p.lateness, p.ttl),
            (Duration::from_secs(7), Duration::from_secs(9))
        );
    }
}
