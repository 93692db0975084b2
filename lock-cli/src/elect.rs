//! `distlock elect`: run a command only while this process leads an election, and
//! `distlock leader`: show or follow an election's leader.

use std::ffi::OsString;
use std::time::Duration;

use clap::Args;
use distlock::election::Leader;
use distlock::{Error, LockOptions};
use serde::Serialize;

use crate::common::{parse_duration, parse_positive_duration, print_stdout, Target, UrlArg};
use crate::exit::{not_acquired_after, CliError, Exit, NOT_ACQUIRED};
use crate::job::Signals;
use crate::run::{finish, hold, waiting, Command, WaitFor};
use crate::units::fmt_duration;
use crate::verbosity::note;

pub const ELECT_HELP: &str = "\
Examples:
  # on every replica: one runs the scheduler loop, the others stand by and take over
  # within the TTL when it dies
  distlock elect billing-leader --value \"$(hostname)\" --ttl 10s -- ./billing-loop
  # who leads, and follow every change
  distlock leader billing-leader --watch

The leader of NAME holds the lock NAME (distlock status NAME shows it). CMD's environment
adds DISTLOCK_KEY (NAME), DISTLOCK_FENCE and DISTLOCK_TERM (the leadership's term: its
fencing token, greater than every earlier leader's; pass it with every write so the
resource can refuse a superseded leader's); DISTLOCK_URL and DISTLOCK_METRICS_PUSH are
removed from it. Its stdin and its death with distlock are as with `distlock run`. When
leadership is lost, CMD is stopped as `distlock run` stops it on a lost lock (SIGTERM,
SIGKILL after --grace; exit 76); when CMD ends, distlock resigns at once so a standby
leads without waiting for the TTL.
Exit status: as `distlock run` (75: --no-wait or --wait passed while another leads; 69:
a backend without elections, such as redlock://).";

/// `distlock elect` arguments.
#[derive(Args, Debug)]
pub struct ElectArgs {
    /// The election's name (the key its leader holds).
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    server: UrlArg,
    /// The value this candidate publishes while it leads (an address, a host name), shown
    /// by `distlock leader` [default: empty].
    #[arg(long, value_name = "VALUE", default_value = "")]
    value: String,
    /// Time to live of the leadership on the server: renewed every TTL/3 while CMD runs; if
    /// distlock dies, a standby leads after at most TTL.
    #[arg(short = 't', long, value_name = "DUR", default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,
    /// Campaign at most DUR [default: until this process leads].
    #[arg(short = 'w', long, value_name = "DUR", value_parser = parse_duration)]
    wait: Option<Duration>,
    /// Do not wait: exit 75 at once when another candidate leads.
    #[arg(short = 'n', long)]
    no_wait: bool,
    /// Stop CMD when it runs longer than DUR (exit 124).
    #[arg(long, value_name = "DUR", value_parser = parse_positive_duration)]
    timeout: Option<Duration>,
    /// How long CMD gets to exit after SIGTERM before SIGKILL. Keep it below the TTL.
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = parse_duration)]
    grace: Duration,
    /// The command to run while leading, and its arguments, after `--`.
    #[arg(value_name = "CMD", required = true, num_args = 1.., last = true)]
    command: Vec<OsString>,
}

