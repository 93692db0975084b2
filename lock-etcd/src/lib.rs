//! # lock-etcd
//!
//! The etcd backend of distlock: consensus-backed locks whose fencing token is the lock
//! key's revision. Works with etcd 3.4 and later (v3 API).
//!
//! ```no_run
//! # async fn demo() -> lock_core::Result<()> {
//! let url = lock_core::LockUrl::parse("etcd://10.0.0.1:2379,10.0.0.2:2379?prefix=app/&timeout=1s")?;
//! let locker = lock_core::Locker::new(lock_etcd::EtcdBackend::connect(&url).await?);
//! # Ok(()) }
//! ```
//!
//! ## Protocol
//!
//! - **Acquire** is one transaction: if the key's `create_revision` is 0 (no key), put it
//!   with the owner token as value, attached to a lease; otherwise read it. The fencing token
//!   is the revision that created the key, strictly increasing across holders because etcd's
//!   revision is one counter for the whole store.
//! - **Hand-over** ([`Backend::hand_over`]: the Locker's next waiter on the key is queued
//!   behind the releasing guard) is one transaction too: if the key still holds the
//!   releasing owner's token, put it with the waiter's, on the same lease. The key is never
//!   deleted in between, so a turn inside one process costs one write instead of two, and
//!   the new holder's fencing token is the revision of that put: again the revision of the
//!   write that made it the holder, greater than every earlier one. The Locker hands one key
//!   over at most 16 times in a row, then releases it, which wakes other processes' waiters.
//!   A waiter asking for another TTL (another lease) gets the key the long way.
//! - **Release** is a transaction that deletes the key only while it holds our owner token.
//!   **Extend** renews the lock's lease (one keep-alive) and reads the key to check it is
//!   still ours on it; [`Error::NotHeld`] otherwise. A new TTL moves the key onto a new lease
//!   (etcd leases keep their TTL), in place; that put's revision is not the holder's fence,
//!   so the value then carries it (`<owner>:<fence>`), for [`inspect`](Backend::inspect). **force_release** deletes
//!   the key and revokes its lease, so the holder's next renewal fails.
//! - Every operation is bounded by the timeout (URL `timeout=`, default 2 s) and fails with
//!   the transient [`Error::Unavailable`] when it passes or the cluster cannot be reached.
//!
//! ## One lease per lock, recycled
//!
//! Each held lock has a lease of its own: a lock whose holder stops renewing expires after
//! *its* TTL, and renewing one lock never extends another. One session lease per backend,
//! kept alive by one stream, would save the lease bookkeeping, but every lock on it would
//! then live as long as the session, whatever its TTL.
//!
//! Lease TTLs are whole seconds, so [`Capabilities::ttl_granularity`] is 1 s. Granting a
//! lease, acquiring and releasing are each a raft write (a disk sync on the leader); with a
//! fresh lease per acquisition (grant, acquire, release, revoke: four writes per cycle) this
//! backend measured 0.45× the throughput of etcd's own lock RPC. So a released lease is kept
//! in a small pool (its key is gone) for the next acquisition with the same TTL: two writes
//! per cycle, like the lock RPC. Renewing the pooled lease on every acquisition cost
//! another ~0.1 ms of etcd's CPU per cycle (a keep-alive is not a raft write, but etcd 3.4
//! spends about as much CPU on it as on a transaction): at 64 tasks etcd's CPU is the
//! bottleneck, and that was 0.6× the peer. Hence the **headroom**: a lock's lease lives 1 s longer than the lock, and a pooled
//! lease known (from the instant its last grant or renewal was sent) to live past the new
//! lock's validity is used as is; only older ones are renewed, in parallel with the
//! acquisition. Within the lock's TTL nothing changes; when a holder stops renewing, etcd
//! frees the lock between its TTL and its TTL + 1 s (plus etcd's expiry lag, below). The
//! shortest lock is therefore the server's shortest lease (1.5 election timeouts, 2 s with
//! etcd's defaults) less 1 s, at least 1 s: [`EtcdBackend`] asks the server when it connects
//! and reports it as [`Capabilities::min_ttl`].
//!
//! The Jepsen rule (etcd 3.4.3's lock RPC granted locks on expired leases): an acquisition
//! never uses a lease that may have run out. A pooled lease is used as is only while known
//! alive past the new lock's validity, otherwise renewed by the acquisition itself; and a
//! grant whose confirmation arrives after the lock's validity (counted from the moment
//! before its lease was granted or renewed) is refused and its lease revoked, so a waiter
//! delayed past its lease is never granted.
//!
//! ## Group commit
//!
//! Every etcd write is a raft round and a WAL sync, and on etcd 3.4 every transaction with
//! a comparison also copies the server's read buffer. Acquire and release transactions
//! that arrive while two others are on their way therefore queue and go together as the
//! nested transactions of one transaction ([`lock_core::group`]; etcd ≥ 3.3): each keeps
//! its own comparison and outcome, and the group costs one write. The fencing token of a
//! grant in a group is the group's revision, which is the revision that created the key.
//! A lone caller's transaction goes at once, alone.
//!
//! ## Waiting
//!
//! One watch per backend over the key prefix, for delete events only (releases, lease
//! expiries, forced releases), wakes the waiters of the deleted key: no polling. It is open
//! only while some waiter listens: a refused attempt opens it from the revision after the
//! one its answer carried, so no delete after the refusal is missed, and it closes a second
//! or so after the last waiter stopped listening. A backend whose locks are not contended
//! thus costs etcd no watch event per release. A watch that fails or falls silent (checked
//! with a progress request every second) is replaced from the current revision, and every
//! waiter is woken, since deletes in between were missed. A release also wakes
//! this process's waiters as soon as etcd confirms it, and the watch event of that same
//! deletion (same revision) then wakes nobody again. A refused attempt tells the waiter
//! how long the holder has left: exactly for a holder in this backend, from the holder's
//! lease TTL (whole seconds) for another process's.
//!
//! etcd deletes an expired lease's keys when its lessor next checks, up to 500 ms after the
//! expiry. Within one backend (one process) the holder's validity is known exactly, and an
//! acquisition that finds the key held by an expired lock of this backend revokes that lease
//! at once; a waiter in another process gets an unrenewed lock up to ~1.5 s after its TTL.
//!
//! ## Several members
//!
//! etcd-client spreads one client's requests over all its endpoints at random, so a member
//! that hangs (paused, partitioned) would keep receiving a share of the requests, each of
//! which waits for the whole timeout. This backend keeps a client per member and sends
//! everything to one preferred member, moving to the next one after a transient failure: a
//! hung member costs one timeout.
//!
//! With credentials, a member whose authentication token expired (etcd's tokens last
//! 5 minutes by default, and etcd-client does not renew them) gets a newly authenticated
//! client; the operation that found the token expired fails with a transient error, which
//! the Locker retries.
//!
//! TLS (`https://` endpoints) is not supported: etcd-client is built without it.
#![deny(missing_docs)]

