//! `distlock cron status FILE`: per job, the last runs (outcome, replica), the last success
//! and the next fire time, as the lock server keeps them.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::Args;
use distlock::scheduler::{BoxError, RunRecord, Scheduler};
use serde::Serialize;

use super::command::rfc3339;
use super::file;
use crate::common::{print_stdout, Target};
use crate::exit::{CliError, Exit, INTERNAL, UNAVAILABLE};
use crate::units::fmt_duration;
use crate::verbosity::note;

pub const AFTER_HELP: &str = "\
Examples:
  distlock cron status /etc/distlock/jobs.toml --url redis://10.0.0.5:6379
  distlock cron status jobs.toml --last 3 --json

Reads the run records every replica wrote to the lock server: per job of FILE its last
runs (fire time, outcome, replica, duration), its last success and its next fire time.
Every replica records each fire time it saw: the one that ran it with how the run ended,
the others as skipped-busy. Times are RFC 3339 in UTC.

Exit 0; 64 for a bad file; 69 when the server is unreachable or keeps no run records.";

/// `distlock cron status` arguments.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The schedule file the replicas run.
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Lock server URL (the forms are in `distlock --help`) [default: memory://].
    #[arg(
        short = 'u',
        long,
        value_name = "URL",
        env = "DISTLOCK_URL",
        hide_env_values = true
    )]
    url: Option<String>,

    /// How many of each job's last run records to show.
    #[arg(long, value_name = "N", default_value_t = 10)]
    last: usize,

    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Report {
    file: String,
    url: String,
    backend: &'static str,
    jobs: Vec<JobReport>,
}

#[derive(Serialize)]
struct JobReport {
    name: String,
    schedule: String,
    time_zone: String,
    /// The next fire time, RFC 3339 in UTC; null when the schedule never fires again.
    next_fire: Option<String>,
    /// The next fire time in the job's zone.
    next_fire_local: Option<String>,
    last_success: Option<Record>,
    /// Newest first.
    runs: Vec<Record>,
}

#[derive(Serialize)]
struct Record {
    scheduled_at: String,
    outcome: &'static str,
    replica: String,
    started_at: Option<String>,
    ended_at: String,
    /// From start to end, for runs that started.
    duration_ms: Option<u64>,
    fence: Option<u64>,
    detail: Option<String>,
    /// The writing replica's clock minus the lock server's, in ms, when it wrote the
    /// record (null where the server has no clock).
    clock_offset_ms: Option<i64>,
}

impl From<&RunRecord> for Record {
    fn from(r: &RunRecord) -> Record {
        Record {
            scheduled_at: rfc3339(r.scheduled_at),
            outcome: r.outcome.as_str(),
            replica: r.replica.clone(),
            started_at: r.started_at.map(rfc3339),
            ended_at: rfc3339(r.ended_at),
            duration_ms: r.started_at.map(|s| millis(r.ended_at, s)),
            fence: r.fence,
            detail: r.detail.clone(),
            clock_offset_ms: r.clock_offset_ms,
        }
    }
}

fn millis(end: SystemTime, start: SystemTime) -> u64 {
    let d = end.duration_since(start).unwrap_or(Duration::ZERO);
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs `distlock cron status`.
///
/// # Errors
/// A bad file, an unreachable server, a backend without run records.
pub async fn run(args: StatusArgs) -> Result<Exit, CliError> {
    let file = file::load(&args.file)?;
    let target = Target::choose(args.url);
    let locker = target.connect().await?;
    let backend = locker.capabilities().name;
    if locker.backend().run_records().is_none() {
        return Err(CliError::new(
            UNAVAILABLE,
            format!("the {backend} backend keeps no run records; there is no history to show"),
        )
        .hint("run the replicas on a lock server that keeps records (memory, redis, etcd)"));
    }
    // The scheduler reads the schedules and the records; it is never started here.
    let scheduler = Scheduler::builder(locker.clone())
        .build()
        .map_err(|e| CliError::new(INTERNAL, e.to_string()))?;
    let mut jobs = Vec::new();
    for spec in &file.jobs {
        let job = spec.job.clone().run(|_| async { Ok::<(), BoxError>(()) });
        let name = job.name().to_owned();
        scheduler
            .add(job)
            .map_err(|e| file::add_error(&args.file, spec, e, &target))?;
        let next = scheduler.next_fire(&name).ok();
        let read = |e: distlock::scheduler::Error| match e {
            distlock::scheduler::Error::Lock(e) => target.error(e),
            other => CliError::new(UNAVAILABLE, other.to_string()),
        };
        let runs = scheduler.recent(&name, args.last).await.map_err(read)?;
        let last_success = scheduler.last_success(&name).await.map_err(read)?;
        jobs.push(JobReport {
            schedule: spec.schedule.clone(),
            time_zone: spec.time_zone.clone().unwrap_or_else(|| "UTC".to_owned()),
            next_fire: next.as_ref().map(|z| z.timestamp().to_string()),
            next_fire_local: next.as_ref().map(ToString::to_string),
            last_success: last_success.as_ref().map(Record::from),
            runs: runs.iter().map(Record::from).collect(),
            name,
        });
    }
    locker.shutdown().await;
    let report = Report {
        file: args.file.display().to_string(),
        url: target.shown(),
        backend,
        jobs,
    };
    if args.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| CliError::new(INTERNAL, format!("cannot write JSON: {e}")))?;
        print_stdout(&format!("{text}\n"));
    } else {
        print_stdout(&text(&report));
    }
    if !locker.capabilities().cross_process {
        note!(
            "distlock: note: {} keeps records inside one process; a new distlock process \
             sees none of the replicas' runs",
            report.url
        );
    }
    Ok(Exit::Code(0))
}

fn text(report: &Report) -> String {
    let mut out = format!("server: {} ({})\n", report.url, report.backend);
    for job in &report.jobs {
        out.push_str(&format!(
            "\njob {:?}: {} ({})\n",
            job.name, job.schedule, job.time_zone
        ));
        out.push_str(&format!(
            "  next fire:    {}\n",
            job.next_fire_local.as_deref().unwrap_or("never")
        ));
        match &job.last_success {
            Some(r) => out.push_str(&format!(
                "  last success: {} on {}\n",
                r.scheduled_at, r.replica
            )),
            None => out.push_str("  last success: never\n"),
        }
        if job.runs.is_empty() {
            out.push_str("  last runs:    none recorded\n");
            continue;
        }
        out.push_str("  last runs (newest first):\n");
        let width = job.runs.iter().map(|r| r.replica.len()).max().unwrap_or(0);
        for r in &job.runs {
            let took = r
                .duration_ms
                .map(|ms| fmt_duration(Duration::from_millis(ms)))
                .unwrap_or_default();
            // The replica's clock against the server's, where the server has one.
            let offset = r
                .clock_offset_ms
                .map(|ms| format!("clock {ms:+}ms"))
                .unwrap_or_default();
            let mut line = format!(
                "    {}  {:<12}  {:<width$}  {took:<8}  {offset:<14}",
                r.scheduled_at, r.outcome, r.replica
            );
            if let Some(d) = &r.detail {
                line.push_str(&format!("  {d}"));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}
