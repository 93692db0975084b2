//! When a job fires: [`Schedule`] (a cron expression or a fixed interval), time zones, and
//! the daylight-saving rules.

use std::time::{Duration, SystemTime};

use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

use crate::error::{Error, Result};

/// The fields of a cron expression with seconds, in order.
const FIELDS_WITH_SECONDS: [&str; 6] = [
    "second",
    "minute",
    "hour",
    "day of month",
    "month",
    "day of week",
];

/// When a job fires.
///
/// - **Cron** ([`Job::cron`](crate::Job::cron)): five fields (`minute hour day-of-month
///   month day-of-week`) or six with seconds first, as [`croner`] reads them (ranges,
///   lists, steps, names such as `MON` and `JAN`, `L`, `W`, `#`, nicknames such as
///   `@daily`). Evaluated on the wall clock of the job's time zone.
/// - **Interval** ([`Job::every`](crate::Job::every)): every `period`, at the instants
///   `Unix epoch + k × period`. The fire times do not depend on when a replica started, so
///   every replica computes the same ones (that is what lets the lock decide who runs
///   each); they do not depend on the time zone either. Use cron for wall-clock times.
///
/// # Daylight-saving time
///
/// For a cron expression whose second, minute and hour fields are each one value (a fixed
/// time of day, such as `0 30 2 * * *`):
/// - a local time that does not exist (the clock springs forward over it) fires **once,
///   at the first instant after the gap**: 02:30 on the day Berlin springs from 02:00 to
///   03:00 fires at 03:00 CEST;
/// - a local time that happens twice (the clock falls back over it) fires **once, at its
///   first occurrence**: 02:30 on the day Berlin falls back from 03:00 to 02:00 fires at
///   02:30 CEST, not again at 02:30 CET.
///
/// An expression with a wildcard, a step, a range or a list in those fields (`*/15`,
/// `0 0-30/10 * * * *`) follows real time instead: it fires at every instant whose local
/// time matches, so a repeated hour fires twice and a skipped hour not at all, and the
/// cadence in real time is kept.
#[derive(Clone, Debug)]
pub struct Schedule {
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    Cron { cron: Box<Cron>, expression: String },
    Every(Duration),
}

impl Schedule {
    /// Parses a cron expression for the job `job` (named in errors).
    pub(crate) fn cron(job: &str, expression: &str) -> Result<Schedule> {
        let cron = parse_cron(expression).map_err(|reason| Error::InvalidCron {
            job: job.to_owned(),
            expression: expression.to_owned(),
            field: field_at_fault(expression),
            reason,
        })?;
        Ok(Schedule {
            kind: Kind::Cron {
                cron: Box::new(cron),
                expression: expression.to_owned(),
            },
        })
    }

    /// A fixed interval for the job `job` (named in errors).
    pub(crate) fn every(job: &str, period: Duration) -> Result<Schedule> {
        if period.is_zero() {
            return Err(Error::ZeroInterval {
                job: job.to_owned(),
            });
        }
        Ok(Schedule {
            kind: Kind::Every(period),
        })
    }

    /// The cron expression, for a cron schedule.
    pub fn expression(&self) -> Option<&str> {
        match &self.kind {
            Kind::Cron { expression, .. } => Some(expression),
            Kind::Every(_) => None,
        }
    }

    /// The period, for an interval schedule.
    pub fn period(&self) -> Option<Duration> {
        match self.kind {
            Kind::Cron { .. } => None,
            Kind::Every(period) => Some(period),
        }
    }

    /// The first fire time strictly after `after`, on the wall clock of `zone` (interval
    /// schedules ignore the zone), as a zoned time; `None` when there is none (a cron
    /// expression that never matches again, or past the year 9999).
    ///
    /// The daylight-saving rules are those of [`Schedule`].
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::SystemTime;
    /// use lock_scheduler::jiff::{tz::TimeZone, Timestamp};
    /// use lock_scheduler::Job;
    ///
    /// let job = Job::cron("report", "0 30 2 * * *")?;
    /// let berlin = TimeZone::get("Europe/Berlin")?;
    /// // The night Berlin springs forward from 02:00 to 03:00: 02:30 does not exist.
    /// let before: Timestamp = "2026-03-29T00:00:00Z".parse()?;
    /// let next = job.schedule().next_after(SystemTime::from(before), &berlin).unwrap();
    /// assert_eq!(next.to_string(), "2026-03-29T03:00:00+02:00[Europe/Berlin]");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn next_after(&self, after: SystemTime, zone: &TimeZone) -> Option<Zoned> {
        let after = Timestamp::try_from(after).ok()?;
        match &self.kind {
            Kind::Cron { cron, .. } => cron
                .find_next_occurrence(&after.to_zoned(zone.clone()), false)
                .ok(),
            Kind::Every(period) => {
                let p = i128::try_from(period.as_nanos()).ok()?;
                let t = after.as_nanosecond();
                let k = t.div_euclid(p) + 1;
                let next = Timestamp::from_nanosecond(k.checked_mul(p)?).ok()?;
                Some(next.to_zoned(zone.clone()))
            }
        }
    }
}

