//! Lock-server URLs: which backend to use, where its servers are, and its options.
//!
//! Grammar: `scheme://[user[:password]@]hostlist[/path][?query]`. The forms:
//!
//! * `memory://` and `memory://?key=value`: the in-process backend; no host, user info or
//!   path.
//! * `redis://[user[:password]@]host[:port][/db]`: one Redis server (default port 6379);
//!   `db` is a `u32` database index, and an empty path or `/` means none. A comma in the
//!   host list is refused: several nodes are `redlock://`.
//! * `rediss://…`: the same over TLS.
//! * `redlock://[user[:password]@]h1[:p1],h2[:p2],…[/db]`: one or more independent Redis
//!   nodes for the Redlock algorithm (default port 6379), with the same optional `/db`.
//! * `etcd://[user[:password]@]h1[:p1],h2[:p2],…`: one or more etcd endpoints (default
//!   port 2379); no path other than empty or `/`.
//!
//! Rules shared by all schemes:
//!
//! * The scheme is case-insensitive and must be followed by `://`.
//! * A host is a name of ASCII letters, digits, `-`, `.` and `_` (one made only of digits
//!   and dots must be a valid IPv4 address), or an IPv6 address in brackets (`[::1]`). A
//!   missing port means the scheme's default port; a given port is decimal digits in
//!   1..=65535. Empty entries in the host list are refused.
//! * The user name and password are percent-decoded; an empty user name is none, so
//!   `redis://:pass@host` gives a password without a user name.
//! * The query is `key=value` pairs separated by `&`, percent-decoded (`+` is a plus sign,
//!   not a space) and kept in order; an empty key or a pair without `=` is refused, an
//!   empty query after `?` is not.
//! * Percent-escapes must be `%` and two hex digits, and decode to UTF-8.
//! * Whitespace, control characters and `#` fragments are refused anywhere, and so is an `@`
//!   after the host list: a password containing `@`, `/`, `?` or `#` must be percent-encoded.
//!
//! `Display` of a [`LockUrl`] percent-encodes what must be, so the text parses back to the
//! same value. Every refusal is [`Error::InvalidUrl`], whose URL has the password replaced by
//! `***` (see [`redact`]).

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

/// The schemes, in the order error messages list them.
const ALL_SCHEMES: [Scheme; 5] = [
    Scheme::Memory,
    Scheme::Redis,
    Scheme::Rediss,
    Scheme::Redlock,
    Scheme::Etcd,
];

/// Backend named by a URL scheme; parsed the same whatever Cargo features are compiled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    /// `memory://`: the in-process backend.
    Memory,
    /// `redis://`: a single Redis server.
    Redis,
    /// `rediss://`: a single Redis server over TLS.
    Rediss,
    /// `redlock://`: several independent Redis nodes (Redlock algorithm).
    Redlock,
    /// `etcd://`: an etcd cluster.
    Etcd,
}

impl Scheme {
    /// Parses a scheme name case-insensitively (`memory`, `redis`, `rediss`, `redlock`,
    /// `etcd`), without the `://`; any other text gives `None`.
    pub fn parse(s: &str) -> Option<Scheme> {
        ALL_SCHEMES
            .into_iter()
            .find(|scheme| scheme.as_str().eq_ignore_ascii_case(s))
    }

    /// The scheme's name in lowercase, as written before `://`.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Memory => "memory",
            Scheme::Redis => "redis",
            Scheme::Rediss => "rediss",
            Scheme::Redlock => "redlock",
            Scheme::Etcd => "etcd",
        }
    }

    /// The Cargo feature of the `distlock` facade that provides this backend: `redis` for
    /// both `redis://` and `rediss://`, otherwise the scheme's own name.
    pub fn feature(self) -> &'static str {
        match self {
            Scheme::Memory => "memory",
            Scheme::Redis | Scheme::Rediss => "redis",
            Scheme::Redlock => "redlock",
            Scheme::Etcd => "etcd",
        }
    }

    /// The port used when a host names none: 6379 for the Redis schemes, 2379 for etcd,
    /// `None` for `memory://`, which takes no host.
    pub fn default_port(self) -> Option<u16> {
        match self {
            Scheme::Memory => None,
            Scheme::Redis | Scheme::Rediss | Scheme::Redlock => Some(6379),
            Scheme::Etcd => Some(2379),
        }
    }

    /// Whether the scheme takes a `/db` database index in its path.
    fn takes_db(self) -> bool {
        matches!(self, Scheme::Redis | Scheme::Rediss | Scheme::Redlock)
    }
}

impl fmt::Display for Scheme {
    /// Writes the lowercase scheme name, without `://`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `host:port` of one server.
///
/// `host` is a host name, an IPv4 address or an IPv6 address; an IPv6 address is stored
/// without brackets and displayed with them (`[::1]:6379`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// Host name or IP address, without brackets.
    pub host: String,
    /// TCP port, 1..=65535 (the scheme's default when the URL names none).
    pub port: u16,
}

