//! Where the nodes are and how the algorithm is tuned: [`RedlockBuilder`].

use std::fmt;
use std::time::Duration;

use lock_core::url::{format_duration, Host, HostPort, UserInfo};
use lock_core::{Error, LockUrl, Result};
use lock_redis::{database_path, url_database, RedisBuilder, DEFAULT_PORT, DEFAULT_PREFIX};

/// The clock-drift factor used when none is given: 1 % of the TTL.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// The bound on connecting to a node (and on its release subscription's requests).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The URL parameters a `redlock://` URL may carry.
pub const URL_PARAMS: &[&str] = &["drift", "prefix", "timeout", "fencing"];

/// Typed configuration of a Redlock over N independent Redis nodes, and the way to connect.
///
/// Built from node addresses with [`RedlockBackend::builder`](crate::RedlockBackend::builder) (or [`RedlockBuilder::new`])
/// and setters, or from a URL with [`RedlockBuilder::from_url`]; nothing is checked or
/// contacted until [`build`](Self::build). Every node gets the same credentials, database
/// and key prefix: they are replicas of one lock space, not shards.
///
/// `Debug` shows the configuration as a URL with the password replaced by `***`.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_redlock::RedlockBackend;
///
/// let backend = RedlockBackend::builder(["10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"])
///     .password("s3cret")
///     .prefix("myapp:locks:")
///     .drift_factor(0.02)
///     .node_timeout(Duration::from_millis(20))
///     .build()
///     .await?;
/// let locker = lock_core::Locker::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq)]
///
/// A setter is named after its property, the same name on every distlock builder
/// (`prefix`, `timeout`, `database`, `username`, `password`, `tls`, `ca_file`,
/// `client_cert`); its getter is `get_<property>` (as tokio-postgres's `Config`).
#[must_use = "setters return the changed value; it does nothing until used"]
pub struct RedlockBuilder {
    /// Node addresses as given; parsed (and checked for duplicates) by `check`.
    addrs: Vec<String>,
    username: Option<String>,
    password: Option<String>,
    db: u32,
    prefix: String,
    drift_factor: f64,
    node_timeout: Option<Duration>,
    connect_timeout: Duration,
    fencing: bool,
    tls: bool,
}

impl RedlockBuilder {
    /// A configuration for the nodes at `addrs` (`host`, `host:port`, `[v6]:port`; the
    /// default port is 6379), without TLS or credentials, database 0, prefix `distlock:`,
    /// drift factor 0.01, per-node timeout derived from each TTL, and fencing on. Malformed
    /// or repeated addresses are reported by `build` as [`Error::InvalidUrl`].
    pub fn new<I, S>(addrs: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedlockBuilder {
            addrs: addrs.into_iter().map(Into::into).collect(),
            username: None,
            password: None,
            db: 0,
            prefix: DEFAULT_PREFIX.to_owned(),
            drift_factor: DEFAULT_DRIFT_FACTOR,
            node_timeout: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            fencing: true,
            tls: false,
        }
    }

