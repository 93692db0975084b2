//! Where the database is and how to talk to it: [`PostgresBuilder`], and the identifier
//! rules for the lease table's name ([`Names`]).

use std::fmt;
use std::time::Duration;

use lock_core::url::sql::{SqlConfig, SqlKind};
use lock_core::url::HostPort;
use lock_core::{Error, LockUrl, Result};

pub use lock_core::url::sql::check_identifier;

/// The port of a PostgreSQL server when an address or URL names none.
pub const DEFAULT_PORT: u16 = 5432;
/// The lease table used when none is given.
pub const DEFAULT_TABLE: &str = lock_core::url::sql::DEFAULT_TABLE;
/// The schema of the lease table when none is given.
pub const DEFAULT_SCHEMA: &str = "public";
/// The per-operation timeout used when none is given.
pub const DEFAULT_TIMEOUT: Duration = lock_core::url::sql::DEFAULT_TIMEOUT;
/// The URL parameters a `postgres://` or `postgresql://` URL may carry.
pub const URL_PARAMS: &[&str] = &["table", "schema", "timeout"];
/// The longest identifier PostgreSQL keeps (`NAMEDATALEN - 1` bytes); longer ones would be
/// cut silently, so they are refused.
pub const MAX_IDENTIFIER_LEN: usize = 63;

/// What `postgres://` URLs and their messages name.
const KIND: SqlKind = SqlKind {
    backend: "PostgreSQL",
    schemes: ["postgres", "postgresql"],
    default_port: DEFAULT_PORT,
    params: URL_PARAMS,
};

/// Typed configuration of one PostgreSQL database, and the way to connect to it.
///
/// Built from an address with [`PostgresBackend::builder`](crate::PostgresBackend::builder)
/// (or [`PostgresBuilder::new`]) and setters, or from a URL with
/// [`PostgresBuilder::from_url`]; nothing is checked or contacted until
/// [`build`](Self::build).
///
/// `Debug` shows the configuration as a URL with the password replaced by `***`.
///
/// # Examples
///
/// ```no_run
/// # async fn demo() -> lock_core::Result<()> {
/// use std::time::Duration;
/// use lock_postgres::PostgresBackend;
///
/// let backend = PostgresBackend::builder("127.0.0.1:5432")
///     .username("app")
///     .password("s3cret")
///     .database("app")
///     .schema("locks")
///     .table("leases")
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
pub struct PostgresBuilder {
    sql: SqlConfig,
    schema: String,
}

impl PostgresBuilder {
    /// A configuration for the server at `addr` (`host`, `host:port`, `[v6]:port`; the
    /// default port is 5432), user `postgres` without a password, the user's database,
    /// table `public.distlock_leases` and a 2 s operation timeout. A malformed `addr` is
    /// reported by `build` as [`Error::InvalidUrl`].
    pub fn new(addr: impl Into<String>) -> Self {
        PostgresBuilder {
            sql: SqlConfig::new(addr.into(), DEFAULT_PORT),
            schema: DEFAULT_SCHEMA.to_owned(),
        }
    }

    /// The configuration a `postgres://` or `postgresql://` URL describes:
    /// `postgres[ql]://[user[:password]@]host[:port][/database][?table=…&schema=…&timeout=…]`,
    /// default port 5432, the user's own database unless the path names one.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for another scheme, no host or several, a path with more than
    /// a database name, an unknown parameter, a `table` or `schema` that is not a plain
    /// identifier (see [`table`](Self::table)), or a `timeout` that is not a positive
    /// duration such as `500ms` or `2s`.
    pub fn from_url(url: &LockUrl) -> Result<Self> {
        let builder = PostgresBuilder {
            sql: SqlConfig::from_url(url, &KIND)?,
            schema: url.param("schema").unwrap_or(DEFAULT_SCHEMA).to_owned(),
        };
        builder.check()?;
        Ok(builder)
    }

