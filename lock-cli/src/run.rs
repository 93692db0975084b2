//! `distlock run`: run a command only while holding a lock.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use distlock::{Error, Event, LockGuard, LockOptions, Locker};

use crate::common::Target;
use crate::exit::{
    not_acquired_after, transient_message, CliError, Exit, LOCK_LOST, NOT_ACQUIRED, TIMED_OUT,
    USAGE,
};
use crate::fire::{Claimed, NotClaimed, Scheduled};
use crate::job::{status_code, Input, Job, Signals, Spawn};
use crate::push::Pushgateway;
use crate::units::fmt_duration;
use crate::verbosity::note;

pub use crate::run_args::{RunArgs, AFTER_HELP};

/// How long to wait for a held lock.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WaitFor {
    Not,
    AtMost(Duration),
    Forever,
}

/// Why distlock stopped the command.
pub(crate) enum Stop {
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
    let target = Target::choose_on_this_host(args.url.clone())?;
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
    if target.is_default() {
        note!(
            "distlock: note: no --url or DISTLOCK_URL: a file lock in {}, which excludes the \
             processes of this host only (name a lock server to exclude across hosts)",
            target.shown()
        );
    } else if !caps.cross_process {
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

    let mut wait = WaitFor::from_args(args.no_wait, args.wait);
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
    let opts = LockOptions::new()
        .ttl(args.ttl)
        .watchdog(true)
        .permits(args.claim().map_err(|e| target.error(e))?);
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
    let mut env = vec![
        ("DISTLOCK_KEY", args.key.clone()),
        ("DISTLOCK_FENCE", guard.fence().to_string()),
    ];
    if let Some(at) = scheduled_at {
        env.push(("DISTLOCK_SCHEDULED_AT", at));
    }
    if let Some(claimed) = &claimed {
        let (local, zone) = claimed.scheduled_local();
        env.push(("DISTLOCK_SCHEDULED_LOCAL", local));
        if let Some(zone) = zone {
            env.push(("DISTLOCK_TIME_ZONE", zone));
        }
    }
    let command = Command {
        what: "lock",
        key: &args.key,
        command: &args.command,
        env,
        timeout: args.timeout,
        grace: args.grace,
    };
    let mut outcome = hold(&guard, &command, &mut signals).await;
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

impl WaitFor {
    /// `--no-wait` and `--wait DUR` as a wait: `-n` wins, no `-w` waits forever.
    pub(crate) fn from_args(no_wait: bool, wait: Option<Duration>) -> Self {
        match (no_wait, wait) {
            (true, _) => WaitFor::Not,
            (false, Some(d)) => WaitFor::AtMost(d),
            (false, None) => WaitFor::Forever,
        }
    }
}

/// Waits for the lock as `wait` says (see [`waiting`]).
async fn acquire(
    locker: &Locker,
    target: &Target,
    key: &str,
    opts: &LockOptions,
    wait: WaitFor,
) -> Result<LockGuard, CliError> {
    let opts = waiting(locker, target, opts, wait);
    match locker.acquire(key, &opts).await {
        Ok(guard) => Ok(guard),
        Err(Error::Timeout { waited, .. }) => Err(not_acquired_after(key, waited)),
        Err(e) => Err(target.error(e)),
    }
}

/// `opts` waiting as `wait` says; notes on stderr (through the Locker's observer) when the
/// key is held elsewhere, when the server fails while distlock keeps trying, and when it
/// answers again.
pub(crate) fn waiting(
    locker: &Locker,
    target: &Target,
    opts: &LockOptions,
    wait: WaitFor,
) -> LockOptions {
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
    opts
}

/// The command distlock runs while a grant is held, and how.
pub(crate) struct Command<'a> {
    /// What the grant is, in messages: `lock`, `leadership`.
    pub(crate) what: &'static str,
    pub(crate) key: &'a str,
    pub(crate) command: &'a [std::ffi::OsString],
    pub(crate) env: Vec<(&'static str, String)>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) grace: Duration,
}

/// Runs the command while the grant is held; returns its exit status, or why and with
/// what status distlock stopped it.
pub(crate) async fn hold(
    guard: &LockGuard,
    args: &Command<'_>,
    signals: &mut Signals,
) -> Result<(std::process::ExitStatus, Option<Stop>), CliError> {
    let how = Spawn {
        env: &args.env,
        stdin: Input::Inherited,
        prefix: None,
    };
    let mut job = Job::spawn(args.command, &how)?;
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
                "distlock: lost {} {:?} while the command ran (renewal refused or the server \
                 stopped answering); stopping it: SIGTERM, SIGKILL after {grace}",
                args.what, args.key
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
pub(crate) async fn finish(
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
