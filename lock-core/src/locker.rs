//! The waiting policy: [`Locker`].

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::backend::{Attempt, Backend, Capabilities, Pause};
use crate::error::{Error, Result};
use crate::guard::{GuardShared, LockGuard};
use crate::lease::{Lease, LockKey, Owner};
use crate::options::{Backoff, LockOptions, WaitStrategy};
use crate::registry::Registry;
use crate::sync::lock;

/// The longest key accepted, in bytes.
pub const MAX_KEY_LEN: usize = 1024;

/// Backoff between attempts when the backend cannot announce a release.
const WAIT_BACKOFF: (Duration, Duration) = (Duration::from_millis(2), Duration::from_millis(500));
/// Backoff between attempts after a transient error (server unreachable).
const ERROR_BACKOFF: (Duration, Duration) = (Duration::from_millis(20), Duration::from_secs(1));
/// Hand-overs of one key in a row inside a Locker, after which its holder releases it on
/// the server instead: waiters in other processes, woken by that release, then get their
/// chance at it.
pub(crate) const MAX_HAND_OVERS: u32 = 16;

/// Checks a key: not empty, at most [`MAX_KEY_LEN`] bytes.
pub fn validate_key(key: &str) -> Result<()> {
    let reason = if key.is_empty() {
        "a lock key must not be empty"
    } else if key.len() > MAX_KEY_LEN {
        "a lock key must be at most 1024 bytes"
    } else {
        return Ok(());
    };
    let mut shown = key.to_owned();
    if shown.len() > 64 {
        let mut cut = 64;
        while !shown.is_char_boundary(cut) {
            cut -= 1;
        }
        shown.truncate(cut);
        shown.push('…');
    }
    Err(Error::InvalidKey { key: shown, reason })
}

/// What [`Locker::run`] did with the job.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub enum Outcome<T> {
    /// The lock was won and the job ran to completion with this result.
    Ran(T),
    /// The lock was not won (taken, or the wait timed out); the job did not run.
    Skipped,
    /// The job's hard timeout passed; the job was cancelled and the lock released.
    TimedOut,
    /// The lock was lost while the job ran; the job was cancelled.
    LockLost,
}

/// Counts of what a [`Locker`] holds in memory, for monitoring and leak tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockerStats {
    /// Guards currently held through this Locker.
    pub held: usize,
    /// Keys with local waiters queued.
    pub queued_keys: usize,
    /// Background tasks (releases, cleanups) still running.
    pub background_tasks: usize,
}

/// Background tasks a Locker waits for on shutdown.
#[derive(Default)]
pub(crate) struct Tracker {
    count: AtomicUsize,
    idle: Notify,
}

impl Tracker {
    pub(crate) fn spawn<F>(self: &Arc<Self>, fut: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        self.count.fetch_add(1, Ordering::SeqCst);
        let me = self.clone();
        handle.spawn(async move {
            fut.await;
            if me.count.fetch_sub(1, Ordering::SeqCst) == 1 {
                me.idle.notify_waiters();
            }
        });
        true
    }

