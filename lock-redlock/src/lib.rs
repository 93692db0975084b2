//! # lock-redlock
//!
//! The Redlock backend of distlock: one lock over N independent Redis nodes (no replication
//! between them), granted when a majority of them grant it, with an allowance for the drift
//! between the nodes' clocks and ours. It composes lock-redis's single-node protocol
//! ([`RedisNode`]); the scripts, key layout and release channel are those of lock-redis, so a
//! one-node Redlock and a `redis://` backend on the same server exclude each other.
//!
//! ```no_run
//! # async fn demo() -> lock_core::Result<()> {
//! use lock_core::{LockOptions, Locker};
//! use lock_redlock::RedlockBackend;
//!
//! let url = lock_core::LockUrl::parse("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379")?;
//! let locker = Locker::new(RedlockBackend::connect(&url).await?);
//! let guard = locker.acquire("jobs/nightly", &LockOptions::new()).await?;
//! println!("fencing token {}", guard.fence());
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! ## The algorithm
//!
//! With N nodes the quorum is `N / 2 + 1` (any N ≥ 1; odd N tolerate the most failures per
//! node). Every operation is sent to every node at once, each request bounded by a per-node
//! timeout much smaller than the TTL (`TTL / 10` between 5 ms and 50 ms unless configured),
//! and ends as soon as its outcome is decided: a quorum answered yes, or enough nodes
//! answered no or failed that it can no longer be reached. A dead or paused node therefore
//! never delays an operation that a majority can decide.
//!
//! - **Acquire.** The instant `start` is taken before the first request. The attempt is
//!   granted only when a quorum granted it and the *validity* is still positive:
//!   `validity = TTL − elapsed − (TTL × drift + 2 ms)`, where `elapsed` is measured on the
//!   monotonic clock from `start` to the moment the quorum was reached. The grant's
//!   `valid_until` is that moment plus the validity, i.e. `start + TTL − (TTL × drift + 2 ms)`:
//!   every node set its key after `start`, so none expires it before then, even with a clock
//!   running `drift` faster than ours (and 2 ms for Redis's expiry precision). Otherwise the
//!   attempt is abandoned: released on every node that may hold it (those that granted
//!   before the attempt returns; those that failed or did not answer yet in the background,
//!   sent behind their pending request on the same connection).
//! - **Extend** goes to every node and succeeds only when a quorum extended it before the
//!   lease's current validity passed; the new `valid_until` is computed as for a grant. A
//!   majority answering "not ours" is [`Error::NotHeld`].
//! - **Release** goes to every node (it deletes wherever the lock is still ours, also after
//!   the call returned) and is `Ok` when a quorum still held it, [`Error::NotHeld`] when a
//!   majority did not.
//! - **Waiting.** Releases are announced on every node's release channel; the backend
//!   subscribes to all of them (one connection per node, started by the first waiter) and
//!   wakes the waiters of a key at the first notice. A release through this backend wakes
//!   its own waiters as soon as its requests are on the node connections (their attempts
//!   follow on the same connections, so each node sees the release first). A refused
//!   attempt also says when enough holders' keys expire for a quorum to become free.
//!
//! ## Outcomes of an attempt
//!
//! - [`Attempt::Granted`]: a quorum granted, the validity is positive, and (with fencing)
//!   the token was written back.
//! - [`Attempt::Taken`]: enough nodes answered "held by another owner" that no quorum was
//!   possible, with the time until enough of those keys expire for a quorum to be free.
//!   When this attempt itself won some nodes, contenders may have split the nodes between
//!   them (their keys go away at once), so there is no expiry hint: the
//!   [`Locker`](lock_core::Locker) retries after its jittered backoff or at the first
//!   release notice, which desynchronises contenders as the Redlock description recommends.
//! - [`Error::QuorumNotReached`] (transient: the [`Locker`](lock_core::Locker) retries
//!   until its deadline): too many nodes failed or timed out, or the fence write-back
//!   missed a majority. The errors of the failed nodes are in `node_errors`, each naming
//!   its node.
//! - [`Error::Unavailable`] (transient): a quorum granted, but too late to leave a positive
//!   validity (slow nodes, or a pause of this process); the attempt was released.
//! - A non-transient node error (wrong password, not a Redis server) on so many nodes that
//!   no quorum is possible is returned as is, so that waiting does not hide a
//!   misconfiguration.
//! - [`Error::InvalidTtl`] when the TTL is too short to leave any validity after the drift
//!   allowance (`TTL × drift + 2 ms ≥ TTL`), before any request.
//!
//! ## Fencing tokens
//!
//! Each node issues its own token by lock-redis's rule, `max(counter + 1, node TIME in µs)`,
//! written back to that node's counter. The largest token of a quorum is not monotonic by
//! itself: two majorities can differ in their largest node. So, by default, a grant raises
//! the fence counter of the key to its token on a majority of the nodes that granted it
//! before the guard is returned ([`RedisNode::raise_fence`]; the nodes that issued the
//! winning token already have it). Any later quorum shares a node with that majority, and
//! that node's next token is greater, so tokens strictly increase across holders of a key.
//! This costs one more round trip; it can be turned off (`fencing=false`,
//! [`RedlockBuilder::fencing`]) and [`Capabilities::monotonic_fencing`] says which is in
//! force.
//!
//! What the tokens promise, precisely. A token `F` granted at (real) time `t` is carried by
//! the counters of a majority, each kept for the TTL plus
//! [`FENCE_RETENTION`](lock_redis::FENCE_RETENTION) (10 minutes) after it was written. A
//! later grant's token is greater than `F`:
//!
//! - while one node of its quorum still has a counter carrying `F` (at most TTL + 10 min
//!   after `t`, and only if that node did not lose it or restore an older one: a restart
//!   without persistence, from an RDB snapshot or AOF `everysec`); otherwise
//! - when the clock of one node of its quorum reads more than `F`, i.e. when that node's
//!   clock is not behind the clock that issued `F` (at `t`) by more than the time since
//!   `t`. Nodes with correct clocks always satisfy this.
//!
//! So tokens can go back only when node clocks disagree: a node whose clock runs ahead by
//! `s` issues tokens that a later quorum without it and without a live counter (more than
//! TTL + 10 minutes later, or sooner after counters were lost or restored stale) may
//! undercut until `s` has passed. Keep node clocks synchronised (NTP) well within 10
//! minutes; a counter lost on every node of a quorum is covered by the clocks alone.
//! Tokens stay below 2^53.
//!
//! ## Safety: restarts, persistence and clocks
//!
//! Redlock's safety rests on each node keeping a key until it expires. **A node restarted
//! without persistence comes back empty**: if it was one of the bare majority holding a
//! lock, another client can win a majority with it while the first still holds the lock —
//! two holders. As the Redlock description says, run the nodes either
//!
//! - with persistence that survives a crash (`appendonly yes` with `appendfsync always`),
//!   or
//! - with *delayed restarts*: keep a crashed node out of service for at least the longest
//!   TTL in use before it answers again. A holder that needed the node for its majority
//!   cannot renew without it, so by then its keys on the other nodes have expired and its
//!   guard has reported the loss.
//!
//! This crate cannot detect a restart; it relies on one of those two rules. It also
//! assumes the nodes' clocks do not run faster than ours by more than the drift factor
//! (a clock *jump* on a node, e.g. by NTP stepping, breaks it) and that this process is
//! not paused for longer than its remaining validity without noticing: a holder must
//! check [`LockGuard::lost`](lock_core::LockGuard::lost), and protected resources should
//! check fencing tokens.
//!
//! Requests cut short when an operation was decided without them are still delivered; a
//! node that answers very late (paused, then resumed) may then set a key for an owner
//! that already gave up. Requests that failed (timed out: their connection is discarded,
//! and a release on a new one could overtake them) are abandoned with a tombstone
//! ([`RedisNode::abandon`], [`Backend::abandon`] for the Locker's clean-ups), which
//! refuses them should they still arrive within
//! [`ABANDON_RETENTION`](lock_redis::ABANDON_RETENTION); requests merely unanswered when
//! the attempt was decided are released behind them on the same connection. Any key left
//! over expires at its TTL and never counts for anyone else.
//!
//! ## Configuration
//!
//! `redlock://[user[:password]@]h1[:p1],h2[:p2],…[/db][?drift=…&prefix=…&timeout=…&fencing=…]`
//! or the typed [`RedlockBuilder`] from [`RedlockBackend::builder`]:
//!
//! - `drift`: clock-drift factor in `[0, 1)`, default `0.01`;
//! - `prefix`: namespace of keys and release channels, default `distlock:`;
//! - `timeout`: a fixed per-node timeout (`20ms`), default derived from each TTL;
//! - `fencing`: `true` (default) or `false`.
//!
//! Any other parameter, a node listed twice, or a bad value is [`Error::InvalidUrl`].
//! Every node gets the same credentials, database and prefix. `Debug` of every type here
//! hides the password. Building contacts every node; it succeeds when a majority
//! answered, and a node that was down is reconnected in the background.
//!
//! ## Capabilities
//!
//! Name `redlock`; TTLs from [`MIN_TTL`] (100 ms) to 30 days in 1 ms steps. The minimum
//! keeps a useful validity in the worst case the defaults allow: an attempt whose quorum
//! needs a node answering at the per-node timeout (10 ms at 100 ms TTL), then a write-back
//! at the timeout again, loses 20 ms plus the 3 ms drift allowance, leaving 77 ms, more
//! than two renewal periods of the watchdog (`TTL / 3`). Monotonic fencing as configured;
//! release notices; cross-process exclusion.
#![deny(missing_docs)]

