//! The held lock: [`LockGuard`], its watchdog and its lost signal.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio::task::AbortHandle;

use crate::backend::Attempt;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::locker::{CancelCleanup, HandOffRequest, Inner, QueueEntry};
use crate::notices::lock;
use crate::registry::Slot;

pub(crate) struct GuardShared {
    slot: Slot,
    locker: Arc<Inner>,
    /// The lease as granted: its key, owner and fence never change during a hold.
    granted: Lease,
    /// The validity now (moved by renewals) and the TTL renewals use.
    validity: Mutex<(Instant, Duration)>,
    /// Set when the lock is known gone (or the hold ended); never cleared.
    lost: AtomicBool,
    /// Wakes `lost()` futures on every change of `lost` or of the validity.
    changed: Notify,
    /// Whether a `lost()` future was ever made: if not, nobody needs waking.
    watched: AtomicBool,
    /// Set once by whoever ends the hold: `release`, `Drop` or `Locker::shutdown`; the
    /// watchdog stops when it sees it.
    done: AtomicBool,
    /// The lock as the server holds it once it was staged for the next local waiter
    /// ([`Backend::hand_over`](crate::Backend::hand_over) while this guard still holds):
    /// that waiter's lease, which this guard's renewals and release then act on.
    successor: Mutex<Option<Lease>>,
}

impl GuardShared {
    fn lease(&self) -> Lease {
        let mut lease = self.granted.clone();
        lease.set_valid_until(self.valid_until());
        lease
    }

    pub(crate) fn valid_until(&self) -> Instant {
        lock(&self.validity).0
    }

    /// The lock as the server holds it: this guard's lease, or its staged successor's.
    pub(crate) fn server_lease(&self) -> Lease {
        lock(&self.successor)
            .clone()
            .unwrap_or_else(|| self.lease())
    }