    /// The role to log in as; default `postgres`.
    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.sql.username = Some(username.into());
        self
    }

    /// The role's password (any method the server asks for: SCRAM, MD5, cleartext).
    pub fn password(mut self, password: impl Into<String>) -> Self {
        self.sql.password = Some(password.into());
        self
    }

    /// The database to connect to; default: the one named like the user.
    pub fn database(mut self, database: impl Into<String>) -> Self {
        self.sql.database = Some(database.into());
        self
    }

    /// The schema of the lease table; default `public`. Created when missing.
    ///
    /// Like [`table`](Self::table), a plain identifier: an ASCII letter or `_`, then ASCII
    /// letters, digits or `_`, at most 63 bytes; checked before any SQL is built.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// The lease table; default `distlock_leases`. Created (with its fence sequence
    /// `<table>_fence`, `<table>_perms`, the holders of permits, and the functions that
    /// claim them, `<table>_take`, `_renew`, `_give` and `_clear`, and `<table>_runs` (with
    /// its index `<table>_slots`) and `<table>_fires`, the scheduler's run records and
    /// fire-time claims, and `<table>_leads`, the leaders' values of elections) when
    /// missing; a run records' table made by an older version is upgraded on connect.
    ///
    /// A plain identifier (an ASCII letter or `_`, then ASCII letters, digits or `_`, at most
    /// 57 bytes so that the sequence's name fits too), checked by `build` before any SQL is
    /// built: names are spliced into statements (quoted), so nothing else is let through.
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

    /// The configured schema and table, as given.
    pub fn table_name(&self) -> (&str, &str) {
        (&self.schema, &self.sql.table)
    }

    /// The configuration as a URL that [`from_url`](Self::from_url) turns back into it
    /// (password included; see `Debug` for a redacted form). `None` when the address given to
    /// [`new`](Self::new) is malformed.
    pub fn url(&self) -> Option<String> {
        self.to_lock_url().map(|url| url.to_string())
    }

    /// Validates everything `build` needs, before any I/O and before any SQL is built.
    pub(crate) fn check(&self) -> Result<Names> {
        let refuse = |reason: String| Error::invalid_url(&self.redacted(), reason);
        self.sql.check(refuse)?;
        Names::new(&self.schema, &self.sql.table).map_err(refuse)
    }

    pub(crate) fn host_port(&self) -> &HostPort {
        self.sql.host_port()
    }

    pub(crate) fn client_config(&self) -> tokio_postgres::Config {
        let addr = self.host_port();
        let mut config = tokio_postgres::Config::new();
        config
            .host(&addr.host)
            .port(addr.port)
            .user(self.sql.username.as_deref().unwrap_or("postgres"))
            .application_name("distlock")
            .connect_timeout(self.sql.timeout);
        if let Some(password) = &self.sql.password {
            config.password(password);
        }
        if let Some(database) = &self.sql.database {
            config.dbname(database);
        }
        config
    }

    /// The URL with the password hidden, for messages and `Debug`.
    pub(crate) fn redacted(&self) -> String {
        self.sql.redacted(self.to_lock_url())
    }

    fn to_lock_url(&self) -> Option<LockUrl> {
        let mut params = Vec::new();
        if self.schema != DEFAULT_SCHEMA {
            params.push(("schema".to_owned(), self.schema.clone()));
        }
        self.sql.to_lock_url(&KIND, params)
    }
}

impl fmt::Debug for PostgresBuilder {
    /// `PostgresBuilder("postgres://user:***@host:port/db?…")`: the password never appears.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("PostgresBuilder")
            .field(&format_args!("{}", self.redacted()))
            .finish()
    }
}

/// The validated, quoted names the statements are built from: only [`Names::new`] makes
/// them, after [`check_identifier`] accepted both parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Names {
    /// `"schema"`.
    pub(crate) schema: String,
    /// `"schema"."table"`.
    pub(crate) table: String,
    /// `"schema"."table_fence"`, the fence sequence.
    pub(crate) sequence: String,
    /// `"schema"."table_runs"`, the run records.
    pub(crate) runs: String,
    /// `"schema"."table_slots"`, the run records' unique index on `(job, slot)`.
    pub(crate) slots: String,
    /// `"schema"."table_fires"`, the fire-time claims.
    pub(crate) fires: String,
    /// `"schema"."table_perms"`, the holders of permits (semaphores, reader-writer keys).
    pub(crate) perms: String,
    /// `"schema"."table_leads"`, the leaders' values of elections.
    pub(crate) leads: String,
    /// The unquoted schema and table (for catalog look-ups, as parameters).
    pub(crate) raw_schema: String,
    pub(crate) raw_table: String,
    /// The release channel (`LISTEN` identifier and `pg_notify` argument).
    pub(crate) channel: String,
}

