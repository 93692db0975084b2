//! One Redis server: the single-node lock protocol, [`RedisNode`].

use lock_core::sync::lock;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use lock_core::group::{GroupCommit, GroupKey, GroupSend};
use lock_core::{Attempt, Error, Holder, Owner, ReleaseNotices, Result};
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind,
    IntoConnectionInfo, RedisConnectionInfo, RedisError, ServerErrorKind, Value,
};

use crate::config::RedisBuilder;
use crate::scripts::{self, Script};
use crate::watch::ReleaseWatch;
use crate::CAPABILITIES;

/// The name errors carry.
pub(crate) const BACKEND: &str = "redis";

/// How long a fence counter lives beyond the TTL of the grant (or the Redlock write-back)
/// that last wrote it. While it lives, fences of the key increase whatever the server clock
/// does; afterwards the server clock orders them (see the crate documentation).
pub const FENCE_RETENTION: Duration = Duration::from_secs(600);

/// How long the tombstone of an abandoned attempt lives ([`RedisNode::abandon`]): an
/// attempt's request that reaches the server up to this long after its abandon is refused.
/// A request delayed longer (a server paused for more than this with the request in its
/// socket buffer) can still grant, and that lock then lives for its TTL. Ten minutes is
/// far longer than TCP keeps retransmitting to an unreachable peer by default, and each
/// tombstone is one small key, written only for attempts whose answer never came.
pub const ABANDON_RETENTION: Duration = Duration::from_secs(600);

/// The largest fence this protocol handles: Lua numbers are doubles, exact up to 2^53.
pub const MAX_FENCE: u64 = 1 << 53;

/// One Redis server and the single-node lock protocol on it: take, extend, release, inspect
/// a lock, and raise a key's fence counter. [`RedisBackend`](crate::RedisBackend) is a thin
/// [`Backend`](lock_core::Backend) over one node; Redlock composes several.
///
/// Each method is one atomic Lua script (sent as `EVALSHA`, falling back to `EVAL` when the
/// server's script cache is empty, e.g. after a restart), bounded by the node's
/// [`timeout`](Self::timeout), connecting included. A timeout or an I/O error is the
/// transient [`Error::Unavailable`]; a refusal the protocol cannot recover from (wrong
/// password, not a Redis server, an unexpected reply) is [`Error::Backend`].
///
/// All clones share one multiplexed connection, opened by
/// [`RedisBuilder::build_node`] and reopened by the next operation after it broke (server
/// restart, dropped connection, timeout). An operation that finds the shared connection
/// closed before its request went out reconnects and sends it once more.
///
/// # Keys
///
/// Lock `name` lives at `<prefix>{<name>}` with the owner token (32 hex digits) as value and
/// the TTL as expiry; its fence counter at `<prefix>{<name>}:fence`. The braces are a Redis
/// Cluster hash tag, so both keys share a slot, and no lock key can equal a counter key (lock
/// keys end with `}`). Releases are announced on the channel `<prefix>released:<db>` (see
/// [`watch_releases`](Self::watch_releases)).
#[derive(Clone)]
pub struct RedisNode {
    shared: Arc<Shared>,
    timeout: Duration,
}

struct Shared {
    config: RedisBuilder,
    addr: String,
    client: Client,
    channel: String,
    /// Prefix of this node's release notices, so its own watch can skip them.
    origin: String,
    link: Connector,
    /// Acquires and releases, grouped into one script call per kind under load.
    ops: Arc<GroupCommit<Ops>>,
}