mod config;
mod fanout;
mod member;

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::{
    Attempt, Backend, Capabilities, Error, Holder, Lease, LockUrl, Owner, ReleaseListener,
    ReleaseNotices, Result,
};
pub use lock_redis::RedisNode;

pub use config::{RedlockBuilder, DEFAULT_CONNECT_TIMEOUT, DEFAULT_DRIFT_FACTOR, URL_PARAMS};
use fanout::Fanout;
use member::Member;

/// The name errors carry.
pub(crate) const BACKEND: &str = "redlock";

/// The shortest TTL (shorter ones are rounded up); see the crate documentation.
pub const MIN_TTL: Duration = Duration::from_millis(100);
/// The default per-node timeout is `TTL / 10`, at least this.
pub const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(5);
/// The default per-node timeout is `TTL / 10`, at most this.
pub const MAX_NODE_TIMEOUT: Duration = Duration::from_millis(50);
/// The default per-node timeout of requests without a TTL (release, inspect,
/// force-release). Nothing waits on them for its validity, and a release returns as soon as
/// a majority decided it, so this only bounds how long an undecided one waits for slow nodes.
pub const UNTIMED_NODE_TIMEOUT: Duration = Duration::from_millis(500);
/// Added to the drift allowance: Redis expires keys with about a millisecond of precision.
pub const EXPIRY_PRECISION: Duration = Duration::from_millis(2);

