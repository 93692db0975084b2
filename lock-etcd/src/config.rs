//! Where the cluster is and how to talk to it: [`EtcdBuilder`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use lock_core::url::TlsFiles;
use lock_core::{Error, LockUrl, Result};

/// The client port of an etcd member when a URL names none.
pub const DEFAULT_PORT: u16 = 2379;
/// The key prefix used when none is given.
pub const DEFAULT_PREFIX: &str = "distlock/";
/// The per-operation timeout used when none is given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// The URL parameters an `etcd://` URL may carry.
pub const URL_PARAMS: &[&str] = &["prefix", "timeout", "tls", "ca", "cert", "key"];

/// Typed configuration of an etcd cluster, and the way to connect to it.
///
/// Built from endpoints with [`EtcdBackend::builder`](crate::EtcdBackend::builder) (or [`EtcdBuilder::new`]) and setters,
/// or from a URL with [`EtcdBuilder::from_url`]; nothing is checked or contacted until
/// [`build`](Self::build).
///
/// `Debug` shows the configuration with the password replaced by `***`.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_etcd::EtcdBackend;
///
/// let backend = EtcdBackend::builder(["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"])
///     .username("locks")
///     .password("s3cret")
///     .prefix("myapp/locks/")
///     .timeout(Duration::from_secs(1))
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
pub struct EtcdBuilder {
    pub(crate) endpoints: Vec<String>,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) tls: bool,
    /// PEM files: the CA to trust instead of the system's roots, and the client certificate
    /// and key for members that demand one (`--client-cert-auth`).
    pub(crate) tls_files: TlsFiles,
}

impl EtcdBuilder {
    /// A configuration for the cluster members at `endpoints` (`host:port` or
    /// `http://host:port`), without credentials, prefix `distlock/` and a 2 s operation
    /// timeout. Malformed endpoints are reported by `build` as [`Error::InvalidUrl`].
    pub fn new<I, S>(endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdBuilder {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            username: None,
            password: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: DEFAULT_TIMEOUT,
            tls: false,
            tls_files: TlsFiles::default(),
        }
    }