impl fmt::Debug for RedisNode {
    /// The server's URL with the password hidden, and the timeout.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisNode")
            .field("url", &format_args!("{}", self.shared.config.redacted()))
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl RedisNode {
    /// Opens the command connection and checks the server with `PING`.
    pub(crate) async fn connect(config: RedisBuilder) -> Result<RedisNode> {
        #[cfg(feature = "tls")]
        if config.is_tls() {
            // rustls needs a process-wide crypto provider; keep one the application chose.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let host = config
            .host_port()
            .cloned()
            .ok_or_else(|| Error::invalid_url(&config.redacted(), "malformed address"))?;
        let addr = host.to_string();
        let connection_addr = if config.is_tls() {
            ConnectionAddr::TcpTls {
                host: host.host.clone(),
                port: host.port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.host.clone(), host.port)
        };
        let mut settings = RedisConnectionInfo::default().set_db(i64::from(config.database()));
        let (username, password) = config.credentials();
        if let Some(username) = username {
            settings = settings.set_username(username);
        }
        if let Some(password) = password {
            settings = settings.set_password(password);
        }
        let info: ConnectionInfo = connection_addr
            .into_connection_info()
            .map(|info| info.set_redis_settings(settings))
            .map_err(|e| Error::backend(BACKEND, e))?;
        let client = Client::open(info).map_err(|e| Error::backend(BACKEND, e))?;
        let timeout = config.operation_timeout();
        let channel = format!("{}released:{}", config.key_prefix(), config.database());
        let node = RedisNode {
            shared: Arc::new_cyclic(|me| Shared {
                link: Connector::new(client.clone()),
                addr,
                client,
                channel,
                origin: format!("{} ", Owner::random()),
                config,
                ops: GroupCommit::new(Ops(me.clone())),
            }),
            timeout,
        };
        node.ping().await?;
        Ok(node)
    }

    /// The operation timeout of this handle.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A handle on the same server and connection whose operations are bounded by
    /// `timeout` instead (zero is taken as 1 ms).
    pub fn with_timeout(&self, timeout: Duration) -> RedisNode {
        RedisNode {
            shared: self.shared.clone(),
            timeout: timeout.max(Duration::from_millis(1)),
        }
    }

    /// `host:port` of the server.
    pub fn addr(&self) -> &str {
        &self.shared.addr
    }

    /// The configuration this node was built from.
    pub fn config(&self) -> &RedisBuilder {
        &self.shared.config
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        self.shared.config.key_prefix()
    }

    /// The Redis key holding lock `name`: `<prefix>{<name>}`.
    pub fn lock_key(&self, name: &str) -> String {
        key(self.prefix(), name, "")
    }

    /// The Redis key holding the fence counter of lock `name`: `<prefix>{<name>}:fence`.
    pub fn fence_key(&self, name: &str) -> String {
        key(self.prefix(), name, ":fence")
    }

    /// The Redis key of the tombstone of `owner`'s abandoned attempt on lock `name`:
    /// `<prefix>{<name>}:x:<owner>` (the lock's hash tag; it cannot equal a lock key, which
    /// ends with `}`, nor a fence counter key, which ends with `:fence`).
    pub fn tombstone_key(&self, name: &str, owner: Owner) -> String {
        let mut key = key(self.prefix(), name, ":x:");
        key.push_str(std::str::from_utf8(&hex(owner)).unwrap_or_default());
        key
    }

    /// The pub/sub channel releases are announced on.
    pub fn release_channel(&self) -> &str {
        &self.shared.channel
    }

    /// Checks that the server answers `PING` with `PONG`.
    ///
    /// # Errors
    /// [`Error::Unavailable`] when unreachable or silent; [`Error::Backend`] when the
    /// credentials are refused or the peer does not speak the Redis protocol.
    pub async fn ping(&self) -> Result<()> {
        let reply = self.send(&redis::cmd("PING"), "PING").await?;
        match reply {
            Value::SimpleString(s) if s == "PONG" => Ok(()),
            other => Err(self.unexpected("PING", &other)),
        }
    }

    /// One attempt to take lock `name` for `owner` for `ttl` (rounded as [`CAPABILITIES`]
    /// say). Granted: the fencing token and a `valid_until` computed from the instant before
    /// the request was sent. Taken: the holder's remaining time (`None` when the key has no
    /// expiry, i.e. it was written by something other than this protocol).
    ///
    /// Asking again with the owner that already holds the lock grants it again with the
    /// same fence and a fresh TTL.
    ///
    /// A grant's fence is `max(counter + 1, server TIME in µs)`, written back to the
    /// key's counter. Fences of a key strictly increase from grant to grant while the
    /// counter lives, and otherwise (counter expired, lost, or restored STALE by an RDB
    /// snapshot, AOF `everysec` or an async replica) as long as the server clock did not
    /// go back below the time of the previous grants (see the crate documentation).
    ///
    /// # Errors
    /// [`Error::InvalidTtl`]; otherwise as [`ping`](Self::ping).
    pub async fn try_acquire(&self, name: &str, owner: Owner, ttl: Duration) -> Result<Attempt> {
        let ttl = CAPABILITIES.effective_ttl(ttl)?;
        let ttl_ms = millis(ttl);
        let started = Instant::now();
        let lock_key = self.lock_key(name);
        let op = AcquireOp {
            fence_key: self.fence_key(name),
            tombstone: self.tombstone_key(name, owner),
            owner: hex(owner),
            ttl_ms,
            retention: ttl_ms + millis(FENCE_RETENTION),
            timeout: self.timeout,
        };
        let reply = match self.grouped("acquire", lock_key, Op::Acquire(op)).await? {
            Out::Acquire(flag, value) => (flag, value),
            Out::Refused(message) => return Err(self.failure("acquire", Failure::Refused(message))),
            Out::Release(_) => return Err(self.failure("acquire", mismatched())),
        };
        self.attempt_reply("acquire", started + ttl, reply)
    }

    /// Passes lock `name` from `from` straight to `to` for `ttl`, with a new fence, if
    /// `from` still holds it: one script, the key never free in between. `Taken` when
    /// `from` no longer holds it (nothing changes then).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn hand_over(
        &self,
        name: &str,
        from: Owner,
        to: Owner,
        ttl: Duration,
    ) -> Result<Attempt> {
        let ttl = CAPABILITIES.effective_ttl(ttl)?;
        let ttl_ms = millis(ttl);
        let started = Instant::now();
        let (lock_key, fence_key) = (self.lock_key(name), self.fence_key(name));
        let tombstone = self.tombstone_key(name, to);
        let (from, to) = (hex(from), hex(to));
        let reply = self
            .eval(&scripts::HAND_OVER, "hand_over", |cmd| {
                cmd.arg(3)
                    .arg(&lock_key)
                    .arg(&fence_key)
                    .arg(&tombstone)
                    .arg(&from[..])
                    .arg(&to[..])
                    .arg(ttl_ms)
                    .arg(ttl_ms + millis(FENCE_RETENTION));
            })
            .await?;
        let numbers = integers(&reply, 2).map_err(|f| self.failure("hand_over", f))?;
        self.attempt_reply("hand_over", started + ttl, (numbers[0], numbers[1]))
    }

    /// The attempt a `{flag, value}` reply of [`scripts::ACQUIRE`] or
    /// [`scripts::HAND_OVER`] tells.
    fn attempt_reply(
        &self,
        op: &'static str,
        valid_until: Instant,
        reply: (i64, i64),
    ) -> Result<Attempt> {
        match reply {
            (1, fence) if fence > 0 => Ok(Attempt::Granted {
                fence: fence as u64,
                valid_until,
            }),
            (0, pttl) => Ok(Attempt::Taken {
                expires_in: match pttl {
                    // Redis rounds PTTL down: wake a millisecond later rather than too early.
                    0.. => Some(Duration::from_millis(pttl as u64 + 1)),
                    -2 => Some(Duration::ZERO),
                    _ => None,
                },
            }),
            (flag, value) => Err(self.failure(
                op,
                Failure::Reply(format!("unexpected reply {{{flag}, {value}}}")),
            )),
        }
    }

    /// Pushes the expiry of lock `name` to `ttl` from now if `owner` still holds it:
    /// `Some(valid_until)` (from the instant before the request), `None` when not held.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn extend(&self, name: &str, owner: Owner, ttl: Duration) -> Result<Option<Instant>> {
        let ttl = CAPABILITIES.effective_ttl(ttl)?;
        let ttl_ms = millis(ttl);
        let started = Instant::now();
        let lock_key = self.lock_key(name);
        let owner = hex(owner);
        let reply = self
            .eval(&scripts::EXTEND, "extend", |cmd| {
                cmd.arg(1).arg(&lock_key).arg(&owner[..]).arg(ttl_ms);
            })
            .await?;
        match reply {
            Value::Int(1) => Ok(Some(started + ttl)),
            Value::Int(0) => Ok(None),
            other => Err(self.unexpected("extend", &other)),
        }
    }

