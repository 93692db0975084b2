//! The waiting policy: [`Locker`], and the guards it hands out.
//!
//! The modules depend on each other in one direction only: this one (the public API) on
//! `acquire` (attempts and the waiting loop), which uses `guard`, which uses `handover`,
//! `shared`, `queue` and `deadline`; `queue`, `deadline` and `watchdog` (the renewal
//! schedule, which `hold` fills) depend on nothing here.

mod acquire;
mod deadline;
pub(crate) mod election;
mod guard;
mod handover;
mod hold;
mod jobs;
mod metrics;
mod observe;
mod queue;
mod shared;
mod stop;
mod types;
mod watchdog;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::backend::Backend;
use crate::capabilities::Capabilities;
use crate::error::{Error, Result};
use crate::lease::LockKey;
use crate::options::{LockOptions, WaitStrategy};

pub use guard::LockGuard;
pub use observe::{Event, Observer};
use shared::{Line, Shared};
pub use types::{validate_key, LockerStats, Outcome, MAX_KEY_LEN};

/// Hands out locks from one backend with one waiting policy, the same on every backend.
///
/// Waiters of one Locker for the same key line up in a local FIFO queue and only the head
/// of the queue attempts on the backend: a networked server sees one contender per process
/// and waiters inside a process are served in arrival order. A Locker is cheap to clone
/// (all clones share the queues and the set of held guards).
///
/// While a guard of this Locker holds the key, the head waiter does not attempt at all: it
/// waits for that guard's end. On a backend with a [`HandOver`](crate::HandOver), the holder's
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
///
/// # Drop
///
/// Guards and background releases keep what they need of the Locker, so dropping the last
/// clone of a Locker ends nothing. But background work runs on the runtime that started
/// it: a program that returns from `main` right after dropping its guards cuts their
/// releases short, and the locks stay on the server for their TTL. End a program with
/// [`shutdown`](Self::shutdown); a Locker whose last clone is dropped while guards are held
/// or background releases are on their way says so with a `tracing` warning naming how
/// many.
#[derive(Clone)]
pub struct Locker {
    inner: Arc<Shared>,
    /// Dropped with the last clone: warns of what is still outstanding.
    _last: Arc<LastClone>,
}

/// Warns, when the last clone of a Locker is dropped, of the guards still held and the
/// background releases still on their way.
struct LastClone(Arc<Shared>);

