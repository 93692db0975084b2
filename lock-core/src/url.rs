//! Lock-server URLs: the generic shape every backend's URL shares.
//!
//! Grammar: `scheme://[user[:password]@][host[:port][,host[:port]…]][/path][?query]`.
//! This module knows the shape only; what a scheme means (which backend, its default port,
//! whether it takes several hosts, a path or credentials) is decided by the backend's
//! builder (`RedisBuilder::from_url`, …) and the `distlock` facade, which maps scheme
//! names to backends. The rules of the shape:
//!
//! * The scheme is an ASCII letter followed by letters, digits, `+`, `-` and `.`; it is
//!   case-insensitive (stored lower-cased) and must be followed by `://`.
//! * The host list may be empty. Each entry is a name of ASCII letters, digits, `-`, `.`
//!   and `_` (one made only of digits and dots must be a valid IPv4 address), or an IPv6
//!   address in brackets (`[::1]`), with an optional port: decimal digits in 1..=65535.
//!   Empty entries in a host list are refused.
//! * The user name and password are percent-decoded; a missing user info (no `@`) is told
//!   apart from an empty one, and [`LockUrl::username`] treats an empty user name as none,
//!   so `redis://:pass@host` gives a password without a user name.
//! * The path is everything from the first `/` after the hosts to the `?`, percent-decoded.
//! * The query is `key=value` pairs separated by `&`, percent-decoded (`+` is a plus sign,
//!   not a space) and kept in order; an empty key or a pair without `=` is refused, an
//!   empty query after `?` is not.
//! * Percent-escapes must be `%` and two hex digits, and decode to UTF-8.
//! * Whitespace, control characters and `#` fragments are refused anywhere, and so is an `@`
//!   after the host list: a password containing `@`, `/`, `?` or `#` must be percent-encoded.
//!
//! `Display` of a [`LockUrl`] percent-encodes what must be, so the text parses back to the
//! same value. Every refusal is [`Error::InvalidUrl`], whose URL has the password, and the
//! value of every parameter whose name ends in `password`, replaced by `***` (see
//! [`redact`]).
//!
//! Durations in parameters use the grammar of [`parse_duration`] (humantime's: `250ms`,
//! `1.5s`, `2min`, `1h30m`), the same as the `distlock` command's `--ttl` and `--timeout`.

mod duration;
mod host;
mod parse;
mod percent;
// What the SQL backends' builders share, for the distlock backend crates: public only with
// the `internals` feature, outside the semver promise (as `group`).
#[cfg(feature = "internals")]
#[doc(hidden)]
pub mod sql;
#[cfg(not(feature = "internals"))]
#[allow(dead_code, unreachable_pub)]
mod sql;

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

pub use crate::error::{is_secret_param, redact};
pub use duration::{format_duration, parse_duration};
pub use host::{Host, HostPort};
pub use parse::parse_digits;

/// The user info of a URL, the part before `@`, percent-decoded.
///
/// `Debug` hides the password.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct UserInfo {
    /// The user name as written; may be empty (`redis://:pass@host`).
    pub username: String,
    /// The password; `Some` whenever the user info has a `:` (even if empty).
    pub password: Option<String>,
}

impl UserInfo {
    /// User info from optional parts: `None` when both are `None`, so that a configuration
    /// without credentials writes no `@`.
    pub fn from_parts(username: Option<&str>, password: Option<&str>) -> Option<UserInfo> {
        if username.is_none() && password.is_none() {
            return None;
        }
        Some(UserInfo {
            username: username.unwrap_or_default().to_owned(),
            password: password.map(str::to_owned),
        })
    }
}

impl fmt::Debug for UserInfo {
    /// Shows the user name and `***` in place of any password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserInfo")
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish()
    }
}

