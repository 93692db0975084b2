//! [`RedlockBackend`]: the [`Backend`] over N nodes, its configuration, capabilities and
//! clock-drift allowance; each operation's protocol is in its own module.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::{
    Admin, Attempt, Backend, Capabilities, Error, Holder, Lease, LockUrl, Owner, Permits,
    ReleaseListener, ReleaseNotices, Result, Ttl,
};
#[cfg(feature = "internals")]
use lock_redis::RedisNode;

use crate::config::RedlockBuilder;
use crate::error::NAME;
use crate::member::Member;
use crate::nodes::Nodes;
use crate::quorum::quorum;
use crate::{acquire, extend, inspect, release};

/// The shortest TTL (shorter ones are rounded up); see the crate documentation.
pub const MIN_TTL: Duration = Duration::from_millis(100);
/// Added to the drift allowance: Redis expires keys with about a millisecond of precision.
pub const EXPIRY_PRECISION: Duration = Duration::from_millis(2);

/// Why Redlock refuses claims of several permits (semaphores, reader-writer locks): each
/// node would count the permits granted through it, but the majorities that grant differ,
/// so the holders are not bounded by any one count. With 3 nodes and 2 permits, holders
/// granted on nodes {1,2}, {2,3} and {1,3} are three, while each node counts two.
pub const PERMITS_REFUSAL: &str = "claims of several permits on a key (semaphores, \
     reader-writer locks): the majorities of independent nodes overlap, so no node's count \
     bounds the holders (3 nodes, 2 permits: holders granted on nodes {1,2}, {2,3} and \
     {1,3} are three while each node counts two)";

/// Locks on N independent Redis nodes by the Redlock algorithm (see the crate
/// documentation for the rules it keeps).
///
/// Build it with [`RedlockBackend::connect`] from a `redlock://` URL or
/// [`RedlockBackend::builder`], then hand it to a [`Locker`](lock_core::Locker). `Debug`
/// hides the password.
///
#[doc = include_str!("design.md")]
pub struct RedlockBackend {
    pub(crate) nodes: Nodes,
    drift_factor: f64,
    fencing: bool,
    caps: Capabilities,
    notices: Arc<ReleaseNotices>,
    /// Set once every node's release subscription runs, so `listen` skips the check.
    all_watching: AtomicBool,
    config: RedlockBuilder,
}

impl std::fmt::Debug for RedlockBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBackend")
            .field("url", &format_args!("{}", self.config.redacted()))
            .field("quorum", &self.nodes.quorum)
            .field("nodes", &self.nodes.members)
            .field("listened_keys", &self.notices.listened_keys())
            .finish()
    }
}

