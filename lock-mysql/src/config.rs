//! Where the database is and how to talk to it: [`MysqlBuilder`], and the identifier rules
//! for the lease table's name ([`Names`]).

use std::fmt;
use std::time::Duration;

use lock_core::url::sql::{SqlConfig, SqlKind};
use lock_core::url::HostPort;
use lock_core::{Error, LockUrl, Result};

pub use lock_core::url::sql::check_identifier;

/// The port of a MySQL or MariaDB server when an address or URL names none.
pub const DEFAULT_PORT: u16 = 3306;
/// The lease table used when none is given.
pub const DEFAULT_TABLE: &str = lock_core::url::sql::DEFAULT_TABLE;
/// The per-operation timeout used when none is given.
pub const DEFAULT_TIMEOUT: Duration = lock_core::url::sql::DEFAULT_TIMEOUT;
/// The URL parameters a `mysql://` or `mariadb://` URL may carry.
pub const URL_PARAMS: &[&str] = &["table", "timeout"];
/// The longest identifier MySQL and MariaDB keep (64 characters).
pub const MAX_IDENTIFIER_LEN: usize = 64;
/// What `mysql://` URLs and their messages name.
const KIND: SqlKind = SqlKind {
    backend: "MySQL",
    schemes: ["mysql", "mariadb"],
    default_port: DEFAULT_PORT,
    params: URL_PARAMS,
};
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
    sql: SqlConfig,
}

impl MysqlBuilder {
    /// A configuration for the server at `addr` (`host`, `host:port`, `[v6]:port`; the
    /// default port is 3306), user `root` without a password, no database (one must be
    /// set), table `distlock_leases` and a 2 s operation timeout. A malformed `addr` is
    /// reported by `build` as [`Error::InvalidUrl`].
    pub fn new(addr: impl Into<String>) -> Self {
        MysqlBuilder {
            sql: SqlConfig::new(addr.into(), DEFAULT_PORT),
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
        let builder = MysqlBuilder {
            sql: SqlConfig::from_url(url, &KIND)?,
        };
        builder.check()?;
        Ok(builder)
    }

    /// The user to log in as; default `root`.
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.sql.username = Some(username.into());
        self
    }

    /// The user's password (`mysql_native_password`, or `caching_sha2_password` of MySQL
    /// 8, which over a connection without TLS asks the server for its RSA key).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.sql.password = Some(password.into());
        self
    }

    /// The database (schema) holding the lease tables: required, and it must exist.
    ///
    /// A plain identifier, as [`table`](Self::table).
    pub fn database(mut self, database: impl Into<String>) -> Self {
        self.sql.database = Some(database.into());
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
        self.sql.table = table.into();
        self
    }

    /// The bound on every operation, connecting included; default 2 s. When it passes the
    /// operation fails with the transient [`Error::Unavailable`].
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.sql.timeout = timeout;
        self
    }

    /// The configured operation timeout.
    pub fn get_timeout(&self) -> Duration {
        self.sql.timeout
    }

    /// The configured database and table, as given.
    pub fn table_name(&self) -> (Option<&str>, &str) {
        (self.sql.database.as_deref(), &self.sql.table)
    }

    /// The configuration as a URL that [`from_url`](Self::from_url) turns back into it
    /// (password included; see `Debug` for a redacted form). `None` when the address given
    /// to [`new`](Self::new) is malformed.
    pub fn url(&self) -> Option<String> {
        self.to_lock_url().map(|url| url.to_string())
    }

    /// Validates everything `build` needs, before any I/O and before any SQL is built.
    pub(crate) fn check(&self) -> Result<Names> {
        let refuse = |reason: String| Error::invalid_url(&self.redacted(), reason);
        self.sql.check(refuse)?;
        let Some(database) = &self.sql.database else {
            return Err(refuse(
                "a database is required (mysql://host/DATABASE, or `database(…)`)".into(),
            ));
        };
        Names::new(database, &self.sql.table).map_err(refuse)
    }

    pub(crate) fn host_port(&self) -> &HostPort {
        self.sql.host_port()
    }

    pub(crate) fn client_opts(&self) -> mysql_async::Opts {
        let addr = self.host_port();
        let host = addr.host.trim_start_matches('[').trim_end_matches(']');
        mysql_async::OptsBuilder::default()
            .ip_or_hostname(host)
            .tcp_port(addr.port)
            .user(Some(self.sql.username.as_deref().unwrap_or("root")))
            .pass(self.sql.password.clone())
            .db_name(self.sql.database.clone())
            .prefer_socket(false)
            .tcp_nodelay(true)
            // Every statement is a text script (see `sql.rs`): nothing to cache.
            .stmt_cache_size(0)
            .into()
    }

    /// The URL with the password hidden, for messages and `Debug`.
    pub(crate) fn redacted(&self) -> String {
        self.sql.redacted(self.to_lock_url())
    }

    fn to_lock_url(&self) -> Option<LockUrl> {
        self.sql.to_lock_url(&KIND, Vec::new())
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