/// The quorum of `nodes` nodes: a strict majority, `nodes / 2 + 1`.
pub fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// Locks on N independent Redis nodes by the Redlock algorithm (see the crate
/// documentation for the rules it keeps).
///
/// Build it with [`RedlockBackend::connect`] from a `redlock://` URL or
/// [`RedlockBackend::builder`], then hand it to a [`Locker`](lock_core::Locker). `Debug`
/// hides the password.
pub struct RedlockBackend {
    members: Vec<Arc<Member>>,
    quorum: usize,
    drift_factor: f64,
    node_timeout: Option<Duration>,
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
            .field("quorum", &self.quorum)
            .field("nodes", &self.members)
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
                node_errors: errors,
            });
        }
        for e in &errors {
            tracing::warn!(error = %e, "redlock node down at start; reconnecting in the background");
        }
        let fencing = config.is_fencing();
        Ok(RedlockBackend {
            quorum,
            drift_factor: config.drift(),
            node_timeout: config.fixed_node_timeout(),
            fencing,
            caps: Capabilities {
                name: BACKEND,
                min_ttl: MIN_TTL,
                ttl_granularity: Duration::from_millis(1),
                max_ttl: lock_redis::CAPABILITIES.max_ttl,
                monotonic_fencing: fencing,
                release_notices: true,
                cross_process: true,
                hand_over: false,
                clock_drift: lock_core::ClockDrift {
                    per_million: (config.drift() * 1e6).ceil() as u32,
                    fixed: EXPIRY_PRECISION,
                },
            },
            members,
            notices: Arc::new(ReleaseNotices::new()),
            all_watching: AtomicBool::new(false),
            config,
        })
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Always false: a Redlock has at least one node.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Nodes needed for a majority.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// Node `i` (in configuration order) when it is connected; `None` while it is down
    /// since the start, or when `i` is out of range.
    pub fn node(&self, i: usize) -> Option<RedisNode> {
        let member = self.members.get(i)?;
        member.node(self.timeout_for(None)).ok()
    }

    /// The nodes' addresses, in configuration order.
    pub fn node_addrs(&self) -> Vec<&str> {
        self.members.iter().map(|m| m.addr.as_str()).collect()
    }

    /// The configuration this backend was built from.
    pub fn config(&self) -> &RedlockBuilder {
        &self.config
    }

    /// The bound on each node's answer to a request with `ttl` (`None`: release, inspect,
    /// force-release): the configured timeout, or `TTL / 10` between
    /// [`MIN_NODE_TIMEOUT`] and [`MAX_NODE_TIMEOUT`] (without a TTL,
    /// [`UNTIMED_NODE_TIMEOUT`]).
    pub fn timeout_for(&self, ttl: Option<Duration>) -> Duration {
        match (self.node_timeout, ttl) {
            (Some(fixed), _) => fixed,
            (None, Some(ttl)) => (ttl / 10).clamp(MIN_NODE_TIMEOUT, MAX_NODE_TIMEOUT),
            (None, None) => UNTIMED_NODE_TIMEOUT,
        }
    }

    /// The part of `ttl` set aside for clock drift: `ttl × drift + 2 ms`. A grant is valid
    /// until `start + ttl − drift_allowance(ttl)` (see the crate documentation).
    pub fn drift_allowance(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + EXPIRY_PRECISION
    }

    /// `ttl − drift_allowance(ttl)`, or `InvalidTtl` when nothing is left.
    fn usable(&self, ttl: Duration) -> Result<Duration> {
        let allowance = self.drift_allowance(ttl);
        ttl.checked_sub(allowance)
            .filter(|left| !left.is_zero())
            .ok_or_else(|| Error::InvalidTtl {
                ttl,
                backend: BACKEND,
                reason: format!(
                    "the clock-drift allowance {allowance:?} (TTL × {} + {EXPIRY_PRECISION:?}) \
                     leaves no validity",
                    self.drift_factor
                ),
            })
    }

    /// Sends `op` to the nodes `targets` at once, each bounded by `timeout`; a node that is
    /// not connected answers with its error at once.
    fn fan_out<T, F, Fut>(
        &self,
        targets: impl IntoIterator<Item = usize>,
        timeout: Duration,
        op: F,
    ) -> Fanout<T>
    where
        F: Fn(RedisNode) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        Fanout::new(
            targets
                .into_iter()
                .map(|i| {
                    let request: std::pin::Pin<Box<dyn Future<Output = Result<T>> + Send>> =
                        match self.members[i].node(timeout) {
                            Ok(node) => Box::pin(op(node)),
                            Err(e) => Box::pin(std::future::ready(Err(e))),
                        };
                    (i, request)
                })
                .collect(),
        )
    }

    /// Cleans up after an attempt of `owner` that was not granted, on every node that may
    /// hold it: `now` (those that granted) released before returning; `failed` (an error,
    /// e.g. a timeout that discarded the node's connection, so a release could overtake
    /// the attempt) abandoned with a tombstone ([`RedisNode::abandon`]) in the background;
    /// `unanswered` (still on their way on a live connection) released in the background,
    /// queued behind the attempt on the same connection.
    async fn give_up(
        &self,
        key: &Arc<str>,
        owner: Owner,
        timeout: Duration,
        now: Vec<usize>,
        failed: Vec<usize>,
        unanswered: Vec<usize>,
    ) {
        let release = |node: RedisNode| {
            let key = key.clone();
            async move { node.release(&key, owner).await }
        };
        let abandon = |node: RedisNode| {
            let key = key.clone();
            async move { node.abandon(&key, owner).await }
        };
        // No local notice for these: the keys never blocked a quorum, and a notice would wake
        // this very attempt's waiter at once.
        self.fan_out(unanswered, timeout, release)
            .finish_in_background(|_, _| {});
        self.fan_out(failed, self.timeout_for(None), abandon)
            .finish_in_background(|_, _| {});
        let mut replies = self.fan_out(now, timeout, release);
        while let Some((i, reply)) = replies.next().await {
            if let Err(e) = reply {
                tracing::debug!(node = self.members[i].addr, error = %e, "release of an abandoned attempt failed; the key expires at its TTL");
            }
        }
    }

    /// Raises the key's fence counter to `fence` on enough granted nodes that a majority
    /// has it (the nodes that issued `fence` have it already).
    async fn write_back(
        &self,
        key: &Arc<str>,
        fence: u64,
        ttl: Duration,
        granted: &[(usize, u64)],
        valid_until: Instant,
    ) -> Result<()> {
        let have = granted.iter().filter(|(_, f)| *f == fence).count();
        let need = self.quorum.saturating_sub(have);
        if need == 0 {
            return Ok(());
        }
        let targets: Vec<usize> = granted
            .iter()
            .filter(|(_, f)| *f < fence)
            .map(|(i, _)| *i)
            .collect();
        let left = valid_until.saturating_duration_since(Instant::now());
        let timeout = self.timeout_for(Some(ttl)).min(left);
        let mut replies = self.fan_out(targets.iter().copied(), timeout, |node| {
            let key = key.clone();
            async move { node.raise_fence(&key, fence, ttl).await }
        });
        let (mut raised, mut failed) = (0, Vec::new());
        while let Some((_, reply)) = replies.next().await {
            match reply {
                Ok(_) => raised += 1,
                Err(e) => failed.push(e),
            }
            if raised >= need || failed.len() > targets.len() - need {
                break;
            }
        }
        if raised >= need {
            Ok(())
        } else {
            Err(Error::QuorumNotReached {
                granted: have + raised,
                needed: self.quorum,
                node_errors: failed,
            })
        }
    }

    /// Sends `op` to every node and waits for every answer: the answers of the nodes that
    /// answered and the number that failed, or the quorum error when fewer than a majority
    /// answered.
    async fn ask_all<T, F, Fut>(&self, op: F) -> Result<(Vec<T>, usize)>
    where
        F: Fn(RedisNode) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        let n = self.members.len();
        let replies = self.fan_out(0..n, self.timeout_for(None), op).all().await;
        let mut answers = Vec::with_capacity(n);
        let mut failed = Vec::new();
        for (i, reply) in replies {
            match reply {
                Ok(answer) => answers.push(answer),
                Err(e) => failed.push((i, e)),
            }
        }
        if answers.len() < self.quorum {
            return Err(self.quorum_error(answers.len(), failed));
        }
        Ok((answers, failed.len()))
    }

    /// The error of an operation that missed its quorum because nodes failed: the first
    /// non-transient error when those alone rule the quorum out, else `QuorumNotReached`.
    fn quorum_error(&self, granted: usize, failed: Vec<(usize, Error)>) -> Error {
        let mut errors: Vec<Error> = failed.into_iter().map(|(_, e)| e).collect();
        let fatal = errors.iter().filter(|e| !e.is_transient()).count();
        if fatal > self.members.len() - self.quorum {
            if let Some(i) = errors.iter().position(|e| !e.is_transient()) {
                return errors.swap_remove(i);
            }
        }
        Error::QuorumNotReached {
            granted,
            needed: self.quorum,
            node_errors: errors,
        }
    }

    /// When a refused attempt may succeed without a release notice: when enough of the
    /// holders' keys have expired for a quorum of nodes to be free, counting every node
    /// that did not answer "taken" as free. `None` when that needs a key without expiry.
    fn wake_hint(&self, taken: &mut [Option<Duration>]) -> Option<Duration> {
        let free = self.members.len() - taken.len();
        let need = self.quorum.saturating_sub(free).max(1);
        // Soonest expiry first, keys without expiry last.
        taken.sort_unstable_by_key(|t| (t.is_none(), *t));
        taken.get(need - 1).copied().flatten()
    }
}

