//! Where the database is and how to talk to it: [`MysqlBuilder`], and the identifier rules
//! for the lease table's name ([`Names`]).

use std::fmt;
use std::time::Duration;

use lock_core::url::{format_duration, Host, HostPort, UserInfo};
use lock_core::{Error, LockUrl, Result};

/// The port of a MySQL or MariaDB server when an address or URL names none.
pub const DEFAULT_PORT: u16 = 3306;
/// The lease table used when none is given.
pub const DEFAULT_TABLE: &str = "distlock_leases";
/// The per-operation timeout used when none is given.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// The URL parameters a `mysql://` or `mariadb://` URL may carry.
pub const URL_PARAMS: &[&str] = &["table", "timeout"];
/// The longest identifier MySQL and MariaDB keep (64 characters).
pub const MAX_IDENTIFIER_LEN: usize = 64;
/// The connections one backend keeps open: one more than the group commit sends at once,
/// so that an extension or an inspection never waits behind two groups.
pub(crate) const CONNECTIONS: usize = lock_core::group::MAX_IN_FLIGHT + 1;

/// Typed configuration of one MySQL or MariaDB database, and the way to connect to it.
///
/// Built from an address with [`MysqlBackend::builder`](crate::MysqlBackend::builder) (or
/// [`MysqlBuilder::new`]) and setters, or from a URL with [`MysqlBuilder::from_url`];
/// nothing is checked or contacted until [`build`](Self::build).
///
/// A setter is named after its property, the same name on every distlock builder
/// (`timeout`, `database`, `username`, `password`); its getter is `get_<property>`.
///
/// `Debug` shows the configuration as a URL with the password replaced by `***`.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_mysql::MysqlBackend;
///
/// let backend = MysqlBackend::builder("127.0.0.1:3306")
///     .username("app")
///     .password("s3cret")
///     .database("app")
///     .table("leases")
///     .timeout(Duration::from_millis(500))
///     .build()
///     .await?;
/// let locker = lock_core::Locker::new(backend);
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq)]
#[must_use = "setters return the changed value; it does nothing until used"]
pub struct MysqlBuilder {
    /// The parsed `host:port`, or the reason `addr` could not be parsed (reported by `build`).
    addr: std::result::Result<HostPort, (String, String)>,
    username: Option<String>,
    password: Option<String>,
    database: Option<String>,
    table: String,
    timeout: Duration,
}

impl MysqlBuilder {
    /// A configuration for the server at `addr` (`host`, `host:port`, `[v6]:port`; the
    /// default port is 3306), user `root` without a password, no database (one must be
    /// set), table `distlock_leases` and a 2 s operation timeout. A malformed `addr` is
    /// reported by `build` as [`Error::InvalidUrl`].
    pub fn new(addr: impl Into<String>) -> Self {
        let addr = addr.into();
        MysqlBuilder {
            addr: HostPort::parse(&addr, DEFAULT_PORT).map_err(|reason| (addr, reason)),
            username: None,
            password: None,
            database: None,
            table: DEFAULT_TABLE.to_owned(),
            timeout: DEFAULT_TIMEOUT,
        }
    }

    /// The configuration a `mysql://` or `mariadb://` URL describes:
    /// `mysql://[user[:password]@]host[:port]/database[?table=…&timeout=…]`, default port
    /// 3306.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for another scheme, no host or several, no database or a path
    /// with more than a database name, an unknown parameter, a `table` or database that is
    /// not a plain identifier (see [`table`](Self::table)), or a `timeout` that is not a
    /// positive duration such as `500ms` or `2s`.
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        if !matches!(url.scheme.as_str(), "mysql" | "mariadb") {
            return Err(url.invalid(format!(
                "the MySQL backend takes mysql:// or mariadb:// URLs, not {}://",
                url.scheme
            )));
        }
        let host = match url.hosts.as_slice() {
            [host] => host.with_default_port(DEFAULT_PORT),
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
        url.check_params(URL_PARAMS)?;
        let mut builder = MysqlBuilder {
            addr: Ok(host),
            username: url.username().filter(|u| !u.is_empty()).map(str::to_owned),
            password: url.password().map(str::to_owned),
            database: (!database.is_empty()).then(|| database.to_owned()),
            table: url.param("table").unwrap_or(DEFAULT_TABLE).to_owned(),
            timeout: DEFAULT_TIMEOUT,
        };
        if let Some(timeout) = url.duration_param("timeout")? {
            builder.timeout = timeout;
        }
        builder.check()?;
        Ok(builder)
    }

