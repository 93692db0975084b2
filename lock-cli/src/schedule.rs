//! Schedules as schedule files and `distlock run --schedule` write them (a cron expression
//! with seconds, or `every DUR`), and the checks the CLI adds to the scheduler's. The
//! defaults for `at_least`, `lateness` and `ttl` are the scheduler's own rule
//! ([`distlock::scheduler::Plan::for_fire_time`]).

use std::time::{Duration, SystemTime};

use distlock::scheduler::jiff::tz::TimeZone;
use distlock::scheduler::{Job, Schedule};

use crate::common::parse_duration;
use crate::units::fmt_duration;

/// A bound on the scheduler's default lateness and TTL (both at most 30 s: half of its
/// longest default at-least hold of 1 min, and its longest default TTL).
const LONGEST_DEFAULT: Duration = Duration::from_secs(30);
/// The shortest lateness accepted: a lock round trip.
pub const MIN_LATENESS: Duration = Duration::from_millis(10);
/// The shortest `every` period accepted: fire times come at most once a second.
pub const MIN_PERIOD: Duration = Duration::from_secs(1);
/// How many fire times from now the timing checks look at (gaps of cron schedules vary).
const FIRE_TIMES_CHECKED: usize = 64;

/// Parses the `DUR` of `every DUR`: a fixed length of at least one second, no months or
/// years (which have no fixed length).
///
/// # Errors
/// What is wrong, in a few words.
pub fn parse_every(period: &str) -> Result<Duration, String> {
    let units = period
        .split(|c: char| !c.is_ascii_alphabetic())
        .filter(|u| !u.is_empty());
    for unit in units {
        if matches!(unit, "M" | "month" | "months" | "y" | "year" | "years") {
            return Err(format!(
                "`every {period}` counts in months or years, which have no fixed length \
                 (`M` is a month of 30.44 days): use a cron expression for calendar dates, \
                 like \"0 0 0 1 */5 *\""
            ));
        }
    }
    let d = parse_duration(period)
        .map_err(|e| format!("\"every {period}\" is not `every DUR` (like `every 30s`): {e}"))?;
    if d < MIN_PERIOD {
        return Err(format!(
            "`every {period}` is shorter than one second: fire times come at most once a \
             second (use `every 1s` or longer)"
        ));
    }
    Ok(d)
}

/// A job of `schedule` (a cron expression, or `every DUR`) named `name`; `Err` says which
/// field is wrong (`"name"` or `"schedule"`) and the scheduler's error or the CLI's reason.
pub fn job(name: &str, schedule: &str) -> Result<Job, ScheduleError> {
    match schedule.trim().strip_prefix("every ") {
        Some(period) => {
            let period = parse_every(period.trim()).map_err(ScheduleError::Every)?;
            Job::every(name, period).map_err(ScheduleError::Library)
        }
        None => Job::cron(name, schedule).map_err(ScheduleError::Library),
    }
}

/// Why a schedule was refused.
#[derive(Debug)]
pub enum ScheduleError {
    /// `every DUR` that is not usable (see [`parse_every`]).
    Every(String),
    /// The scheduler refused the name or the schedule.
    Library(distlock::scheduler::Error),
}

/// The `at_least`, `lateness` and TTL the scheduler uses for one fire time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The gap to the next fire time.
    pub gap: Duration,
    /// The at-least hold, as the scheduler caps it.
    pub at_least: Duration,
    /// The lateness bound.
    pub lateness: Duration,
    /// The lock's TTL.
    pub ttl: Duration,
}

/// A job's own settings, each `None` when the default applies.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timing {
    /// `at_least`.
    pub at_least: Option<Duration>,
    /// `lateness`.
    pub lateness: Option<Duration>,
    /// `ttl`.
    pub ttl: Option<Duration>,
}

