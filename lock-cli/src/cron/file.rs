//! The schedule file of `distlock cron`: TOML, scheduler defaults at the top, one `[[job]]`
//! table per job. Everything is checked before anything runs; the first problem is one line
//! naming the job and the field.

use std::collections::HashSet;
use std::fmt;
use std::path::Path;
use std::time::Duration;

use toml::{Table, Value};

use crate::common::parse_duration;
use crate::exit::{CliError, USAGE};

/// What a job does when its lock is held by another replica's run at its fire time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnBusy {
    /// Record the fire time as skipped-busy and wait for the next one.
    Skip,
    /// Wait for the lock (until the next fire time at most), then run.
    Wait,
}

/// One job of the file, every default applied.
#[derive(Clone, Debug)]
pub struct JobSpec {
    /// The job's name: its lock key and the name in its run records.
    pub name: String,
    /// The schedule as written (a cron expression with seconds, or `every DUR`).
    pub schedule: String,
    /// The IANA time zone the schedule is read in.
    pub time_zone: String,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// The hard timeout of one run, if any.
    pub timeout: Option<Duration>,
    /// The lock is held at least until the fire time plus this.
    pub at_least: Duration,
    /// What a fire time does when the lock is held elsewhere.
    pub on_busy: OnBusy,
}

/// The scheduler's own settings (top of the file), and the jobs.
#[derive(Clone, Debug)]
pub struct CronFile {
    /// The lock's time to live (renewed every ttl/3 while a command runs).
    pub ttl: Duration,
    /// SIGTERM to SIGKILL, when a command is stopped (timeout, lost lock, shutdown).
    pub grace: Duration,
    /// On SIGTERM / Ctrl-C: how long running commands get to finish before they are cut.
    pub shutdown_grace: Duration,
    /// Run records kept per job in the lock server.
    pub history: usize,
    /// The jobs, in file order.
    pub jobs: Vec<JobSpec>,
}

/// The file's defaults, when it says nothing.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
/// See [`CronFile::grace`].
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);
/// See [`CronFile::shutdown_grace`].
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(30);
/// See [`CronFile::history`].
pub const DEFAULT_HISTORY: usize = 100;
/// See [`JobSpec::at_least`].
pub const DEFAULT_AT_LEAST: Duration = Duration::from_secs(1);
/// See [`JobSpec::time_zone`].
pub const DEFAULT_TIME_ZONE: &str = "UTC";

/// Where in the file a problem is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Place {
    /// The TOML itself, at this line and column (1-based).
    Syntax { line: usize, column: usize },
    /// A top-level setting.
    Top { field: String },
    /// A job's field; `job` is its name, or `#N` (1-based) when it has none.
    Job { job: String, field: String },
    /// The file as a whole.
    File,
}

/// A problem with the file: where, and what.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileError {
    /// Where.
    pub place: Place,
    /// What, in a few words.
    pub message: String,
}

impl fmt::Display for FileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.place {
            Place::Syntax { line, column } => {
                write!(f, "line {line}, column {column}: {}", self.message)
            }
            Place::Top { field } => write!(f, "field `{field}`: {}", self.message),
            Place::Job { job, field } => write!(f, "job {job}, field `{field}`: {}", self.message),
            Place::File => f.write_str(&self.message),
        }
    }
}

impl FileError {
    /// The CLI error (exit 64): `FILE: job "x", field `schedule`: …`, on one line.
    pub fn into_cli(self, path: &Path) -> CliError {
        CliError::new(USAGE, format!("{}: {self}", path.display()))
    }
}

const TOP_FIELDS: &[&str] = &[
    "time_zone",
    "timeout",
    "at_least",
    "on_busy",
    "ttl",
    "grace",
    "shutdown_grace",
    "history",
    "job",
];
const JOB_FIELDS: &[&str] = &[
    "name",
    "schedule",
    "time_zone",
    "command",
    "timeout",
    "at_least",
    "on_busy",
];