    /// The user to log in as; default `root`.
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    /// The user's password (`mysql_native_password`, or `caching_sha2_password` of MySQL
    /// 8, which over a connection without TLS asks the server for its RSA key).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.password = Some(password.into());
        self
    }

    /// The database (schema) holding the lease tables: required, and it must exist.
    ///
    /// A plain identifier, as [`table`](Self::table).
    pub fn database(mut self, database: impl Into<String>) -> Self {
        self.database = Some(database.into());
        self
    }

    /// The lease table; default `distlock_leases`. Created when missing, with
    /// `<table>_fence` (the fences' `AUTO_INCREMENT`) and `<table>_raw` (the raw
    /// baseline's rows).
    ///
    /// A plain identifier (an ASCII letter or `_`, then ASCII letters, digits or `_`, at
    /// most 58 bytes so that `<table>_fence` fits in 64), checked by `build` before any SQL
    /// is built: names are spliced into statements (quoted), so nothing else is let
    /// through.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// The bound on every operation, connecting included; default 2 s. When it passes the
    /// operation fails with the transient [`Error::Unavailable`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The configured operation timeout.
    pub fn get_timeout(&self) -> Duration {
        self.timeout
    }

    /// The configured database and table, as given.
    pub fn table_name(&self) -> (Option<&str>, &str) {
        (self.database.as_deref(), &self.table)
    }

    /// The configuration as a URL that [`from_url`](Self::from_url) turns back into it
    /// (password included; see `Debug` for a redacted form). `None` when the address given
    /// to [`new`](Self::new) is malformed.
    pub fn url(&self) -> Option<String> {
        self.to_lock_url().map(|url| url.to_string())
    }

    /// Validates everything `build` needs, before any I/O and before any SQL is built.
    pub(crate) fn check(&self) -> Result<Names> {
        if let Err((addr, reason)) = &self.addr {
            return Err(Error::invalid_url(addr, reason.clone()));
        }
        let refuse = |reason: String| Error::invalid_url(&self.redacted(), reason);
        if self.timeout.is_zero() {
            return Err(refuse(
                "parameter `timeout` must be greater than zero".into(),
            ));
        }
        let Some(database) = &self.database else {
            return Err(refuse(
                "a database is required (mysql://host/DATABASE, or `database(…)`)".into(),
            ));
        };
        Names::new(database, &self.table).map_err(refuse)
    }

    pub(crate) fn host_port(&self) -> &HostPort {
        match &self.addr {
            Ok(addr) => addr,
            Err(_) => unreachable!("check() refuses a malformed address"),
        }
    }

    pub(crate) fn client_opts(&self) -> mysql_async::Opts {
        let addr = self.host_port();
        let host = addr.host.trim_start_matches('[').trim_end_matches(']');
        mysql_async::OptsBuilder::default()
            .ip_or_hostname(host)
            .tcp_port(addr.port)
            .user(Some(self.username.as_deref().unwrap_or("root")))
            .pass(self.password.clone())
            .db_name(self.database.clone())
            .prefer_socket(false)
            .tcp_nodelay(true)
            // Every statement is a text script (see `sql.rs`): nothing to cache.
            .stmt_cache_size(0)
            .into()
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
        if self.table != DEFAULT_TABLE {
            params.push(("table".to_owned(), self.table.clone()));
        }
        if self.timeout != DEFAULT_TIMEOUT {
            params.push(("timeout".to_owned(), format_duration(self.timeout)));
        }
        Some(LockUrl {
            scheme: "mysql".to_owned(),
            userinfo: UserInfo::from_parts(self.username.as_deref(), self.password.as_deref()),
            hosts: vec![Host::from(host.clone())],
            path: self
                .database
                .as_ref()
                .map_or_else(String::new, |db| format!("/{db}")),
            params,
        })
    }
}