impl Schedule {
    /// The length of the interval between fire times that `at` falls in, in `zone`: from
    /// the latest fire time at or before `at` to the first one after it (the gap after the
    /// first fire time when none came before; an interval schedule's period whatever `at`
    /// is); `None` when there is no fire time after `at`. The period gauge's value.
    pub(crate) fn period_at(&self, at: SystemTime, zone: &TimeZone) -> Option<Duration> {
        let next = self.next_after(at, zone)?;
        let gap = |from: &Zoned, to: &Zoned| instant(to).duration_since(instant(from)).ok();
        match &self.kind {
            Kind::Every(period) => Some(*period),
            Kind::Cron { cron, .. } => {
                let at = Timestamp::try_from(at).ok()?.to_zoned(zone.clone());
                match cron.find_previous_occurrence(&at, true) {
                    Ok(previous) => gap(&previous, &next),
                    Err(_) => gap(&next, &self.next_after(instant(&next), zone)?),
                }
            }
        }
    }
}

fn instant(z: &Zoned) -> SystemTime {
    SystemTime::from(z.timestamp())
}

impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Cron { expression, .. } => write!(f, "cron {expression:?}"),
            Kind::Every(period) => write!(f, "every {period:?}"),
        }
    }
}

fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
}

fn parse_cron(expression: &str) -> std::result::Result<Cron, String> {
    let fields = expression.split_whitespace().count();
    let nickname = expression.trim_start().starts_with('@');
    if !nickname && !(5..=6).contains(&fields) {
        return Err(format!(
            "expected 5 fields (minute hour day-of-month month day-of-week) or 6 (a \
             second first), found {fields}"
        ));
    }
    parser().parse(expression).map_err(|e| e.to_string())
}

/// The one field whose replacement by `*` makes the expression parse, if there is one.
fn field_at_fault(expression: &str) -> Option<&'static str> {
    let parts: Vec<&str> = expression.split_whitespace().collect();
    let names: &[&'static str] = match parts.len() {
        6 => &FIELDS_WITH_SECONDS,
        5 => &FIELDS_WITH_SECONDS[1..],
        _ => return None,
    };
    let mut at_fault = None;
    for (i, name) in names.iter().enumerate() {
        let mut fixed = parts.clone();
        fixed[i] = "*";
        if parser().parse(&fixed.join(" ")).is_ok() {
            if at_fault.is_some() {
                return None;
            }
            at_fault = Some(*name);
        }
    }
    at_fault
}

/// The time zone named `name`: an IANA name from the time zone database (the system's,
/// or the copy built into this crate when the host has none), `UTC`, or `local` for the
/// host's own zone.
pub(crate) fn zone_named(job: Option<&str>, name: &str) -> Result<TimeZone> {
    let found = if name == "local" {
        TimeZone::try_system()
    } else {
        TimeZone::get(name)
    };
    found.map_err(|e| Error::UnknownTimeZone {
        job: job.map(str::to_owned),
        name: name.to_owned(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(rfc3339: &str) -> SystemTime {
        SystemTime::from(rfc3339.parse::<Timestamp>().unwrap())
    }

    fn cron(expression: &str) -> Schedule {
        Schedule::cron("j", expression).unwrap()
    }

    /// The period is the interval's, for an interval schedule; for cron, the gap from the
    /// latest fire time (at or before the instant) to the next, so a weekday job reads
    /// three days over the weekend and one during the week.
    #[test]
    fn the_period_is_the_current_gap_between_fire_times() {
        let utc = TimeZone::UTC;
        let every = Schedule::every("j", Duration::from_secs(30)).unwrap();
        let now = at("2026-12-07T10:00:07Z");
        assert_eq!(every.period_at(now, &utc), Some(Duration::from_secs(30)));
        assert_eq!(
            cron("0 * * * * *").period_at(now, &utc),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            cron("*/2 * * * * *").period_at(now, &utc),
            Some(Duration::from_secs(2))
        );
        let day = Duration::from_secs(24 * 3600);
        let weekdays = cron("0 0 9 * * MON-FRI");
        // 2026-12-05 is a Saturday: from Friday 09:00 to Monday 09:00.
        assert_eq!(
            weekdays.period_at(at("2026-12-05T12:00:00Z"), &utc),
            Some(3 * day)
        );
        // At a fire time: from it to the next (Friday's to Monday's).
        assert_eq!(
            weekdays.period_at(at("2026-12-04T09:00:00Z"), &utc),
            Some(3 * day)
        );
        assert_eq!(
            weekdays.period_at(at("2026-12-08T10:00:00Z"), &utc),
            Some(day)
        );
    }
}
