//! What can go wrong with one request ([`Failure`]) and the error it becomes: the transient
//! [`Error::Unavailable`] or the permanent [`Error::Backend`], naming the server and the
//! operation.

use std::fmt;
use std::time::Duration;

use lock_core::Error;
use tokio_postgres::error::SqlState;

/// The name errors, logs and capabilities carry.
pub const NAME: &str = "postgres";

/// What went wrong with one request.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No answer within the operation timeout.
    Timeout,
    /// The client library failed (I/O, protocol, an error the server sent).
    Client(tokio_postgres::Error),
    /// The server answered something the protocol does not allow.
    Reply(String),
    /// The failure of a grouped statement, which each request of the group reports.
    Shared(std::sync::Arc<Failure>),
}

impl Failure {
    /// Whether trying again later may succeed.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Failure::Timeout => true,
            Failure::Reply(_) => false,
            Failure::Client(e) => is_transient(e),
            Failure::Shared(f) => f.is_transient(),
        }
    }

    /// Whether the connection this failure happened on must be replaced: it timed out (a
    /// request may still be on its way) or broke.
    pub(crate) fn breaks_connection(&self) -> bool {
        match self {
            Failure::Timeout => true,
            Failure::Reply(_) => false,
            Failure::Client(e) => e.is_closed() || e.as_db_error().is_none(),
            Failure::Shared(f) => f.breaks_connection(),
        }
    }
}

fn is_transient(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    match e.code() {
        Some(code) => {
            let class = &code.code()[..2];
            // 08: connection exception; 53: insufficient resources; 57P01..03: shutdown,
            // crash shutdown, cannot connect now (starting up); 40: serialization / deadlock.
            matches!(class, "08" | "53" | "40")
                || *code == SqlState::ADMIN_SHUTDOWN
                || *code == SqlState::CRASH_SHUTDOWN
                || *code == SqlState::CANNOT_CONNECT_NOW
                || *code == SqlState::QUERY_CANCELED
        }
        // No SQLSTATE: I/O (refused, reset) is transient; a reply that is not the
        // PostgreSQL protocol is not.
        None => std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>()),
    }
}

/// The source of the errors a backend returns: which server, which operation, what.
#[derive(Debug)]
pub(crate) struct RequestError {
    pub(crate) addr: String,
    pub(crate) op: &'static str,
    pub(crate) failure: Failure,
    pub(crate) timeout: Duration,
}

impl RequestError {
    /// The error a caller sees: [`Error::Unavailable`] when transient, else
    /// [`Error::Backend`].
    pub(crate) fn into_error(self) -> Error {
        if self.failure.is_transient() {
            Error::unavailable(NAME, self)
        } else {
            Error::backend(NAME, self)
        }
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "postgres at {} ({}): ", self.addr, self.op)?;
        self.describe(&self.failure, f)
    }
}

impl RequestError {
    fn describe(&self, failure: &Failure, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match failure {
            Failure::Shared(shared) => self.describe(shared, f),
            Failure::Timeout => write!(f, "no answer within {:?}", self.timeout),
            Failure::Reply(what) => f.write_str(what),
            Failure::Client(e) => match e.as_db_error() {
                Some(db) => {
                    let code = db.code();
                    if code.code().starts_with("28") {
                        f.write_str("authentication refused (check the user name and password): ")?;
                    } else if *code == SqlState::INVALID_CATALOG_NAME {
                        f.write_str("no such database: ")?;
                    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
                        f.write_str(
                            "permission denied (the role needs to create or use the lease table): ",
                        )?;
                    }
                    write!(f, "{} (SQLSTATE {})", db.message(), code.code())
                }
                None => {
                    let io = std::error::Error::source(e)
                        .and_then(|s| s.downcast_ref::<std::io::Error>());
                    match io {
                        Some(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
                            write!(f, "connection refused (is PostgreSQL running there?): {io}")
                        }
                        Some(io) if self.op == "connect" => write!(
                            f,
                            "{e}: {io} (is this a PostgreSQL server, and is it up?)"
                        ),
                        Some(io) => write!(f, "{e}: {io}"),
                        None if e.is_closed() => write!(
                            f,
                            "the server closed the connection (restarting, or not a PostgreSQL port?)"
                        ),
                        None => write!(
                            f,
                            "{e} (does the server speak the PostgreSQL protocol? is this a PostgreSQL port?)"
                        ),
                    }
                }
            },
        }
    }
}

impl std::error::Error for RequestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let mut failure = &self.failure;
        while let Failure::Shared(shared) = failure {
            failure = shared;
        }
        match failure {
            Failure::Client(e) => Some(e),
            _ => None,
        }
    }
}
