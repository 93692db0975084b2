//! Where the ensemble is and how to talk to it: [`ZooKeeperBuilder`].

use std::fmt;
use std::time::Duration;

use lock_core::url::{format_duration, HostPort};
use lock_core::{Error, LockUrl, Result};

/// The client port of a ZooKeeper server when an address or URL names none.
pub const DEFAULT_PORT: u16 = 2181;
/// The node under which the keys' nodes live when the URL has no path.
pub const DEFAULT_ROOT: &str = "/distlock";
/// The session timeout asked for when none is given: the Locker's default TTL (30 s) fits
/// in it (see [`ZooKeeperBuilder::session_timeout`]).
pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(30);
/// The per-operation timeout used when none is given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// The URL parameters a `zookeeper://` URL may carry.
pub const URL_PARAMS: &[&str] = &["session_timeout", "timeout"];

/// Typed configuration of one ZooKeeper ensemble, and the way to connect to it.
///
/// Built from a connect string with [`ZooKeeperBackend::builder`](crate::ZooKeeperBackend::builder)
/// (or [`ZooKeeperBuilder::new`]) and setters, or from a URL with
/// [`ZooKeeperBuilder::from_url`]; nothing is checked or contacted until
/// [`build`](Self::build).
///
/// `Debug` shows the configuration as a URL.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_zookeeper::ZooKeeperBackend;
///
/// let backend = ZooKeeperBackend::builder("zk1:2181,zk2:2181,zk3:2181")
///     .root("/myapp/locks")
///     .session_timeout(Duration::from_secs(20))
///     .timeout(Duration::from_millis(500))
///     .build()
///     .await?;
/// let locker = lock_core::Locker::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq)]
#[must_use = "setters return the changed value; it does nothing until used"]
pub struct ZooKeeperBuilder {
    /// The parsed members, or the entry that could not be parsed and why (reported by
    /// `build`).
    hosts: std::result::Result<Vec<HostPort>, (String, String)>,
    root: String,
    session_timeout: Duration,
    timeout: Duration,
}

impl ZooKeeperBuilder {
    /// A configuration for the ensemble whose members `hosts` lists
    /// (`host[:port],host[:port],…`, default port 2181), keys under `/distlock`, a 30 s
    /// session timeout and a 2 s operation timeout. A malformed list is reported by `build`
    /// as [`Error::InvalidUrl`].
    pub fn new(hosts: impl Into<String>) -> Self {
        let hosts = hosts.into();
        let parsed = hosts
            .split(',')
            .map(|entry| {
                HostPort::parse(entry.trim(), DEFAULT_PORT)
                    .map_err(|reason| (hosts.clone(), reason))
            })
            .collect();
        ZooKeeperBuilder {
            hosts: parsed,
            root: DEFAULT_ROOT.to_owned(),
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The configuration a `zookeeper://host[:port],host[:port],…[/root][?session_timeout=…&timeout=…]`
    /// URL describes: the members (default port 2181), the node under which keys live (the
    /// path, default `/distlock`; it acts as a chroot: nothing outside it is touched), the
    /// session timeout to ask for and the per-operation timeout.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for another scheme, no host, user info, an unknown parameter,
    /// a path that is not a valid node path (see [`root`](Self::root)), or timeouts that are
    /// not positive durations such as `500ms` or `20s`.
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        if url.scheme != "zookeeper" {
            return Err(url.invalid(format!(
                "the ZooKeeper backend takes zookeeper:// URLs, not {}://",
                url.scheme
            )));
        }
        if url.hosts.is_empty() {
            return Err(url.invalid("zookeeper:// needs at least one host"));
        }
        if url.userinfo.is_some() {
            return Err(url.invalid("zookeeper:// takes no user name or password"));
        }
        url.check_params(URL_PARAMS)?;
        let mut builder = ZooKeeperBuilder {
            hosts: Ok(url.host_ports(DEFAULT_PORT)),
            root: if url.path.is_empty() || url.path == "/" {
                DEFAULT_ROOT.to_owned()
            } else {
                url.path.clone()
            },
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            timeout: DEFAULT_TIMEOUT,
        };
        if let Some(t) = url.duration_param("session_timeout")? {
            builder.session_timeout = t;
        }
        if let Some(t) = url.duration_param("timeout")? {
            builder.timeout = t;
        }
        builder.check().map_err(|reason| url.invalid(reason))?;
        Ok(builder)
    }

    /// The node under which the keys' nodes live (default `/distlock`): an absolute node
    /// path without a trailing `/`, empty segments, `.` or `..`, created with its parents
    /// when missing. Nothing outside it is read or written.
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// The session timeout to ask the ensemble for (default 30 s); the servers grant one
    /// between their `minSessionTimeout` and `maxSessionTimeout` (by default 2 and 20
    /// ticks). The granted timeout is the backend's longest lock TTL: a grant's validity
    /// never reaches past the moment the servers could expire the session.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Bound on each request, and on connecting (default 2 s).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The configured session timeout (the one asked for).
    pub fn get_session_timeout(&self) -> Duration {
        self.session_timeout
    }

    /// The configured operation timeout.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// The configured root node.
    pub fn get_root(&self) -> &str {
        &self.root
    }

    /// The `zookeeper://` URL of this configuration, as [`from_url`](Self::from_url) reads
    /// it back; `None` when the host list is malformed.
    pub fn url(&self) -> Option<String> {
        let hosts = self.hosts.as_ref().ok()?;
        let hosts: Vec<String> = hosts.iter().map(ToString::to_string).collect();
        let mut url = format!("zookeeper://{}", hosts.join(","));
        if self.root != DEFAULT_ROOT {
            url.push_str(&self.root);
        }
        let mut params = Vec::new();
        if self.session_timeout != DEFAULT_SESSION_TIMEOUT {
            params.push(format!(
                "session_timeout={}",
                format_duration(self.session_timeout)
            ));
        }
        if self.timeout != DEFAULT_TIMEOUT {
            params.push(format!("timeout={}", format_duration(self.timeout)));
        }
        if !params.is_empty() {
            url.push('?');
            url.push_str(&params.join("&"));
        }
        Some(url)
    }

    /// Checks the configuration; the reason when it is refused.
    pub(crate) fn check(&self) -> std::result::Result<(), String> {
        if let Err((hosts, reason)) = &self.hosts {
            return Err(format!("bad member list `{hosts}`: {reason}"));
        }
        if self.timeout.is_zero() {
            return Err("parameter `timeout` must be greater than zero".into());
        }
        if self.session_timeout < Duration::from_millis(10) {
            return Err("parameter `session_timeout` must be at least 10ms".into());
        }
        if self.session_timeout > Duration::from_secs(24 * 3600) {
            return Err("parameter `session_timeout` must be at most 24h".into());
        }
        check_root(&self.root)
    }

    /// The checked configuration, or [`Error::InvalidUrl`].
    pub(crate) fn checked(&self) -> Result<()> {
        self.check()
            .map_err(|reason| Error::invalid_url(&self.redacted(), reason))
    }

    /// The connect string the client takes: `host:port,host:port`.
    pub(crate) fn connect_string(&self) -> String {
        let hosts = self.hosts.as_deref().unwrap_or_default();
        let hosts: Vec<String> = hosts.iter().map(ToString::to_string).collect();
        hosts.join(",")
    }

    /// The configuration for messages.
    pub(crate) fn redacted(&self) -> String {
        self.url()
            .unwrap_or_else(|| "zookeeper://(malformed)".into())
    }
}

impl fmt::Debug for ZooKeeperBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ZooKeeperBuilder")
            .field(&self.redacted())
            .finish()
    }
}

