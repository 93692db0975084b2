//! `distlock run`: run a command only while holding a lock.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Args;
use distlock::{Error, Event, LockGuard, LockOptions, Locker};

use crate::common::{parse_duration, parse_positive_duration, Target};
use crate::exit::{
    not_acquired_after, transient_message, CliError, Exit, LOCK_LOST, NOT_ACQUIRED, TIMED_OUT,
    USAGE,
};
use crate::fire::{Claimed, NotClaimed, Scheduled};
use crate::job::{status_code, Job, Signals};
use crate::push::Pushgateway;
use crate::units::fmt_duration;
use crate::verbosity::note;

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
--schedule it adds DISTLOCK_SCHEDULED_AT, the fire time claimed (RFC 3339, UTC).

CMD runs in its own process group, so it is not the terminal's foreground job: it cannot
read from the terminal, and distlock relays Ctrl-C to it.

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

With memory:// the lock excludes only inside this one distlock process: fine for trying
the command out, useless between processes (distlock says so on stderr).";

/// `distlock run` arguments.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// The lock's key (name); every process locking the same key on the same server
    /// excludes the others.
    #[arg(value_name = "KEY")]
    key: String,

    /// Lock server URL (the forms are in `distlock --help`) [default: memory://].
    #[arg(
        short = 'u',
        long,
        value_name = "URL",
        env = "DISTLOCK_URL",
        hide_env_values = true
    )]
    url: Option<String>,

    /// Time to live of the lock on the server. distlock renews it every TTL/3 while CMD
    /// runs; if distlock dies, the lock is free again after at most TTL.
    #[arg(
        short = 't',
        long,
        value_name = "DUR",
        default_value = "30s",
        env = "DISTLOCK_TTL",
        hide_env_values = true,
        value_parser = parse_duration
    )]
    ttl: Duration,

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
    wait: Option<Duration>,

    /// Do not wait: exit 75 (see -E) at once when the lock is held (as flock's -n). Wins
    /// over --wait and DISTLOCK_WAIT, as flock's -n wins over its -w.
    #[arg(short = 'n', long)]
    no_wait: bool,

    /// Stop CMD when it runs longer than DUR (exit 124).
    #[arg(
        long,
        value_name = "DUR",
        env = "DISTLOCK_TIMEOUT",
        hide_env_values = true,
        value_parser = parse_positive_duration
    )]
    timeout: Option<Duration>,

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
    grace: Duration,

    /// Serve the lock's metrics in the Prometheus text format on HOST:PORT while distlock
    /// runs.
    #[arg(
        long,
        value_name = "HOST:PORT",
        env = "DISTLOCK_METRICS_ADDR",
        hide_env_values = true
    )]
    metrics_addr: Option<String>,

    /// At exit, write the metrics (the lock's and the run's distlock_run_*) to PATH in the
    /// Prometheus text format, for node_exporter's textfile collector (PATH ends in
    /// .prom): written beside it, then renamed over it.
    #[arg(
        long,
        value_name = "PATH",
        env = "DISTLOCK_METRICS_TEXTFILE",
        hide_env_values = true
    )]
    metrics_textfile: Option<PathBuf>,

    /// At exit, push the same metrics to the Prometheus Pushgateway at URL
    /// (http://HOST:PORT), as the group job=NAME: PUT after a success, else POST (which
    /// keeps the group's last success).
    #[arg(
        long,
        value_name = "URL",
        env = "DISTLOCK_METRICS_PUSH",
        hide_env_values = true
    )]
    metrics_push: Option<String>,

    /// The job label of the --metrics-textfile and --metrics-push series, which tells this
    /// job's file from the others in node_exporter's directory, and its Pushgateway group
    /// [default: KEY].
    #[arg(
        long,
        value_name = "NAME",
        env = "DISTLOCK_METRICS_JOB",
        hide_env_values = true
    )]
    metrics_job: Option<String>,

    /// Run CMD only for a fire time of this schedule, once across every host: a cron
    /// expression with seconds (`0 */5 * * * *`) or `every DUR`. The newest fire time not
    /// after now (on the lock server's clock where it has one) and within --lateness is
    /// claimed in the lock server; a host that loses the claim does not run CMD (see
    /// --conflict-exit-code). CMD gets DISTLOCK_SCHEDULED_AT (RFC 3339, UTC).
    #[arg(long, value_name = "EXPR")]
    schedule: Option<String>,

    /// The time zone of a cron --schedule: an IANA name, UTC or local [default: UTC].
    #[arg(long, value_name = "TZ", requires = "schedule")]
    time_zone: Option<String>,

    /// With --schedule: a fire time not started within DUR of it is missed (exit 75)
    /// [default: the scheduler's: half of at_least (itself half the gap, at most 1m), at
    /// least 500ms].
    #[arg(
        long,
        value_name = "DUR",
        requires = "schedule",
        value_parser = parse_duration
    )]
    lateness: Option<Duration>,

    /// Keep the lock until DUR after CMD started (with --schedule: after the fire time),
    /// however quickly CMD ended, measured on the monotonic clock.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    at_least: Option<Duration>,

    /// The exit status when another holder keeps CMD from running: the lock is held
    /// (--no-wait, or --wait passed) or, with --schedule, another host claimed the fire
    /// time. As flock(1)'s -E. 0 makes it a success; with -q nothing is printed then.
    #[arg(short = 'E', long, value_name = "N", default_value_t = 75,
          value_parser = clap::value_parser!(u8))]
    conflict_exit_code: u8,

    /// The command to run and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD", num_args = 1..)]
    command: Vec<OsString>,
}

