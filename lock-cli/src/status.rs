//! `distlock status`: who holds a key now, as far as the backend can tell.

use clap::Args;
use serde::Serialize;

use crate::common::{print_stdout, Target, UrlArg};
use crate::exit::{CliError, Exit};
use crate::units::fmt_duration;
use crate::verbosity::note;

pub const AFTER_HELP: &str = "\
Examples:
  distlock status nightly-report --url redis://10.0.0.5:6379
  distlock status nightly-report --json

Prints whether KEY is held, the holder's fencing token and owner token, and how long the
lock has left when the backend tells. The exit status is 0 whether the key is held or
free; scripts read --json. Backends that cannot inspect locks exit 69.";

/// `distlock status` arguments.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The lock's key.
    #[arg(value_name = "KEY")]
    key: String,

    #[command(flatten)]
    server: UrlArg,

    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The JSON form of the answer.
#[derive(Serialize)]
struct Report<'a> {
    key: &'a str,
    backend: &'static str,
    url: String,
    held: bool,
    /// The holder's fencing token, when held and known.
    fence: Option<u64>,
    /// The holder's owner token (32 hex digits), when held and known.
    owner: Option<String>,
    /// Milliseconds left before the lock expires, when held and the backend tells.
    expires_in_ms: Option<u64>,
    /// Whether the lock server is shared between processes (false for memory://).
    cross_process: bool,
    /// Every grant on the key (one for a lock; each holder of permits of a semaphore or a
    /// reader-writer key); `fence`, `owner` and `expires_in_ms` above are the first's.
    holders: Vec<HolderReport>,
}

/// One grant on the key, in the JSON form.
#[derive(Serialize)]
struct HolderReport {
    fence: Option<u64>,
    owner: Option<String>,
    expires_in_ms: Option<u64>,
    /// `lock`, `read`, `write`, or `k of N permits`.
    permits: String,
}

/// Runs `distlock status`.
///
/// # Errors
/// Bad input, an unreachable server, or a backend that cannot inspect locks.
pub async fn run(args: StatusArgs) -> Result<Exit, CliError> {
    let target = Target::choose(args.server.url);
    distlock::validate_key(&args.key).map_err(|e| target.error(e))?;
    let locker = target.connect().await?;
    let caps = locker.capabilities().clone();
    let admin = locker.backend().admin().ok_or_else(|| {
        target.error(distlock::Error::Unsupported {
            backend: caps.name,
            operation: "inspect",
        })
    })?;
    let holders = admin
        .inspect(&args.key)
        .await
        .map_err(|e| target.error(e))?;
    let holder = holders.first().cloned();
    let millis = |d: std::time::Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let report = Report {
        key: &args.key,
        backend: caps.name,
        url: target.shown(),
        held: holder.is_some(),
        fence: holder.as_ref().and_then(|h| h.fence),
        owner: holder.as_ref().and_then(|h| h.owner).map(|o| o.to_string()),
        expires_in_ms: holder.as_ref().and_then(|h| h.expires_in).map(millis),
        cross_process: caps.cross_process,
        holders: holders
            .iter()
            .map(|h| HolderReport {
                fence: h.fence,
                owner: h.owner.map(|o| o.to_string()),
                expires_in_ms: h.expires_in.map(millis),
                permits: h.permits.to_string(),
            })
            .collect(),
    };
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::new(crate::exit::INTERNAL, format!("cannot write JSON: {e}")))?;
        print_stdout(&format!("{text}\n"));
    } else {
        print_stdout(&text(&report, &holders));
    }
    if !caps.cross_process {
        note!(
            "distlock: note: {} locks live inside one process; a new distlock process sees \
             none of another process's locks",
            report.url
        );
    }
    Ok(Exit::Code(0))
}

fn text(report: &Report<'_>, holders: &[distlock::Holder]) -> String {
    let unknown = || "unknown (the backend does not tell)".to_owned();
    let mut out = format!(
        "key:        {}\nserver:     {} ({})\n",
        report.key, report.url, report.backend
    );
    if holders.is_empty() {
        out.push_str("state:      free\n");
    }
    for (i, h) in holders.iter().enumerate() {
        let fence = h.fence.map_or_else(unknown, |f| f.to_string());
        let expires = h.expires_in.map_or_else(unknown, fmt_duration);
        let owner = h.owner.map_or_else(unknown, |o| o.to_string());
        if i == 0 {
            out.push_str("state:      held\n");
        } else {
            out.push('\n');
        }
        if h.permits != distlock::Permits::LOCK {
            out.push_str(&format!("permits:    {}\n", h.permits));
        }
        out.push_str(&format!(
            "fence:      {fence}\nexpires in: {expires}\nowner:      {owner}\n"
        ));
    }
    out
}