impl Drop for LastClone {
    fn drop(&mut self) {
        let (held, background) = (self.0.held.len(), self.0.tasks.len());
        if held > 0 || background > 0 {
            tracing::warn!(
                backend = self.0.caps.name,
                held,
                background,
                "a Locker was dropped with {held} locks held and {background} background \
                 releases on their way: they end with their guards and runtimes, and a lock \
                 whose release is cut short stays on the server for its TTL; call \
                 Locker::shutdown().await before the program returns"
            );
        }
    }
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
        let inner = Arc::new(Shared::new(backend, defaults));
        Locker {
            _last: Arc::new(LastClone(inner.clone())),
            inner,
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
            queued_keys: self.inner.queues.len(),
            background_tasks: self.inner.tasks.len(),
            renewals_scheduled: self.inner.watchdog.len(),
        }
    }

    /// Acquires `key` with the default options.
    ///
    /// The same as [`acquire`](Self::acquire) with [`default_options`](Self::default_options):
    /// [`LockOptions::default`] (30 s TTL, wait up to 30 s, watchdog on) unless the Locker
    /// was built [`with_options`](Self::with_options).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire): dropping the future leaves no lock held and no waiter
    /// queued.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// let guard = locker.lock("stock/item-42").await?;
    /// // ... read, check and write the item: no other holder of the key runs this now ...
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn lock<K: LockKey + ?Sized>(&self, key: &K) -> Result<LockGuard> {
        let opts = self.inner.defaults.clone();
        self.acquire(key, &opts).await
    }

    /// One attempt at `key` with the default TTL and watchdog setting: `Ok(None)` when the
    /// lock is taken.
    ///
    /// The default wait strategy is not used: this is [`acquire`](Self::acquire) with
    /// [`WaitStrategy::Skip`]. The attempt is made at once, without queueing behind this
    /// Locker's waiters for the key, and a transient failure is returned, not retried.
    ///
    /// # Errors
    /// Invalid key or TTL ([`Error::InvalidKey`](crate::Error::InvalidKey), [`Error::InvalidTtl`](crate::Error::InvalidTtl), before any I/O), or
    /// the backend failed (transient errors such as [`Error::Unavailable`](crate::Error::Unavailable) included);
    /// [`Error::Shutdown`](crate::Error::Shutdown) after [`shutdown`](Self::shutdown). A taken lock is `Ok(None)`,
    /// never [`Error::Locked`](crate::Error::Locked).
    ///
    /// # Cancel safety
    /// Dropping the future leaves no lock held: an attempt in flight is abandoned in the
    /// background ([`Backend::abandon`], tracked by [`shutdown`](Self::shutdown) and
    /// [`settle`](Self::settle)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// match locker.try_acquire("jobs/nightly").await? {
    ///     Some(guard) => {
    ///         // ... the job ...
    ///         guard.release().await?;
    ///     }
    ///     None => println!("another replica runs the job"),
    /// }
    /// # Ok(()) }
    /// ```
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
    /// The TTL goes through the backend's rules ([`Capabilities::effective_ttl`]) first.
    /// When nobody of this Locker is queued on the key, the first attempt is made at once;
    /// otherwise the caller joins the key's local FIFO queue and attempts only when it is at
    /// its head (see [`Locker`] for the wait behind a local holder and the hand-over). With
    /// [`WaitStrategy::Skip`] there is one attempt and no queueing; a transient failure is
    /// then returned, not retried. The wait deadline covers the whole acquisition, queueing
    /// included. An [`Observer`] set by [`observe`](Self::observe) is told of the wait, the
    /// retries and the grant.
    ///
    /// The guard releases the lock when dropped (in the background) or by
    /// [`LockGuard::release`].
    ///
    /// # Errors
    /// - [`Error::InvalidKey`](crate::Error::InvalidKey) / [`Error::InvalidTtl`](crate::Error::InvalidTtl) for bad input, before any I/O;
    /// - [`Error::Locked`](crate::Error::Locked) with [`WaitStrategy::Skip`] when the lock is taken;
    /// - [`Error::Timeout`](crate::Error::Timeout) when the wait deadline passed while the lock was taken;
    /// - the last transient error (e.g. [`Error::Unavailable`](crate::Error::Unavailable)) when the deadline passed
    ///   while the server failed; non-transient backend errors at once;
    /// - [`Error::Shutdown`](crate::Error::Shutdown) after [`shutdown`](Self::shutdown) (also for an acquisition
    ///   under way when the Locker is shut down: the grant it then receives is released).
    ///
    /// # Cancel safety
    /// Dropping the future at any await leaves no lock held and no waiter queued: an attempt
    /// in flight when the future is dropped is released in the background (tracked by
    /// [`shutdown`](Self::shutdown)): it is abandoned through [`Backend::abandon`], retried a
    /// few times on transient errors, so that it never grants later either. A key being
    /// handed over to the dropped waiter is released in the background by the former holder.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{Error, LockOptions};
    ///
    /// let opts = LockOptions::new()
    ///     .ttl(Duration::from_secs(10))
    ///     .wait_for(Duration::from_secs(2));
    /// match locker.acquire("jobs/nightly", &opts).await {
    ///     Ok(guard) => {
    ///         println!("fencing token {}", guard.fence());
    ///         guard.release().await?;
    ///     }
    ///     Err(Error::Timeout { waited, .. }) => println!("still taken after {waited:?}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn acquire<K: LockKey + ?Sized>(
        &self,
        key: &K,
        opts: &LockOptions,
    ) -> Result<LockGuard> {
        // The clock is read at the call for an observer; otherwise only once the answer is
        // not immediate: an acquisition answered at once by an in-process backend (memory)
        // is recorded as taking no time, which spares the uncontended cycle a clock read.
        let mut called = self.inner.observer.get().map(|_| Instant::now());
        let mut waited = false;
        let result = self.acquire_at(key, opts, &mut called, &mut waited).await;
        let ended = match &result {
            Ok(guard) => guard.granted_at(),
            Err(_) => Instant::now(),
        };
        let called = called.unwrap_or(ended);
        self.inner.metrics.with(opts.metrics_label, |s| {
            s.acquired(&result, called, ended, waited);
        });
        result
    }

    /// [`acquire`](Self::acquire); `called` is when it was called (read here after an
    /// immediate attempt that did not answer, when not read already); sets `waited` when
    /// the acquisition waits (joins the key's queue).
    async fn acquire_at<K: LockKey + ?Sized>(
        &self,
        key: &K,
        opts: &LockOptions,
        called: &mut Option<Instant>,
        waited: &mut bool,
    ) -> Result<LockGuard> {
        let observed = *called;
        let key_str = key.as_key();
        // Refused before any I/O: counted here (server calls count their own errors).
        let refused = |e: Error| {
            self.inner.metrics.with(opts.metrics_label, |s| s.error(&e));
            e
        };
        validate_key(key_str).map_err(refused)?;
        let ttl = self.inner.caps.effective_ttl(opts.ttl).map_err(refused)?;
        self.inner
            .caps
            .check_permits(opts.permits)
            .map_err(refused)?;
        if self.inner.shut_down.load(Ordering::SeqCst) {
            return Err(refused(Error::Shutdown));
        }
        // An in-process backend never yields: take part in tokio's cooperative budget, as
        // tokio's own mutex does, so a task looping on locks cannot starve its neighbours.
        tokio::task::coop::consume_budget().await;
        // One shared copy of the key, for the lease and (in memory) the lock table.
        let shared_key: Arc<str> = key.to_shared();
        let key: &str = &shared_key;
        let skip = matches!(opts.wait, WaitStrategy::Skip);
        // Fast path: nobody of ours is queued on this key, so trying first is fair.
        let first_try = skip || self.inner.queues.is_free(key);
        // An in-process backend answers at once: no deadline is needed for that attempt.
        let mut tried = false;
        let mut announced = false;
        if first_try {
            if let Some(answer) = acquire::attempt_now(&self.inner, &shared_key, ttl, opts) {
                match answer {
                    Ok(Ok(guard)) => return self.granted(guard, observed),
                    Ok(Err(_)) if skip => {
                        return Err(Error::Locked {
                            key: key.to_owned(),
                        })
                    }
                    Err(e) if skip || !e.is_transient() => return Err(e),
                    Ok(Err(_)) => {
                        self.inner.observe(|| Event::Waiting { key });
                        tried = true;
                        announced = true;
                    }
                    Err(e) => {
                        self.inner.observe(|| Event::Retrying { key, error: &e });
                        tried = true;
                    }
                }
            }
        }
        let now = *called.get_or_insert_with(Instant::now);
        // The place in a line the server keeps, for every attempt below: left before an
        // answer other than its owner's grant, abandoned in the background if cancelled.
        let mut line = Line::new(&self.inner, &shared_key);
        let result = async {
            let (started, deadline) = match opts.wait {
                WaitStrategy::Skip => {
                    return match acquire::attempt(&self.inner, &shared_key, ttl, opts, &mut line)
                        .await?
                    {
                        Ok(guard) => self.granted(guard, observed),
                        Err(_) => Err(Error::Locked {
                            key: key.to_owned(),
                        }),
                    };
                }
                WaitStrategy::Wait(t) => (
                    Some(now),
                    Some(now.checked_add(t).unwrap_or_else(deadline::far_future)),
                ),
                // The start only matters for the error message of a bounded wait.
                WaitStrategy::WaitForever => (None, None),
            };
            if first_try && !tried {
                let first = match deadline {
                    None => {
                        Some(acquire::attempt(&self.inner, &shared_key, ttl, opts, &mut line).await)
                    }
                    Some(d) => tokio::time::timeout_at(
                        d.into(),
                        acquire::attempt(&self.inner, &shared_key, ttl, opts, &mut line),
                    )
                    .await
                    .ok(),
                };
                match first {
                    None => return Err(deadline::timeout_error(key, started)),
                    Some(Ok(Ok(guard))) => return self.granted(guard, observed),
                    Some(Err(e)) if !e.is_transient() => return Err(e),
                    Some(Ok(Err(_))) => {
                        self.inner.observe(|| Event::Waiting { key });
                        announced = true;
                    }
                    Some(Err(e)) => self.inner.observe(|| Event::Retrying { key, error: &e }),
                }
            }
            *waited = true;
            // Boxed: the waiting state machine is large, and the uncontended path above should
            // not carry (and move) it.
            Box::pin(acquire::queued(
                &self.inner,
                &shared_key,
                ttl,
                opts,
                started,
                deadline,
                announced,
                &mut line,
            ))
            .await
            .and_then(|guard| self.granted(guard, observed))
        }
        .await;
        if result.is_err() {
            if let Some(line) = line.as_mut() {
                line.leave().await;
            }
        }
        result
    }

    /// A grant, told to the observer (with the time since `observed`) when there is one.
    fn granted(&self, guard: LockGuard, observed: Option<Instant>) -> Result<LockGuard> {
        if let Some(started) = observed {
            self.inner.observe(|| Event::Granted {
                key: guard.key(),
                fence: guard.fence(),
                waited: started.elapsed(),
            });
        }
        Ok(guard)
    }

    /// Sets the [`Observer`] told of this Locker's contention and retries (shared by its
    /// clones); `false` when one was set already (the first one stays).
    ///
    /// Every acquisition through this Locker ([`acquire`](Self::acquire), and so
    /// [`lock`](Self::lock), [`try_acquire`](Self::try_acquire), [`run`](Self::run) and
    /// [`acquire_many`](Self::acquire_many)) tells it, on the acquiring task: once
    /// [`Event::Waiting`] when its wait begins, [`Event::Retrying`] for each transient
    /// failure, and [`Event::Granted`] with the time the acquisition took. With
    /// [`WaitStrategy::Skip`] only grants are told. An observer cannot be removed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// use lock_core::Event;
    ///
    /// locker.observe(|event: &Event<'_>| {
    ///     if let Event::Waiting { key } = event {
    ///         eprintln!("waiting for {key}");
    ///     }
    /// });
    /// # Ok(()) }
    /// ```
    pub fn observe(&self, observer: impl Observer) -> bool {
        self.inner.observer.set(Box::new(observer)).is_ok()
    }
}
