//! Scheduled jobs on replicas whose clocks disagree, over real Redis, PostgreSQL and etcd
//! servers: each replica has a clock of its own (the system clock shifted, or stepped
//! while it runs), not a view of one shared clock. Each fire time runs exactly once, never
//! before its fire time on the lock server's clock (where the server has one: etcd has
//! none, and a fast replica there starts by its own clock), and the on-time replicas keep
//! winning.
//!
//! The periods are scaled down from the field's (`every 10s`, 6 s behind) to keep the run
//! short: `every 2s` with 1.2 s behind breaks the old rule the same way (more than the
//! default at-least hold of half the period).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use distlock::scheduler::jiff::SignedDuration;
use distlock::scheduler::{BoxError, Clock, Job, Running, Scheduler, Sleep};
use distlock::Locker;
use lock_testkit::{EtcdServer, PostgresServer, RedisServer};

/// A run as the job saw it: replica, fire time, start on the test process's clock (the
/// servers' clock on loopback).
type Run = (String, SystemTime, SystemTime);

#[derive(Clone, Default)]
struct Runs(Arc<Mutex<Vec<Run>>>);

impl Runs {
    fn job(&self, job: Job) -> Job {
        let runs = self.clone();
        job.run(move |ctx| {
            let runs = runs.clone();
            async move {
                let started = SystemTime::now();
                runs.0.lock().unwrap().push((
                    ctx.replica().to_owned(),
                    ctx.scheduled_at(),
                    started,
                ));
                Ok::<_, BoxError>(())
            }
        })
    }

    fn get(&self) -> Vec<Run> {
        self.0.lock().unwrap().clone()
    }
}

/// A clock of its own: the system clock shifted by an offset that can be stepped while the
/// scheduler runs (an NTP step, a VM restored from a snapshot).
#[derive(Clone, Default)]
struct SteppedClock(Arc<AtomicI64>);

impl SteppedClock {
    fn step(&self, by_ms: i64) {
        self.0.fetch_add(by_ms, Ordering::SeqCst);
    }
}

impl Clock for SteppedClock {
    fn now(&self) -> SystemTime {
        let offset = self.0.load(Ordering::SeqCst);
        let magnitude = Duration::from_millis(offset.unsigned_abs());
        if offset < 0 {
            SystemTime::now() - magnitude
        } else {
            SystemTime::now() + magnitude
        }
    }

    fn sleep_until(&self, at: SystemTime) -> Sleep {
        let clock = self.clone();
        Box::pin(async move {
            while let Ok(left) = at.duration_since(clock.now()) {
                if left.is_zero() {
                    return;
                }
                tokio::time::sleep(left.min(Duration::from_millis(100))).await;
            }
        })
    }
}

/// The lock servers, each a URL for `distlock::connect`, and whether it has a clock.
struct Servers {
    _redis: RedisServer,
    _postgres: PostgresServer,
    _etcd: EtcdServer,
    urls: Vec<(String, bool)>,
}

async fn servers() -> Servers {
    let (redis, postgres, etcd) = tokio::join!(
        RedisServer::start(),
        PostgresServer::start(),
        EtcdServer::start()
    );
    let urls = vec![
        (redis.url(), true),
        (postgres.url(), true),
        (etcd.url(), false),
    ];
    Servers {
        _redis: redis,
        _postgres: postgres,
        _etcd: etcd,
        urls,
    }
}

/// A replica on its own connection to `url`.
async fn replica(url: &str, id: &str, clock: Option<SteppedClock>, offset_ms: i64) -> Scheduler {
    let locker: Locker = distlock::connect(url).await.expect("connect");
    let mut builder = Scheduler::builder(locker).replica(id);
    builder = match clock {
        Some(clock) => builder.clock(clock),
        None => builder.clock_offset(SignedDuration::from_millis(offset_ms)),
    };
    builder.build().expect("scheduler")
}

async fn stop(running: Vec<Running>) {
    for handle in running {
        handle.shutdown(Duration::from_secs(10)).await;
    }
}

/// No fire time ran twice; none started before its fire time by more than `margin`.
fn once_and_not_early(url: &str, runs: &[Run], margin: Duration) {
    let mut fires: Vec<SystemTime> = runs.iter().map(|r| r.1).collect();
    fires.sort();
    let all = fires.len();
    fires.dedup();
    assert_eq!(all, fires.len(), "{url}: a fire time ran twice: {runs:?}");
    for (replica, fire, started) in runs {
        assert!(
            *started + margin >= *fire,
            "{url}: {replica} started {:?} before its fire time",
            fire.duration_since(*started).unwrap_or_default()
        );
    }
}

