//! `RedisNode`, the handle on one Redis server: its connection and group commit, its key
//! names and timeout, and how one request is sent and its failure reported. The lock
//! operations on it are in `node.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lock_core::group::{GroupCommit, GroupKey};
use lock_core::url::HostPort;
use lock_core::{Error, Owner, ReleaseNotices, Result};
use redis::{
    Client, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, Value,
};

use crate::cluster::{self, Target};
use crate::codec::{hex, key};
use crate::config::RedisBuilder;
use crate::connection::Connector;
use crate::error::{Failure, NodeError, NAME};
use crate::ops::{Op, Ops, Out};
use crate::scripts::Script;
use crate::sentinel::Endpoint;
use crate::watch::ReleaseWatch;

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
/// `RedisBuilder::build_node` and reopened by the next operation after it broke (server
/// restart, dropped connection, timeout). An operation that finds the shared connection
/// closed before its request went out reconnects and sends it once more.
///
/// # Keys
///
/// Lock `name` lives at `<prefix>{<name>}` with the owner token (32 hex digits) as value and
/// the TTL as expiry; its fence counter at `<prefix>{<name>}:fence`. Claimed with several
/// permits (a semaphore, a reader-writer key), the key's grants live at
/// `<prefix>{<name>}:holders` (a sorted set of owners by expiry) and
/// `<prefix>{<name>}:permits` (a hash), and take their fences from the same counter. The
/// braces are a Redis Cluster hash tag, so all of a name's keys share a slot, and no lock
/// key can equal another key of the protocol (lock keys end with `}`). Releases are
/// announced on the channel `<prefix>released:<db>` (see
/// [`watch_releases`](Self::watch_releases)). The raw baseline writes and deletes
/// `<prefix>{<name>}:baseline` ([`raw_cycle`](Self::raw_cycle)), never a lock's keys.
/// Run records of job `job` (the scheduler's history, [`append_run`](Self::append_run))
/// live at `<prefix>runs:{<job>}` (a list, newest first), `<prefix>runs:{<job>}:ok` (the
/// last success) and `<prefix>runs:{<job>}:failed` (the last failure), and the job's
/// control ([`set_control`](Self::set_control)) at `<prefix>runs:{<job>}:control`, apart
/// from every lock key. The fire-time claim of job `job`
/// ([`claim_fire_time`](Self::claim_fire_time)) is a hash at `<prefix>claim:{<job>}`, apart
/// from every lock and records key. The value the leader of election `name` published
/// ([`publish_leader`](Self::publish_leader)) is a hash at `<prefix>{<name>}:leader`,
/// beside the lock `name` it leads by.
#[derive(Clone)]
pub struct RedisNode {
    shared: Arc<Shared>,
    pub(crate) timeout: Duration,
    /// Prefix of the release notices sent through this handle and its clones, so that the
    /// subscription started through them can skip them (their sender notified its own
    /// waiters already). Per handle, not per connection: two backends over one node each
    /// get their own ([`with_own_origin`](Self::with_own_origin)), and hear each other.
    origin: Arc<str>,
}

