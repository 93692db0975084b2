//! The end of a Locker's work: waiting for its background work (`settle`), background work
//! the distlock crates hand it (`spawn_background`), and the graceful stop (`shutdown`).

use std::sync::atomic::Ordering;

#[cfg(doc)]
use super::LockGuard;
use super::Locker;

impl Locker {
    /// Waits until the background work of this Locker (releases of dropped guards, cleanups
    /// of cancelled attempts) has finished, without stopping it.
    ///
    /// Held guards and their watchdogs are not background work: `settle` does not wait for
    /// them, nor release them. Work started while it waits is waited for too; work started
    /// after it returned is not. Useful in tests and before reading
    /// [`stats`](Self::stats), and before dropping the runtime, whose end cuts background
    /// releases short (their locks then expire at their TTL).
    ///
    /// # Cancel safety
    /// Dropping the future stops nothing: the background work goes on, and `settle` can be
    /// called again.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// let guard = locker.lock("jobs/nightly").await?;
    /// drop(guard); // released in the background (at once on an in-process backend)
    /// locker.settle().await;
    /// assert_eq!(locker.stats().background_tasks, 0);
    /// # Ok(()) }
    /// ```
    pub async fn settle(&self) {
        self.inner.tasks.wait_idle().await;
    }

    /// Runs `work` on the current runtime as one of this Locker's background tasks: counted
    /// in [`stats`](Self::stats), awaited by [`settle`](Self::settle) and
    /// [`shutdown`](Self::shutdown) until it ends or its runtime drops it. False outside a
    /// runtime (`work` is dropped unpolled). For the distlock crates, so that work which
    /// will drop guards (the scheduler's cancelled runs) is waited for by a shutdown
    /// started before those guards are dropped; outside the semver promise.
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn spawn_background<F>(&self, work: F) -> bool
    where
        F: std::future::Future<Output = ()> + Send + 'static,
    {
        self.inner.tasks.spawn(work)
    }

    /// Stops granting, releases every lock still held through this Locker (their guards'
    /// `lost()` fires), and waits for background releases to finish. For a graceful stop.
    ///
    /// It applies to every clone of this Locker, for good. Acquisitions started afterwards
    /// fail with [`Error::Shutdown`](crate::Error::Shutdown) before any I/O. An acquisition already waiting is not
    /// interrupted: it fails with [`Error::Shutdown`](crate::Error::Shutdown) when it would have been granted (the grant
    /// is released), or ends as usual at its deadline. The held locks are released one
    /// after another, each after a renewal in flight finished, and never handed over to a
    /// waiter; a guard's later [`release`](LockGuard::release) returns [`Error::NotHeld`](crate::Error::NotHeld).
    /// Then it waits as [`settle`](Self::settle) does. Calling it again only waits for
    /// background work.
    ///
    /// A guard granted on another thread while `shutdown` runs may be missed by it: it is
    /// then released by its own release or drop, or by a later `shutdown`.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the Locker shut down. The guard whose release is under way
    /// has stopped renewing and its release may or may not have reached the server: its
    /// lock then expires at its TTL, and its `lost()` fires at the latest when its validity
    /// passes (or when it is dropped). Guards not reached yet stay held and go on renewing,
    /// but this Locker no longer tracks them: a later `shutdown` does not release them
    /// (their own release or drop does), and [`stats`](Self::stats) does not count them.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// let guard = locker.lock("jobs/nightly").await?;
    /// let lost = guard.lost();
    /// // On SIGTERM, for example:
    /// locker.shutdown().await;
    /// lost.await; // resolved: the lock was released by the shutdown
    /// assert!(guard.is_lost());
    /// assert!(locker.lock("jobs/other").await.is_err()); // Error::Shutdown
    /// # Ok(()) }
    /// ```
    pub async fn shutdown(&self) {
        self.inner.shut_down.store(true, Ordering::SeqCst);
        for guard in self.inner.held.drain() {
            guard.release_for_shutdown().await;
        }
        self.inner.tasks.wait_idle().await;
    }
}
