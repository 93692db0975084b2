//! The rules of the higher-level helpers: `run`, `acquire_many`, many tasks, shutdown.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::target::{opts, slack, Target};
use lock_core::{Error, LockOptions, Locker, Outcome};

struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// `run` reports Ran / Skipped / TimedOut / LockLost correctly and cancels the job.
pub async fn run_reports_outcomes_and_cancels_the_job(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("run");
    let ttl = t.short_ttl();

    let ran = a.run(&key, &opts(ttl), async { 7 }).await.unwrap();
    assert_eq!(ran, Outcome::Ran(7));
    assert!(
        b.try_acquire(&key).await.unwrap().is_some_and(|g| {
            drop(g);
            true
        }),
        "the lock is released after the job"
    );
    b.settle().await;

    let holder = b
        .acquire(&key, &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    let skipped = a.run(&key, &opts(ttl), async { 1 }).await.unwrap();
    assert_eq!(skipped, Outcome::Skipped);
    let skipped = a
        .run(
            &key,
            &opts(ttl).wait_for(Duration::from_millis(100)),
            async { 1 },
        )
        .await
        .unwrap();
    assert_eq!(skipped, Outcome::Skipped);
    holder.release().await.unwrap();

    let cancelled = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let job = {
        let (flag, finished) = (DropFlag(cancelled.clone()), finished.clone());
        async move {
            let _flag = flag;
            tokio::time::sleep(Duration::from_secs(30)).await;
            finished.store(true, Ordering::SeqCst);
        }
    };
    let started = Instant::now();
    let timed_out = a
        .run(
            &key,
            &opts(ttl).job_timeout(Duration::from_millis(200)),
            job,
        )
        .await
        .unwrap();
    assert_eq!(timed_out, Outcome::TimedOut);
    assert!(started.elapsed() < Duration::from_millis(200) + slack(t) * 2);
    assert!(cancelled.load(Ordering::SeqCst) && !finished.load(Ordering::SeqCst));
    let after = b.try_acquire(&key).await.unwrap();
    assert!(after.is_some(), "the lock is released after a timeout");
    drop(after);
    b.settle().await;

    if !t.revocable("run_reports_outcomes_and_cancels_the_job") {
        return;
    }
    let cancelled = Arc::new(AtomicBool::new(false));
    let job = {
        let flag = DropFlag(cancelled.clone());
        async move {
            let _flag = flag;
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
    };
    let revoker = {
        let (t, key) = (t.clone(), key.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            t.revoke(&key).await;
        })
    };
    let started = Instant::now();
    let lost = a.run(&key, &opts(ttl), job).await.unwrap();
    assert_eq!(lost, Outcome::LockLost);
    assert!(cancelled.load(Ordering::SeqCst), "the job was cancelled");
    assert!(started.elapsed() <= Duration::from_millis(100) + ttl + slack(t));
    revoker.await.unwrap();
}

/// `run` with `at_least` keeps the lock until that long after the grant although the job
/// ended at once (another Locker is refused meanwhile, the watchdog renewing a TTL shorter
/// than the hold), then releases it.
///
/// The TTL is 1 s, not the 300 ms [`Target::short_ttl`]: a loss ends the hold (nothing is
/// left to keep), and over a 2 s hold a loaded machine once stalled a 300 ms TTL's
/// renewals on PostgreSQL long enough to lose it, so that `run` returned at 1.76 s.
pub async fn run_keeps_the_lock_for_its_at_least_hold(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("run-at-least");
    let ttl = t.short_ttl().max(Duration::from_secs(1));
    let hold = ttl * 2;
    let (ended, job_ended) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let run = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move {
            let job = async move {
                let _ = ended.send(());
            };
            a.run(&key, &opts(ttl).at_least(hold), job).await
        })
    };
    job_ended.await.expect("the job ran");
    assert!(
        b.try_acquire(&key).await.unwrap().is_none(),
        "the lock is kept after a quick job, within its at-least hold"
    );
    let outcome = run.await.expect("the run task").unwrap();
    assert_eq!(outcome, Outcome::Ran(()));
    assert!(
        started.elapsed() >= hold,
        "run returned {:?} after it started, before its at-least hold of {hold:?}",
        started.elapsed()
    );
    let after = b.try_acquire(&key).await.unwrap();
    assert!(after.is_some(), "the lock is released after the hold");
    drop(after);
    b.settle().await;
}