/// Runs `distlock elect`.
///
/// # Errors
/// Bad input, an unreachable server, a backend without elections, leadership not won, or
/// a command that cannot start.
pub async fn elect(args: ElectArgs) -> Result<Exit, CliError> {
    let target = Target::choose(args.server.url.clone());
    distlock::validate_key(&args.name).map_err(|e| target.error(e))?;
    let mut signals = Signals::catch()?;
    let locker = tokio::select! {
        locker = target.connect() => locker?,
        sig = signals.recv() => return Ok(Exit::Signal(sig)),
    };
    locker
        .capabilities()
        .effective_ttl(args.ttl)
        .map_err(|e| target.error(e))?;
    let election = locker.election(&args.name).map_err(|e| target.error(e))?;
    if !locker.capabilities().cross_process {
        note!(
            "distlock: note: {} elections are decided inside this distlock process only; \
             other processes do not take part (use --url or DISTLOCK_URL to name a lock server)",
            target.shown()
        );
    }
    let opts = LockOptions::new().ttl(args.ttl).watchdog(true);
    let opts = waiting(
        &locker,
        &target,
        &opts,
        WaitFor::from_args(args.no_wait, args.wait),
    );
    let campaign = tokio::select! {
        campaign = election.campaign(args.value.as_bytes(), &opts) => campaign,
        sig = signals.recv() => {
            locker.shutdown().await;
            return Ok(Exit::Signal(sig));
        }
    };
    let leadership = match campaign {
        Ok(leadership) => leadership,
        Err(e @ (Error::Timeout { .. } | Error::Locked { .. })) => {
            locker.shutdown().await;
            let waited = match e {
                Error::Timeout { waited, .. } => waited,
                _ => Duration::ZERO,
            };
            let e = not_acquired_after(&args.name, waited);
            return Err(CliError {
                code: NOT_ACQUIRED,
                message: format!(
                    "{}; another candidate leads; not running the command",
                    e.message
                ),
                ..e
            });
        }
        Err(e) => return Err(target.error(e)),
    };
    let term = leadership.term().to_string();
    let command = Command {
        what: "leadership",
        key: &args.name,
        command: &args.command,
        env: vec![
            ("DISTLOCK_KEY", args.name.clone()),
            ("DISTLOCK_FENCE", term.clone()),
            ("DISTLOCK_TERM", term),
        ],
        timeout: args.timeout,
        grace: args.grace,
    };
    let guard = leadership.into_guard();
    let outcome = hold(&guard, &command, &mut signals).await;
    finish(guard, &target, &args.name, &locker, outcome).await
}

pub const LEADER_HELP: &str = "\
Examples:
  distlock leader billing-leader --url redis://10.0.0.5:6379
  distlock leader billing-leader --watch --json

Prints the election's leader: its value, its term and how long its leadership lasts
unless renewed; `no leader` when nobody leads. --watch prints the state, then every
change, woken by the server's notices, until interrupted. The exit status is 0 whether
or not someone leads; scripts read --json (one object per line with --watch).";

/// `distlock leader` arguments.
#[derive(Args, Debug)]
pub struct LeaderArgs {
    /// The election's name.
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    server: UrlArg,
    /// Follow the leadership: print every change until interrupted.
    #[arg(long)]
    watch: bool,
    /// Print JSON objects (one per line) instead of text.
    #[arg(long)]
    json: bool,
}

/// The JSON form of a leadership.
#[derive(Serialize)]
struct LeaderReport<'a> {
    name: &'a str,
    leader: bool,
    /// The value as text (lossy when it is not UTF-8).
    value: Option<String>,
    term: Option<u64>,
    expires_in_ms: Option<u64>,
}

fn report(name: &str, leader: Option<&Leader>, json: bool) -> String {
    if json {
        let r = LeaderReport {
            name,
            leader: leader.is_some(),
            value: leader.map(|l| String::from_utf8_lossy(&l.value).into_owned()),
            term: leader.map(|l| l.term),
            expires_in_ms: leader
                .and_then(|l| l.expires_in)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        };
        let text = serde_json::to_string(&r).unwrap_or_else(|_| "{}".to_owned());
        return format!("{text}\n");
    }
    match leader {
        None => format!("{name}: no leader\n"),
        Some(l) => {
            let left = l
                .expires_in
                .map_or_else(|| "unknown".to_owned(), fmt_duration);
            format!(
                "{name}: led by {:?} (term {}, expires in {left} unless renewed)\n",
                String::from_utf8_lossy(&l.value),
                l.term
            )
        }
    }
}

/// Runs `distlock leader`.
///
/// # Errors
/// Bad input, an unreachable server, a backend without elections.
pub async fn leader(args: LeaderArgs) -> Result<Exit, CliError> {
    let target = Target::choose(args.server.url.clone());
    distlock::validate_key(&args.name).map_err(|e| target.error(e))?;
    let mut signals = Signals::catch()?;
    let locker = target.connect().await?;
    let election = locker.election(&args.name).map_err(|e| target.error(e))?;
    if !args.watch {
        let now = election.leader().await.map_err(|e| target.error(e))?;
        print_stdout(&report(&args.name, now.as_ref(), args.json));
        return Ok(Exit::Code(0));
    }
    let mut watch = election.observe();
    loop {
        let changed = tokio::select! {
            changed = watch.changed() => changed,
            _ = signals.recv() => return Ok(Exit::Code(0)),
        };
        match changed {
            Ok(now) => print_stdout(&report(&args.name, now.as_ref(), args.json)),
            Err(e) if e.is_transient() => {
                eprintln!("distlock: {}; still watching", target.error(e).message);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(target.error(e)),
        }
    }
}