    /// Records the lease the lock was staged to for the next waiter.
    pub(crate) fn staged(&self, successor: Lease) {
        *lock(&self.successor) = Some(successor);
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    /// Extends the lock on the server (whichever lease holds it) to `ttl` from now.
    async fn extend_on_server(&self, ttl: Duration) -> Result<Instant> {
        let lease = self.server_lease();
        let result = self.locker.proto().extend(&lease, ttl).await;
        let result = match result {
            // Staged for a successor meanwhile: extend that.
            Err(Error::NotHeld { .. }) if self.server_lease().owner() != lease.owner() => {
                self.locker.proto().extend(&self.server_lease(), ttl).await
            }
            result => result,
        };
        if let Ok(valid_until) = result {
            if let Some(successor) = lock(&self.successor).as_mut() {
                successor.set_valid_until(valid_until);
            }
        }
        result
    }

    fn key(&self) -> &str {
        self.granted.key()
    }

    /// Whether the hold is known ended (released, lost).
    pub(crate) fn is_gone(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Resolves as soon as the hold is known ended: `lost` set, or the validity passed
    /// without a renewal.
    pub(crate) fn ended(shared: Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
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

    fn renewed(&self, valid_until: Instant) {
        lock(&self.validity).0 = valid_until;
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
        }
        was_lost
    }

    pub(crate) fn mark_lost(&self, why: &str) {
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

    /// Claims the end of the hold; false when someone else already ended it.
    fn finish(&self) -> bool {
        if self.done.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.locker.held.remove(self.slot);
        true
    }

    async fn release_on_backend(&self) -> Result<()> {
        if let Some(answer) = self.release_now() {
            return answer;
        }
        let sent = Instant::now();
        let entry = self.locker.hand_off_entry(self, self.key());
        // A staging for the next waiter in flight finishes first.
        let _staging = match &entry {
            Some(entry) => Some(entry.stage.lock().await),
            None => None,
        };
        let record = self.server_lease();
        // Kept to the end: a waiter whose request was taken waits for it to be answered or
        // dropped, and attempts on the server only then.
        let mut request = entry.as_ref().and_then(|e| e.take_request());
        if let (Some(entry), Some(request)) = (&entry, &mut request) {
            if request.owner == record.owner() {
                // Staged for this waiter: the server holds it for it already.
                let reply = request.reply.take().map(|reply| reply.send(record.clone()));
                if let Some(Ok(())) = reply {
                    return self.released(self.held_until(sent));
                }
            } else if self.locker.may_hand_over(entry) {
                if let Some(result) = self.hand_over(&record, entry, request).await {
                    return self.released(result);
                }
            }
        }
        let result = self.locker.proto().release(&record).await;
        self.released(result.and_then(|()| self.held_until(sent)))
    }

    /// `Ok` when this guard's validity lasted until `sent`, `NotHeld` otherwise.
    fn held_until(&self, sent: Instant) -> Result<()> {
        if self.valid_until() > sent {
            Ok(())
        } else {
            Err(Error::NotHeld {
                key: self.key().to_owned(),
            })
        }
    }

    /// Passes the key straight to the waiter queued behind this guard
    /// ([`Backend::hand_over`](crate::Backend::hand_over)); `None` when it did not happen
    /// and the lock is still to be released.
    async fn hand_over(
        &self,
        lease: &Lease,
        entry: &QueueEntry,
        request: &mut HandOffRequest,
    ) -> Option<Result<()>> {
        let sent = Instant::now();
        // Dropped half-way (the release future was), the hand-over may still happen:
        // what the waiter may have been granted is then released.
        let mut cleanup = CancelCleanup {
            inner: &self.locker,
            key: self.key(),
            owner: request.owner,
            armed: true,
        };
        let answer = self
            .locker
            .proto()
            .hand_over(lease, request.owner, request.ttl)
            .await;
        cleanup.armed = false;
        match answer {
            Ok(Attempt::Granted { fence, valid_until }) => {
                entry.handed_over();
                let next = Lease::new(lease.key_arc().clone(), request.owner, fence, valid_until);
                let reply = request.reply.take().map(|reply| reply.send(next));
                if let Some(Err(next)) = reply {
                    // The waiter gave up meanwhile: nobody holds the grant.
                    self.locker.cleanup_in_background(next);
                }
                Some(self.held_until(sent))
            }
            Ok(Attempt::Taken { .. }) => Some(Err(Error::NotHeld {
                key: self.key().to_owned(),
            })),
            Err(Error::Unsupported { .. }) => None,
            Err(e) => {
                tracing::debug!(key = self.key(), error = %e, "hand-over failed");
                // It may have happened: the grant it may have made is released too.
                let next = Lease::new(lease.key_arc().clone(), request.owner, 0, sent);
                self.locker.cleanup_in_background(next);
                Some(Err(e))
            }
        }
    }

    /// The release answered at once by an in-process backend (no copy of the lease);
    /// `None` when the backend needs the async call.
    fn release_now(&self) -> Option<Result<()>> {
        let result = self.locker.proto().release_now(&self.granted)?;
        Some(self.released(result))
    }

    fn released(&self, result: Result<()>) -> Result<()> {
        self.set_gone();
        self.locker.holder_ended(self, self.key());
        let key = self.key();
        match &result {
            Ok(()) => tracing::debug!(key, fence = self.granted.fence(), "lock released"),
            Err(e) => tracing::debug!(key, error = %e, "release found the lock gone"),
        }
        result
    }

    fn release_in_background(self: &Arc<Self>) {
        let me = self.clone();
        let spawned = self.locker.tasks.spawn(async move {
            let _ = me.release_on_backend().await;
        });
        if !spawned {
            tracing::debug!(
                key = self.key(),
                "guard dropped outside a tokio runtime; the lock expires at its TTL"
            );
        }
    }

    pub(crate) async fn release_for_shutdown(self: &Arc<Self>) {
        if self.finish() {
            if let Err(e) = self.release_on_backend().await {
                tracing::debug!(error = %e, "shutdown release failed");
            }
        }
    }
}

/// A held lock. Dropping it releases the lock in the background on the current tokio
/// runtime (tracked by [`Locker::shutdown`](crate::Locker::shutdown)); outside a runtime
/// the lock simply expires at its TTL. [`release`](Self::release) releases and reports.
///
/// With the watchdog on (the default) the lock is renewed every `ttl / 3` until released;
/// if a renewal is refused, or the validity passes while the server does not answer,
/// [`lost`](Self::lost) resolves and [`is_lost`](Self::is_lost) turns true.
#[must_use = "dropping the guard releases the lock at once"]
pub struct LockGuard {
    shared: Arc<GuardShared>,
    watchdog: Option<AbortHandle>,
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
    pub(crate) fn new(locker: &Arc<Inner>, lease: Lease, ttl: Duration, watchdog: bool) -> Self {
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
                successor: Mutex::new(None),
            });
            (shared.clone(), shared)
        });
        let watchdog = watchdog
            .then(|| tokio::runtime::Handle::try_current().ok())
            .flatten()
            .map(|rt| rt.spawn(run_watchdog(shared.clone())).abort_handle());
        LockGuard {
            shared,
            watchdog,
            state: State::Held,
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &str {
        self.shared.key()
    }

    pub(crate) fn downgrade(&self) -> std::sync::Weak<GuardShared> {
        Arc::downgrade(&self.shared)
    }

    /// The fencing token of this grant: pass it to the protected resource, which refuses
    /// writes carrying a token lower than one it has already seen.
    pub fn fence(&self) -> u64 {
        self.shared.granted.fence()
    }

    /// Until when the lock is ours unless renewed (monotonic clock of this process).
    pub fn valid_until(&self) -> Instant {
        self.shared.valid_until()
    }

    /// The TTL the lock is renewed with (after the backend's rounding).
    pub fn ttl(&self) -> Duration {
        lock(&self.shared.validity).1
    }

    /// A copy of the lease as the backend granted it.
    pub fn lease(&self) -> Lease {
        self.shared.lease()
    }

    /// Whether the lock is known gone: renewal refused, released by shutdown, or validity
    /// passed.
    pub fn is_lost(&self) -> bool {
        self.shared.lost.load(Ordering::SeqCst) || Instant::now() >= self.valid_until()
    }

    /// A future that resolves as soon as the lock is known gone: a renewal was refused, the
    /// validity passed without a successful renewal (server unreachable, or watchdog off),
    /// the Locker was shut down, or the guard was dropped. It does not borrow the guard.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        GuardShared::ended(self.shared.clone())
    }