/// `acquire_many` is all-or-nothing and never deadlocks against a reversed order.
pub async fn acquire_many_never_deadlocks(t: &Target) {
    let keys: Vec<String> = (0..3).map(|i| t.key(&format!("many{i}"))).collect();
    let reversed: Vec<String> = keys.iter().rev().cloned().collect();
    let (a, b) = (t.locker(), t.locker());
    let o = opts(Duration::from_secs(10)).wait_forever();
    let rounds = 10;
    let run = |locker: Locker, keys: Vec<String>, o: LockOptions| async move {
        for _ in 0..rounds {
            let guards = locker.acquire_many(&keys, &o).await.unwrap();
            assert_eq!(guards.len(), 3);
            tokio::task::yield_now().await;
            for g in guards {
                g.release().await.unwrap();
            }
        }
    };
    let both = futures::future::join(
        tokio::spawn(run(a.clone(), keys.clone(), o.clone())),
        tokio::spawn(run(b.clone(), reversed, o.clone())),
    );
    let (x, y) = tokio::time::timeout(Duration::from_secs(30), both)
        .await
        .expect("acquire_many in opposite orders must not deadlock");
    x.unwrap();
    y.unwrap();

    let blocker = b
        .acquire(&keys[1], &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    let result = a.acquire_many(&keys, &opts(Duration::from_secs(10))).await;
    assert!(
        matches!(result, Err(Error::Locked { .. })),
        "got {result:?}"
    );
    let first = b.try_acquire(&keys[0]).await.unwrap();
    assert!(
        first.is_some(),
        "a failed acquire_many releases what it took"
    );
    drop(first);
    blocker.release().await.unwrap();
}

/// N tasks × M rounds on one key never overlap (checked with a shared counter and with
/// fence order).
pub async fn tasks_never_overlap(t: &Target) {
    let key = t.key("overlap");
    let inside = Arc::new(AtomicUsize::new(0));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let (lockers, per_locker, rounds) = (3, 4, 15);
    for _ in 0..lockers {
        let locker = t.locker();
        for _ in 0..per_locker {
            let (locker, key, inside, fences) =
                (locker.clone(), key.clone(), inside.clone(), fences.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..rounds {
                    let g = locker
                        .acquire(&key, &opts(Duration::from_secs(10)).wait_forever())
                        .await
                        .unwrap();
                    assert_eq!(
                        inside.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two holders at once"
                    );
                    lock_core::sync::lock(&fences).push(g.fence());
                    tokio::task::yield_now().await;
                    assert_eq!(
                        inside.fetch_sub(1, Ordering::SeqCst),
                        1,
                        "two holders at once"
                    );
                    g.release().await.unwrap();
                }
            }));
        }
    }
    let all = futures::future::join_all(tasks);
    for r in tokio::time::timeout(Duration::from_secs(60), all)
        .await
        .expect("no stall")
    {
        r.unwrap();
    }
    let fences = lock_core::sync::lock(&fences).clone();
    assert_eq!(fences.len(), lockers * per_locker * rounds);
    if t.caps().monotonic_fencing {
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "fences in order of entry must strictly increase"
        );
    }
}

/// `shutdown` releases every lock still held through the Locker (their `lost()` fires),
/// waits for background releases, and refuses later acquires.
pub async fn shutdown_releases_every_held_lock(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let keys: Vec<String> = (0..3).map(|i| t.key(&format!("shutdown{i}"))).collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(
            a.acquire(key, &opts(Duration::from_secs(10)))
                .await
                .unwrap(),
        );
    }
    // One more dropped just before shutdown: its background release must be awaited too.
    drop(
        a.acquire(&t.key("shutdown-dropped"), &opts(Duration::from_secs(10)))
            .await
            .unwrap(),
    );
    let lost: Vec<_> = guards.iter().map(|g| g.lost()).collect();
    a.shutdown().await;
    assert_eq!(a.stats().held, 0);
    assert_eq!(a.stats().background_tasks, 0);
    tokio::time::timeout(Duration::from_secs(1), futures::future::join_all(lost))
        .await
        .expect("lost() fires for guards released by shutdown");
    for key in &keys {
        let g = b.try_acquire(key).await.unwrap();
        assert!(g.is_some(), "shutdown released {key}");
        g.unwrap().release().await.unwrap();
    }
    for g in guards {
        assert!(g.is_lost());
        assert!(matches!(g.release().await, Err(Error::NotHeld { .. })));
    }
    assert!(matches!(
        a.acquire(&keys[0], &opts(Duration::from_secs(10))).await,
        Err(Error::Shutdown)
    ));
}