impl RedlockBackend {
    /// A builder for the nodes at `addrs` (`host` or `host:port` each); see
    /// [`RedlockBuilder`].
    pub fn builder<I, S>(addrs: I) -> RedlockBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedlockBuilder::new(addrs)
    }

    /// Connects to the nodes a `redlock://` URL names (this is what `distlock::connect`
    /// calls); see [`RedlockBuilder::build`].
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for another scheme, unknown parameters, bad values or a node
    /// listed twice; otherwise as [`RedlockBuilder::build`].
    pub async fn connect(url: &LockUrl) -> Result<RedlockBackend> {
        RedlockBuilder::from_url(url)?.build().await
    }

    pub(crate) async fn connect_with(config: RedlockBuilder) -> Result<RedlockBackend> {
        let members: Vec<Arc<Member>> = config
            .node_builders()
            .into_iter()
            .zip(config.addrs())
            .map(|(builder, addr)| Member::new(builder, addr.clone()))
            .collect();
        let quorum = quorum(members.len());
        let results = futures::future::join_all(members.iter().map(|m| m.connect())).await;
        let mut errors: Vec<Error> = results.into_iter().filter_map(|r| r.err()).collect();
        // A refused password or a port that is not Redis will not heal by waiting.
        if let Some(i) = errors.iter().position(|e| !e.is_transient()) {
            return Err(errors.swap_remove(i));
        }
        let connected = members.len() - errors.len();
        if connected < quorum {
            return Err(Error::QuorumNotReached {
                granted: connected,
                needed: quorum,
                node_errors: errors.into(),
            });
        }
        for e in &errors {
            tracing::warn!(error = %e.report(), "redlock node down at start; reconnecting in the background");
        }
        let fencing = config.is_fencing();
        Ok(RedlockBackend {
            drift_factor: config.get_drift_factor(),
            fencing,
            caps: Capabilities::new(NAME)
                .min_ttl(MIN_TTL)
                .ttl_granularity(Duration::from_millis(1))
                .max_ttl(lock_redis::CAPABILITIES.max_ttl)
                .monotonic_fencing(fencing)
                .release_notices(true)
                .cross_process(true)
                .clock_drift(lock_core::ClockDrift::new(
                    (config.get_drift_factor() * 1e6).ceil() as u32,
                    EXPIRY_PRECISION,
                ))
                .permits_refusal(PERMITS_REFUSAL),
            nodes: Nodes {
                members,
                quorum,
                node_timeout: config.get_node_timeout(),
            },
            notices: Arc::new(ReleaseNotices::new()),
            all_watching: AtomicBool::new(false),
            config,
        })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.members.len()
    }

    /// Always false: a Redlock has at least one node.
    pub fn is_empty(&self) -> bool {
        self.nodes.members.is_empty()
    }

    /// Nodes needed for a majority.
    pub fn quorum(&self) -> usize {
        self.nodes.quorum
    }

    /// Node `i` (in configuration order) when it is connected; `None` while it is down
    /// since the start, or when `i` is out of range. Unstable (feature `internals`).
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub fn node(&self, i: usize) -> Option<RedisNode> {
        let member = self.nodes.members.get(i)?;
        member.node(self.timeout_for(None)).ok()
    }

    /// The nodes' addresses, in configuration order.
    pub fn node_addrs(&self) -> Vec<&str> {
        self.nodes.members.iter().map(|m| m.addr.as_str()).collect()
    }

    /// The configuration this backend was built from.
    pub fn config(&self) -> &RedlockBuilder {
        &self.config
    }

    /// The bound on each node's answer to a request with `ttl` (`None`: release, inspect,
    /// force-release): the configured timeout, or `TTL / 10` between
    /// [`MIN_NODE_TIMEOUT`](crate::MIN_NODE_TIMEOUT) and
    /// [`MAX_NODE_TIMEOUT`](crate::MAX_NODE_TIMEOUT) (without a TTL,
    /// [`UNTIMED_NODE_TIMEOUT`](crate::UNTIMED_NODE_TIMEOUT)).
    pub fn timeout_for(&self, ttl: Option<Duration>) -> Duration {
        self.nodes.timeout_for(ttl)
    }

    /// The part of `ttl` set aside for clock drift: `ttl × drift + 2 ms`. A grant is valid
    /// until `start + ttl − drift_allowance(ttl)` (see the crate documentation).
    pub fn drift_allowance(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + EXPIRY_PRECISION
    }

    /// `ttl − drift_allowance(ttl)`: never zero, as [`Capabilities::effective_ttl`]
    /// refuses a TTL its drift allowance would use up.
    fn usable(&self, ttl: Ttl) -> Duration {
        ttl.get().saturating_sub(self.drift_allowance(ttl.get()))
    }
}

