//! Where the server is and how to talk to it: [`RedisBuilder`].

use std::fmt;
use std::time::Duration;

use lock_core::url::{format_duration, HostPort};
use lock_core::{Error, LockUrl, Result, Scheme};

use crate::{RedisBackend, RedisNode};

/// The key prefix used when none is given.
pub const DEFAULT_PREFIX: &str = "distlock:";
/// The per-operation timeout used when none is given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// The URL parameters a `redis://` or `rediss://` URL may carry.
pub const URL_PARAMS: &[&str] = &["prefix", "timeout"];

/// Typed configuration of one Redis server, and the way to connect to it.
///
/// Built from an address with [`RedisBackend::builder`] (or [`RedisBuilder::new`]) and
/// setters, or from a URL with [`RedisBuilder::from_url`]; nothing is checked or contacted
/// until [`build`](Self::build) / [`build_node`](Self::build_node).
///
/// `Debug` shows the configuration as a URL with the password replaced by `***`.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_redis::RedisBackend;
///
/// let backend = RedisBackend::builder("127.0.0.1:6379")
///     .password("s3cret")
///     .db(2)
///     .prefix("myapp:locks:")
///     .timeout(Duration::from_millis(500))
///     .build()
///     .await?;
/// let locker = lock_core::Locker::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct RedisBuilder {
    /// The parsed `host:port`, or the reason `addr` could not be parsed (reported by `build`).
    addr: std::result::Result<HostPort, (String, String)>,
    tls: bool,
    username: Option<String>,
    password: Option<String>,
    db: u32,
    prefix: String,
    timeout: Duration,
}

impl RedisBuilder {
    /// A configuration for the server at `addr` (`host`, `host:port`, `[v6]:port`; the
    /// default port is 6379), without TLS or credentials, database 0, prefix `distlock:` and
    /// a 1 s operation timeout. A malformed `addr` is reported by `build` as
    /// [`Error::InvalidUrl`].
    pub fn new(addr: impl Into<String>) -> Self {
        RedisBuilder {
            addr: parse_addr(addr.into()),
            tls: false,
            username: None,
            password: None,
            db: 0,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The configuration a `redis://` or `rediss://` URL describes:
    /// `redis[s]://[user[:password]@]host[:port][/db][?prefix=…&timeout=…]`.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for another scheme, an unknown parameter, a `timeout` that is
    /// not a positive duration such as `500ms` or `2s`.
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        let tls = match url.scheme {
            Scheme::Redis => false,
            Scheme::Rediss => true,
            other => {
                return Err(Error::invalid_url(
                    &url.redacted(),
                    format!("the Redis backend takes redis:// or rediss:// URLs, not {other}://"),
                ))
            }
        };
        url.check_params(URL_PARAMS)?;
        let [host] = url.hosts.as_slice() else {
            return Err(Error::invalid_url(
                &url.redacted(),
                "a redis:// URL names exactly one host (several nodes are redlock://)",
            ));
        };
        let mut builder = RedisBuilder {
            addr: Ok(host.clone()),
            tls,
            username: url.username.clone(),
            password: url.password.clone(),
            db: url.db.unwrap_or(0),
            prefix: url.param("prefix").unwrap_or(DEFAULT_PREFIX).to_owned(),
            timeout: DEFAULT_TIMEOUT,
        };
        if let Some(timeout) = url.duration_param("timeout")? {
            builder.timeout = timeout;
        }
        builder.check()?;
        Ok(builder)
    }

    /// Connects over TLS (`rediss://`) when `on`, verifying the server's certificate against
    /// the system's root certificates.
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }

    /// The ACL user name (Redis 6+); without one the `default` user is used.
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// The password (`AUTH`).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// The database index (`SELECT`); default 0.
    pub fn db(mut self, db: u32) -> Self {
        self.db = db;
        self
    }

    /// The prefix of every key and of the release channel; default `distlock:`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The bound on every operation, connecting included; default 1 s. When it passes the
    /// operation fails with the transient [`Error::Unavailable`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Whether TLS is on.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The configured prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The configured database index.
    pub fn database(&self) -> u32 {
        self.db
    }

    /// The configured operation timeout.
    pub fn operation_timeout(&self) -> Duration {
        self.timeout
    }

    /// The configuration as a URL that [`from_url`](Self::from_url) turns back into it
    /// (password included; see `Debug` for a redacted form). `None` when the address given to
    /// [`new`](Self::new) is malformed.
    pub fn url(&self) -> Option<String> {
        self.to_lock_url().map(|url| url.to_string())
    }

