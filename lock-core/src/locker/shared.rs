//! What a Locker and its guards share: the backend, the guards held, the per-key queues,
//! the background tasks, and the clean-up of attempts whose answer never came.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;

use super::metrics::LockerMetrics;
use super::observe::{Event, Observer};
use super::queue::Queues;
use super::watchdog::Watchdog;
use crate::backend::Backend;
use crate::capabilities::Capabilities;
use crate::error::Error;
use crate::lease::{Lease, Owner};
use crate::options::{Backoff, LockOptions};
use crate::registry::Registry;

/// Backoff between attempts after a transient error (server unreachable).
pub(crate) const ERROR_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(20), Duration::from_secs(1));

/// Attempts at [`Backend::abandon`] for one clean-up before the grant is left to its TTL.
const ABANDON_ATTEMPTS: u32 = 5;

/// A hold registered with its Locker, so `shutdown` can end it.
pub(crate) trait Held: Send + Sync {
    /// Ends the hold (releases on the server) unless it ended already.
    fn release_for_shutdown(self: Arc<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// The state of one Locker, shared by its clones and its guards.
pub(crate) struct Shared {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) caps: Capabilities,
    /// Local FIFO queues: only the waiter holding a key's turn attempts on the backend.
    pub(crate) queues: Queues,
    /// Guards held through this Locker, for `shutdown`.
    pub(crate) held: Registry<Arc<dyn Held>>,
    pub(crate) tasks: Arc<Tracker>,
    pub(crate) shut_down: AtomicBool,
    pub(crate) defaults: LockOptions,
    /// Told of contention and retries, when set.
    pub(crate) observer: OnceLock<Box<dyn Observer>>,
    /// Renews the guards that have the watchdog on.
    pub(crate) watchdog: Arc<Watchdog>,
    /// The series this Locker records into.
    pub(crate) metrics: Arc<LockerMetrics>,
}

impl Shared {
    pub(crate) fn new(backend: Arc<dyn Backend>, defaults: LockOptions) -> Self {
        let caps = backend.capabilities().clone();
        Shared {
            metrics: Arc::new(LockerMetrics::new(caps.name)),
            caps,
            backend,
            queues: Queues::default(),
            held: Registry::new(),
            tasks: Arc::new(Tracker::default()),
            shut_down: AtomicBool::new(false),
            defaults,
            observer: OnceLock::new(),
            watchdog: Arc::default(),
        }
    }

    /// Tells the observer, if there is one, of the event `make` builds.
    pub(crate) fn observe<'a>(&self, make: impl FnOnce() -> Event<'a>) {
        if let Some(observer) = self.observer.get() {
            observer.on_event(&make());
        }
    }

