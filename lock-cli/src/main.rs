#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod baseline;
mod bench;
mod common;
mod cron;
mod elect;
mod exit;
mod fire;
mod job;
mod manual;
mod metrics;
mod progress;
mod push;
mod report;
mod run;
mod run_args;
mod schedule;
mod status;
mod units;
mod verbosity;

use std::future::Future;
use std::io::Write;
use std::time::Duration;

use clap::{ArgAction, CommandFactory, FromArgMatches, Parser, Subcommand};

use crate::exit::{CliError, Exit, INTERNAL, USAGE};
use crate::verbosity::Verbosity;

const AFTER_HELP: &str = "\
Lock servers (-u/--url, else $DISTLOCK_URL, else memory://; for `run`, else a file lock in
$XDG_RUNTIME_DIR/distlock):
  memory://
      this process only, for trying things out
  file:///DIR[?sync=false]
      flock on a file per key in DIR: the processes of this host, free when the holder dies
  redis://[USER:PASS@]HOST[:PORT][/DB][?prefix=P&timeout=DUR]
      one Redis server (port 6379)
  rediss://[USER:PASS@]HOST[:PORT][/DB][?ca=PEM&cert=PEM&key=PEM&prefix=P&timeout=DUR]
      one Redis server over TLS (ca: CA file instead of the system roots; cert+key:
      a client certificate)
  redis+sentinel://[USER:PASS@]HOST[:PORT],HOST[:PORT],.../MASTER[/DB][?sentinel_user=U&
      sentinel_password=P&prefix=P&timeout=DUR]
      the master these Redis Sentinels (port 26379) name, found again after a failover
      (USER:PASS are the master's credentials)
  redis+cluster://[USER:PASS@]HOST[:PORT],HOST[:PORT],...[?prefix=P&timeout=DUR]
      a Redis Cluster through its seed nodes (port 6379)
  redlock://[USER:PASS@]HOST[:PORT],HOST[:PORT],...[/DB][?drift=F&fencing=BOOL&prefix=P&
      timeout=DUR]
      Redlock: a majority of independent Redis nodes (port 6379)
  etcd://[USER:PASS@]HOST[:PORT][,HOST[:PORT]...][?tls=true&ca=PEM&cert=PEM&key=PEM&
      prefix=P&timeout=DUR]
      an etcd cluster (port 2379); TLS with tls=true or any of ca, cert, key
  postgres://[USER:PASS@]HOST[:PORT][/DB][?table=T&schema=S&timeout=DUR]
      a PostgreSQL lease table (port 5432); postgresql:// is the same
  mysql://[USER:PASS@]HOST[:PORT]/DB[?table=T&timeout=DUR]
      a MySQL 8 or MariaDB 10.3+ lease table (port 3306); mariadb:// is the same
  zookeeper://HOST[:PORT],HOST[:PORT],...[/ROOT][?session_timeout=DUR&timeout=DUR]
      ephemeral sequential nodes on a ZooKeeper ensemble (port 2181); TTLs up to
      the session timeout (default 30s)
Percent-encode @ / ? # in a password; prefer $DISTLOCK_URL to --url for one (other users
of the host see command lines). Durations are written like 500ms, 30s, 5m or 1h 30m.

Messages go to stderr: errors and warnings, from distlock and from the libraries (as
`WARN lock_etcd::connect: ...`). -q leaves errors only; -v adds the libraries' info
events, -vv debug, -vvv trace; RUST_LOG (like lock_redis=debug) replaces that filter.

Examples:
  distlock run nightly-report --url redis://10.0.0.5:6379 -- ./report.sh
  distlock run --no-wait backup -- ./backup.sh    (a file lock: one at a time on this host)
  distlock bench --url memory:// --url redis://127.0.0.1:6379
  distlock status nightly-report --url redis://10.0.0.5:6379
  distlock cron jobs.toml --url redis://10.0.0.5:6379
  distlock completions bash > /etc/bash_completion.d/distlock
  distlock man > /usr/local/share/man/man1/distlock.1

Exit statuses are listed in `distlock run --help`; all subcommands exit 64 on bad input,
69 when the lock server is unreachable or refusing, 70 on an internal error.";

/// Run a command under a distributed lock, benchmark lock servers, inspect a lock.
#[derive(Parser, Debug)]
#[command(name = "distlock", version, after_help = AFTER_HELP, max_term_width = 100)]
struct Cli {
    /// Say more on stderr: the libraries' info events; -vv debug, -vvv trace.
    #[arg(short, long, global = true, action = ArgAction::Count)]
    verbose: u8,

