//! What can go wrong with one request ([`Failure`]) and the error it becomes: the transient
//! [`Error::Unavailable`] or the permanent [`Error::Backend`], naming the server and the
//! operation.

use std::fmt;
use std::time::Duration;

use lock_core::Error;

/// The name errors, logs and capabilities carry.
pub const NAME: &str = "mysql";

/// Server error codes the backend acts on.
pub(crate) mod code {
    /// `ER_LOCK_DEADLOCK`: the transaction was rolled back whole; transient (the Locker's
    /// waiting policy may try an acquisition again; a release or a hand-over is sent again
    /// by the backend, see `Again::IfDeadlock`).
    pub(crate) const DEADLOCK: u16 = 1213;
    /// `ER_LOCK_WAIT_TIMEOUT`: the statement was rolled back, the transaction is open.
    pub(crate) const LOCK_WAIT_TIMEOUT: u16 = 1205;
    /// `ER_NO_SUCH_THREAD`: the session to end had already ended.
    pub(crate) const NO_SUCH_THREAD: u16 = 1094;
}

/// What went wrong with one request.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No answer within the operation timeout, while at the step named.
    Timeout(&'static str),
    /// The client library failed (I/O, protocol, an error the server sent).
    Client(mysql_async::Error),
    /// The server answered something the protocol does not allow.
    Reply(String),
    /// The connection's replies were out of step with its requests (the reply to a script
    /// was not its whole answer): given up, and whatever the script did is unknown.
    OutOfStep(String),
    /// The failure of a grouped script, which each request of the group reports.
    Shared(std::sync::Arc<Failure>),
}

impl Failure {
    /// Whether trying again later may succeed.
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Failure::Timeout(_) | Failure::OutOfStep(_) => true,
            Failure::Reply(_) => false,
            Failure::Client(e) => is_transient(e),
            Failure::Shared(f) => f.is_transient(),
        }
    }

    /// Whether the server rolled the whole transaction back for a deadlock (error 1213):
    /// nothing of the script happened.
    pub(crate) fn is_deadlock(&self) -> bool {
        match self {
            Failure::Client(mysql_async::Error::Server(s)) => s.code == code::DEADLOCK,
            Failure::Shared(f) => f.is_deadlock(),
            _ => false,
        }
    }

    /// Whether the connection this failure happened on must be replaced: it timed out (a
    /// request may still be on its way) or broke.
    /// The connection was found closed by the server (an I/O error: end of file, reset,
    /// broken pipe), not timed out or out of step.
    pub(crate) fn is_closed(&self) -> bool {
        match self {
            Failure::Client(mysql_async::Error::Io(_)) => true,
            Failure::Shared(f) => f.is_closed(),
            _ => false,
        }
    }

    pub(crate) fn breaks_connection(&self) -> bool {
        match self {
            Failure::Timeout(_) | Failure::OutOfStep(_) => true,
            Failure::Reply(_) => false,
            Failure::Client(e) => e.is_fatal(),
            Failure::Shared(f) => f.breaks_connection(),
        }
    }
}

fn is_transient(e: &mysql_async::Error) -> bool {
    match e {
        mysql_async::Error::Io(_) => true,
        // A connection that ended mid-request (a restart, a killed server).
        mysql_async::Error::Driver(d) => matches!(
            d,
            mysql_async::DriverError::ConnectionClosed | mysql_async::DriverError::PoolDisconnected
        ),
        mysql_async::Error::Server(s) => matches!(
            s.code,
            code::DEADLOCK
                | code::LOCK_WAIT_TIMEOUT
                // Too many connections, server shutdown in progress, query interrupted,
                // lost connection, server going away, out of resources.
                | 1040
                | 1053
                | 1317
                | 1158..=1161 | 2006 | 2013 | 1041 | 1927
        ),
        mysql_async::Error::Other(_) | mysql_async::Error::Url(_) => false,
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
        if let Failure::OutOfStep(what) = &self.failure {
            tracing::warn!(addr = %self.addr, op = self.op, "connection given up: {what}");
        }
        if self.failure.is_transient() {
            Error::unavailable(NAME, self)
        } else {
            Error::backend(NAME, self)
        }
    }
}

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mysql at {} ({}): ", self.addr, self.op)?;
        describe(&self.failure, self.timeout, f)
    }
}

fn describe(failure: &Failure, timeout: Duration, f: &mut fmt::Formatter<'_>) -> fmt::Result {
    match failure {
        Failure::Shared(shared) => describe(shared, timeout, f),
        Failure::Timeout(step) => write!(f, "no answer within {timeout:?} ({step})"),
        Failure::Reply(what) | Failure::OutOfStep(what) => f.write_str(what),
        Failure::Client(mysql_async::Error::Server(s)) => {
            match s.code {
                // Access denied (user, password, database).
                1044 | 1045 | 1698 => f.write_str(
                    "authentication refused (check the user name, password and database): ",
                )?,
                1049 => f.write_str("no such database: ")?,
                1142 | 1227 => f.write_str(
                    "permission denied (the user needs to create and use the lease tables): ",
                )?,
                _ => {}
            }
            write!(f, "{} (error {}, SQLSTATE {})", s.message, s.code, s.state)
        }
        Failure::Client(mysql_async::Error::Io(io)) => {
            let refused = matches!(io, mysql_async::IoError::Io(e)
                if e.kind() == std::io::ErrorKind::ConnectionRefused);
            if refused {
                write!(
                    f,
                    "connection refused (is MySQL/MariaDB running there?): {io}"
                )
            } else {
                write!(f, "{io}")
            }
        }
        Failure::Client(e) => write!(
            f,
            "{e} (does the server speak the MySQL protocol? is this a MySQL/MariaDB port?)"
        ),
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