    /// The backend as a trait object. Calling through `Arc<dyn Backend>` directly would
    /// pick the forwarding `impl Backend for Arc<B>` and box every future twice.
    pub(crate) fn proto(&self) -> &dyn Backend {
        &*self.backend
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    /// A clean-up for the grant a call on `key` for `owner` may make, armed until
    /// [`CancelCleanup::disarm`].
    pub(crate) fn arm_cleanup<'a>(&'a self, key: &'a Arc<str>, owner: Owner) -> CancelCleanup<'a> {
        CancelCleanup {
            shared: self,
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
        let shared_metrics = self.metrics.clone();
        self.tasks.spawn(async move {
            let mut backoff = Backoff::new(ERROR_BACKOFF.0, ERROR_BACKOFF.1);
            for attempt in 1..=ABANDON_ATTEMPTS {
                match backend.as_ref().abandon(&key, owner).await {
                    Ok(()) => return,
                    Err(e) if e.is_transient() && attempt < ABANDON_ATTEMPTS => {
                        shared_metrics.with(None, |s| s.error(&e));
                        tracing::debug!(key = &*key, error = %e.report(), "abandoning an attempt failed; retrying");
                        tokio::time::sleep(backoff.next_delay()).await;
                    }
                    Err(e) => {
                        shared_metrics.with(None, |s| s.error(&e));
                        tracing::debug!(key = &*key, error = %e.report(), "abandoning an attempt failed; a grant it made expires at its TTL");
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
        let shared_metrics = self.metrics.clone();
        self.tasks.spawn(async move {
            let key = lease.key();
            match backend.as_ref().release(&lease).await {
                Ok(()) => tracing::debug!(key, "released a lock granted to an abandoned attempt"),
                Err(Error::NotHeld { .. }) => {}
                Err(e) => {
                    shared_metrics.with(None, |s| s.error(&e));
                    tracing::debug!(key, error = %e.report(), "cleanup of an abandoned attempt failed; the lock expires at its TTL");
                }
            }
        });
    }
}

/// Abandons, in the background, what a server call for `owner` that was dropped
/// mid-flight or failed may have granted, unless disarmed once its answer is known.
pub(crate) struct CancelCleanup<'a> {
    shared: &'a Shared,
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
            self.shared
                .abandon_in_background(self.key.clone(), self.owner);
        }
    }
}

/// A place in the line of waiters a server keeps ([`Capabilities::server_queue`]): the
/// owner every attempt of one acquisition is made with. An acquisition that ends without
/// that owner's grant [leaves](Self::leave) the line before it answers (so a key released
/// next is free at once); one that is cancelled leaves it in the background (dropped
/// armed).
///
/// [`Capabilities::server_queue`]: crate::Capabilities::server_queue
pub(crate) struct Line<'a> {
    shared: &'a Shared,
    key: &'a Arc<str>,
    owner: Owner,
    /// Whether an attempt was made as `owner`: only then can the server hold a place.
    attempted: bool,
    armed: bool,
}

impl<'a> Line<'a> {
    /// A place for `key` when the backend keeps a line on the server; `None` elsewhere
    /// (each attempt then has an owner of its own).
    pub(crate) fn new(shared: &'a Shared, key: &'a Arc<str>) -> Option<Line<'a>> {
        shared.caps.server_queue.then(|| Line {
            shared,
            key,
            owner: Owner::random(),
            attempted: false,
            armed: true,
        })
    }

    /// The owner of the next attempt.
    pub(crate) fn owner(&self) -> Owner {
        self.owner
    }

    /// The owner of an attempt about to be sent.
    pub(crate) fn attempting(&mut self) -> Owner {
        self.attempted = true;
        self.owner
    }

    /// Leaves the line: abandons the owner's place on the server and waits for it
    /// (in the background when that fails). Cancelling it leaves the abandonment to the
    /// background.
    pub(crate) async fn leave(&mut self) {
        if !(self.armed && self.attempted) {
            return;
        }
        let abandoned = self.shared.proto().abandon(self.key, self.owner).await;
        self.armed = false;
        if abandoned.is_err() {
            self.shared
                .abandon_in_background(self.key.clone(), self.owner);
        }
    }

    /// Leaves the line and takes a new owner, for a wait that cannot keep its place (it
    /// waits behind a sibling of its own Locker: a place reaching the head of the line
    /// meanwhile would block that sibling, and with it the whole line).
    pub(crate) async fn restart(&mut self) {
        self.leave().await;
        *self = Line {
            shared: self.shared,
            key: self.key,
            owner: Owner::random(),
            attempted: false,
            armed: true,
        };
    }

    /// After an attempt with [`owner`](Self::owner) failed: its clean-up abandons that owner
    /// in the background, and could remove a place taken again under it, so the next
    /// attempt takes a new one.
    pub(crate) fn failed(&mut self) {
        self.owner = Owner::random();
        self.attempted = false;
    }

    /// The owner was granted: its place is the grant now, released with the guard.
    pub(crate) fn granted(&mut self) {
        self.armed = false;
    }
}

impl Drop for Line<'_> {
    fn drop(&mut self) {
        if self.armed && self.attempted {
            self.shared
                .abandon_in_background(self.key.clone(), self.owner);
        }
    }
}

/// One task of a [`Tracker`]: uncounted when dropped, whether the task finished or its
/// runtime dropped it unfinished.
struct Counted(Arc<Tracker>);

impl Drop for Counted {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Background tasks a Locker waits for on shutdown.
#[derive(Default)]
pub(crate) struct Tracker {
    count: AtomicUsize,
    idle: Notify,
}

impl Tracker {
    /// Spawns `fut` on the current runtime, counted until it ends or is dropped unfinished
    /// (its runtime shut down); false outside a runtime.
    pub(crate) fn spawn<F>(self: &Arc<Self>, fut: F) -> bool
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        self.count.fetch_add(1, Ordering::SeqCst);
        // Moved into the task from the start: dropped with it, polled or not.
        let counted = Counted(self.clone());
        handle.spawn(async move {
            let _counted = counted;
            fut.await;
        });
        true
    }

    /// Tasks still running.
    pub(crate) fn len(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Waits until no task runs.
    pub(crate) async fn wait_idle(&self) {
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