#[async_trait]
impl Backend for RedlockBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    // Locks only (`max_permits` 1, see `PERMITS_REFUSAL`): the Locker never sends another
    // claim.
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        _permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        let usable = self.usable(ttl);
        acquire::try_acquire(&self.nodes, key, owner, ttl, usable, self.fencing).await
    }

    async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        let usable = self.usable(ttl);
        extend::extend(&self.nodes, lease, ttl, usable).await
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        release::release(&self.nodes, &self.notices, lease).await
    }

    /// Abandons the attempt on every node (lock-redis's abandon: a tombstone refuses it
    /// should it still arrive, a grant it got already is deleted), waiting for every answer
    /// within the untimed per-node timeout. `Ok` when a majority answered: the leftover of
    /// the attempt on a minority never counts for anyone and expires at its TTL. Otherwise
    /// the quorum error.
    async fn abandon(&self, key: &str, owner: Owner) -> Result<()> {
        let name: Arc<str> = Arc::from(key);
        let (deleted, _) = self
            .nodes
            .ask_all(|node| {
                let name = name.clone();
                async move { node.abandon(&name, owner).await }
            })
            .await?;
        if deleted.contains(&true) {
            self.notices.notify(key);
        }
        Ok(())
    }

    fn listen(&self, key: &str) -> Option<ReleaseListener> {
        // Registered before the subscriptions start: their first `notify_all` covers the gap.
        let listener = self.notices.listen(key);
        if !self.all_watching.load(Ordering::Relaxed) {
            let mut all = true;
            for member in &self.nodes.members {
                all &= member.ensure_watch(&self.notices);
            }
            if all {
                self.all_watching.store(true, Ordering::Relaxed);
            }
        }
        Some(listener)
    }

    fn admin(&self) -> Option<&dyn Admin> {
        Some(self)
    }

    fn baseline(&self) -> Option<&dyn lock_core::Baseline> {
        Some(self)
    }

    /// Each node keeps the history as one Redis server does; appends need a majority,
    /// reads merge a majority's answers (see `records.rs`).
    fn run_records(&self) -> Option<&dyn lock_core::records::RunRecords> {
        Some(self)
    }
}

#[async_trait]
impl Admin for RedlockBackend {
    /// The owner whose key is on a majority of the nodes (counting nodes that did not answer
    /// as possibly holding it), `None` when there is none: keys on a minority are leftovers
    /// of failed attempts and expire at their TTL. Fails with `QuorumNotReached` when fewer
    /// than a majority answered. Its `fence` is known when fencing is on and a majority of
    /// the answering nodes agree on it (the write-back makes them); `expires_in` is when
    /// fewer than a quorum of its keys will be left.
    async fn inspect(&self, key: &str) -> Result<Vec<Holder>> {
        Ok(inspect::holder(&self.nodes, self.fencing, key)
            .await?
            .into_iter()
            .collect())
    }

    /// Deletes the key on every node that answers, whoever holds it, and wakes the local
    /// waiters (the nodes announce it to other processes); true when any node had a lock.
    /// Fails with `QuorumNotReached` when fewer than a majority answered, since the holder
    /// may then still hold it.
    async fn force_release(&self, key: &str) -> Result<bool> {
        let name: Arc<str> = Arc::from(key);
        let answers = self
            .nodes
            .ask_all(|node| {
                let name = name.clone();
                async move { node.force_release(&name).await }
            })
            .await;
        self.notices.notify(key);
        Ok(answers?.0.contains(&true))
    }
}

impl RedlockBuilder {
    /// Connects to every node and returns the backend.
    ///
    /// Every node is contacted in parallel, each within the connect timeout. The backend is
    /// returned once a majority answered; nodes that could not be reached are reconnected in
    /// the background and count as failed nodes until then.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`](lock_core::Error::InvalidUrl) for no node, a malformed or repeated address, a drift factor
    /// outside `[0, 1)` or a zero timeout; [`Error::Backend`](lock_core::Error::Backend) when a node refuses the
    /// credentials or the database, or does not speak the Redis protocol;
    /// [`Error::QuorumNotReached`](lock_core::Error::QuorumNotReached) when fewer than a majority of the nodes answered.
    pub async fn build(self) -> Result<RedlockBackend> {
        self.check(&self.redacted())?;
        RedlockBackend::connect_with(self).await
    }
}
