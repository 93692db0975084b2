//! Safety rules: hand-over, serialized operations per guard, queue entries. Each is the
//! regression test of a violation found in review; [`run_safety`] runs them all.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::target::{opts, queued_holder, queued_holder_and_waiter, slack, spawn_acquire, Target};
use lock_core::{Attempt, Backend, Capabilities, Error, Lease, Locker, Owner, Result, Ttl};

/// Runs the safety rules, in order, each bounded like [`run_all`](super::run_all)'s.
pub async fn run_safety(t: &Target) {
    run_rules!(
        t;
        a_waiter_with_a_shorter_ttl_never_shortens_its_siblings_lock,
        renewals_while_a_waiter_is_queued_keep_the_holder,
        a_hand_over_never_returns_an_expired_lease,
        a_lost_lease_is_never_renewed_again,
        extensions_apply_in_order,
        no_queue_entry_outlives_its_holder,
    );
}

/// A waiter queued with a short TTL behind a sibling holding with a long one never
/// shortens the holder's lock: while the holder believes it holds, another Locker is
/// refused, long after the waiter's TTL.
pub async fn a_waiter_with_a_shorter_ttl_never_shortens_its_siblings_lock(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("short-waiter");
    let long = t
        .caps()
        .effective_ttl(Duration::from_secs(30))
        .unwrap()
        .get();
    let short = t.short_ttl();
    let holder_opts = opts(long).wait_for(Duration::from_secs(10)).watchdog(false);
    let holder = queued_holder(&a, &key, &holder_opts, slack(t)).await;
    let waiter = spawn_acquire(
        &a,
        &key,
        &opts(short)
            .wait_for(Duration::from_secs(60))
            .watchdog(false),
    );
    // Well past the waiter's TTL (and past the server's expiry of a lock of that TTL).
    tokio::time::sleep(short * 3 + Duration::from_secs(1)).await;
    assert!(!holder.is_lost(), "the holder still believes it holds");
    match b.acquire(&key, &opts(long).watchdog(false)).await {
        Err(Error::Locked { .. }) => {}
        Ok(g) => panic!(
            "another Locker got fence {} while the holder (fence {}) believes it holds",
            g.fence(),
            holder.fence()
        ),
        Err(e) => panic!("unexpected {e}"),
    }
    holder.release().await.expect("released");
    let next = waiter.await.unwrap().expect("the waiter takes over");
    next.release().await.unwrap();
}

/// Renewals (the watchdog's and `extend`) racing the arrival of a sibling waiter leave
/// the holder holding: never refused, never lost, and nobody else gets in; the waiter
/// takes over at the release.
pub async fn renewals_while_a_waiter_is_queued_keep_the_holder(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("renew-queued");
    let ttl = t
        .caps()
        .effective_ttl(Duration::from_millis(900))
        .unwrap()
        .get();
    let wait = opts(ttl).wait_for(Duration::from_secs(30));
    let mut holder = queued_holder(&a, &key, &wait, slack(t)).await;
    for round in 0..8 {
        // The waiter arrives while the holder's renewal is on its way.
        let waiter = spawn_acquire(&a, &key, &wait);
        let (renewed, ()) = futures::join!(holder.extend(ttl), tokio::task::yield_now());
        renewed.unwrap_or_else(|e| panic!("round {round}: extend refused: {e}"));
        tokio::time::sleep(slack(t)).await;
        holder
            .extend(ttl)
            .await
            .unwrap_or_else(|e| panic!("round {round}: second extend refused: {e}"));
        assert!(
            !holder.is_lost(),
            "round {round}: the holder was marked lost"
        );
        if let Ok(g) = b.acquire(&key, &opts(ttl)).await {
            panic!(
                "round {round}: another Locker got fence {} while the holder holds",
                g.fence()
            );
        }
        holder.release().await.expect("released");
        let next = waiter.await.unwrap().expect("the waiter takes over");
        assert!(!next.is_lost());
        if let Ok(g) = b.acquire(&key, &opts(ttl)).await {
            panic!(
                "round {round}: another Locker got fence {} after the hand-over",
                g.fence()
            );
        }
        holder = next;
    }
    holder.release().await.unwrap();
}

