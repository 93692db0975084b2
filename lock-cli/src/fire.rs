//! `distlock run --schedule`: which fire time this invocation stands for, claiming it in
//! the lock server (one host per fire time, whatever the hosts' clocks say), and placing
//! it on this process's monotonic clock by the server's answer.

use std::time::{Duration, Instant, SystemTime};

use distlock::scheduler::jiff::tz::TimeZone;
use distlock::scheduler::Schedule;
use distlock::Locker;

use crate::common::Target;
use crate::cron::command::{local_time, rfc3339};
use crate::exit::{CliError, NOT_ACQUIRED, UNAVAILABLE, USAGE};
use crate::schedule::{self, due, Plan, ScheduleError, Timing};
use crate::units::fmt_duration;

/// A checked `--schedule` with its zone and timing.
pub struct Scheduled {
    /// The expression as given.
    pub expression: String,
    schedule: Schedule,
    zone: TimeZone,
    timing: Timing,
}

/// Where a fire time falls on this process's monotonic clock: `instant` is when the
/// deciding clock (the lock server's where it answers one, else this host's) read `wall`.
#[derive(Clone, Copy, Debug)]
pub struct Placed {
    instant: Instant,
    wall: SystemTime,
}

impl Placed {
    /// The monotonic instant at which the deciding clock reads `t` (now, when that is
    /// longer ago than the monotonic clock counts).
    pub fn instant_of(&self, t: SystemTime) -> Instant {
        match t.duration_since(self.wall) {
            Ok(ahead) => self.instant + ahead,
            Err(behind) => self
                .instant
                .checked_sub(behind.duration())
                .unwrap_or_else(Instant::now),
        }
    }
}

/// The fire time this invocation won.
pub struct Claimed {
    /// The fire time.
    pub fire: SystemTime,
    /// Its at-least hold, lateness and TTL.
    pub plan: Plan,
    /// The fire time on the monotonic clock.
    pub placed: Placed,
    /// The schedule's time zone.
    pub zone: TimeZone,
}

impl Claimed {
    /// The latest instant the command may start: the fire time's lateness bound.
    pub fn latest_start(&self) -> Instant {
        self.placed.instant_of(self.fire + self.plan.lateness)
    }

    /// `DISTLOCK_SCHEDULED_AT`.
    pub fn scheduled_at(&self) -> String {
        rfc3339(self.fire)
    }

    /// `DISTLOCK_SCHEDULED_LOCAL` (the fire time in the schedule's zone, RFC 3339 with its
    /// offset) and `DISTLOCK_TIME_ZONE` (the zone's IANA name, if it has one).
    pub fn scheduled_local(&self) -> (String, Option<String>) {
        match distlock::scheduler::jiff::Timestamp::try_from(self.fire) {
            Ok(t) => local_time(&t.to_zoned(self.zone.clone())),
            Err(_) => (self.scheduled_at(), None),
        }
    }

    /// The monotonic instant `at_least` after the fire time, capped as the scheduler caps
    /// it (9/10 of the gap to the next fire time).
    pub fn hold_until(&self, at_least: Duration) -> Instant {
        let capped = at_least.min(self.plan.gap.mul_f64(0.9));
        self.placed.instant_of(self.fire + capped)
    }

    /// The "too late" error.
    pub fn missed(&self, key: &str, why: &str) -> CliError {
        CliError::new(
            NOT_ACQUIRED,
            format!(
                "fire time {} of {key:?} missed: {why}, past its lateness bound {}; not \
                 running the command",
                self.scheduled_at(),
                fmt_duration(self.plan.lateness)
            ),
        )
    }
}

/// How a claim ended without a fire time won.
pub enum NotClaimed {
    /// Another host claimed it (or a newer one): the conflict case.
    Elsewhere(CliError),
    /// An error (no fire time due, server failure).
    Error(CliError),
}