/// A parsed lock-server URL: the generic shape, not yet any backend's configuration.
///
/// Values made by [`LockUrl::parse`] keep these rules, and for every value that keeps them
/// `LockUrl::parse(&url.to_string())` gives the value back: the scheme is a valid scheme in
/// lower case, the path is empty or starts with `/`, parameter names are not empty.
///
/// `Debug` and [`LockUrl::redacted`] hide the password, and the value of every parameter
/// whose name ends in `password` ([`is_secret_param`]); `Display` shows them (it is the URL
/// to connect with).
#[derive(Clone, PartialEq, Eq)]
pub struct LockUrl {
    /// The scheme, lower-cased, without `://` (`memory`, `redis`, `etcd`, …).
    pub scheme: String,
    /// The percent-decoded user info; `None` when the URL has no `@`.
    pub userinfo: Option<UserInfo>,
    /// The hosts, in URL order, each with the port the URL names, if any; empty when the
    /// URL names none.
    pub hosts: Vec<Host>,
    /// The percent-decoded path: empty, or starting with `/`.
    pub path: String,
    /// Query parameters in URL order, percent-decoded; names may repeat.
    pub params: Vec<(String, String)>,
}

impl LockUrl {
    /// Parses `scheme://[user[:password]@]hostlist[/path][?query]` by the rules of the
    /// [module documentation](self); every refusal is [`Error::InvalidUrl`] with the password
    /// hidden.
    ///
    /// # Examples
    ///
    /// ```
    /// use lock_core::LockUrl;
    ///
    /// let url = LockUrl::parse("Redis://:s3cret@cache:6380/2?prefix=app%3A").unwrap();
    /// assert_eq!(url.scheme, "redis");
    /// assert_eq!(url.password(), Some("s3cret"));
    /// assert_eq!(url.hosts[0].to_string(), "cache:6380");
    /// assert_eq!(url.path, "/2");
    /// assert_eq!(url.param("prefix"), Some("app:"));
    /// assert_eq!(url.redacted(), "redis://:***@cache:6380/2?prefix=app%3A");
    /// ```
    pub fn parse(s: &str) -> Result<LockUrl> {
        let parts = parse::split(s).map_err(|reason| Error::invalid_url(s, reason))?;
        Ok(LockUrl {
            scheme: parts.scheme,
            userinfo: parts
                .userinfo
                .map(|(username, password)| UserInfo { username, password }),
            hosts: parts.hosts,
            path: parts.path,
            params: parts.params,
        })
    }

    /// The user name, `None` when the URL has none or an empty one.
    pub fn username(&self) -> Option<&str> {
        self.userinfo
            .as_ref()
            .map(|info| info.username.as_str())
            .filter(|name| !name.is_empty())
    }

    /// The password, `None` when the user info has no `:`.
    pub fn password(&self) -> Option<&str> {
        self.userinfo.as_ref()?.password.as_deref()
    }

    /// The hosts with `default_port` wherever the URL names no port.
    pub fn host_ports(&self, default_port: u16) -> Vec<HostPort> {
        self.hosts
            .iter()
            .map(|host| host.with_default_port(default_port))
            .collect()
    }

    /// The value of query parameter `name`; when it is given several times the last one wins.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// Refuses any query parameter whose name is not in `known`, with
    /// [`Error::InvalidUrl`] "unknown parameter `x` (known: a, b)".
    pub fn check_params(&self, known: &[&str]) -> Result<()> {
        match self
            .params
            .iter()
            .find(|(key, _)| !known.contains(&key.as_str()))
        {
            None => Ok(()),
            Some((key, _)) => {
                let known = if known.is_empty() {
                    "none".to_string()
                } else {
                    known.join(", ")
                };
                Err(self.invalid(format!("unknown parameter `{key}` (known: {known})")))
            }
        }
    }

    /// Parameter `name` as a duration written for [`parse_duration`] (`250ms`, `1.5s`,
    /// `2min`, `1h30m`); `Ok(None)` when absent, [`Error::InvalidUrl`] naming the parameter
    /// when the value is not such a duration.
    pub fn duration_param(&self, name: &str) -> Result<Option<Duration>> {
        match self.param(name) {
            None => Ok(None),
            Some(value) => parse_duration(value)
                .map(Some)
                .map_err(|reason| self.invalid(format!("parameter `{name}`: {reason}"))),
        }
    }

