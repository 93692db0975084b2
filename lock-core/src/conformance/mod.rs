//! The conformance suite: the rules every backend keeps, one public async function each.
//!
//! Each function panics (like an assertion) when its rule is broken. Call them all with
//! [`run_all`], or one by one. A [`Target`] gives the suite the backend and, per backend,
//! the way to take a lock away behind its holder's back (by default
//! [`Backend::force_release`]). Expectations follow the backend's [`Capabilities`], never
//! its name; TTLs are scaled up to the backend's minimum.
//!
//! Several [`Locker`]s over one backend stand in for several processes.
//!
//! [`exclusion`] holds the randomized exclusion checker (many Lockers × tasks, faults
//! between rounds, a fenced resource that fails the run on any overlap).

/// Runs each rule on the target, in order, each bounded by a generous timeout so a hang
/// fails loudly with the rule's name.
macro_rules! run_rules {
    ($t:expr; $($rule:ident),* $(,)?) => {$(
        eprintln!("conformance [{}]: {}", $t.caps().name, stringify!($rule));
        if tokio::time::timeout(Duration::from_secs(120), $rule($t)).await.is_err() {
            panic!("conformance rule {} hung for 120 s", stringify!($rule));
        }
    )*};
}

pub mod exclusion;
mod safety;

pub use safety::*;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{
    Attempt, Backend, Capabilities, Error, Lease, LockGuard, LockOptions, Locker, Outcome, Owner,
    Result, WaitStrategy,
};

/// A boxed future, as returned by a [`Target`]'s revoke hook.
pub type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The backend under test and its per-backend hooks.
#[derive(Clone)]
pub struct Target {
    backend: Arc<dyn Backend>,
    revoke: Option<Arc<dyn Fn(String) -> BoxFuture + Send + Sync>>,
    prefix: String,
}

impl Target {
    /// A target over `backend`; locks are taken away with [`Backend::force_release`].
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Target {
            backend,
            revoke: None,
            prefix: format!("conf-{:08x}/", rand::random::<u32>()),
        }
    }

    /// A target over the backend of an existing Locker.
    pub fn from_locker(locker: &Locker) -> Self {
        Self::new(locker.backend().clone())
    }

    /// Replaces the way a lock is taken away behind its holder's back (for example a raw
    /// `DEL` on the server).
    pub fn with_revoke<F, Fut>(mut self, revoke: F) -> Self
    where
        F: Fn(String) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.revoke = Some(Arc::new(move |key| Box::pin(revoke(key))));
        self
    }

    /// A new Locker over the backend: one "process".
    pub fn locker(&self) -> Locker {
        Locker::with_backend(self.backend.clone())
    }

    fn key(&self, name: &str) -> String {
        format!("{}{}-{:08x}", self.prefix, name, rand::random::<u32>())
    }

    fn caps(&self) -> &Capabilities {
        self.backend.capabilities()
    }

    /// A short TTL the backend accepts: 300 ms, or the backend's minimum.
    pub fn short_ttl(&self) -> Duration {
        self.caps()
            .effective_ttl(Duration::from_millis(300))
            .expect("300 ms is a valid TTL")
    }

    async fn revoke(&self, key: &str) {
        match &self.revoke {
            Some(hook) => hook(key.to_owned()).await,
            None => {
                self.backend
                    .as_ref()
                    .force_release(key)
                    .await
                    .expect("force_release");
            }
        }
    }
}

/// Slack allowed for scheduling and network round trips in timing bounds.
fn slack(t: &Target) -> Duration {
    if t.caps().cross_process {
        Duration::from_millis(250)
    } else {
        Duration::from_millis(100)
    }
}

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).wait(WaitStrategy::Skip)
}

/// Runs every rule, in order, each bounded by a generous timeout so a hang fails loudly
/// with the rule's name.
pub async fn run_all(t: &Target) {
    run_rules!(
        t;
        grant_and_release,
        held_key_is_refused,
        different_keys_are_independent,
        stale_release_never_removes_new_holder,
        extend_of_expired_or_foreign_lease_fails,
        fencing_tokens_strictly_increase,
        lock_expires_after_ttl,
        watchdog_keeps_lock_across_ttls,
        lost_fires_when_taken_away,
        wait_timeout_is_bounded,
        waiter_is_handed_the_lock_promptly,
        a_queued_waiter_takes_over_from_its_sibling,
        cancelled_acquires_leave_nothing_behind,
        run_reports_outcomes_and_cancels_the_job,
        acquire_many_never_deadlocks,
        tasks_never_overlap,
        shutdown_releases_every_held_lock,
        invalid_input_is_refused,
    );
}