    /// Deletes lock `name` if `owner` still holds it, announcing the release on the
    /// channel; `true` when deleted, `false` when it was not held by `owner` (then nothing
    /// changes and nothing is announced).
    ///
    /// # Errors
    /// As [`ping`](Self::ping).
    pub async fn release(&self, name: &str, owner: Owner) -> Result<bool> {
        self.release_queued(name, owner, None).await
    }

    /// [`release`](Self::release), calling `queued` as soon as the request is queued on
    /// the shared connection (and again if it had to be re-sent). A request queued after
    /// it on this node runs after it on the server, so a local waiter woken by `queued`
    /// can attempt at once, saving a round trip on every hand-off; if that attempt comes
    /// too early (the release fails), it is only refused.
    pub(crate) async fn release_queued(
        &self,
        name: &str,
        owner: Owner,
        queued: Option<Queued>,
    ) -> Result<bool> {
        let lock_key = self.lock_key(name);
        let op = ReleaseOp {
            owner: hex(owner),
            notice: self.notice(name),
            queued,
            timeout: self.timeout,
        };
        match self.grouped("release", lock_key, Op::Release(op)).await? {
            Out::Release(flag) => self.flag("release", Value::Int(flag)),
            Out::Refused(message) => Err(self.failure("release", Failure::Refused(message))),
            Out::Acquire(..) => Err(self.failure("release", mismatched())),
        }
    }

    /// Forgets `owner`'s attempt on lock `name` whose answer never came (it timed out, or
    /// its caller gave up): writes the attempt's tombstone ([`tombstone_key`], kept for
    /// [`ABANDON_RETENTION`]), so that its request, if it reaches the server later (it may
    /// sit in the socket buffer of a discarded connection while this goes on a new one),
    /// is answered "taken" and grants nothing; and deletes the lock (announcing the
    /// release) if the attempt was granted already. `true` when a lock was deleted.
    ///
    /// One script, sent at once (not behind queued requests): order does not matter, the
    /// tombstone covers an attempt that arrives after it.
    ///
    /// Cancellation: dropping the future after the request went out does not recall it;
    /// before, nothing is written, and the attempt may still grant (until its TTL).
    ///
    /// [`tombstone_key`]: Self::tombstone_key
    ///
    /// # Errors
    /// As [`ping`](Self::ping); an error means the tombstone may not be written.
    pub async fn abandon(&self, name: &str, owner: Owner) -> Result<bool> {
        let lock_key = self.lock_key(name);
        let tombstone = self.tombstone_key(name, owner);
        let notice = self.notice(name);
        let owner = hex(owner);
        let reply = self
            .eval(&scripts::ABANDON, "abandon", |cmd| {
                cmd.arg(2)
                    .arg(&lock_key)
                    .arg(&tombstone)
                    .arg(&owner[..])
                    .arg(&self.shared.channel)
                    .arg(&notice)
                    .arg(millis(ABANDON_RETENTION));
            })
            .await?;
        self.flag("abandon", reply)
    }

