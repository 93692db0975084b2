//! The exclusion checker's fire-time mode: K schedulers (lock-scheduler), each over its own
//! Locker and its own backend instance (memory: one shared in-process backend), each with a
//! seeded random clock offset in −3 s..+3 s, all firing one `every 1s` job whose runs
//! last a seeded random time around the period (most shorter, some longer, so runs would
//! overlap without the lock). A judge in the test process sees every run start
//! and end, with its fire time, replica and fence, and fails the run on:
//!
//! - **duplicate**: two runs of one fire time;
//! - **early**: a run starting before its fire time on the deciding clock, less 50 ms: the
//!   server's clock where the claim answers it (Redis, PostgreSQL: on loopback, the test
//!   process's system clock), else the claiming scheduler's own clock (etcd, memory);
//! - **late**: a run starting past its lateness bound on that clock (plus 250 ms of slack):
//!   it should have been recorded `Missed`;
//! - **overlap**: a run starting while another one has not ended;
//! - **fence**: a run whose fence is not greater than that of the run before it;
//! - **records**: a run without its run record in the lock server, or a record of a run the
//!   judge never saw (replica, fence);
//! - **ran nowhere**: more than half of the fire times of the steady window ran nowhere
//!   (some may: the run before is still going, a replica late past the bound records
//!   `Missed`, a stopped replica's claims; they are counted and their records shown);
//! - **leaks**: a run still going after every scheduler shut down, a lock of the job left on
//!   the server, a Locker's stats not all zeros after its shutdown.
//!
//! The fault: the replica whose clock is furthest ahead is shut down (`Running::shutdown`)
//! at 30 % of the run (`STOP_AT`) and started again at 45 % (`RESTART_AT`), as a new
//! scheduler over the same Locker. That replica reaches every fire time first and so wins
//! every claim: stopping any other replica would change nothing observable. Stopping it
//! hands the fire times over to the next replica, exercises the shutdown's early release of
//! the at-least hold in front of replicas whose clocks are up to 6 s behind (a slow replica
//! then finds the lock free: only the claim stops it from running the fire time again), and
//! the restarted replica must not run a fire time twice.
//! It is a shutdown and restart, not a pause: every replica and the judge live in the test
//! process, so no single replica can be stopped with SIGSTOP, and pausing the server for
//! less than the lateness bound would only delay claims made up to 3 s ahead.
//!
//! `DISTLOCK_CHECK_SEED` replays a seed (the same offsets, period and run lengths, in the
//! order the runs start; not the same interleaving), `DISTLOCK_SOAK_SECS` sets the run's
//! length.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use distlock::records::{RunOutcome, RunRecord};
use distlock::scheduler::jiff::SignedDuration;
use distlock::scheduler::{BoxError, Job, Running, Scheduler};
use distlock::{Backend, Locker, MemoryBackend};
use lock_conformance::exclusion::{resolve_seed, SEED_ENV, SOAK_ENV};
use lock_testkit::{EtcdServer, PostgresServer, RedisServer};

/// Schedulers (replicas) per run.
const REPLICAS: usize = 4;
/// Clock offsets are drawn uniformly in ±this many milliseconds.
const MAX_OFFSET_MS: i64 = 3_000;
/// How much earlier than its fire time a run may start (clock reading, rounding).
const EARLY_MARGIN: Duration = Duration::from_millis(50);
/// How much later than its lateness bound a run may start (scheduling on a loaded machine).
const LATE_SLACK: Duration = Duration::from_millis(250);
/// The job's lateness bound.
const LATENESS: Duration = Duration::from_millis(500);
/// The shutdowns' grace period.
const GRACE: Duration = Duration::from_secs(1);
/// When the replica furthest ahead is stopped, and started again, as parts of the run.
const STOP_AT: f64 = 0.3;
const RESTART_AT: f64 = 0.45;

// ---------------------------------------------------------------------------------------
// Backends
// ---------------------------------------------------------------------------------------