    /// Parameter `name` as a finite `f64`; `Ok(None)` when absent, [`Error::InvalidUrl`]
    /// naming the parameter when the value is not a number or is infinite or NaN.
    pub fn f64_param(&self, name: &str) -> Result<Option<f64>> {
        match self.param(name) {
            None => Ok(None),
            Some(value) => match value.parse::<f64>() {
                Ok(number) if number.is_finite() => Ok(Some(number)),
                _ => Err(self.invalid(format!(
                    "parameter `{name}` must be a finite number, not `{value}`"
                ))),
            },
        }
    }

    /// Parameter `name` as a `u64` written in decimal digits only; `Ok(None)` when absent,
    /// [`Error::InvalidUrl`] naming the parameter otherwise.
    pub fn u64_param(&self, name: &str) -> Result<Option<u64>> {
        match self.param(name) {
            None => Ok(None),
            Some(value) => match parse::parse_digits::<u64>(value) {
                Some(number) => Ok(Some(number)),
                None => Err(self.invalid(format!(
                    "parameter `{name}` must be a whole number 0..={}, not `{value}`",
                    u64::MAX
                ))),
            },
        }
    }

    /// Parameter `name` as `true` or `false` (exactly those words); `Ok(None)` when absent,
    /// [`Error::InvalidUrl`] naming the parameter otherwise.
    pub fn bool_param(&self, name: &str) -> Result<Option<bool>> {
        match self.param(name) {
            None => Ok(None),
            Some("true") => Ok(Some(true)),
            Some("false") => Ok(Some(false)),
            Some(other) => Err(self.invalid(format!(
                "parameter `{name}` must be `true` or `false`, not `{other}`"
            ))),
        }
    }

    /// The URL as `Display` writes it, with the password (if any) and the value of every
    /// secret parameter ([`is_secret_param`]: `sentinel_password`) replaced by `***`.
    pub fn redacted(&self) -> String {
        UrlDisplay {
            url: self,
            hide_password: true,
        }
        .to_string()
    }

    /// An [`Error::InvalidUrl`] about this URL for `reason`, which never shows the password:
    /// what a backend's builder returns when the URL breaks one of its rules.
    pub fn invalid(&self, reason: impl Into<String>) -> Error {
        Error::invalid_url(&self.redacted(), reason)
    }
}

impl fmt::Display for LockUrl {
    /// Writes the full URL, password included, percent-encoding in the user info, path and
    /// query every byte other than ASCII letters, digits, `-`, `.`, `_` and `~` (and `/` in
    /// the path), so that parsing the text gives this value back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        UrlDisplay {
            url: self,
            hide_password: false,
        }
        .fmt(f)
    }
}

impl fmt::Debug for LockUrl {
    /// Writes `LockUrl(<redacted URL>)`: the password never appears in debug output.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockUrl")
            .field(&format_args!("{}", self.redacted()))
            .finish()
    }
}

impl FromStr for LockUrl {
    type Err = Error;

    /// Same as [`LockUrl::parse`].
    fn from_str(s: &str) -> Result<LockUrl> {
        LockUrl::parse(s)
    }
}

/// Writes a [`LockUrl`], with or without its password.
struct UrlDisplay<'a> {
    url: &'a LockUrl,
    hide_password: bool,
}

impl fmt::Display for UrlDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use percent::{encode, encode_path};
        let url = self.url;
        write!(f, "{}://", url.scheme)?;
        if let Some(info) = &url.userinfo {
            f.write_str(&encode(&info.username))?;
            if let Some(password) = &info.password {
                f.write_str(":")?;
                if self.hide_password {
                    f.write_str("***")?;
                } else {
                    f.write_str(&encode(password))?;
                }
            }
            f.write_str("@")?;
        }
        for (i, host) in url.hosts.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{host}")?;
        }
        f.write_str(&encode_path(&url.path))?;
        for (i, (key, value)) in url.params.iter().enumerate() {
            f.write_str(if i == 0 { "?" } else { "&" })?;
            if self.hide_password && crate::error::is_secret_param(key) {
                write!(f, "{}=***", encode(key))?;
            } else {
                write!(f, "{}={}", encode(key), encode(value))?;
            }
        }
        Ok(())
    }
}