impl fmt::Display for HostPort {
    /// Writes `host:port`, putting a host that contains `:` (IPv6) in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// A parsed lock-server URL.
///
/// Values made by [`LockUrl::parse`] keep these rules, and for every value that keeps them
/// `LockUrl::parse(&url.to_string())` gives the value back: `memory://` has no user info,
/// hosts or database; `redis://` and `rediss://` have exactly one host; `redlock://` and
/// `etcd://` have at least one; only the Redis schemes have a database; `username` is never
/// `Some("")`; parameter names are not empty.
///
/// `Debug` and [`LockUrl::redacted`] hide the password; `Display` shows it (it is the URL to
/// connect with).
#[derive(Clone, PartialEq, Eq)]
pub struct LockUrl {
    /// The backend.
    pub scheme: Scheme,
    /// Percent-decoded user name; `None` when the URL has none or an empty one.
    pub username: Option<String>,
    /// Percent-decoded password; `Some` whenever the user info has a `:` (even if empty).
    pub password: Option<String>,
    /// The servers, in URL order; empty for `memory://`, exactly one for `redis://` and
    /// `rediss://`.
    pub hosts: Vec<HostPort>,
    /// Database index from the `/N` path; only for `redis://`, `rediss://` and `redlock://`.
    pub db: Option<u32>,
    /// Query parameters in URL order, percent-decoded; names may repeat.
    pub params: Vec<(String, String)>,
}

impl LockUrl {
    /// Parses `scheme://[user[:password]@]hostlist[/path][?query]` by the rules of the
    /// [module documentation](self); every refusal is [`Error::InvalidUrl`] with the password
    /// hidden.
    pub fn parse(s: &str) -> Result<LockUrl> {
        parse_url(s).map_err(|reason| Error::invalid_url(s, reason))
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
                Err(self.error(format!("unknown parameter `{key}` (known: {known})")))
            }
        }
    }

    /// Parameter `name` as a duration written for [`parse_duration`] (`250ms`, `1.5s`, `5m`,
    /// `1h`); `Ok(None)` when absent, [`Error::InvalidUrl`] naming the parameter when the
    /// value is not such a duration.
    pub fn duration_param(&self, name: &str) -> Result<Option<Duration>> {
        match self.param(name) {
            None => Ok(None),
            Some(value) => parse_duration(value)
                .map(Some)
                .map_err(|reason| self.error(format!("parameter `{name}`: {reason}"))),
        }
    }

    /// Parameter `name` as a finite `f64`; `Ok(None)` when absent, [`Error::InvalidUrl`]
    /// naming the parameter when the value is not a number or is infinite or NaN.
    pub fn f64_param(&self, name: &str) -> Result<Option<f64>> {
        match self.param(name) {
            None => Ok(None),
            Some(value) => match value.parse::<f64>() {
                Ok(number) if number.is_finite() => Ok(Some(number)),
                _ => Err(self.error(format!(
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
            Some(value) => match parse_digits::<u64>(value) {
                Some(number) => Ok(Some(number)),
                None => Err(self.error(format!(
                    "parameter `{name}` must be a whole number 0..={}, not `{value}`",
                    u64::MAX
                ))),
            },
        }
    }

    /// The URL as `Display` writes it, with the password (if any) replaced by `***`.
    pub fn redacted(&self) -> String {
        UrlDisplay {
            url: self,
            hide_password: true,
        }
        .to_string()
    }

    /// An [`Error::InvalidUrl`] about this URL, which never shows the password.
    fn error(&self, reason: String) -> Error {
        Error::invalid_url(&self.redacted(), reason)
    }
}

impl fmt::Display for LockUrl {
    /// Writes the full URL, password included, percent-encoding in the user info and query
    /// every byte other than ASCII letters, digits, `-`, `.`, `_` and `~`, so that parsing the
    /// text gives this value back. Hosts always carry their port.
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
        let url = self.url;
        write!(f, "{}://", url.scheme)?;
        if url.username.is_some() || url.password.is_some() {
            if let Some(username) = &url.username {
                f.write_str(&percent_encode(username))?;
            }
            if let Some(password) = &url.password {
                f.write_str(":")?;
                if self.hide_password {
                    f.write_str("***")?;
                } else {
                    f.write_str(&percent_encode(password))?;
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
        if let Some(db) = url.db {
            write!(f, "/{db}")?;
        }
        for (i, (key, value)) in url.params.iter().enumerate() {
            f.write_str(if i == 0 { "?" } else { "&" })?;
            write!(f, "{}={}", percent_encode(key), percent_encode(value))?;
        }
        Ok(())
    }
}

/// Writes a duration so that [`parse_duration`] reads it back exactly (`2s`, `250ms`,
/// `1.5ms`): the inverse used when a configuration is turned back into a URL.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos % 1_000_000_000 == 0 {
        format!("{}s", nanos / 1_000_000_000)
    } else if nanos % 1_000_000 == 0 {
        format!("{}ms", nanos / 1_000_000)
    } else {
        let frac = format!("{:06}", nanos % 1_000_000);
        format!("{}.{}ms", nanos / 1_000_000, frac.trim_end_matches('0'))
    }
}

/// Parses a duration with a required unit: an unsigned decimal number (`250`, `1.5`) followed
/// by `ms`, `s`, `m` or `h`. A bare number (even `0`), an unknown unit, a sign, or a value too
/// large for [`Duration`] is refused with a message saying why. Fractions below a nanosecond
/// are dropped.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    if s.is_empty() {
        return Err("empty duration (expected e.g. `250ms`, `2s`, `5m`, `1h`)".to_string());
    }
    let split = s
        .char_indices()
        .find(|&(_, c)| !(c.is_ascii_digit() || c == '.'))
        .map_or(s.len(), |(i, _)| i);
    let (number, unit) = s.split_at(split);
    let nanos_per_unit: u128 = match unit {
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "" => {
            return Err(format!(
                "duration `{s}` has no unit (use ms, s, m or h, e.g. `{s}s`)"
            ))
        }
        _ => {
            return Err(format!(
                "duration `{s}` has unknown unit `{unit}` (use ms, s, m or h)"
            ))
        }
    };
    let (whole, fraction) = match number.split_once('.') {
        Some((whole, fraction)) => (whole, fraction),
        None => (number, ""),
    };
    let bad_number = || format!("duration `{s}` does not start with a number like `2` or `1.5`");
    if whole.is_empty() || (number.contains('.') && fraction.is_empty()) {
        return Err(bad_number());
    }
    if !whole.bytes().all(|b| b.is_ascii_digit()) || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad_number());
    }
    let too_large = || format!("duration `{s}` is too large");
    let whole: u128 = whole.parse().map_err(|_| too_large())?;
    let mut nanos = whole.checked_mul(nanos_per_unit).ok_or_else(too_large)?;
    // Digits past the 20th are far below a nanosecond for every unit: drop them.
    let fraction = fraction.get(..fraction.len().min(20)).unwrap_or("");
    if !fraction.is_empty() {
        let digits: u128 = fraction.parse().map_err(|_| bad_number())?;
        let scale = 10u128.pow(u32::try_from(fraction.len()).unwrap_or(20));
        nanos = nanos
            .checked_add(digits * nanos_per_unit / scale)
            .ok_or_else(too_large)?;
    }
    let secs = u64::try_from(nanos / 1_000_000_000).map_err(|_| too_large())?;
    let subsec = u32::try_from(nanos % 1_000_000_000).map_err(|_| too_large())?;
    Ok(Duration::new(secs, subsec))
}