mod batch;
mod config;
mod error;
mod leases;
mod members;
mod watch;

use lock_core::sync::lock;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, KeyValue, LeaseGrantOptions,
    PutOptions, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use lock_core::{
    Attempt, Backend, Capabilities, Error, Holder, Lease, LockUrl, Owner, ReleaseListener,
    ReleaseNotices, Result,
};

use batch::{Answer, Batcher};
pub use config::{EtcdBuilder, DEFAULT_PORT, DEFAULT_PREFIX, DEFAULT_TIMEOUT, URL_PARAMS};
use error::{failed, is_lease_not_found, timed_out, unexpected};
use leases::{secs, Pool, Renewal, Slot, HEADROOM_SECS};
use lock_core::group::GroupKey;
use members::Members;

/// The backend's name in errors and capabilities.
pub(crate) const NAME: &str = "etcd";
/// Far beyond any sensible lease, and small enough that `Instant + ttl` never overflows.
const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);
/// HTTP/2 pings on the connections find dead ones; etcd refuses clients that ping more
/// often than every 5 s.
const CONNECTION_PING: Duration = Duration::from_secs(10);
/// How long past its validity a held-lock record of a guard that never released is kept.
const HELD_GRACE: Duration = Duration::from_secs(60);

/// Locks on an etcd cluster. Build a [`Locker`](lock_core::Locker) over it with
/// `Locker::new(EtcdBackend::connect(&url).await?)`, or configure it with
/// [`EtcdBackend::builder`].
///
/// Dropping it stops its release watch and revokes its leases in the background: the idle
/// ones, and those of locks it granted that were never released (a Locker keeps its backend
/// alive while any of its guards is held).
pub struct EtcdBackend {
    shared: Arc<Shared>,
    watch: tokio::task::AbortHandle,
}

struct Shared {
    members: Arc<Members>,
    endpoints: Vec<String>,
    prefix: String,
    timeout: Duration,
    caps: Capabilities,
    notices: Arc<ReleaseNotices>,
    /// Announces each release once, from this backend's releases and from the watch.
    announcer: Arc<watch::Announcer>,
    /// Opens the watch when a refused attempt needs it.
    demand: Arc<watch::Demand>,
    held: Mutex<HeldTable>,
    pool: Mutex<Pool>,
    /// Acquire and release transactions go through it, grouped under load.
    batch: Arc<Batcher>,
}

/// A lock granted through this backend and not yet released, by owner token.
#[derive(Default)]
struct HeldTable {
    map: HashMap<u128, Held>,
    /// Size after the last sweep of long-expired records; the next sweep runs at twice that.
    swept_at: usize,
}

struct Held {
    lease_id: i64,
    ttl_secs: i64,
    valid_until: Instant,
    /// The lease with its keep-alive stream; out while an extension uses it.
    slot: Option<Slot>,
    /// The fence written into the key's value, once the key was moved to a new lease (see
    /// [`stored_value`]).
    value_fence: Option<u64>,
}

/// What a read of a lock key showed.
struct Seen {
    owner: Option<Owner>,
    lease: i64,
    /// The holder's fencing token.
    fence: i64,
}