#[async_trait]
impl Backend for RedlockBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn try_acquire(&self, key: &str, owner: Owner, ttl: Duration) -> Result<Attempt> {
        let usable = self.usable(ttl)?;
        let (n, q) = (self.members.len(), self.quorum);
        let key: Arc<str> = Arc::from(key);
        let start = Instant::now();
        let valid_until = start + usable;
        let timeout = self.timeout_for(Some(ttl));
        let mut replies = self.fan_out(0..n, timeout, |node| {
            let key = key.clone();
            async move { node.try_acquire(&key, owner, ttl).await }
        });
        let mut granted: Vec<(usize, u64)> = Vec::with_capacity(n);
        let mut taken: Vec<(usize, Option<Duration>)> = Vec::new();
        let mut failed: Vec<(usize, Error)> = Vec::new();
        while let Some((i, reply)) = replies.next().await {
            match reply {
                Ok(Attempt::Granted { fence, .. }) => granted.push((i, fence)),
                Ok(Attempt::Taken { expires_in }) => taken.push((i, expires_in)),
                Err(e) => failed.push((i, e)),
            }
            if granted.len() >= q || taken.len() + failed.len() > n - q {
                break;
            }
        }
        // Requests still in flight were handed to their connections: dropping their futures
        // does not recall them (a late grant is cleaned up by `give_up` or by our release).
        drop(replies);

