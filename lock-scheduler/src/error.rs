//! The one error type of the scheduler.

/// Every error the scheduler returns; each names what to fix.
///
/// Errors about a job carry the job's name. The enum is `#[non_exhaustive]`: match the
/// variants you act on and keep a wildcard arm.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The cron expression does not parse. `field` names the field at fault when one field
    /// alone is (`"second"`, `"minute"`, `"hour"`, `"day of month"`, `"month"`,
    /// `"day of week"`).
    #[error("job {job:?}: invalid cron expression {expression:?}{}: {reason}", field.map(|f| format!(" (field {f})")).unwrap_or_default())]
    InvalidCron {
        /// The job's name.
        job: String,
        /// The expression as given.
        expression: String,
        /// The field at fault, when one can be named.
        field: Option<&'static str>,
        /// What the parser said.
        reason: String,
    },

    /// The time zone name is not in the time zone database (IANA names such as
    /// `Europe/Berlin`, `UTC`, or `local` for the host's zone).
    #[error("{}unknown time zone {name:?}: {reason}", job.as_ref().map(|j| format!("job {j:?}: ")).unwrap_or_default())]
    UnknownTimeZone {
        /// The job's name, or `None` for the scheduler's default zone.
        job: Option<String>,
        /// The name as given.
        name: String,
        /// What the time zone database said.
        reason: String,
    },

    /// The job's name is not a valid lock key (empty, or longer than
    /// [`MAX_KEY_LEN`](lock_core::MAX_KEY_LEN) bytes): the name is the job's lock key.
    #[error("invalid job name {job:?}: {reason}")]
    InvalidJobName {
        /// The name (cut to 64 bytes).
        job: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// An interval schedule of zero length.
    #[error("job {job:?}: the interval must be longer than zero")]
    ZeroInterval {
        /// The job's name.
        job: String,
    },

    /// The schedule has no fire time after now (for example `0 0 0 30 2 *`, February 30th).
    #[error("job {job:?}: the schedule never fires")]
    NeverFires {
        /// The job's name.
        job: String,
    },

    /// An option of the job is out of range (a zero timeout, a TTL the backend refuses).
    #[error("job {job:?}: {reason}")]
    InvalidOption {
        /// The job's name.
        job: String,
        /// What is wrong.
        reason: String,
    },

    /// The job was added without [`Job::run`](crate::Job::run): it has nothing to run.
    #[error("job {job:?} has no task: give it one with Job::run")]
    NoTask {
        /// The job's name.
        job: String,
    },

    /// A job of this name is already registered (names are lock keys: they must be
    /// unique).
    #[error("a job named {job:?} is already registered")]
    DuplicateJob {
        /// The job's name.
        job: String,
    },

    /// No job of this name is registered on this scheduler.
    #[error("no job named {job:?} is registered")]
    UnknownJob {
        /// The name asked for.
        job: String,
    },

    /// [`Scheduler::start`](crate::Scheduler::start) was called on a scheduler already
    /// started.
    #[error("the scheduler is already started")]
    AlreadyStarted,

    /// The lock server keeps no run records (its backend has no
    /// [`RunRecords`](lock_core::records::RunRecords)): history is only in metrics and logs.
    #[error("the {backend} backend keeps no run records; history is in metrics and logs only")]
    RecordsNotKept {
        /// The backend's name.
        backend: &'static str,
    },

    /// The lock server cannot keep fire-time claims (its backend has no
    /// [`FireClaims`](lock_core::claims::FireClaims): Redlock, whose majority writes are
    /// not one atomic step), so the scheduler cannot run each fire time once: it refuses to
    /// start.
    #[error(
        "the {backend} backend cannot keep fire-time claims, so the scheduler cannot run each \
         fire time once; schedule on memory (one process), Redis, etcd or PostgreSQL"
    )]
    ClaimsNotKept {
        /// The backend's name.
        backend: &'static str,
    },

    /// The lock server failed (reading records, or an invalid TTL found before any I/O).
    #[error(transparent)]
    Lock(#[from] lock_core::Error),
}

/// The scheduler's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
