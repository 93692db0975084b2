//! The seam between policy and protocol: the [`Backend`] trait and its optional abilities
//! ([`HandOver`], [`Admin`], [`Immediate`], [`Baseline`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::capabilities::{Capabilities, Ttl};
use crate::error::Result;
use crate::lease::{Lease, Owner};
use crate::notices::ReleaseListener;
use crate::permits::Permits;

/// The outcome of one acquisition attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// The lock is ours.
    Granted {
        /// The fencing token of this grant.
        fence: u64,
        /// Until when it is ours, computed from the moment before the request was sent.
        valid_until: Instant,
    },
    /// Another owner holds the lock.
    Taken {
        /// How long the holder has left, when the server tells; a waiter wakes then even
        /// without a release notice.
        expires_in: Option<Duration>,
    },
}

/// What [`Admin::inspect`] knows of a key's current holder.
///
/// `#[non_exhaustive]`: it may tell more later; backends build it with [`Holder::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's owner token, when the server stores it readably.
    pub owner: Option<Owner>,
    /// The holder's fencing token, when known.
    pub fence: Option<u64>,
    /// Time left before the lock expires, when the server tells.
    pub expires_in: Option<Duration>,
    /// The permits the holder claims ([`Permits::LOCK`] for a lock).
    pub permits: Permits,
}

impl Holder {
    /// A lock's holder with these owner token, fencing token and time left (each when
    /// known).
    pub fn new(owner: Option<Owner>, fence: Option<u64>, expires_in: Option<Duration>) -> Self {
        Holder {
            owner,
            fence,
            expires_in,
            permits: Permits::LOCK,
        }
    }

    /// The same holder, claiming `permits`.
    pub fn permits(mut self, permits: Permits) -> Self {
        self.permits = permits;
        self
    }
}