    async fn wait_idle(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// A key's local queue: the turn its waiters take in order, and the guard of the waiter
/// that last won it through the queue.
#[derive(Default)]
pub(crate) struct QueueEntry {
    turn: tokio::sync::Mutex<()>,
    holder: Mutex<std::sync::Weak<GuardShared>>,
    /// The head waiter's request to be handed the key by that holder (backends with
    /// [`Backend::hand_over`]).
    hand_off: Mutex<Option<HandOffRequest>>,
    /// Hand-overs in a row since a waiter last won the key through the server.
    handed: AtomicU32,
}

/// A waiter's request to receive the key straight from its holder.
pub(crate) struct HandOffRequest {
    pub(crate) owner: Owner,
    pub(crate) ttl: Duration,
    /// Where the holder sends the new lease; dropped unsent when the hand-over did not happen.
    pub(crate) reply: Option<tokio::sync::oneshot::Sender<Lease>>,
}

impl QueueEntry {
    /// The guard of this Locker that holds the key, if one does: the head of the queue
    /// waits for its end rather than spend a refused attempt on the server.
    /// A holder whose validity passed (not renewed, not yet dropped) is not one: the
    /// waiter then tries the server, which tells when the key is free.
    fn local_holder(&self) -> Option<Arc<GuardShared>> {
        lock(&self.holder)
            .upgrade()
            .filter(|g| !g.is_gone() && g.valid_until() > Instant::now())
    }
}

pub(crate) type Turn = Arc<QueueEntry>;

pub(crate) struct Inner {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) caps: Capabilities,
    /// Local FIFO queues: only the waiter holding a key's turn attempts on the backend.
    queues: Mutex<HashMap<Arc<str>, Turn>>,
    /// Number of keys in `queues`, so the uncontended path skips the map.
    queued: AtomicUsize,
    /// Guards held through this Locker, for `shutdown`.
    pub(crate) held: Registry<Arc<GuardShared>>,
    pub(crate) tasks: Arc<Tracker>,
    shut_down: AtomicBool,
    defaults: LockOptions,
}

impl Inner {
    /// Takes the request of the head waiter queued behind `holder` on `key`, when the
    /// backend hands keys over and the key may be handed over once more (not after
    /// shutdown, and not more than [`MAX_HAND_OVERS`] times in a row). Called by the
    /// holder's release only, once its own renewals have stopped.
    pub(crate) fn take_hand_off(&self, holder: &GuardShared, key: &str) -> Option<HandOffRequest> {
        if !self.caps.hand_over
            || self.queued.load(Ordering::SeqCst) == 0
            || self.shut_down.load(Ordering::SeqCst)
        {
            return None;
        }
        let queues = lock(&self.queues);
        let entry = queues.get(key)?;
        if !std::ptr::eq(lock(&entry.holder).as_ptr(), holder)
            || entry.handed.load(Ordering::SeqCst) >= MAX_HAND_OVERS
        {
            return None;
        }
        let request = lock(&entry.hand_off).take()?;
        entry.handed.fetch_add(1, Ordering::SeqCst);
        Some(request)
    }

