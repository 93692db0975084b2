//! Where the server is and how to talk to it: [`RedisBuilder`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lock_core::url::{format_duration, parse_digits, Host, HostPort, TlsFiles, UserInfo};
use lock_core::{Error, LockUrl, Result};

use crate::sentinel::url::{SentinelConfig, SENTINEL_SCHEME};

/// The port of a Redis server when an address or URL names none.
pub const DEFAULT_PORT: u16 = 6379;
/// The key prefix used when none is given.
pub const DEFAULT_PREFIX: &str = "distlock:";
/// The per-operation timeout used when none is given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// The URL parameters a `redis://` or `rediss://` URL may carry (`ca`, `cert` and `key`
/// only `rediss://`).
pub const URL_PARAMS: &[&str] = &["prefix", "timeout", "ca", "cert", "key"];

/// Typed configuration of one Redis server, and the way to connect to it.
///
/// Built from an address with [`RedisBackend::builder`](crate::RedisBackend::builder) (or [`RedisBuilder::new`]) and
/// setters, or from a URL with [`RedisBuilder::from_url`]; nothing is checked or contacted
/// until [`build`](Self::build).
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
///     .database(2)
///     .prefix("myapp:locks:")
///     .timeout(Duration::from_millis(500))
///     .build()
///     .await?;
/// let locker = lock_core::Locker::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq)]
///
/// A setter is named after its property, the same name on every distlock builder
/// (`prefix`, `timeout`, `database`, `username`, `password`, `tls`, `ca_file`,
/// `client_cert`); its getter is `get_<property>` (as tokio-postgres's `Config`).
#[must_use = "setters return the changed value; it does nothing until used"]
pub struct RedisBuilder {
    /// The parsed `host:port`, or the reason `addr` could not be parsed (reported by `build`).
    addr: std::result::Result<HostPort, (String, String)>,
    tls: bool,
    /// PEM files: the CA to trust instead of the system's roots, and the client certificate
    /// and key for servers that demand one (`tls-auth-clients yes`).
    tls_files: TlsFiles,
    username: Option<String>,
    password: Option<String>,
    db: u32,
    prefix: String,
    timeout: Duration,
    /// Sentinel mode: the master is the one these sentinels name (`sentinel.rs`).
    sentinel: Option<SentinelConfig>,
    /// Redis Cluster: every seed node (the first is also `addr`); `None` for one server.
    seeds: Option<Vec<HostPort>>,
    /// Group concurrent acquires and releases into one script call (default on).
    grouping: bool,
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
            tls_files: TlsFiles::default(),
            username: None,
            password: None,
            db: 0,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            sentinel: None,
            seeds: None,
            grouping: true,
        }
    }

    /// The configuration a `redis://` or `rediss://` URL describes:
    /// `redis[s]://[user[:password]@]host[:port][/db][?prefix=…&timeout=…]`, default port
    /// 6379, database 0 unless the path names one. `rediss://` also takes `ca=PATH` (a PEM
    /// file of the CA certificates to trust instead of the system's roots) and
    /// `cert=PATH&key=PATH` (a client certificate and its key, both PEM, for a server that
    /// demands one).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for another scheme, no host or several (several nodes are
    /// `redlock://`), a path that is not a database index, an unknown parameter, a
    /// `timeout` that is not a positive duration such as `500ms` or `2s`, `ca`, `cert` or
    /// `key` on `redis://`, or `cert` without `key` (or the reverse).
    ///
    /// `redis+sentinel://[user[:password]@]host[:port],…/<master-name>[/db][?…]` names
    /// the master through its sentinels (default port 26379; see
    /// [`sentinel`](Self::sentinel)); it also takes `sentinel_user` and
    /// `sentinel_password`, the sentinels' own credentials (the user info is the
    /// master's). No sentinel, no master name or a malformed database index is
    /// [`Error::InvalidUrl`].
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        if url.scheme == SENTINEL_SCHEME {
            let (sentinel, builder) = SentinelConfig::from_url(url, Self::from_url)?;
            let builder = builder.with_sentinel(sentinel);
            builder.check()?;
            return Ok(builder);
        }
        let tls = match url.scheme.as_str() {
            "redis" => false,
            "rediss" => true,
            "redis+cluster" => return Self::from_cluster_url(url),
            other => {
                return Err(url.invalid(format!(
                    "the Redis backend takes redis:// or rediss:// URLs (or redis+cluster://), not {other}://"
                )))
            }
        };
        let host = match url.hosts.as_slice() {
            [host] => host.with_default_port(DEFAULT_PORT),
            [] => return Err(url.invalid(format!("{}:// needs a host", url.scheme))),
            _ => {
                return Err(url.invalid(format!(
                    "{}:// names one host; use redlock:// for several nodes",
                    url.scheme
                )))
            }
        };
        let db = url_database(url)?;
        url.check_params(URL_PARAMS)?;
        let mut builder = RedisBuilder {
            addr: Ok(host),
            tls,
            tls_files: TlsFiles::from_url(url)?,
            username: url.username().map(str::to_owned),
            password: url.password().map(str::to_owned),
            db,
            prefix: url.param("prefix").unwrap_or(DEFAULT_PREFIX).to_owned(),
            timeout: DEFAULT_TIMEOUT,
            sentinel: None,
            seeds: None,
            grouping: true,
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

    /// Trusts the CA certificates in the PEM file at `path` instead of the system's root
    /// certificates (a private CA, a self-signed server). Needs [`tls`](Self::tls); the
    /// file is read when connecting.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_files.set_ca_file(path);
        self
    }

    /// Presents the client certificate in the PEM file `cert`, with its private key in
    /// `key`, to a server that demands one (`tls-auth-clients yes`). Needs
    /// [`tls`](Self::tls); the files are read when connecting.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_files.set_client_cert(cert, key);
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
    pub fn database(mut self, database: u32) -> Self {
        self.db = database;
        self
    }

    /// The database index: the old name of [`database`](Self::database).
    #[deprecated(since = "0.1.0", note = "renamed `database`, as on every builder")]
    pub fn db(self, db: u32) -> Self {
        self.database(db)
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

    /// Whether acquires and releases that arrive while earlier calls are on their way go
    /// together as one script call (`lock_core::group`; on a cluster, only those of one
    /// hash slot, with up to 16 calls on their way). Default on for one server, off for a
    /// cluster; off, every request is its own call and none waits for another (requests
    /// on one key still reach the server in order).
    pub fn grouping(mut self, on: bool) -> Self {
        self.grouping = on;
        self
    }

    /// Whether grouping is on (see [`grouping`](Self::grouping)).
    pub fn is_grouping(&self) -> bool {
        self.grouping
    }

    /// Whether TLS is on.
    pub fn is_tls(&self) -> bool {
        self.tls
    }

    /// The CA file trusted instead of the system's roots, if any.
    pub fn get_ca_file(&self) -> Option<&Path> {
        self.tls_files.ca_file()
    }

    /// The client certificate and key files, if any.
    pub fn get_client_cert(&self) -> Option<(&Path, &Path)> {
        self.tls_files.client_cert()
    }

    /// The configured prefix.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The configured database index.
    pub fn get_database(&self) -> u32 {
        self.db
    }

    /// The configured operation timeout.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// The configuration as a URL that [`from_url`](Self::from_url) turns back into it
    /// (password included; see `Debug` for a redacted form). `None` when the address given to
    /// [`new`](Self::new) is malformed.
    pub fn url(&self) -> Option<String> {
        self.to_lock_url().map(|url| url.to_string())
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
        if let Some(sentinel) = &self.sentinel {
            sentinel.check(&self.redacted(), self.tls)?;
        }
        self.check_cluster()?;
        if !self.tls && !self.tls_files.is_empty() {
            return Err(Error::invalid_url(
                &self.redacted(),
                "a CA file or a client certificate needs TLS (rediss://)",
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

    pub(crate) fn with_sentinel(mut self, sentinel: SentinelConfig) -> Self {
        self.sentinel = Some(sentinel);
        self
    }

    pub(crate) fn sentinel_config(&self) -> Option<&SentinelConfig> {
        self.sentinel.as_ref()
    }

    pub(crate) fn sentinel_config_mut(&mut self) -> Option<&mut SentinelConfig> {
        self.sentinel.as_mut()
    }

    pub(crate) fn credentials(&self) -> (Option<&str>, Option<&str>) {
        (self.username.as_deref(), self.password.as_deref())
    }

    /// The URL with the password hidden, for messages and `Debug`.
    pub(crate) fn redacted(&self) -> String {
        match self.to_lock_url() {
            Some(url) => url.redacted(),
            None => match (&self.addr, &self.sentinel) {
                (_, Some(sentinel)) => sentinel.describe_invalid(),
                (Err((addr, _)), None) => format!("<invalid address {addr:?}>"),
                (Ok(_), None) => unreachable!("to_lock_url only fails on a bad address"),
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
        params.extend(self.tls_files.params());
        let userinfo = UserInfo::from_parts(
            self.username.as_deref().filter(|u| !u.is_empty()),
            self.password.as_deref(),
        );
        if let Some(sentinel) = &self.sentinel {
            return sentinel.lock_url(userinfo, self.db, params);
        }
        if let Some(seeds) = &self.seeds {
            return Some(self.cluster_url(seeds, params));
        }
        Some(LockUrl {
            scheme: if self.tls { "rediss" } else { "redis" }.to_owned(),
            userinfo,
            hosts: vec![Host::from(host.clone())],
            path: database_path(self.db),
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

/// The database index a Redis URL's path names: `/N` with `N` a `u32` in decimal digits;
/// 0 for an empty path or `/`. Shared by `redis://`, `rediss://` and `redlock://`.
///
/// # Errors
/// [`Error::InvalidUrl`] naming the index when the path is anything else.
pub fn url_database(url: &LockUrl) -> Result<u32> {
    let index = url.path.strip_prefix('/').unwrap_or(&url.path);
    if index.is_empty() {
        return Ok(0);
    }
    parse_digits::<u32>(index).ok_or_else(|| {
        url.invalid(format!(
            "database index `{index}` in the path is not a number 0..={}",
            u32::MAX
        ))
    })
}

/// The path that names database `db` in a URL: none for 0, the default.
pub fn database_path(db: u32) -> String {
    if db == 0 {
        String::new()
    } else {
        format!("/{db}")
    }
}

/// Parses `host[:port]` by lock-core's address rules; the error keeps the text and why.
fn parse_addr(addr: String) -> std::result::Result<HostPort, (String, String)> {
    HostPort::parse(&addr, DEFAULT_PORT).map_err(|reason| (addr, reason))
}

mod cluster;
#[cfg(test)]
mod tests;