impl fmt::Debug for MysqlBuilder {
    /// `MysqlBuilder("mysql://user:***@host:port/db?…")`: the password never appears.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("MysqlBuilder")
            .field(&format_args!("{}", self.redacted()))
            .finish()
    }
}

/// The validated, quoted names the statements are built from: only [`Names::new`] makes
/// them, after [`check_identifier`] accepted both parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Names {
    /// `` `db`.`table` ``.
    pub(crate) table: String,
    /// `` `db`.`table_fence` ``, whose `AUTO_INCREMENT` draws the fences.
    pub(crate) fence: String,
    /// `` `db`.`table_raw` ``, the raw baseline's rows.
    pub(crate) raw: String,
}

impl Names {
    fn new(database: &str, table: &str) -> std::result::Result<Names, String> {
        check_identifier("database", database, MAX_IDENTIFIER_LEN)?;
        // Room for `_fence`.
        check_identifier("table", table, MAX_IDENTIFIER_LEN - 6)?;
        Ok(Names {
            table: format!("`{database}`.`{table}`"),
            fence: format!("`{database}`.`{table}_fence`"),
            raw: format!("`{database}`.`{table}_raw`"),
        })
    }
}

/// Accepts a plain SQL identifier: an ASCII letter or `_`, then ASCII letters, digits or
/// `_`, at most `max` bytes. Everything else (quotes, backquotes, dots, spaces, `;`,
/// non-ASCII) is refused, so a configured name can never change a statement's meaning.
///
/// # Errors
/// The reason, naming `what` (`table`, `database`).
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

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Result<MysqlBuilder> {
        MysqlBuilder::from_url(&LockUrl::parse(s)?)
    }

    #[test]
    fn urls_are_read_and_written_back() {
        let b = url("mariadb://app:s3cret@db:3307/locks?table=t1&timeout=500ms").unwrap();
        assert_eq!(b.table_name(), (Some("locks"), "t1"));
        assert_eq!(b.get_timeout(), Duration::from_millis(500));
        let again = url(&b.url().unwrap()).unwrap();
        assert_eq!(again, b);
        let shown = format!("{b:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("app:***@db:3307/locks"), "{shown}");
        let b = url("mysql://h/app").unwrap();
        assert_eq!(b.host_port().port, DEFAULT_PORT);
        assert_eq!(b.table_name(), (Some("app"), DEFAULT_TABLE));
    }

    #[test]
    fn bad_urls_and_names_are_refused_before_any_sql() {
        for bad in [
            "redis://h/db",
            "mysql:///db",
            "mysql://h",
            "mysql://a,b/db",
            "mysql://h/db/x",
            "mysql://h/db?prefix=x",
            "mysql://h/db?timeout=0s",
            "mysql://h/db?table=a;drop%20table%20x",
            "mysql://h/db?table=%60quoted%60",
            "mysql://h/db?table=1abc",
            "mysql://h/db?table=",
            "mysql://h/a.b",
            "mysql://h/db?table=t%C3%A9",
        ] {
            assert!(
                matches!(url(bad), Err(Error::InvalidUrl { .. })),
                "{bad} should be refused"
            );
        }
        let long = "a".repeat(59);
        assert!(url(&format!("mysql://h/db?table={long}")).is_err());
        assert!(url(&format!("mysql://h/db?table={}", &long[..58])).is_ok());
        assert!(MysqlBuilder::new("h")
            .database("d")
            .table("x y")
            .check()
            .is_err());
        assert!(MysqlBuilder::new("h:0").database("d").check().is_err());
        assert!(MysqlBuilder::new("h").check().is_err(), "no database");
    }
}
