#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// docs.rs marks each item with the Cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

// Modules, each depending only on those listed after it (config excepted: the builder
// and what it builds name each other):
// - leaders: the leaders' values of elections (`LeaderValues`) in `<table>_leads`;
// - claims: the fire-time claims (`FireClaims`) in `<table>_fires`;
// - records: the run records (`RunRecords`) in `<table>_runs`;
// - permits: the claims of several permits (semaphores, reader-writer keys);
// - backend: `PostgresBackend`, the `Backend`, `HandOver`, `Admin` and `Baseline`;
// - watch: the `LISTEN` connection feeding the release notices;
// - batch: the group commit of acquisitions and releases (single or array statements);
// - connection: the lock connection, its prepared statements, reconnection, timeouts;
// - sql: the statements' text, built from validated names;
// - error: request failures and the errors they become; config: the builder and names.
mod backend;
mod batch;
mod claims;
mod config;
mod connection;
mod error;
mod leaders;
mod permits;
mod permits_sql;
mod records;
mod sql;
mod watch;

pub use backend::{PostgresBackend, BASELINE_CYCLE, CAPABILITIES};
pub use config::{check_identifier, PostgresBuilder, MAX_IDENTIFIER_LEN};
pub use config::{DEFAULT_PORT, DEFAULT_SCHEMA, DEFAULT_TABLE, DEFAULT_TIMEOUT, URL_PARAMS};
pub use error::NAME;

/// The SQL of a lock's grant and release on the lease table `table` of `schema`, as the
/// backend sends them, and the release channel: for the bench's raw loop that does the same
/// server work with no library around it. The grant takes `$1` the key (bytea), `$2` the
/// owner (text), `$3` the TTL in milliseconds (bigint) and answers one row; the release
/// takes the key, the owner and the channel (text). The tables must exist (a backend
/// connected to them made them). An invalid name is an error naming it.
#[cfg(feature = "internals")]
#[doc(hidden)]
pub fn lock_statements(
    schema: &str,
    table: &str,
) -> std::result::Result<(String, String, String), String> {
    let names = config::Names::new(schema, table)?;
    let sql = sql::Sql::new(&names);
    Ok((sql.acquire, sql.release, names.channel))
}