impl Timing {
    /// The plan of the fire time `fire` of `schedule` in `zone`, as the scheduler makes it.
    pub fn plan(&self, schedule: &Schedule, zone: &TimeZone, fire: SystemTime) -> Plan {
        let plan = distlock::scheduler::Plan::for_fire_time(
            schedule,
            zone,
            fire,
            self.at_least,
            self.lateness,
            self.ttl,
        );
        Plan {
            gap: plan.gap,
            at_least: plan.at_least,
            lateness: plan.lateness,
            ttl: plan.ttl,
        }
    }

    /// The plans of the next fire times after `now` (a sample: cron gaps vary).
    fn upcoming(&self, schedule: &Schedule, zone: &TimeZone, now: SystemTime) -> Vec<Plan> {
        let mut plans = Vec::new();
        let mut after = now;
        while plans.len() < FIRE_TIMES_CHECKED {
            let Some(next) = schedule.next_after(after, zone) else {
                break;
            };
            let at = SystemTime::from(next.timestamp());
            plans.push(self.plan(schedule, zone, at));
            after = at;
        }
        plans
    }

    /// Checks that the timing can work, as a schedule file needs it: a lateness of at
    /// least [`MIN_LATENESS`], and when `at_least` or `lateness` is set, a lateness below
    /// the at-least hold at every fire time looked at. `Err` names the field at fault
    /// (`"lateness"`, or `"at_least"` when only the lateness is the default) and why.
    ///
    /// # Errors
    /// The first rule broken.
    pub fn check(
        &self,
        schedule: &Schedule,
        zone: &TimeZone,
        now: SystemTime,
    ) -> Result<(), (&'static str, String)> {
        self.check_floor()?;
        // The defaults alone always pass (the scheduler keeps lateness below at_least).
        self.check_pair(schedule, zone, now)
    }

