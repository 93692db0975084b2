//! `distlock cron`: run a schedule file on this replica (every replica runs the same file),
//! and `distlock cron status`: what the lock server remembers of the runs.

pub(crate) mod command;
mod control;
mod fields;
pub mod file;
mod status;

use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand};
use distlock::scheduler::{self, jiff, Scheduler};
use tokio::sync::watch;

use crate::common::Target;
use crate::exit::{CliError, Exit, INTERNAL, UNAVAILABLE, USAGE};
use crate::job::Signals;
use crate::units::fmt_duration;
use crate::verbosity::note;
use command::{rfc3339, Stops, Task, STOP_MARGIN};

pub const AFTER_HELP: &str = "\
Examples:
  # on every replica, the same file and the same lock server:
  distlock cron /etc/distlock/jobs.toml --url redis://10.0.0.5:6379
  distlock cron jobs.toml --url etcd://10.0.0.7:2379 --replica web-3 --metrics-addr 0.0.0.0:9464
  # what ran where, how it ended, and what fires next:
  distlock cron status jobs.toml --url redis://10.0.0.5:6379

A schedule file (TOML): scheduler defaults at the top, then one [[job]] per job; the
first six, history, history_failed, catch_up and starting_deadline may also be set per
job.
  time_zone = \"Europe/Berlin\"   # IANA name, \"UTC\" (the default) or \"local\"
  on_busy = \"skip\"              # lock held by another run: skip (default) | wait
  timeout = \"1h\"                # stop a command that runs longer (default: none)
  at_least = \"5s\"               # hold each fire time's lock this long (default: gap/2, <= 1m)
  lateness = \"2s\"               # a fire time started later is missed (default: at_least/2)
  ttl = \"10s\"                   # lock TTL, renewed every ttl/3 (default: gap/2, 1s..30s)
  grace = \"5s\"                  # stopping a command: SIGTERM, then SIGKILL after this
  shutdown_grace = \"20s\"        # on SIGTERM/Ctrl-C: how long running commands may finish
  history = 100                 # records of successful runs kept per job in the lock server
  history_failed = 100          # records of every other outcome kept (default: history)
  catch_up = \"none\"             # at a start after downtime: none | latest (run the newest
                                # fire time missed, once, on one replica)
  starting_deadline = \"1h\"      # catch_up = latest: how old it may be (default 24h)
  mode = \"each\"                 # each: every replica fires, each fire time's claim picks
                                # the one that runs it | leader: one elected replica fires
                                # every job, the others stand by (see below)
  election = \"distlock-cron/leader\"  # mode = leader: the election (one per schedule file)
  leader_ttl = \"15s\"            # mode = leader: a standby takes over this long after the
                                # leader died (at once when it shuts down)

  [[job]]
  name = \"nightly-report\"       # also the lock's key
  schedule = \"0 30 2 * * *\"     # cron, seconds first: sec min hour day month weekday
  command = [\"/usr/local/bin/report\", \"--full\"]
  timeout = \"2h\"
  leave_children = false        # true: what it leaves running when it exits is not stopped

  [[job]]
  name = \"sync\"
  schedule = \"every 30s\"        # at Unix epoch + k x 30s, the same on every replica
  command = [\"sh\", \"-c\", \"exec /usr/local/bin/sync >> /var/log/sync.log 2>&1\"]

Each fire time runs on one replica: it is first claimed in the lock server (one atomic
step that exactly one replica wins, whatever the replicas' clocks say; the server's clock
decides when it is due), then the winner locks the job's name and holds the lock at least
until the fire time + at_least. A run of the same job still holding the lock makes the
fire time skipped-busy. Outcomes: ok, failed, skipped-busy, timed-out, lock-lost, missed,
cut. The URL must be named (--url or DISTLOCK_URL; --url memory:// runs the jobs in this
process alone), and its backend must keep claims (not redlock://).

mode = \"leader\" keeps every job on one replica (its in-process state, its connections)
and spares the standbys a claim at every fire time; each run still claims its fire time
and locks the job, so a change of leader neither repeats nor overlaps runs. A fire time
due while no replica leads (up to leader_ttl after a leader died) runs if a standby leads
within its lateness, else runs nowhere. Keep the default when any replica may run any
fire time.

The command gets DISTLOCK_JOB, DISTLOCK_SCHEDULED_AT (the fire time, RFC 3339 in UTC),
DISTLOCK_SCHEDULED_LOCAL (the same instant in the job's time zone, with its offset:
2026-12-07T02:30:00+01:00), DISTLOCK_TIME_ZONE (the zone's IANA name), DISTLOCK_FENCE (the
fencing token of this run's lock) and DISTLOCK_REPLICA; DISTLOCK_URL and
DISTLOCK_METRICS_PUSH (they may hold passwords) are removed from its environment. Its
stdin is /dev/null. Each line it writes is relayed (stdout to distlock's stdout, stderr
to its stderr) after the job's name and the fire time:
  [nightly-report 2026-12-07T01:30:00Z] report written
and a failed run's record keeps the end of its output. It runs in its own process group
and dies with distlock: SIGKILL when distlock dies, even of SIGKILL (the command's own
process; what it started in the background is reached by the stop below). When it
exits, whatever it left running in its group (`sleep 25 &`) is stopped before the lock is
released: SIGTERM, SIGKILL after grace; `leave_children = true` on a job keeps them. On a
timeout or a lost lock it is stopped as `distlock run` stops it: SIGTERM to the group,
SIGKILL after grace. As PID 1 (a container's init) distlock also reaps the orphaned
processes reparented to it.

SIGTERM or Ctrl-C: no new fire times; running commands get shutdown_grace to finish, the
rest are stopped and recorded as cut (named on stderr); every lock is released; exit 0.
The whole stop takes at most about shutdown_grace + grace + 1 s: 26 s by default, within
Kubernetes' default 30 s grace and systemd's 90 s (docker stop waits 10 s: give -t 30).
A second signal kills every command at once (SIGKILL); those runs are not recorded.
SIGHUP stops the same way, then exits 129, so that a supervisor restarting on failure
(systemd's Restart=on-failure) starts it again with the file read anew.

Exit status:
  0    shut down by SIGTERM or Ctrl-C
  129  shut down by SIGHUP
  64   bad command line or schedule file (one line naming the job and the field),
       no --url nor DISTLOCK_URL, or a --metrics-addr that is not HOST:PORT
  69   lock server unreachable or refusing, its backend not compiled in or unable to
       keep fire-time claims (redlock), or --metrics-addr cannot be listened on
  70   internal error

--metrics-addr serves the scheduler's metrics in the Prometheus text format, each
labelled distlock_job (the job's name; not job, which Prometheus keeps for its target):
distlock_scheduler_runs_total{distlock_job,outcome},
distlock_scheduler_run_duration_seconds (a histogram, buckets 0.1s to 8h),
distlock_scheduler_last_run_duration_seconds, distlock_scheduler_running,
distlock_scheduler_period_seconds (every DUR: DUR; cron: the gap from the latest fire time
to the next), distlock_scheduler_started_timestamp_seconds,
distlock_scheduler_last_success_timestamp_seconds, distlock_scheduler_skips_total,
distlock_scheduler_claimed_elsewhere_total and distlock_scheduler_record_errors_total;
beside them the lock's own distlock_lock_* series (listed in `distlock run --help`).
Alert when a job has not succeeded for two periods, or never did since its start:
  (time() - max by (distlock_job) (distlock_scheduler_last_success_timestamp_seconds)
     > 2 * max by (distlock_job) (distlock_scheduler_period_seconds))
  or (time() - min by (distlock_job) (distlock_scheduler_started_timestamp_seconds)
     > 2 * max by (distlock_job) (distlock_scheduler_period_seconds)
   unless max by (distlock_job) (distlock_scheduler_last_success_timestamp_seconds))
A file named `status`, `pause`, `resume` or `trigger` is given as ./status and so on.";

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
    /// Pauses JOB on every replica (through the lock server) until `resume`.
    #[command(after_help = control::AFTER_HELP)]
    Pause(control::ControlArgs),
    /// Ends a pause of JOB on every replica.
    #[command(after_help = control::AFTER_HELP)]
    Resume(control::ControlArgs),
    /// Runs JOB once now, on one of the replicas.
    #[command(after_help = control::AFTER_HELP)]
    Trigger(control::ControlArgs),
}

/// `distlock cron FILE` arguments.
#[derive(Args, Debug)]
struct RunArgs {
    /// The schedule file (TOML), the same on every replica.
    #[arg(value_name = "FILE", required = true)]
    file: Option<PathBuf>,

    /// Lock server URL, the same on every replica (the forms are in `distlock --help`);
    /// without it distlock cron refuses to start: --url memory:// runs the jobs in this
    /// process alone.
    #[arg(
        short = 'u',
        long,
        value_name = "URL",
        env = "DISTLOCK_URL",
        hide_env_values = true
    )]
    url: Option<String>,

    /// This replica's name in the run records and in the commands' DISTLOCK_REPLICA
    /// [default: HOSTNAME-PID].
    #[arg(
        long,
        value_name = "ID",
        env = "DISTLOCK_REPLICA",
        hide_env_values = true
    )]
    replica: Option<String>,

    /// Serve the metrics in the Prometheus text format on HOST:PORT.
    #[arg(
        long,
        value_name = "HOST:PORT",
        env = "DISTLOCK_METRICS_ADDR",
        hide_env_values = true
    )]
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
        Some(CronCommand::Pause(a)) => control::run(control::Action::Pause, a).await,
        Some(CronCommand::Resume(a)) => control::run(control::Action::Resume, a).await,
        Some(CronCommand::Trigger(a)) => control::run(control::Action::Trigger, a).await,
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

async fn replica(args: RunArgs) -> Result<Exit, CliError> {
    let path = args.file.expect("clap requires FILE without a subcommand");
    // Everything that can be wrong with the file is found before connecting.
    let file = file::load(&path)?;
    let target = Target::choose(args.url);
    if target.is_default() {
        return Err(CliError::new(
            USAGE,
            "no lock server named (neither --url nor DISTLOCK_URL): every replica would run \
             every job; give every replica the same --url, or --url memory:// to run the jobs \
             in this process alone",
        ));
    }
    for warning in &file.warnings {
        note!("distlock: warning: {}: {warning}", path.display());
    }
    let metrics_addr = args
        .metrics_addr
        .as_deref()
        .map(crate::metrics::resolve)
        .transpose()?;
    let mut signals = Signals::catch()?;
    crate::job::reap_orphans_at_pid_1()?;
    let locker = tokio::select! {
        locker = target.connect() => locker?,
        sig = signals.recv() => return Ok(Exit::Code(exit_code(sig))),
    };
    if let Some(addr) = metrics_addr {
        crate::metrics::install(Some(addr), &[])?;
    }

    let replica_id = args.replica.unwrap_or_else(scheduler::default_replica);
    let mut builder = Scheduler::builder(locker.clone())
        .replica(replica_id.clone())
        .retention(scheduler::Retention::new(file.history, file.history_failed));
    if let Some(ms) = args.clock_offset {
        builder = builder.clock_offset(jiff::SignedDuration::from_millis(ms));
    }
    if let Some(mode) = &file.leader {
        builder = builder.leader(mode.clone());
    }
    let scheduler = builder
        .build()
        .map_err(|e| CliError::new(INTERNAL, format!("cannot build the scheduler: {e}")))?;
    let stops = Stops::default();
    let (hurry_tx, hurry) = watch::channel(false);
    for spec in &file.jobs {
        let task = Task {
            command: Arc::new(spec.command.clone()),
            leave_children: spec.leave_children,
            grace: file.grace,
            shutdown_grace: file.shutdown_grace,
            stops: stops.clone(),
            hurry: hurry.clone(),
        };
        let mut job = spec.job.clone();
        if let Some(timeout) = spec.timeout {
            // The CLI stops the command at `timeout` (see Task::run); the scheduler cancels
            // the run and records it timed-out once the command is surely gone.
            job = job.timeout(timeout + file.grace + STOP_MARGIN);
        }
        let job = job.run(move |ctx| task.clone().run(ctx));
        scheduler
            .add(job)
            .map_err(|e| file::add_error(&path, spec, e, &target))?;
    }
    if !locker.capabilities().cross_process {
        note!(
            "distlock: note: {} locks exclude only inside this distlock process; replicas in \
             other processes would run the same fire times (use --url or DISTLOCK_URL to name \
             a lock server)",
            target.shown()
        );
    }
    if locker.backend().run_records().is_none() {
        note!(
            "distlock: note: the {} backend keeps no run records: `distlock cron status` \
             shows no history; outcomes are in the metrics and on stderr",
            locker.capabilities().name
        );
    }
    let running = scheduler.start().map_err(|e| match e {
        scheduler::Error::ClaimsNotKept { .. } => CliError::new(UNAVAILABLE, e.to_string()),
        scheduler::Error::Lock(e @ distlock::Error::Unsupported { .. }) => {
            CliError::new(UNAVAILABLE, format!("mode = \"leader\": {e}"))
        }
        e => CliError::new(INTERNAL, format!("cannot start the scheduler: {e}")),
    })?;
    note!(
        "distlock: cron: {} job(s) from {} on {} as replica {replica_id:?}",
        file.jobs.len(),
        path.display(),
        target.shown()
    );

    let sig = signals.recv().await;
    note!(
        "distlock: {}: shutting down: no new runs; running commands get {} to finish \
         (a second signal kills them at once){}",
        signal_name(sig),
        fmt_duration(file.shutdown_grace),
        if sig == libc::SIGHUP {
            format!("; then exit {HANGUP} (to be restarted)")
        } else {
            String::new()
        }
    );
    // The scheduler's grace outlasts the CLI's own (shutdown_grace, then SIGTERM and
    // SIGKILL after grace): a command is gone before its run is cut and its lock released.
    let mut shutdown = Box::pin(running.shutdown(file.shutdown_grace + file.grace + STOP_MARGIN));
    tokio::select! {
        report = &mut shutdown => {
            stops.wait().await;
            for run in &report.cut {
                note!(
                    "distlock: cut: {:?} scheduled at {}: still running after {}; stopped \
                     (recorded as cut)",
                    run.job,
                    rfc3339(run.scheduled_at),
                    fmt_duration(file.shutdown_grace)
                );
            }
            for run in &report.finished {
                note!(
                    "distlock: finished during shutdown: {:?} scheduled at {}: {}",
                    run.job,
                    rfc3339(run.scheduled_at),
                    run.outcome
                );
            }
        }
        again = signals.recv() => {
            note!(
                "distlock: {} again: killing the running commands now; their runs are not \
                 recorded",
                signal_name(again)
            );
            let _ = hurry_tx.send(true);
            stops.kill_all();
            // Dropping the shutdown cancels the runs (their commands are reaped by the
            // background stops) and releases their locks in the background, which the
            // Locker's shutdown awaits.
            drop(shutdown);
            tokio::task::yield_now().await;
            stops.wait().await;
        }
    }
    locker.shutdown().await;
    note!("distlock: cron: stopped; every lock released");
    Ok(Exit::Code(exit_code(sig)))
}

/// The exit status after a shutdown by `sig`: 0 for SIGTERM and SIGINT (asked to stop),
/// [`HANGUP`] for SIGHUP, so that a supervisor restarting on failure starts it again (a
/// reload: the file is read anew).
fn exit_code(sig: i32) -> i32 {
    if sig == libc::SIGHUP {
        HANGUP
    } else {
        0
    }
}

/// The exit status after SIGHUP: 128 + SIGHUP, as a shell shows a process killed by it.
pub const HANGUP: i32 = 128 + libc::SIGHUP;

fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "signal",
    }
}