    /// The configuration an `etcd://` URL describes:
    /// `etcd://[user:password@]host[:port][,host[:port]…][?prefix=…&timeout=…]` (default port
    /// 2379, no path).
    ///
    /// TLS (etcd's `https://` client URLs) is asked for with parameters, not a scheme:
    /// `tls=true` verifies the members against the system's root certificates; `ca=PATH` (a
    /// PEM file) trusts that CA instead; `cert=PATH&key=PATH` presents a client certificate
    /// (PEM) to members started with `--client-cert-auth`. `ca`, `cert` and `key` imply
    /// `tls=true`.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for another scheme, no host, a path, an unknown parameter, an
    /// empty `prefix`, a `timeout` that is not a positive duration such as `500ms` or `2s`,
    /// a password without a user name, a `tls` that is not `true` or `false`, `tls=false`
    /// with `ca`, `cert` or `key`, or `cert` without `key` (or the reverse).
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        if url.scheme != "etcd" {
            return Err(url.invalid(format!(
                "the etcd backend takes etcd:// URLs, not {}://",
                url.scheme
            )));
        }
        if url.hosts.is_empty() {
            return Err(url.invalid("etcd:// needs a host"));
        }
        if !matches!(url.path.as_str(), "" | "/") {
            return Err(url.invalid(format!("etcd:// takes no path (got `{}`)", url.path)));
        }
        url.check_params(URL_PARAMS)?;
        if url.username().is_none() && url.password().is_some() {
            return Err(url.invalid("etcd authentication needs a user name with the password"));
        }
        let mut builder = EtcdBuilder {
            endpoints: url
                .host_ports(DEFAULT_PORT)
                .iter()
                .map(ToString::to_string)
                .collect(),
            username: url.username().map(str::to_owned),
            password: url.password().map(str::to_owned),
            prefix: url.param("prefix").unwrap_or(DEFAULT_PREFIX).to_owned(),
            timeout: DEFAULT_TIMEOUT,
            tls: false,
            tls_files: TlsFiles::from_url(url)?,
        };
        let files = !builder.tls_files.is_empty();
        builder.tls = match url.param("tls") {
            None => files,
            Some("true") => true,
            Some("false") if files => {
                return Err(url.invalid("`ca`, `cert` and `key` need TLS, not `tls=false`"))
            }
            Some("false") => false,
            Some(other) => {
                return Err(url.invalid(format!(
                    "parameter `tls` is `true` or `false`, not `{other}`"
                )))
            }
        };
        if let Some(timeout) = url.duration_param("timeout")? {
            builder.timeout = timeout;
        }
        builder.check()?;
        Ok(builder)
    }

    /// Authenticates as `username` (etcd's own users, `etcdctl user add`), with the
    /// [`password`](Self::password).
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// The password of the [`username`](Self::username) (needs one).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// The prefix of every lock key; default `distlock/`. Must not be empty: the backend
    /// watches the whole prefix for releases.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The bound on every operation (connecting included); default 2 s. When it passes,
    /// the operation fails with the transient [`Error::Unavailable`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Connects to the members with TLS when `on` (their `https://` client URLs),
    /// verifying their certificates against the system's root certificates unless a
    /// [`ca_file`](Self::ca_file) is given.
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }

    /// Trusts the CA certificates in the PEM file at `path` instead of the system's roots,
    /// and turns TLS on. The file is read when connecting.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.tls_files.set_ca_file(path);
        self.tls = true;
        self
    }

    /// Presents the client certificate in the PEM file `cert`, with its private key in
    /// `key`, to members that demand one (`--client-cert-auth`), and turns TLS on. The files
    /// are read when connecting.
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.tls_files.set_client_cert(cert, key);
        self.tls = true;
        self
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

    /// The configured endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The configured key prefix.
    pub fn get_prefix(&self) -> &str {
        &self.prefix
    }

    /// The configured operation timeout.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// Validates what `build` needs, before any I/O.
    pub(crate) fn check(&self) -> Result<()> {
        let refuse = |reason: String| Err(Error::invalid_url(&self.redacted(), reason));
        if self.endpoints.is_empty() {
            return refuse("at least one etcd endpoint is needed".into());
        }
        if !self.tls && !self.tls_files.is_empty() {
            return refuse("a CA file or a client certificate needs TLS".into());
        }
        #[cfg(not(feature = "tls"))]
        if self.tls {
            return refuse(
                "TLS needs the `tls` feature of lock-etcd, which is not compiled in".into(),
            );
        }
        let scheme = if self.tls { "https://" } else { "http://" };
        for endpoint in &self.endpoints {
            let bare = endpoint.strip_prefix(scheme).unwrap_or(endpoint);
            let well_formed = !bare.is_empty()
                && !bare.contains("://")
                && !bare.contains('/')
                && !bare
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || c == '@');
            if !well_formed {
                return refuse(format!(
                    "endpoint `{endpoint}` is not host:port or {scheme}host:port"
                ));
            }
        }
        if self.prefix.is_empty() {
            return refuse("the key prefix must not be empty".into());
        }
        if self.timeout.is_zero() {
            return refuse("the timeout must be greater than zero".into());
        }
        if self.username.is_none() && self.password.is_some() {
            return refuse("etcd authentication needs a user name with the password".into());
        }
        Ok(())
    }

    /// The configuration as an `etcd://` URL with the password replaced by `***`.
    pub(crate) fn redacted(&self) -> String {
        let mut url = String::from("etcd://");
        if let Some(name) = &self.username {
            url.push_str(name);
            url.push_str(":***@");
        }
        url.push_str(&self.endpoints.join(","));
        url.push_str(&format!(
            "?prefix={}&timeout={}ms",
            self.prefix,
            self.timeout.as_millis()
        ));
        if self.tls {
            url.push_str("&tls=true");
        }
        for (name, value) in self.tls_files.params() {
            url.push_str(&format!("&{name}={value}"));
        }
        url
    }
}