/// A waiter never gets a lease whose validity has passed: a process paused past its TTLs
/// while another process took the key, whose holder then releases, hands nothing stale
/// to its queued waiter, and what the waiter gets is valid when `acquire` returns.
pub async fn a_hand_over_never_returns_an_expired_lease(t: &Target) {
    if t.session_bound() {
        eprintln!(
            "conformance [{}]: a_hand_over_never_returns_an_expired_lease not run (session-bound grants do not expire)",
            t.caps().name
        );
        return;
    }
    let b = t.locker();
    let key = t.key("expired-hand-over");
    let ttl = t.short_ttl();
    let settle = slack(t);
    let (paused_tx, paused) = tokio::sync::oneshot::channel();
    // "Process" A: a runtime of its own on a thread of its own, frozen whole.
    let process = {
        let (t, key) = (t.clone(), key.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let a = t.locker();
                let wait = opts(ttl).wait_for(Duration::from_secs(30)).watchdog(false);
                let holder = queued_holder(&a, &key, &wait, settle).await;
                let waiter = {
                    let (a, key, wait) = (a.clone(), key.clone(), wait.clone());
                    tokio::spawn(async move {
                        let guard = a.acquire(&key, &wait).await?;
                        // Checked the moment `acquire` returns.
                        Ok::<_, Error>((!guard.is_lost(), guard.fence()))
                    })
                };
                tokio::time::sleep(settle).await;
                let _ = paused_tx.send(());
                std::thread::sleep(ttl * 2 + settle * 4);
                let _ = holder.release().await;
                let answer = waiter.await.expect("the waiter task");
                a.shutdown().await;
                answer
            })
        })
    };
    paused.await.expect("process A runs");
    tokio::time::sleep(ttl + settle).await;
    let other = b
        .acquire(
            &key,
            &opts(ttl).wait_for(Duration::from_secs(30)).watchdog(false),
        )
        .await
        .expect("the key is free once the paused holder's TTL passed");
    let answer = tokio::task::spawn_blocking(move || process.join())
        .await
        .unwrap()
        .expect("process A finishes");
    let (valid, fence) = answer.expect("the waiter gets the key in the end");
    assert!(
        valid,
        "the waiter got fence {fence} already expired (the other holder: fence {})",
        other.fence()
    );
    drop(other);
    b.settle().await;
}

/// A guard found lost never reaches the server again: no renewal follows a refused
/// `extend`, whatever its watchdog period.
pub async fn a_lost_lease_is_never_renewed_again(t: &Target) {
    if !t.revocable("a_lost_lease_is_never_renewed_again") {
        return;
    }
    let counting = Arc::new(Counting {
        inner: t.backend.clone(),
        extends: AtomicUsize::new(0),
        refused: AtomicUsize::new(0),
    });
    let a = Locker::with_backend(counting.clone());
    let key = t.key("lost-renewals");
    let ttl = t.short_ttl();
    let guard = a.acquire(&key, &opts(ttl)).await.unwrap();
    t.revoke(&key).await;
    let refused = guard.extend(ttl).await;
    assert!(matches!(refused, Err(Error::NotHeld { .. })), "{refused:?}");
    assert!(guard.is_lost());
    let after = counting.extends.load(Ordering::SeqCst);
    // Several watchdog periods.
    tokio::time::sleep(ttl + ttl / 2).await;
    assert!(guard.extend(ttl).await.is_err());
    assert_eq!(
        counting.extends.load(Ordering::SeqCst),
        after,
        "a lost guard renewed its lease again"
    );
    drop(guard);
    a.shutdown().await;
}