        let mut failure = None;
        if granted.len() >= q {
            let reached = Instant::now();
            if reached < valid_until {
                let fence = granted.iter().map(|(_, f)| *f).max().unwrap_or(0);
                let written = if self.fencing {
                    self.write_back(&key, fence, ttl, &granted, valid_until)
                        .await
                } else {
                    Ok(())
                };
                match written {
                    Ok(()) if Instant::now() < valid_until => {
                        return Ok(Attempt::Granted { fence, valid_until });
                    }
                    Ok(()) => failure = Some(validity_passed(start, ttl, usable)),
                    Err(e) => failure = Some(e),
                }
            } else {
                failure = Some(validity_passed(start, ttl, usable));
            }
        }

        // Not granted: nodes that answered "taken" hold nothing of ours; every other node may
        // (a failed request may have been applied, an unanswered one may still be).
        let now: Vec<usize> = granted.iter().map(|(i, _)| *i).collect();
        let errored: Vec<usize> = failed.iter().map(|(i, _)| *i).collect();
        let unanswered: Vec<usize> = (0..n)
            .filter(|i| {
                !now.contains(i) && !errored.contains(i) && !taken.iter().any(|(t, _)| t == i)
            })
            .collect();
        self.give_up(&key, owner, timeout, now, errored, unanswered)
            .await;