/// One lock server's protocol: each method is ONE attempt, with no retry, wait or renewal
/// policy (that lives once in [`Locker`](crate::Locker) and [`LockGuard`](crate::LockGuard)).
///
/// Implementations must keep these rules, which the conformance suite checks:
/// - `try_acquire` grants only when the unexpired grants on the key leave the claimed
///   permits free (a lock: nobody else holds it), and stores `owner` as the grant's value;
/// - `extend` and `release` act only when the stored value is the lease's owner, and
///   return [`Error::NotHeld`](crate::Error::NotHeld) otherwise; they never touch another
///   owner's lock;
/// - every network call is bounded by a timeout and fails with a transient
///   [`Error::Unavailable`](crate::Error::Unavailable) rather than hanging.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    /// What this backend can promise.
    fn capabilities(&self) -> &Capabilities;

    /// One attempt to take `permits` of `key` for `owner` for `ttl`.
    ///
    /// Grants only when the unexpired grants on `key` leave `permits.take()` of its
    /// `permits.of()` free (for a lock, [`Permits::LOCK`]: when nobody else holds it),
    /// storing `owner` as the grant's value: [`Attempt::Granted`] with the grant's fencing token (ordered as
    /// [`Capabilities::monotonic_fencing`] says) and its `valid_until`, counted from before
    /// the request was sent, less the [`clock_drift`](Capabilities::clock_drift) allowance
    /// ([`Capabilities::validity`]). Otherwise [`Attempt::Taken`], with the
    /// holder's time left when the server tells. `ttl` has passed
    /// [`Capabilities::effective_ttl`], and `permits` [`Capabilities::check_permits`]: the
    /// backend needs no checks of its own (a backend whose
    /// [`max_permits`](Capabilities::max_permits) is 1 only ever sees [`Permits::LOCK`]),
    /// except that a claim naming another `of` than the key's holders is refused with
    /// [`Error::InvalidPermits`](crate::Error::InvalidPermits). No retry, no wait: the
    /// [`Locker`](crate::Locker) does those.
    ///
    /// # Errors
    /// [`Error::Unavailable`](crate::Error::Unavailable) (transient) when the server could
    /// not be reached or did not answer in time;
    /// [`Error::QuorumNotReached`](crate::Error::QuorumNotReached) (transient, Redlock) when
    /// fewer than a majority of nodes granted;
    /// [`Error::Backend`](crate::Error::Backend) when the server answered something the
    /// protocol does not allow. After an error the attempt may still have granted: the
    /// Locker abandons it as it does a dropped call.
    ///
    /// # Cancel safety
    /// A dropped call may still reach the server and grant; the Locker then
    /// [`abandon`](Self::abandon)s it.
    ///
    /// # Examples
    ///
    /// One attempt straight on the protocol (applications use [`Locker`](crate::Locker)):
    ///
    /// ```no_run
    /// # async fn demo(backend: &dyn lock_core::Backend) -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{Attempt, Lease, Owner, Permits};
    ///
    /// let ttl = backend.capabilities().effective_ttl(Duration::from_secs(10))?;
    /// let owner = Owner::random();
    /// match backend.try_acquire("jobs/nightly", owner, Permits::LOCK, ttl).await? {
    ///     Attempt::Granted { fence, valid_until } => {
    ///         let lease = Lease::new("jobs/nightly", owner, fence, valid_until);
    ///         backend.release(&lease).await?;
    ///     }
    ///     Attempt::Taken { expires_in } => println!("taken; free in at most {expires_in:?}"),
    /// }
    /// # Ok(()) }
    /// ```
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt>;

    /// Pushes the lease's expiry to `ttl` from now if it is still ours; returns the new
    /// `valid_until`, counted from before the request was sent.
    ///
    /// Acts only when the stored value is the lease's owner and the lock has not expired;
    /// never touches another owner's lock. The new `valid_until` is shortened by the
    /// clock-drift allowance as for [`try_acquire`](Self::try_acquire).
    ///
    /// # Errors
    /// [`Error::NotHeld`](crate::Error::NotHeld) when the lock is no longer the lease's
    /// (expired, released, taken over); transient errors as for
    /// [`try_acquire`](Self::try_acquire), after which the extension may or may not have
    /// been applied.
    ///
    /// # Cancel safety
    /// A dropped call may still reach the server and apply the new TTL, or not. The
    /// [`LockGuard`](crate::LockGuard) allows for both: until the answer comes, its validity
    /// is the earlier of the old one and what the new TTL alone guarantees.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     backend: &dyn lock_core::Backend,
    /// #     mut lease: lock_core::Lease,
    /// # ) -> lock_core::Result<()> {
    /// use std::time::Duration;
    ///
    /// let ttl = backend.capabilities().effective_ttl(Duration::from_secs(10))?;
    /// let valid_until = backend.extend(&lease, ttl).await?;
    /// lease.set_valid_until(valid_until);
    /// # Ok(()) }
    /// ```
    async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant>;

    /// Deletes the lock if it is still ours; `NotHeld` if it was not.
    ///
    /// Acts only when the stored value is the lease's owner; never touches another owner's
    /// lock. A backend with [release notices](Capabilities::release_notices) announces the
    /// release to the waiters of the key.
    ///
    /// # Errors
    /// [`Error::NotHeld`](crate::Error::NotHeld) when the lock was not the lease's any more
    /// (expired, taken over, already released); transient errors as for
    /// [`try_acquire`](Self::try_acquire), after which the lock may or may not be deleted (if
    /// not, it expires at its TTL).
    ///
    /// # Cancel safety
    /// A dropped call may still reach the server and delete the lock, or not (it then
    /// expires at its TTL); either way no other owner's lock is touched. When
    /// [`LockGuard::release`](crate::LockGuard::release) is dropped, the guard sends the
    /// release again from a background task.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     backend: &dyn lock_core::Backend,
    /// #     lease: lock_core::Lease,
    /// # ) -> lock_core::Result<()> {
    /// use lock_core::Error;
    ///
    /// match backend.release(&lease).await {
    ///     Ok(()) => {}
    ///     Err(Error::NotHeld { .. }) => eprintln!("expired or taken over before the release"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    async fn release(&self, lease: &Lease) -> Result<()>;

    /// Registers for the next release notice of `key` (called before an attempt); `None`
    /// when the backend cannot announce releases ([`Capabilities::release_notices`] false).
    fn listen(&self, key: &str) -> Option<ReleaseListener>;

    /// Forgets an attempt of `owner` on `key` whose answer never came (it timed out, failed
    /// transiently, or its caller gave up): if the attempt was granted, releases it; if it
    /// has not reached the server yet, makes sure it never grants. `owner` is the owner
    /// token of that one attempt (of a [`try_acquire`](Self::try_acquire), or the `to` of
    /// a [`HandOver::hand_over`]); the caller never uses it again.
    ///
    /// The Locker calls this to clean up after an abandoned attempt, instead of a release:
    /// a release sent on a new connection can reach the server before the attempt still
    /// buffered on the old one, and then leaves the later grant orphaned for its TTL. A
    /// backend whose requests can be reordered so overrides it with a tombstone that the
    /// late attempt finds; a backend whose server sees one client's requests in order may
    /// keep the default.
    ///
    /// `Ok` also when nothing was held. An error means the clean-up may not have reached
    /// the server: a grant may then stay until its TTL. The default releases
    /// `Lease::new(key, owner, 0, now)` and maps [`Error::NotHeld`](crate::Error::NotHeld)
    /// to `Ok`.
    ///
    /// The Locker runs it on a background task (tracked by
    /// [`Locker::shutdown`](crate::Locker::shutdown)) and retries transient errors a few
    /// times with backoff before leaving the grant to its TTL.
    ///
    /// With [`Capabilities::server_queue`](crate::Capabilities::server_queue) it also
    /// removes the place in the server's line that refused attempts of `owner` kept: the
    /// Locker awaits it before an acquisition answers anything but `owner`'s grant, and
    /// runs it in the background when the acquisition is cancelled.
    ///
    /// # Errors
    /// Transient errors as for [`try_acquire`](Self::try_acquire): the clean-up may not have
    /// reached the server. Never [`Error::NotHeld`](crate::Error::NotHeld).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the clean-up undone (the same as an
    /// error); run it on a task of its own when it must finish.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(backend: &dyn lock_core::Backend) -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{Owner, Permits};
    ///
    /// let ttl = backend.capabilities().effective_ttl(Duration::from_secs(10))?;
    /// let owner = Owner::random();
    /// let attempt = backend.try_acquire("jobs/nightly", owner, Permits::LOCK, ttl);
    /// if tokio::time::timeout(Duration::from_millis(100), attempt).await.is_err() {
    ///     // Given up: whatever the attempt may still grant must not stay behind.
    ///     backend.abandon("jobs/nightly", owner).await?;
    /// }
    /// # Ok(()) }
    /// ```
    async fn abandon(&self, key: &str, owner: Owner) -> Result<()> {
        match self
            .release(&Lease::new(key, owner, 0, Instant::now()))
            .await
        {
            Ok(()) | Err(crate::Error::NotHeld { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// The one-step hand-over of a released lock to the next local waiter, when the
    /// backend can ([`HandOver`]); `None` (the default): the Locker releases and the waiter
    /// acquires.
    fn hand_over(&self) -> Option<&dyn HandOver> {
        None
    }

    /// Inspection and administrative release, for tools ([`Admin`]); `None` (the default)
    /// when the server cannot tell.
    fn admin(&self) -> Option<&dyn Admin> {
        None
    }

    /// Answers without I/O, for an in-process backend ([`Immediate`]); `None` (the
    /// default): the Locker calls the async methods.
    fn immediate(&self) -> Option<&dyn Immediate> {
        None
    }

    /// The server's own round trips without the lock protocol, for benchmarks
    /// ([`Baseline`]); `None` (the default) when there is no server to measure (the
    /// in-process backend).
    fn baseline(&self) -> Option<&dyn Baseline> {
        None
    }

    /// The history of scheduled runs kept in this server, for the scheduler
    /// ([`RunRecords`](crate::records::RunRecords)); `None` (the default) when the backend
    /// keeps none.
    fn run_records(&self) -> Option<&dyn crate::records::RunRecords> {
        None
    }

    /// The fire-time claims kept in this server, for the scheduler
    /// ([`FireClaims`](crate::claims::FireClaims)); `None` (the default) when the backend
    /// cannot keep them (Redlock: a majority write is not one atomic step).
    fn fire_claims(&self) -> Option<&dyn crate::claims::FireClaims> {
        None
    }

    /// Leaders' values published beside their locks, for elections
    /// ([`LeaderValues`](crate::election::LeaderValues)); `None` (the default) when the
    /// backend offers no elections (Redlock: see its crate documentation).
    fn leader_values(&self) -> Option<&dyn crate::election::LeaderValues> {
        None
    }
}

/// A backend's one-step hand-over: the lock passes from its holder straight to the next
/// waiter of the same Locker on release, instead of a release and an acquisition.
#[async_trait]
pub trait HandOver: Send + Sync {
    /// Passes the lock `from` holds straight to `to` for `ttl`, in one step on the server,
    /// for a Locker whose next waiter on the key is queued behind `from`'s holder; `to`
    /// claims the same [`permits`](Lease::permits) as `from`.
    ///
    /// Rules: the lock changes hands only while the server still holds it for `from`, so no
    /// other owner is ever displaced, and `to`'s grant obeys `try_acquire`'s rules (its
    /// fence is greater than `from`'s, its validity counts from before the request).
    /// - `Granted`: `from` held the lock until the hand-over, and `to` holds it now;
    /// - `Taken`: `from` no longer held it; nothing changed;
    ///
    /// The [`LockGuard`](crate::LockGuard) calls it from its release, after its own
    /// renewals have stopped, and only for a waiter of the same Locker queued behind it.
    ///
    /// # Errors
    /// - [`Error::Unsupported`](crate::Error::Unsupported): nothing changed, the backend
    ///   cannot hand this lock over; the caller releases `from` as usual;
    /// - another error: the hand-over may or may not have happened, and the backend has
    ///   undone what it could; the caller reports the error as `from`'s release and
    ///   abandons whatever `to` may have been granted.
    ///
    /// # Cancel safety
    /// A dropped call may still hand the lock over; the caller then
    /// abandons `to`'s grant.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(
    /// #     backend: &dyn lock_core::Backend,
    /// #     held: lock_core::Lease,
    /// # ) -> lock_core::Result<()> {
    /// use std::time::Duration;
    /// use lock_core::{Attempt, Error, Owner};
    ///
    /// let Some(protocol) = backend.hand_over() else {
    ///     return backend.release(&held).await;
    /// };
    /// let ttl = backend.capabilities().effective_ttl(Duration::from_secs(10))?;
    /// let next = Owner::random();
    /// match protocol.hand_over(&held, next, ttl).await {
    ///     Ok(Attempt::Granted { fence, .. }) => println!("handed over, fence {fence}"),
    ///     Ok(Attempt::Taken { .. }) => println!("`held` was no longer the holder"),
    ///     Err(Error::Unsupported { .. }) => backend.release(&held).await?,
    ///     Err(e) => {
    ///         backend.abandon(held.key(), next).await?;
    ///         return Err(e);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    async fn hand_over(&self, from: &Lease, to: Owner, ttl: Ttl) -> Result<Attempt>;
}

/// Inspection and administrative override of a backend's locks (the CLI's `status`, the
/// conformance suite's "taken away behind the holder's back").
#[async_trait]
pub trait Admin: Send + Sync {
    /// Who holds `key` now: every unexpired grant on it (one for a held lock, as many as
    /// hold permits of a semaphore or a reader-writer key); empty when it is free.
    ///
    /// A read: it changes nothing. An expired grant counts as gone. What the server does not
    /// store readably is `None` in the [`Holder`]; each backend documents what it knows.
    ///
    /// # Errors
    /// Transient errors as for [`Backend::try_acquire`] (Redlock:
    /// [`Error::QuorumNotReached`](crate::Error::QuorumNotReached) when fewer than a
    /// majority of nodes answered).
    ///
    /// # Cancel safety
    /// Dropping the future leaves nothing behind.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// let Some(admin) = locker.backend().admin() else {
    ///     return Ok(()); // this backend cannot tell
    /// };
    /// for holder in admin.inspect("jobs/nightly").await? {
    ///     println!("fence {:?}, {:?} left", holder.fence, holder.expires_in);
    /// }
    /// # Ok(()) }
    /// ```
    async fn inspect(&self, key: &str) -> Result<Vec<Holder>>;

    /// Deletes `key`'s grants whoever holds them (each holder finds its grant lost at its
    /// next renewal) and announces the release; true if a grant was there.
    ///
    /// For tools and tests, not for normal locking: until its next renewal the holder
    /// believes it holds the lock while a waiter may be granted it; fencing tokens keep the
    /// protected resource safe meanwhile.
    ///
    /// # Errors
    /// Transient errors as for [`Backend::try_acquire`], after which the lock may or may not
    /// be deleted (Redlock: [`Error::QuorumNotReached`](crate::Error::QuorumNotReached) when
    /// fewer than a majority of nodes answered, since the holder may then still hold it).
    ///
    /// # Cancel safety
    /// Dropping the future may leave the lock deleted or not, as an error does, and a
    /// deletion unannounced to this process's waiters.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
    /// if let Some(admin) = locker.backend().admin() {
    ///     if admin.force_release("jobs/stuck").await? {
    ///         println!("removed the lock of jobs/stuck");
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    async fn force_release(&self, key: &str) -> Result<bool>;
}

/// A backend that answers without waiting on I/O (the in-process one): the Locker calls
/// these instead of the boxed async methods.
pub trait Immediate: Send + Sync {
    /// [`Backend::try_acquire`], answered at once. The key comes as the shared string the
    /// lease will hold, so the backend may keep it without copying.
    fn try_acquire(
        &self,
        key: &Arc<str>,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt>;

    /// [`Backend::release`], answered at once.
    fn release(&self, lease: &Lease) -> Result<()>;
}

/// The server's own round trip on the lock's connection settings, with no lock protocol
/// around it: what `distlock bench` shows beside the lock cycle, so that what a lock costs
/// above the network can be read off on one's own servers.
///
/// A raw cycle is two round trips, as a lock cycle is (acquire, release): a plain write of
/// a key and its deletion, on the same connection(s) and within the same timeouts as the
/// lock's operations, fanned out as they are. Each backend says what it sends in
/// [`description`](Self::description).
///
/// Rules an implementation keeps:
/// - it never touches a lock: the key it writes is the backend's *raw key* for `key`,
///   outside everything the lock protocol stores (lock keys, fence counters, tombstones),
///   so a raw cycle on `key` changes nothing for a holder of, or a waiter on, the lock
///   `key`, and announces no release;
/// - every request is bounded by the timeout the lock's requests have, and fails as
///   they do: the transient [`Error::Unavailable`](crate::Error::Unavailable) when the
///   server could not be reached or did not answer in time,
///   [`Error::QuorumNotReached`](crate::Error::QuorumNotReached) (Redlock) when fewer than
///   a majority of nodes answered, [`Error::Backend`](crate::Error::Backend) for an answer
///   the server's protocol does not allow;
/// - a finished cycle leaves nothing behind; a cycle cut off (an error, a dropped future)
///   leaves at most the raw key, which expires by itself or is overwritten and deleted
///   by the next raw cycle on the same key (each backend documents which).
///
/// It is a measuring stick, not a lock: two raw cycles on one key do not exclude each
/// other, and neither looks at what the other wrote.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(locker: lock_core::Locker) -> lock_core::Result<()> {
/// use std::time::{Duration, Instant};
///
/// let Some(raw) = locker.backend().baseline() else {
///     return Ok(()); // no server to measure
/// };
/// let ttl = locker.capabilities().effective_ttl(Duration::from_secs(10))?;
/// let started = Instant::now();
/// raw.raw_cycle("jobs/nightly", ttl).await?;
/// println!("{}: {:?}", raw.description(), started.elapsed());
/// # Ok(()) }
/// ```
#[async_trait]
pub trait Baseline: Send + Sync {
    /// What one raw cycle sends, in a few words for reports (`"SET NX PX + DEL"`).
    fn description(&self) -> &'static str;

    /// One raw cycle on the raw key of `key`: the plain write, then its deletion, each
    /// bounded by the timeout the lock's operations have (for a backend whose timeouts
    /// follow the TTL, those of a lock of `ttl`). Where the write carries an expiry, it is
    /// `ttl`.
    ///
    /// `Ok` once the deletion was answered; whether the write found the key already there
    /// is not looked at.
    ///
    /// # Errors
    /// As [`Backend::try_acquire`]: [`Error::Unavailable`](crate::Error::Unavailable)
    /// (transient), [`Error::QuorumNotReached`](crate::Error::QuorumNotReached) (transient,
    /// Redlock), [`Error::Backend`](crate::Error::Backend). After an error the raw key may
    /// be left behind, as after a cancelled call.
    ///
    /// # Cancel safety
    /// Dropping the future may leave the raw key behind (never a lock); the backend's
    /// documentation says how it goes away.
    async fn raw_cycle(&self, key: &str, ttl: Ttl) -> Result<()>;
}
