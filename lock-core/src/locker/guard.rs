//! The held lock: [`LockGuard`], its watchdog and its lost signal.
//!
//! Every server operation on a guard's lease (a watchdog renewal, a user's `extend`, the
//! release or the hand-over to the next local waiter) passes through one small state
//! machine, one operation at a time, in order:
//!
//! - **held**: renewals and extensions run one after another (the `ops` mutex); the
//!   validity only ever comes from the operation the server applied last;
//! - **ending** (`done`): claimed once by `release`, `Drop` or `Locker::shutdown`; the
//!   watchdog stops, a renewal in flight finishes, and only then the release (or the
//!   hand-over) is sent;
//! - **lost**: the lock is known gone (renewal refused, validity passed); a lost lease is
//!   never renewed again.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::handover;
use super::queue::{HandOverRequest, LocalHolder};
use super::shared::{Held, Shared};
use crate::backend::Ttl;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::registry::Slot;
use crate::sync::lock;

struct GuardShared {
    slot: Slot,
    locker: Arc<Shared>,
    /// The lease as granted: its key, owner and fence never change during a hold.
    granted: Lease,
    /// The validity now (moved by renewals) and the TTL renewals use.
    validity: Mutex<(Instant, Ttl)>,
    /// Set when the lock is known gone (or the hold ended); never cleared.
    lost: AtomicBool,
    /// Wakes `lost()` futures on every change of `lost` or of the validity.
    changed: Notify,
    /// Whether a `lost()` future was ever made: if not, nobody needs waking.
    watched: AtomicBool,
    /// Set once by whoever ends the hold: `release`, `Drop` or `Locker::shutdown`.
    done: AtomicBool,
    /// One server operation on the lease at a time: renewals, `extend`, release and
    /// hand-over take it for the whole of their server call.
    ops: tokio::sync::Mutex<()>,
    /// Tells the watchdog to stop (a stored permit: a stop before it waits is not missed).
    stop: Notify,
}

impl GuardShared {
    fn lease(&self) -> Lease {
        let mut lease = self.granted.clone();
        lease.set_valid_until(self.valid_until());
        lease
    }

    fn valid_until(&self) -> Instant {
        lock(&self.validity).0
    }

    fn not_held(&self) -> Error {
        self.granted.not_held()
    }

    /// Renews the lease for `ttl` from now: one operation, after every earlier one.
    ///
    /// A lost or ended lease is never renewed, and one whose validity passed is lost. Until
    /// the server answers, the validity is lowered to what the new TTL alone guarantees
    /// when that is earlier (a shorter TTL may be applied on the server before its answer
    /// arrives, or without one), so a renewal that is cut off or fails never leaves the
    /// guard believing in more than the server may keep.
    async fn renew(&self, ttl: Ttl) -> Result<Instant> {
        let _op = self.ops.lock().await;
        if self.is_done() || self.is_gone() {
            return Err(self.not_held());
        }
        let sent = Instant::now();
        let current = self.valid_until();
        if sent >= current {
            self.mark_lost("validity passed before the renewal");
            return Err(self.not_held());
        }
        let bound = self.locker.caps.validity(sent, ttl.get());
        if bound < current {
            self.set_validity(bound, None);
        }
        let lease = self.lease();
        match self.locker.proto().extend(&lease, ttl).await {
            Ok(valid_until) => {
                self.set_validity(valid_until, Some(ttl));
                Ok(valid_until)
            }
            Err(e) => {
                if matches!(e, Error::NotHeld { .. }) {
                    self.mark_lost("renewal refused: the lock is no longer ours");
                } else if Instant::now() >= self.valid_until() {
                    self.mark_lost("validity passed while renewals failed");
                }
                Err(e)
            }
        }
    }

    fn key(&self) -> &str {
        self.granted.key()
    }