impl EtcdBackend {
    /// A configuration for the cluster members at `endpoints` (`host:port`), to complete
    /// with the [`EtcdBuilder`] setters and [`build`](EtcdBuilder::build).
    pub fn builder<I, S>(endpoints: I) -> EtcdBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdBuilder::new(endpoints)
    }

    /// Connects to the cluster an `etcd://` URL names:
    /// `etcd://[user:password@]host[:port][,host[:port]…][?prefix=…&timeout=…]`.
    ///
    /// # Errors
    /// As [`EtcdBuilder::from_url`] and [`EtcdBuilder::build`].
    pub async fn connect(url: &LockUrl) -> Result<EtcdBackend> {
        EtcdBuilder::from_url(url)?.build().await
    }

    /// The key prefix of every lock.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// The endpoints connected to.
    pub fn endpoints(&self) -> &[String] {
        &self.shared.endpoints
    }

    /// The bound on every operation.
    pub fn timeout(&self) -> Duration {
        self.shared.timeout
    }

    /// Number of locks granted through this backend and not released yet.
    pub fn held_leases(&self) -> usize {
        lock(&self.shared.held).map.len()
    }

    /// Number of idle leases kept for reuse.
    pub fn idle_leases(&self) -> usize {
        lock(&self.shared.pool).len()
    }

    /// Number of keys that waiters listen on.
    pub fn listened_keys(&self) -> usize {
        self.shared.notices.listened_keys()
    }

    /// Whether the release watch is open: from a waiter's first refused attempt until a
    /// second or so after nobody listens any more.
    pub fn watching(&self) -> bool {
        self.shared.demand.is_running()
    }

    pub(crate) async fn start(cfg: EtcdBuilder) -> Result<EtcdBackend> {
        let timeout = cfg.timeout;
        let doing = format!("connecting to etcd at {}", cfg.endpoints.join(","));
        let mut options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_keep_alive(CONNECTION_PING, timeout)
            .with_keep_alive_while_idle(false);
        if let Some((name, password)) = &cfg.user {
            options = options.with_user(name.clone(), password.clone());
        }
        let members = Members::connect(&cfg.endpoints, options, timeout, &doing).await?;
        let client = members.client();
        let connect = async {
            // The shortest lease the server grants: it raises shorter TTLs to its minimum.
            let probe = new_lease_id();
            let granted = client
                .lease_client()
                .grant(1, Some(LeaseGrantOptions::new().with_id(probe)))
                .await
                .map_err(failed(doing.as_str()))?;
            if !granted.error().is_empty() || granted.ttl() < 1 {
                return Err(unexpected("a lease grant without a positive TTL"));
            }
            let _ = client.lease_client().revoke(probe).await;
            // etcd 3.4 grants leases to anyone: a read under the prefix is what tells early
            // that the credentials are missing or lack permissions.
            watch::current_revision(&client, &cfg.prefix)
                .await
                .map_err(failed(doing.as_str()))?;
            Ok(granted.ttl())
        };
        let min_secs = tokio::time::timeout(timeout, connect)
            .await
            .unwrap_or_else(|_| Err(timed_out(&doing, timeout)))?;
        let members = Arc::new(members);
        let notices = Arc::new(ReleaseNotices::new());
        let announcer = Arc::new(watch::Announcer::new(notices.clone()));
        let demand = Arc::new(watch::Demand::new(notices.clone()));
        let watch = tokio::spawn(watch::run(
            members.clone(),
            cfg.prefix.clone(),
            announcer.clone(),
            timeout,
            demand.clone(),
        ))
        .abort_handle();
        let shared = Shared {
            batch: batch::batcher(members.clone(), timeout),
            members,
            endpoints: cfg.endpoints,
            prefix: cfg.prefix,
            timeout,
            caps: Capabilities {
                name: NAME,
                // A lock's lease is HEADROOM_SECS longer than the lock.
                min_ttl: secs((min_secs - HEADROOM_SECS).max(1)),
                ttl_granularity: Duration::from_secs(1),
                max_ttl: MAX_TTL,
                monotonic_fencing: true,
                release_notices: true,
                cross_process: true,
                clock_drift: lock_core::ClockDrift::NONE,
                hand_over: true,
            },
            notices,
            announcer,
            demand,
            held: Mutex::new(HeldTable::default()),
            pool: Mutex::new(Pool::default()),
        };
        Ok(EtcdBackend {
            shared: Arc::new(shared),
            watch,
        })
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        self.watch.abort();
        let mut leases = lock(&self.shared.pool).drain();
        leases.extend(lock(&self.shared.held).map.drain().map(|(_, h)| h.lease_id));
        if leases.is_empty() {
            return;
        }
        // Outside a runtime they simply expire at their TTL.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let mut client = self.shared.client().lease_client();
            let timeout = self.shared.timeout;
            runtime.spawn(async move {
                for id in leases {
                    let _ = tokio::time::timeout(timeout, client.revoke(id)).await;
                }
            });
        }
    }
}

