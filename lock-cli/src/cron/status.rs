//! `distlock cron status FILE`: per job, one line per fire time (where it ran, how long,
//! how it ended, with the flags an operator looks for), the durations and the timeout they
//! suggest, the pause, the last success and failure, and the next fire time, as the lock
//! server's journal keeps them.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use distlock::scheduler::{
    duration_stats, fire_times, BoxError, FireTimeLine, RunRecord, Scheduler,
};
use serde::Serialize;

use super::command::rfc3339;
use super::file;
use crate::common::{print_stdout, Target, UrlArg};
use crate::exit::{CliError, Exit, INTERNAL, UNAVAILABLE};
use crate::units::fmt_duration;
use crate::verbosity::note;

pub const AFTER_HELP: &str = "\
Examples:
  distlock cron status /etc/distlock/jobs.toml --url redis://10.0.0.5:6379
  distlock cron status jobs.toml --last 3 --json

Reads the journal every replica writes to the lock server. Per job of FILE:
  - whether it is paused (distlock cron pause), its next fire time, its last success and
    its last failure;
  - the duration of its runs over the kept history (p50, p95, p99, max) and the timeout
    they suggest (p99 x 3);
  - one line per fire time, newest first: where it ran, how long, how it ended. A run
    under way shows as running from its start; one whose replica died as abandoned.
    Flags: `duplicate` (two runs of one fire time), `overlap` (still going when the next
    fire time's run started), `early` (started before its fire time on the server's
    clock), `catch-up` and `trigger` (why it ran).
Times are RFC 3339 in UTC.

Exit 0; 64 for a bad file; 69 when the server is unreachable or keeps no run records.";

/// `distlock cron status` arguments.
#[derive(Args, Debug)]
pub struct StatusArgs {
    /// The schedule file the replicas run.
    #[arg(value_name = "FILE")]
    file: PathBuf,

    #[command(flatten)]
    server: UrlArg,

    /// How many of each job's fire times to show.
    #[arg(long, value_name = "N", default_value_t = 10)]
    last: usize,

    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// The records read per job: the durations are taken over them all.
const READ: usize = 1000;

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
    /// Set while the job is paused on every replica.
    paused: Option<Paused>,
    /// The next fire time, RFC 3339 in UTC; null when the schedule never fires again.
    next_fire: Option<String>,
    /// The next fire time in the job's zone.
    next_fire_local: Option<String>,
    last_success: Option<Record>,
    last_failure: Option<Record>,
    /// Over the runs kept that ended by themselves (ok or failed); null without one.
    durations: Option<Durations>,
    /// One per fire time, newest first.
    fire_times: Vec<Line>,
}

#[derive(Serialize)]
struct Paused {
    by: String,
    since: String,
}

#[derive(Serialize)]
struct Durations {
    samples: usize,
    p50_ms: u64,
    p95_ms: u64,
    p99_ms: u64,
    max_ms: u64,
    suggested_timeout_ms: u64,
}

#[derive(Serialize)]
struct Line {
    /// `ok`, `failed`, …, `running`, or `abandoned`.
    state: &'static str,
    /// Runs of this fire time that started (more than 1: a duplicate).
    runs: usize,
    duplicate: bool,
    overlaps_next: bool,
    early: bool,
    #[serde(flatten)]
    record: Record,
}

#[derive(Serialize)]
struct Record {
    scheduled_at: String,
    outcome: &'static str,
    cause: &'static str,
    replica: String,
    pid: Option<u32>,
    started_at: Option<String>,
    /// For a running record, when it was written.
    ended_at: String,
    /// From start to end, for runs that ended.
    duration_ms: Option<u64>,
    fence: Option<u64>,
    detail: Option<String>,
    /// The tail of the command's output, as the record keeps it.
    output: Option<String>,
    /// The writing replica's clock minus the lock server's, in ms, when it wrote the
    /// record (null where the server has no clock).
    clock_offset_ms: Option<i64>,
}