    /// Whether the hold is known ended (released, lost).
    fn is_gone(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    /// Resolves as soon as the hold is known ended: `lost` set, or the validity passed
    /// without a renewal.
    fn ended(shared: Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        shared.watched.store(true, Ordering::SeqCst);
        async move {
            loop {
                let changed = shared.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if shared.lost.load(Ordering::SeqCst) {
                    return;
                }
                let valid_until = shared.valid_until();
                tokio::select! {
                    _ = changed => {}
                    _ = tokio::time::sleep_until(valid_until.into()) => {
                        if shared.valid_until() <= valid_until {
                            return;
                        }
                    }
                }
            }
        }
    }

    fn set_validity(&self, valid_until: Instant, ttl: Option<Ttl>) {
        {
            let mut validity = lock(&self.validity);
            validity.0 = valid_until;
            if let Some(ttl) = ttl {
                validity.1 = ttl;
            }
        }
        self.wake_watchers();
    }

    fn wake_watchers(&self) {
        if self.watched.load(Ordering::SeqCst) {
            self.changed.notify_waiters();
        }
    }

    /// Marks the hold ended (released, dropped) so `lost()` futures resolve.
    fn set_gone(&self) -> bool {
        let was_lost = self.lost.swap(true, Ordering::SeqCst);
        if !was_lost {
            self.wake_watchers();
            self.stop.notify_one();
        }
        was_lost
    }

    fn mark_lost(&self, why: &str) {
        let was_lost = self.set_gone();
        if !was_lost && !self.done.load(Ordering::SeqCst) {
            tracing::warn!(
                key = self.key(),
                fence = self.granted.fence(),
                backend = self.locker.caps.name,
                why,
                "lock lost"
            );
        }
    }

    /// Claims the end of the hold; false when someone else already ended it. The watchdog
    /// stops at its next look.
    fn finish(&self) -> bool {
        if self.done.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.stop.notify_one();
        self.locker.held.remove(self.slot);
        true
    }

    /// Ends the hold on the server, after a renewal in flight finished: passes the key to
    /// the head waiter queued behind this guard when there is one, releases it otherwise.
    /// Called once, after [`finish`](Self::finish).
    async fn end_on_server(&self) -> Result<()> {
        let _op = self.ops.lock().await;
        if let Some(answer) = self.release_now() {
            return answer;
        }
        let sent = Instant::now();
        let lease = self.lease();
        // Kept to the end: a waiter whose request was taken waits for it to be answered or
        // dropped, and attempts on the server only then.
        let mut request = handover::take(&self.locker, self, self.key());
        if let Some(request) = request.as_mut().filter(|_| lease.valid_until() > sent) {
            if let Some(result) = self.hand_over(&lease, request).await {
                return self.released(result);
            }
        }
        let result = self.locker.proto().release(&lease).await;
        drop(request);
        self.released(result.and_then(|()| self.held_until(sent)))
    }

    /// `Ok` when this guard's validity lasted until `sent`, `NotHeld` otherwise.
    fn held_until(&self, sent: Instant) -> Result<()> {
        if self.valid_until() > sent {
            Ok(())
        } else {
            Err(self.not_held())
        }
    }

    /// Passes the key straight to the waiter queued behind this guard
    /// ([`handover::give`]), in place of the release; `None` when it did not happen and the
    /// lock is still to be released.
    async fn hand_over(&self, lease: &Lease, request: &mut HandOverRequest) -> Option<Result<()>> {
        let sent = Instant::now();
        let given = handover::give(&self.locker, lease, request).await?;
        Some(given.and_then(|()| self.held_until(sent)))
    }

    /// The release answered at once by an in-process backend (no copy of the lease);
    /// `None` when the backend needs the async call.
    fn release_now(&self) -> Option<Result<()>> {
        let result = self.locker.proto().immediate()?.release(&self.granted);
        Some(self.released(result))
    }

    fn released(&self, result: Result<()>) -> Result<()> {
        self.set_gone();
        self.locker.queues.holder_ended(self, self.key());
        let key = self.key();
        match &result {
            Ok(()) => tracing::debug!(key, fence = self.granted.fence(), "lock released"),
            Err(e) => tracing::debug!(key, error = %e, "release found the lock gone"),
        }
        result
    }

    /// Ends the hold from `Drop`: at once when the backend answers in-process and no
    /// operation is in flight, else on a background task.
    fn release_in_background(self: &Arc<Self>) {
        if let Ok(op) = self.ops.try_lock() {
            if self.release_now().is_some() {
                drop(op);
                return;
            }
        }
        let me = self.clone();
        let spawned = self.locker.tasks.spawn(async move {
            let _ = me.end_on_server().await;
        });
        if !spawned {
            tracing::debug!(
                key = self.key(),
                "guard dropped outside a tokio runtime; the lock expires at its TTL"
            );
            self.set_gone();
            self.locker.queues.holder_ended(&**self, self.key());
        }
    }
}

impl Held for GuardShared {
    fn release_for_shutdown(self: Arc<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            if self.finish() {
                if let Err(e) = self.end_on_server().await {
                    tracing::debug!(error = %e, "shutdown release failed");
                }
            }
        })
    }
}

impl LocalHolder for GuardShared {
    fn is_live(&self) -> bool {
        !self.is_gone() && self.valid_until() > Instant::now()
    }

    fn ended(self: Arc<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(GuardShared::ended(self))
    }
}