/// How long to wait for a held lock.
#[derive(Clone, Copy, Debug)]
enum WaitFor {
    Not,
    AtMost(Duration),
    Forever,
}

/// Why distlock stopped the command.
enum Stop {
    Lost,
    TimedOut(Duration),
    Signal(i32),
}

/// Runs `distlock run`; with `--metrics-textfile`, writes the metrics at the end, whatever
/// the end.
///
/// # Errors
/// Bad input, an unreachable server, a lock not won, or a command that cannot start.
pub async fn run(args: RunArgs) -> Result<Exit, CliError> {
    let metrics_addr = args
        .metrics_addr
        .as_deref()
        .map(crate::metrics::resolve)
        .transpose()?;
    let textfile = args
        .metrics_textfile
        .as_deref()
        .map(crate::metrics::check_textfile)
        .transpose()?;
    let push = args
        .metrics_push
        .as_deref()
        .map(Pushgateway::parse)
        .transpose()?;
    let job = args.metrics_job.as_deref().unwrap_or(&args.key);
    if args.metrics_job.as_deref() == Some("") {
        return Err(CliError::new(
            USAGE,
            "invalid --metrics-job \"\": it is empty",
        ));
    }
    let batch = textfile.is_some() || push.is_some();
    let job_label = [("job", job)];
    let labels: &[(&str, &str)] = if batch { &job_label } else { &[] };
    let recorder = if metrics_addr.is_some() || batch {
        Some(crate::metrics::install(metrics_addr, labels)?)
    } else {
        None
    };
    let mut ran = None;
    let exit = run_locked(&args, &mut ran).await;
    let Some(recorder) = recorder.filter(|_| batch) else {
        return exit;
    };
    let code = match &exit {
        Ok(Exit::Code(code)) => *code,
        Ok(Exit::Signal(sig)) => 128 + sig,
        Err(e) => e.code,
    };
    let succeeded = ran.is_some() && code == 0;
    crate::metrics::record_run(code, ran, succeeded, textfile);
    let mut failures = Vec::new();
    if let Some(path) = textfile {
        failures.extend(crate::metrics::write_textfile(&recorder, path).err());
    }
    if let Some(push) = &push {
        let exposition = crate::metrics::render(&recorder);
        failures.extend(push.push(job, exposition, succeeded).await.err());
    }
    // The job's own failure is the one to report; a success whose metrics are lost is a
    // failure of its own, which monitoring would otherwise miss.
    let last = failures.pop();
    for e in &failures {
        eprintln!("{e}");
    }
    match last {
        None => exit,
        Some(e) if code == 0 => Err(e),
        Some(e) => {
            eprintln!("{e}");
            exit
        }
    }
}