    /// Deletes lock `name` whoever holds it and announces the release; `true` when a lock
    /// was there. The fence counter is kept, so later fences still increase.
    ///
    /// # Errors
    /// As [`ping`](Self::ping).
    pub async fn force_release(&self, name: &str) -> Result<bool> {
        let lock_key = self.lock_key(name);
        let notice = self.notice(name);
        let reply = self
            .eval(&scripts::FORCE_RELEASE, "force_release", |cmd| {
                cmd.arg(1)
                    .arg(&lock_key)
                    .arg(&self.shared.channel)
                    .arg(&notice);
            })
            .await?;
        self.flag("force_release", reply)
    }

    /// The holder of lock `name`, `None` when free: its owner token (when the value is one),
    /// the key's fence counter (the holder's fence when the lock was taken through this
    /// protocol) and its remaining time (`None` without expiry).
    ///
    /// # Errors
    /// As [`ping`](Self::ping).
    pub async fn inspect(&self, name: &str) -> Result<Option<Holder>> {
        let (lock_key, fence_key) = (self.lock_key(name), self.fence_key(name));
        let reply = self
            .eval(&scripts::INSPECT, "inspect", |cmd| {
                cmd.arg(2).arg(&lock_key).arg(&fence_key);
            })
            .await?;
        match &reply {
            Value::Nil | Value::Boolean(false) => Ok(None),
            Value::Array(items) => match items.as_slice() {
                [Value::BulkString(owner), Value::Int(pttl), Value::BulkString(fence)] => {
                    Ok(Some(Holder {
                        owner: std::str::from_utf8(owner).ok().and_then(Owner::parse),
                        fence: std::str::from_utf8(fence).ok().and_then(|f| f.parse().ok()),
                        expires_in: u64::try_from(*pttl).ok().map(Duration::from_millis),
                    }))
                }
                _ => Err(self.unexpected("inspect", &reply)),
            },
            _ => Err(self.unexpected("inspect", &reply)),
        }
    }

    /// Raises the fence counter of lock `name` to at least `fence` (then keeping it for
    /// `ttl` plus [`FENCE_RETENTION`]); `true` when raised, `false` when it was already at least
    /// `fence`. Redlock writes a grant's winning fence back to a majority with it, so that
    /// every later majority issues a greater one.
    ///
    /// # Errors
    /// [`Error::InvalidTtl`]; [`Error::Backend`] for a fence above [`MAX_FENCE`]; otherwise
    /// as [`ping`](Self::ping).
    pub async fn raise_fence(&self, name: &str, fence: u64, ttl: Duration) -> Result<bool> {
        let ttl = CAPABILITIES.effective_ttl(ttl)?;
        if fence > MAX_FENCE {
            return Err(self.failure(
                "raise_fence",
                Failure::Reply(format!("fence {fence} is above the maximum {MAX_FENCE}")),
            ));
        }
        let fence_key = self.fence_key(name);
        let retention = millis(ttl) + millis(FENCE_RETENTION);
        let reply = self
            .eval(&scripts::RAISE_FENCE, "raise_fence", |cmd| {
                cmd.arg(1).arg(&fence_key).arg(fence).arg(retention);
            })
            .await?;
        self.flag("raise_fence", reply)
    }

    /// Starts the release subscription of this node (one extra connection, subscribed to
    /// [`release_channel`](Self::release_channel)), feeding `notices`: each release
    /// announced by another client calls [`ReleaseNotices::notify`]; each (re)subscription
    /// calls [`ReleaseNotices::notify_all`], since notices may have been missed meanwhile.
    /// Releases made through this node (and its clones) are not echoed back: the caller
    /// notifies its own waiters directly.
    ///
    /// The subscription reconnects by itself after a failure (backoff up to 1 s) and checks
    /// a silent connection with `PING` every few seconds. It stops when the returned
    /// [`ReleaseWatch`] is dropped. `None` outside a tokio runtime.
    pub fn watch_releases(&self, notices: Arc<ReleaseNotices>) -> Option<ReleaseWatch> {
        ReleaseWatch::start(
            self.shared.client.clone(),
            self.shared.channel.clone(),
            self.shared.origin.clone(),
            self.timeout,
            notices,
        )
    }