/// Checks a schedule and a time zone the way the scheduler will read them.
pub trait Rules {
    /// `Err(reason)` when `schedule` is not a schedule.
    fn schedule(&self, schedule: &str) -> Result<(), String>;
    /// `Err(reason)` when `zone` is not a known time zone.
    fn time_zone(&self, zone: &str) -> Result<(), String>;
}

/// Reads and checks the file at `path`.
///
/// # Errors
/// The file cannot be read, or does not parse or check (exit 64, one line).
pub fn load(path: &Path, rules: &dyn Rules) -> Result<CronFile, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::new(
            USAGE,
            format!("cannot read schedule file {}: {e}", path.display()),
        )
    })?;
    parse(&text, rules).map_err(|e| e.into_cli(path))
}

/// Parses and checks a schedule file's text.
///
/// # Errors
/// The first problem found, in file order.
pub fn parse(text: &str, rules: &dyn Rules) -> Result<CronFile, FileError> {
    let table: Table = text.parse().map_err(|e: toml::de::Error| syntax(text, &e))?;
    let top = |field: &str| Place::Top {
        field: field.to_owned(),
    };
    unknown_fields(&table, TOP_FIELDS, |f| top(f))?;
    let fields = Fields {
        table: &table,
        place: &|f| top(f),
    };
    let time_zone = fields
        .text("time_zone")?
        .unwrap_or_else(|| DEFAULT_TIME_ZONE.to_owned());
    rules.time_zone(&time_zone).map_err(|m| FileError {
        place: top("time_zone"),
        message: m,
    })?;
    let timeout = fields.positive_duration("timeout")?;
    let at_least = fields.duration("at_least")?.unwrap_or(DEFAULT_AT_LEAST);
    let on_busy = fields.on_busy()?.unwrap_or(OnBusy::Skip);
    let ttl = fields.positive_duration("ttl")?.unwrap_or(DEFAULT_TTL);
    let grace = fields.duration("grace")?.unwrap_or(DEFAULT_GRACE);
    let shutdown_grace = fields
        .duration("shutdown_grace")?
        .unwrap_or(DEFAULT_SHUTDOWN_GRACE);
    let history = match table.get("history") {
        None => DEFAULT_HISTORY,
        Some(Value::Integer(n)) if *n >= 1 => usize::try_from(*n).unwrap_or(usize::MAX),
        Some(_) => {
            return Err(FileError {
                place: top("history"),
                message: "must be a whole number of at least 1 (records kept per job)".into(),
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
    let mut names = HashSet::new();
    for (i, value) in jobs_value.iter().enumerate() {
        let number = format!("#{}", i + 1);
        let Value::Table(job) = value else {
            return Err(FileError {
                place: Place::Job {
                    job: number,
                    field: "job".into(),
                },
                message: "must be a [[job]] table".into(),
            });
        };
        // A job is named by its name from the first problem on, when it has a usable one.
        let label = match job.get("name") {
            Some(Value::String(name)) if !name.is_empty() => format!("{name:?}"),
            _ => number,
        };
        let place = |field: &str| Place::Job {
            job: label.clone(),
            field: field.to_owned(),
        };
        let fields = Fields {
            table: job,
            place: &place,
        };
        let name = fields.required_text("name")?;
        distlock::validate_key(&name).map_err(|e| FileError {
            place: place("name"),
            message: match e {
                distlock::Error::InvalidKey { reason, .. } => {
                    format!("not usable as a lock key: {reason}")
                }
                other => other.to_string(),
            },
        })?;
        if !names.insert(name.clone()) {
            return Err(FileError {
                place: place("name"),
                message: "another job has this name; names must be unique (each is a lock)"
                    .into(),
            });
        }
        unknown_fields(job, JOB_FIELDS, &place)?;
        let job_zone = fields.text("time_zone")?;
        if let Some(zone) = &job_zone {
            rules.time_zone(zone).map_err(|m| FileError {
                place: place("time_zone"),
                message: m,
            })?;
        }
        let schedule = fields.required_text("schedule")?;
        rules.schedule(&schedule).map_err(|m| FileError {
            place: place("schedule"),
            message: m,
        })?;
        let command = fields.command()?;
        jobs.push(JobSpec {
            name,
            schedule,
            time_zone: job_zone.unwrap_or_else(|| time_zone.clone()),
            command,
            timeout: fields.positive_duration("timeout")?.or(timeout),
            at_least: fields.duration("at_least")?.unwrap_or(at_least),
            on_busy: fields.on_busy()?.unwrap_or(on_busy),
        });
    }
    Ok(CronFile {
        ttl,
        grace,
        shutdown_grace,
        history,
        jobs,
    })
}

/// A TOML syntax error, at its line and column, on one line.
fn syntax(text: &str, e: &toml::de::Error) -> FileError {
    let (line, column) = match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            (line, column)
        }
        None => (1, 1),
    };
    let message = e.message().lines().next().unwrap_or("invalid TOML").trim();
    FileError {
        place: Place::Syntax { line, column },
        message: format!("not valid TOML: {message}"),
    }
}

fn unknown_fields(
    table: &Table,
    known: &[&str],
    place: impl Fn(&str) -> Place,
) -> Result<(), FileError> {
    match table.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => Err(FileError {
            place: place(k),
            message: format!("unknown field; known fields are {}", known.join(", ")),
        }),
    }
}

/// Typed reads of one table's fields.
struct Fields<'a> {
    table: &'a Table,
    place: &'a dyn Fn(&str) -> Place,
}

