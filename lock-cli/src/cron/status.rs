//! `distlock cron status FILE`: per job, the last runs (outcome, replica), the last success
//! and the next fire time, as the lock server keeps them.

use std::path::PathBuf;

use clap::Args;

use crate::exit::{CliError, Exit};

pub const AFTER_HELP: &str = "\
Examples:
  distlock cron status /etc/distlock/jobs.toml --url redis://10.0.0.5:6379
  distlock cron status jobs.toml --json

Reads the run records every replica wrote to the lock server: per job of FILE its last
runs (fire time, outcome, replica, duration), its last success and its next fire time.
Exit 0; 64 for a bad file; 69 when the server is unreachable or keeps no run records.";

/// `distlock cron status` arguments.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The schedule file the replicas run.
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Lock server URL [default: $DISTLOCK_URL, else memory://].
    #[arg(long, value_name = "URL")]
    url: Option<String>,

    /// How many of each job's last runs to show.
    #[arg(long, value_name = "N", default_value_t = 10)]
    last: usize,

    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs `distlock cron status`.
///
/// # Errors
/// A bad file, an unreachable server, a backend without run records.
pub async fn run(args: StatusArgs) -> Result<Exit, CliError> {
    let _ = args;
    Err(CliError::new(crate::exit::INTERNAL, "not yet"))
}
