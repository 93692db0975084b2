//! The hold behind a [`LockGuard`](super::LockGuard): its lease's state machine, its
//! watchdog and its lost signal.
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

use futures::FutureExt as _;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use tokio::sync::Notify;

use super::handover;
use super::metrics::Series;
use super::queue::{HandOverRequest, LocalHolder};
use super::shared::{Held, Shared};
use super::watchdog::{renewal_period, Renewable, Ticket};
use crate::capabilities::Ttl;
use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::options::LockOptions;
use crate::registry::Slot;
use crate::sync::lock;

mod renew;

pub(super) struct GuardShared {
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
    /// Set once the server no longer holds the key for this hold, as far as this process
    /// knows: its release or hand-over was answered, or the lock was lost. Until then the
    /// Locker's next waiter on the key waits behind this hold, even after its guard was
    /// dropped (its release is then on its way).
    settled: AtomicBool,
    /// One server operation on the lease at a time: renewals, `extend`, release and
    /// hand-over take it for the whole of their server call.
    ops: tokio::sync::Mutex<()>,
    /// The hold's place in the Locker's watchdog schedule, while it has one.
    renewal: Mutex<Option<Ticket>>,
    /// Whether the watchdog renews this hold (asked for, and the backend's grants are not
    /// [session-bound](crate::Capabilities::session_bound)).
    watchdog: bool,
    /// When the lock was granted, for the hold-time metric.
    granted_at: Instant,
    /// The key label of the hold's metrics.
    key_label: Option<&'static str>,
    /// Whether the release is announced to the key's observers (a leadership).
    announce: bool,
}

impl GuardShared {
    pub(super) fn lease(&self) -> Lease {
        let mut lease = self.granted.clone();
        lease.set_valid_until(self.valid_until());
        lease
    }

    pub(super) fn valid_until(&self) -> Instant {
        lock(&self.validity).0
    }

    pub(super) fn not_held(&self) -> Error {
        self.granted.not_held()
    }

    /// Renews the lease for `ttl` from now: one operation, after every earlier one.
    ///
    /// A lost or ended lease is never renewed, and one whose validity passed is lost. Until
    /// the server answers, the validity is lowered to what the new TTL alone guarantees
    /// when that is earlier (a shorter TTL may be applied on the server before its answer
    /// arrives, or without one), so a renewal that is cut off or fails never leaves the
    /// guard believing in more than the server may keep.
    /// With the watchdog on, its next turn is rescheduled a [`renewal_period`] of `ttl`
    /// after an answered renewal, so a TTL shorter than the time to the old turn is renewed
    /// in time, and a turn that was already due does nothing (it is superseded).
    pub(super) async fn extend(self: &Arc<Self>, ttl: Ttl) -> Result<Instant> {
        let _op = self.ops.lock().await;
        let valid_until = self.renew_locked(ttl).await?;
        if self.watchdog {
            // Under the operation lock: no turn can renew with the TTL before this one.
            self.schedule(Instant::now() + renewal_period(ttl.get()));
        }
        Ok(valid_until)
    }