impl std::fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.shared.endpoints)
            .field("prefix", &self.shared.prefix)
            .field("timeout", &self.shared.timeout)
            .field("min_ttl", &self.shared.caps.min_ttl)
            .field("held_leases", &self.held_leases())
            .field("idle_leases", &self.idle_leases())
            .field("listened_keys", &self.listened_keys())
            .field("watching", &self.watching())
            .finish()
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.shared.caps
    }

    /// Runs on a task of its own, so that an attempt dropped half-way (its caller
    /// cancelled) still finishes and gives back what it was granted.
    async fn try_acquire(&self, key: &str, owner: Owner, ttl: Duration) -> Result<Attempt> {
        // Also bounds `ttl` by `max_ttl`, so `Instant + ttl` cannot overflow.
        let ttl_secs = self.shared.lease_secs(ttl)?;
        let key: Arc<str> = Arc::from(key);
        detached(&self.shared, key.clone(), owner, move |shared| async move {
            shared.attempt(&key, owner, ttl, ttl_secs).await
        })
        .await
    }

    /// One transaction: if the key still holds `from`'s value, put it with `to`'s, on
    /// `from`'s lease when the TTL is the same (renewed alongside when needed), on another
    /// otherwise. `to`'s fence is that put's revision. Runs on a task of its own, like
    /// `try_acquire`.
    async fn hand_over(&self, from: &Lease, to: Owner, ttl: Duration) -> Result<Attempt> {
        let ttl_secs = self.shared.lease_secs(ttl)?;
        let from = from.clone();
        detached(
            &self.shared,
            from.key_arc().clone(),
            to,
            move |shared| async move { shared.hand_over(&from, to, ttl, ttl_secs).await },
        )
        .await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Instant> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.extend(lease, ttl).await;
        self.shared.members.note(member, result)
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.release(lease).await;
        self.shared.members.note(member, result)
    }

    fn listen(&self, key: &str) -> Option<ReleaseListener> {
        Some(self.shared.notices.listen(key))
    }

    async fn inspect(&self, key: &str) -> Result<Option<Holder>> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.inspect(key).await;
        self.shared.members.note(member, result)
    }

    async fn force_release(&self, key: &str) -> Result<bool> {
        let (member, _) = self.shared.members.pick();
        let result = self.shared.force_release(key).await;
        self.shared.members.note(member, result)
    }
}

impl Shared {
    /// The client of the preferred member.
    fn client(&self) -> Arc<Client> {
        self.members.client()
    }

    fn full_key(&self, key: &str) -> String {
        let mut full = String::with_capacity(self.prefix.len() + key.len());
        full.push_str(&self.prefix);
        full.push_str(key);
        full
    }

    /// The lease TTL for a lock TTL: whole seconds, rounded up, at least the server minimum.
    fn lease_secs(&self, ttl: Duration) -> Result<i64> {
        if ttl.is_zero() || ttl > self.caps.max_ttl {
            return Err(Error::InvalidTtl {
                ttl,
                backend: NAME,
                reason: format!(
                    "must be greater than zero and at most {:?}",
                    self.caps.max_ttl
                ),
            });
        }
        let whole = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        Ok(i64::try_from(whole.max(self.caps.min_ttl.as_secs())).unwrap_or(i64::MAX))
    }

    /// Runs `op` within the operation timeout.
    async fn within<T>(&self, doing: &str, op: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::time::timeout(self.timeout, op)
            .await
            .unwrap_or_else(|_| Err(timed_out(doing, self.timeout)))
    }

    /// Revokes a lease in the background (which deletes any key attached to it).
    fn revoke_later(&self, id: i64) {
        let mut leases = self.client().lease_client();
        let timeout = self.timeout;
        tokio::spawn(async move {
            let _ = tokio::time::timeout(timeout, leases.revoke(id)).await;
        });
    }

    /// Revokes a lease now; one already gone is fine.
    async fn revoke(&self, id: i64) -> Result<()> {
        match self.client().lease_client().revoke(id).await {
            Ok(_) => Ok(()),
            Err(e) if is_lease_not_found(&e) => Ok(()),
            Err(e) => Err(failed("revoking a lease")(e)),
        }
    }

    /// Keeps a lease that holds no key for the next acquisition.
    fn recycle(&self, slot: Slot) {
        let overflow = lock(&self.pool).put(slot, Instant::now());
        if let Some(slot) = overflow {
            self.revoke_later(slot.id);
        }
    }

    fn hold(&self, owner: Owner, entry: Held) {
        let mut held = lock(&self.held);
        let now = Instant::now();
        if held.map.len() >= 64 && held.map.len() >= held.swept_at * 2 {
            held.map.retain(|_, h| h.valid_until + HELD_GRACE > now);
            held.swept_at = held.map.len();
        }
        held.map.insert(owner.as_u128(), entry);
    }

    async fn attempt(
        &self,
        key: &str,
        owner: Owner,
        ttl: Duration,
        ttl_secs: i64,
    ) -> Result<Attempt> {
        let started = Instant::now();
        let mut used = Vec::new();
        let attempt = self.attempt_within(key, owner, ttl, ttl_secs, started, &mut used);
        match tokio::time::timeout(self.timeout, attempt).await {
            Ok(result) => result,
            Err(_) => {
                // The cut-off requests may have attached the key to one of these leases:
                // revoking them removes it.
                for id in used {
                    self.revoke_later(id);
                }
                Err(timed_out("acquiring", self.timeout))
            }
        }
    }