    /// The backend as a trait object. Calling through `Arc<dyn Backend>` directly would
    /// pick the forwarding `impl Backend for Arc<B>` and box every future twice.
    pub(crate) fn proto(&self) -> &dyn Backend {
        &*self.backend
    }
}

/// Hands out locks from one backend with one waiting policy, the same on every backend.
///
/// Waiters of one Locker for the same key line up in a local FIFO queue and only the head
/// of the queue attempts on the backend: a networked server sees one contender per process
/// and waiters inside a process are served in arrival order. A Locker is cheap to clone
/// (all clones share the queues and the set of held guards).
///
/// While a guard of this Locker holds the key, the head waiter does not attempt at all: it
/// waits for that guard's end. On a backend with [`Backend::hand_over`], the holder's
/// release *is* the hand-over: once the holder's own renewals have stopped, one server
/// step passes the key to the head waiter (only if the server still holds it for the
/// holder), with the next fence and a validity counted from before that step; nothing
/// changes hands while the holder still holds. A key is handed over at most 16 times in a
/// row: then the holder releases it on the server, which wakes waiters in other processes.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_core::LockOptions;
///
/// let guard = locker
///     .acquire("jobs/nightly", &LockOptions::new().ttl(Duration::from_secs(10)))
///     .await?;
/// println!("fencing token {}", guard.fence());
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locker {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Locker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Locker")
            .field("backend", &self.inner.caps.name)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Locker {
    /// A Locker over `backend` with the default [`LockOptions`].
    pub fn new(backend: impl Backend) -> Self {
        Self::with_backend(Arc::new(backend))
    }

    /// A Locker over a shared backend handle.
    pub fn with_backend(backend: Arc<dyn Backend>) -> Self {
        Self::with_options(backend, LockOptions::default())
    }

    /// A Locker over a shared backend handle whose [`lock`](Self::lock) uses `defaults`.
    pub fn with_options(backend: Arc<dyn Backend>, defaults: LockOptions) -> Self {
        let caps = backend.capabilities().clone();
        Locker {
            inner: Arc::new(Inner {
                backend,
                caps,
                queues: Mutex::new(HashMap::new()),
                queued: AtomicUsize::new(0),
                held: Registry::new(),
                tasks: Arc::new(Tracker::default()),
                shut_down: AtomicBool::new(false),
                defaults,
            }),
        }
    }

    /// The backend behind this Locker.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// The backend's capabilities.
    pub fn capabilities(&self) -> &Capabilities {
        &self.inner.caps
    }

    /// The options [`lock`](Self::lock) uses.
    pub fn default_options(&self) -> &LockOptions {
        &self.inner.defaults
    }

    /// What this Locker holds in memory now.
    pub fn stats(&self) -> LockerStats {
        LockerStats {
            held: self.inner.held.len(),
            queued_keys: lock(&self.inner.queues).len(),
            background_tasks: self.inner.tasks.count.load(Ordering::SeqCst),
        }
    }

    /// Acquires `key` with the default options.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub async fn lock<K: LockKey + ?Sized>(&self, key: &K) -> Result<LockGuard> {
        let opts = self.inner.defaults.clone();
        self.acquire(key, &opts).await
    }

    /// One attempt at `key` with the default TTL and watchdog setting: `Ok(None)` when the
    /// lock is taken.
    ///
    /// # Errors
    /// Invalid key or TTL, or the backend failed.
    pub async fn try_acquire<K: LockKey + ?Sized>(&self, key: &K) -> Result<Option<LockGuard>> {
        let opts = self.inner.defaults.clone().skip();
        match self.acquire(key, &opts).await {
            Ok(guard) => Ok(Some(guard)),
            Err(Error::Locked { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Acquires `key` (any string; an `Arc<str>` is kept without a copy) following `opts`:
    /// attempts on the backend, waits for a release notice (or the holder's expiry, or a
    /// jittered exponential backoff) between attempts, and retries transient errors until
    /// the wait strategy's deadline.
    ///
    /// The guard releases the lock when dropped (in the background) or by
    /// [`LockGuard::release`].
    ///
    /// # Errors
    /// - [`Error::InvalidKey`] / [`Error::InvalidTtl`] for bad input, before any I/O;
    /// - [`Error::Locked`] with [`WaitStrategy::Skip`] when the lock is taken;
    /// - [`Error::Timeout`] when the wait deadline passed while the lock was taken;
    /// - the last transient error (e.g. [`Error::Unavailable`]) when the deadline passed
    ///   while the server failed; non-transient backend errors at once;
    /// - [`Error::Shutdown`] after [`shutdown`](Self::shutdown).
    ///
    /// # Cancel safety
    /// Dropping the future at any await leaves no lock held and no waiter queued: an attempt
    /// in flight when the future is dropped is released in the background (tracked by
    /// [`shutdown`](Self::shutdown)).
    pub async fn acquire<K: LockKey + ?Sized>(
        &self,
        key: &K,
        opts: &LockOptions,
    ) -> Result<LockGuard> {
        let key_str = key.as_key();
        validate_key(key_str)?;
        let ttl = self.inner.caps.effective_ttl(opts.ttl)?;
        if self.inner.shut_down.load(Ordering::SeqCst) {
            return Err(Error::Shutdown);
        }
        // An in-process backend never yields: take part in tokio's cooperative budget, as
        // tokio's own mutex does, so a task looping on locks cannot starve its neighbours.
        tokio::task::coop::consume_budget().await;
        // One shared copy of the key, for the lease and (in memory) the lock table.
        let shared_key: Arc<str> = key.to_shared();
        let key: &str = &shared_key;
        let skip = matches!(opts.wait, WaitStrategy::Skip);
        // Fast path: nobody of ours is queued on this key, so trying first is fair.
        let first_try = skip
            || self.inner.queued.load(Ordering::SeqCst) == 0
            || !lock(&self.inner.queues).contains_key(key);
        // An in-process backend answers at once: no deadline is needed for that attempt.
        let mut tried = false;
        if first_try {
            if let Some(answer) = self.attempt_now(&shared_key, ttl, opts) {
                match answer {
                    Ok(Ok(guard)) => return Ok(guard),
                    Ok(Err(_)) if skip => {
                        return Err(Error::Locked {
                            key: key.to_owned(),
                        })
                    }
                    Err(e) if skip || !e.is_transient() => return Err(e),
                    Ok(Err(_)) | Err(_) => tried = true,
                }
            }
        }
        let (started, deadline) = match opts.wait {
            WaitStrategy::Skip => {
                return match self.attempt(&shared_key, ttl, opts).await? {
                    Ok(guard) => Ok(guard),
                    Err(_) => Err(Error::Locked {
                        key: key.to_owned(),
                    }),
                };
            }
            WaitStrategy::Wait(t) => {
                let now = Instant::now();
                (
                    Some(now),
                    Some(now.checked_add(t).unwrap_or_else(far_future)),
                )
            }
            // The start only matters for the error message of a bounded wait.
            WaitStrategy::WaitForever => (None, None),
        };
        if first_try && !tried {
            let first = match deadline {
                None => Some(self.attempt(&shared_key, ttl, opts).await),
                Some(d) => tokio::time::timeout_at(d.into(), self.attempt(&shared_key, ttl, opts))
                    .await
                    .ok(),
            };
            match first {
                None => return Err(timeout_error(key, started)),
                Some(Ok(Ok(guard))) => return Ok(guard),
                Some(Err(e)) if !e.is_transient() => return Err(e),
                Some(Ok(Err(_)) | Err(_)) => {}
            }
        }
        // Boxed: the waiting state machine is large, and the uncontended path above should
        // not carry (and move) it.
        Box::pin(self.queued(&shared_key, ttl, opts, started, deadline)).await
    }

    /// The slow path: take this key's local turn (FIFO), then attempt and wait until
    /// granted or the deadline passes.
    async fn queued(
        &self,
        shared_key: &Arc<str>,
        ttl: Duration,
        opts: &LockOptions,
        started: Option<Instant>,
        deadline: Option<Instant>,
    ) -> Result<LockGuard> {
        let key: &str = shared_key;
        let queue = QueueSlot::join(&self.inner, key);
        let _turn = match within(deadline, queue.turn.turn.lock()).await {
            Some(turn) => turn,
            None => return Err(timeout_error(key, started)),
        };
        let mut wait_backoff = Backoff::new(WAIT_BACKOFF.0, WAIT_BACKOFF.1);
        let mut error_backoff = Backoff::new(ERROR_BACKOFF.0, ERROR_BACKOFF.1);
        let mut last_error: Option<Error> = None;
        // Set when a release notice ended the last wait: attempt then, even if the
        // sibling's release has not returned yet (a backend may announce it as soon as the
        // release is queued ahead of our attempt).
        let mut noticed = false;
        loop {
            // Listen before attempting, so a release right after a refusal is not missed.
            let mut listener = self.inner.proto().listen(key);
            // A sibling holds the key: its release (or loss) ends the wait, and a refused
            // attempt would only cost the server work.
            if let Some(holder) = queue.turn.local_holder().filter(|_| !noticed) {
                // The holder's release hands the key over to this request, if it can.
                let mut hand_off = self
                    .inner
                    .caps
                    .hand_over
                    .then(|| HandOffWait::register(&queue.turn, ttl));
                let handed = async {
                    match hand_off.as_mut() {
                        Some(h) => (&mut h.reply).await.ok(),
                        None => std::future::pending().await,
                    }
                };
                let released = async {
                    match listener.as_mut() {
                        Some(l) => l.released().await,
                        None => std::future::pending().await,
                    }
                };
                let woken = tokio::select! {
                    biased;
                    lease = handed => Woken::HandedOver(lease),
                    _ = GuardShared::ended(holder) => Woken::Ended,
                    _ = released => Woken::Notice,
                    _ = sleep_until_deadline(deadline) => Woken::Deadline,
                };
                let woken = match (woken, hand_off) {
                    // The holder took the request: its answer (a lease, or none when the
                    // hand-over did not happen) is on its way.
                    (Woken::Ended | Woken::Notice, Some(mut h)) if !h.withdraw() => {
                        match within(deadline, &mut h.reply).await {
                            Some(lease) => Woken::HandedOver(lease.ok()),
                            None => Woken::Deadline,
                        }
                    }
                    (woken, _) => woken,
                };
                match woken {
                    Woken::HandedOver(Some(lease)) => {
                        if self.inner.shut_down.load(Ordering::SeqCst) {
                            self.inner.cleanup_in_background(lease);
                            return Err(Error::Shutdown);
                        }
                        if lease.is_expired() {
                            // Answered too late to be of use (the validity counts from
                            // before the hand-over was sent): let it go, try the server.
                            self.inner.cleanup_in_background(lease);
                            noticed = false;
                            continue;
                        }
                        tracing::debug!(key, fence = lease.fence(), "lock handed over");
                        let guard = LockGuard::new(&self.inner, lease, ttl, opts.watchdog);
                        *lock(&queue.turn.holder) = guard.downgrade();
                        return Ok(guard);
                    }
                    // Not handed over: the holder released it on the server meanwhile.
                    Woken::HandedOver(None) | Woken::Ended => noticed = false,
                    Woken::Notice => noticed = true,
                    Woken::Deadline => break,
                }
                continue;
            }
            noticed = false;
            let pause = match within(deadline, self.attempt(shared_key, ttl, opts)).await {
                None => break,
                Some(Ok(Ok(guard))) => {
                    *lock(&queue.turn.holder) = guard.downgrade();
                    queue.turn.handed.store(0, Ordering::SeqCst);
                    return Ok(guard);
                }
                Some(Ok(Err(expires_in))) => {
                    last_error = None;
                    error_backoff.reset();
                    Pause {
                        expires_in,
                        backoff: wait_backoff.next_delay(),
                        listener,
                    }
                }
                Some(Err(e)) if e.is_transient() => {
                    tracing::debug!(key, error = %e, "lock attempt failed; retrying");
                    last_error = Some(e);
                    Pause {
                        expires_in: None,
                        backoff: error_backoff.next_delay(),
                        listener: None,
                    }
                }
                Some(Err(e)) => return Err(e),
            };
            if within(deadline, self.inner.proto().wait(key, pause))
                .await
                .is_none()
            {
                break;
            }
        }
        Err(last_error.unwrap_or_else(|| timeout_error(key, started)))
    }

    /// One attempt on the backend. `Ok(Err(expires_in))` means taken.
    ///
    /// Cancel safe: if dropped while the backend call is in flight, a background task
    /// releases whatever that call may have granted.
    async fn attempt(
        &self,
        shared_key: &Arc<str>,
        ttl: Duration,
        opts: &LockOptions,
    ) -> Result<std::result::Result<LockGuard, Option<Duration>>> {
        if let Some(answer) = self.attempt_now(shared_key, ttl, opts) {
            return answer;
        }
        let key: &str = shared_key;
        let owner = Owner::random();
        let mut cleanup = self.inner.arm_cleanup(shared_key, owner);
        let result = self.inner.proto().try_acquire(key, owner, ttl).await;
        // A failure may come after the request reached the server (a reply lost to a
        // timeout, a paused server resuming, a script that failed half-way): the grant may
        // exist, so the clean-up stays armed and releases it.
        if result.is_ok() {
            cleanup.disarm();
        }
        drop(cleanup);
        match result? {
            Attempt::Granted { fence, valid_until } => {
                let lease = Lease::new(shared_key.clone(), owner, fence, valid_until);
                if self.inner.shut_down.load(Ordering::SeqCst) {
                    let _ = self.inner.proto().release(&lease).await;
                    return Err(Error::Shutdown);
                }
                tracing::debug!(key, fence, backend = self.inner.caps.name, "lock granted");
                Ok(Ok(LockGuard::new(&self.inner, lease, ttl, opts.watchdog)))
            }
            Attempt::Taken { expires_in } => Ok(Err(expires_in)),
        }
    }

    /// One attempt answered at once by an in-process backend
    /// ([`Backend::try_acquire_now`]); `None` when the backend needs the async call. A
    /// synchronous answer has no reply in flight, so nothing needs cleaning up.
    #[allow(clippy::type_complexity)]
    fn attempt_now(
        &self,
        shared_key: &Arc<str>,
        ttl: Duration,
        opts: &LockOptions,
    ) -> Option<Result<std::result::Result<LockGuard, Option<Duration>>>> {
        let owner = Owner::random();
        let proto = self.inner.proto();
        Some(match proto.try_acquire_now(shared_key, owner, ttl)? {
            Ok(Attempt::Granted { fence, valid_until }) => {
                let lease = Lease::new(shared_key.clone(), owner, fence, valid_until);
                if self.inner.shut_down.load(Ordering::SeqCst) {
                    if proto.release_now(&lease).is_none() {
                        self.inner.cleanup_in_background(lease);
                    }
                    return Some(Err(Error::Shutdown));
                }
                let key: &str = shared_key;
                tracing::debug!(key, fence, backend = self.inner.caps.name, "lock granted");
                Ok(Ok(LockGuard::new(&self.inner, lease, ttl, opts.watchdog)))
            }
            Ok(Attempt::Taken { expires_in }) => Ok(Err(expires_in)),
            Err(e) => Err(e),
        })
    }

    /// Runs `job` only if `key` is won, and says what happened.
    ///
    /// The job is cancelled (dropped) as soon as the lock is known lost or
    /// `opts.job_timeout` passes; after it completes or times out the lock is released.
    /// A lock not won (taken with `Skip`, or the wait deadline passed) is
    /// [`Outcome::Skipped`].
    ///
    /// # Errors
    /// Invalid input, and backend failures while acquiring (other than a wait timeout).
    pub async fn run<K, F, T>(&self, key: &K, opts: &LockOptions, job: F) -> Result<Outcome<T>>
    where
        K: LockKey + ?Sized,
        F: Future<Output = T>,
    {
        let guard = match self.acquire(key, opts).await {
            Ok(guard) => guard,
            Err(Error::Locked { .. } | Error::Timeout { .. }) => return Ok(Outcome::Skipped),
            Err(e) => return Err(e),
        };
        let key = key.as_key();
        let lost = guard.lost();
        let hard_timeout = async {
            match opts.job_timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        let outcome = tokio::select! {
            biased;
            _ = lost => {
                tracing::warn!(key, "lock lost while the job ran; job cancelled");
                return Ok(Outcome::LockLost);
            }
            value = job => Outcome::Ran(value),
            _ = hard_timeout => {
                tracing::warn!(key, "job passed its hard timeout; job cancelled");
                Outcome::TimedOut
            }
        };
        if let Err(e) = guard.release().await {
            tracing::warn!(key, error = %e, "release after the job failed");
        }
        Ok(outcome)
    }

    /// Acquires every key of `keys` or none: keys are deduplicated and taken in sorted
    /// order, so two callers with overlapping sets can never deadlock. The wait deadline of
    /// `opts` covers the whole set. Guards come back in sorted key order.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire); locks taken before the failure are released first.
    ///
    /// # Cancel safety
    /// Dropping the future drops the guards taken so far, which release in the background.
    pub async fn acquire_many<S: AsRef<str>>(
        &self,
        keys: &[S],
        opts: &LockOptions,
    ) -> Result<Vec<LockGuard>> {
        let mut sorted: Vec<&str> = keys.iter().map(|k| k.as_ref()).collect();
        for key in &sorted {
            validate_key(key)?;
        }
        sorted.sort_unstable();
        sorted.dedup();
        let started = Instant::now();
        let mut guards = Vec::with_capacity(sorted.len());
        for key in sorted {
            let mut each = opts.clone();
            if let WaitStrategy::Wait(total) = opts.wait {
                each.wait = WaitStrategy::Wait(total.saturating_sub(started.elapsed()));
            }
            match self.acquire(key, &each).await {
                Ok(guard) => guards.push(guard),
                Err(e) => {
                    for guard in guards.drain(..).rev() {
                        let _ = guard.release().await;
                    }
                    return Err(match e {
                        Error::Timeout { key, .. } => Error::Timeout {
                            key,
                            waited: started.elapsed(),
                        },
                        other => other,
                    });
                }
            }
        }
        Ok(guards)
    }

    /// Waits until the background work of this Locker (releases of dropped guards, cleanups
    /// of cancelled attempts) has finished, without stopping it.
    pub async fn settle(&self) {
        self.inner.tasks.wait_idle().await;
    }

    /// Stops granting, releases every lock still held through this Locker (their guards'
    /// `lost()` fires), and waits for background releases to finish. For a graceful stop.
    pub async fn shutdown(&self) {
        self.inner.shut_down.store(true, Ordering::SeqCst);
        for guard in self.inner.held.drain() {
            guard.release_for_shutdown().await;
        }
        self.inner.tasks.wait_idle().await;
    }
}

/// A Locker's FIFO queue entry for a key; removes the key's queue when the last member leaves.
struct QueueSlot<'a> {
    inner: &'a Inner,
    key: &'a str,
    turn: Turn,
}

impl<'a> QueueSlot<'a> {
    fn join(inner: &'a Inner, key: &'a str) -> Self {
        let mut queues = lock(&inner.queues);
        let turn = match queues.get(key) {
            Some(turn) => turn.clone(),
            None => {
                let turn = Turn::default();
                queues.insert(Arc::from(key), turn.clone());
                inner.queued.fetch_add(1, Ordering::SeqCst);
                turn
            }
        };
        QueueSlot { inner, key, turn }
    }
}

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        let mut queues = lock(&self.inner.queues);
        // The map holds one reference and we hold one: nobody else is queued. A key whose
        // holder won it through the queue keeps its entry until that guard ends
        // ([`Inner::holder_ended`]), so that the next waiter queues behind it.
        if Arc::strong_count(&self.turn) == 2 && self.turn.local_holder().is_none() {
            queues.remove(self.key);
            self.inner.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Inner {
    /// Removes `key`'s queue entry when `holder`, the guard it was kept for, has ended and
    /// nobody is queued.
    pub(crate) fn holder_ended(&self, holder: &GuardShared, key: &str) {
        if self.queued.load(Ordering::SeqCst) == 0 {
            return;
        }
        let mut queues = lock(&self.queues);
        let Some(entry) = queues.get(key) else {
            return;
        };
        if Arc::strong_count(entry) == 1 && std::ptr::eq(lock(&entry.holder).as_ptr(), holder) {
            queues.remove(key);
            self.queued.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// How the head waiter's wait behind a sibling holder ended.
enum Woken {
    /// The holder handed the key over (`Some`), or answered that it did not (`None`).
    HandedOver(Option<Lease>),
    /// The holder's guard ended (released, lost or expired).
    Ended,
    /// A release notice for the key.
    Notice,
    Deadline,
}

/// The head waiter's standing request to be handed the key; withdrawn when dropped unless
/// the holder took it already (whose grant, if nobody receives it, the holder releases).
struct HandOffWait<'a> {
    entry: &'a QueueEntry,
    owner: Owner,
    reply: tokio::sync::oneshot::Receiver<Lease>,
}

impl<'a> HandOffWait<'a> {
    fn register(entry: &'a QueueEntry, ttl: Duration) -> Self {
        let owner = Owner::random();
        let (tx, reply) = tokio::sync::oneshot::channel();
        *lock(&entry.hand_off) = Some(HandOffRequest {
            owner,
            ttl,
            reply: Some(tx),
        });
        HandOffWait {
            entry,
            owner,
            reply,
        }
    }

    /// Takes the request back; false when the holder has taken it.
    fn withdraw(&self) -> bool {
        let mut slot = lock(&self.entry.hand_off);
        if slot.as_ref().is_some_and(|r| r.owner == self.owner) {
            *slot = None;
            true
        } else {
            false
        }
    }
}

impl Drop for HandOffWait<'_> {
    fn drop(&mut self) {
        self.withdraw();
    }
}

/// Releases, in the background, what a server call for `owner` that was dropped
/// mid-flight or failed may have granted, unless disarmed once its answer is known.
pub(crate) struct CancelCleanup<'a> {
    inner: &'a Inner,
    key: &'a Arc<str>,
    owner: Owner,
    armed: bool,
}

impl CancelCleanup<'_> {
    /// The call's answer is known: nothing to clean up.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for CancelCleanup<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.inner
                .abandon_in_background(self.key.clone(), self.owner);
        }
    }
}

/// Attempts at [`Backend::abandon`] for one clean-up before the grant is left to its TTL.
const ABANDON_ATTEMPTS: u32 = 5;

impl Inner {
    /// A clean-up for the grant a call on `key` for `owner` may make, armed until
    /// [`CancelCleanup::disarm`].
    pub(crate) fn arm_cleanup<'a>(&'a self, key: &'a Arc<str>, owner: Owner) -> CancelCleanup<'a> {
        CancelCleanup {
            inner: self,
            key,
            owner,
            armed: true,
        }
    }

    /// Forgets, in the background, a server call for `owner` on `key` whose answer never
    /// came ([`Backend::abandon`]): whatever it granted is released, and if it has not
    /// reached the server yet it never grants. Transient failures are retried a few times
    /// with backoff (a paused server can fail the first try too); the task is tracked, so
    /// `shutdown` waits for it.
    pub(crate) fn abandon_in_background(&self, key: Arc<str>, owner: Owner) {
        let backend = self.backend.clone();
        self.tasks.spawn(async move {
            let mut backoff = Backoff::new(ERROR_BACKOFF.0, ERROR_BACKOFF.1);
            for attempt in 1..=ABANDON_ATTEMPTS {
                match backend.as_ref().abandon(&key, owner).await {
                    Ok(()) => return,
                    Err(e) if e.is_transient() && attempt < ABANDON_ATTEMPTS => {
                        tracing::debug!(key = &*key, error = %e, "abandoning an attempt failed; retrying");
                        tokio::time::sleep(backoff.next_delay()).await;
                    }
                    Err(e) => {
                        tracing::debug!(key = &*key, error = %e, "abandoning an attempt failed; a grant it made expires at its TTL");
                        return;
                    }
                }
            }
        });
    }

    /// Releases, in the background, a grant whose answer came but that nobody holds (a
    /// hand-over whose waiter gave up, a lease handed over too late, a grant after
    /// shutdown).
    pub(crate) fn cleanup_in_background(&self, lease: Lease) {
        let backend = self.backend.clone();
        self.tasks.spawn(async move {
            let key = lease.key();
            match backend.as_ref().release(&lease).await {
                Ok(()) => tracing::debug!(key, "released a lock granted to an abandoned attempt"),
                Err(Error::NotHeld { .. }) => {}
                Err(e) => tracing::debug!(key, error = %e, "cleanup of an abandoned attempt failed; the lock expires at its TTL"),
            }
        });
    }
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(86400 * 365 * 30)
}

fn timeout_error(key: &str, started: Option<Instant>) -> Error {
    Error::Timeout {
        key: key.to_owned(),
        waited: started.map(|s| s.elapsed()).unwrap_or_default(),
    }
}

/// Sleeps until `deadline`, forever without one.
async fn sleep_until_deadline(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
}

/// Runs `fut` until `deadline`; `None` when the deadline passed first.
async fn within<F: Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        None => Some(fut.await),
        Some(d) => tokio::time::timeout_at(d.into(), fut).await.ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_validated() {
        assert!(matches!(validate_key(""), Err(Error::InvalidKey { .. })));
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN)).is_ok());
        let err = validate_key(&"é".repeat(MAX_KEY_LEN)).unwrap_err();
        match err {
            Error::InvalidKey { key, .. } => assert!(key.len() <= 64 + '…'.len_utf8()),
            other => panic!("unexpected {other:?}"),
        }
    }
}
