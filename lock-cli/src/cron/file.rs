//! The schedule file of `distlock cron`: TOML, scheduler defaults at the top, one `[[job]]`
//! table per job. Everything is checked before anything runs; the first problem is one line
//! naming the job and the field.

use std::collections::HashSet;

use std::path::Path;
use std::time::{Duration, SystemTime};

use distlock::scheduler::{CatchUp, Job, OnBusy, Retention};
use toml::{Table, Value};

use super::fields::{syntax, unknown_fields, Fields};
pub use super::fields::{FileError, Place};
use crate::exit::{CliError, USAGE};
use crate::schedule::{ScheduleError, Timing};
use crate::units::fmt_duration;

/// One job of the file, every default applied.
#[derive(Clone, Debug)]
pub struct JobSpec {
    /// The scheduler's job: name, schedule, zone and options, without its task yet.
    pub job: Job,
    /// The schedule as written (a cron expression, or `every DUR`).
    pub schedule: String,
    /// The time zone's name as written (in the job or at the top), if any.
    pub time_zone: Option<String>,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// The hard timeout of one run, if any.
    pub timeout: Option<Duration>,
    /// `leave_children = true`: what the command leaves running in its process group
    /// when it exits is not stopped (by default it is: SIGTERM, SIGKILL after the grace).
    pub leave_children: bool,
}

/// The scheduler's own settings (top of the file), and the jobs.
#[derive(Clone, Debug)]
pub struct CronFile {
    /// SIGTERM to SIGKILL, when a command is stopped (timeout, lost lock, shutdown).
    pub grace: Duration,
    /// On SIGTERM / Ctrl-C: how long running commands get to finish before they are cut.
    pub shutdown_grace: Duration,
    /// Successful runs' records kept per job in the lock server (`history`).
    pub history: usize,
    /// Records of every other outcome kept per job (`history_failed`, default `history`).
    pub history_failed: usize,
    /// `mode = "leader"`: one elected replica fires every job (the election's name and
    /// the leadership's TTL); `None` (`mode = "each"`, the default): every replica fires
    /// and each fire time's claim picks the one that runs it.
    pub leader: Option<distlock::scheduler::LeaderMode>,
    /// The jobs, in file order.
    pub jobs: Vec<JobSpec>,
    /// What may not work as meant but does not keep the file from running (a grace longer
    /// than the TTL, a program not found), to show on stderr.
    pub warnings: Vec<FileError>,
}

/// See [`CronFile::grace`].
pub const DEFAULT_GRACE: Duration = Duration::from_secs(5);
/// See [`CronFile::shutdown_grace`]. With [`DEFAULT_GRACE`] and the second of margin the
/// whole stop takes at most about 26 s: within Kubernetes' default 30 s grace.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(20);
/// The election of `mode = "leader"` when the file names none.
pub const DEFAULT_ELECTION: &str = "distlock-cron/leader";
/// See [`CronFile::history`].
pub const DEFAULT_HISTORY: usize = distlock::scheduler::DEFAULT_KEEP;
const TOP_FIELDS: &[&str] = &[
    "time_zone",
    "timeout",
    "at_least",
    "lateness",
    "on_busy",
    "ttl",
    "grace",
    "shutdown_grace",
    "history",
    "history_failed",
    "catch_up",
    "starting_deadline",
    "mode",
    "election",
    "leader_ttl",
    "job",
];
const JOB_FIELDS: &[&str] = &[
    "name",
    "schedule",
    "time_zone",
    "command",
    "timeout",
    "at_least",
    "lateness",
    "on_busy",
    "ttl",
    "leave_children",
    "history",
    "history_failed",
    "catch_up",
    "starting_deadline",
];

/// Reads and checks the file at `path`.
///
/// # Errors
/// The file cannot be read, or does not parse or check (exit 64, one line).
pub fn load(path: &Path) -> Result<CronFile, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::new(
            USAGE,
            format!("cannot read schedule file {}: {e}", path.display()),
        )
    })?;
    parse(&text).map_err(|e| e.into_cli(path))
}

/// The job options a table (the top, or a job's) sets; a job's own replace the top's.
#[derive(Clone, Debug, Default)]
struct Options {
    time_zone: Option<String>,
    timeout: Option<Duration>,
    at_least: Option<Duration>,
    lateness: Option<Duration>,
    on_busy: Option<OnBusy>,
    ttl: Option<Duration>,
    catch_up: Option<CatchUp>,
}

impl Options {
    fn read(fields: &Fields<'_>) -> Result<Options, FileError> {
        Ok(Options {
            time_zone: fields.text("time_zone")?,
            timeout: fields.positive_duration("timeout")?,
            at_least: fields.duration("at_least")?,
            lateness: fields.duration("lateness")?,
            on_busy: fields.on_busy()?,
            ttl: fields.positive_duration("ttl")?,
            catch_up: fields.catch_up()?,
        })
    }