impl Names {
    pub(crate) fn new(schema: &str, table: &str) -> std::result::Result<Names, String> {
        check_identifier("schema", schema, MAX_IDENTIFIER_LEN)?;
        // Room for the sequence's `_fence`.
        check_identifier("table", table, MAX_IDENTIFIER_LEN - 6)?;
        let mut channel = format!("distlock.{schema}.{table}");
        if channel.len() > MAX_IDENTIFIER_LEN {
            channel = format!("distlock.{:016x}", fnv1a(channel.as_bytes()));
        }
        Ok(Names {
            schema: format!("\"{schema}\""),
            table: format!("\"{schema}\".\"{table}\""),
            sequence: format!("\"{schema}\".\"{table}_fence\""),
            // `_runs` is shorter than `_fence`: it fits wherever the sequence does.
            runs: format!("\"{schema}\".\"{table}_runs\""),
            // `_slots` is as long as `_fence`.
            slots: format!("\"{schema}\".\"{table}_slots\""),
            // `_fires` is as long as `_fence` (`_claims` would not fit the longest table).
            fires: format!("\"{schema}\".\"{table}_fires\""),
            // `_perms` is as long as `_fence` too.
            perms: format!("\"{schema}\".\"{table}_perms\""),
            // `_leads` too (`_leaders` would not fit the longest table).
            leads: format!("\"{schema}\".\"{table}_leads\""),
            raw_schema: schema.to_owned(),
            raw_table: table.to_owned(),
            channel,
        })
    }
}

/// FNV-1a: a stable hash for channel names too long to spell out (the same in every
/// process and version, unlike the standard library's hasher).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn url(s: &str) -> Result<PostgresBuilder> {
        PostgresBuilder::from_url(&LockUrl::parse(s)?)
    }

    #[test]
    fn urls_are_read_and_written_back() {
        let b =
            url("postgresql://app:s3cret@db:6543/locks?table=t1&schema=s1&timeout=500ms").unwrap();
        assert_eq!(b.table_name(), ("s1", "t1"));
        assert_eq!(b.get_timeout(), Duration::from_millis(500));
        let again = url(&b.url().unwrap()).unwrap();
        assert_eq!(again, b);
        let shown = format!("{b:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("app:***@db:6543/locks"), "{shown}");
        let b = url("postgres://h").unwrap();
        assert_eq!(b.host_port().port, DEFAULT_PORT);
        assert_eq!(b.table_name(), (DEFAULT_SCHEMA, DEFAULT_TABLE));
    }

    #[test]
    fn bad_urls_and_names_are_refused_before_any_sql() {
        for bad in [
            "redis://h",
            "postgres://",
            "postgres://a,b",
            "postgres://h/db/x",
            "postgres://h?prefix=x",
            "postgres://h?timeout=0s",
            "postgres://h?table=a;drop%20table%20x",
            "postgres://h?table=%22quoted%22",
            "postgres://h?table=1abc",
            "postgres://h?table=",
            "postgres://h?schema=a.b",
            "postgres://h?table=t%C3%A9",
        ] {
            assert!(
                matches!(url(bad), Err(Error::InvalidUrl { .. })),
                "{bad} should be refused"
            );
        }
        let long = "a".repeat(58);
        assert!(url(&format!("postgres://h?table={long}")).is_err());
        assert!(url(&format!("postgres://h?table={}", &long[..57])).is_ok());
        assert!(PostgresBuilder::new("h").table("x y").check().is_err());
        assert!(PostgresBuilder::new("h:0").check().is_err());
    }

    #[test]
    fn long_names_get_a_hashed_channel() {
        let names = Names::new(&"s".repeat(40), &"t".repeat(40)).unwrap();
        assert!(names.channel.len() <= MAX_IDENTIFIER_LEN);
        assert_eq!(
            Names::new("public", "x").unwrap().channel,
            "distlock.public.x"
        );
    }
}