/// Three replicas, one 1.2 s behind (more than the default at-least hold of 1 s on
/// `every 2s`): every fire time runs once and on time. Where the server has a clock the
/// late replica goes by it (and may win); without one (etcd) it finds each fire time
/// claimed when its clock gets there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_behind_never_runs_a_fire_time_again() {
    let servers = servers().await;
    for (url, has_clock) in &servers.urls {
        let runs = Runs::default();
        let mut running = Vec::new();
        for (id, offset) in [("on-time-1", 0), ("on-time-2", 0), ("behind", -1200)] {
            let scheduler = replica(url, id, None, offset).await;
            let job = Job::every("clocks/behind", Duration::from_secs(2)).unwrap();
            scheduler.add(runs.job(job)).unwrap();
            running.push(scheduler.start().unwrap());
        }
        // A fire time before every replica ran may fall to the late one alone.
        let all_started = SystemTime::now();
        tokio::time::sleep(Duration::from_millis(7500)).await;
        stop(running).await;
        let runs = runs.get();
        once_and_not_early(url, &runs, Duration::from_millis(50));
        let judged: Vec<_> = runs.iter().filter(|r| r.1 > all_started).collect();
        assert!(judged.len() >= 2, "{url}: fire times ran: {runs:?}");
        if *has_clock {
            // The late replica waits for fire times on the server's clock (its first claim
            // measured it): when it wins one, it runs it on time.
            for (replica, fire, started) in &judged {
                let late = started.duration_since(*fire).unwrap_or_default();
                assert!(
                    late < Duration::from_millis(500),
                    "{url}: {replica} ran {late:?} after the fire time: {runs:?}"
                );
            }
        } else {
            // Without a server clock it claims 1.2 s late: each fire time is taken by then.
            assert!(
                judged.iter().all(|r| r.0 != "behind"),
                "{url}: the late replica ran a fire time: {runs:?}"
            );
        }
    }
}

/// A replica 1.5 s ahead on a daily job claims the fire time first and waits for the
/// server's clock: it runs once, on time (where the server has a clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_ahead_runs_a_daily_job_on_the_servers_time() {
    let servers = servers().await;
    for (url, has_clock) in &servers.urls {
        // A daily fire time 3 s from now, in whole seconds (UTC).
        let now = distlock::scheduler::jiff::Timestamp::now();
        let fire = distlock::scheduler::jiff::Timestamp::from_second(now.as_second() + 3).unwrap();
        let at = fire.to_zoned(distlock::scheduler::jiff::tz::TimeZone::UTC);
        let expression = format!("{} {} {} * * *", at.second(), at.minute(), at.hour());
        let runs = Runs::default();
        let mut running = Vec::new();
        for (id, offset) in [("ahead", 1500), ("on-time", 0)] {
            let scheduler = replica(url, id, None, offset).await;
            let job = Job::cron("clocks/close-the-day", &expression)
                .unwrap()
                .time_zone("UTC")
                .unwrap();
            scheduler.add(runs.job(job)).unwrap();
            running.push(scheduler.start().unwrap());
        }
        tokio::time::sleep(Duration::from_millis(4500)).await;
        stop(running).await;
        let runs = runs.get();
        assert_eq!(runs.len(), 1, "{url}: one run of the day: {runs:?}");
        assert_eq!(runs[0].1, SystemTime::from(fire), "{url}");
        if *has_clock {
            once_and_not_early(url, &runs, Duration::from_millis(50));
        }
    }
}