/// Returns `url` with the password of its user info replaced by `***`, for error messages
/// and logs; never panics.
///
/// The password is everything between the first `:` after `://` and the last `@` (so an
/// unencoded `@`, `/` or `?` in a password is hidden too). Without a `://` the text from the
/// start is searched the same way. When there is no `@`, or no `:` before it, the input is
/// returned unchanged. For a URL that [`LockUrl::parse`] accepts this hides exactly the
/// password and matches [`LockUrl::redacted`] of the parsed value.
pub fn redact(url: &str) -> String {
    let start = url.find("://").map_or(0, |i| i + 3);
    let (head, rest) = url.split_at(start);
    let Some(at) = rest.rfind('@') else {
        return url.to_string();
    };
    let (userinfo, tail) = rest.split_at(at);
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{head}{user}:***{tail}"),
        None => url.to_string(),
    }
}

/// The parser behind [`LockUrl::parse`]; returns the reason of a refusal.
fn parse_url(s: &str) -> std::result::Result<LockUrl, String> {
    if s.chars().any(char::is_whitespace) {
        return Err("whitespace is not allowed in a lock URL".to_string());
    }
    if let Some(c) = s.chars().find(|c| c.is_control()) {
        return Err(format!(
            "control character U+{:04X} is not allowed in a lock URL",
            u32::from(c)
        ));
    }
    if s.contains('#') {
        return Err(
            "`#` fragments are not allowed (percent-encode `#` as %23 in a password or parameter)"
                .to_string(),
        );
    }
    let Some((scheme_text, rest)) = s.split_once("://") else {
        return Err(
            "missing `://` after the scheme (expected e.g. `redis://localhost:6379`)".to_string(),
        );
    };
    let scheme = Scheme::parse(scheme_text).ok_or_else(|| {
        format!(
            "unknown scheme `{scheme_text}` (expected {})",
            ALL_SCHEMES.map(Scheme::as_str).join(", ")
        )
    })?;

    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest, None),
    };
    let (authority, path) = match before_query.find('/') {
        Some(i) => before_query.split_at(i),
        None => (before_query, ""),
    };
    if path.contains('@') || query.is_some_and(|q| q.contains('@')) {
        return Err(
            "unencoded `@` after the host list; percent-encode `@`, `/`, `?` and `#` \
                    in user names, passwords and parameters (as %40, %2F, %3F, %23)"
                .to_string(),
        );
    }
    let (userinfo, hostlist) = match authority.rsplit_once('@') {
        Some((userinfo, hostlist)) => (Some(userinfo), hostlist),
        None => (None, authority),
    };

    let query = query.unwrap_or("");

    let Some(default_port) = scheme.default_port() else {
        // memory://
        if !hostlist.is_empty() {
            return Err("memory:// takes no host".to_string());
        }
        if userinfo.is_some() {
            return Err("memory:// takes no user name or password".to_string());
        }
        if !path.is_empty() {
            return Err("memory:// takes no path".to_string());
        }
        return Ok(LockUrl {
            scheme,
            username: None,
            password: None,
            hosts: Vec::new(),
            db: None,
            params: parse_query(query)?,
        });
    };

    let (username, password) = match userinfo {
        None => (None, None),
        Some(userinfo) => {
            let (user, password) = match userinfo.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (userinfo, None),
            };
            let user = percent_decode(user, "user name")?;
            let password = password
                .map(|p| percent_decode(p, "password"))
                .transpose()?;
            ((!user.is_empty()).then_some(user), password)
        }
    };

    if matches!(scheme, Scheme::Redis | Scheme::Rediss) && hostlist.contains(',') {
        return Err(format!(
            "{scheme}:// names one host; use redlock:// for several nodes"
        ));
    }
    if hostlist.is_empty() {
        return Err(format!("{scheme}:// needs a host"));
    }
    let hosts = hostlist
        .split(',')
        .map(|entry| parse_host(entry, default_port))
        .collect::<std::result::Result<Vec<_>, _>>()?;

    let db = match path {
        "" | "/" => None,
        _ if scheme.takes_db() => {
            let index = path.get(1..).unwrap_or("");
            Some(parse_digits::<u32>(index).ok_or_else(|| {
                format!(
                    "database index `{index}` in the path is not a number 0..={}",
                    u32::MAX
                )
            })?)
        }
        _ => return Err(format!("{scheme}:// takes no path (got `{path}`)")),
    };

    Ok(LockUrl {
        scheme,
        username,
        password,
        hosts,
        db,
        params: parse_query(query)?,
    })
}

/// Parses one entry of the host list: `name[:port]`, `a.b.c.d[:port]` or `[ipv6][:port]`.
fn parse_host(entry: &str, default_port: u16) -> std::result::Result<HostPort, String> {
    if entry.is_empty() {
        return Err("empty host in the host list".to_string());
    }
    if let Some(bracketed) = entry.strip_prefix('[') {
        let Some((address, after)) = bracketed.split_once(']') else {
            return Err(
                "unterminated `[` (IPv6 hosts are written `[addr]` or `[addr]:port`)".to_string(),
            );
        };
        if address.parse::<Ipv6Addr>().is_err() {
            return Err(format!("`[{address}]` is not a valid IPv6 address"));
        }
        let port = if after.is_empty() {
            default_port
        } else if let Some(port) = after.strip_prefix(':') {
            parse_port(port)?
        } else {
            return Err(format!(
                "unexpected `{after}` after `[{address}]` (expected `:port`)"
            ));
        };
        return Ok(HostPort {
            host: address.to_string(),
            port,
        });
    }
    let (host, port) = match entry.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (entry, None),
    };
    if port.is_some_and(|p| p.contains(':')) {
        return Err("IPv6 addresses must be in brackets, e.g. `[::1]:6379`".to_string());
    }
    if host.is_empty() {
        return Err("empty host name before `:`".to_string());
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
    {
        return Err(format!(
            "invalid host `{host}` (a host name has only ASCII letters, digits, `-`, `.` and `_`)"
        ));
    }
    if host.contains('.')
        && host.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && host.parse::<Ipv4Addr>().is_err()
    {
        return Err(format!("`{host}` is not a valid IPv4 address"));
    }
    let port = match port {
        None => default_port,
        Some(port) => parse_port(port)?,
    };
    Ok(HostPort {
        host: host.to_string(),
        port,
    })
}