    /// Say only errors on stderr: no warnings or notes, from distlock or the libraries;
    /// `run` also prints nothing when another holder keeps CMD from running (see -E).
    #[arg(short, long, global = true)]
    quiet: bool,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run CMD only while holding the lock KEY (renewed while CMD runs); exit with CMD's
    /// status.
    #[command(after_help = run::AFTER_HELP)]
    Run(run::RunArgs),
    /// Measure lock throughput and latency of one or more lock servers.
    #[command(after_help = bench::AFTER_HELP)]
    Bench(bench::BenchArgs),
    /// Run CMD only while this process leads the election NAME; stop it when leadership
    /// is lost, resign when it ends.
    #[command(after_help = elect::ELECT_HELP)]
    Elect(elect::ElectArgs),
    /// Show the leader of the election NAME (value, term, time left), or follow it.
    #[command(after_help = elect::LEADER_HELP)]
    Leader(elect::LeaderArgs),
    /// Show whether KEY is held, its fencing token and its remaining validity.
    #[command(after_help = status::AFTER_HELP)]
    Status(status::StatusArgs),
    /// Run a schedule file of jobs on this replica, each fire time on one replica only
    /// (`cron FILE`), or show the jobs' last runs (`cron status FILE`).
    #[command(after_help = cron::AFTER_HELP)]
    Cron(cron::CronArgs),
    /// Print the completion script of SHELL for distlock to stdout.
    #[command(after_help = manual::COMPLETIONS_HELP)]
    Completions(manual::CompletionsArgs),
    /// Print distlock's manual page (roff, section 1) to stdout, or a subcommand's.
    #[command(after_help = manual::MAN_HELP)]
    Man(manual::ManArgs),
}

fn main() {
    let parsed = Cli::command()
        .try_get_matches()
        .and_then(|matches| Ok((Cli::from_arg_matches(&matches)?, matches)));
    let (cli, matches) = match parsed {
        Ok(parsed) => parsed,
        Err(e) => {
            let _ = e.print();
            std::process::exit(if e.use_stderr() { USAGE } else { 0 });
        }
    };
    common::note_url_source(&matches);
    // Checked here rather than by clap, which misses the pair when one is given before the
    // subcommand and the other after it.
    let verbosity = if cli.quiet && cli.verbose > 0 {
        Err(CliError::new(
            USAGE,
            "--quiet cannot be used with --verbose",
        ))
    } else {
        Ok(Verbosity::from_flags(cli.quiet, cli.verbose))
    };
    if let Err(e) = verbosity.and_then(verbosity::init) {
        eprintln!("{e}");
        std::process::exit(e.code);
    }
    let exit = match cli.command {
        Command::Run(args) => block_on(run::run(args)),
        Command::Bench(args) => block_on(bench::run(args)),
        Command::Status(args) => block_on(status::run(args)),
        Command::Elect(args) => block_on(elect::elect(args)),
        Command::Leader(args) => block_on(elect::leader(args)),
        Command::Cron(args) => block_on(cron::run(args)),
        Command::Completions(args) => manual::completions(args, Cli::command()),
        Command::Man(args) => manual::man(args, Cli::command()),
    };
    let _ = std::io::stdout().flush();
    match exit {
        Ok(Exit::Code(code)) => std::process::exit(code),
        Ok(Exit::Signal(sig)) => die_of(sig),
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(e.code);
        }
    }
}

/// Runs a subcommand on a multi-threaded tokio runtime.
fn block_on(subcommand: impl Future<Output = Result<Exit, CliError>>) -> Result<Exit, CliError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::new(INTERNAL, format!("cannot start the async runtime: {e}")))?;
    let exit = runtime.block_on(subcommand);
    // Background work (renewals, client connections) must not hold up the exit.
    runtime.shutdown_timeout(Duration::from_secs(1));
    exit
}

/// Dies of `sig` with its default action, so that the parent sees the process killed by
/// the signal the user sent (a shell then stops a script on Ctrl-C, as it should).
fn die_of(sig: i32) -> ! {
    // SAFETY: resetting a disposition and raising a signal have no memory-safety
    // preconditions; no other thread runs Rust code any more (the runtime is shut down).
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
    // Only reached if the signal's default action does not terminate the process.
    std::process::exit(128 + sig)
}