/// A replica whose clock steps back 10 minutes right after its run keeps the lock no
/// longer than its at-least hold (counted on the monotonic clock): the other replica,
/// started while that hold is on, runs the next fire times, each once.
///
/// The stepped replica runs alone until its first run is over: with a server clock both
/// replicas go by the server's time, so which one wins a shared first fire time is a race.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_stepped_back_inside_the_hold_does_not_stretch_it() {
    let servers = servers().await;
    for (url, _) in &servers.urls {
        let runs = Runs::default();
        let stepped = SteppedClock::default();
        let first = Arc::new(Mutex::new(None::<SystemTime>));
        let a = replica(url, "stepped", Some(stepped.clone()), 0).await;
        let (clock, seen) = (stepped.clone(), first.clone());
        let job = Job::every("clocks/stepped", Duration::from_secs(2))
            .unwrap()
            .at_least(Duration::from_millis(1500));
        let noted = runs.clone();
        a.add(job.run(move |ctx| {
            let (clock, seen, noted) = (clock.clone(), seen.clone(), noted.clone());
            async move {
                noted.0.lock().unwrap().push((
                    ctx.replica().to_owned(),
                    ctx.scheduled_at(),
                    SystemTime::now(),
                ));
                if seen.lock().unwrap().replace(ctx.scheduled_at()).is_none() {
                    clock.step(-600_000);
                }
                Ok::<_, BoxError>(())
            }
        }))
        .unwrap();
        let mut running = vec![a.start().unwrap()];
        let waited = tokio::time::Instant::now();
        let first = loop {
            if let Some(first) = *first.lock().unwrap() {
                break first;
            }
            assert!(
                waited.elapsed() < Duration::from_secs(5),
                "{url}: the stepped replica ran no fire time in 5 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let b = replica(url, "steady", None, 0).await;
        b.add(
            runs.job(
                Job::every("clocks/stepped", Duration::from_secs(2))
                    .unwrap()
                    .at_least(Duration::from_millis(1500)),
            ),
        )
        .unwrap();
        running.push(b.start().unwrap());
        tokio::time::sleep(Duration::from_millis(5500)).await;
        stop(running).await;
        let runs = runs.get();
        once_and_not_early(url, &runs, Duration::from_millis(50));
        let later: Vec<_> = runs.iter().filter(|r| r.1 > first).collect();
        assert!(
            later.len() >= 2 && later.iter().all(|r| r.0 == "steady"),
            "{url}: after the step the steady replica runs each fire time: {runs:?}"
        );
    }
}

/// A replica ahead by more than the period learns the server's clock from its first
/// claim and waits for fire times on it, so it never claims a fire time before the
/// earlier ones were claimed: every fire time runs once, none runs nowhere (where the
/// server has a clock; on etcd such a replica may leave a fire time unclaimed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_ahead_by_more_than_the_period_leaves_no_fire_time_behind() {
    let servers = servers().await;
    for (url, has_clock) in &servers.urls {
        let runs = Runs::default();
        let mut running = Vec::new();
        for (id, offset) in [("far-ahead", 2500), ("on-time", 0), ("behind", -700)] {
            let scheduler = replica(url, id, None, offset).await;
            let job = Job::every("clocks/far-ahead", Duration::from_secs(2)).unwrap();
            scheduler.add(runs.job(job)).unwrap();
            running.push(scheduler.start().unwrap());
        }
        let all_started = SystemTime::now();
        tokio::time::sleep(Duration::from_millis(7500)).await;
        let ended = SystemTime::now();
        stop(running).await;
        let runs = runs.get();
        let margin = if *has_clock { 50 } else { 2600 };
        once_and_not_early(url, &runs, Duration::from_millis(margin));
        if *has_clock {
            // Every fire time from a period after the start to a second before the end.
            let first = all_started + Duration::from_secs(2);
            let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
            let expected: Vec<u64> = (secs(first) + 1..secs(ended) - 1)
                .filter(|s| s % 2 == 0)
                .collect();
            let ran: Vec<u64> = runs.iter().map(|r| secs(r.1)).collect();
            for fire in &expected {
                assert!(
                    ran.contains(fire),
                    "{url}: fire time {fire} ran nowhere: {runs:?}"
                );
            }
        }
    }
}

/// Replicas starting with clocks far off (6 s behind, then 5 s ahead, on `every 2s`) start
/// from the server's clock: the late one claims no fire time already past on the server
/// (which it would only find missed), the fast one finds none "missed while no replica
/// ran" that is still to come; nothing is recorded missed, and each fire time runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_starting_with_clocks_off_record_nothing_missed() {
    let servers = servers().await;
    for (url, has_clock) in servers.urls.iter().filter(|(_, clock)| *clock) {
        let runs = Runs::default();
        let mut running = Vec::new();
        let mut schedulers = Vec::new();
        for (id, offset) in [("behind", -6000), ("ahead", 5000)] {
            let scheduler = replica(url, id, None, offset).await;
            let job = Job::every("clocks/starting", Duration::from_secs(2)).unwrap();
            scheduler.add(runs.job(job)).unwrap();
            running.push(scheduler.start().unwrap());
            schedulers.push(scheduler);
        }
        tokio::time::sleep(Duration::from_millis(5500)).await;
        stop(running).await;
        let runs = runs.get();
        let margin = if *has_clock { 50 } else { 5100 };
        once_and_not_early(url, &runs, Duration::from_millis(margin));
        assert!(runs.len() >= 2, "{url}: fire times ran: {runs:?}");
        let records = schedulers[0].recent("clocks/starting", 100).await.unwrap();
        let missed: Vec<_> = records
            .iter()
            .filter(|r| r.outcome == distlock::scheduler::RunOutcome::Missed)
            .collect();
        assert!(missed.is_empty(), "{url}: missed: {missed:#?}");
    }
}