    /// The configuration a `redlock://` URL describes:
    /// `redlock://[user[:password]@]h1[:p1],h2[:p2],…[/db][?drift=…&prefix=…&timeout=…&fencing=…]`.
    ///
    /// - `drift`: the clock-drift factor, a number in `[0, 1)` (default `0.01`);
    /// - `prefix`: the namespace of every key and release channel (default `distlock:`);
    /// - `timeout`: a fixed per-node timeout such as `20ms` (default: derived from each TTL,
    ///   see [`node_timeout`](Self::node_timeout));
    /// - `fencing`: `true` (default) or `false`, see [`fencing`](Self::fencing).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for another scheme, an unknown parameter, a bad value, or a node
    /// listed twice.
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        if url.scheme != "redlock" {
            return Err(url.invalid(format!(
                "the Redlock backend takes redlock:// URLs, not {}://",
                url.scheme
            )));
        }
        if url.hosts.is_empty() {
            return Err(url.invalid("redlock:// needs a host"));
        }
        let db = url_database(url)?;
        url.check_params(URL_PARAMS)?;
        let hosts = url.host_ports(DEFAULT_PORT);
        let mut builder = RedlockBuilder::new(hosts.iter().map(HostPort::to_string));
        builder.username = url.username().map(str::to_owned);
        builder.password = url.password().map(str::to_owned);
        builder.db = db;
        if let Some(prefix) = url.param("prefix") {
            builder.prefix = prefix.to_owned();
        }
        if let Some(drift) = url.f64_param("drift")? {
            builder.drift_factor = drift;
        }
        builder.node_timeout = url.duration_param("timeout")?;
        builder.fencing = url.bool_param("fencing")?.unwrap_or(true);
        builder.check(&url.redacted())?;
        Ok(builder)
    }

    /// The ACL user name (Redis 6+) on every node.
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// The password (`AUTH`) on every node.
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// The database index (`SELECT`) on every node; default 0.
    pub fn database(mut self, database: u32) -> Self {
        self.db = database;
        self
    }

    /// The database index: the old name of [`database`](Self::database).
    #[deprecated(since = "0.1.0", note = "renamed `database`, as on every builder")]
    pub fn db(self, db: u32) -> Self {
        self.database(db)
    }

    /// The prefix of every key and release channel; default `distlock:`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The clock-drift factor ρ, in `[0, 1)`; default 0.01. A grant's validity is
    /// `TTL − elapsed − (TTL × ρ + 2 ms)`: the nodes' clocks may run up to ρ faster than
    /// ours, and Redis expires keys with about a millisecond of precision.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// A fixed bound on each node's answer to each request. Without one (the default) it
    /// is derived from the TTL of the request: `TTL / 10`, between 5 ms and 50 ms, and
    /// 500 ms for requests without a TTL (release, inspect, force-release). Keep it much
    /// smaller than the TTL: an attempt that needs a slow node for its quorum loses that
    /// time from the validity.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = Some(timeout);
        self
    }

    /// The bound on connecting to each node, by [`build`](Self::build) and by the
    /// background reconnection of a node that was down; default 1 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Whether fencing tokens strictly increase across holders (default on): each grant
    /// writes its token back to a majority before it is returned, at the cost of one more
    /// round trip. Off, a grant's token is the largest of its quorum's node tokens, which
    /// is not monotonic (two majorities can differ in their largest node).
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// Connects to every node over TLS when `on` (needs the `tls` feature of lock-redis).
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }

    /// The node addresses as given.
    pub fn addrs(&self) -> &[String] {
        &self.addrs
    }

    /// The configured drift factor.
    pub fn get_drift_factor(&self) -> f64 {
        self.drift_factor
    }

    /// The fixed per-node timeout, `None` when derived from each TTL.
    pub fn get_node_timeout(&self) -> Option<Duration> {
        self.node_timeout
    }

    /// Whether fencing tokens are written back to a majority.
    pub fn is_fencing(&self) -> bool {
        self.fencing
    }

    /// The configured key prefix.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The configuration as a URL that [`from_url`](Self::from_url) turns back into it
    /// (password included; see `Debug` for a redacted form). `None` when an address is
    /// malformed. The connect timeout and TLS have no URL form.
    pub fn url(&self) -> Option<String> {
        self.to_lock_url().map(|url| url.to_string())
    }

    /// The per-node builders (same credentials, database, prefix; the connect timeout).
    pub(crate) fn node_builders(&self) -> Vec<RedisBuilder> {
        self.addrs
            .iter()
            .map(|addr| {
                let mut node = RedisBuilder::new(addr.clone())
                    .database(self.db)
                    .prefix(self.prefix.clone())
                    .timeout(self.connect_timeout)
                    .tls(self.tls);
                if let Some(user) = &self.username {
                    node = node.username(user.clone());
                }
                if let Some(password) = &self.password {
                    node = node.password(password.clone());
                }
                node
            })
            .collect()
    }

    /// Validates what `build` needs, before any I/O; `shown` is the URL for messages.
    pub(crate) fn check(&self, shown: &str) -> Result<()> {
        let refuse = |reason: String| Err(Error::invalid_url(shown, reason));
        if self.addrs.is_empty() {
            return refuse("a Redlock needs at least one node".into());
        }
        let hosts = self.hosts().map_err(|(addr, reason)| {
            Error::invalid_url(shown, format!("node address {addr:?}: {reason}"))
        })?;
        // The same server listed twice would vote twice: a majority of the list would no
        // longer be a majority of the servers.
        for (i, host) in hosts.iter().enumerate() {
            if hosts[..i].contains(host) {
                return refuse(format!("node {host} is listed twice"));
            }
        }
        if !(0.0..1.0).contains(&self.drift_factor) {
            return refuse(format!(
                "parameter `drift` must be a number in [0, 1), not {}",
                self.drift_factor
            ));
        }
        if self.node_timeout.is_some_and(|t| t.is_zero()) {
            return refuse("parameter `timeout` must be greater than zero".into());
        }
        if self.connect_timeout.is_zero() {
            return refuse("the connect timeout must be greater than zero".into());
        }
        Ok(())
    }

    /// Every address parsed by lock-core's address rules, or the first bad one and why.
    fn hosts(&self) -> std::result::Result<Vec<HostPort>, (String, String)> {
        self.addrs
            .iter()
            .map(|addr| {
                HostPort::parse(addr, DEFAULT_PORT).map_err(|reason| (addr.clone(), reason))
            })
            .collect()
    }

    /// The URL with the password hidden, for messages and `Debug`.
    pub(crate) fn redacted(&self) -> String {
        match self.to_lock_url() {
            Some(url) => url.redacted(),
            None => format!("<invalid node address in {:?}>", self.addrs),
        }
    }

    fn to_lock_url(&self) -> Option<LockUrl> {
        let hosts = self.hosts().ok()?;
        let mut params = Vec::new();
        if self.drift_factor != DEFAULT_DRIFT_FACTOR {
            params.push(("drift".to_owned(), self.drift_factor.to_string()));
        }
        if self.prefix != DEFAULT_PREFIX {
            params.push(("prefix".to_owned(), self.prefix.clone()));
        }
        if let Some(timeout) = self.node_timeout {
            params.push(("timeout".to_owned(), format_duration(timeout)));
        }
        if !self.fencing {
            params.push(("fencing".to_owned(), "false".to_owned()));
        }
        Some(LockUrl {
            scheme: "redlock".to_owned(),
            userinfo: UserInfo::from_parts(
                self.username.as_deref().filter(|u| !u.is_empty()),
                self.password.as_deref(),
            ),
            hosts: hosts.into_iter().map(Host::from).collect(),
            path: database_path(self.db),
            params,
        })
    }
}

impl fmt::Debug for RedlockBuilder {
    /// `RedlockBuilder(redlock://:***@h1:6379,h2:6379?…)`: the password never appears.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedlockBuilder")
            .field(&format_args!("{}", self.redacted()))
            .finish()
    }
}

#[cfg(test)]
mod tests;