/// A held lock. Dropping it releases the lock in the background on the current tokio
/// runtime (tracked by [`Locker::shutdown`](crate::Locker::shutdown)); outside a runtime
/// the lock simply expires at its TTL. [`release`](Self::release) releases and reports.
///
/// With the watchdog on (the default) the lock is renewed every `ttl / 3` until released;
/// if a renewal is refused, or the validity passes while the server does not answer,
/// [`lost`](Self::lost) resolves and [`is_lost`](Self::is_lost) turns true. Renewals,
/// [`extend`](Self::extend) and the release reach the server one at a time, in order.
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
///   when the backend can. Outside a tokio runtime that task cannot start, and the lock
///   expires at its TTL.
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
    pub(crate) fn new(locker: &Arc<Shared>, lease: Lease, ttl: Ttl, watchdog: bool) -> Self {
        let shared = locker.held.insert(|slot| {
            let shared = Arc::new(GuardShared {
                slot,
                locker: locker.clone(),
                validity: Mutex::new((lease.valid_until(), ttl)),
                granted: lease,
                lost: AtomicBool::new(false),
                changed: Notify::new(),
                watched: AtomicBool::new(false),
                done: AtomicBool::new(false),
                ops: tokio::sync::Mutex::new(()),
                stop: Notify::new(),
            });
            (shared.clone() as Arc<dyn Held>, shared)
        });
        if watchdog {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(run_watchdog(shared.clone()));
            }
        }
        LockGuard {
            shared,
            state: State::Held,
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        self.shared.key()
    }

    /// The guard's hold as the key's queue records it.
    pub(crate) fn downgrade(&self) -> Weak<dyn LocalHolder> {
        Arc::downgrade(&self.shared) as Weak<dyn LocalHolder>
    }

    /// The fencing token of this grant: pass it to the protected resource, which refuses
    /// writes carrying a token lower than one it has already seen.
    pub fn fence(&self) -> u64 {
        self.shared.granted.fence()
    }

    /// Until when the lock is ours unless renewed (monotonic clock of this process). While
    /// a renewal or [`extend`](Self::extend) is on its way it is the earlier of the
    /// validity before it and what its TTL guarantees.
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// The TTL the lock is renewed with (after the backend's rounding).
    pub fn ttl(&self) -> Duration {
        lock(&self.shared.validity).1.get()
    }

    /// A copy of the lease as the backend granted it.
    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// Whether the lock is known gone: renewal refused, released by shutdown, or validity
    /// passed. Once true it stays true.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.load(Ordering::SeqCst) || Instant::now() >= self.valid_until()
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
    /// takes the new TTL once the server applied it. While the request is on its way,
    /// [`valid_until`](Self::valid_until) is the earlier of the validity before it and what
    /// the new TTL guarantees. With the watchdog off, this is how a holder keeps its lock.
    ///
    /// # Errors
    /// [`Error::InvalidTtl`]; [`Error::NotHeld`] when the lock is no longer ours (the guard
    /// is then lost for good); transient backend errors (the validity is then at most what
    /// the shorter of the old and the new TTL guarantees).
    ///
    /// [`Error::NotHeld`] comes without a server call when the guard is already known lost,
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
        let ttl = self.shared.locker.caps.effective_ttl(ttl)?;
        self.shared.renew(ttl).await?;
        tracing::debug!(key = self.key(), ?ttl, "lock extended");
        Ok(())
    }

    /// Releases the lock and reports whether it was still ours (`Ok`) or already gone
    /// ([`Error::NotHeld`]). A renewal on its way finishes first. When a waiter of the
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
    /// [`Error::NotHeld`]; transient backend errors (the lock then expires at its TTL).
    ///
    /// [`Error::NotHeld`] when the lock expired, was taken over, or was already released by
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

/// Renews the lease every `ttl / 3` until the hold ends or the lock is lost. Each renewal
/// is bounded by the validity: one that has not answered by then loses the lock.
async fn run_watchdog(shared: Arc<GuardShared>) {
    let mut next = Instant::now() + lock(&shared.validity).1.get() / 3;
    loop {
        tokio::select! {
            biased;
            _ = shared.stop.notified() => {}
            _ = tokio::time::sleep_until(next.into()) => {}
        }
        if shared.is_done() || shared.is_gone() {
            return;
        }
        let ttl = lock(&shared.validity).1;
        let period = ttl.get() / 3;
        let valid_until = shared.valid_until();
        match tokio::time::timeout_at(valid_until.into(), shared.renew(ttl)).await {
            Ok(Ok(_)) => {
                tracing::debug!(key = shared.key(), "lock renewed");
                next = Instant::now() + period;
            }
            Ok(Err(_)) if shared.is_done() || shared.is_gone() => return,
            Ok(Err(e)) => {
                tracing::debug!(key = shared.key(), error = %e, "renewal failed; retrying");
                let now = Instant::now();
                let left = shared.valid_until().saturating_duration_since(now);
                next = now + (period / 4).min(left / 2).max(Duration::from_millis(1));
            }
            Err(_) => {
                if !shared.is_done() {
                    shared.mark_lost("validity passed while the server did not answer");
                }
                return;
            }
        }
    }
}
