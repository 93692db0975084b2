//! `distlock run`'s command line: its arguments and the help text after them.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::common::{parse_duration, parse_positive_duration};

pub const AFTER_HELP: &str = "\
Examples:
  # a crontab on every host: each fire time runs on one host; the others exit 0 silently
  DISTLOCK_URL=redis://db1:6379
  */5 * * * * distlock run backup --schedule '0 */5 * * * *' -E 0 -q -n -- /usr/local/bin/backup
  # wait up to a minute for the lock, stop the job if it runs for more than an hour
  distlock run reindex -w 1m --timeout 1h -- ./reindex.sh
  # the job sees the key and the fencing token of its grant
  distlock run deploy -- sh -c 'echo \"$DISTLOCK_KEY holds fence $DISTLOCK_FENCE\"'
  # a long job whose lock Prometheus scrapes while it runs
  distlock run reindex --metrics-addr 0.0.0.0:9464 -- ./reindex.sh
  # a nightly job's metrics for node_exporter's textfile collector
  distlock run backup --metrics-textfile /var/lib/node_exporter/backup.prom -- ./backup.sh

Exit status:
  CMD's status  CMD ran to completion while holding the lock
  128+N         CMD was killed by signal N
  64            bad command line, key, TTL, duration, URL, --metrics-addr,
                --metrics-textfile (its directory must exist) or --metrics-push
  69            lock server unreachable or refusing, or its backend not compiled in,
                or --metrics-addr cannot be listened on, or the metrics of a
                successful run cannot be written (--metrics-textfile) or pushed
  70            internal error
  75            lock not acquired: held elsewhere (--no-wait) or --wait passed, or the
                --schedule fire time claimed by another host (-E N sets these); a
                --schedule fire time missed (past --lateness)
  76            lock lost while CMD ran; CMD was stopped
  124           --timeout passed; CMD was stopped
  126           CMD could not be executed
  127           CMD was not found
  Stopping CMD means SIGTERM to its process group, then SIGKILL after --grace.
  On SIGINT, SIGTERM or SIGHUP distlock forwards the signal to CMD's process group,
  waits for CMD (SIGKILL after --grace, or at once on a second signal), releases the
  lock and dies of the same signal (the shell reports 128+N: 130, 143, 129).