    /// The payload announcing `name`'s release: this node's origin, a space, the name.
    fn notice(&self, name: &str) -> String {
        let mut notice = String::with_capacity(self.shared.origin.len() + name.len());
        notice.push_str(&self.shared.origin);
        notice.push_str(name);
        notice
    }

    fn flag(&self, op: &'static str, reply: Value) -> Result<bool> {
        match reply {
            Value::Int(0) => Ok(false),
            Value::Int(1) => Ok(true),
            other => Err(self.unexpected(op, &other)),
        }
    }

    /// Sends `op` on `lock_key` through the node's group commit, within this handle's
    /// timeout.
    async fn grouped(&self, op_name: &'static str, lock_key: String, op: Op) -> Result<Out> {
        let key = GroupKey::of(lock_key.as_str());
        let op = (lock_key, op);
        self.shared
            .ops
            .send(key, op, self.timeout)
            .await
            .map_err(|failure| self.failure(op_name, Failure::Shared(failure)))
    }

    /// Runs `script` with the arguments `fill` adds after the script (see
    /// [`Shared::eval_raw`]), within this handle's timeout.
    async fn eval<F>(&self, script: &Script, op: &'static str, fill: F) -> Result<Value>
    where
        F: Fn(&mut Cmd),
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        self.shared
            .eval_raw(script, deadline, &|| {}, fill)
            .await
            .map_err(|failure| self.failure(op, failure))
    }

    async fn send(&self, cmd: &Cmd, op: &'static str) -> Result<Value> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        self.shared
            .link
            .send(cmd, deadline, &|| {})
            .await
            .map_err(|failure| self.failure(op, failure))
    }

    fn unexpected(&self, op: &'static str, reply: &Value) -> Error {
        self.failure(op, Failure::Reply(format!("unexpected reply {reply:?}")))
    }

    fn failure(&self, op: &'static str, failure: Failure) -> Error {
        let transient = failure.is_transient();
        let error = NodeError {
            addr: self.shared.addr.clone(),
            op,
            failure,
            timeout: self.timeout,
            tls: self.shared.config.is_tls(),
        };
        if transient {
            Error::unavailable(BACKEND, error)
        } else {
            Error::backend(BACKEND, error)
        }
    }
}

impl Shared {
    /// Runs `script` with the arguments `fill` adds after the script: `EVALSHA`, and `EVAL`
    /// when the server does not know the script (empty cache after a restart or a
    /// `SCRIPT FLUSH`), both before `deadline`; `queued` is called whenever a request of it
    /// is queued on the connection.
    async fn eval_raw<F>(
        &self,
        script: &Script,
        deadline: tokio::time::Instant,
        queued: &(dyn Fn() + Sync),
        fill: F,
    ) -> std::result::Result<Value, Failure>
    where
        F: Fn(&mut Cmd),
    {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(script.sha());
        fill(&mut cmd);
        match self.link.send(&cmd, deadline, queued).await {
            Err(Failure::Redis(e)) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                let mut cmd = redis::cmd("EVAL");
                cmd.arg(script.source);
                fill(&mut cmd);
                self.link.send(&cmd, deadline, queued).await
            }
            other => other,
        }
    }
}

/// A callback run once a release request is queued on the connection.
pub(crate) type Queued = Arc<dyn Fn() + Send + Sync>;

/// One acquire of a group (its lock key travels with it).
pub(crate) struct AcquireOp {
    fence_key: String,
    tombstone: String,
    owner: [u8; 32],
    ttl_ms: u64,
    retention: u64,
    timeout: Duration,
}

/// One release of a group (its lock key travels with it).
pub(crate) struct ReleaseOp {
    owner: [u8; 32],
    notice: String,
    queued: Option<Queued>,
    timeout: Duration,
}

/// A group's deadline: the longest of its members' timeouts from now (each caller also
/// bounds its own wait by its own timeout).
fn group_deadline(timeouts: impl Iterator<Item = Duration>) -> tokio::time::Instant {
    tokio::time::Instant::now() + timeouts.max().unwrap_or(Duration::from_secs(1))
}

/// One grouped operation of a node.
pub(crate) enum Op {
    Acquire(AcquireOp),
    Release(ReleaseOp),
}

/// Its answer: `(1, fence)` or `(0, pttl)` for an acquire; 1 or 0 for a release; or the
/// server's refusal of an operation on this request's keys alone (e.g. `WRONGTYPE`), which
/// is this caller's error and nobody else's in its group.
pub(crate) enum Out {
    Acquire(i64, i64),
    Release(i64),
    Refused(String),
}

/// A node's acquires and releases, each group one call of [`scripts::ACQUIRE`] or of
/// [`scripts::RELEASE`] over one or more locks. One group commit carries both, so
/// operations on one lock reach the server in the order they were sent (a clean-up release
/// never overtakes the abandoned acquire it cleans up after).
pub(crate) struct Ops(Weak<Shared>);