    async fn attempt_within(
        &self,
        key: &str,
        owner: Owner,
        ttl: Duration,
        ttl_secs: i64,
        started: Instant,
        used: &mut Vec<i64>,
    ) -> Result<Attempt> {
        let valid_until = started + ttl;
        let full = self.full_key(key);
        let value = owner.to_string();
        let spare = lock(&self.pool).take(ttl_secs, started);
        let reused = match spare {
            Some(slot) => {
                let txn = acquire_txn(&full, &value, slot.id);
                self.send_on_lease(slot, valid_until, &full, txn, used)
                    .await?
            }
            None => None,
        };
        let (slot, mut response) = match reused {
            Some(done) => done,
            None => {
                self.acquire_with_new_lease(ttl_secs, &full, &value, used)
                    .await?
            }
        };
        if !response.succeeded() {
            let stale = holder_in(&response.response).and_then(|seen| self.expired_holder(&seen));
            if let Some(stale) = stale {
                // The holder is a lock of this backend past its validity that etcd has not
                // expired yet: its lease can go now.
                if let Err(e) = self.revoke(stale).await {
                    self.recycle(slot);
                    return Err(e);
                }
                response = match self
                    .batch
                    .send(
                        GroupKey::of(full.as_str()),
                        acquire_txn(&full, &value, slot.id),
                        self.timeout,
                    )
                    .await
                {
                    Ok(response) => response,
                    Err(e) => {
                        self.revoke_later(slot.id);
                        return Err(acquire_failed(e));
                    }
                };
            }
        }
        if response.succeeded() {
            let fence = Some(response.revision)
                .filter(|&r| r > 0)
                .ok_or_else(|| unexpected("a transaction without a revision"))?;
            if Instant::now() >= valid_until {
                // Granted on a lease that may already have run out: never hand that out.
                self.revoke_later(slot.id);
                return Err(Error::unavailable(
                    NAME,
                    "etcd confirmed the grant only after the lock's TTL had passed; not granted",
                ));
            }
            self.hold(
                owner,
                Held {
                    lease_id: slot.id,
                    ttl_secs,
                    valid_until,
                    slot: Some(slot),
                    value_fence: None,
                },
            );
            return Ok(Attempt::Granted {
                fence: fence as u64,
                valid_until,
            });
        }
        let holder = holder_in(&response.response);
        // Its waiter hears of the next delete from the watch, from right after this answer.
        self.demand.ensure(key, response.revision.saturating_add(1));
        let expires_in = self.expires_in(holder.as_ref()).await;
        // Back to the pool only after the last await: an attempt cut off by its timeout
        // revokes every lease it used, and a lease already in the pool may by then carry
        // another lock.
        self.recycle(slot);
        Ok(Attempt::Taken { expires_in })
    }

    /// `txn` (an acquisition or a hand-over on `slot`'s lease): as is when the lease is
    /// known to live past `valid_until`, with a renewal of the lease at the same time
    /// otherwise. `None` when the lease turned out to have expired.
    async fn send_on_lease(
        &self,
        mut slot: Slot,
        valid_until: Instant,
        full: &str,
        txn: Txn,
        used: &mut Vec<i64>,
    ) -> Result<Option<(Slot, Answer)>> {
        used.push(slot.id);
        let client = self.client();
        if slot.covers(valid_until) {
            return match self.batch.send(GroupKey::of(full), txn, self.timeout).await {
                Ok(response) => Ok(Some((slot, response))),
                Err(e) => {
                    self.revoke_later(slot.id);
                    Err(acquire_failed(e))
                }
            };
        }
        let (renewal, txn) = tokio::join!(
            slot.keep_alive(&client),
            self.batch.send(GroupKey::of(full), txn, self.timeout)
        );
        match (renewal, txn) {
            (Ok(Renewal::Alive), Ok(response)) => Ok(Some((slot, response))),
            (Ok(Renewal::Gone), Ok(response)) => {
                if response.succeeded() {
                    // The key went onto a lease that is about to be revoked: take it back
                    // before trying again with a new lease.
                    self.revoke(slot.id).await?;
                }
                Ok(None)
            }
            (Ok(Renewal::Gone), Err(e)) if is_lease_not_found(&e) => Ok(None),
            (Err(e), _) | (_, Err(e)) => {
                self.revoke_later(slot.id);
                Err(acquire_failed(e))
            }
        }
    }

    /// Grants a new lease, then runs the acquire transaction on it.
    async fn acquire_with_new_lease(
        &self,
        ttl_secs: i64,
        full: &str,
        value: &str,
        used: &mut Vec<i64>,
    ) -> Result<(Slot, Answer)> {
        let slot = self.grant(ttl_secs, used).await?;
        match self
            .batch
            .send(
                GroupKey::of(full),
                acquire_txn(full, value, slot.id),
                self.timeout,
            )
            .await
        {
            Ok(response) => Ok((slot, response)),
            Err(e) => {
                self.revoke_later(slot.id);
                Err(acquire_failed(e))
            }
        }
    }

    /// Grants a lease for locks of `ttl_secs`.
    async fn grant(&self, ttl_secs: i64, used: &mut Vec<i64>) -> Result<Slot> {
        let id = new_lease_id();
        used.push(id);
        let lease_secs = ttl_secs + HEADROOM_SECS;
        let sent = Instant::now();
        let options = LeaseGrantOptions::new().with_id(id);
        match self
            .client()
            .lease_client()
            .grant(lease_secs, Some(options))
            .await
        {
            Ok(granted) if granted.error().is_empty() && granted.ttl() >= lease_secs => {
                Ok(Slot::granted(id, ttl_secs, granted.ttl(), sent))
            }
            Ok(_) => {
                self.revoke_later(id);
                Err(unexpected("a lease grant shorter than asked"))
            }
            Err(e) => {
                self.revoke_later(id);
                Err(failed("granting a lease")(e))
            }
        }
    }