/// An absolute node path with no trailing `/`, empty, `.` or `..` segment, and not under
/// `/zookeeper` (the server's own).
fn check_root(root: &str) -> std::result::Result<(), String> {
    let bad = |why: &str| Err(format!("root node `{root}` {why}"));
    let Some(rest) = root.strip_prefix('/') else {
        return bad("must start with `/`");
    };
    if rest.is_empty() {
        return bad("must name a node below `/`");
    }
    for segment in rest.split('/') {
        if segment.is_empty() || segment == "." || segment == ".." {
            return bad("has an empty, `.` or `..` segment");
        }
        if segment.chars().any(|c| c.is_control()) {
            return bad("has a control character");
        }
    }
    if rest == "zookeeper" || rest.starts_with("zookeeper/") {
        return bad("is inside the server's own `/zookeeper`");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Result<ZooKeeperBuilder> {
        ZooKeeperBuilder::from_url(&LockUrl::parse(s)?)
    }

    #[test]
    fn urls_are_read_and_written_back() {
        let b = url("zookeeper://a:2182,b/app/locks?session_timeout=20s&timeout=500ms").unwrap();
        assert_eq!(b.connect_string(), "a:2182,b:2181");
        assert_eq!(b.get_root(), "/app/locks");
        assert_eq!(b.get_session_timeout(), Duration::from_secs(20));
        assert_eq!(b.get_timeout(), Duration::from_millis(500));
        assert_eq!(url(&b.url().unwrap()).unwrap(), b);
        let d = url("zookeeper://h").unwrap();
        assert_eq!(d.get_root(), DEFAULT_ROOT);
        assert_eq!(d.url().unwrap(), "zookeeper://h:2181");
    }

    #[test]
    fn bad_urls_are_refused() {
        for bad in [
            "zookeeper://",
            "zookeeper://u:p@h",
            "zookeeper://h?table=x",
            "zookeeper://h?timeout=0s",
            "zookeeper://h?session_timeout=1ms",
            "zookeeper://h?session_timeout=abc",
            "zookeeper://h/a//b",
            "zookeeper://h/a/../b",
            "zookeeper://h/zookeeper/x",
            "redis://h",
        ] {
            assert!(
                matches!(url(bad), Err(Error::InvalidUrl { .. })),
                "{bad} accepted"
            );
        }
    }
}