impl Ops {
    /// Runs `ops` (all acquires or all releases) as one script call; `dispatched` is called
    /// once the call is queued on the connection, which the server reads in order.
    async fn run(
        &self,
        ops: &[(String, Op)],
        dispatched: &(dyn Fn() + Sync),
    ) -> std::result::Result<Vec<Out>, Failure> {
        let shared = self.0.upgrade().ok_or_else(gone)?;
        let deadline = group_deadline(ops.iter().map(|(_, op)| match op {
            Op::Acquire(a) => a.timeout,
            Op::Release(r) => r.timeout,
        }));
        let acquires: Vec<(&String, &AcquireOp)> = ops
            .iter()
            .filter_map(|(k, op)| match op {
                Op::Acquire(a) => Some((k, a)),
                Op::Release(_) => None,
            })
            .collect();
        let releases: Vec<(&String, &ReleaseOp)> = ops
            .iter()
            .filter_map(|(k, op)| match op {
                Op::Release(r) => Some((k, r)),
                Op::Acquire(_) => None,
            })
            .collect();
        if acquires.len() == ops.len() {
            let reply = shared
                .eval_raw(&scripts::ACQUIRE, deadline, dispatched, |cmd| {
                    cmd.arg(acquires.len() * 3);
                    for (lock_key, op) in &acquires {
                        cmd.arg(*lock_key).arg(&op.fence_key).arg(&op.tombstone);
                    }
                    for (_, op) in &acquires {
                        cmd.arg(&op.owner[..]).arg(op.ttl_ms).arg(op.retention);
                    }
                })
                .await?;
            return acquire_answers(&reply, acquires.len());
        }
        if releases.len() != ops.len() {
            return Err(Failure::Reply("a group mixed acquires and releases".into()));
        }
        let queued = || {
            dispatched();
            for (_, op) in &releases {
                if let Some(queued) = &op.queued {
                    queued();
                }
            }
        };
        let reply = shared
            .eval_raw(&scripts::RELEASE, deadline, &queued, |cmd| {
                cmd.arg(releases.len());
                for (lock_key, _) in &releases {
                    cmd.arg(*lock_key);
                }
                cmd.arg(&shared.channel);
                for (_, op) in &releases {
                    cmd.arg(&op.owner[..]).arg(&op.notice);
                }
            })
            .await?;
        release_answers(&reply, releases.len())
    }
}

impl GroupSend for Ops {
    type Request = (String, Op);
    type Answer = Out;
    type Error = Arc<Failure>;

    async fn send_one(
        &self,
        op: Self::Request,
        dispatched: &(dyn Fn() + Sync),
    ) -> std::result::Result<Out, Arc<Failure>> {
        let mut answers = self
            .run(std::slice::from_ref(&op), dispatched)
            .await
            .map_err(Arc::new)?;
        answers
            .pop()
            .ok_or_else(|| Arc::new(Failure::Reply("an empty reply".into())))
    }

    async fn send_group(
        &self,
        ops: Vec<Self::Request>,
        dispatched: &(dyn Fn() + Sync),
    ) -> Vec<std::result::Result<Out, Arc<Failure>>> {
        match self.run(&ops, dispatched).await {
            Ok(answers) => answers.into_iter().map(Ok).collect(),
            Err(failure) => {
                let failure = Arc::new(failure);
                ops.iter().map(|_| Err(failure.clone())).collect()
            }
        }
    }

    /// No answer in time (queued too long behind other calls), or its group was cut off.
    fn no_answer(&self) -> Arc<Failure> {
        Arc::new(Failure::Timeout)
    }

    /// A group is one script call: acquires or releases, not both.
    fn groups_with(&self, first: &Self::Request, other: &Self::Request) -> bool {
        matches!(
            (&first.1, &other.1),
            (Op::Acquire(_), Op::Acquire(_)) | (Op::Release(_), Op::Release(_))
        )
    }
}

/// The failure of an answer of the wrong kind (which the group commit never produces).
fn mismatched() -> Failure {
    Failure::Reply("an answer of the wrong kind".into())
}

/// The failure of a request whose node handle went away, or whose group ended unanswered.
fn gone() -> Failure {
    Failure::Reply(
        "the request ended without an answer (node dropped or runtime shutting down)".into(),
    )
}

/// The `n` answers of an [`scripts::ACQUIRE`] reply: `flag, value` pairs, the value of a
/// `-1` flag being the server's error message for that lock.
fn acquire_answers(reply: &Value, n: usize) -> std::result::Result<Vec<Out>, Failure> {
    let unexpected = || Failure::Reply(format!("unexpected reply {reply:?}"));
    match reply {
        Value::Array(items) if items.len() == n * 2 => items
            .chunks(2)
            .map(|pair| match pair {
                [Value::Int(flag), Value::Int(value)] => Ok(Out::Acquire(*flag, *value)),
                [Value::Int(-1), message] => {
                    Ok(Out::Refused(text(message).ok_or_else(unexpected)?))
                }
                _ => Err(unexpected()),
            })
            .collect(),
        _ => Err(unexpected()),
    }
}