    /// Connects, checks that the server answers `PING` like Redis, and returns the backend.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for a malformed address or a zero timeout;
    /// [`Error::Unavailable`] when the server cannot be reached within the timeout;
    /// [`Error::Backend`] when it refuses the credentials or the database, or does not speak
    /// the Redis protocol.
    pub async fn build(self) -> Result<RedisBackend> {
        Ok(RedisBackend::from_node(self.build_node().await?))
    }

    /// Like [`build`](Self::build), but returns the bare [`RedisNode`] (for composing several
    /// servers, as Redlock does).
    ///
    /// # Errors
    /// As [`build`](Self::build).
    pub async fn build_node(self) -> Result<RedisNode> {
        self.check()?;
        RedisNode::connect(self).await
    }

    /// Validates what `build` needs, before any I/O.
    pub(crate) fn check(&self) -> Result<()> {
        if let Err((addr, reason)) = &self.addr {
            return Err(Error::invalid_url(addr, reason.clone()));
        }
        if self.timeout.is_zero() {
            return Err(Error::invalid_url(
                &self.redacted(),
                "parameter `timeout` must be greater than zero",
            ));
        }
        #[cfg(not(feature = "tls"))]
        if self.tls {
            return Err(Error::invalid_url(
                &self.redacted(),
                "rediss:// needs the `tls` feature of lock-redis, which is not compiled in",
            ));
        }
        Ok(())
    }

    pub(crate) fn host_port(&self) -> Option<&HostPort> {
        self.addr.as_ref().ok()
    }

    pub(crate) fn credentials(&self) -> (Option<&str>, Option<&str>) {
        (self.username.as_deref(), self.password.as_deref())
    }

    /// The URL with the password hidden, for messages and `Debug`.
    pub(crate) fn redacted(&self) -> String {
        match self.to_lock_url() {
            Some(url) => url.redacted(),
            None => match &self.addr {
                Err((addr, _)) => format!("<invalid address {addr:?}>"),
                Ok(_) => unreachable!("to_lock_url only fails on a bad address"),
            },
        }
    }

    fn to_lock_url(&self) -> Option<LockUrl> {
        let host = self.addr.as_ref().ok()?;
        let mut params = Vec::new();
        if self.prefix != DEFAULT_PREFIX {
            params.push(("prefix".to_owned(), self.prefix.clone()));
        }
        if self.timeout != DEFAULT_TIMEOUT {
            params.push(("timeout".to_owned(), format_duration(self.timeout)));
        }
        Some(LockUrl {
            scheme: if self.tls {
                Scheme::Rediss
            } else {
                Scheme::Redis
            },
            username: self.username.clone().filter(|u| !u.is_empty()),
            password: self.password.clone(),
            hosts: vec![host.clone()],
            db: (self.db != 0).then_some(self.db),
            params,
        })
    }
}

impl fmt::Debug for RedisBuilder {
    /// `RedisBuilder("redis://:***@host:port/db?…")`: the password never appears.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedisBuilder")
            .field(&format_args!("{}", self.redacted()))
            .finish()
    }
}