/// Parses the text after a host's `:`: decimal digits for a port in 1..=65535.
fn parse_port(port: &str) -> std::result::Result<u16, String> {
    if port.is_empty() {
        return Err("missing port number after `:`".to_string());
    }
    if !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("port `{port}` is not a number"));
    }
    match port.parse::<u16>() {
        Ok(0) => Err("port 0 is not allowed (ports are 1..=65535)".to_string()),
        Ok(port) => Ok(port),
        Err(_) => Err(format!("port `{port}` is out of range 1..=65535")),
    }
}

/// Parses the query (the text after `?`) into percent-decoded `(name, value)` pairs.
fn parse_query(query: &str) -> std::result::Result<Vec<(String, String)>, String> {
    if query.is_empty() {
        return Ok(Vec::new());
    }
    query
        .split('&')
        .map(|pair| {
            let Some((key, value)) = pair.split_once('=') else {
                if pair.is_empty() {
                    return Err("empty parameter name (stray `&`)".to_string());
                }
                let key = percent_decode(pair, "parameter name")?;
                return Err(format!(
                    "parameter `{key}` has no value (write `{key}=value`)"
                ));
            };
            let key = percent_decode(key, "parameter name")?;
            if key.is_empty() {
                return Err("empty parameter name before `=`".to_string());
            }
            let value = percent_decode(value, &format!("value of parameter `{key}`"))?;
            Ok((key, value))
        })
        .collect()
}

/// Parses a non-empty string of ASCII digits (no sign) as `T`; `None` for anything else or
/// on overflow.
fn parse_digits<T: FromStr>(s: &str) -> Option<T> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Decodes `%XX` escapes; `what` names the part of the URL for the error message, which never
/// quotes the text (it may be a password).
fn percent_decode(s: &str, what: &str) -> std::result::Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let high = bytes.get(i + 1).copied().and_then(hex_value);
            let low = bytes.get(i + 2).copied().and_then(hex_value);
            let (Some(high), Some(low)) = (high, low) else {
                return Err(format!(
                    "invalid percent-escape in the {what} (`%` must be followed by two hex digits)"
                ));
            };
            out.push(high << 4 | low);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out)
        .map_err(|_| format!("the {what} is not valid UTF-8 after percent-decoding"))
}