/// A lock is granted, reports its key, and can be released and taken again.
pub async fn grant_and_release(t: &Target) {
    let locker = t.locker();
    let key = t.key("grant");
    let guard = locker
        .acquire(&key, &opts(Duration::from_secs(10)))
        .await
        .expect("free key is granted");
    assert_eq!(guard.key(), key);
    assert!(!guard.is_lost());
    assert!(guard.valid_until() > Instant::now());
    guard.release().await.expect("release of a held lock is Ok");
    let again = locker.try_acquire(&key).await.expect("no error");
    assert!(again.is_some(), "a released key can be taken again");
    again.unwrap().release().await.unwrap();
}

/// A second acquire of a held key is refused, from the same and from another Locker.
pub async fn held_key_is_refused(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("held");
    let guard = a
        .acquire(&key, &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    assert!(b.try_acquire(&key).await.unwrap().is_none());
    assert!(a.try_acquire(&key).await.unwrap().is_none());
    match b.acquire(&key, &opts(Duration::from_secs(10))).await {
        Err(Error::Locked { key: k }) => assert_eq!(k, key),
        other => panic!("expected Locked, got {other:?}"),
    }
    guard.release().await.unwrap();
}

/// Locks on different keys do not exclude each other.
pub async fn different_keys_are_independent(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let g1 = a
        .acquire(&t.key("k1"), &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    let g2 = b
        .acquire(&t.key("k2"), &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    g1.release().await.unwrap();
    g2.release().await.unwrap();
}

async fn grant(t: &Target, key: &str, owner: Owner, ttl: Duration) -> Lease {
    match t
        .backend
        .as_ref()
        .try_acquire(key, owner, ttl)
        .await
        .unwrap()
    {
        Attempt::Granted { fence, valid_until } => Lease::new(key, owner, fence, valid_until),
        Attempt::Taken { .. } => panic!("{key} should be free"),
    }
}

async fn wait_until_expired(t: &Target, lease: &Lease) {
    tokio::time::sleep_until((lease.valid_until() + slack(t) / 2).into()).await;
}

/// Release by a stale (expired) lease never removes the new holder's lock.
pub async fn stale_release_never_removes_new_holder(t: &Target) {
    let key = t.key("stale");
    let ttl = t.short_ttl();
    let stale = grant(t, &key, Owner::random(), ttl).await;
    wait_until_expired(t, &stale).await;
    let fresh = grant(t, &key, Owner::random(), Duration::from_secs(10)).await;
    assert!(matches!(
        t.backend.as_ref().release(&stale).await,
        Err(Error::NotHeld { .. })
    ));
    let third = t
        .backend
        .try_acquire(&key, Owner::random(), ttl)
        .await
        .unwrap();
    assert!(
        matches!(third, Attempt::Taken { .. }),
        "the new holder's lock survived the stale release"
    );
    t.backend
        .release(&fresh)
        .await
        .expect("new holder releases");
}

/// Extend of an expired or a foreign lease fails with NotHeld and changes nothing.
pub async fn extend_of_expired_or_foreign_lease_fails(t: &Target) {
    let key = t.key("extend");
    let ttl = t.short_ttl();
    let expired = grant(t, &key, Owner::random(), ttl).await;
    wait_until_expired(t, &expired).await;
    assert!(matches!(
        t.backend.as_ref().extend(&expired, ttl).await,
        Err(Error::NotHeld { .. })
    ));
    let holder = grant(t, &key, Owner::random(), Duration::from_secs(10)).await;
    let foreign = Lease::new(
        key.as_str(),
        Owner::random(),
        holder.fence(),
        Instant::now(),
    );
    assert!(matches!(
        t.backend
            .as_ref()
            .extend(&foreign, Duration::from_secs(10))
            .await,
        Err(Error::NotHeld { .. })
    ));
    assert!(matches!(
        t.backend.as_ref().release(&foreign).await,
        Err(Error::NotHeld { .. })
    ));
    let extended = t
        .backend
        .as_ref()
        .extend(&holder, Duration::from_secs(20))
        .await;
    assert!(
        extended.is_ok(),
        "the real holder can still extend: {extended:?}"
    );
    t.backend.as_ref().release(&holder).await.unwrap();
}

/// Fencing tokens strictly increase across successive holders of a key (when the
/// backend promises monotonic fencing), also across Lockers and after expiry.
pub async fn fencing_tokens_strictly_increase(t: &Target) {
    let key = t.key("fence");
    let lockers = [t.locker(), t.locker()];
    let mut fences = Vec::new();
    for i in 0..6 {
        let g = lockers[i % 2]
            .acquire(&key, &opts(Duration::from_secs(10)))
            .await
            .unwrap();
        fences.push(g.fence());
        g.release().await.unwrap();
    }
    let ttl = t.short_ttl();
    let expiring = lockers[0]
        .acquire(&key, &opts(ttl).watchdog(false))
        .await
        .unwrap();
    fences.push(expiring.fence());
    let next = lockers[1]
        .acquire(&key, &opts(ttl).wait_for(ttl * 4))
        .await
        .unwrap();
    fences.push(next.fence());
    next.release().await.unwrap();
    drop(expiring);
    if t.caps().monotonic_fencing {
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "fences must strictly increase: {fences:?}"
        );
    }
}

/// A lock expires after its TTL when not renewed, and the next acquirer gets it.
pub async fn lock_expires_after_ttl(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("expire");
    let ttl = t.short_ttl();
    let started = Instant::now();
    let first = a.acquire(&key, &opts(ttl).watchdog(false)).await.unwrap();
    assert!(b.try_acquire(&key).await.unwrap().is_none());
    let second = b
        .acquire(&key, &opts(ttl).wait_for(ttl * 4))
        .await
        .expect("the next acquirer gets an expired lock");
    let waited = started.elapsed();
    assert!(
        waited + Duration::from_millis(5) >= ttl,
        "granted after {waited:?}, before the TTL {ttl:?} passed"
    );
    assert!(
        waited <= ttl + slack(t) * 2,
        "the waiter woke {waited:?} after the start, TTL {ttl:?}: expiry must wake it"
    );
    assert!(first.is_lost());
    assert!(matches!(first.release().await, Err(Error::NotHeld { .. })));
    second.release().await.unwrap();
}

/// The watchdog keeps a lock across at least five TTLs.
pub async fn watchdog_keeps_lock_across_ttls(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("watchdog");
    let ttl = t.short_ttl();
    let guard = a.acquire(&key, &opts(ttl)).await.unwrap();
    let end = Instant::now() + ttl * 5;
    while Instant::now() < end {
        tokio::time::sleep(ttl / 2).await;
        assert!(
            b.try_acquire(&key).await.unwrap().is_none(),
            "renewed lock stays held"
        );
        assert!(!guard.is_lost());
    }
    assert!(guard.valid_until() > Instant::now());
    guard.release().await.expect("still ours after 5 TTLs");
}

/// `lost()` fires when the lock is taken away behind the holder's back.
pub async fn lost_fires_when_taken_away(t: &Target) {
    let locker = t.locker();
    let key = t.key("lost");
    let ttl = t.short_ttl();
    let guard = locker.acquire(&key, &opts(ttl)).await.unwrap();
    let lost = guard.lost();
    t.revoke(&key).await;
    let taken_at = Instant::now();
    tokio::time::timeout(ttl + slack(t), lost)
        .await
        .expect("lost() fires within the TTL after the lock was taken away");
    assert!(guard.is_lost());
    assert!(taken_at.elapsed() <= ttl + slack(t));
    assert!(matches!(guard.release().await, Err(Error::NotHeld { .. })));
}

/// `Wait(timeout)` returns a timeout error within the timeout plus a small bound.
pub async fn wait_timeout_is_bounded(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("timeout");
    let guard = a
        .acquire(&key, &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    let timeout = Duration::from_millis(300);
    let started = Instant::now();
    let result = b
        .acquire(&key, &opts(Duration::from_secs(10)).wait_for(timeout))
        .await;
    let waited = started.elapsed();
    assert!(
        matches!(result, Err(Error::Timeout { .. })),
        "got {result:?}"
    );
    assert!(waited >= timeout, "gave up early after {waited:?}");
    assert!(
        waited <= timeout + slack(t),
        "gave up late after {waited:?}"
    );
    guard.release().await.unwrap();
}

/// A waiter is handed the lock promptly after a release (no polling delay).
pub async fn waiter_is_handed_the_lock_promptly(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("handoff");
    let bound = if t.caps().release_notices {
        slack(t)
    } else {
        Duration::from_millis(600)
    };
    for _ in 0..3 {
        let guard = a
            .acquire(&key, &opts(Duration::from_secs(10)))
            .await
            .unwrap();
        let waiter = {
            let (b, key) = (b.clone(), key.clone());
            tokio::spawn(async move {
                let g = b
                    .acquire(
                        &key,
                        &opts(Duration::from_secs(10)).wait_for(Duration::from_secs(10)),
                    )
                    .await;
                (Instant::now(), g)
            })
        };
        tokio::time::sleep(Duration::from_millis(150)).await;
        let released_at = Instant::now();
        guard.release().await.unwrap();
        let (granted_at, g) = waiter.await.unwrap();
        let g = g.expect("the waiter gets the lock");
        let delay = granted_at - released_at;
        assert!(delay <= bound, "hand-off took {delay:?} (bound {bound:?})");
        g.release().await.unwrap();
    }
}

/// `locker.acquire(key, opts)` on a task of its own.
pub fn spawn_acquire(
    locker: &Locker,
    key: &str,
    opts: &LockOptions,
) -> tokio::task::JoinHandle<Result<LockGuard>> {
    let (locker, key, opts) = (locker.clone(), key.to_owned(), opts.clone());
    tokio::spawn(async move { locker.acquire(&key, &opts).await })
}

/// Takes `key` through `locker`'s queue: behind a first holder that releases it after
/// `settle`. The guard returned is then the one the Locker's next waiters on the key queue
/// behind (and, with [`Capabilities::hand_over`], are handed the key by).
pub async fn queued_holder(
    locker: &Locker,
    key: &str,
    opts: &LockOptions,
    settle: Duration,
) -> LockGuard {
    let first = locker.acquire(key, opts).await.expect("the first holder");
    let second = spawn_acquire(locker, key, opts);
    tokio::time::sleep(settle).await;
    first.release().await.expect("the first release");
    second
        .await
        .expect("the waiter task")
        .expect("the queued holder")
}

/// [`queued_holder`], and a waiter queued behind it for `settle`.
pub async fn queued_holder_and_waiter(
    locker: &Locker,
    key: &str,
    opts: &LockOptions,
    settle: Duration,
) -> (LockGuard, tokio::task::JoinHandle<Result<LockGuard>>) {
    let holder = queued_holder(locker, key, opts, settle).await;
    let waiter = spawn_acquire(locker, key, opts);
    tokio::time::sleep(settle).await;
    (holder, waiter)
}

/// A waiter queued behind a holder of the same Locker takes over when it releases: at once,
/// with a greater fence, while another Locker never gets in between; the holder can renew
/// meanwhile. A holder whose lock was taken away behind its back hands nothing over: its
/// waiter gets the key from the server, and its release reports `NotHeld`.
pub async fn a_queued_waiter_takes_over_from_its_sibling(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("takeover");
    let ttl = t.caps().effective_ttl(Duration::from_secs(5)).unwrap();
    let wait = opts(ttl).wait_for(Duration::from_secs(10)).watchdog(false);
    let settle = slack(t);
    for _ in 0..3 {
        let (holder, waiter) = queued_holder_and_waiter(&a, &key, &wait, settle).await;
        holder
            .extend(ttl)
            .await
            .expect("the holder renews while a waiter is queued");
        assert!(matches!(
            b.acquire(&key, &opts(ttl)).await,
            Err(Error::Locked { .. })
        ));
        let fence = holder.fence();
        holder.release().await.expect("released");
        let next = tokio::time::timeout(slack(t), waiter)
            .await
            .expect("the waiter takes over at once")
            .unwrap()
            .expect("granted");
        let fencing = t.caps().monotonic_fencing;
        assert!(
            !fencing || next.fence() > fence,
            "{} after {fence}",
            next.fence()
        );
        assert!(matches!(
            b.acquire(&key, &opts(ttl)).await,
            Err(Error::Locked { .. })
        ));
        if let Ok(Some(seen)) = t.backend.inspect(&key).await {
            assert_eq!(seen.owner, Some(next.lease().owner()));
            if fencing {
                assert_eq!(seen.fence, Some(next.fence()));
            }
        }
        next.release().await.unwrap();
        b.acquire(&key, &opts(ttl))
            .await
            .expect("free after the last release")
            .release()
            .await
            .unwrap();
    }
    // Taken away behind the holder's back before a waiter queues: the waiter behind it
    // learns it from the hand-over, or from the holder's next renewal (at ttl / 3).
    let renewed = wait.clone().watchdog(true);
    let holder = queued_holder(&a, &key, &renewed, settle).await;
    t.revoke(&key).await;
    let waiter = spawn_acquire(&a, &key, &wait);
    let next = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter gets the key from the server")
        .unwrap()
        .expect("granted");
    assert!(!t.caps().monotonic_fencing || next.fence() > holder.fence());
    assert!(matches!(holder.release().await, Err(Error::NotHeld { .. })));
    assert!(
        !next.is_lost(),
        "the stale holder's release left the new one alone"
    );
    next.release().await.unwrap();
}

/// Cancelled acquires leave no lock held and no waiter queued.
pub async fn cancelled_acquires_leave_nothing_behind(t: &Target) {
    let (a, b, c) = (t.locker(), t.locker(), t.locker());
    let key = t.key("cancel");
    // A waiter dropped while queued.
    let guard = a
        .acquire(&key, &opts(Duration::from_secs(10)))
        .await
        .unwrap();
    let forever = opts(Duration::from_secs(10)).wait_forever();
    for _ in 0..3 {
        let wait = b.acquire(&key, &forever);
        assert!(tokio::time::timeout(Duration::from_millis(50), wait)
            .await
            .is_err());
    }
    assert_eq!(
        b.stats().queued_keys,
        0,
        "a dropped waiter leaves the queue"
    );
    guard.release().await.unwrap();
    // Acquires dropped at every point of their attempt, on a free key.
    let once = opts(Duration::from_secs(10));
    for i in 0..40u64 {
        let attempt = b.acquire(&key, &once);
        let _ = tokio::time::timeout(Duration::from_micros(i * 50), attempt).await;
        b.settle().await;
        let free = c.try_acquire(&key).await.unwrap();
        if let Some(g) = free {
            g.release().await.unwrap();
        } else {
            // The attempt completed and its guard was dropped: the release is in flight.
            b.settle().await;
            let g = c
                .acquire(&key, &opts(Duration::from_secs(10)).wait_for(slack(t)))
                .await
                .expect("nothing left behind by a cancelled acquire");
            g.release().await.unwrap();
        }
    }
    assert_eq!(b.stats().held, 0);
    assert_eq!(b.stats().queued_keys, 0);
}

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
                    crate::sync::lock(&fences).push(g.fence());
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
    let fences = crate::sync::lock(&fences).clone();
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

/// A release through one backend instance (another process, as far as the server can
/// tell) wakes a waiter on a second instance of the same server promptly, long before the
/// holder's TTL. Not part of [`run_all`]: it needs two instances.
pub async fn release_wakes_a_waiter_on_another_instance(a: &Target, b: &Target) {
    let key = a.key("instances");
    let (a, b, bound) = (a.locker(), b.locker(), slack(a));
    let ttl = Duration::from_secs(30);
    for round in 0..3 {
        let guard = a.acquire(&key, &opts(ttl)).await.unwrap();
        let waiter = {
            let (b, key) = (b.clone(), key.clone());
            tokio::spawn(async move {
                let g = b
                    .acquire(&key, &opts(ttl).wait_for(Duration::from_secs(10)))
                    .await;
                (Instant::now(), g)
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let released_at = Instant::now();
        guard.release().await.unwrap();
        let (granted_at, g) = waiter.await.unwrap();
        let g = g.expect("the other instance gets the lock");
        let delay = granted_at - released_at;
        assert!(
            delay < bound,
            "round {round}: hand-off across instances took {delay:?} (bound {bound:?})"
        );
        g.release().await.unwrap();
    }
}

/// Invalid keys and TTLs are refused with typed errors before any I/O.
pub async fn invalid_input_is_refused(t: &Target) {
    let locker = t.locker();
    let ok = opts(Duration::from_secs(10));
    assert!(matches!(
        locker.acquire("", &ok).await,
        Err(Error::InvalidKey { .. })
    ));
    let long = "x".repeat(crate::MAX_KEY_LEN + 1);
    assert!(matches!(
        locker.acquire(&long, &ok).await,
        Err(Error::InvalidKey { .. })
    ));
    assert!(matches!(
        locker.acquire_many(&["a", ""], &ok).await,
        Err(Error::InvalidKey { .. })
    ));
    let key = t.key("input");
    assert!(matches!(
        locker.acquire(&key, &opts(Duration::ZERO)).await,
        Err(Error::InvalidTtl { .. })
    ));
    assert!(matches!(
        locker.acquire(&key, &opts(Duration::MAX)).await,
        Err(Error::InvalidTtl { .. })
    ));
    let max = t.caps().max_ttl;
    assert!(matches!(
        locker
            .acquire(&key, &opts(max + Duration::from_secs(1)))
            .await,
        Err(Error::InvalidTtl { .. })
    ));
    // Below the minimum is rounded up, never refused.
    let g = locker
        .acquire(&key, &opts(Duration::from_nanos(1)).watchdog(false))
        .await
        .expect("a tiny TTL is rounded up to the backend minimum");
    assert!(g.ttl() >= t.caps().min_ttl);
    assert!(matches!(
        g.extend(Duration::ZERO).await,
        Err(Error::InvalidTtl { .. })
    ));
    drop(g);
}