    /// [`extend`](Self::extend)'s and the watchdog's renewal, with the operation lock held.
    async fn renew_locked(&self, ttl: Ttl) -> Result<Instant> {
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
                self.metrics(|s| {
                    s.renewal_failed();
                    s.error(&e);
                });
                if matches!(e, Error::NotHeld { .. }) {
                    self.mark_lost("renewal refused: the lock is no longer ours");
                } else if Instant::now() >= self.valid_until() {
                    self.mark_lost("validity passed while renewals failed");
                }
                Err(e)
            }
        }
    }

    pub(super) fn key(&self) -> &str {
        self.granted.key()
    }

    /// Whether the hold is known ended (released, lost).
    pub(super) fn is_gone(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    fn is_done(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    /// Resolves as soon as the hold is known ended: `lost` set, or the validity passed
    /// without a renewal.
    pub(super) fn ended(shared: Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        Self::until(shared, |hold| hold.lost.load(Ordering::SeqCst))
    }

    /// Marks the hold settled on the server (see `settled`) and wakes who waits for it.
    fn settle(&self) {
        if !self.settled.swap(true, Ordering::SeqCst) {
            self.wake_watchers();
        }
    }

    /// Resolves as soon as `done` holds for the hold, or its validity passed without a
    /// renewal.
    fn until(
        shared: Arc<Self>,
        done: fn(&Self) -> bool,
    ) -> impl Future<Output = ()> + Send + 'static {
        shared.watched.store(true, Ordering::SeqCst);
        async move {
            loop {
                let changed = shared.changed.notified();
                tokio::pin!(changed);
                changed.as_mut().enable();
                if done(&shared) {
                    return;
                }
                let valid_until = shared.valid_until();
                futures::select! {
                    _ = changed.fuse() => {}
                    _ = tokio::time::sleep_until(valid_until.into()).fuse() => {
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
    pub(super) fn set_gone(&self) -> bool {
        self.end(None)
    }

    /// Ends the hold once; `true` when it had ended already. A loss (`lost`: why) is
    /// counted and logged before any `lost()` future is woken, so a holder that drops its
    /// guard the moment it hears of the loss finds it counted.
    fn end(&self, lost: Option<&str>) -> bool {
        let was_lost = self.lost.swap(true, Ordering::SeqCst);
        if !was_lost {
            if let Some(why) = lost.filter(|_| !self.done.load(Ordering::SeqCst)) {
                self.metrics(Series::lost);
                tracing::warn!(
                    key = self.key(),
                    fence = self.granted.fence(),
                    backend = self.locker.caps.name,
                    why,
                    "lock lost"
                );
            }
            self.metrics(|s| s.held(self.granted_at));
            self.wake_watchers();
            self.unschedule();
        }
        was_lost
    }

    fn mark_lost(&self, why: &str) {
        self.end(Some(why));
        self.settle();
    }

    /// Claims the end of the hold; false when someone else already ended it. The watchdog
    /// stops at its next look.
    pub(super) fn finish(&self) -> bool {
        if self.done.swap(true, Ordering::SeqCst) {
            return false;
        }
        self.unschedule();
        self.locker.held.remove(self.slot);
        true
    }

    /// Puts the next renewal in the Locker's watchdog schedule, at `at`, in place of the
    /// one scheduled before (so a hold has at most one turn to come), unless the hold
    /// ended. Under the `renewal` lock, after which `finish` and `set_gone` look: so an
    /// ended hold never stays scheduled.
    fn schedule(self: &Arc<Self>, at: Instant) {
        let mut renewal = lock(&self.renewal);
        if let Some(earlier) = renewal.take() {
            self.locker.watchdog.cancel(earlier);
        }
        if self.is_done() || self.is_gone() {
            return;
        }
        let hold = Arc::downgrade(self) as Weak<dyn Renewable>;
        *renewal = self.locker.watchdog.schedule(at, hold);
    }

    /// Takes the hold out of the watchdog schedule.
    fn unschedule(&self) {
        if let Some(ticket) = lock(&self.renewal).take() {
            self.locker.watchdog.cancel(ticket);
        }
    }

    /// Ends the hold on the server, after a renewal in flight finished: passes the key to
    /// the head waiter queued behind this guard when there is one, releases it otherwise.
    /// Called once, after [`finish`](Self::finish).
    pub(super) async fn end_on_server(&self) -> Result<()> {
        // Almost always free (no renewal in flight): then taken without a wait, and without
        // spending the task's cooperative budget, which would make it yield twice as often.
        let _op = match self.ops.try_lock() {
            Ok(op) => op,
            Err(_) => self.ops.lock().await,
        };
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
        if self.announce && result.is_ok() {
            self.announce_release().await;
        }
        drop(request);
        self.released(result.and_then(|()| self.held_until(sent)))
    }

    /// Tells the key's observers in every process that its leader released it. A failure
    /// costs them only time: they learn of it at the leadership's expiry.
    async fn announce_release(&self) {
        if let Some(values) = self.locker.proto().leader_values() {
            if let Err(e) = values.announce(self.key()).await {
                tracing::debug!(key = self.key(), error = %e.report(), "announcing a resignation failed; observers learn of it at its expiry");
            }
        }
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
        if given.is_ok() {
            self.metrics(Series::handed_over);
        }
        Some(given.and_then(|()| self.held_until(sent)))
    }

    /// The release answered at once by an in-process backend (no copy of the lease);
    /// `None` when the backend needs the async call.
    fn release_now(&self) -> Option<Result<()>> {
        let result = self.locker.proto().immediate()?.release(&self.granted);
        Some(self.released(result))
    }

    fn released(&self, result: Result<()>) -> Result<()> {
        match &result {
            // The release of a lock known lost (counted as lost) finds it gone, as expected.
            Err(Error::NotHeld { .. }) if self.is_gone() => {}
            Err(e) => self.metrics(|s| s.error(e)),
            Ok(()) => {}
        }
        self.set_gone();
        self.settle();
        self.locker.queues.holder_ended(self, self.key());
        let key = self.key();
        match &result {
            Ok(()) => tracing::debug!(key, fence = self.granted.fence(), "lock released"),
            Err(e) => tracing::debug!(key, error = %e.report(), "release found the lock gone"),
        }
        result
    }

    /// Ends the hold from `Drop`: at once when the backend answers in-process and no
    /// operation is in flight, else on a background task.
    pub(super) fn release_in_background(self: &Arc<Self>) {
        if let Ok(op) = self.ops.try_lock() {
            if self.release_now().is_some() {
                drop(op);
                return;
            }
        }
        // Until its release is answered, the Locker's next acquisition of the key waits
        // behind this hold (and is handed the key, when the backend can) rather than be
        // refused by the server.
        self.locker.queues.hold(
            self.granted.key_arc(),
            Arc::downgrade(self) as Weak<dyn LocalHolder>,
        );
        let ending = Ending {
            hold: self.clone(),
            answered: false,
        };
        let spawned = self.locker.tasks.spawn(async move {
            let _ = ending.hold.end_on_server().await;
            ending.answered();
        });
        if !spawned {
            tracing::debug!(
                key = self.key(),
                "guard dropped outside a tokio runtime; the lock expires at its TTL"
            );
            self.end_locally();
        }
    }

    /// Ends the hold in this process only, the server not told: the lock expires at its
    /// TTL, and the Locker's next waiter on the key no longer waits behind this hold.
    fn end_locally(&self) {
        self.set_gone();
        self.settle();
        self.locker.queues.holder_ended(self, self.key());
    }
}

/// A dropped guard's release on its way: ends the hold locally if dropped unanswered (its
/// runtime shut down), so neither the key's queue nor `shutdown` waits for it.
struct Ending {
    hold: Arc<GuardShared>,
    answered: bool,
}

impl Ending {
    /// The release was answered: nothing left to end.
    fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        if !self.answered {
            tracing::warn!(
                key = self.hold.key(),
                "the runtime of a dropped guard's release shut down before the release was answered; the lock expires at its TTL"
            );
            self.hold.end_locally();
        }
    }
}

impl Held for GuardShared {
    fn release_for_shutdown(self: Arc<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            if self.finish() {
                if let Err(e) = self.end_on_server().await {
                    tracing::debug!(error = %e.report(), "shutdown release failed");
                }
            }
        })
    }
}

impl LocalHolder for GuardShared {
    fn is_live(&self) -> bool {
        !self.settled.load(Ordering::SeqCst) && self.valid_until() > Instant::now()
    }

    fn ended(self: Arc<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(GuardShared::until(self, |hold| {
            hold.settled.load(Ordering::SeqCst)
        }))
    }

    fn permits(&self) -> crate::Permits {
        self.granted.permits()
    }
}

impl GuardShared {
    /// A hold of `lease`, granted at `granted_at`, registered with its Locker, renewed by a
    /// watchdog when `opts.watchdog`.
    pub(super) fn start(
        locker: &Arc<Shared>,
        lease: Lease,
        ttl: Ttl,
        opts: &LockOptions,
        granted_at: Instant,
    ) -> Arc<Self> {
        // A session-bound grant lasts while its session does: nothing to renew.
        let watchdog = opts.watchdog && !locker.caps.session_bound;
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
                settled: AtomicBool::new(false),
                ops: tokio::sync::Mutex::new(()),
                renewal: Mutex::new(None),
                watchdog,
                granted_at,
                key_label: opts.metrics_label,
                announce: opts.announce,
            });
            (shared.clone() as Arc<dyn Held>, shared)
        });
        if watchdog {
            // A renewal period after the grant, counted from its validity (no clock read).
            let before_end = ttl.get() - renewal_period(ttl.get());
            let valid_until = shared.valid_until();
            shared.schedule(
                valid_until
                    .checked_sub(before_end)
                    .unwrap_or_else(Instant::now),
            );
        }
        shared
    }

    /// When the lock was granted.
    pub(super) fn granted_at(&self) -> Instant {
        self.granted_at
    }

    /// Records into this hold's series.
    fn metrics<R>(&self, f: impl FnOnce(&Series) -> R) -> R {
        self.locker.metrics.with(self.key_label, f)
    }

    /// The lease as granted (key, owner, fence).
    pub(super) fn granted(&self) -> &Lease {
        &self.granted
    }

    /// The TTL renewals use.
    pub(super) fn ttl(&self) -> Ttl {
        lock(&self.validity).1
    }

    /// The backend's capabilities.
    pub(super) fn caps(&self) -> &crate::capabilities::Capabilities {
        &self.locker.caps
    }
}