/// The value of one hexadecimal digit.
fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-encodes every byte except the unreserved ASCII letters, digits, `-`, `.`, `_`, `~`.
fn percent_encode(s: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_duration_round_trips() {
        for d in [
            Duration::from_secs(2),
            Duration::from_millis(250),
            Duration::from_micros(1500),
            Duration::from_nanos(1),
            Duration::ZERO,
        ] {
            assert_eq!(parse_duration(&format_duration(d)), Ok(d), "{d:?}");
        }
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
    }
    use proptest::prelude::*;

    fn ok(s: &str) -> LockUrl {
        match LockUrl::parse(s) {
            Ok(url) => url,
            Err(err) => panic!("{s:?} should parse, got {err}"),
        }
    }

    /// Parses `s`, expects `InvalidUrl`, and returns its reason.
    fn refused(s: &str) -> String {
        match LockUrl::parse(s) {
            Ok(url) => panic!("{s:?} should be refused, got {url:?}"),
            Err(err) => {
                assert!(matches!(err, Error::InvalidUrl { .. }), "{s:?}: {err:?}");
                match err {
                    Error::InvalidUrl { reason, .. } => reason,
                    _ => unreachable!(),
                }
            }
        }
    }

    fn assert_refused(s: &str, needle: &str) {
        let reason = refused(s);
        assert!(
            reason.contains(needle),
            "{s:?}: reason {reason:?} should mention {needle:?}"
        );
    }

    fn hp(host: &str, port: u16) -> HostPort {
        HostPort {
            host: host.to_string(),
            port,
        }
    }

    fn params(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    // ---- Scheme -------------------------------------------------------------------------

    #[test]
    fn scheme_parse_and_properties() {
        assert_eq!(Scheme::parse("memory"), Some(Scheme::Memory));
        assert_eq!(Scheme::parse("REDIS"), Some(Scheme::Redis));
        assert_eq!(Scheme::parse("Rediss"), Some(Scheme::Rediss));
        assert_eq!(Scheme::parse("redLock"), Some(Scheme::Redlock));
        assert_eq!(Scheme::parse("etcd"), Some(Scheme::Etcd));
        assert_eq!(Scheme::parse("http"), None);
        assert_eq!(Scheme::parse(""), None);
        assert_eq!(Scheme::parse("redis://"), None);
        for scheme in ALL_SCHEMES {
            assert_eq!(Scheme::parse(scheme.as_str()), Some(scheme));
            assert_eq!(scheme.to_string(), scheme.as_str());
        }
        assert_eq!(Scheme::Rediss.feature(), "redis");
        assert_eq!(Scheme::Redis.feature(), "redis");
        assert_eq!(Scheme::Redlock.feature(), "redlock");
        assert_eq!(Scheme::Etcd.feature(), "etcd");
        assert_eq!(Scheme::Memory.feature(), "memory");
        assert_eq!(Scheme::Memory.default_port(), None);
        assert_eq!(Scheme::Redis.default_port(), Some(6379));
        assert_eq!(Scheme::Rediss.default_port(), Some(6379));
        assert_eq!(Scheme::Redlock.default_port(), Some(6379));
        assert_eq!(Scheme::Etcd.default_port(), Some(2379));
    }

    #[test]
    fn host_port_display() {
        assert_eq!(hp("localhost", 6379).to_string(), "localhost:6379");
        assert_eq!(hp("::1", 6379).to_string(), "[::1]:6379");
        assert_eq!(hp("10.0.0.1", 1).to_string(), "10.0.0.1:1");
    }

    // ---- accepted forms -----------------------------------------------------------------

    #[test]
    fn memory() {
        let url = ok("memory://");
        assert_eq!(url.scheme, Scheme::Memory);
        assert_eq!(url.username, None);
        assert_eq!(url.password, None);
        assert!(url.hosts.is_empty());
        assert_eq!(url.db, None);
        assert!(url.params.is_empty());
        assert_eq!(url.to_string(), "memory://");

        let url = ok("MEMORY://?a=b&c=");
        assert_eq!(url.scheme, Scheme::Memory);
        assert_eq!(url.params, params(&[("a", "b"), ("c", "")]));
        assert_eq!(url.to_string(), "memory://?a=b&c=");
        assert_eq!(ok("memory://?").params, params(&[]));
    }

    #[test]
    fn redis_default_port() {
        let url = ok("redis://localhost");
        assert_eq!(url.scheme, Scheme::Redis);
        assert_eq!(url.hosts, vec![hp("localhost", 6379)]);
        assert_eq!(url.username, None);
        assert_eq!(url.password, None);
        assert_eq!(url.db, None);
        assert!(url.params.is_empty());
        assert_eq!(url.to_string(), "redis://localhost:6379");
        assert_eq!(ok("redis://localhost/").db, None);
        assert_eq!(ok("redis://localhost:6379/?").db, None);
    }

    #[test]
    fn redis_password_only_db_and_query() {
        let url = ok("redis://:secret@127.0.0.1:6380/2?prefix=app:");
        assert_eq!(url.scheme, Scheme::Redis);
        assert_eq!(url.username, None);
        assert_eq!(url.password.as_deref(), Some("secret"));
        assert_eq!(url.hosts, vec![hp("127.0.0.1", 6380)]);
        assert_eq!(url.db, Some(2));
        assert_eq!(url.params, params(&[("prefix", "app:")]));
        assert_eq!(url.param("prefix"), Some("app:"));
        assert_eq!(
            url.to_string(),
            "redis://:secret@127.0.0.1:6380/2?prefix=app%3A"
        );
        assert_eq!(
            url.redacted(),
            "redis://:***@127.0.0.1:6380/2?prefix=app%3A"
        );
    }

    #[test]
    fn rediss_user_and_password() {
        let url = ok("rediss://user:pw@host:6380");
        assert_eq!(url.scheme, Scheme::Rediss);
        assert_eq!(url.username.as_deref(), Some("user"));
        assert_eq!(url.password.as_deref(), Some("pw"));
        assert_eq!(url.hosts, vec![hp("host", 6380)]);
        assert_eq!(url.db, None);

        let url = ok("redis://user@host");
        assert_eq!(url.username.as_deref(), Some("user"));
        assert_eq!(url.password, None);

        let url = ok("redis://user:@host");
        assert_eq!(url.username.as_deref(), Some("user"));
        assert_eq!(url.password.as_deref(), Some(""));
    }

    #[test]
    fn userinfo_is_percent_decoded() {
        let url = ok("redis://us%40er:p%3Aa%2Fs%3Fs%23%25%C3%A9@host");
        assert_eq!(url.username.as_deref(), Some("us@er"));
        assert_eq!(url.password.as_deref(), Some("p:a/s?s#%é"));
        // A raw `:` in the password and a raw `@` in the user info are understood too.
        let url = ok("redis://u@x:pa:ss@host");
        assert_eq!(url.username.as_deref(), Some("u@x"));
        assert_eq!(url.password.as_deref(), Some("pa:ss"));
        assert_eq!(ok(&url.to_string()), url);
    }

    #[test]
    fn redlock_several_hosts() {
        let url = ok("redlock://h1:1,h2:2,h3:3?drift=0.02");
        assert_eq!(url.scheme, Scheme::Redlock);
        assert_eq!(url.hosts, vec![hp("h1", 1), hp("h2", 2), hp("h3", 3)]);
        assert_eq!(url.db, None);
        assert_eq!(url.params, params(&[("drift", "0.02")]));
        assert_eq!(url.f64_param("drift").ok(), Some(Some(0.02)));

        let url = ok("redlock://:pw@a,b:7000,[::1]/5");
        assert_eq!(
            url.hosts,
            vec![hp("a", 6379), hp("b", 7000), hp("::1", 6379)]
        );
        assert_eq!(url.db, Some(5));
        assert_eq!(url.to_string(), "redlock://:pw@a:6379,b:7000,[::1]:6379/5");
    }

    #[test]
    fn etcd_cluster() {
        let url = ok("etcd://a:2379,b:2379?prefix=x/&timeout=2s");
        assert_eq!(url.scheme, Scheme::Etcd);
        assert_eq!(url.hosts, vec![hp("a", 2379), hp("b", 2379)]);
        assert_eq!(url.db, None);
        assert_eq!(url.params, params(&[("prefix", "x/"), ("timeout", "2s")]));
        assert_eq!(
            url.duration_param("timeout").ok(),
            Some(Some(Duration::from_secs(2)))
        );
        let url = ok("etcd://root:pw@etcd-1.internal_x,10.1.2.3/");
        assert_eq!(url.username.as_deref(), Some("root"));
        assert_eq!(url.password.as_deref(), Some("pw"));
        assert_eq!(
            url.hosts,
            vec![hp("etcd-1.internal_x", 2379), hp("10.1.2.3", 2379)]
        );
    }

    #[test]
    fn ipv6_hosts() {
        let url = ok("redis://[::1]:6379");
        assert_eq!(url.hosts, vec![hp("::1", 6379)]);
        assert_eq!(url.to_string(), "redis://[::1]:6379");
        let url = ok("etcd://[2001:db8::1],[::ffff:10.0.0.1]:2380");
        assert_eq!(
            url.hosts,
            vec![hp("2001:db8::1", 2379), hp("::ffff:10.0.0.1", 2380)]
        );
    }

    #[test]
    fn query_is_percent_decoded_and_plus_is_kept() {
        let url = ok("memory://?a%20b=c+d&e=%26%3D&f=x=y&a%20b=2");
        assert_eq!(
            url.params,
            params(&[("a b", "c+d"), ("e", "&="), ("f", "x=y"), ("a b", "2")])
        );
        assert_eq!(url.param("a b"), Some("2"), "last occurrence wins");
        assert_eq!(url.param("missing"), None);
    }

    #[test]
    fn from_str_matches_parse() {
        let url: LockUrl = "redis://localhost".parse().expect("parses");
        assert_eq!(url, ok("redis://localhost"));
        assert!("nope".parse::<LockUrl>().is_err());
    }

    // ---- refusals, one per rule -----------------------------------------------------------

    #[test]
    fn refuses_unknown_scheme() {
        assert_refused(
            "http://localhost",
            "unknown scheme `http` (expected memory, redis, rediss, redlock, etcd)",
        );
        assert_refused("://localhost", "unknown scheme ``");
    }

    #[test]
    fn refuses_missing_separator() {
        assert_refused("redis:localhost", "missing `://`");
        assert_refused("localhost:6379", "missing `://`");
        assert_refused("", "missing `://`");
        assert_refused("memory", "missing `://`");
    }

    #[test]
    fn refuses_memory_with_host_userinfo_or_path() {
        assert_refused("memory://localhost", "memory:// takes no host");
        assert_refused("memory://u:p@", "memory:// takes no user name or password");
        assert_refused("memory://@", "memory:// takes no user name or password");
        assert_refused("memory:///", "memory:// takes no path");
        assert_refused("memory:///x?a=b", "memory:// takes no path");
    }

    #[test]
    fn refuses_several_redis_hosts() {
        assert_refused(
            "redis://a:1,b:2",
            "redis:// names one host; use redlock:// for several nodes",
        );
        assert_refused("rediss://a,", "rediss:// names one host");
    }

    #[test]
    fn refuses_bad_database_index() {
        assert_refused("redis://host/x", "database index `x`");
        assert_refused("redis://host/-1", "database index");
        assert_refused("redis://host/+1", "database index");
        assert_refused("redis://host/4294967296", "database index");
        assert_refused("redis://host/1/2", "database index");
        assert_refused("redlock://a,b/db0", "database index");
        assert_eq!(ok("redis://host/4294967295").db, Some(u32::MAX));
    }

    #[test]
    fn refuses_etcd_path() {
        assert_refused("etcd://a/0", "etcd:// takes no path");
        assert_refused("etcd://a/prefix", "etcd:// takes no path");
    }

    #[test]
    fn refuses_bad_hosts() {
        assert_refused("redis://", "redis:// needs a host");
        assert_refused("etcd://u:p@", "etcd:// needs a host");
        assert_refused("redlock://?a=b", "redlock:// needs a host");
        assert_refused("redlock://a:1,,b:2", "empty host");
        assert_refused("etcd://a,", "empty host");
        assert_refused("redis://:6379", "empty host");
        assert_refused("redis://ho!st", "invalid host `ho!st`");
        assert_refused("redis://hôst", "invalid host");
        assert_refused("redis://h%41st", "invalid host");
        assert_refused("redis://999.1.1.1", "not a valid IPv4 address");
        assert_refused("redis://1.2.3", "not a valid IPv4 address");
        assert_refused("redis://::1", "IPv6 addresses must be in brackets");
        assert_refused("redis://[::1", "unterminated `[`");
        assert_refused("redis://[zz::1]:1", "not a valid IPv6 address");
        assert_refused("redis://[1.2.3.4]", "not a valid IPv6 address");
        assert_refused("redis://[::1]6379", "expected `:port`");
    }

    #[test]
    fn refuses_bad_ports() {
        assert_refused("redis://host:0", "port 0 is not allowed");
        assert_refused("redis://host:abc", "port `abc` is not a number");
        assert_refused("redis://host:+1", "is not a number");
        assert_refused("redis://host:99999", "out of range");
        assert_refused("redis://host:65536", "out of range");
        assert_refused("redis://host:", "missing port");
        assert_refused("redis://[::1]:", "missing port");
        assert_eq!(ok("redis://host:65535").hosts, vec![hp("host", 65535)]);
    }

    #[test]
    fn refuses_bad_query() {
        assert_refused("redis://h?=v", "empty parameter name");
        assert_refused("redis://h?a=1&", "empty parameter name");
        assert_refused("redis://h?a=1&&b=2", "empty parameter name");
        assert_refused("redis://h?flag", "parameter `flag` has no value");
        assert_refused("redis://h?a=1&flag", "parameter `flag` has no value");
    }

    #[test]
    fn refuses_bad_percent_escapes() {
        assert_refused("redis://h?a=%zz", "invalid percent-escape");
        assert_refused("redis://h?a=%4", "invalid percent-escape");
        assert_refused("redis://h?a=%", "invalid percent-escape");
        assert_refused(
            "redis://h?a%=1",
            "invalid percent-escape in the parameter name",
        );
        assert_refused("redis://u%:p@h", "invalid percent-escape in the user name");
        assert_refused("redis://u:p%g1@h", "invalid percent-escape in the password");
        assert_refused("redis://h?a=%FF", "not valid UTF-8");
        assert_refused("redis://u:%C3@h", "password is not valid UTF-8");
    }

    #[test]
    fn refuses_whitespace_control_and_fragment() {
        assert_refused("redis://host ", "whitespace");
        assert_refused(" redis://host", "whitespace");
        assert_refused("redis://h?a=b c", "whitespace");
        assert_refused("redis://h\u{a0}", "whitespace");
        assert_refused("redis://h\u{7}", "control character U+0007");
        assert_refused("redis://h?a=\u{9f}", "control character");
        assert_refused("redis://host#frag", "`#` fragments are not allowed");
        assert_refused("redis://u:pa#ss@host", "`#`");
    }

    #[test]
    fn refuses_unencoded_at_after_hosts() {
        // A password with a raw `/` or `?` would otherwise be read as a path or a query.
        assert_refused("redis://u:pa/ss@host", "unencoded `@`");
        assert_refused("redis://u:pa?ss@host", "unencoded `@`");
        assert_refused("redis://host?email=a@b", "unencoded `@`");
    }

    #[test]
    fn errors_hide_the_password() {
        let err = LockUrl::parse("redis://u:hunter2@host:bad").expect_err("bad port");
        assert!(matches!(err, Error::InvalidUrl { .. }));
        let display = err.to_string();
        let debug = format!("{err:?}");
        assert!(!display.contains("hunter2"), "{display}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(display.contains("redis://u:***@host:bad"), "{display}");
        assert!(display.contains("port `bad`"), "{display}");

        for input in [
            "redis://u:hunter2/x@host",
            "redis://u:hunter2?x@host",
            "redis://u:hunter2#@host",
            "redis://u:hunter2@host ",
            "redis://u:6379?hunter2@host",
            "memory://u:hunter2@",
            "redis://u:hunter2@a,b",
            "redis://u:hunter2%zz@host",
            "etcd://u:hunter2@/x",
        ] {
            let err = LockUrl::parse(input).expect_err(input);
            assert!(matches!(err, Error::InvalidUrl { .. }), "{input}");
            assert!(!err.to_string().contains("hunter2"), "{input}: {err}");
            assert!(!format!("{err:?}").contains("hunter2"), "{input}: {err:?}");
        }
    }

    #[test]
    fn debug_hides_the_password() {
        let url = ok("rediss://user:hunter2@host:6380/1");
        let debug = format!("{url:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert_eq!(debug, "LockUrl(rediss://user:***@host:6380/1)");
        assert!(!format!("{url:#?}").contains("hunter2"));
        assert_eq!(url.redacted(), "rediss://user:***@host:6380/1");
        assert!(url.to_string().contains("hunter2"));
        assert_eq!(ok("redis://user@host").redacted(), "redis://user@host:6379");
    }

    // ---- redact ---------------------------------------------------------------------------

    #[test]
    fn redact_examples() {
        assert_eq!(redact("redis://u:pw@host"), "redis://u:***@host");
        assert_eq!(redact("redis://:pw@host/0?a=b"), "redis://:***@host/0?a=b");
        assert_eq!(redact("redis://u@host"), "redis://u@host");
        assert_eq!(redact("redis://host:6379"), "redis://host:6379");
        assert_eq!(redact("redis://u:p@ss@host"), "redis://u:***@host");
        assert_eq!(redact("redis://u:p/a?s@host"), "redis://u:***@host");
        assert_eq!(redact("redis:/u:pw@host"), "redis:***@host");
        assert_eq!(redact(""), "");
        assert_eq!(redact("@"), "@");
        assert_eq!(redact(":@"), ":***@");
        assert_eq!(redact("://"), "://");
        assert_eq!(redact("é://ü:ö@ä"), "é://ü:***@ä");
    }

    // ---- parse_duration -------------------------------------------------------------------

    #[test]
    fn parse_duration_accepts() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0.001ms"), Ok(Duration::from_micros(1)));
        assert_eq!(parse_duration("0.000001ms"), Ok(Duration::from_nanos(1)));
        assert_eq!(parse_duration("0.25m"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_duration("007s"), Ok(Duration::from_secs(7)));
        assert_eq!(
            parse_duration("1.0000000000000000000000009s"),
            Ok(Duration::from_secs(1))
        );
    }

    #[test]
    fn parse_duration_refuses() {
        let cases = [
            ("", "empty"),
            ("0", "no unit"),
            ("5", "no unit"),
            ("s", "number"),
            ("ms", "number"),
            ("-1s", "unknown unit"),
            ("+1s", "unknown unit"),
            (".5s", "number"),
            ("1.s", "number"),
            ("1..5s", "number"),
            ("1.2.3s", "number"),
            ("1x", "unknown unit `x`"),
            ("1S", "unknown unit"),
            ("1 s", "unknown unit"),
            ("1e3s", "unknown unit"),
            ("5µs", "unknown unit"),
            ("1d", "unknown unit"),
            ("99999999999999999999999h", "too large"),
            ("999999999999999999999999999999999999999999s", "too large"),
        ];
        for (input, needle) in cases {
            match parse_duration(input) {
                Ok(d) => panic!("{input:?} should be refused, got {d:?}"),
                Err(reason) => assert!(reason.contains(needle), "{input:?}: {reason}"),
            }
        }
    }

    // ---- parameter helpers ----------------------------------------------------------------

    fn reason(err: Error) -> String {
        match err {
            Error::InvalidUrl { reason, url } => {
                assert!(!url.contains("hunter2"), "{url}");
                reason
            }
            other => panic!("expected InvalidUrl, got {other:?}"),
        }
    }

    #[test]
    fn check_params_names_unknown_ones() {
        let url = ok("redis://:hunter2@h?prefix=a&ttl=1s&bogus=1");
        assert!(url.check_params(&["prefix", "ttl", "bogus"]).is_ok());
        let err = url.check_params(&["prefix", "ttl"]).expect_err("bogus");
        assert!(matches!(err, Error::InvalidUrl { .. }));
        assert!(!err.to_string().contains("hunter2"));
        assert_eq!(
            reason(err),
            "unknown parameter `bogus` (known: prefix, ttl)"
        );
        let err = url.check_params(&[]).expect_err("none known");
        assert_eq!(reason(err), "unknown parameter `prefix` (known: none)");
        assert!(ok("redis://h").check_params(&[]).is_ok());
    }

    #[test]
    fn duration_param() {
        let url = ok("redis://:hunter2@h?timeout=2s&bad=2&worse=soon");
        assert_eq!(
            url.duration_param("timeout").ok(),
            Some(Some(Duration::from_secs(2)))
        );
        assert_eq!(url.duration_param("absent").ok(), Some(None));
        let reason_bad = reason(url.duration_param("bad").expect_err("no unit"));
        assert!(reason_bad.contains("parameter `bad`"), "{reason_bad}");
        assert!(reason_bad.contains("no unit"), "{reason_bad}");
        let reason_worse = reason(url.duration_param("worse").expect_err("junk"));
        assert!(reason_worse.contains("parameter `worse`"), "{reason_worse}");
    }

    #[test]
    fn f64_param() {
        let url = ok("redlock://a?drift=0.01&neg=-1.5&exp=1e-3&inf=inf&nan=NaN&word=abc");
        assert_eq!(url.f64_param("drift").ok(), Some(Some(0.01)));
        assert_eq!(url.f64_param("neg").ok(), Some(Some(-1.5)));
        assert_eq!(url.f64_param("exp").ok(), Some(Some(0.001)));
        assert_eq!(url.f64_param("absent").ok(), Some(None));
        for name in ["inf", "nan", "word"] {
            let r = reason(url.f64_param(name).expect_err(name));
            assert!(r.contains(&format!("parameter `{name}`")), "{r}");
            assert!(r.contains("finite number"), "{r}");
        }
    }

    #[test]
    fn u64_param() {
        let url = ok(concat!(
            "etcd://a?n=42&max=18446744073709551615",
            "&over=18446744073709551616&neg=-1&plus=%2B1&f=1.5"
        ));
        assert_eq!(url.u64_param("n").ok(), Some(Some(42)));
        assert_eq!(url.u64_param("max").ok(), Some(Some(u64::MAX)));
        assert_eq!(url.u64_param("absent").ok(), Some(None));
        for name in ["over", "neg", "plus", "f"] {
            let r = reason(url.u64_param(name).expect_err(name));
            assert!(r.contains(&format!("parameter `{name}`")), "{r}");
        }
    }

    // ---- property tests -------------------------------------------------------------------

    fn scheme_strategy() -> impl Strategy<Value = Scheme> {
        prop_oneof![
            Just(Scheme::Memory),
            Just(Scheme::Redis),
            Just(Scheme::Rediss),
            Just(Scheme::Redlock),
            Just(Scheme::Etcd),
        ]
    }

    fn host_strategy() -> impl Strategy<Value = HostPort> {
        let host = prop_oneof![
            "[a-zA-Z_][a-zA-Z0-9_-]{0,10}(\\.[a-zA-Z0-9_-]{1,8}){0,3}",
            "[0-9]{1,6}",
            any::<Ipv4Addr>().prop_map(|ip| ip.to_string()),
            any::<Ipv6Addr>().prop_map(|ip| ip.to_string()),
        ];
        (host, 1..=u16::MAX).prop_map(|(host, port)| HostPort { host, port })
    }

    fn lock_url_strategy() -> impl Strategy<Value = LockUrl> {
        (
            scheme_strategy(),
            any::<Option<String>>(),
            any::<Option<String>>(),
            proptest::collection::vec(host_strategy(), 1..5),
            any::<Option<u32>>(),
            proptest::collection::vec((".+", any::<String>()), 0..4),
        )
            .prop_map(|(scheme, username, password, mut hosts, db, params)| {
                let username = username.filter(|u| !u.is_empty());
                match scheme {
                    Scheme::Memory => LockUrl {
                        scheme,
                        username: None,
                        password: None,
                        hosts: Vec::new(),
                        db: None,
                        params,
                    },
                    Scheme::Redis | Scheme::Rediss => {
                        hosts.truncate(1);
                        LockUrl {
                            scheme,
                            username,
                            password,
                            hosts,
                            db,
                            params,
                        }
                    }
                    Scheme::Redlock => LockUrl {
                        scheme,
                        username,
                        password,
                        hosts,
                        db,
                        params,
                    },
                    Scheme::Etcd => LockUrl {
                        scheme,
                        username,
                        password,
                        hosts,
                        db: None,
                        params,
                    },
                }
            })
    }

    /// Parses junk: never panics, refusals are `InvalidUrl`, and anything accepted prints
    /// back to text that parses to the same value.
    fn check_junk(input: &str) -> std::result::Result<(), TestCaseError> {
        match LockUrl::parse(input) {
            Ok(url) => {
                let text = url.to_string();
                prop_assert_eq!(LockUrl::parse(&text).ok(), Some(url.clone()), "{}", text);
                prop_assert_eq!(redact(&text), url.redacted());
            }
            Err(err) => prop_assert!(matches!(err, Error::InvalidUrl { .. }), "{:?}", err),
        }
        let _ = redact(input);
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn round_trip(url in lock_url_strategy()) {
            let text = url.to_string();
            let parsed = LockUrl::parse(&text);
            prop_assert!(parsed.is_ok(), "{:?} -> {:?}", text, parsed);
            prop_assert_eq!(parsed.ok(), Some(url.clone()));
            prop_assert_eq!(text.parse::<LockUrl>().ok(), Some(url.clone()));
            prop_assert_eq!(redact(&text), url.redacted());
        }

        #[test]
        fn junk_any_string(input in ".*") {
            check_junk(&input)?;
        }

        #[test]
        fn junk_url_characters(input in "[a-z:/@?&=%\\[\\],.0-9]{0,40}") {
            check_junk(&input)?;
        }

        #[test]
        fn junk_after_scheme(
            scheme in "(memory|redis|rediss|redlock|etcd|REDIS)",
            rest in "[a-z:/@?&=%\\[\\],.0-9A-F]{0,40}",
        ) {
            check_junk(&format!("{scheme}://{rest}"))?;
        }

        #[test]
        fn redact_hides_generated_passwords(
            url in lock_url_strategy().prop_filter("has hosts", |u| !u.hosts.is_empty()),
            secret in any::<String>(),
        ) {
            let mut url = url;
            let password = format!("SECRET{secret}");
            url.password = Some(password.clone());
            let text = url.to_string();
            let redacted = redact(&text);
            prop_assert!(!redacted.contains(&percent_encode(&password)), "{}", redacted);
            prop_assert!(!redacted.contains("SECRET"), "{}", redacted);
            prop_assert_eq!(&redacted, &url.redacted());
            let debug = format!("{url:?}");
            prop_assert!(!debug.contains("SECRET"), "{}", debug);
        }

        #[test]
        fn redact_hides_raw_passwords(
            scheme in "[a-z]{1,8}",
            user in "[^:]*",
            secret in any::<String>(),
            tail in "[^@]*",
        ) {
            let password = format!("SECRET{secret}");
            let input = format!("{scheme}://{user}:{password}@{tail}");
            let redacted = redact(&input);
            prop_assert_eq!(&redacted, &format!("{scheme}://{user}:***@{tail}"));
            if let Err(err) = LockUrl::parse(&input) {
                prop_assert!(matches!(err, Error::InvalidUrl { .. }), "{:?}", err);
                if let Error::InvalidUrl { url, .. } = &err {
                    prop_assert!(!url.contains(&password), "{}", url);
                }
            }
        }

        #[test]
        fn redact_never_panics(input in any::<String>()) {
            let _ = redact(&input);
        }

        #[test]
        fn parse_duration_never_panics(input in "[0-9.a-zµ]{0,30}|.*") {
            let _ = parse_duration(&input);
        }

        #[test]
        fn parse_duration_millis_round_trip(ms in 0u64..=u64::MAX / 1_000_000) {
            prop_assert_eq!(parse_duration(&format!("{ms}ms")), Ok(Duration::from_millis(ms)));
        }
    }
}