/// Concurrent extensions of one guard reach the server one after the other: the guard's
/// validity is never later than the server's expiry, whichever finished first.
pub async fn extensions_apply_in_order(t: &Target) {
    let (a, b) = (t.locker(), t.locker());
    let key = t.key("extend-order");
    let short = t.short_ttl();
    let long = t
        .caps()
        .effective_ttl(Duration::from_secs(20))
        .unwrap()
        .get();
    for round in 0..10 {
        let guard = a.acquire(&key, &opts(long).watchdog(false)).await.unwrap();
        let (x, y) = if round % 2 == 0 {
            futures::join!(guard.extend(long), guard.extend(short))
        } else {
            let (y, x) = futures::join!(guard.extend(short), guard.extend(long));
            (x, y)
        };
        x.unwrap();
        y.unwrap();
        if guard
            .valid_until()
            .saturating_duration_since(Instant::now())
            > short + slack(t)
        {
            // The long one was applied last: the server keeps it that long.
            tokio::time::sleep(short + slack(t)).await;
            assert!(!guard.is_lost());
            if let Ok(g) = b.acquire(&key, &opts(long)).await {
                panic!(
                    "round {round}: granted fence {} while the guard believes it holds",
                    g.fence()
                );
            }
        }
        let _ = guard.release().await;
    }
}

/// After every guard ended and background work settled, a Locker keeps no per-key state:
/// a key won through the queue does not keep its queue entry.
pub async fn no_queue_entry_outlives_its_holder(t: &Target) {
    let a = t.locker();
    let ttl = t
        .caps()
        .effective_ttl(Duration::from_secs(5))
        .unwrap()
        .get();
    let wait = opts(ttl).wait_for(Duration::from_secs(10));
    for i in 0..3 {
        let key = t.key(&format!("entries-{i}"));
        let (holder, waiter) = queued_holder_and_waiter(&a, &key, &wait, slack(t)).await;
        if i == 1 {
            drop(holder);
        } else {
            holder.release().await.unwrap();
        }
        let next = waiter.await.unwrap().unwrap();
        if i == 2 {
            drop(next);
        } else {
            next.release().await.unwrap();
        }
    }
    a.settle().await;
    let stats = a.stats();
    assert_eq!(
        (stats.held, stats.queued_keys, stats.background_tasks),
        (0, 0, 0),
        "{stats:?}"
    );
}

/// A backend that counts the extensions it forwards and the attempts the server refused.
pub(crate) struct Counting {
    pub(crate) inner: Arc<dyn Backend>,
    pub(crate) extends: AtomicUsize,
    pub(crate) refused: AtomicUsize,
}

// Every provided method forwarded (a default would drop the inner backend's abandon or
// one of its abilities, and the rules would test a different backend).
#[async_trait::async_trait]
#[deny(clippy::missing_trait_methods)]
impl Backend for Counting {
    fn capabilities(&self) -> &Capabilities {
        self.inner.capabilities()
    }
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        permits: lock_core::Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        let attempt = self.inner.try_acquire(key, owner, permits, ttl).await;
        if matches!(attempt, Ok(Attempt::Taken { .. })) {
            self.refused.fetch_add(1, Ordering::SeqCst);
        }
        attempt
    }
    async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        self.extends.fetch_add(1, Ordering::SeqCst);
        self.inner.extend(lease, ttl).await
    }
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.inner.release(lease).await
    }
    fn listen(&self, key: &str) -> Option<lock_core::ReleaseListener> {
        self.inner.listen(key)
    }
    fn hand_over(&self) -> Option<&dyn lock_core::HandOver> {
        self.inner.hand_over()
    }
    fn admin(&self) -> Option<&dyn lock_core::Admin> {
        self.inner.admin()
    }
    async fn abandon(&self, key: &str, owner: Owner) -> Result<()> {
        self.inner.abandon(key, owner).await
    }
    // Deliberately not forwarded: in-process answers would bypass the counts, so the rules
    // using this wrapper take the async path on every backend.
    fn immediate(&self) -> Option<&dyn lock_core::Immediate> {
        None
    }
    fn baseline(&self) -> Option<&dyn lock_core::Baseline> {
        self.inner.baseline()
    }
    fn run_records(&self) -> Option<&dyn lock_core::records::RunRecords> {
        self.inner.run_records()
    }
    fn fire_claims(&self) -> Option<&dyn lock_core::claims::FireClaims> {
        self.inner.fire_claims()
    }
    fn leader_values(&self) -> Option<&dyn lock_core::election::LeaderValues> {
        self.inner.leader_values()
    }
}