/// What one backend's run is given.
struct Target {
    name: &'static str,
    /// One per replica, each over its own backend instance (memory: one shared).
    lockers: Vec<Locker>,
    /// Whether the claim answers the server's clock (then the judge reads the test
    /// process's system clock, the server's on loopback).
    server_clock: bool,
    /// A backend of its own on the same server, to look for locks left.
    probe: Arc<dyn Backend>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_times_memory() {
    let backend: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    check(Target {
        name: "memory",
        lockers: (0..REPLICAS)
            .map(|_| Locker::with_backend(backend.clone()))
            .collect(),
        server_clock: false,
        probe: backend,
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_times_redis() {
    let server = RedisServer::start().await;
    let url = format!("redis://{}?prefix=fire%3A", server.addr());
    let mut lockers = Vec::new();
    for _ in 0..REPLICAS {
        lockers.push(Locker::new(common::redis_backend(&url).await));
    }
    check(Target {
        name: "redis",
        lockers,
        server_clock: true,
        probe: Arc::new(common::redis_backend(&url).await),
    })
    .await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_times_postgres() {
    let server = PostgresServer::start().await;
    let url = common::postgres_url(server.addr(), "table=fire_times");
    let mut lockers = Vec::new();
    for _ in 0..REPLICAS {
        lockers.push(Locker::new(common::postgres_backend(&url).await));
    }
    check(Target {
        name: "postgres",
        lockers,
        server_clock: true,
        probe: Arc::new(common::postgres_backend(&url).await),
    })
    .await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fire_times_etcd() {
    let server = EtcdServer::start().await;
    let endpoints = [server.endpoint()];
    let mut lockers = Vec::new();
    for _ in 0..REPLICAS {
        lockers.push(Locker::new(
            common::etcd_backend(&endpoints, "prefix=fire/").await,
        ));
    }
    check(Target {
        name: "etcd",
        lockers,
        server_clock: false,
        probe: Arc::new(common::etcd_backend(&endpoints, "prefix=fire/").await),
    })
    .await;
    drop(server);
}

// ---------------------------------------------------------------------------------------
// The seeded plan
// ---------------------------------------------------------------------------------------

/// splitmix64 of `seed` mixed with `stream` and `n`: every random choice of a run.
fn draw(seed: u64, stream: u64, n: u64) -> u64 {
    let mut z =
        seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform draw in `0.0..1.0`.
fn unit(seed: u64, stream: u64, n: u64) -> f64 {
    (draw(seed, stream, n) >> 11) as f64 / (1u64 << 53) as f64
}

const STREAM_OFFSET: u64 = 2;
const STREAM_LENGTH: u64 = 3;

/// What a seed decides.
#[derive(Debug)]
struct Plan {
    seed: u64,
    period: Duration,
    at_least: Duration,
    /// Each replica's clock offset, in milliseconds (negative: behind).
    offsets: Vec<i64>,
    /// How long the schedulers run.
    length: Duration,
    /// The replica stopped and started again (the one furthest ahead).
    restarted: usize,
}

impl Plan {
    fn new(seed: u64) -> Plan {
        // One period: with clock leads up to 3 s, a restart costs about 3 + 3 fire times
        // of a 2 s period, too many for a run of ~20 s to judge the rest.
        let period = Duration::from_secs(1);
        let offsets: Vec<i64> = (0..REPLICAS as u64)
            .map(|r| {
                (draw(seed, STREAM_OFFSET, r) % (2 * MAX_OFFSET_MS as u64 + 1)) as i64
                    - MAX_OFFSET_MS
            })
            .collect();
        let restarted = (0..REPLICAS).max_by_key(|&r| offsets[r]).unwrap();
        let length = std::env::var(SOAK_ENV)
            .ok()
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(Duration::from_secs(18), Duration::from_secs_f64);
        Plan {
            seed,
            period,
            at_least: period / 2,
            offsets,
            length,
            restarted,
        }
    }

    /// How long the `k`-th run to start lasts: 80 % of runs 0.2..0.95 periods, 20 %
    /// 1.05..1.5 periods (the next fire time finds the lock taken and is skipped).
    fn run_length(&self, k: u64) -> Duration {
        let (long, x) = (
            unit(self.seed, STREAM_LENGTH, 2 * k) < 0.2,
            unit(self.seed, STREAM_LENGTH, 2 * k + 1),
        );
        let factor = if long {
            1.05 + 0.45 * x
        } else {
            0.2 + 0.75 * x
        };
        self.period.mul_f64(factor)
    }

    fn offset(&self, replica: usize) -> SignedDuration {
        SignedDuration::from_millis(self.offsets[replica])
    }
}

// ---------------------------------------------------------------------------------------
// The judge
// ---------------------------------------------------------------------------------------

#[derive(Debug)]
struct Run {
    fire: SystemTime,
    replica: usize,
    fence: u64,
    /// The deciding clock's reading at the start, and the system clock's.
    start_clock: SystemTime,
    start_system: SystemTime,
    start: Instant,
    end: Option<Instant>,
}

#[derive(Default)]
struct Judge {
    runs: Vec<Run>,
    /// Runs started and not ended.
    active: BTreeSet<usize>,
    violations: Vec<String>,
    origin: Option<Instant>,
}

impl Judge {
    fn at(&self, t: Instant) -> f64 {
        self.origin
            .map_or(0.0, |o| t.saturating_duration_since(o).as_secs_f64())
    }

    fn violation(&mut self, kind: &str, detail: String) {
        eprintln!("fire times: VIOLATION [{kind}] {detail}");
        self.violations.push(format!("[{kind}] {detail}"));
    }
}

/// The judge, shared by every replica's job.
#[derive(Clone)]
struct Resource {
    judge: Arc<Mutex<Judge>>,
    plan: Arc<Plan>,
    server_clock: bool,
}

/// Ends a run at the judge when dropped: when the run's future ends or is cancelled.
struct RunEnd {
    resource: Resource,
    index: usize,
}

impl Drop for RunEnd {
    fn drop(&mut self) {
        let mut judge = self
            .resource
            .judge
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        judge.runs[self.index].end = Some(Instant::now());
        judge.active.remove(&self.index);
    }
}

impl Resource {
    /// A run of `fire` by `replica` with `fence` starts now: checks it, and returns how
    /// long it lasts and what ends it.
    fn start(
        &self,
        fire: SystemTime,
        replica: usize,
        name: &str,
        fence: u64,
    ) -> (Duration, RunEnd) {
        let start = Instant::now();
        let start_system = SystemTime::now();
        let start_clock = if self.server_clock {
            start_system
        } else {
            shift(start_system, self.plan.offsets[replica])
        };
        let clock = if self.server_clock {
            "the server's clock"
        } else {
            "the claiming scheduler's own clock"
        };
        let mut judge = self.judge.lock().unwrap_or_else(|e| e.into_inner());
        let index = judge.runs.len();
        let me = format!(
            "run #{index} of fire time {} by r{replica} (fence {fence}) at +{:.3}s",
            secs(fire),
            judge.at(start)
        );
        if name != format!("r{replica}") {
            judge.violation(
                "context",
                format!("{me}: the context names replica {name:?}"),
            );
        }
        let since_epoch = fire.duration_since(UNIX_EPOCH).unwrap_or_default();
        if !since_epoch
            .as_nanos()
            .is_multiple_of(self.plan.period.as_nanos())
        {
            judge.violation(
                "schedule",
                format!("{me}: not a fire time of every {:?}", self.plan.period),
            );
        }
        if let Some(other) = judge.runs.iter().find(|r| r.fire == fire) {
            let detail = format!(
                "{me}: fire time already ran on r{} (fence {}) at +{:.3}s",
                other.replica,
                other.fence,
                judge.at(other.start)
            );
            judge.violation("duplicate", detail);
        }
        if start_clock + EARLY_MARGIN < fire {
            let detail = format!(
                "{me}: started {:.3}s before its fire time on {clock}",
                signed(fire, start_clock)
            );
            judge.violation("early", detail);
        }
        if start_clock > fire + LATENESS + LATE_SLACK {
            let detail = format!(
                "{me}: started {:.3}s after its fire time on {clock}, past the lateness bound \
                 of {LATENESS:?} (it should be Missed)",
                signed(start_clock, fire)
            );
            judge.violation("late", detail);
        }
        let active: Vec<usize> = judge.active.iter().copied().collect();
        for other in active {
            let o = &judge.runs[other];
            let detail = format!(
                "{me}: run #{other} of fire time {} by r{} (fence {}, since +{:.3}s) has not \
                 ended",
                secs(o.fire),
                o.replica,
                o.fence,
                judge.at(o.start)
            );
            judge.violation("overlap", detail);
        }
        if let Some(last) = judge.runs.last() {
            if fence <= last.fence {
                let detail = format!(
                    "{me}: the run before (fire time {} by r{}) had fence {}",
                    secs(last.fire),
                    last.replica,
                    last.fence
                );
                judge.violation("fence", detail);
            }
        }
        judge.runs.push(Run {
            fire,
            replica,
            fence,
            start_clock,
            start_system,
            start,
            end: None,
        });
        judge.active.insert(index);
        drop(judge);
        (
            self.plan.run_length(index as u64),
            RunEnd {
                resource: self.clone(),
                index,
            },
        )
    }

    /// The job as `replica` registers it.
    fn job(&self, name: &str, replica: usize) -> Job {
        let resource = self.clone();
        Job::every(name, self.plan.period)
            .expect("a valid job")
            .at_least(self.plan.at_least)
            .lateness(LATENESS)
            .run(move |ctx| {
                let (length, end) =
                    resource.start(ctx.scheduled_at(), replica, ctx.replica(), ctx.fence());
                async move {
                    let _end = end;
                    tokio::time::sleep(length).await;
                    Ok::<_, BoxError>(())
                }
            })
    }

    /// A scheduler for `replica`, started.
    fn start_replica(&self, locker: &Locker, name: &str, replica: usize) -> Running {
        let scheduler = Scheduler::builder(locker.clone())
            .replica(format!("r{replica}"))
            .clock_offset(self.plan.offset(replica))
            .keep(1_000)
            .build()
            .expect("a scheduler");
        scheduler.add(self.job(name, replica)).expect("the job");
        scheduler.start().expect("started")
    }
}

fn shift(t: SystemTime, ms: i64) -> SystemTime {
    let d = Duration::from_millis(ms.unsigned_abs());
    if ms < 0 {
        t - d
    } else {
        t + d
    }
}

/// `a − b` in seconds.
fn signed(a: SystemTime, b: SystemTime) -> f64 {
    match a.duration_since(b) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

/// A fire time as seconds since the epoch, modulo 10⁴ (short, and enough in one run).
fn secs(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("…{:04}.{:03}", d.as_secs() % 10_000, d.subsec_millis())
}

/// The first fire time at or after `t`.
fn ceil_fire(t: SystemTime, period: Duration) -> SystemTime {
    let n = t.duration_since(UNIX_EPOCH).unwrap().as_nanos();
    let p = period.as_nanos();
    let k = n.div_ceil(p);
    UNIX_EPOCH + Duration::from_nanos((k * p) as u64)
}

// ---------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------

async fn check(target: Target) {
    let began = Instant::now();
    let plan = Arc::new(Plan::new(resolve_seed(None)));
    let seed = plan.seed;
    let name = target.name;
    let job = format!("fire/job-{:08x}", common::rand_u32());
    eprintln!(
        "fire times [{name}]: seed {seed} (replay: {SEED_ENV}={seed}); {REPLICAS} replicas, \
         clock offsets {:?} ms, every {:?} (at least {:?}, lateness {LATENESS:?}), {:?}; r{} \
         (furthest ahead) stopped at {:.0} % and started again at {:.0} %; {}",
        plan.offsets,
        plan.period,
        plan.at_least,
        plan.length,
        plan.restarted,
        STOP_AT * 100.0,
        RESTART_AT * 100.0,
        if target.server_clock {
            "the server's clock decides"
        } else {
            "no server clock: each claimer's own clock decides"
        }
    );
    assert!(
        target.probe.fire_claims().is_some() && target.probe.run_records().is_some(),
        "[{name}] the backend must keep fire-time claims and run records"
    );
    let admin = target
        .probe
        .admin()
        .unwrap_or_else(|| panic!("[{name}] the backend cannot inspect a lock"));
    let resource = Resource {
        judge: Arc::default(),
        plan: plan.clone(),
        server_clock: target.server_clock,
    };
    let t0 = Instant::now();
    let t0_wall = SystemTime::now();
    resource.judge.lock().unwrap().origin = Some(t0);
    let mut running: Vec<Option<Running>> = target
        .lockers
        .iter()
        .enumerate()
        .map(|(r, locker)| Some(resource.start_replica(locker, &job, r)))
        .collect();

    // The fault: the replica furthest ahead stopped, then started again.
    let r = plan.restarted;
    tokio::time::sleep_until((t0 + plan.length.mul_f64(STOP_AT)).into()).await;
    let stopped_at = SystemTime::now();
    let report = running[r].take().unwrap().shutdown(GRACE).await;
    eprintln!(
        "fire times [{name}]: +{:.3}s r{r} shut down ({} runs finished in the grace, {} cut)",
        t0.elapsed().as_secs_f64(),
        report.finished.len(),
        report.cut.len()
    );
    tokio::time::sleep_until((t0 + plan.length.mul_f64(RESTART_AT)).into()).await;
    let restarted_at = SystemTime::now();
    running[r] = Some(resource.start_replica(&target.lockers[r], &job, r));
    eprintln!(
        "fire times [{name}]: +{:.3}s r{r} started again",
        t0.elapsed().as_secs_f64()
    );
    tokio::time::sleep_until((t0 + plan.length).into()).await;
    let end_wall = SystemTime::now();
    futures::future::join_all(
        running
            .into_iter()
            .map(|handle| handle.unwrap().shutdown(GRACE)),
    )
    .await;
    let ended = t0.elapsed();

    // What the lock server recorded (every replica's records of the job).
    let records: Vec<RunRecord> = target
        .probe
        .run_records()
        .unwrap()
        .recent(&job, 1_000)
        .await
        .unwrap_or_else(|e| panic!("[{name}] reading the run records: {e}"));
    // No lock left, and every Locker idle once shut down.
    let left = admin.inspect(&job).await;
    let mut leaks = Vec::new();
    match left {
        Ok(holders) if holders.is_empty() => {}
        Ok(holders) => leaks.push(format!(
            "the job's lock is still held on the server after every scheduler shut down: \
             {holders:?}"
        )),
        Err(e) => leaks.push(format!("inspecting the job's lock failed: {e}")),
    }
    for (r, locker) in target.lockers.iter().enumerate() {
        if tokio::time::timeout(Duration::from_secs(10), locker.shutdown())
            .await
            .is_err()
        {
            leaks.push(format!("r{r}: Locker::shutdown did not finish within 10 s"));
        }
        let stats = locker.stats();
        if stats.held != 0 || stats.queued_keys != 0 || stats.background_tasks != 0 {
            leaks.push(format!(
                "r{r}: stats after shutdown are {stats:?}, not all zeros"
            ));
        }
    }

    let mut judge = resource.judge.lock().unwrap();
    for detail in leaks {
        judge.violation("leak", detail);
    }
    let still: Vec<usize> = judge.active.iter().copied().collect();
    for i in still {
        let detail = format!(
            "run #{i} of fire time {} by r{} is still going after every scheduler shut down",
            secs(judge.runs[i].fire),
            judge.runs[i].replica
        );
        judge.violation("leak", detail);
    }

    // Runs and records agree: every run has its record, every record of a run was seen.
    let started: Vec<&RunRecord> = records.iter().filter(|r| r.started_at.is_some()).collect();
    let mut record_problems = Vec::new();
    for (i, run) in judge.runs.iter().enumerate() {
        let replica = format!("r{}", run.replica);
        if !started.iter().any(|rec| {
            rec.scheduled_at == run.fire && rec.replica == replica && rec.fence == Some(run.fence)
        }) {
            record_problems.push(format!(
                "run #{i} of fire time {} by {replica} (fence {}) has no record of a run",
                secs(run.fire),
                run.fence
            ));
        }
    }
    for rec in &started {
        if !judge.runs.iter().any(|run| {
            run.fire == rec.scheduled_at
                && format!("r{}", run.replica) == rec.replica
                && Some(run.fence) == rec.fence
        }) {
            record_problems.push(format!(
                "a record of a run the judge never saw: fire time {} by {} (fence {:?}, {:?})",
                secs(rec.scheduled_at),
                rec.replica,
                rec.fence,
                rec.outcome
            ));
        }
    }
    for detail in record_problems {
        judge.violation("records", detail);
    }

    // The steady window: from the first fire time every replica was up for (the one
    // furthest ahead starts at its clock's now) to two periods before the end.
    let max_offset = *plan.offsets.iter().max().unwrap();
    let first = ceil_fire(shift(t0_wall, max_offset.max(0)) + plan.period, plan.period);
    let last = end_wall - plan.period * 2;
    let mut window = Vec::new();
    let mut f = first;
    while f <= last {
        window.push(f);
        f += plan.period;
    }
    let ran: BTreeSet<SystemTime> = judge.runs.iter().map(|r| r.fire).collect();
    // Fire times the restart costs, by design: those the stopped replica claimed ahead
    // (its lead, on backends where it waits for the server's clock), those while it was
    // down (the others' claims of them can be refused by its claims ahead, and replicas
    // late past the bound record them Missed), and those its restart skips (it starts at
    // the first fire time after its clock's now, and that claim moves the claimed fire
    // time past the ones before it, which nobody can claim any more). Counted apart.
    let lead = Duration::from_millis(plan.offsets[r].max(0) as u64);
    let in_fault = |f: &SystemTime| *f > stopped_at && *f <= restarted_at + lead + plan.period;
    let nowhere: Vec<SystemTime> = window
        .iter()
        .copied()
        .filter(|f| !ran.contains(f))
        .collect();
    let judged = window.iter().filter(|f| !in_fault(f)).count();
    let lost_to_fault = nowhere.iter().filter(|f| in_fault(f)).count();
    let nowhere_judged = nowhere.len() - lost_to_fault;
    let mut by_fire: BTreeMap<SystemTime, Vec<&RunRecord>> = BTreeMap::new();
    for rec in &records {
        by_fire.entry(rec.scheduled_at).or_default().push(rec);
    }
    let mut causes = String::new();
    for f in &nowhere {
        let seen: Vec<String> = by_fire
            .get(f)
            .map(|recs| {
                recs.iter()
                    .map(|r| {
                        format!(
                            "{} {:?}: {}",
                            r.replica,
                            r.outcome,
                            r.detail.as_deref().unwrap_or("")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let _ = writeln!(
            causes,
            "    {} ran nowhere{}; records: {}",
            secs(*f),
            if in_fault(f) { " (restart)" } else { "" },
            if seen.is_empty() {
                "none (claimed by a replica that did not run it, or skipped by a claim after \
                 it)"
                .to_owned()
            } else {
                seen.join("; ")
            }
        );
    }
    if judged < 4 {
        judge.violation(
            "ran nowhere",
            format!(
                "the steady window holds only {judged} fire times outside the restart: the run \
                 is too short to judge"
            ),
        );
    } else if nowhere_judged * 2 > judged {
        judge.violation(
            "ran nowhere",
            format!(
                "{nowhere_judged} of the {judged} fire times of the steady window outside the \
                 restart ran nowhere: the schedulers are not running the job"
            ),
        );
    }

    // What happened, for the report.
    let mut wins = vec![0usize; REPLICAS];
    for run in &judge.runs {
        wins[run.replica] += 1;
    }
    let mut outcomes: BTreeMap<String, usize> = BTreeMap::new();
    for rec in &records {
        *outcomes
            .entry(format!("{}:{:?}", rec.replica, rec.outcome))
            .or_default() += 1;
    }
    let missed = records
        .iter()
        .filter(|r| r.outcome == RunOutcome::Missed)
        .count();
    // How far the runs' starts were from their fire times on the system clock (real time,
    // the servers' on loopback): on backends without a server clock, a replica whose clock
    // is ahead starts its runs that much early in real time.
    let early = judge
        .runs
        .iter()
        .map(|r| signed(r.fire, r.start_system))
        .fold(f64::NEG_INFINITY, f64::max);
    let delay = judge
        .runs
        .iter()
        .map(|r| signed(r.start_clock, r.fire))
        .fold(f64::NEG_INFINITY, f64::max);
    let after_restart = judge
        .runs
        .iter()
        .filter(|r| r.fire > stopped_at)
        .map(|r| r.replica)
        .collect::<BTreeSet<_>>();
    let violations = std::mem::take(&mut judge.violations);
    let mut report = String::new();
    let _ = writeln!(
        report,
        "fire times [{name}]: seed {seed} ({SEED_ENV}={seed}), every {:?}, offsets {:?} ms, \
         {:.1}s of schedulers, {:.1}s in all",
        plan.period,
        plan.offsets,
        ended.as_secs_f64(),
        began.elapsed().as_secs_f64()
    );
    let _ = writeln!(
        report,
        "  runs: {} (wins per replica {:?}; replicas running fire times after r{r}'s stop: \
         {after_restart:?}); steady window {} fire times: {judged} outside the restart, \
         {nowhere_judged} of them ran nowhere; {lost_to_fault} lost to the restart; {missed} \
         Missed records; records {outcomes:?}",
        judge.runs.len(),
        wins,
        window.len(),
    );
    if judge.runs.is_empty() {
        let _ = writeln!(report, "  starts: no run started");
    } else {
        let _ = writeln!(
            report,
            "  starts: at most {delay:.3}s after the fire time on the deciding clock; at most \
             {:.3}s before it in real time",
            early.max(0.0)
        );
    }
    report.push_str(&causes);
    if violations.is_empty() {
        let _ = writeln!(report, "  no violations");
    } else {
        let _ = writeln!(report, "  VIOLATIONS: {}", violations.len());
        for v in &violations {
            let _ = writeln!(report, "  - {v}");
        }
    }
    let _ = write!(report, "  seed {seed} ({SEED_ENV}={seed})");
    eprintln!("{report}");
    if judge.runs.is_empty() {
        panic!("fire-time checker FAILED: nothing ran\n{report}");
    }
    if !violations.is_empty() {
        panic!("fire-time checker FAILED\n{report}");
    }
}