CMD's environment adds DISTLOCK_KEY (the key) and DISTLOCK_FENCE (the fencing token of
this grant, greater than every earlier grant's on backends with monotonic fencing):
pass it to the resource you write to so that it can refuse a stale holder. With
--schedule it adds DISTLOCK_SCHEDULED_AT, the fire time claimed (RFC 3339, UTC),
DISTLOCK_SCHEDULED_LOCAL (the same instant in --time-zone, with its offset) and
DISTLOCK_TIME_ZONE (the zone's IANA name). DISTLOCK_URL and DISTLOCK_METRICS_PUSH are
removed from it: they may hold passwords (pass CMD a URL it needs under another name).

-p N (--permits N) holds one of KEY's N permits instead of the whole key, so at most N
commands run at once across every host (as `consul lock -n N`); --read and --write hold
KEY as a reader (beside other readers) or a writer (alone). Every run on one KEY must
claim it the same way (a plain lock, the same N, or --read/--write): another claim on a
held KEY is refused (exit 64). Backends that keep locks only refuse them (exit 69).

CMD runs in its own process group, so it is not the terminal's foreground job, and
distlock relays Ctrl-C to it. CMD reads distlock's stdin when that is a pipe or a file
(`pg_dump db | distlock run backup -- upload`); when it is a terminal CMD gets /dev/null,
since a read from the terminal would stop CMD (SIGTTIN) while it holds the lock. CMD dies
with distlock: if distlock is killed (even with SIGKILL), CMD gets SIGKILL.

--metrics-addr HOST:PORT serves the lock's metrics in the Prometheus text format while
distlock runs (from before it connects until it exits), labelled backend=NAME, never with
the key: the histograms (buckets 0.5ms to 60s) distlock_lock_acquire_duration_seconds
{outcome} and distlock_lock_wait_duration_seconds{outcome} (outcome granted, refused,
timed_out or error), distlock_lock_hold_duration_seconds (buckets 1ms to 1 day, recorded
when the lock is released or lost), the counters distlock_lock_lost_total,
distlock_lock_renewals_failed_total, distlock_lock_handovers_total and
distlock_lock_errors_total{kind}.

--metrics-textfile PATH writes them at exit to PATH (through a temporary file renamed
over it), with the run's gauges distlock_run_last_exit_code,
distlock_run_last_end_timestamp_seconds, distlock_run_last_duration_seconds (when CMD
ran) and distlock_run_last_success_timestamp_seconds (when CMD last exited 0; kept from
the previous file otherwise: alert on it), every series labelled job=NAME
(--metrics-job, default KEY). --metrics-push URL sends the same to a Pushgateway as the
group job=NAME (plain HTTP; PUT after a success, else POST, which keeps the last success).

Without --url or DISTLOCK_URL the lock is a file lock (flock) in $XDG_RUNTIME_DIR/distlock
(else $TMPDIR/distlock-UID): it excludes the distlock processes of this user on this host,
as flock(1) does, and is free the moment its holder dies, so the TTL does not apply
(distlock says so on stderr). Name a lock server to exclude across hosts. With memory://
the lock excludes only inside this one distlock process: fine for trying the command out,
useless between processes (distlock says so on stderr).";

/// `distlock run` arguments.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The lock's key (name); every process locking the same key on the same server
    /// excludes the others.
    #[arg(value_name = "KEY")]
    pub(crate) key: String,

    /// Lock server URL (the forms are in `distlock --help`) [default: a file lock in
    /// $XDG_RUNTIME_DIR/distlock, for the processes of this host].
    #[arg(
        short = 'u',
        long,
        value_name = "URL",
        env = "DISTLOCK_URL",
        hide_env_values = true
    )]
    pub(crate) url: Option<String>,

    /// Time to live of the lock on the server. distlock renews it every TTL/3 while CMD
    /// runs; if distlock dies, the lock is free again after at most TTL (a file lock has
    /// none: it is free at once).
    #[arg(
        short = 't',
        long,
        value_name = "DUR",
        default_value = "30s",
        env = "DISTLOCK_TTL",
        hide_env_values = true,
        value_parser = parse_duration
    )]
    pub(crate) ttl: Duration,

    /// Wait at most DUR for the lock when it is held (as flock's -w) [default: wait until
    /// it is free].
    #[arg(
        short = 'w',
        long,
        value_name = "DUR",
        env = "DISTLOCK_WAIT",
        hide_env_values = true,
        value_parser = parse_duration
    )]
    pub(crate) wait: Option<Duration>,

    /// Do not wait: exit 75 (see -E) at once when the lock is held (as flock's -n). Wins
    /// over --wait and DISTLOCK_WAIT, as flock's -n wins over its -w.
    #[arg(short = 'n', long)]
    pub(crate) no_wait: bool,

    /// Stop CMD when it runs longer than DUR (exit 124).
    #[arg(
        long,
        value_name = "DUR",
        env = "DISTLOCK_TIMEOUT",
        hide_env_values = true,
        value_parser = parse_positive_duration
    )]
    pub(crate) timeout: Option<Duration>,

    /// How long CMD gets to exit after SIGTERM before SIGKILL. Keep it below the TTL: after
    /// a lost lock CMD runs unprotected for up to this long.
    #[arg(
        long,
        value_name = "DUR",
        default_value = "10s",
        env = "DISTLOCK_GRACE",
        hide_env_values = true,
        value_parser = parse_duration
    )]
    pub(crate) grace: Duration,

    /// Serve the lock's metrics in the Prometheus text format on HOST:PORT while distlock
    /// runs.
    #[arg(
        long,
        value_name = "HOST:PORT",
        env = "DISTLOCK_METRICS_ADDR",
        hide_env_values = true
    )]
    pub(crate) metrics_addr: Option<String>,

    /// At exit, write the metrics (the lock's and the run's distlock_run_*) to PATH in the
    /// Prometheus text format, for node_exporter's textfile collector (PATH ends in
    /// .prom): written beside it, then renamed over it.
    #[arg(
        long,
        value_name = "PATH",
        env = "DISTLOCK_METRICS_TEXTFILE",
        hide_env_values = true
    )]
    pub(crate) metrics_textfile: Option<PathBuf>,

    /// At exit, push the same metrics to the Prometheus Pushgateway at URL
    /// (http://HOST:PORT), as the group job=NAME: PUT after a success, else POST (which
    /// keeps the group's last success).
    #[arg(
        long,
        value_name = "URL",
        env = "DISTLOCK_METRICS_PUSH",
        hide_env_values = true
    )]
    pub(crate) metrics_push: Option<String>,

    /// The job label of the --metrics-textfile and --metrics-push series, which tells this
    /// job's file from the others in node_exporter's directory, and its Pushgateway group
    /// [default: KEY].
    #[arg(
        long,
        value_name = "NAME",
        env = "DISTLOCK_METRICS_JOB",
        hide_env_values = true
    )]
    pub(crate) metrics_job: Option<String>,

    /// Run CMD only for a fire time of this schedule, once across every host: a cron
    /// expression with seconds (`0 */5 * * * *`) or `every DUR`. The newest fire time not
    /// after now (on the lock server's clock where it has one) and within --lateness is
    /// claimed in the lock server; a host that loses the claim does not run CMD (see
    /// --conflict-exit-code). CMD gets DISTLOCK_SCHEDULED_AT (RFC 3339, UTC).
    #[arg(long, value_name = "EXPR")]
    pub(crate) schedule: Option<String>,

    /// The time zone of a cron --schedule: an IANA name, UTC or local [default: UTC].
    #[arg(long, value_name = "TZ", requires = "schedule")]
    pub(crate) time_zone: Option<String>,

    /// With --schedule: a fire time not started within DUR of it is missed (exit 75)
    /// [default: the scheduler's: half of at_least (itself half the gap, at most 1m), at
    /// least 500ms].
    #[arg(
        long,
        value_name = "DUR",
        requires = "schedule",
        value_parser = parse_duration
    )]
    pub(crate) lateness: Option<Duration>,

    /// Keep the lock until DUR after CMD started (with --schedule: after the fire time),
    /// however quickly CMD ended, measured on the monotonic clock.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub(crate) at_least: Option<Duration>,

    /// The exit status when another holder keeps CMD from running: the lock is held
    /// (--no-wait, or --wait passed) or, with --schedule, another host claimed the fire
    /// time. As flock(1)'s -E. 0 makes it a success; with -q nothing is printed then.
    #[arg(short = 'E', long, value_name = "N", default_value_t = 75,
          value_parser = clap::value_parser!(u8))]
    pub(crate) conflict_exit_code: u8,

    /// Hold one of N permits of KEY instead of the whole key: at most N commands run at
    /// once across every host (as `consul lock -n N`). Every run on KEY must give the same
    /// N.
    #[arg(short = 'p', long, value_name = "N", conflicts_with_all = ["read", "write"],
          value_parser = clap::value_parser!(u32).range(1..=i64::from(distlock::MAX_PERMITS)))]
    pub(crate) permits: Option<u32>,

    /// Hold KEY as a reader: readers run side by side, never beside a --write run of the
    /// same KEY.
    #[arg(long, conflicts_with = "write")]
    pub(crate) read: bool,

    /// Hold KEY as a writer: alone, with no --read run of the same KEY beside it.
    #[arg(long)]
    pub(crate) write: bool,

    /// The command to run and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD", num_args = 1..)]
    pub(crate) command: Vec<OsString>,
}

impl RunArgs {
    /// What the run claims of KEY: the whole key (a lock), one of --permits N, or a side of
    /// a reader-writer key.
    pub(crate) fn claim(&self) -> distlock::Result<distlock::Permits> {
        Ok(match (self.permits, self.read, self.write) {
            (Some(n), _, _) => distlock::Permits::new(1, n)?,
            (None, true, _) => distlock::Permits::read(),
            (None, false, true) => distlock::Permits::write(),
            (None, false, false) => distlock::Permits::LOCK,
        })
    }
}