    /// The lease of a lock of this backend whose validity has passed, taken out of the
    /// held table; `None` for a valid lock or another process's.
    fn expired_holder(&self, seen: &Seen) -> Option<i64> {
        let owner = seen.owner?.as_u128();
        let mut held = lock(&self.held);
        let entry = held.map.get(&owner)?;
        if entry.lease_id != seen.lease || Instant::now() < entry.valid_until {
            return None;
        }
        held.map.remove(&owner);
        Some(seen.lease)
    }

    /// How long the holder has left: exactly for a lock of this backend, from its lease's
    /// remaining whole seconds (rounded up) for another process's.
    async fn expires_in(&self, seen: Option<&Seen>) -> Option<Duration> {
        let seen = seen?;
        if let Some(owner) = seen.owner {
            if let Some(entry) = lock(&self.held).map.get(&owner.as_u128()) {
                if entry.lease_id == seen.lease {
                    return Some(entry.valid_until.saturating_duration_since(Instant::now()));
                }
            }
        }
        if seen.lease == 0 {
            return None;
        }
        match self
            .client()
            .lease_client()
            .time_to_live(seen.lease, None)
            .await
        {
            Ok(answer) if answer.ttl() >= 0 => Some(secs(answer.ttl() + 1)),
            _ => None,
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Instant> {
        let ttl_secs = self.lease_secs(ttl)?;
        if lease.is_expired() {
            return Err(lease.not_held());
        }
        let owner = lease.owner().as_u128();
        let (lease_id, held_secs, slot, value_fence) = match lock(&self.held).map.get_mut(&owner) {
            Some(entry) => (
                entry.lease_id,
                entry.ttl_secs,
                entry.slot.take(),
                entry.value_fence,
            ),
            None => return Err(lease.not_held()),
        };
        let started = Instant::now();
        self.within("extending", async {
            if held_secs == ttl_secs {
                self.renew(lease, lease_id, held_secs, slot, started + ttl)
                    .await
            } else {
                let slot =
                    slot.unwrap_or_else(|| Slot::known(lease_id, held_secs, lease.valid_until()));
                self.move_to_new_lease(lease, slot, value_fence, ttl_secs, started + ttl)
                    .await
            }
        })
        .await
    }

    /// Renews the lock's lease and checks that the key is still ours on it.
    async fn renew(
        &self,
        lease: &Lease,
        lease_id: i64,
        ttl_secs: i64,
        slot: Option<Slot>,
        valid_until: Instant,
    ) -> Result<Instant> {
        let mut slot = slot.unwrap_or_else(|| Slot::known(lease_id, ttl_secs, lease.valid_until()));
        let full = self.full_key(lease.key());
        let client = self.client();
        let mut kv = client.kv_client();
        let (renewal, current) = tokio::join!(slot.keep_alive(&client), kv.get(full, None));
        let renewal = renewal.map_err(failed("renewing the lock's lease"))?;
        let current = current.map_err(failed("checking the lock"))?;
        let ours = current
            .kvs()
            .first()
            .is_some_and(|kv| kv.lease() == lease_id && seen(kv).owner == Some(lease.owner()));
        let owner = lease.owner().as_u128();
        if renewal == Renewal::Gone || !ours {
            lock(&self.held).map.remove(&owner);
            if renewal == Renewal::Alive {
                // Ours, but it holds no key of ours any more.
                self.revoke_later(lease_id);
            }
            return Err(lease.not_held());
        }
        match lock(&self.held).map.get_mut(&owner) {
            Some(entry) if entry.lease_id == lease_id => {
                entry.valid_until = valid_until;
                entry.slot = Some(slot);
                Ok(valid_until)
            }
            // Reaped or released while the renewal was in flight.
            _ => Err(lease.not_held()),
        }
    }

    /// A new TTL needs a new lease (etcd leases keep their TTL): move the key onto one. The
    /// key is rewritten in place, its value now carrying the fence, which the put's revision
    /// no longer tells.
    async fn move_to_new_lease(
        &self,
        lease: &Lease,
        old: Slot,
        value_fence: Option<u64>,
        ttl_secs: i64,
        valid_until: Instant,
    ) -> Result<Instant> {
        let owner = lease.owner();
        let mut used = Vec::new();
        let slot = self.grant(ttl_secs, &mut used).await?;
        let full = self.full_key(lease.key());
        let txn = Txn::new()
            .when([
                Compare::value(
                    full.as_str(),
                    CompareOp::Equal,
                    stored_value(owner, value_fence),
                ),
                Compare::lease(full.as_str(), CompareOp::Equal, old.id),
            ])
            .and_then([TxnOp::put(
                full.as_str(),
                stored_value(owner, Some(lease.fence())),
                Some(PutOptions::new().with_lease(slot.id)),
            )]);
        let response = match self.client().kv_client().txn(txn).await {
            Ok(response) => response,
            Err(e) if is_lease_not_found(&e) => {
                self.revoke_later(slot.id);
                return Err(Error::unavailable(NAME, LEASE_RAN_OUT));
            }
            Err(e) => {
                self.revoke_later(slot.id);
                return Err(failed("moving the lock to a new lease")(e));
            }
        };
        if !response.succeeded() {
            lock(&self.held).map.remove(&owner.as_u128());
            self.recycle(slot);
            self.revoke_later(old.id);
            return Err(lease.not_held());
        }
        let mut held = lock(&self.held);
        match held.map.get_mut(&owner.as_u128()) {
            Some(entry) if entry.lease_id == old.id => {
                entry.lease_id = slot.id;
                entry.ttl_secs = ttl_secs;
                entry.valid_until = valid_until;
                entry.slot = Some(slot);
                entry.value_fence = Some(lease.fence());
                drop(held);
                self.recycle(old);
                Ok(valid_until)
            }
            _ => {
                // Released or reaped meanwhile: the key must not outlive that on the new lease.
                drop(held);
                self.revoke_later(slot.id);
                self.revoke_later(old.id);
                Err(lease.not_held())
            }
        }
    }

    async fn hand_over(
        &self,
        from: &Lease,
        to: Owner,
        ttl: Duration,
        ttl_secs: i64,
    ) -> Result<Attempt> {
        let started = Instant::now();
        let valid_until = started + ttl;
        let entry = {
            let mut held = lock(&self.held);
            let owner = from.owner().as_u128();
            match held.map.get(&owner) {
                None => return Ok(Attempt::Taken { expires_in: None }),
                // The new holder keeps the lease, which serves one TTL only: another TTL
                // goes the long way (release, then acquisition).
                Some(entry) if entry.ttl_secs != ttl_secs => {
                    return Err(Error::Unsupported {
                        backend: NAME,
                        operation: "hand_over to another TTL",
                    })
                }
                Some(_) => held.map.remove(&owner),
            }
        };
        let Some(mut entry) = entry else {
            return Ok(Attempt::Taken { expires_in: None });
        };
        let slot = entry
            .slot
            .take()
            .unwrap_or_else(|| Slot::known(entry.lease_id, entry.ttl_secs, from.valid_until()));
        let full = self.full_key(from.key());
        let txn = Txn::new()
            .when([Compare::value(
                full.as_str(),
                CompareOp::Equal,
                stored_value(from.owner(), entry.value_fence),
            )])
            .and_then([TxnOp::put(
                full.as_str(),
                stored_value(to, None),
                Some(PutOptions::new().with_lease(slot.id)),
            )]);
        let lease_id = slot.id;
        let mut used = Vec::new();
        // On failure the lease is revoked, and the key with it, whoever it was handed to.
        let sent = self
            .within(
                "handing over",
                self.send_on_lease(slot, valid_until, &full, txn, &mut used),
            )
            .await;
        let (slot, answer) = match sent {
            Ok(Some(done)) => done,
            // The lease had run out, and the key on it.
            Ok(None) => return Ok(Attempt::Taken { expires_in: None }),
            Err(e) => {
                self.revoke_later(lease_id);
                return Err(e);
            }
        };
        if !answer.succeeded() {
            // Not ours any more: the lease holds nothing of ours.
            self.revoke_later(lease_id);
            return Ok(Attempt::Taken { expires_in: None });
        }
        let fence = Some(answer.revision)
            .filter(|&r| r > 0)
            .ok_or_else(|| unexpected("a transaction without a revision"))?;
        if Instant::now() >= valid_until {
            // The Jepsen rule, as for an acquisition.
            self.revoke_later(lease_id);
            return Err(Error::unavailable(
                NAME,
                "etcd confirmed the hand-over only after the lock's TTL had passed; not granted",
            ));
        }
        entry.valid_until = valid_until;
        entry.slot = Some(slot);
        entry.value_fence = None;
        self.hold(to, entry);
        Ok(Attempt::Granted {
            fence: fence as u64,
            valid_until,
        })
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let sent = Instant::now();
        let entry = lock(&self.held).map.remove(&lease.owner().as_u128());
        let full = self.full_key(lease.key());
        let value_fence = entry.as_ref().and_then(|e| e.value_fence);
        let txn = Txn::new()
            .when([Compare::value(
                full.as_str(),
                CompareOp::Equal,
                stored_value(lease.owner(), value_fence),
            )])
            .and_then([TxnOp::delete(full.as_str(), None)]);
        let deleted = self
            .within("releasing", async {
                self.batch
                    .send(GroupKey::of(full.as_str()), txn, self.timeout)
                    .await
                    .map_err(failed("releasing"))
            })
            .await
            .map(|answer| (answer.succeeded(), answer.revision));
        if let Ok((true, revision)) = deleted {
            // Waiters in this process need not wait for the watch event of this deletion,
            // which then wakes nobody again.
            self.announcer
                .deleted_here(lease.key(), revision, self.demand.is_running());
        }
        let deleted = deleted.map(|(succeeded, _)| succeeded);
        if let Some(entry) = entry {
            match (&deleted, entry.slot) {
                // The key was on this lease (an operation cut off half-way would have kept
                // its slot): the lease is free for the next lock.
                (Ok(true), Some(slot)) => self.recycle(slot),
                // Otherwise revoke it, which deletes the key if it is still on it, and
                // nothing else.
                _ => self.revoke_later(entry.lease_id),
            }
        }
        match deleted {
            Ok(true) if lease.valid_until() > sent => Ok(()),
            // Deleted, but its validity had passed: the hold was not ours to the end.
            Ok(_) => Err(lease.not_held()),
            Err(e) => Err(e),
        }
    }

    async fn inspect(&self, key: &str) -> Result<Option<Holder>> {
        let full = self.full_key(key);
        self.within("inspecting", async {
            let current = self
                .client()
                .kv_client()
                .get(full, None)
                .await
                .map_err(failed("inspecting"))?;
            let Some(seen) = current.kvs().first().map(seen) else {
                return Ok(None);
            };
            Ok(Some(Holder {
                owner: seen.owner,
                fence: u64::try_from(seen.fence).ok(),
                expires_in: self.expires_in(Some(&seen)).await,
            }))
        })
        .await
    }

    async fn force_release(&self, key: &str) -> Result<bool> {
        let full = self.full_key(key);
        let removed = self
            .within("force-releasing", async {
                let deleted = self
                    .client()
                    .kv_client()
                    .delete(full, Some(DeleteOptions::new().with_prev_key()))
                    .await
                    .map_err(failed("force-releasing"))?;
                let Some(seen) = deleted.prev_kvs().first().map(seen) else {
                    return Ok(false);
                };
                if let Some(owner) = seen.owner {
                    lock(&self.held).map.remove(&owner.as_u128());
                }
                if seen.lease != 0 {
                    // The holder's next renewal then fails at once.
                    if let Err(e) = self.revoke(seen.lease).await {
                        tracing::debug!(error = %e, "revoking a force-released lock's lease");
                    }
                }
                Ok(true)
            })
            .await?;
        self.notices.notify(key);
        Ok(removed)
    }
}

/// Runs `op`, an operation that may grant `key` to `owner`, in place, and finishes it on a
/// task of its own if the caller gives up mid-flight: it cannot be cut off half-way (a
/// transaction etcd may still apply after a release sent meanwhile), and a grant nobody
/// waits for any more is released there, after it happened.
async fn detached<F, Fut>(
    shared: &Arc<Shared>,
    key: Arc<str>,
    owner: Owner,
    op: F,
) -> Result<Attempt>
where
    F: FnOnce(Arc<Shared>) -> Fut,
    Fut: Future<Output = Result<Attempt>> + Send + 'static,
{
    let (member, _) = shared.members.pick();
    let mut run = Detached {
        op: Some(Box::pin(op(shared.clone()))),
        shared: shared.clone(),
        key,
        owner,
    };
    let result = std::future::poll_fn(|cx| run.poll_op(cx)).await;
    shared.members.note(member, result)
}

/// An operation run in place by [`detached`]; finished on a task of its own when dropped
/// before it completed.
struct Detached {
    op: Option<Pin<Box<dyn Future<Output = Result<Attempt>> + Send>>>,
    shared: Arc<Shared>,
    key: Arc<str>,
    owner: Owner,
}

impl Detached {
    fn poll_op(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<Attempt>> {
        let Some(op) = self.op.as_mut() else {
            return std::task::Poll::Ready(Err(Error::backend(NAME, "polled after completion")));
        };
        let result = std::task::ready!(op.as_mut().poll(cx));
        self.op = None;
        std::task::Poll::Ready(result)
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        let Some(op) = self.op.take() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to finish on: whatever it was granted expires at its TTL.
            return;
        };
        let (shared, key, owner) = (self.shared.clone(), self.key.clone(), self.owner);
        runtime.spawn(async move {
            if let Ok(Attempt::Granted { fence, valid_until }) = op.await {
                let lease = Lease::new(key, owner, fence, valid_until);
                let _ = shared.release(&lease).await;
            }
        });
    }
}

fn acquire_txn(full: &str, value: &str, lease: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(full, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            full,
            value,
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(full, None)])
}

/// An acquire transaction's error: a lease that ran out before the transaction reached
/// etcd (a slow network) is transient like a timeout, not a refusal.
fn acquire_failed(e: etcd_client::Error) -> Error {
    if is_lease_not_found(&e) {
        Error::unavailable(NAME, LEASE_RAN_OUT)
    } else {
        failed("acquiring")(e)
    }
}

const LEASE_RAN_OUT: &str = "the lease ran out before the request reached etcd";

/// A lock key's value: the owner token, followed by `:` and the fence once the key was
/// moved to a new lease (that put changed the key's `mod_revision`, which is otherwise the
/// fence: the revision of the creation or of the hand-over that made this owner hold it).
fn stored_value(owner: Owner, value_fence: Option<u64>) -> String {
    match value_fence {
        None => owner.to_string(),
        Some(fence) => format!("{owner}:{fence}"),
    }
}

fn seen(kv: &KeyValue) -> Seen {
    let value = std::str::from_utf8(kv.value()).unwrap_or("");
    let (owner, fence) = match value.split_once(':') {
        Some((owner, fence)) => (owner, fence.parse().ok()),
        None => (value, None),
    };
    Seen {
        owner: Owner::parse(owner),
        lease: kv.lease(),
        fence: fence.unwrap_or_else(|| kv.mod_revision()),
    }
}

/// The current holder, read by the refused acquire transaction.
fn holder_in(response: &TxnResponse) -> Option<Seen> {
    response.op_responses().iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => get.kvs().first().map(seen),
        _ => None,
    })
}

/// A random lease id in `1..=i64::MAX`: chosen here rather than by etcd, so that an attempt
/// knows which lease to revoke even when the grant's answer never arrives.
fn new_lease_id() -> i64 {
    let bits = (Owner::random().as_u128() as u64) >> 1;
    i64::try_from(bits.max(1)).unwrap_or(1)
}
