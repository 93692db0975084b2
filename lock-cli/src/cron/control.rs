//! `distlock cron pause / resume / trigger JOB`: cluster-wide control of a job through the
//! lock server, acted on by every replica at once (no restart, no file edit).

use clap::Args;
use distlock::scheduler::control;

use super::command::rfc3339;
use crate::common::{print_stdout, Target, UrlArg};
use crate::exit::{CliError, Exit, UNAVAILABLE, USAGE};

pub const AFTER_HELP: &str = "\
Examples:
  distlock cron pause nightly-report --url redis://10.0.0.5:6379
  distlock cron resume nightly-report --url redis://10.0.0.5:6379
  distlock cron trigger nightly-report --url redis://10.0.0.5:6379

pause: from its next fire time no replica starts the job (a run under way goes on);
`distlock cron status` shows it paused. resume: its next fire time runs again.
trigger: one replica running the job runs it once now (within its control poll, 2s by
default), under the job's lock (skipped if a run holds it), recorded as `trigger`; a
paused job runs too. JOB is the job's name in the schedule file.

Exit 0; 64 for a bad job name; 69 when the server is unreachable or keeps no journal.";

/// `distlock cron pause|resume|trigger` arguments.
#[derive(Args, Debug)]
pub struct ControlArgs {
    /// The job's name (as in the schedule file).
    #[arg(value_name = "JOB")]
    job: String,

    #[command(flatten)]
    server: UrlArg,

    /// Who asks, as the journal and `cron status` show it [default: USER@HOSTNAME].
    #[arg(long, value_name = "NAME")]
    by: Option<String>,
}

/// Which control.
#[derive(Clone, Copy, Debug)]
pub enum Action {
    Pause,
    Resume,
    Trigger,
}

fn asker() -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .unwrap_or_else(|_| "unknown".to_owned());
    let host = distlock::scheduler::default_replica();
    // `hostname-pid`: the host is what comes before the last `-`.
    let host = host.rsplit_once('-').map_or(host.as_str(), |(h, _)| h);
    format!("{user}@{host}")
}

/// Runs `distlock cron pause|resume|trigger`.
///
/// # Errors
/// A bad job name, an unreachable server, a backend without a journal.
pub async fn run(action: Action, args: ControlArgs) -> Result<Exit, CliError> {
    if let Err(e) = distlock::validate_key(&args.job) {
        return Err(CliError::new(USAGE, format!("bad job name: {e}")));
    }
    let target = Target::choose(args.server.url);
    let locker = target.connect().await?;
    let by = args.by.unwrap_or_else(asker);
    let failed = |e: distlock::scheduler::Error| match e {
        distlock::scheduler::Error::Lock(e) => target.error(e),
        other => CliError::new(UNAVAILABLE, other.to_string()),
    };
    let said = match action {
        Action::Pause => {
            control::pause(&locker, &args.job, &by)
                .await
                .map_err(failed)?;
            format!("paused {:?} on every replica (by {by})\n", args.job)
        }
        Action::Resume => {
            control::resume(&locker, &args.job, &by)
                .await
                .map_err(failed)?;
            format!("resumed {:?} on every replica (by {by})\n", args.job)
        }
        Action::Trigger => {
            let at = control::trigger(&locker, &args.job, &by)
                .await
                .map_err(failed)?;
            format!(
                "triggered {:?} at {} (by {by}): one replica runs it within its control poll\n",
                args.job,
                rfc3339(at)
            )
        }
    };
    locker.shutdown().await;
    print_stdout(&said);
    Ok(Exit::Code(0))
}
