//! Reading the schedule file's fields: where a problem is ([`Place`]), the one-line error
//! ([`FileError`]), and typed reads of a table's fields ([`Fields`]) that name the field
//! they refuse.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use distlock::scheduler::{CatchUp, OnBusy};
use toml::{Table, Value};

use crate::common::parse_duration;

/// `catch_up = "latest"` without a `starting_deadline`: a missed fire time up to a day
/// old is caught up.
pub const DEFAULT_STARTING_DEADLINE: Duration = Duration::from_secs(24 * 3600);
use crate::exit::{CliError, USAGE};

/// How long `on_busy = "wait"` waits at most; the scheduler ends every wait at the fire
/// time's lateness bound anyway.
const WAIT_AS_LONG_AS_ALLOWED: Duration = Duration::from_secs(24 * 3600);

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

/// A TOML syntax error, at its line and column, on one line.
pub(super) fn syntax(text: &str, e: &toml::de::Error) -> FileError {
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

pub(super) fn unknown_fields(
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
pub(super) struct Fields<'a> {
    pub(super) table: &'a Table,
    pub(super) place: &'a dyn Fn(&str) -> Place,
}

impl Fields<'_> {
    pub(super) fn err(&self, field: &str, message: impl Into<String>) -> FileError {
        FileError {
            place: (self.place)(field),
            message: message.into(),
        }
    }

    pub(super) fn text(&self, field: &str) -> Result<Option<String>, FileError> {
        match self.table.get(field) {
            None => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.clone())),
            Some(Value::String(_)) => Err(self.err(field, "is empty")),
            Some(other) => {
                Err(self.err(field, format!("must be a string, not {}", other.type_str())))
            }
        }
    }

    pub(super) fn required_text(&self, field: &str) -> Result<String, FileError> {
        self.text(field)?
            .ok_or_else(|| self.err(field, "missing (every job needs one)"))
    }

    pub(super) fn duration(&self, field: &str) -> Result<Option<Duration>, FileError> {
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

    pub(super) fn positive_duration(&self, field: &str) -> Result<Option<Duration>, FileError> {
        match self.duration(field)? {
            Some(d) if d.is_zero() => Err(self.err(field, "must be greater than zero")),
            d => Ok(d),
        }
    }

    pub(super) fn flag(&self, field: &str) -> Result<Option<bool>, FileError> {
        match self.table.get(field) {
            None => Ok(None),
            Some(Value::Boolean(b)) => Ok(Some(*b)),
            Some(other) => Err(self.err(
                field,
                format!("must be true or false, not {}", other.type_str()),
            )),
        }
    }

    /// A whole number of at least 1 (records kept).
    pub(super) fn count(&self, field: &str) -> Result<Option<usize>, FileError> {
        match self.table.get(field) {
            None => Ok(None),
            Some(Value::Integer(n)) if *n >= 1 => {
                Ok(Some(usize::try_from(*n).unwrap_or(usize::MAX)))
            }
            Some(_) => Err(self.err(
                field,
                "must be a whole number of at least 1 (records kept per job)",
            )),
        }
    }

    /// `catch_up = "none" | "latest"` with its `starting_deadline`.
    pub(super) fn catch_up(&self) -> Result<Option<CatchUp>, FileError> {
        let field = "catch_up";
        let bad = || self.err(field, "must be \"none\" or \"latest\"");
        let deadline = self.positive_duration("starting_deadline")?;
        match self.text(field).map_err(|_| bad())?.as_deref() {
            None if deadline.is_some() => Err(self.err(
                "starting_deadline",
                "applies only with catch_up = \"latest\"",
            )),
            None => Ok(None),
            Some("none") if deadline.is_some() => Err(self.err(
                "starting_deadline",
                "applies only with catch_up = \"latest\"",
            )),
            Some("none") => Ok(Some(CatchUp::None)),
            Some("latest") => Ok(Some(CatchUp::Latest {
                deadline: deadline.unwrap_or(DEFAULT_STARTING_DEADLINE),
            })),
            Some(_) => Err(bad()),
        }
    }

    pub(super) fn on_busy(&self) -> Result<Option<OnBusy>, FileError> {
        let field = "on_busy";
        let bad = || self.err(field, "must be \"skip\" or \"wait\"");
        match self.text(field).map_err(|_| bad())? {
            None => Ok(None),
            Some(s) if s == "skip" => Ok(Some(OnBusy::Skip)),
            Some(s) if s == "wait" => Ok(Some(OnBusy::Wait(WAIT_AS_LONG_AS_ALLOWED))),
            Some(_) => Err(bad()),
        }
    }

    pub(super) fn command(&self) -> Result<Vec<String>, FileError> {
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