/// The `n` answers of a [`scripts::RELEASE`] reply: 1 or 0, or the server's error message
/// for that lock.
fn release_answers(reply: &Value, n: usize) -> std::result::Result<Vec<Out>, Failure> {
    let unexpected = || Failure::Reply(format!("unexpected reply {reply:?}"));
    match reply {
        Value::Array(items) if items.len() == n => items
            .iter()
            .map(|item| match item {
                Value::Int(flag) => Ok(Out::Release(*flag)),
                message => Ok(Out::Refused(text(message).ok_or_else(unexpected)?)),
            })
            .collect(),
        _ => Err(unexpected()),
    }
}

/// The text of a string reply.
fn text(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    }
}

/// `n` integers of an array reply.
fn integers(reply: &Value, n: usize) -> std::result::Result<Vec<i64>, Failure> {
    let unexpected = || Failure::Reply(format!("unexpected reply {reply:?}"));
    match reply {
        Value::Array(items) if items.len() == n => items
            .iter()
            .map(|v| match v {
                Value::Int(i) => Ok(*i),
                _ => Err(unexpected()),
            })
            .collect(),
        _ => Err(unexpected()),
    }
}

/// Milliseconds of a duration, rounded up.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
}

/// `<prefix>{<name>}<suffix>`.
fn key(prefix: &str, name: &str, suffix: &str) -> String {
    let mut key = String::with_capacity(prefix.len() + name.len() + suffix.len() + 2);
    key.push_str(prefix);
    key.push('{');
    key.push_str(name);
    key.push('}');
    key.push_str(suffix);
    key
}

/// The owner token as stored: 32 lowercase hex digits (as `Owner`'s `Display`, without
/// the formatting machinery on the hot path).
fn hex(owner: Owner) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let value = owner.as_u128();
    let mut out = [0u8; 32];
    for (i, digit) in out.iter_mut().enumerate() {
        *digit = DIGITS[((value >> ((31 - i) * 4)) & 0xf) as usize];
    }
    out
}

/// What went wrong with one request.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No answer within the operation timeout.
    Timeout,
    /// The client library failed (I/O, protocol, server error).
    Redis(RedisError),
    /// The server answered something the protocol does not allow.
    Reply(String),
    /// The server refused an operation on this request's keys (e.g. `WRONGTYPE`: a value
    /// of another type at the lock key); the rest of its group was answered.
    Refused(String),
    /// The failure of a group this request was part of.
    Shared(Arc<Failure>),
}

impl Failure {
    /// The failure itself, looking through a group's.
    fn own(&self) -> &Failure {
        match self {
            Failure::Shared(inner) => inner.own(),
            other => other,
        }
    }

    fn is_transient(&self) -> bool {
        match self {
            Failure::Timeout => true,
            Failure::Reply(_) | Failure::Refused(_) => false,
            Failure::Shared(failure) => failure.is_transient(),
            Failure::Redis(e) => match e.kind() {
                ErrorKind::Io => true,
                ErrorKind::Server(kind) => matches!(
                    kind,
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                ),
                // A long script of another client blocks the server for a while.
                ErrorKind::Extension => e.code() == Some("BUSY"),
                _ => false,
            },
        }
    }
}

/// The source of the errors a [`RedisNode`] returns: which server, which operation, what.
#[derive(Debug)]
struct NodeError {
    addr: String,
    op: &'static str,
    failure: Failure,
    timeout: Duration,
    tls: bool,
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redis at {} ({}): ", self.addr, self.op)?;
        // The first PING of a connection is where a wrong port or a missing TLS shows.
        let checking = self.op == "PING";
        match self.failure.own() {
            Failure::Timeout if checking && self.tls => write!(
                f,
                "no answer within {:?} (does the server speak TLS? rediss:// needs it)",
                self.timeout
            ),
            Failure::Timeout => write!(f, "no answer within {:?}", self.timeout),
            Failure::Redis(e)
                if checking && e.is_connection_dropped() && !e.is_connection_refusal() =>
            {
                write!(
                    f,
                    "the server closed the connection on PING (is this a Redis port?): {e}"
                )
            }
            Failure::Reply(what) => f.write_str(what),
            Failure::Refused(what) => write!(
                f,
                "the server refused an operation on the lock's keys: {what}"
            ),
            Failure::Shared(_) => f.write_str("the request's group failed"),
            Failure::Redis(e) => {
                let auth = e.kind() == ErrorKind::AuthenticationFailed
                    || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"));
                if auth {
                    write!(
                        f,
                        "authentication refused (check the user name and password): {e}"
                    )
                } else if e.kind() == ErrorKind::Parse {
                    write!(
                        f,
                        "the server does not speak the Redis protocol (is this a Redis port?): {e}"
                    )
                } else if e.is_connection_refusal() {
                    write!(f, "connection refused (is Redis running there?): {e}")
                } else {
                    write!(f, "{e}")
                }
            }
        }
    }
}

