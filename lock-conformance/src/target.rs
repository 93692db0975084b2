//! The backend under test ([`Target`]) and the helpers the rules share.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use super::faults::hooks::{BoxFuture, Faults};
use lock_core::{
    Attempt, Backend, Capabilities, Lease, LockGuard, LockOptions, Locker, Owner, Result, Ttl,
    WaitStrategy,
};

/// The backend under test and its per-backend hooks.
#[derive(Clone)]
pub struct Target {
    pub(crate) backend: Arc<dyn Backend>,
    revoke: Option<Arc<dyn Fn(String) -> BoxFuture + Send + Sync>>,
    faults: Option<Faults>,
    prefix: String,
}

impl Target {
    /// A target over `backend`; locks are taken away with [`Admin::force_release`](lock_core::Admin::force_release).
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Target {
            backend,
            revoke: None,
            faults: None,
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

    /// Gives the fault rules ([`run_faults`](super::run_faults)) their hooks into the
    /// servers behind the backend; without it every fault rule reports itself not run.
    pub fn with_faults(mut self, faults: Faults) -> Self {
        self.faults = Some(faults);
        self
    }

    pub(crate) fn faults(&self) -> Option<&Faults> {
        self.faults.as_ref()
    }

    /// A new Locker over the backend: one "process".
    pub fn locker(&self) -> Locker {
        Locker::with_backend(self.backend.clone())
    }

    pub(crate) fn key(&self, name: &str) -> String {
        format!("{}{}-{:08x}", self.prefix, name, rand::random::<u32>())
    }

    pub(crate) fn caps(&self) -> &Capabilities {
        self.backend.capabilities()
    }

    /// Whether grants outlive their TTL while their session lives
    /// ([`Capabilities::session_bound`]).
    pub(crate) fn session_bound(&self) -> bool {
        self.caps().session_bound
    }

    /// Whether a lock can be taken away behind its holder's back: with a revoke hook, or
    /// [`Admin::force_release`](lock_core::Admin::force_release) on a TTL-bound backend. A
    /// session-bound grant (a file lock) ends only with its session: without a hook the
    /// rules that revoke say so and skip that part.
    pub(crate) fn revocable(&self, rule: &str) -> bool {
        let can = self.revoke.is_some() || !self.session_bound();
        if !can {
            eprintln!(
                "conformance [{}]: {rule}: revocation not run (session-bound grants end only with their session, and no revoke hook was given)",
                self.caps().name
            );
        }
        can
    }

    /// Ends `lease` the way a lapse ends it: waits for its expiry, or, for a session-bound
    /// grant that never expires while its session lives, releases it.
    pub(crate) async fn lapse(&self, lease: &Lease) {
        if self.session_bound() {
            self.backend.release(lease).await.expect("release");
        } else {
            wait_until_expired(self, lease).await;
        }
    }

    /// `ttl` as the backend accepts it (rounded up to its minimum and granularity).
    ///
    /// # Panics
    /// When the backend refuses the TTL.
    pub fn ttl(&self, ttl: Duration) -> Ttl {
        self.caps()
            .effective_ttl(ttl)
            .unwrap_or_else(|e| panic!("{ttl:?} is a valid TTL: {e}"))
    }

    /// A short TTL the backend accepts: 300 ms, or the backend's minimum.
    pub fn short_ttl(&self) -> Duration {
        self.caps()
            .effective_ttl(Duration::from_millis(300))
            .expect("300 ms is a valid TTL")
            .get()
    }

    /// Who holds `key`, when the backend can tell ([`Admin`](lock_core::Admin)).
    /// The holder of a lock: the first of [`Admin::inspect`](lock_core::Admin::inspect)'s list.
    pub(crate) async fn inspect(&self, key: &str) -> Option<Result<Option<lock_core::Holder>>> {
        let holders = self.backend.admin()?.inspect(key).await;
        Some(holders.map(|h| h.into_iter().next()))
    }

    pub(crate) async fn revoke(&self, key: &str) {
        match &self.revoke {
            Some(hook) => hook(key.to_owned()).await,
            None => {
                self.backend
                    .admin()
                    .expect("a backend without `admin()` needs a revoke hook")
                    .force_release(key)
                    .await
                    .expect("force_release");
            }
        }
    }
}

/// Slack allowed for scheduling and network round trips in timing bounds: the same for an
/// in-process backend, whose waits are timers too (a loaded 2-core machine delayed one by
/// 320 ms past a 100 ms bound).
pub(crate) fn slack(_t: &Target) -> Duration {
    Duration::from_millis(250)
}

pub(crate) fn opts(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).wait(WaitStrategy::Skip)
}

pub(crate) async fn grant(t: &Target, key: &str, owner: Owner, ttl: Duration) -> Lease {
    match t
        .backend
        .as_ref()
        .try_acquire(key, owner, lock_core::Permits::LOCK, t.ttl(ttl))
        .await
        .unwrap()
    {
        Attempt::Granted { fence, valid_until } => Lease::new(key, owner, fence, valid_until),
        Attempt::Taken { .. } => panic!("{key} should be free"),
    }
}

pub(crate) async fn wait_until_expired(t: &Target, lease: &Lease) {
    tokio::time::sleep_until((lease.valid_until() + slack(t) / 2).into()).await;
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
/// behind (and, with a backend that hands over ([`HandOver`](lock_core::HandOver)), are handed the key by).
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