    /// A lateness, when set, of at least [`MIN_LATENESS`].
    ///
    /// # Errors
    /// It is shorter.
    pub fn check_floor(&self) -> Result<(), (&'static str, String)> {
        if let Some(l) = self.lateness {
            if l < MIN_LATENESS {
                return Err((
                    "lateness",
                    format!(
                        "{} is shorter than a lock round trip: use at least {}",
                        fmt_duration(l),
                        fmt_duration(MIN_LATENESS)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The lateness (set or default) below the at-least hold (set or default) at each of
    /// the next fire times.
    ///
    /// # Errors
    /// The first fire time where it is not, naming the field at fault.
    pub fn check_pair(
        &self,
        schedule: &Schedule,
        zone: &TimeZone,
        now: SystemTime,
    ) -> Result<(), (&'static str, String)> {
        let Some(plan) = self
            .upcoming(schedule, zone, now)
            .into_iter()
            .find(|p| p.lateness >= p.at_least)
        else {
            return Ok(());
        };
        let lateness = match self.lateness {
            Some(_) => fmt_duration(plan.lateness),
            None => format!(
                "{} (the default: half of at_least, at least 500ms, at most 3/4 of at_least)",
                fmt_duration(plan.lateness)
            ),
        };
        let at_least = match self.at_least {
            Some(a) if a == plan.at_least => fmt_duration(a),
            Some(_) => format!(
                "{} (9/10 of the {} gap to the next fire time)",
                fmt_duration(plan.at_least),
                fmt_duration(plan.gap)
            ),
            None => format!(
                "{} (the default: half the {} gap, at most 1m)",
                fmt_duration(plan.at_least),
                fmt_duration(plan.gap)
            ),
        };
        let field = if self.lateness.is_some() {
            "lateness"
        } else {
            "at_least"
        };
        Err((
            field,
            format!(
                "lateness {lateness} is not below at_least {at_least}: a fire time won that \
                 late would find the hold over; lower lateness or raise at_least"
            ),
        ))
    }

    /// The shortest TTL among the next fire times, for the grace check.
    pub fn shortest_ttl(&self, schedule: &Schedule, zone: &TimeZone, now: SystemTime) -> Duration {
        self.upcoming(schedule, zone, now)
            .iter()
            .map(|p| p.ttl)
            .min()
            .unwrap_or(LONGEST_DEFAULT)
    }
}

/// The newest fire time of `schedule` in `zone` that is not after `now` and not older than
/// its lateness bound (the plan of `timing`), with its plan; `None` when there is none.
pub fn due(
    schedule: &Schedule,
    zone: &TimeZone,
    timing: &Timing,
    now: SystemTime,
) -> Option<(SystemTime, Plan)> {
    // The lateness of any fire time is at most the explicit one, or the largest default.
    let window = timing.lateness.unwrap_or(LONGEST_DEFAULT);
    let start = now.checked_sub(window + Duration::from_millis(1))?;
    let mut newest = None;
    let mut after = start;
    while let Some(next) = schedule.next_after(after, zone) {
        let at = SystemTime::from(next.timestamp());
        if at > now {
            break;
        }
        newest = Some(at);
        after = at;
    }
    let at = newest?;
    let plan = timing.plan(schedule, zone, at);
    let late = now.duration_since(at).unwrap_or_default();
    (late <= plan.lateness).then_some((at, plan))
}

/// Whether `program` (a command's first word) can be found: a path naming an executable
/// file, or a name found in one of `PATH`'s directories.
pub fn findable(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if program.contains('/') {
        return executable(std::path::Path::new(program));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).any(|dir| executable(&dir.join(program)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn every(s: &str) -> Schedule {
        job("j", s).unwrap().schedule().clone()
    }

    /// A whole hour: a fire time of every period used here.
    fn hour() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(3600 * 300_000)
    }

    #[test]
    fn defaults_follow_the_scheduler_s_rule() {
        let t = Timing::default();
        let p = t.plan(&every("every 10s"), &TimeZone::UTC, hour());
        assert_eq!(
            (p.at_least, p.lateness, p.ttl),
            (
                Duration::from_secs(5),
                Duration::from_millis(2500),
                Duration::from_secs(5)
            )
        );
        let p = t.plan(&every("every 1h"), &TimeZone::UTC, hour());
        assert_eq!(
            (p.at_least, p.lateness, p.ttl),
            (
                Duration::from_secs(60),
                Duration::from_secs(30),
                Duration::from_secs(30)
            )
        );
        // The default lateness stays below at_least.
        let p = t.plan(&every("every 1s"), &TimeZone::UTC, hour());
        assert_eq!(
            (p.at_least, p.lateness),
            (Duration::from_millis(500), Duration::from_millis(375))
        );
    }

    #[test]
    fn every_refuses_months_years_and_sub_second_periods() {
        assert!(parse_every("5M").unwrap_err().contains("months or years"));
        assert!(parse_every("1y").unwrap_err().contains("months or years"));
        assert!(parse_every("2 months")
            .unwrap_err()
            .contains("months or years"));
        assert!(parse_every("500ms").unwrap_err().contains("one second"));
        assert_eq!(parse_every("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_every("1s"), Ok(Duration::from_secs(1)));
    }

    #[test]
    fn the_due_fire_time_is_the_newest_within_its_lateness() {
        let s = every("every 10s");
        let t = Timing::default();
        let at = hour();
        let (f, p) = due(&s, &TimeZone::UTC, &t, at + Duration::from_secs(2)).unwrap();
        assert_eq!(f, at);
        assert_eq!(p.lateness, Duration::from_millis(2500));
        assert_eq!(due(&s, &TimeZone::UTC, &t, at), Some((at, p)));
        assert!(due(&s, &TimeZone::UTC, &t, at + Duration::from_secs(3)).is_none());
        let t = Timing {
            lateness: Some(Duration::from_secs(4)),
            ..Timing::default()
        };
        assert!(due(&s, &TimeZone::UTC, &t, at + Duration::from_secs(3)).is_some());
    }
}