        if let Some(e) = failure {
            return Err(e);
        }
        if taken.len() > n - q {
            // Winning some nodes means contenders may have split the nodes between them, and
            // their keys go away at once: no expiry hint, so the Locker retries after its
            // jittered backoff (contenders desynchronise) or at the first release notice.
            let expires_in = if granted.is_empty() {
                self.wake_hint(&mut taken.into_iter().map(|(_, e)| e).collect::<Vec<_>>())
            } else {
                None
            };
            return Ok(Attempt::Taken { expires_in });
        }
        Err(self.quorum_error(granted.len(), failed))
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Instant> {
        let usable = self.usable(ttl)?;
        let (n, q) = (self.members.len(), self.quorum);
        let start = Instant::now();
        let current = lease.valid_until();
        if start >= current {
            return Err(lease.not_held());
        }
        let key = lease.key_arc().clone();
        let owner = lease.owner();
        let timeout = self.timeout_for(Some(ttl)).min(current - start);
        let mut replies = self.fan_out(0..n, timeout, |node| {
            let key = key.clone();
            async move { node.extend(&key, owner, ttl).await }
        });
        let (mut extended, mut refused, mut failed) = (0, 0, Vec::new());
        while let Some((i, reply)) = replies.next().await {
            match reply {
                Ok(Some(_)) => extended += 1,
                Ok(None) => refused += 1,
                Err(e) => failed.push((i, e)),
            }
            // As for release: a refusal by a majority is NotHeld (the guard is lost at once),
            // anything less certain is transient (the watchdog retries within the validity).
            if extended >= q || refused > n - q {
                break;
            }
        }
        if extended >= q {
            let now = Instant::now();
            let valid_until = start + usable;
            // A quorum that answered after the lease's validity cannot vouch for the gap.
            return if now < current && now < valid_until {
                Ok(valid_until)
            } else {
                Err(lease.not_held())
            };
        }
        if refused > n - q {
            return Err(lease.not_held());
        }
        Err(self.quorum_error(extended, failed))
    }