    /// Renews the lock for `ttl` from now (also changing the watchdog's TTL).
    ///
    /// # Errors
    /// [`Error::InvalidTtl`]; [`Error::NotHeld`] when the lock is no longer ours (the guard
    /// is then lost); transient backend errors.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let ttl = self.shared.locker.caps.effective_ttl(ttl)?;
        if self.shared.done.load(Ordering::SeqCst) {
            return Err(Error::NotHeld {
                key: self.key().to_owned(),
            });
        }
        match self.shared.extend_on_server(ttl).await {
            Ok(valid_until) => {
                lock(&self.shared.validity).1 = ttl;
                self.shared.renewed(valid_until);
                tracing::debug!(key = self.key(), ?ttl, "lock extended");
                Ok(())
            }
            Err(e) => {
                if matches!(e, Error::NotHeld { .. }) {
                    self.shared.mark_lost("extension refused");
                }
                Err(e)
            }
        }
    }

    /// Releases the lock and reports whether it was still ours (`Ok`) or already gone
    /// ([`Error::NotHeld`]).
    ///
    /// # Errors
    /// [`Error::NotHeld`]; transient backend errors (the lock then expires at its TTL).
    ///
    /// # Cancel safety
    /// If the future is dropped before completing, the release continues in the background.
    pub async fn release(mut self) -> Result<()> {
        self.stop_watchdog();
        if !self.shared.finish() {
            return Err(Error::NotHeld {
                key: self.key().to_owned(),
            });
        }
        // From here until the answer, a dropped future leaves the release to `Drop`, which
        // finishes it in the background.
        if let Some(answer) = self.shared.release_now() {
            self.state = State::Ended;
            return answer;
        }
        self.state = State::Releasing;
        let result = self.shared.release_on_backend().await;
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

impl LockGuard {
    fn stop_watchdog(&mut self) {
        if let Some(handle) = self.watchdog.take() {
            handle.abort();
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        self.stop_watchdog();
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

async fn run_watchdog(shared: Arc<GuardShared>) {
    let mut next = Instant::now() + lock(&shared.validity).1 / 3;
    loop {
        tokio::time::sleep_until(next.into()).await;
        if shared.done.load(Ordering::SeqCst) {
            // Released by `Locker::shutdown`, which cannot reach this task's handle.
            return;
        }
        let ttl = lock(&shared.validity).1;
        let period = ttl / 3;
        let valid_until = shared.valid_until();
        let attempt =
            tokio::time::timeout_at(valid_until.into(), shared.extend_on_server(ttl)).await;
        match attempt {
            Ok(Ok(new_valid_until)) => {
                shared.renewed(new_valid_until);
                tracing::debug!(key = shared.key(), "lock renewed");
                next = Instant::now() + period;
            }
            Ok(Err(Error::NotHeld { .. })) => {
                shared.mark_lost("renewal refused: the lock is no longer ours");
                return;
            }
            Ok(Err(e)) => {
                let now = Instant::now();
                if now >= valid_until {
                    shared.mark_lost("validity passed while renewals failed");
                    return;
                }
                tracing::debug!(key = shared.key(), error = %e, "renewal failed; retrying");
                let left = valid_until - now;
                next = now + (period / 4).min(left / 2).max(Duration::from_millis(1));
            }
            Err(_) => {
                shared.mark_lost("validity passed while the server did not answer");
                return;
            }
        }
    }
}
