//! What the builders of SQL backends (`postgres://`, `mysql://`) share: one database
//! server at one address, credentials, a database, a lease table, an operation timeout
//! ([`SqlConfig`]), and the rule for the names spliced into their statements
//! ([`check_identifier`]). Each builder keeps what is its own (its schemes, default
//! port and user, further parameters, the names it derives from the table) and its
//! documented setters; the parsing, the checks and their error messages live here once.

use std::time::Duration;

use super::{format_duration, Host, HostPort, LockUrl, UserInfo};
use crate::error::{Error, Result};

/// The lease table used when none is given.
pub const DEFAULT_TABLE: &str = "distlock_leases";
/// The per-operation timeout used when none is given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);

/// Which SQL backend a configuration is for: what its URLs and messages name.
#[derive(Clone, Copy, Debug)]
pub struct SqlKind {
    /// The backend's name in messages (`PostgreSQL`, `MySQL`).
    pub backend: &'static str,
    /// The schemes it takes, the first being the one its URLs are written with.
    pub schemes: [&'static str; 2],
    /// The server's port when an address or URL names none.
    pub default_port: u16,
    /// The URL parameters it takes (`table` and `timeout` among them).
    pub params: &'static [&'static str],
}

/// The configuration every SQL backend's builder holds: the server's address, the user,
/// password and database, the lease table and the operation timeout.
///
/// Nothing is checked or contacted when it is made or changed: a malformed address is
/// kept with its reason and refused by [`check`](Self::check), as a zero timeout is.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqlConfig {
    /// The parsed `host:port`, or the address as given and why it could not be parsed.
    pub addr: std::result::Result<HostPort, (String, String)>,
    /// The user to log in as; `None`: the backend's default.
    pub username: Option<String>,
    /// The user's password.
    pub password: Option<String>,
    /// The database; `None`: the backend's default, or none.
    pub database: Option<String>,
    /// The lease table, as given (checked by the builder before any SQL is built).
    pub table: String,
    /// The bound on every operation, connecting included.
    pub timeout: Duration,
}

impl SqlConfig {
    /// The configuration for the server at `addr` (`host`, `host:port`, `[v6]:port`,
    /// `default_port` when it names none): no user, password or database, table
    /// [`DEFAULT_TABLE`], timeout [`DEFAULT_TIMEOUT`].
    pub fn new(addr: String, default_port: u16) -> SqlConfig {
        SqlConfig {
            addr: HostPort::parse(&addr, default_port).map_err(|reason| (addr, reason)),
            username: None,
            password: None,
            database: None,
            table: DEFAULT_TABLE.to_owned(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The configuration `url` describes:
    /// `scheme://[user[:password]@]host[:port][/database][?table=…&timeout=…]`, one of
    /// `kind`'s schemes, only `kind`'s parameters; an empty user name is none.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for another scheme, no host or several, a path with more than
    /// a database name, an unknown parameter, or a `timeout` that is not a duration.
    pub fn from_url(url: &LockUrl, kind: &SqlKind) -> Result<SqlConfig> {
        let [scheme, alias] = kind.schemes;
        if url.scheme != scheme && url.scheme != alias {
            return Err(url.invalid(format!(
                "the {} backend takes {scheme}:// or {alias}:// URLs, not {}://",
                kind.backend, url.scheme
            )));
        }
        let host = match url.hosts.as_slice() {
            [host] => host.with_default_port(kind.default_port),
            [] => return Err(url.invalid(format!("{}:// needs a host", url.scheme))),
            _ => {
                return Err(url.invalid(format!(
                    "{}:// names one host (several are not supported)",
                    url.scheme
                )))
            }
        };
        let database = url.path.strip_prefix('/').unwrap_or(&url.path);
        if database.contains('/') {
            return Err(url.invalid(format!("the path names one database, not `{}`", url.path)));
        }
        url.check_params(kind.params)?;
        Ok(SqlConfig {
            addr: Ok(host),
            username: url.username().filter(|u| !u.is_empty()).map(str::to_owned),
            password: url.password().map(str::to_owned),
            database: (!database.is_empty()).then(|| database.to_owned()),
            table: url.param("table").unwrap_or(DEFAULT_TABLE).to_owned(),
            timeout: url.duration_param("timeout")?.unwrap_or(DEFAULT_TIMEOUT),
        })
    }

    /// Refuses a malformed address (with the address as given) and a zero timeout (with
    /// the error `refuse` makes of the reason).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`].
    pub fn check(&self, refuse: impl Fn(String) -> Error) -> Result<()> {
        if let Err((addr, reason)) = &self.addr {
            return Err(Error::invalid_url(addr, reason.clone()));
        }
        if self.timeout.is_zero() {
            return Err(refuse(
                "parameter `timeout` must be greater than zero".into(),
            ));
        }
        Ok(())
    }

    /// The server's address.
    ///
    /// # Panics
    /// When the address is malformed: call it only after [`check`](Self::check) passed.
    pub fn host_port(&self) -> &HostPort {
        match &self.addr {
            Ok(addr) => addr,
            Err(_) => unreachable!("check() refuses a malformed address"),
        }
    }

    /// The configuration as a URL of `kind`'s first scheme: `params` (the builder's own,
    /// already left out when default) first, then `table` and `timeout` when not the
    /// defaults. `None` when the address is malformed.
    pub fn to_lock_url(
        &self,
        kind: &SqlKind,
        mut params: Vec<(String, String)>,
    ) -> Option<LockUrl> {
        let host = self.addr.as_ref().ok()?;
        if self.table != DEFAULT_TABLE {
            params.push(("table".to_owned(), self.table.clone()));
        }
        if self.timeout != DEFAULT_TIMEOUT {
            params.push(("timeout".to_owned(), format_duration(self.timeout)));
        }
        Some(LockUrl {
            scheme: kind.schemes[0].to_owned(),
            userinfo: UserInfo::from_parts(self.username.as_deref(), self.password.as_deref()),
            hosts: vec![Host::from(host.clone())],
            path: self
                .database
                .as_ref()
                .map_or_else(String::new, |db| format!("/{db}")),
            params,
        })
    }

    /// `url` (this configuration's, from [`to_lock_url`](Self::to_lock_url)) with the
    /// password hidden, for messages and `Debug`; the malformed address when there is no
    /// URL.
    pub fn redacted(&self, url: Option<LockUrl>) -> String {
        match (url, &self.addr) {
            (Some(url), _) => url.redacted(),
            (None, Err((addr, _))) => format!("<invalid address {addr:?}>"),
            (None, Ok(_)) => unreachable!("to_lock_url only fails on a bad address"),
        }
    }
}

/// Accepts a plain SQL identifier: an ASCII letter or `_`, then ASCII letters, digits or
/// `_`, at most `max` bytes. Everything else (quotes, backquotes, dots, spaces, `;`,
/// non-ASCII) is refused, so a configured name can never change a statement's meaning.
///
/// # Errors
/// The reason, naming `what` (`table`, `schema`, `database`).
pub fn check_identifier(what: &str, name: &str, max: usize) -> std::result::Result<(), String> {
    let mut chars = name.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !plain {
        return Err(format!(
            "{what} {name:?} is not a plain identifier (an ASCII letter or `_`, then letters, digits or `_`)"
        ));
    }
    if name.len() > max {
        return Err(format!("{what} {name:?} is longer than {max} bytes"));
    }
    Ok(())
}