/// Parses `host[:port]` with the URL rules of lock-core; the error keeps the text and why.
fn parse_addr(addr: String) -> std::result::Result<HostPort, (String, String)> {
    let refuse = |reason: String| Err((addr.clone(), reason));
    if addr.contains(['@', '/', '?', ',']) {
        return refuse("expected `host` or `host:port`".to_owned());
    }
    match LockUrl::parse(&format!("redis://{addr}")) {
        Ok(url) => match url.hosts.into_iter().next() {
            Some(host) => Ok(host),
            None => refuse("expected `host` or `host:port`".to_owned()),
        },
        Err(Error::InvalidUrl { reason, .. }) => refuse(reason),
        Err(other) => refuse(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(url: &str) -> Result<RedisBuilder> {
        RedisBuilder::from_url(&LockUrl::parse(url)?)
    }

    #[test]
    fn urls_give_the_configuration() {
        let b = from("redis://127.0.0.1:7000").unwrap();
        assert_eq!(b.host_port().unwrap().to_string(), "127.0.0.1:7000");
        assert!(!b.is_tls());
        assert_eq!(b.credentials(), (None, None));
        assert_eq!(b.database(), 0);
        assert_eq!(b.key_prefix(), "distlock:");
        assert_eq!(b.operation_timeout(), Duration::from_secs(1));

        let b =
            from("redis://alice:p%40ss@cache.example:6380/3?prefix=app%3Alocks%3A&timeout=250ms")
                .unwrap();
        assert!(!b.is_tls());
        assert_eq!(b.credentials(), (Some("alice"), Some("p@ss")));
        assert_eq!(b.host_port().unwrap().to_string(), "cache.example:6380");
        assert_eq!(b.database(), 3);
        assert_eq!(b.key_prefix(), "app:locks:");
        assert_eq!(b.operation_timeout(), Duration::from_millis(250));

        let b = from("redis://[::1]").unwrap();
        assert_eq!(b.host_port().unwrap().to_string(), "[::1]:6379");
        let b = from("redis://h?prefix=").unwrap();
        assert_eq!(b.key_prefix(), "");
    }

    #[test]
    fn bad_urls_are_invalid_url_errors() {
        for (url, needle) in [
            ("redis://h?foo=1", "unknown parameter `foo`"),
            ("redis://h?timeout=abc", "timeout"),
            ("redis://h?timeout=5", "no unit"),
            ("redis://h?timeout=0ms", "greater than zero"),
            ("redis://h1,h2", "redlock"),
            ("redis://h:99999", "port"),
            ("redis://h/notanumber", ""),
            ("memory://", "redis:// or rediss://"),
            ("etcd://h:2379", "redis:// or rediss://"),
            ("redis://:secret@h?bogus=1", "bogus"),
        ] {
            match from(url) {
                Err(Error::InvalidUrl { url: shown, reason }) => {
                    assert!(reason.contains(needle), "{url}: {reason}");
                    assert!(
                        !shown.contains("secret"),
                        "{url}: password shown in {shown}"
                    );
                }
                other => panic!("{url}: expected InvalidUrl, got {other:?}"),
            }
        }
    }

    #[test]
    fn builder_setters_and_round_trip() {
        let b = RedisBuilder::new("10.0.0.5:6390")
            .username("bob")
            .password("hunter2")
            .db(7)
            .prefix("x:")
            .timeout(Duration::from_micros(1500));
        assert!(b.check().is_ok());
        let url = b.url().unwrap();
        assert_eq!(
            url,
            "redis://bob:hunter2@10.0.0.5:6390/7?prefix=x%3A&timeout=1.5ms"
        );
        assert_eq!(from(&url).unwrap(), b);
        let plain = RedisBuilder::new("localhost");
        assert_eq!(plain.url().unwrap(), "redis://localhost:6379");
        assert_eq!(from(&plain.url().unwrap()).unwrap(), plain);
    }

    /// `rediss://` gives a TLS configuration, or a clear refusal without the `tls` feature.
    #[test]
    fn rediss_means_tls() {
        let url = "rediss://alice:pw@cache.example:6380/3";
        let built = RedisBuilder::new("cache.example:6380")
            .username("alice")
            .password("pw")
            .db(3)
            .tls(true);
        assert_eq!(built.url().unwrap(), url);
        #[cfg(feature = "tls")]
        {
            let b = from(url).unwrap();
            assert!(b.is_tls());
            assert_eq!(b, built);
            assert!(built.check().is_ok());
        }
        #[cfg(not(feature = "tls"))]
        for result in [from(url), built.check().map(|()| built.clone())] {
            match result {
                Err(Error::InvalidUrl { reason, .. }) => assert!(reason.contains("`tls`")),
                other => panic!("expected InvalidUrl, got {other:?}"),
            }
        }
    }

    #[test]
    fn bad_addresses_and_timeouts_are_reported_by_check() {
        for addr in [
            "",
            "a b",
            "host:0",
            "host:port",
            "user@host",
            "h/1",
            "h1,h2",
            "[::1",
        ] {
            match RedisBuilder::new(addr).check() {
                Err(Error::InvalidUrl { .. }) => {}
                other => panic!("{addr:?}: expected InvalidUrl, got {other:?}"),
            }
            assert!(RedisBuilder::new(addr).url().is_none());
            assert!(format!("{:?}", RedisBuilder::new(addr)).contains("invalid address"));
        }
        assert!(matches!(
            RedisBuilder::new("h").timeout(Duration::ZERO).check(),
            Err(Error::InvalidUrl { .. })
        ));
    }

    #[test]
    fn debug_hides_the_password() {
        let b = RedisBuilder::new("h:1").username("u").password("topsecret");
        let shown = format!("{b:?}");
        assert!(!shown.contains("topsecret"), "{shown}");
        assert!(shown.contains("u:***@h:1"), "{shown}");
        let b = from("redis://:topsecret@h:1/2?timeout=2s").unwrap();
        let shown = format!("{b:?}");
        assert!(!shown.contains("topsecret"), "{shown}");
        assert_eq!(shown, r#"RedisBuilder(redis://:***@h:1/2?timeout=2s)"#);
    }

    #[test]
    fn durations_format_back_exactly() {
        for d in [
            Duration::from_secs(2),
            Duration::from_millis(250),
            Duration::from_micros(1500),
            Duration::from_nanos(1),
            Duration::from_nanos(1_000_001_000),
        ] {
            let text = format_duration(d);
            assert_eq!(lock_core::url::parse_duration(&text), Ok(d), "{text}");
        }
    }
}