impl Fields<'_> {
    fn err(&self, field: &str, message: impl Into<String>) -> FileError {
        FileError {
            place: (self.place)(field),
            message: message.into(),
        }
    }

    fn text(&self, field: &str) -> Result<Option<String>, FileError> {
        match self.table.get(field) {
            None => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
            Some(Value::String(_)) => Err(self.err(field, "is empty")),
            Some(other) => Err(self.err(
                field,
                format!("must be a string, not {}", other.type_str()),
            )),
        }
    }

    fn required_text(&self, field: &str) -> Result<String, FileError> {
        self.text(field)?
            .ok_or_else(|| self.err(field, "missing (every job needs one)"))
    }

    fn duration(&self, field: &str) -> Result<Option<Duration>, FileError> {
        match self.text(field) {
            Ok(None) => Ok(None),
            Ok(Some(s)) => parse_duration(&s)
                .map(Some)
                .map_err(|e| self.err(field, format!("{s:?} is not a duration: {e}"))),
            Err(_) => Err(self.err(
                field,
                "must be a duration in quotes, like \"500ms\", \"30s\" or \"5m\"",
            )),
        }
    }

    fn positive_duration(&self, field: &str) -> Result<Option<Duration>, FileError> {
        match self.duration(field)? {
            Some(d) if d.is_zero() => Err(self.err(field, "must be greater than zero")),
            d => Ok(d),
        }
    }

    fn on_busy(&self) -> Result<Option<OnBusy>, FileError> {
        let field = "on_busy";
        let bad = || self.err(field, "must be \"skip\" or \"wait\"");
        match self.text(field).map_err(|_| bad())? {
            None => Ok(None),
            Some(s) if s == "skip" => Ok(Some(OnBusy::Skip)),
            Some(s) if s == "wait" => Ok(Some(OnBusy::Wait)),
            Some(_) => Err(bad()),
        }
    }

    fn command(&self) -> Result<Vec<String>, FileError> {
        let field = "command";
        let bad = || {
            self.err(
                field,
                "must be a list of strings, the program then its arguments, like \
                 [\"/usr/local/bin/backup\", \"--full\"]",
            )
        };
        match self.table.get(field) {
            None => Err(self.err(field, "missing (every job needs one)")),
            Some(Value::Array(items)) => {
                let args = items
                    .iter()
                    .map(|v| v.as_str().map(str::to_owned).ok_or_else(bad))
                    .collect::<Result<Vec<_>, _>>()?;
                match args.first() {
                    None => Err(self.err(field, "is empty: name the program to run")),
                    Some(p) if p.is_empty() => Err(self.err(field, "the program name is empty")),
                    Some(_) => Ok(args),
                }
            }
            Some(_) => Err(bad()),
        }
    }
}
