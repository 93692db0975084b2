//! The held lock: [`LockGuard`], the handle on a hold ([`hold`](super::hold)).

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::hold::GuardShared;
use super::queue::LocalHolder;
use super::shared::Shared;
use crate::capabilities::Ttl;
use crate::error::Result;
use crate::lease::Lease;
use crate::options::LockOptions;

/// A held lock. Dropping it releases the lock in the background on the current tokio
/// runtime (tracked by [`Locker::shutdown`](crate::Locker::shutdown)); outside a runtime
/// the lock simply expires at its TTL. [`release`](Self::release) releases and reports.
///
/// With the watchdog on (the default) the lock is renewed every `ttl / 3` until released,
/// on the process's renewal thread, whichever runtime granted it;
/// if a renewal is refused, or the validity passes while the server does not answer,
/// [`lost`](Self::lost) resolves and [`is_lost`](Self::is_lost) turns true. Renewals,
/// [`extend`](Self::extend) and the release reach the server one at a time, in order.
///
/// With a [session-bound](crate::Capabilities::session_bound) backend (a file lock) the
/// grant lasts until it is released or its session ends: the TTL is ignored, no watchdog
/// renews it, [`valid_until`](Self::valid_until) lies a century ahead, and
/// [`lost`](Self::lost) fires only when the backend learns that the session is gone (for a
/// file lock: never while the process lives). Where the text below says the lock expires
/// at its TTL, such a lock stays held until its session ends.
///
/// # Drop
///
/// Dropping a guard that is still held ends the hold at once: the watchdog stops and its
/// [`lost`](Self::lost) futures resolve. The lock is then released
/// - right inside `drop`, when the backend answers in-process
///   ([`Backend::immediate`](crate::Backend::immediate), the memory backend) and no
///   renewal is in flight;
/// - otherwise on a background task of the current tokio runtime, tracked by
///   [`Locker::shutdown`](crate::Locker::shutdown) and
///   [`Locker::settle`](crate::Locker::settle): a renewal in flight finishes first, then
///   the release is sent, or the one-step hand-over to the next waiter of the same Locker
///   when the backend can. Until that release is answered, the dropped guard stays the
///   key's local holder: the Locker's next acquisition of the key waits behind it (and is
///   handed the key at that release) instead of being refused by the server. Outside a
///   tokio runtime that task cannot start, and the lock expires at its TTL.
///
/// The answer of such a release is not reported (use [`release`](Self::release) for it).
/// Dropping a guard whose hold [`Locker::shutdown`](crate::Locker::shutdown) already ended
/// sends nothing.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
/// {
///     let guard = locker.lock("stock/item-42").await?;
///     // ... work under the lock, renewed every ttl / 3 meanwhile ...
///     println!("holding {} with fence {}", guard.key(), guard.fence());
/// } // dropped here: released in the background
/// # Ok(()) }
/// ```
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    shared: Arc<GuardShared>,
    state: State,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("fence", &self.fence())
            .field("valid_until", &self.valid_until())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LockGuard {
    /// A guard of `lease`, granted at `granted_at`.
    pub(crate) fn new(
        locker: &Arc<Shared>,
        lease: Lease,
        ttl: Ttl,
        opts: &LockOptions,
        granted_at: Instant,
    ) -> Self {
        LockGuard {
            shared: GuardShared::start(locker, lease, ttl, opts, granted_at),
            state: State::Held,
        }
    }

    /// When the hold began (this process's monotonic clock, read at the grant).
    pub(crate) fn granted_at(&self) -> Instant {
        self.shared.granted_at()
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        self.shared.key()
    }

    /// The guard's hold as the key's queue records it.
    pub(crate) fn downgrade(&self) -> Weak<dyn LocalHolder> {
        Arc::downgrade(&self.shared) as Weak<dyn LocalHolder>
    }

    /// The permits this grant holds of its key ([`Permits::LOCK`](crate::Permits::LOCK)
    /// for a lock).
    pub fn permits(&self) -> crate::Permits {
        self.shared.granted().permits()
    }

    /// The fencing token of this grant: pass it to the protected resource, which refuses
    /// writes carrying a token lower than one it has already seen.
    pub fn fence(&self) -> u64 {
        self.shared.granted().fence()
    }

    /// Until when the lock is ours unless renewed (monotonic clock of this process). While
    /// a renewal or [`extend`](Self::extend) is on its way it is the earlier of the
    /// validity before it and what its TTL guarantees.
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// The TTL the lock is renewed with (after the backend's rounding).
    pub fn ttl(&self) -> Duration {
        self.shared.ttl().get()
    }

    /// A copy of the lease as the backend granted it.
    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// Whether the lock is known gone: renewal refused, released by shutdown, or validity
    /// passed. Once true it stays true.
    pub fn is_lost(&self) -> bool {
        self.shared.is_gone() || Instant::now() >= self.valid_until()
    }

    /// A future that resolves as soon as the lock is known gone: a renewal was refused, the
    /// validity passed without a successful renewal (server unreachable, or watchdog off),
    /// the Locker was shut down, or the guard was dropped. It does not borrow the guard.
    ///
    /// It resolves at once when the lock is already known gone, and also once
    /// [`release`](Self::release) has its answer. A renewal or [`extend`](Self::extend) that
    /// moves the validity moves the instant it waits for. Any number of these futures can be
    /// made; each resolves on its own.
    ///
    /// # Cancel safety
    /// Dropping the future has no effect on the guard or the lock; a new one can be made at
    /// any time (the method is cancel safe).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// # async fn copy_the_files() {}
    /// let guard = locker.lock("jobs/sync").await?;
    /// tokio::select! {
    ///     _ = guard.lost() => eprintln!("lock lost: stopping the sync"),
    ///     _ = copy_the_files() => guard.release().await?,
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        GuardShared::ended(self.shared.clone())
    }

    /// Renews the lock for `ttl` from now (also changing the watchdog's TTL), after any
    /// renewal already on its way. A lock whose validity passed is lost and not renewed.
    ///
    /// `ttl` goes through the backend's rules first
    /// ([`Capabilities::effective_ttl`](crate::Capabilities::effective_ttl)); the watchdog
    /// takes the new TTL once the server applied it, and its next renewal comes a third of
    /// the new TTL after the answer (a watchdog turn that fell due meanwhile is dropped). While the request is on its way,
    /// [`valid_until`](Self::valid_until) is the earlier of the validity before it and what
    /// the new TTL guarantees. With the watchdog off, this is how a holder keeps its lock.
    ///
    /// # Errors
    /// [`Error::InvalidTtl`](crate::Error::InvalidTtl); [`Error::NotHeld`](crate::Error::NotHeld) when the lock is no longer ours (the guard
    /// is then lost for good); transient backend errors (the validity is then at most what
    /// the shorter of the old and the new TTL guarantees).
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) comes without a server call when the guard is already known lost,
    /// its validity passed, or [`Locker::shutdown`](crate::Locker::shutdown) ended the hold.
    /// After a transient error the guard is not lost (unless its validity passed meanwhile)
    /// and the watchdog, when on, goes on renewing.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the extension applied on the server or not; the
    /// guard's validity is then the earlier of the two outcomes, and the watchdog goes on.
    /// It goes on with the TTL it had: the new one is taken only from an answered
    /// extension. Dropped while it waits for a renewal on its way, it has sent nothing.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::LockOptions;
    ///
    /// // No watchdog: the holder renews by hand between the steps of a long job.
    /// let opts = LockOptions::new().ttl(Duration::from_secs(10)).watchdog(false);
    /// let guard = locker.acquire("jobs/migrate", &opts).await?;
    /// for step in 0..3 {
    ///     // ... step `step`, well under 10 s ...
    ///     guard.extend(Duration::from_secs(10)).await?;
    /// }
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let ttl = self.shared.caps().effective_ttl(ttl)?;
        self.shared.extend(ttl).await?;
        tracing::debug!(key = self.key(), ?ttl, "lock extended");
        Ok(())
    }

    /// Releases the lock and reports whether it was still ours (`Ok`) or already gone
    /// ([`Error::NotHeld`](crate::Error::NotHeld)). A renewal on its way finishes first. When a waiter of the
    /// same Locker is queued on the key (and the backend can), the release is the one-step
    /// hand-over of the key to it.
    ///
    /// `Ok` means the lock was still this guard's when the release (or hand-over) was sent:
    /// the server found it ours, and its validity had not passed. A key is handed over at
    /// most 16 times in a row, and never after
    /// [`Locker::shutdown`](crate::Locker::shutdown). When the call returns, with or
    /// without an error, the hold has ended: [`lost`](Self::lost) has resolved.
    ///
    /// # Errors
    /// [`Error::NotHeld`](crate::Error::NotHeld); transient backend errors (the lock then expires at its TTL).
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) when the lock expired, was taken over, or was already released by
    /// [`Locker::shutdown`](crate::Locker::shutdown) (then nothing is sent). When a hand-over
    /// fails with an error it may or may not have happened: what the waiter may have been
    /// granted is released in the background, the error is returned, and a lock that was
    /// not handed over expires at its TTL.
    ///
    /// # Cancel safety
    /// If the future is dropped before completing, the release continues in the background.
    /// It continues as a dropped guard's does (see [Drop](LockGuard#drop)): on the current
    /// tokio runtime, tracked by [`Locker::shutdown`](crate::Locker::shutdown); outside a
    /// runtime the lock expires at its TTL. Its answer is then not reported.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// use lock_core::Error;
    ///
    /// let guard = locker.lock("stock/item-42").await?;
    /// // ... write, passing guard.fence() to the store ...
    /// match guard.release().await {
    ///     Ok(()) => {}
    ///     // Expired or taken over meanwhile: the writes may have raced another holder.
    ///     Err(Error::NotHeld { key }) => eprintln!("{key} was no longer ours"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn release(mut self) -> Result<()> {
        if !self.shared.finish() {
            return Err(self.shared.not_held());
        }
        // From here until the answer, a dropped future leaves the release to `Drop`, which
        // finishes it in the background.
        self.state = State::Releasing;
        let result = self.shared.end_on_server().await;
        self.state = State::Ended;
        result
    }
}

/// Where a guard is in its life, for `Drop`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Held,
    /// `release` claimed the end of the hold and awaits the backend.
    Releasing,
    Ended,
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        match self.state {
            State::Held => {
                if self.shared.finish() {
                    self.shared.release_in_background();
                }
            }
            State::Releasing => self.shared.release_in_background(),
            // The release's answer already marked the hold gone.
            State::Ended => return,
        }
        self.shared.set_gone();
    }
}