/// `distlock run` up to its exit; `ran` is set to how long CMD ran, if it ran.
async fn run_locked(args: &RunArgs, ran: &mut Option<Duration>) -> Result<Exit, CliError> {
    let target = Target::choose(args.url.clone());
    distlock::validate_key(&args.key).map_err(|e| target.error(e))?;
    let scheduled = args
        .schedule
        .as_deref()
        .map(|expr| {
            Scheduled::new(
                &args.key,
                expr,
                args.time_zone.as_deref(),
                args.lateness,
                args.at_least,
            )
        })
        .transpose()?;
    // Caught from the start: a Ctrl-C while connecting or waiting must still let an
    // acquisition in flight be cleaned up.
    let mut signals = Signals::catch()?;

    let locker = tokio::select! {
        locker = target.connect() => locker?,
        sig = signals.recv() => return Ok(Exit::Signal(sig)),
    };
    let caps = locker.capabilities();
    caps.effective_ttl(args.ttl).map_err(|e| target.error(e))?;
    if !caps.cross_process {
        note!(
            "distlock: note: {} locks exclude only inside this distlock process; other \
             processes are not kept out (use --url or DISTLOCK_URL to name a lock server)",
            target.shown()
        );
    }
    let conflict = |e: CliError| -> Result<Exit, CliError> {
        if crate::verbosity::quiet() {
            Ok(Exit::Code(i32::from(args.conflict_exit_code)))
        } else {
            Err(CliError {
                code: i32::from(args.conflict_exit_code),
                ..e
            })
        }
    };

    let claimed = match &scheduled {
        None => None,
        Some(scheduled) => {
            let replica = distlock::scheduler::default_replica();
            let claim = tokio::select! {
                claim = scheduled.claim(&locker, &target, &args.key, &replica) => claim,
                sig = signals.recv() => return Ok(Exit::Signal(sig)),
            };
            match claim {
                Ok(claimed) => Some(claimed),
                Err(NotClaimed::Elsewhere(e)) => return conflict(e),
                Err(NotClaimed::Error(e)) => return Err(e),
            }
        }
    };
    if let Some(claimed) = &claimed {
        // A host whose clock is ahead claimed early: the server's clock reaches the fire
        // time later.
        let start = claimed.placed.instant_of(claimed.fire);
        tokio::select! {
            () = tokio::time::sleep_until(start.into()) => {}
            sig = signals.recv() => return Ok(Exit::Signal(sig)),
        }
        if Instant::now() > claimed.latest_start() {
            return Err(claimed.missed(&args.key, "the claim was answered too late"));
        }
    }

    let mut wait = match (args.no_wait, args.wait) {
        (true, _) => WaitFor::Not,
        (false, Some(d)) => WaitFor::AtMost(d),
        (false, None) => WaitFor::Forever,
    };
    if let Some(claimed) = &claimed {
        // A fire time waits for an earlier run at most until its lateness bound.
        let left = claimed
            .latest_start()
            .saturating_duration_since(Instant::now());
        wait = match wait {
            WaitFor::Not => WaitFor::Not,
            WaitFor::AtMost(d) => WaitFor::AtMost(d.min(left)),
            WaitFor::Forever => WaitFor::AtMost(left),
        };
    }
    let opts = LockOptions::new().ttl(args.ttl).watchdog(true);
    let acquired = tokio::select! {
        acquired = acquire(&locker, &target, &args.key, &opts, wait) => acquired,
        sig = signals.recv() => {
            // The acquisition was dropped; whatever it had been granted is released in the
            // background, which shutdown waits for.
            locker.shutdown().await;
            return Ok(Exit::Signal(sig));
        }
    };
    let guard = match acquired {
        Ok(guard) => guard,
        Err(e) if e.code == NOT_ACQUIRED => {
            locker.shutdown().await;
            return conflict(CliError {
                message: format!("{}; not running the command", e.message),
                ..e
            });
        }
        Err(e) => return Err(e),
    };
    if let Some(claimed) = &claimed {
        if Instant::now() > claimed.latest_start() {
            let _ = guard.release().await;
            locker.settle().await;
            return Err(claimed.missed(&args.key, "the lock was won too late"));
        }
    }

    let started = Instant::now();
    let scheduled_at = claimed.as_ref().map(Claimed::scheduled_at);
    let mut outcome = hold(&guard, args, scheduled_at, &mut signals).await;
    if outcome.is_ok() {
        *ran = Some(started.elapsed());
    }
    if let (Some(at_least), Ok((_, None | Some(Stop::TimedOut(_))))) = (args.at_least, &outcome) {
        let until = match &claimed {
            Some(claimed) => claimed.hold_until(at_least),
            None => started + at_least,
        };
        // The lock is kept, however quickly the command ended; a signal or a lost lock
        // ends the hold.
        tokio::select! {
            () = tokio::time::sleep_until(until.into()) => {}
            () = guard.lost() => {}
            sig = signals.recv() => {
                if let Ok((status, _)) = outcome {
                    outcome = Ok((status, Some(Stop::Signal(sig))));
                }
            }
        }
    }
    finish(guard, &target, &args.key, &locker, outcome).await
}