    async fn release(&self, lease: &Lease) -> Result<()> {
        let (n, q) = (self.members.len(), self.quorum);
        let key = lease.key_arc().clone();
        let owner = lease.owner();
        let mut replies = self.fan_out(0..n, self.timeout_for(None), |node| {
            let key = key.clone();
            async move { node.release(&key, owner).await }
        });
        // Hand the requests to the node connections, then wake the local waiters at once:
        // their attempts usually go out on the same connections behind the releases, so
        // every node sees the release first, and a hand-off inside a process saves a round
        // trip. (A notice that turns out early only costs the waiter one refused attempt;
        // the notice after the quorum wakes it again.)
        let early = replies.ready();
        self.notices.notify(&key);
        let mut tally = Tally::default();
        for (i, reply) in early {
            tally.add(i, reply);
        }
        // Decided: held by a quorum, or not ours on a majority. Otherwise wait for every
        // answer, to tell "not held" from "nodes unreachable".
        while tally.yes < q && tally.no <= n - q {
            let Some((i, reply)) = replies.next().await else {
                break;
            };
            tally.add(i, reply);
        }
        for (i, reply) in replies.ready() {
            tally.add(i, reply);
        }
        // The early notice may have come before a release reached its connection (a node
        // whose releases were queued for a group): a waiter that attempted at once was
        // refused and listens again, so tell it once more now that a quorum released.
        if tally.yes >= q {
            self.notices.notify(&key);
        }
        // The rest finish in the background, so that the lock is deleted wherever it is still
        // ours; without a quorum yet, each late release announces itself.
        let notify_late = tally.yes < q;
        let (notices, name) = (self.notices.clone(), key.clone());
        replies.finish_in_background(move |_, reply| {
            if notify_late && matches!(reply, Ok(true)) {
                notices.notify(&name);
            }
        });
        let Tally {
            yes: released,
            no: refused,
            failed,
        } = tally;
        if released >= q {
            Ok(())
        } else if refused > n - q {
            Err(lease.not_held())
        } else {
            Err(self.quorum_error(released, failed))
        }
    }