    fn or(self, defaults: &Options) -> Options {
        Options {
            time_zone: self.time_zone.or_else(|| defaults.time_zone.clone()),
            timeout: self.timeout.or(defaults.timeout),
            at_least: self.at_least.or(defaults.at_least),
            lateness: self.lateness.or(defaults.lateness),
            on_busy: self.on_busy.or(defaults.on_busy),
            ttl: self.ttl.or(defaults.ttl),
            catch_up: self.catch_up.or(defaults.catch_up),
        }
    }
}

/// Parses and checks a schedule file's text: schedules and time zones by the scheduler's
/// own rules ([`Job::cron`], [`Job::every`], [`Job::time_zone`]).
///
/// # Errors
/// The first problem found, in file order.
pub fn parse(text: &str) -> Result<CronFile, FileError> {
    let table: Table = text
        .parse()
        .map_err(|e: toml::de::Error| syntax(text, &e))?;
    let top = |field: &str| Place::Top {
        field: field.to_owned(),
    };
    unknown_fields(&table, TOP_FIELDS, top)?;
    let fields = Fields {
        table: &table,
        place: &top,
    };
    let defaults = Options::read(&fields)?;
    if let Some(zone) = &defaults.time_zone {
        // The scheduler's own check, through a job that stands for every job without a
        // zone of its own.
        let probe = Job::every("time-zone-check", Duration::from_secs(1))
            .expect("a valid name and a positive period");
        let _checked: Job = probe.time_zone(zone).map_err(|e| FileError {
            place: top("time_zone"),
            message: library_message(&e),
        })?;
    }
    let grace = fields.duration("grace")?.unwrap_or(DEFAULT_GRACE);
    let shutdown_grace = fields
        .duration("shutdown_grace")?
        .unwrap_or(DEFAULT_SHUTDOWN_GRACE);
    let history = fields.count("history")?.unwrap_or(DEFAULT_HISTORY);
    let history_failed = fields.count("history_failed")?.unwrap_or(history);

    let leader = match fields.text("mode")?.as_deref() {
        None | Some("each") => {
            for field in ["election", "leader_ttl"] {
                if table.contains_key(field) {
                    return Err(FileError {
                        place: top(field),
                        message: "applies only with mode = \"leader\"".into(),
                    });
                }
            }
            None
        }
        Some("leader") => {
            let election = fields
                .text("election")?
                .unwrap_or_else(|| DEFAULT_ELECTION.to_owned());
            if let Err(e) = distlock::validate_key(&election) {
                return Err(FileError {
                    place: top("election"),
                    message: e.to_string(),
                });
            }
            let ttl = fields
                .positive_duration("leader_ttl")?
                .unwrap_or(distlock::scheduler::DEFAULT_LEADER_TTL);
            Some(distlock::scheduler::LeaderMode::new(election).ttl(ttl))
        }
        Some(other) => {
            return Err(FileError {
                place: top("mode"),
                message: format!("must be \"each\" (the default) or \"leader\", not {other:?}"),
            })
        }
    };

    let jobs_value = match table.get("job") {
        Some(Value::Array(jobs)) if !jobs.is_empty() => jobs,
        Some(Value::Array(_)) | None => {
            return Err(FileError {
                place: Place::File,
                message: "no jobs: add at least one [[job]] table".into(),
            })
        }
        Some(_) => {
            return Err(FileError {
                place: top("job"),
                message: "must be [[job]] tables, one per job".into(),
            })
        }
    };
    let mut jobs = Vec::with_capacity(jobs_value.len());
    let mut warnings = Vec::new();
    let mut names = HashSet::new();
    for (i, value) in jobs_value.iter().enumerate() {
        let number = format!("#{}", i + 1);
        let Value::Table(table) = value else {
            return Err(FileError {
                place: Place::Job {
                    job: number,
                    field: "job".into(),
                },
                message: "must be a [[job]] table".into(),
            });
        };
        // A job is named by its name from the first problem on, when it has a usable one.
        let label = match table.get("name") {
            Some(Value::String(name)) if !name.is_empty() => format!("{name:?}"),
            _ => number,
        };
        let place = |field: &str| Place::Job {
            job: label.clone(),
            field: field.to_owned(),
        };
        let fields = Fields {
            table,
            place: &place,
        };
        let name = fields.required_text("name")?;
        unknown_fields(table, JOB_FIELDS, place)?;
        let schedule = fields.required_text("schedule")?;
        let at = |field: &str| {
            let place = &place;
            let field = field.to_owned();
            move |e: distlock::scheduler::Error| FileError {
                place: place(&field),
                message: library_message(&e),
            }
        };
        let mut job = crate::schedule::job(&name, &schedule).map_err(|e| match e {
            ScheduleError::Every(message) => fields.err("schedule", message),
            ScheduleError::Library(e @ distlock::scheduler::Error::InvalidJobName { .. }) => {
                at("name")(e)
            }
            ScheduleError::Library(e) => at("schedule")(e),
        })?;
        if !names.insert(name.clone()) {
            return Err(fields.err(
                "name",
                "another job has this name; names must be unique (each is a lock)",
            ));
        }
        let own = Options::read(&fields)?;
        let own_zone = own.time_zone.is_some();
        if own_zone && job.schedule().period().is_some() {
            return Err(fields.err(
                "time_zone",
                "an `every` schedule does not depend on the time zone (its fire times are \
                 Unix epoch + k × period): remove time_zone, or use a cron expression",
            ));
        }
        let options = own.or(&defaults);
        if let Some(zone) = &options.time_zone {
            job = job.time_zone(zone).map_err(|e| FileError {
                place: if own_zone {
                    place("time_zone")
                } else {
                    top("time_zone")
                },
                message: library_message(&e),
            })?;
        }
        if let Some(d) = options.timeout {
            job = job.timeout(d);
        }
        if let Some(d) = options.at_least {
            job = job.at_least(d);
        }
        if let Some(d) = options.lateness {
            job = job.lateness(d);
        }
        if let Some(d) = options.ttl {
            job = job.ttl(d);
        }
        job = job.on_busy(options.on_busy.unwrap_or(OnBusy::Skip));
        if let Some(catch_up) = options.catch_up {
            job = job.catch_up(catch_up);
        }
        let (own_history, own_failed) = (fields.count("history")?, fields.count("history_failed")?);
        if own_history.is_some() || own_failed.is_some() {
            let ok = own_history.unwrap_or(history);
            job = job.history(Retention::new(
                ok,
                own_failed.or(own_history).unwrap_or(history_failed),
            ));
        }
        let timing = Timing {
            at_least: options.at_least,
            lateness: options.lateness,
            ttl: options.ttl,
        };
        let zone = job
            .time_zone_value()
            .cloned()
            .unwrap_or(distlock::scheduler::jiff::tz::TimeZone::UTC);
        let now = SystemTime::now();
        timing
            .check(job.schedule(), &zone, now)
            .map_err(|(field, message)| fields.err(field, message))?;
        let command = fields.command()?;
        let leave_children = fields.flag("leave_children")?.unwrap_or(false);
        let ttl = timing.shortest_ttl(job.schedule(), &zone, now);
        if grace > ttl {
            warnings.push(fields.err(
                "grace",
                format!(
                    "the grace {} (SIGTERM to SIGKILL) is longer than the lock's TTL {}{}: a \
                     command stopped because its lock was lost may run that long unprotected; \
                     keep grace below the ttl",
                    fmt_duration(grace),
                    fmt_duration(ttl),
                    if options.ttl.is_some() {
                        ""
                    } else {
                        " (the default: half the gap, 1s to 30s)"
                    }
                ),
            ));
        }
        if !crate::schedule::findable(&command[0]) {
            warnings.push(fields.err(
                "command",
                format!(
                    "`{}` is not found{}: its runs will fail until it is installed",
                    command[0],
                    if command[0].contains('/') {
                        " (or is not an executable file)"
                    } else {
                        " on PATH"
                    }
                ),
            ));
        }
        jobs.push(JobSpec {
            job,
            schedule,
            time_zone: options.time_zone,
            command,
            timeout: options.timeout,
            leave_children,
        });
    }
    Ok(CronFile {
        grace,
        shutdown_grace,
        history,
        history_failed,
        leader,
        jobs,
        warnings,
    })
}