impl std::error::Error for NodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self.failure.own() {
            Failure::Redis(e) => Some(e),
            _ => None,
        }
    }
}

/// The shared multiplexed connection, reopened on demand after it broke.
struct Connector {
    client: Client,
    config: AsyncConnectionConfig,
    current: Mutex<Option<Link>>,
    /// Serialises reconnects, so concurrent operations share one new connection.
    connecting: tokio::sync::Mutex<()>,
    generation: AtomicU64,
}

#[derive(Clone)]
struct Link {
    conn: MultiplexedConnection,
    generation: u64,
}

impl Connector {
    fn new(client: Client) -> Self {
        Connector {
            client,
            // Our own deadline bounds connecting and every request, so that a timeout
            // always reads the same and counts from the start of the operation.
            config: AsyncConnectionConfig::new()
                .set_connection_timeout(None)
                .set_response_timeout(None),
            current: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            generation: AtomicU64::new(0),
        }
    }

    fn cached(&self) -> Option<Link> {
        lock(&self.current).clone()
    }

    /// The current connection, or a new one; `true` when it was opened by this call.
    async fn link(&self) -> std::result::Result<(Link, bool), RedisError> {
        if let Some(link) = self.cached() {
            return Ok((link, false));
        }
        let _turn = self.connecting.lock().await;
        if let Some(link) = self.cached() {
            return Ok((link, false));
        }
        let conn = self
            .client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await?;
        let link = Link {
            conn,
            generation: self.generation.fetch_add(1, Ordering::Relaxed) + 1,
        };
        *lock(&self.current) = Some(link.clone());
        Ok((link, true))
    }

    /// Forgets connection `generation` (if still current) so the next request reconnects.
    fn discard(&self, generation: u64) {
        let mut current = lock(&self.current);
        if current.as_ref().is_some_and(|l| l.generation == generation) {
            *current = None;
        }
    }

    /// Sends `cmd` and reads its reply before `deadline`, calling `queued` once the request
    /// is queued on the connection.
    async fn send(
        &self,
        cmd: &Cmd,
        deadline: tokio::time::Instant,
        queued: &(dyn Fn() + Sync),
    ) -> std::result::Result<Value, Failure> {
        let mut resent = false;
        loop {
            let (mut link, fresh) = match self.cached() {
                Some(link) => (link, false),
                None => match tokio::time::timeout_at(deadline, self.link()).await {
                    Err(_) => return Err(Failure::Timeout),
                    Ok(Err(e)) => return Err(Failure::Redis(e)),
                    Ok(Ok(link)) => link,
                },
            };
            let mut request = std::pin::pin!(link.conn.send_packed_command(cmd));
            // The first poll queues the request on the connection, whose driver writes
            // requests in queue order; only then may `queued` let others queue behind it.
            let sent = match futures::poll!(request.as_mut()) {
                std::task::Poll::Ready(reply) => Ok(reply),
                std::task::Poll::Pending => {
                    queued();
                    tokio::time::timeout_at(deadline, request).await
                }
            };
            // Error replies arrive as values; the protocol treats them as errors.
            match sent.map(|reply| reply.and_then(Value::extract_error)) {
                Ok(Ok(value)) => return Ok(value),
                Err(_) => {
                    // A connection that stays silent may be half-open: do not reuse it.
                    self.discard(link.generation);
                    return Err(Failure::Timeout);
                }
                Ok(Err(e)) => {
                    if e.is_io_error() || e.is_unrecoverable_error() {
                        self.discard(link.generation);
                    }
                    // The connection we kept had closed while idle (server restart, idle
                    // timeout): send once more on a new one. The scripts make a repeated
                    // request harmless in the rare case the first one did arrive.
                    if !fresh && !resent && e.is_connection_dropped() {
                        resent = true;
                        continue;
                    }
                    return Err(Failure::Redis(e));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_round_up() {
        assert_eq!(millis(Duration::from_millis(10)), 10);
        assert_eq!(millis(Duration::from_micros(10_001)), 11);
        assert_eq!(
            millis(Duration::MAX),
            u64::try_from(Duration::MAX.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX)
        );
    }

    #[test]
    fn owner_hex_and_keys_have_the_stored_form() {
        for owner in [
            Owner::from_u128(0),
            Owner::from_u128(u128::MAX),
            Owner::random(),
        ] {
            assert_eq!(&hex(owner)[..], owner.to_string().as_bytes());
        }
        assert_eq!(key("p:", "a/b", ""), "p:{a/b}");
        assert_eq!(key("", "x", ":fence"), "{x}:fence");
    }

    #[test]
    fn failures_are_classified() {
        assert!(Failure::Timeout.is_transient());
        assert!(!Failure::Reply("x".into()).is_transient());
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(Failure::Redis(io).is_transient());
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "bad"));
        assert!(!Failure::Redis(auth).is_transient());
    }
}