impl Scheduled {
    /// Checks `--schedule`, `--time-zone`, `--lateness` and `--at-least` for the job `key`.
    ///
    /// # Errors
    /// One line naming the flag at fault (exit 64).
    pub fn new(
        key: &str,
        expression: &str,
        time_zone: Option<&str>,
        lateness: Option<Duration>,
        at_least: Option<Duration>,
    ) -> Result<Scheduled, CliError> {
        let usage =
            |flag: &str, message: String| CliError::new(USAGE, format!("{flag}: {message}"));
        let mut job = schedule::job(key, expression).map_err(|e| match e {
            ScheduleError::Every(m) => usage("--schedule", m),
            ScheduleError::Library(e) => usage("--schedule", e.to_string()),
        })?;
        if let Some(tz) = time_zone {
            if job.schedule().period().is_some() {
                return Err(usage(
                    "--time-zone",
                    "an `every` schedule does not depend on the time zone (its fire times are \
                     Unix epoch + k × period): leave --time-zone out, or use a cron expression"
                        .into(),
                ));
            }
            job = job
                .time_zone(tz)
                .map_err(|e| usage("--time-zone", e.to_string()))?;
        }
        let zone = job.time_zone_value().cloned().unwrap_or(TimeZone::UTC);
        let timing = Timing {
            at_least,
            lateness,
            ttl: None,
        };
        let flag = |field: &str| match field {
            "lateness" => "--lateness",
            _ => "--at-least",
        };
        timing.check_floor().map_err(|(f, m)| usage(flag(f), m))?;
        if at_least.is_some() {
            timing
                .check_pair(job.schedule(), &zone, SystemTime::now())
                .map_err(|(f, m)| usage(flag(f), m))?;
        }
        Ok(Scheduled {
            expression: expression.to_owned(),
            schedule: job.schedule().clone(),
            zone,
            timing,
        })
    }

    /// Claims the newest fire time due (not after now, within its lateness), on the
    /// server's clock where the claim answers one: a host whose clock is behind claims
    /// the fire time the server's clock has reached; one whose clock is ahead finds its
    /// fire time placed in the future and waits for it (see [`Placed`]).
    ///
    /// # Errors
    /// [`NotClaimed`]: claimed elsewhere, no fire time due, or the server failed.
    pub async fn claim(
        &self,
        locker: &Locker,
        target: &Target,
        key: &str,
        replica: &str,
    ) -> Result<Claimed, NotClaimed> {
        if locker.backend().fire_claims().is_none() {
            return Err(NotClaimed::Error(CliError::new(
                UNAVAILABLE,
                format!(
                    "the {} backend cannot keep fire-time claims, so --schedule cannot run each \
                     fire time once; use Redis, etcd or PostgreSQL",
                    locker.capabilities().name
                ),
            )));
        }
        let now = SystemTime::now();
        let Some((mut fire, mut plan)) = due(&self.schedule, &self.zone, &self.timing, now) else {
            return Err(NotClaimed::Error(self.nothing_due(key, now, "this host's")));
        };
        let mut tried_server_time = false;
        loop {
            let sent = Instant::now();
            let asked_at = SystemTime::now();
            let answer = locker
                .claim_fire_time(key, fire, replica)
                .await
                .map_err(|e| NotClaimed::Error(target.error(e)))?;
            let answered = Instant::now();
            let placed = match answer.server_time {
                // The server's time stands for the middle of the round trip.
                Some(server) => Placed {
                    instant: sent + (answered - sent) / 2,
                    wall: server,
                },
                None => Placed {
                    instant: answered,
                    wall: asked_at + (answered - sent),
                },
            };
            // A host whose clock is behind: the server's clock may have reached a newer
            // fire time, which is the one to run (claims only move forward).
            if let (Some(server), false) = (answer.server_time, tried_server_time) {
                tried_server_time = true;
                if let Some((newer, newer_plan)) =
                    due(&self.schedule, &self.zone, &self.timing, server)
                {
                    if newer > fire && answer.claim.fire_time < newer {
                        fire = newer;
                        plan = newer_plan;
                        continue;
                    }
                }
            }
            if !answer.won {
                let claim = &answer.claim;
                return Err(NotClaimed::Elsewhere(CliError::new(
                    NOT_ACQUIRED,
                    format!(
                        "fire time {} of {key:?} is claimed by {:?}{}; not running the command",
                        rfc3339(fire),
                        claim.replica,
                        if claim.fire_time > fire {
                            format!(" (which claimed the newer {})", rfc3339(claim.fire_time))
                        } else {
                            String::new()
                        }
                    ),
                )));
            }
            return Ok(Claimed {
                fire,
                plan,
                placed,
                zone: self.zone.clone(),
            });
        }
    }

    fn nothing_due(&self, key: &str, now: SystemTime, whose: &str) -> CliError {
        CliError::new(
            NOT_ACQUIRED,
            format!(
                "no fire time of {key:?} ({}) is due on {whose} clock ({}): none in the last \
                 lateness bound; not running the command",
                self.expression,
                rfc3339(now)
            ),
        )
    }
}
