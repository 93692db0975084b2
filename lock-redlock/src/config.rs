//! Where the nodes are and how the algorithm is tuned: [`RedlockBuilder`].

use std::fmt;
use std::time::Duration;

use lock_core::url::{format_duration, HostPort};
use lock_core::{Error, LockUrl, Result, Scheme};
use lock_redis::{RedisBuilder, DEFAULT_PREFIX};

use crate::RedlockBackend;

/// The clock-drift factor used when none is given: 1 % of the TTL.
pub const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// The bound on connecting to a node (and on its release subscription's requests).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The URL parameters a `redlock://` URL may carry.
pub const URL_PARAMS: &[&str] = &["drift", "prefix", "timeout", "fencing"];

/// Typed configuration of a Redlock over N independent Redis nodes, and the way to connect.
///
/// Built from node addresses with [`RedlockBackend::builder`] (or [`RedlockBuilder::new`])
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
        if url.scheme != Scheme::Redlock {
            return Err(Error::invalid_url(
                &url.redacted(),
                format!(
                    "the Redlock backend takes redlock:// URLs, not {}://",
                    url.scheme
                ),
            ));
        }
        url.check_params(URL_PARAMS)?;
        let mut builder = RedlockBuilder::new(url.hosts.iter().map(HostPort::to_string));
        builder.username = url.username.clone();
        builder.password = url.password.clone();
        builder.db = url.db.unwrap_or(0);
        if let Some(prefix) = url.param("prefix") {
            builder.prefix = prefix.to_owned();
        }
        if let Some(drift) = url.f64_param("drift")? {
            builder.drift_factor = drift;
        }
        builder.node_timeout = url.duration_param("timeout")?;
        builder.fencing = match url.param("fencing") {
            None | Some("true") => true,
            Some("false") => false,
            Some(other) => {
                return Err(Error::invalid_url(
                    &url.redacted(),
                    format!("parameter `fencing` must be `true` or `false`, not `{other}`"),
                ))
            }
        };
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
    pub fn db(mut self, db: u32) -> Self {
        self.db = db;
        self
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
    pub fn drift(&self) -> f64 {
        self.drift_factor
    }

    /// The fixed per-node timeout, `None` when derived from each TTL.
    pub fn fixed_node_timeout(&self) -> Option<Duration> {
        self.node_timeout
    }

    /// Whether fencing tokens are written back to a majority.
    pub fn is_fencing(&self) -> bool {
        self.fencing
    }

    /// The configured key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The configuration as a URL that [`from_url`](Self::from_url) turns back into it
    /// (password included; see `Debug` for a redacted form). `None` when an address is
    /// malformed. The connect timeout and TLS have no URL form.
    pub fn url(&self) -> Option<String> {
        self.to_lock_url().map(|url| url.to_string())
    }

    /// Connects to every node and returns the backend.
    ///
    /// Every node is contacted in parallel, each within the connect timeout. The backend is
    /// returned once a majority answered; nodes that could not be reached are reconnected in
    /// the background and count as failed nodes until then.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for no node, a malformed or repeated address, a drift factor
    /// outside `[0, 1)` or a zero timeout; [`Error::Backend`] when a node refuses the
    /// credentials or the database, or does not speak the Redis protocol;
    /// [`Error::QuorumNotReached`] when fewer than a majority of the nodes answered.
    pub async fn build(self) -> Result<RedlockBackend> {
        self.check(&self.redacted())?;
        RedlockBackend::connect_with(self).await
    }

    /// The per-node builders (same credentials, database, prefix; the connect timeout).
    pub(crate) fn node_builders(&self) -> Vec<RedisBuilder> {
        self.addrs
            .iter()
            .map(|addr| {
                let mut node = RedisBuilder::new(addr.clone())
                    .db(self.db)
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

    /// Every address parsed with lock-core's URL rules, or the first bad one and why.
    fn hosts(&self) -> std::result::Result<Vec<HostPort>, (String, String)> {
        self.addrs
            .iter()
            .map(|addr| {
                let bad = |reason: String| (addr.clone(), reason);
                if addr.contains(['@', '/', '?', ',']) {
                    return Err(bad("expected `host` or `host:port`".into()));
                }
                match LockUrl::parse(&format!("redis://{addr}")) {
                    Ok(url) => url
                        .hosts
                        .into_iter()
                        .next()
                        .ok_or_else(|| bad("expected `host` or `host:port`".into())),
                    Err(Error::InvalidUrl { reason, .. }) => Err(bad(reason)),
                    Err(other) => Err(bad(other.to_string())),
                }
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
            scheme: Scheme::Redlock,
            username: self.username.clone().filter(|u| !u.is_empty()),
            password: self.password.clone(),
            hosts,
            db: (self.db != 0).then_some(self.db),
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
mod tests {
    use super::*;

    fn from(url: &str) -> Result<RedlockBuilder> {
        RedlockBuilder::from_url(&LockUrl::parse(url)?)
    }

    #[test]
    fn urls_give_the_configuration() {
        let b = from("redlock://h1,h2:7000,[::1]:7001").unwrap();
        assert_eq!(b.addrs(), ["h1:6379", "h2:7000", "[::1]:7001"]);
        assert_eq!(b.drift(), DEFAULT_DRIFT_FACTOR);
        assert_eq!(b.fixed_node_timeout(), None);
        assert!(b.is_fencing());
        assert_eq!(b.key_prefix(), "distlock:");

        let b = from(
            "redlock://alice:p%40ss@h1:1,h2:2,h3:3/4?drift=0.05&prefix=app%3A&timeout=20ms&fencing=false",
        )
        .unwrap();
        assert_eq!(b.drift(), 0.05);
        assert_eq!(b.fixed_node_timeout(), Some(Duration::from_millis(20)));
        assert!(!b.is_fencing());
        assert_eq!(b.key_prefix(), "app:");
        assert_eq!(b.db, 4);
        assert_eq!(b.username.as_deref(), Some("alice"));
        assert_eq!(b.password.as_deref(), Some("p@ss"));
        let nodes = b.node_builders();
        assert_eq!(nodes.len(), 3);
        assert!(nodes
            .iter()
            .all(|n| n.key_prefix() == "app:" && n.database() == 4));
    }

    #[test]
    fn bad_urls_are_invalid_url_errors() {
        for (url, needle) in [
            ("redlock://h?foo=1", "unknown parameter `foo`"),
            ("redlock://h?drift=abc", "drift"),
            ("redlock://h?drift=1", "[0, 1)"),
            ("redlock://h?drift=-0.1", "[0, 1)"),
            ("redlock://h?timeout=5", "no unit"),
            ("redlock://h?timeout=0ms", "greater than zero"),
            ("redlock://h?fencing=yes", "`true` or `false`"),
            ("redlock://h1:1,h2:2,h1:1", "listed twice"),
            ("redlock://h1,h1:6379", "listed twice"),
            ("redis://h", "redlock://"),
            ("memory://", "redlock://"),
            ("redlock://:secret@h?bogus=1", "bogus"),
            ("redlock://:secret@h,h", "twice"),
        ] {
            match from(url) {
                Err(Error::InvalidUrl { url: shown, reason }) => {
                    assert!(reason.contains(needle), "{url}: {reason}");
                    assert!(!shown.contains("secret"), "{url}: password in {shown}");
                }
                other => panic!("{url}: expected InvalidUrl, got {other:?}"),
            }
        }
    }

    #[test]
    fn builder_checks_and_round_trips() {
        let b = RedlockBuilder::new(["10.0.0.1:7000", "10.0.0.2"])
            .username("bob")
            .password("hunter2")
            .db(3)
            .prefix("x:")
            .drift_factor(0.1)
            .node_timeout(Duration::from_micros(2500))
            .fencing(false);
        assert!(b.check("").is_ok());
        let url = b.url().unwrap();
        assert_eq!(
            url,
            "redlock://bob:hunter2@10.0.0.1:7000,10.0.0.2:6379/3?drift=0.1&prefix=x%3A&timeout=2.5ms&fencing=false"
        );
        let back = from(&url).unwrap();
        assert_eq!(back.url(), b.url());
        let plain = RedlockBuilder::new(["a"]);
        assert_eq!(plain.url().unwrap(), "redlock://a:6379");

        let refused = |b: RedlockBuilder| matches!(b.check(""), Err(Error::InvalidUrl { .. }));
        assert!(refused(RedlockBuilder::new(Vec::<String>::new())));
        assert!(refused(RedlockBuilder::new(["a b"])));
        assert!(refused(RedlockBuilder::new(["h:0"])));
        assert!(refused(RedlockBuilder::new(["u@h"])));
        assert!(refused(RedlockBuilder::new(["h"]).drift_factor(f64::NAN)));
        assert!(refused(
            RedlockBuilder::new(["h"]).node_timeout(Duration::ZERO)
        ));
        assert!(refused(
            RedlockBuilder::new(["h"]).connect_timeout(Duration::ZERO)
        ));
        assert!(RedlockBuilder::new(["h:1", "a b"]).url().is_none());
    }

    #[test]
    fn debug_hides_the_password() {
        let b = RedlockBuilder::new(["h:1", "h:2"])
            .username("u")
            .password("topsecret");
        let shown = format!("{b:?}");
        assert!(!shown.contains("topsecret"), "{shown}");
        assert_eq!(shown, "RedlockBuilder(redlock://u:***@h:1,h:2)");
        let bad = format!("{:?}", RedlockBuilder::new(["a b"]).password("topsecret"));
        assert!(!bad.contains("topsecret"), "{bad}");
    }
}