/// The files a TLS connection trusts and presents: a CA file (PEM) trusted instead of the
/// system's root certificates, and a client certificate with its key (PEM) for servers
/// that demand one. Both are optional; the files are read only when connecting.
///
/// Every backend that speaks TLS names them with the same URL parameters, `ca=PATH`,
/// `cert=PATH` and `key=PATH` ([`TlsFiles::PARAMS`]); `cert` and `key` go together.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    ca_file: Option<PathBuf>,
    client_cert: Option<(PathBuf, PathBuf)>,
}

impl TlsFiles {
    /// The URL parameters these files are read from.
    pub const PARAMS: [&'static str; 3] = ["ca", "cert", "key"];

    /// The files `url`'s `ca`, `cert` and `key` parameters name.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for `cert` without `key` or the
    /// reverse.
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        let client_cert =
            match (url.param("cert"), url.param("key")) {
                (Some(cert), Some(key)) => Some((cert.into(), key.into())),
                (None, None) => None,
                _ => return Err(url.invalid(
                    "parameters `cert` and `key` go together (a client certificate and its key)",
                )),
            };
        Ok(TlsFiles {
            ca_file: url.param("ca").map(PathBuf::from),
            client_cert,
        })
    }

    /// Trusts the CA in `path` instead of the system's roots.
    pub fn set_ca_file(&mut self, path: impl Into<PathBuf>) {
        self.ca_file = Some(path.into());
    }

    /// Presents the client certificate in `cert`, with its private key in `key`.
    pub fn set_client_cert(&mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) {
        self.client_cert = Some((cert.into(), key.into()));
    }

    /// The CA file trusted instead of the system's roots, if any.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }

    /// The client certificate and key files, if any.
    pub fn client_cert(&self) -> Option<(&Path, &Path)> {
        self.client_cert
            .as_ref()
            .map(|(cert, key)| (cert.as_path(), key.as_path()))
    }

    /// Whether no file is named (the system's roots, no client certificate).
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.client_cert.is_none()
    }

    /// The URL parameters that name these files, in the order [`from_url`](Self::from_url)
    /// reads them back.
    pub fn params(&self) -> Vec<(String, String)> {
        let path = |p: &Path| p.to_string_lossy().into_owned();
        let mut params = Vec::new();
        if let Some(ca) = &self.ca_file {
            params.push(("ca".to_owned(), path(ca)));
        }
        if let Some((cert, key)) = &self.client_cert {
            params.push(("cert".to_owned(), path(cert)));
            params.push(("key".to_owned(), path(key)));
        }
        params
    }
}

#[cfg(test)]
mod tls_tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn files_round_trip_through_url_parameters() {
        let url: LockUrl = "x://h?ca=/c.pem&cert=/a.pem&key=/k.pem".parse().unwrap();
        let files = TlsFiles::from_url(&url).unwrap();
        assert_eq!(files.ca_file(), Some(Path::new("/c.pem")));
        assert_eq!(
            files.client_cert(),
            Some((Path::new("/a.pem"), Path::new("/k.pem")))
        );
        assert!(!files.is_empty());
        let mut url2: LockUrl = "x://h".parse().unwrap();
        url2.params = files.params();
        assert_eq!(TlsFiles::from_url(&url2).unwrap(), files);
        let none: LockUrl = "x://h".parse().unwrap();
        assert!(TlsFiles::from_url(&none).unwrap().is_empty());
        for lone in ["x://h?cert=/a.pem", "x://h?key=/k.pem"] {
            let url: LockUrl = lone.parse().unwrap();
            let e = TlsFiles::from_url(&url).unwrap_err();
            assert!(e.to_string().contains("go together"), "{lone}: {e}");
        }
    }
}