impl From<&RunRecord> for Record {
    fn from(r: &RunRecord) -> Record {
        Record {
            scheduled_at: rfc3339(r.scheduled_at),
            outcome: r.outcome.as_str(),
            cause: r.cause.as_str(),
            replica: r.replica.clone(),
            pid: r.pid,
            started_at: r.started_at.map(rfc3339),
            ended_at: rfc3339(r.ended_at),
            duration_ms: r.duration().map(ms),
            fence: r.fence,
            detail: r.detail.clone(),
            output: r.output.clone(),
            clock_offset_ms: r.clock_offset_ms,
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs `distlock cron status`.
///
/// # Errors
/// A bad file, an unreachable server, a backend without run records.
pub async fn run(args: StatusArgs) -> Result<Exit, CliError> {
    let file = file::load(&args.file)?;
    let target = Target::choose(args.server.url);
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
        let records = scheduler.recent(&name, READ).await.map_err(read)?;
        let last_success = scheduler.last_success(&name).await.map_err(read)?;
        let last_failure = scheduler.last_failure(&name).await.map_err(read)?;
        let control = scheduler.control(&name).await.map_err(read)?;
        // The fences holding the job's lock now: a running record without one is abandoned.
        let live: Option<Vec<u64>> = match locker.backend().admin() {
            Some(admin) => Some(
                admin
                    .inspect(&name)
                    .await
                    .map_err(|e| target.error(e))?
                    .iter()
                    .filter_map(|h| h.fence)
                    .collect(),
            ),
            None => None,
        };
        let lines = fire_times(&records, live.as_deref());
        jobs.push(JobReport {
            schedule: spec.schedule.clone(),
            time_zone: spec.time_zone.clone().unwrap_or_else(|| "UTC".to_owned()),
            paused: control.filter(|c| c.paused).map(|c| Paused {
                by: c.changed_by,
                since: rfc3339(c.changed_at),
            }),
            next_fire: next.as_ref().map(|z| z.timestamp().to_string()),
            next_fire_local: next.as_ref().map(ToString::to_string),
            last_success: last_success.as_ref().map(Record::from),
            last_failure: last_failure.as_ref().map(Record::from),
            durations: duration_stats(&records).map(|d| Durations {
                samples: d.samples,
                p50_ms: ms(d.p50),
                p95_ms: ms(d.p95),
                p99_ms: ms(d.p99),
                max_ms: ms(d.max),
                suggested_timeout_ms: ms(d.suggested_timeout),
            }),
            fire_times: lines.iter().take(args.last).map(line).collect(),
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

fn line(l: &FireTimeLine) -> Line {
    Line {
        state: l.state.as_str(),
        runs: l.runs,
        duplicate: l.runs > 1,
        overlaps_next: l.overlaps_next,
        early: l.early,
        record: Record::from(&l.record),
    }
}

fn text(report: &Report) -> String {
    let mut out = format!("server: {} ({})\n", report.url, report.backend);
    for job in &report.jobs {
        out.push_str(&format!(
            "\njob {:?}: {} ({})\n",
            job.name, job.schedule, job.time_zone
        ));
        if let Some(p) = &job.paused {
            out.push_str(&format!(
                "  PAUSED since {} by {} (distlock cron resume {:?})\n",
                p.since, p.by, job.name
            ));
        }
        out.push_str(&format!(
            "  next fire:    {}\n",
            job.next_fire_local.as_deref().unwrap_or("never")
        ));
        for (what, r) in [
            ("last success", &job.last_success),
            ("last failure", &job.last_failure),
        ] {
            match r {
                Some(r) => {
                    out.push_str(&format!("  {what}: {} on {}\n", r.scheduled_at, r.replica))
                }
                None => out.push_str(&format!("  {what}: never\n")),
            }
        }
        if let Some(d) = &job.durations {
            let f = |ms: u64| fmt_duration(Duration::from_millis(ms));
            out.push_str(&format!(
                "  durations:    p50 {}  p95 {}  p99 {}  max {}  over {} runs; suggested timeout {}\n",
                f(d.p50_ms),
                f(d.p95_ms),
                f(d.p99_ms),
                f(d.max_ms),
                d.samples,
                f(d.suggested_timeout_ms)
            ));
        }
        if job.fire_times.is_empty() {
            out.push_str("  fire times:   none recorded\n");
            continue;
        }
        out.push_str("  fire times (newest first):\n");
        let width = job
            .fire_times
            .iter()
            .map(|l| l.record.replica.len())
            .max()
            .unwrap_or(0);
        for l in &job.fire_times {
            let r = &l.record;
            let took = r
                .duration_ms
                .map(|ms| fmt_duration(Duration::from_millis(ms)))
                .unwrap_or_default();
            let mut flags = Vec::new();
            if l.duplicate {
                flags.push(format!("duplicate x{}", l.runs));
            }
            if l.overlaps_next {
                flags.push("overlap".to_owned());
            }
            if l.early {
                flags.push("early".to_owned());
            }
            if r.cause != "schedule" {
                flags.push(r.cause.to_owned());
            }
            let mut line = format!(
                "    {}  {:<12}  {:<width$}  {took:<8}",
                r.scheduled_at, l.state, r.replica
            );
            if let Some(pid) = r.pid {
                line.push_str(&format!("  pid {pid}"));
            }
            if let Some(fence) = r.fence {
                line.push_str(&format!("  fence {fence}"));
            }
            if let Some(ms) = r.clock_offset_ms {
                line.push_str(&format!("  clock {ms:+}ms"));
            }
            if !flags.is_empty() {
                line.push_str(&format!("  [{}]", flags.join(", ")));
            }
            if let Some(d) = &r.detail {
                line.push_str(&format!("  {d}"));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    out
}