impl fmt::Debug for EtcdBuilder {
    /// Shows everything but the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBuilder")
            .field("endpoints", &self.endpoints)
            .field("user", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("tls", &self.tls)
            .field("ca_file", &self.tls_files.ca_file())
            .field("client_cert", &self.tls_files.client_cert())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(url: &str) -> Result<EtcdBuilder> {
        EtcdBuilder::from_url(&LockUrl::parse(url)?)
    }

    fn assert_refused(url: &str, needle: &str) {
        match from(url) {
            Err(Error::InvalidUrl { url: shown, reason }) => {
                assert!(
                    reason.contains(needle),
                    "{url}: {reason:?} should mention {needle:?}"
                );
                assert!(!shown.contains("hunter2"), "{url}: password in {shown}");
            }
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }

    #[test]
    fn several_hosts_and_default_port() {
        let b = from("etcd://a:2379,b:2380?prefix=x/&timeout=2s").unwrap();
        assert_eq!(b.endpoints(), ["a:2379", "b:2380"]);
        assert_eq!(b.get_prefix(), "x/");
        assert_eq!(b.get_timeout(), Duration::from_secs(2));
        let b = from("etcd://root:pw@etcd-1.internal_x,10.1.2.3/").unwrap();
        assert_eq!(b.username.as_deref(), Some("root"));
        assert_eq!(b.password.as_deref(), Some("pw"));
        assert_eq!(b.endpoints(), ["etcd-1.internal_x:2379", "10.1.2.3:2379"]);
        let b = from("etcd://[2001:db8::1],[::ffff:10.0.0.1]:2380").unwrap();
        assert_eq!(
            b.endpoints(),
            ["[2001:db8::1]:2379", "[::ffff:10.0.0.1]:2380"]
        );
        assert_eq!(from("etcd://h").unwrap().get_prefix(), DEFAULT_PREFIX);
    }

    #[test]
    fn refuses_what_etcd_urls_do_not_take() {
        assert_refused("etcd://u:hunter2@", "etcd:// needs a host");
        assert_refused("etcd://a/0", "etcd:// takes no path");
        assert_refused("etcd://a/prefix", "etcd:// takes no path");
        assert_refused("etcd://u:hunter2@a/x", "etcd:// takes no path");
        assert_refused("etcd://:hunter2@a", "needs a user name");
        assert_refused("etcd://a?colour=red", "unknown parameter `colour`");
        assert_refused("etcd://a?prefix=", "must not be empty");
        assert_refused("redis://a", "etcd://");
    }

    /// `tls`, `ca`, `cert` and `key`: the files imply TLS, and contradictions are refused.
    #[test]
    fn tls_parameters() {
        let b = from("etcd://h?tls=true").unwrap();
        assert!(b.is_tls() && b.get_ca_file().is_none());
        let b = from("etcd://h?ca=/c.pem&cert=/a.pem&key=/k.pem").unwrap();
        assert!(b.is_tls());
        assert_eq!(b.get_ca_file(), Some(Path::new("/c.pem")));
        assert_eq!(
            b.get_client_cert(),
            Some((Path::new("/a.pem"), Path::new("/k.pem")))
        );
        assert!(!from("etcd://h?tls=false").unwrap().is_tls());
        assert!(!from("etcd://h").unwrap().is_tls());
        assert_refused("etcd://h?tls=yes", "`true` or `false`");
        assert_refused("etcd://h?tls=false&ca=/c.pem", "need TLS");
        assert_refused("etcd://h?cert=/a.pem", "go together");
        assert_refused("etcd://h?key=/k.pem&tls=true", "go together");
        let https = EtcdBuilder::new(["https://h:2379"]).tls(true);
        assert!(https.check().is_ok());
        assert!(EtcdBuilder::new(["https://h:2379"]).check().is_err());
        assert!(EtcdBuilder::new(["http://h:2379"])
            .tls(true)
            .check()
            .is_err());
    }

    /// `?timeout=` takes the CLI's durations.
    #[test]
    fn timeouts_are_human_durations() {
        let timeout = |url: &str| from(url).unwrap().get_timeout();
        assert_eq!(timeout("etcd://h?timeout=2min"), Duration::from_secs(120));
        assert_eq!(timeout("etcd://h?timeout=1h30m"), Duration::from_secs(5400));
        assert_refused("etcd://h?timeout=fast", "parameter `timeout`");
        assert_refused("etcd://h?timeout=0ms", "greater than zero");
    }
}