struct Shared {
    config: RedisBuilder,
    addr: String,
    /// Where the release subscription listens: the server (directly or through the
    /// sentinels), or each seed of a cluster in turn.
    watch_endpoints: Vec<Endpoint>,
    channel: String,
    link: Arc<Connector>,
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
            check_crypto_provider()?;
        }
        let open = |info: ConnectionInfo| open_client(&config, info);
        let mut settings = RedisConnectionInfo::default().set_db(i64::from(config.get_database()));
        let (username, password) = config.credentials();
        if let Some(username) = username {
            settings = settings.set_username(username);
        }
        if let Some(password) = password {
            settings = settings.set_password(password);
        }
        let timeout = config.get_timeout();
        let (addr, target, watch_endpoints) = if config.is_cluster() {
            let seeds: Vec<ConnectionInfo> = config
                .seed_nodes()
                .iter()
                .map(|seed| connection_info(&config, seed, &settings))
                .collect::<Result<_>>()?;
            let watch = seeds
                .iter()
                .map(|info| Ok(Endpoint::Direct(Arc::new(open(info.clone())?))))
                .collect::<Result<_>>()?;
            let addr = config.seed_nodes().iter().map(HostPort::to_string);
            let addr = addr.collect::<Vec<_>>().join(",");
            let target = Target::Cluster(cluster::client(seeds, timeout)?);
            (addr, target, watch)
        } else {
            let (endpoint, addr) = match Endpoint::for_sentinels(&config, &settings) {
                Some(found) => found,
                None => {
                    let host = config.host_port().cloned().ok_or_else(|| {
                        Error::invalid_url(&config.redacted(), "malformed address")
                    })?;
                    let client = open(connection_info(&config, &host, &settings)?)?;
                    (Endpoint::Direct(Arc::new(client)), host.to_string())
                }
            };
            (addr, Target::Endpoint(endpoint.clone()), vec![endpoint])
        };
        let channel = format!("{}released:{}", config.get_prefix(), config.get_database());
        let link = Arc::new(Connector::new(target));
        let ops = Ops::new(Arc::downgrade(&link), channel.clone(), config.is_cluster());
        let ops = if !config.is_grouping() {
            GroupCommit::with_limits(ops, usize::MAX, 1)
        } else if config.is_cluster() {
            GroupCommit::with_limits(ops, CLUSTER_IN_FLIGHT, lock_core::group::MAX_GROUP)
        } else {
            GroupCommit::new(ops)
        };
        let node = RedisNode {
            shared: Arc::new(Shared {
                link,
                addr,
                watch_endpoints,
                channel,
                config,
                ops,
            }),
            timeout,
            origin: new_origin(),
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
            origin: self.origin.clone(),
        }
    }

    /// A handle on the same server and connection whose releases are announced under an
    /// origin of its own: a subscription started through it ([`watch_releases`]) hears the
    /// releases made through this node's other handles, and skips only its own. Each
    /// [`RedisBackend`](crate::RedisBackend) takes one, so two backends over one node wake
    /// each other's waiters.
    ///
    /// [`watch_releases`]: Self::watch_releases
    pub fn with_own_origin(&self) -> RedisNode {
        RedisNode {
            shared: self.shared.clone(),
            timeout: self.timeout,
            origin: new_origin(),
        }
    }

    /// `host:port` of the server; through sentinels, ``master `NAME` via sentinels
    /// HOST:PORT,…`` (the master's address changes with failovers).
    pub fn addr(&self) -> &str {
        &self.shared.addr
    }

    /// The configuration this node was built from.
    pub fn config(&self) -> &RedisBuilder {
        &self.shared.config
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        self.shared.config.get_prefix()
    }

    /// The Redis key holding lock `name`: `<prefix>{<name>}`.
    pub fn lock_key(&self, name: &str) -> String {
        key(self.prefix(), name, "")
    }

    /// The Redis key holding the fence counter of lock `name`: `<prefix>{<name>}:fence`.
    pub fn fence_key(&self, name: &str) -> String {
        key(self.prefix(), name, ":fence")
    }

    /// The Redis sorted set of the holders of key `name`'s permits (a semaphore or a
    /// reader-writer key; see `permits.rs`): `<prefix>{<name>}:holders`.
    pub fn holders_key(&self, name: &str) -> String {
        key(self.prefix(), name, ":holders")
    }

    /// The Redis hash of key `name`'s permits (how many, how many taken, and each holder's
    /// take and fence): `<prefix>{<name>}:permits`.
    pub fn permits_key(&self, name: &str) -> String {
        key(self.prefix(), name, ":permits")
    }

    /// The Redis hash holding the value the leader of election `name` published, with its
    /// owner and term: `<prefix>{<name>}:leader` (the lock's hash tag; it cannot equal a
    /// lock key, which ends with `}`, nor another key of the lock, whose suffixes differ).
    pub fn leader_key(&self, name: &str) -> String {
        key(self.prefix(), name, ":leader")
    }

    /// The Redis key of the tombstone of `owner`'s abandoned attempt on lock `name`:
    /// `<prefix>{<name>}:x:<owner>` (the lock's hash tag; it cannot equal a lock key, which
    /// ends with `}`, nor a fence counter key, which ends with `:fence`).
    pub fn tombstone_key(&self, name: &str, owner: Owner) -> String {
        let mut key = key(self.prefix(), name, ":x:");
        key.push_str(std::str::from_utf8(&hex(owner)).unwrap_or_default());
        key
    }

    /// The Redis list holding job `job`'s run records, newest first:
    /// `<prefix>runs:{<job>}`. Every lock key (and its counter, tombstone and baseline key)
    /// starts `<prefix>{`, every records key `<prefix>runs:{`, so none can equal a lock's
    /// key, whatever the names; the braces give the job's records one hash tag.
    pub fn runs_key(&self, job: &str) -> String {
        let mut key = String::with_capacity(self.prefix().len() + job.len() + 7);
        key.push_str(self.prefix());
        key.push_str("runs:");
        key.push('{');
        key.push_str(job);
        key.push('}');
        key
    }

    /// The Redis key holding job `job`'s last successful run record:
    /// `<prefix>runs:{<job>}:ok` (the hash tag of [`runs_key`](Self::runs_key); it cannot
    /// equal a history list's key, which ends with `}`).
    pub fn last_success_key(&self, job: &str) -> String {
        let mut key = self.runs_key(job);
        key.push_str(":ok");
        key
    }

    /// The Redis key holding job `job`'s last failed run record (an outcome that
    /// [`is_failure`](lock_core::records::RunOutcome::is_failure)):
    /// `<prefix>runs:{<job>}:failed` (the hash tag of [`runs_key`](Self::runs_key); its
    /// ending sets it apart from every other records key).
    pub fn last_failure_key(&self, job: &str) -> String {
        let mut key = self.runs_key(job);
        key.push_str(":failed");
        key
    }

    /// The Redis key holding job `job`'s control (pause, trigger):
    /// `<prefix>runs:{<job>}:control` (the hash tag of [`runs_key`](Self::runs_key); its
    /// ending sets it apart from every other records key).
    pub fn control_key(&self, job: &str) -> String {
        let mut key = self.runs_key(job);
        key.push_str(":control");
        key
    }

    /// The Redis hash holding job `job`'s fire-time claim (the newest fire time claimed,
    /// by whom, when): `<prefix>claim:{<job>}`. It starts `<prefix>claim:{`, so it cannot
    /// equal a lock's key (`<prefix>{`) nor a run records key (`<prefix>runs:{`), whatever
    /// the names; the braces are the job's hash tag.
    pub fn claim_key(&self, job: &str) -> String {
        let mut key = String::with_capacity(self.prefix().len() + job.len() + 8);
        key.push_str(self.prefix());
        key.push_str("claim:");
        key.push('{');
        key.push_str(job);
        key.push('}');
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

    /// Starts the release subscription of this node (one extra connection, subscribed to
    /// [`release_channel`](Self::release_channel)), feeding `notices`: each release
    /// announced by another client calls [`ReleaseNotices::notify`]; each (re)subscription
    /// calls [`ReleaseNotices::notify_all`], since notices may have been missed meanwhile.
    /// Releases made through this handle (and its clones and
    /// [`with_timeout`](Self::with_timeout) handles) are not echoed back: the caller
    /// notifies its own waiters directly. Releases through a
    /// [`with_own_origin`](Self::with_own_origin) handle, or any other client, are.
    ///
    /// The subscription reconnects by itself after a failure (backoff up to 1 s) and checks
    /// a silent connection with `PING` every few seconds. It stops when the returned
    /// `ReleaseWatch` is dropped. `None` outside a tokio runtime.
    pub fn watch_releases(&self, notices: Arc<ReleaseNotices>) -> Option<ReleaseWatch> {
        ReleaseWatch::start(
            self.shared.watch_endpoints.clone(),
            self.shared.channel.clone(),
            self.origin.to_string(),
            self.timeout,
            notices,
        )
    }

    /// The payload announcing `name`'s release: this node's origin, a space, the name.
    pub(crate) fn notice(&self, name: &str) -> String {
        let mut notice = String::with_capacity(self.origin.len() + name.len());
        notice.push_str(&self.origin);
        notice.push_str(name);
        notice
    }

    pub(crate) fn flag(&self, op: &'static str, reply: Value) -> Result<bool> {
        match reply {
            Value::Int(0) => Ok(false),
            Value::Int(1) => Ok(true),
            other => Err(self.unexpected(op, &other)),
        }
    }

    /// Sends `op` on `lock_key` through the node's group commit, within this handle's
    /// timeout.
    pub(crate) async fn grouped(
        &self,
        op_name: &'static str,
        lock_key: String,
        op: Op,
    ) -> Result<Out> {
        let key = GroupKey::of(lock_key.as_str());
        let op = (lock_key, op);
        self.shared
            .ops
            .send(key, op, self.timeout)
            .await
            .map_err(|failure| self.failure(op_name, Failure::Shared(failure)))
    }

    /// Runs `script` with the arguments `fill` adds after the script (see
    /// [`Connector::eval`]), within this handle's timeout.
    pub(crate) async fn eval<F>(&self, script: &Script, op: &'static str, fill: F) -> Result<Value>
    where
        F: Fn(&mut Cmd),
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        self.shared
            .link
            .eval(script, deadline, &|| {}, fill)
            .await
            .map_err(|failure| self.failure(op, failure))
    }

    pub(crate) async fn send(&self, cmd: &Cmd, op: &'static str) -> Result<Value> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        self.shared
            .link
            .send(cmd, deadline, &|| {})
            .await
            .map_err(|failure| self.failure(op, failure))
    }

    pub(crate) fn unexpected(&self, op: &'static str, reply: &Value) -> Error {
        self.failure(op, Failure::unexpected(reply))
    }

    pub(crate) fn failure(&self, op: &'static str, failure: Failure) -> Error {
        NodeError {
            addr: self.shared.addr.clone(),
            op,
            failure,
            timeout: self.timeout,
            tls: self.shared.config.is_tls(),
        }
        .into_error()
    }
}

