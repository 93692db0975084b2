//! `distlock cron`: run a schedule file on this replica (every replica runs the same file),
//! and `distlock cron status`: what the lock server remembers of the runs.

mod command;
pub mod file;
mod metrics;
mod status;

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};

use crate::exit::{CliError, Exit};

pub const AFTER_HELP: &str = "\
Examples:
  # on every replica, the same file and the same lock server:
  distlock cron /etc/distlock/jobs.toml --url redis://10.0.0.5:6379
  distlock cron jobs.toml --url etcd://10.0.0.7:2379 --replica web-3 --metrics-addr 0.0.0.0:9464
  # what ran where, how it ended, and what fires next:
  distlock cron status jobs.toml --url redis://10.0.0.5:6379

A schedule file (TOML): scheduler defaults at the top, then one [[job]] per job.
  time_zone = \"Europe/Berlin\"   # default for every job (IANA name; default UTC)
  at_least = \"5s\"               # hold each fire time's lock at least this long (default 1s)
  on_busy = \"skip\"              # lock held by another replica's run: skip | wait
  timeout = \"1h\"                # stop a command that runs longer (default: none)
  ttl = \"30s\"                   # lock time to live, renewed every ttl/3 while a run lasts
  grace = \"10s\"                 # SIGTERM, then SIGKILL after this, when a command is stopped
  shutdown_grace = \"30s\"        # on SIGTERM/Ctrl-C: how long running commands may finish
  history = 100                 # run records kept per job in the lock server

  [[job]]
  name = \"nightly-report\"       # also the lock's key
  schedule = \"0 30 2 * * *\"     # cron with seconds: sec min hour day month weekday
  command = [\"/usr/local/bin/report\", \"--full\"]
  timeout = \"2h\"

  [[job]]
  name = \"sync\"
  schedule = \"every 30s\"
  time_zone = \"UTC\"
  command = [\"sh\", \"-c\", \"exec /usr/local/bin/sync >> /var/log/sync.log 2>&1\"]

Each fire time runs on one replica: the first to lock the job's name runs it, holding the
lock at least until the fire time + at_least, so that a replica whose clock is behind by
less than at_least cannot run the same fire time again. The others record it as
skipped-busy. Outcomes: ok, failed, skipped-busy, timed-out, lock-lost, missed, cut.

The command gets DISTLOCK_JOB, DISTLOCK_SCHEDULED_AT (the fire time, RFC 3339 in UTC),
DISTLOCK_FENCE (the fencing token of this run's lock) and DISTLOCK_REPLICA. It runs in its
own process group; on a timeout or a lost lock it is stopped as `distlock run` stops it:
SIGTERM to the group, SIGKILL after grace.

SIGTERM or Ctrl-C: no new fire times; running commands get shutdown_grace to finish, the
rest are stopped and recorded as cut (named on stderr); every lock is released; exit 0.
A second signal stops every command at once.

Exit status:
  0    shut down by SIGTERM or Ctrl-C
  64   bad command line or schedule file (one line naming the job and the field),
       or a --metrics-addr that is not HOST:PORT
  69   lock server unreachable or refusing, its backend not compiled in,
       or --metrics-addr cannot be listened on
  70   internal error

--metrics-addr serves the scheduler's metrics in the Prometheus text format.
A file named `status` is given as ./status.";

/// `distlock cron` arguments.
#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct CronArgs {
    #[command(subcommand)]
    sub: Option<CronCommand>,

    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum CronCommand {
    /// Per job of FILE: the last runs with their outcomes and replicas, the last success and
    /// the next fire time.
    #[command(after_help = status::AFTER_HELP)]
    Status(status::StatusArgs),
}

/// `distlock cron FILE` arguments.
#[derive(Args, Debug)]
struct RunArgs {
    /// The schedule file (TOML), the same on every replica.
    #[arg(value_name = "FILE", required = true)]
    file: Option<PathBuf>,

    /// Lock server URL [default: $DISTLOCK_URL, else memory://].
    #[arg(long, value_name = "URL")]
    url: Option<String>,

    /// This replica's name in the run records and in DISTLOCK_REPLICA [default:
    /// HOSTNAME:PID].
    #[arg(long, value_name = "ID")]
    replica: Option<String>,

    /// Serve the metrics in the Prometheus text format on HOST:PORT.
    #[arg(long, value_name = "HOST:PORT")]
    metrics_addr: Option<String>,

    /// Test only: run the scheduler on a clock this far ahead (`+1s`) or behind (`-1s`) of
    /// the system clock.
    #[arg(long, value_name = "DUR", hide = true, allow_hyphen_values = true,
          value_parser = parse_offset)]
    clock_offset: Option<i64>,
}

/// Runs `distlock cron`.
///
/// # Errors
/// A bad file, an unreachable server, a metrics address that cannot be served.
pub async fn run(args: CronArgs) -> Result<Exit, CliError> {
    match args.sub {
        Some(CronCommand::Status(status)) => status::run(status).await,
        None => replica(args.run).await,
    }
}

/// Milliseconds of a signed duration (`-1s`, `+250ms`, `2s`).
fn parse_offset(s: &str) -> Result<i64, String> {
    let (sign, rest) = match s.as_bytes().first() {
        Some(b'-') => (-1, &s[1..]),
        Some(b'+') => (1, &s[1..]),
        _ => (1, s),
    };
    let d = crate::common::parse_duration(rest)?;
    i64::try_from(d.as_millis())
        .map(|ms| sign * ms)
        .map_err(|_| "too large".to_owned())
}

/// This host's name and this process's id: distinct for every replica, also on one host.
fn default_replica() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates on success
    // when the name fits, and the last byte is kept 0 either way.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    let host = if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "localhost".to_owned()
    };
    format!("{host}:{}", std::process::id())
}

async fn replica(args: RunArgs) -> Result<Exit, CliError> {
    let _ = (args, Duration::ZERO, default_replica());
    Err(CliError::new(crate::exit::INTERNAL, "not yet"))
}
