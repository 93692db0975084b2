#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod baseline;
mod bench;
mod common;
mod cron;
mod exit;
mod fire;
mod job;
mod metrics;
mod progress;
mod report;
mod run;
mod schedule;
mod status;
mod units;

use std::io::Write;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::exit::{CliError, Exit, INTERNAL, USAGE};

const AFTER_HELP: &str = "\
Lock servers (--url, else $DISTLOCK_URL, else memory://):
  memory://                            this process only, for trying things out
  redis://[USER:PASS@]HOST:PORT[/DB]   one Redis server (rediss:// over TLS)
  redlock://HOST:PORT,HOST:PORT,...    Redlock over independent Redis nodes
  etcd://HOST:PORT[,HOST:PORT...]      an etcd cluster
  postgres://USER:PASS@HOST:PORT/DB    a PostgreSQL lease table (?table=, ?schema=)
Durations are written like 500ms, 30s, 5m or 1h 30m.

Examples:
  distlock run nightly-report --url redis://10.0.0.5:6379 -- ./report.sh
  distlock bench --url memory:// --url redis://127.0.0.1:6379
  distlock status nightly-report --url redis://10.0.0.5:6379
  distlock cron jobs.toml --url redis://10.0.0.5:6379

Exit statuses are listed in `distlock run --help`; all subcommands exit 64 on bad input,
69 when the lock server is unreachable or refusing, 70 on an internal error.";

/// Run a command under a distributed lock, benchmark lock servers, inspect a lock.
#[derive(Parser, Debug)]
#[command(name = "distlock", version, after_help = AFTER_HELP)]
struct Cli {
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
    /// Show whether KEY is held, its fencing token and its remaining validity.
    #[command(after_help = status::AFTER_HELP)]
    Status(status::StatusArgs),
    /// Run a schedule file of jobs on this replica, each fire time on one replica only
    /// (`cron FILE`), or show the jobs' last runs (`cron status FILE`).
    #[command(after_help = cron::AFTER_HELP)]
    Cron(cron::CronArgs),
}

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            std::process::exit(if e.use_stderr() { USAGE } else { 0 });
        }
    };
    let exit = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => {
            let exit = runtime.block_on(async {
                match cli.command {
                    Command::Run(args) => run::run(args).await,
                    Command::Bench(args) => bench::run(args).await,
                    Command::Status(args) => status::run(args).await,
                    Command::Cron(args) => cron::run(args).await,
                }
            });
            // Background work (renewals, client connections) must not hold up the exit.
            runtime.shutdown_timeout(Duration::from_secs(1));
            exit
        }
        Err(e) => Err(CliError::new(
            INTERNAL,
            format!("cannot start the async runtime: {e}"),
        )),
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