/// Waits for the lock as `wait` says, noting on stderr (through the Locker's observer)
/// when the key is held elsewhere, when the server fails while distlock keeps trying, and
/// when it answers again.
async fn acquire(
    locker: &Locker,
    target: &Target,
    key: &str,
    opts: &LockOptions,
    wait: WaitFor,
) -> Result<LockGuard, CliError> {
    let (opts, until) = match wait {
        WaitFor::Not => (opts.clone().skip(), String::new()),
        WaitFor::AtMost(d) => (
            opts.clone().wait_for(d),
            format!("up to {}", fmt_duration(d)),
        ),
        WaitFor::Forever => (opts.clone().wait_forever(), "until it is free".to_owned()),
    };
    let url = target.shown();
    let failing = AtomicBool::new(false);
    let terminal = std::io::stderr().is_terminal();
    locker.observe(move |event: &Event<'_>| match event {
        Event::Waiting { key } if terminal => {
            note!("distlock: lock {key:?} is held by another owner; waiting {until}");
        }
        // Once per series of failures, and once when the server answers again.
        Event::Retrying { error, .. } if !failing.swap(true, Ordering::SeqCst) => {
            note!("distlock: {}; still trying", transient_message(error, &url));
        }
        Event::Granted { .. } if failing.swap(false, Ordering::SeqCst) => {
            note!("distlock: {url} answers again");
        }
        _ => {}
    });
    match locker.acquire(key, &opts).await {
        Ok(guard) => Ok(guard),
        Err(Error::Timeout { waited, .. }) => Err(not_acquired_after(key, waited)),
        Err(e) => Err(target.error(e)),
    }
}

/// Runs the command while the lock is held; returns its exit status, or why and with what
/// status distlock stopped it.
async fn hold(
    guard: &LockGuard,
    args: &RunArgs,
    scheduled_at: Option<String>,
    signals: &mut Signals,
) -> Result<(std::process::ExitStatus, Option<Stop>), CliError> {
    let mut env = vec![
        ("DISTLOCK_KEY", args.key.clone()),
        ("DISTLOCK_FENCE", guard.fence().to_string()),
    ];
    if let Some(at) = scheduled_at {
        env.push(("DISTLOCK_SCHEDULED_AT", at));
    }
    let mut job = Job::spawn(&args.command, &env)?;
    let lost = guard.lost();
    let timeout = async {
        match args.timeout {
            Some(t) => {
                tokio::time::sleep(t).await;
                t
            }
            None => std::future::pending().await,
        }
    };
    // Biased towards the command's own exit: when it finishes just as the lock is lost or
    // the timeout passes, its result is what it did.
    let stop = tokio::select! {
        biased;
        status = job.wait() => return Ok((status?, None)),
        () = lost => Stop::Lost,
        t = timeout => Stop::TimedOut(t),
        sig = signals.recv() => Stop::Signal(sig),
    };
    let grace = fmt_duration(args.grace);
    let first = match stop {
        Stop::Lost => {
            eprintln!(
                "distlock: lost lock {:?} while the command ran (renewal refused or the server \
                 stopped answering); stopping it: SIGTERM, SIGKILL after {grace}",
                args.key
            );
            libc::SIGTERM
        }
        Stop::TimedOut(t) => {
            eprintln!(
                "distlock: the command ran longer than --timeout {}; stopping it: SIGTERM, \
                 SIGKILL after {grace}",
                fmt_duration(t)
            );
            libc::SIGTERM
        }
        Stop::Signal(sig) => sig,
    };
    let status = job.stop(first, args.grace, signals).await?;
    Ok((status, Some(stop)))
}

/// Releases the lock and decides the exit.
async fn finish(
    guard: LockGuard,
    target: &Target,
    key: &str,
    locker: &Locker,
    outcome: Result<(std::process::ExitStatus, Option<Stop>), CliError>,
) -> Result<Exit, CliError> {
    let lost_already = matches!(outcome, Ok((_, Some(Stop::Lost))));
    match guard.release().await {
        Ok(()) => {}
        Err(_) if lost_already => {}
        Err(Error::NotHeld { .. }) => note!(
            "distlock: warning: lock {key:?} was no longer held when the command finished \
             (expired or taken over); another holder may have overlapped its end"
        ),
        Err(e) => note!(
            "distlock: warning: could not release lock {key:?} ({}); it expires at its TTL",
            target.error(e).message
        ),
    }
    locker.settle().await;
    let (status, stop) = outcome?;
    Ok(match stop {
        None => Exit::Code(status_code(status)),
        Some(Stop::Lost) => Exit::Code(LOCK_LOST),
        Some(Stop::TimedOut(_)) => Exit::Code(TIMED_OUT),
        Some(Stop::Signal(sig)) => Exit::Signal(sig),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_are_distinct() {
        let codes = [
            crate::exit::USAGE,
            crate::exit::UNAVAILABLE,
            crate::exit::INTERNAL,
            NOT_ACQUIRED,
            LOCK_LOST,
            TIMED_OUT,
            crate::exit::CANNOT_EXECUTE,
            crate::exit::NOT_FOUND,
        ];
        let mut sorted = codes.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), codes.len());
    }
}