    /// Abandons the attempt on every node ([`RedisNode::abandon`]: a tombstone refuses it
    /// should it still arrive, a grant it got already is deleted), waiting for every answer
    /// within the untimed per-node timeout. `Ok` when a majority answered: the leftover of
    /// the attempt on a minority never counts for anyone and expires at its TTL. Otherwise
    /// the quorum error.
    async fn abandon(&self, key: &str, owner: Owner) -> Result<()> {
        let name: Arc<str> = Arc::from(key);
        let (deleted, _) = self
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
            for member in &self.members {
                all &= member.ensure_watch(&self.notices);
            }
            if all {
                self.all_watching.store(true, Ordering::Relaxed);
            }
        }
        Some(listener)
    }

    /// The owner whose key is on a majority of the nodes (counting nodes that did not answer
    /// as possibly holding it), `None` when there is none: keys on a minority are leftovers
    /// of failed attempts and expire at their TTL. Fails with `QuorumNotReached` when fewer
    /// than a majority answered. Its `fence` is known when fencing is on and a majority of
    /// the answering nodes agree on it (the write-back makes them); `expires_in` is when
    /// fewer than a quorum of its keys will be left.
    async fn inspect(&self, key: &str) -> Result<Option<Holder>> {
        let q = self.quorum;
        let name: Arc<str> = Arc::from(key);
        let (answers, unknown) = self
            .ask_all(|node| {
                let name = name.clone();
                async move { node.inspect(&name).await }
            })
            .await?;
        let holders: Vec<Holder> = answers.into_iter().flatten().collect();
        // The holder is the owner whose key is (or, counting the nodes that did not answer,
        // may be) on a majority; a key on a minority is a leftover that expires by itself.
        let mut best: Option<(usize, Holder)> = None;
        for candidate in &holders {
            let same: Vec<&Holder> = holders
                .iter()
                .filter(|h| h.owner == candidate.owner)
                .collect();
            let count = same.len();
            if count + unknown < q || best.as_ref().is_some_and(|(c, _)| *c >= count) {
                continue;
            }
            let mut expiries: Vec<Option<Duration>> = same.iter().map(|h| h.expires_in).collect();
            // Longest first, `None` (no expiry) longest of all: a quorum holds it until the
            // q-th longest expires (with fewer keys seen, until the shortest does).
            expiries.sort_unstable_by_key(|e| std::cmp::Reverse((e.is_none(), *e)));
            // With the write-back a majority of the holder's nodes carry exactly its token (late
            // grants and nodes not raised carry others), so a value on a quorum of the answers
            // is the token. Without the write-back, or with too few answers, it is unknown.
            let fence = if self.fencing {
                same.iter()
                    .filter_map(|h| h.fence)
                    .find(|f| same.iter().filter(|h| h.fence == Some(*f)).count() >= q)
            } else {
                None
            };
            best = Some((
                count,
                Holder {
                    owner: candidate.owner,
                    fence,
                    expires_in: expiries[q.min(count) - 1],
                },
            ));
        }
        Ok(best.map(|(_, holder)| holder))
    }

    /// Deletes the key on every node that answers, whoever holds it, and wakes the local
    /// waiters (the nodes announce it to other processes); true when any node had a lock.
    /// Fails with `QuorumNotReached` when fewer than a majority answered, since the holder
    /// may then still hold it.
    async fn force_release(&self, key: &str) -> Result<bool> {
        let name: Arc<str> = Arc::from(key);
        let answers = self
            .ask_all(|node| {
                let name = name.clone();
                async move { node.force_release(&name).await }
            })
            .await;
        self.notices.notify(key);
        Ok(answers?.0.contains(&true))
    }
}

/// Answers of the nodes to a yes/no request.
#[derive(Default)]
struct Tally {
    yes: usize,
    no: usize,
    failed: Vec<(usize, Error)>,
}

impl Tally {
    fn add(&mut self, i: usize, reply: Result<bool>) {
        match reply {
            Ok(true) => self.yes += 1,
            Ok(false) => self.no += 1,
            Err(e) => self.failed.push((i, e)),
        }
    }
}

/// A quorum that granted too late to leave any validity.
fn validity_passed(start: Instant, ttl: Duration, usable: Duration) -> Error {
    Error::unavailable(
        BACKEND,
        ValidityPassed {
            elapsed: start.elapsed(),
            ttl,
            usable,
        },
    )
}

/// The source of the error of an attempt whose quorum came after its validity passed.
#[derive(Debug)]
struct ValidityPassed {
    elapsed: Duration,
    ttl: Duration,
    usable: Duration,
}

impl std::fmt::Display for ValidityPassed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a quorum granted, but after {:?}: no validity left of the TTL {:?} \
             ({:?} after the clock-drift allowance); the attempt was released",
            self.elapsed, self.ttl, self.usable
        )
    }
}

impl std::error::Error for ValidityPassed {}