/// A fresh release-notice origin: a random token and a space.
fn new_origin() -> Arc<str> {
    Arc::from(format!("{} ", Owner::random()))
}

/// Calls on their way at once through a cluster node's group commit: its calls go to
/// several masters, and each group holds keys of one slot only (see `design.md`).
const CLUSTER_IN_FLIGHT: usize = 16;

/// How to reach the server at `host` with `config`'s TLS, credentials and database.
fn connection_info(
    config: &RedisBuilder,
    host: &HostPort,
    settings: &RedisConnectionInfo,
) -> Result<ConnectionInfo> {
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
    connection_addr
        .into_connection_info()
        .map(|info| info.set_redis_settings(settings.clone()))
        .map_err(|e| Error::backend(NAME, e))
}

/// The client for `info`, with the CA and client certificate `config` names, if any.
fn open_client(config: &RedisBuilder, info: ConnectionInfo) -> Result<Client> {
    match tls_certificates(config)? {
        None => Client::open(info),
        #[cfg(feature = "tls")]
        Some(certificates) => Client::build_with_tls(info, certificates),
        #[cfg(not(feature = "tls"))]
        Some(never) => match never {},
    }
    .map_err(|e| {
        Error::invalid_url(
            &config.redacted(),
            format!("unusable TLS certificates: {e}"),
        )
    })
}