/// The scheduler's error without the job's name (the place names it already).
fn library_message(e: &distlock::scheduler::Error) -> String {
    use distlock::scheduler::Error as E;
    match e {
        E::InvalidCron {
            expression,
            field,
            reason,
            ..
        } => match field {
            Some(f) => format!("invalid cron expression {expression:?}, its {f} field: {reason}"),
            None => format!("invalid cron expression {expression:?}: {reason}"),
        },
        E::UnknownTimeZone { name, .. } => format!(
            "unknown time zone {name:?} (use an IANA name like \"Europe/Berlin\", \"UTC\" \
             or \"local\")"
        ),
        E::InvalidJobName { reason, .. } => format!("not usable as a lock key: {reason}"),
        E::ZeroInterval { .. } => "the interval must be longer than zero".to_owned(),
        other => other.to_string(),
    }
}

/// A job the scheduler refused, as a line naming the job and the field.
pub(super) fn add_error(
    path: &std::path::Path,
    spec: &JobSpec,
    e: distlock::scheduler::Error,
    target: &crate::common::Target,
) -> CliError {
    use distlock::scheduler::Error as E;
    let job = format!("{:?}", spec.job.name());
    let (field, message) = match e {
        E::NeverFires { .. } => ("schedule", "the schedule never fires".to_owned()),
        E::InvalidOption { reason, .. } => {
            let field = if reason.contains("TTL") || reason.contains("ttl") {
                "ttl"
            } else if reason.contains("timeout") {
                "timeout"
            } else {
                ""
            };
            (field, reason)
        }
        E::Lock(err) => return target.error(err),
        other => ("", other.to_string()),
    };
    let place = if field.is_empty() {
        format!("job {job}")
    } else {
        format!("job {job}, field `{field}`")
    };
    CliError::new(USAGE, format!("{}: {place}: {message}", path.display()))
}

#[cfg(test)]
mod tests;