/// The CA and client certificate of a TLS configuration, read from their files; `None`
/// when the configuration names neither (the system's roots, no client certificate).
///
/// # Errors
/// [`Error::InvalidUrl`] naming the file when one cannot be read.
/// Rule: this crate installs no process-wide rustls crypto provider. rustls settles it on
/// first use (the provider the application installed, else the only one compiled into the
/// build); where neither settles it (no provider compiled in, or several), rustls would panic
/// inside redis-rs, so this returns a non-transient [`Error::Backend`] naming the fix instead.
/// rustls' own panic message is still printed by the panic hook in that case.
#[cfg(feature = "tls")]
fn check_crypto_provider() -> Result<()> {
    if rustls::crypto::CryptoProvider::get_default().is_some() {
        return Ok(());
    }
    // rustls' own resolution: it installs the provider its crate features name, if one.
    match std::panic::catch_unwind(|| drop(rustls::ClientConfig::builder())) {
        Ok(()) => Ok(()),
        Err(_) => Err(Error::backend(
            "redis",
            "rediss:// needs a rustls crypto provider and this build names none or several: \
             call rustls::crypto::ring::default_provider().install_default() (or the aws-lc-rs \
             one) before connecting, or enable distlock's `tls-ring` feature alone",
        )),
    }
}

#[cfg(feature = "tls")]
fn tls_certificates(config: &RedisBuilder) -> Result<Option<redis::TlsCertificates>> {
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            Error::invalid_url(
                &config.redacted(),
                format!("cannot read the {what} file {}: {e}", path.display()),
            )
        })
    };
    let client = config.get_client_cert();
    if !config.is_tls() || (config.get_ca_file().is_none() && client.is_none()) {
        return Ok(None);
    }
    let root_cert = match config.get_ca_file() {
        Some(path) => Some(read("CA", path)?),
        None => None,
    };
    let client_tls = match client {
        Some((cert, key)) => Some(redis::ClientTlsConfig {
            client_cert: read("client certificate", cert)?,
            client_key: read("client key", key)?,
        }),
        None => None,
    };
    Ok(Some(redis::TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// Without the `tls` feature no configuration reaches here with TLS (`check` refuses it).
#[cfg(not(feature = "tls"))]
fn tls_certificates(_config: &RedisBuilder) -> Result<Option<std::convert::Infallible>> {
    Ok(None)
}

impl RedisBuilder {
    /// Like [`build`](Self::build), but returns the bare `RedisNode` (for composing several
    /// servers, as Redlock does).
    ///
    /// # Errors
    /// As [`build`](Self::build).
    #[cfg(feature = "internals")]
    #[doc(hidden)]
    pub async fn build_node(self) -> Result<RedisNode> {
        self.check()?;
        RedisNode::connect(self).await
    }
}
