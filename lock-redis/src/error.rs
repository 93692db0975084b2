//! What can go wrong with one request to a Redis server ([`Failure`]), and how it is
//! reported: [`NodeError`] names the server and the operation, folded into the transient
//! [`Error::Unavailable`] or the permanent [`Error::Backend`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use lock_core::Error;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};

/// The name errors carry.
pub(crate) const NAME: &str = "redis";

/// What went wrong with one request.
#[derive(Debug)]
pub(crate) enum Failure {
    /// No answer within the operation timeout.
    Timeout,
    /// The client library failed (I/O, protocol, server error).
    Redis(RedisError),
    /// The server answered something the protocol does not allow.
    Reply(String),
    /// The server refused an operation on this request's keys (e.g. `WRONGTYPE`: a value
    /// of another type at the lock key); the rest of its group was answered.
    Refused(String),
    /// The failure of a group this request was part of.
    Shared(Arc<Failure>),
    /// No sentinel named a usable master (`sentinel.rs`): transient when some sentinel or
    /// master could not be reached or was not a master yet (a failover under way).
    Discovery { transient: bool, message: String },
}

impl Failure {
    /// A reply the protocol does not allow.
    pub(crate) fn unexpected(reply: &Value) -> Failure {
        Failure::Reply(format!("unexpected reply {reply:?}"))
    }

    /// The failure itself, looking through a group's.
    fn own(&self) -> &Failure {
        match self {
            Failure::Shared(inner) => inner.own(),
            other => other,
        }
    }

    fn is_transient(&self) -> bool {
        match self {
            Failure::Timeout => true,
            Failure::Reply(_) => false,
            // A node that became a replica refuses writes; the master is elsewhere.
            Failure::Refused(message) => is_readonly(message),
            Failure::Discovery { transient, .. } => *transient,
            Failure::Shared(failure) => failure.is_transient(),
            // A certificate refused, or a server that does not speak TLS: retrying cannot help.
            Failure::Redis(e) if tls_problem(e).is_some() => false,
            Failure::Redis(e) => match e.kind() {
                // A cluster client without a connection to the slot's node (mid-failover).
                ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => true,
                ErrorKind::Server(kind) => matches!(
                    kind,
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                ),
                // A long script of another client blocks the server for a while.
                ErrorKind::Extension => e.code() == Some("BUSY"),
                _ => false,
            },
        }
    }
}

/// Whether a server's error message is `READONLY` (a replica refusing a write).
pub(crate) fn is_readonly(message: &str) -> bool {
    message.starts_with("READONLY")
}

/// What a TLS failure most likely means, for the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "tls"), allow(dead_code))]
pub(crate) enum TlsProblem {
    /// The server's certificate does not chain to a trusted CA, or names another host.
    Untrusted,
    /// The peer answered the handshake with something that is not TLS.
    NotTls,
    /// The server ended the handshake with an alert (e.g. it demands a client certificate).
    Refused,
}

/// The TLS problem behind `e`, if rustls reported one.
#[cfg(feature = "tls")]
pub(crate) fn tls_problem(e: &RedisError) -> Option<TlsProblem> {
    Some(match lock_core::find_cause::<rustls::Error>(e)? {
        rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => {
            TlsProblem::Untrusted
        }
        rustls::Error::InvalidMessage(_)
        | rustls::Error::InappropriateMessage { .. }
        | rustls::Error::InappropriateHandshakeMessage { .. } => TlsProblem::NotTls,
        _ => TlsProblem::Refused,
    })
}

#[cfg(not(feature = "tls"))]
pub(crate) fn tls_problem(_e: &RedisError) -> Option<TlsProblem> {
    None
}

/// The source of the errors a `RedisNode` returns: which server, which operation, what.
#[derive(Debug)]
pub(crate) struct NodeError {
    pub(crate) addr: String,
    pub(crate) op: &'static str,
    pub(crate) failure: Failure,
    pub(crate) timeout: Duration,
    pub(crate) tls: bool,
}

impl NodeError {
    /// The error a caller sees: [`Error::Unavailable`] when the failure is transient (a
    /// timeout, an I/O error, a server busy or loading), else [`Error::Backend`].
    pub(crate) fn into_error(self) -> Error {
        let transient = self.failure.is_transient();
        if transient {
            Error::unavailable(NAME, self)
        } else {
            Error::backend(NAME, self)
        }
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redis at {} ({}): ", self.addr, self.op)?;
        // The first PING of a connection is where a wrong port or a missing TLS shows.
        let checking = self.op == "PING";
        match self.failure.own() {
            Failure::Timeout if checking && self.tls => write!(
                f,
                "no answer within {:?} (does the server speak TLS? rediss:// needs it)",
                self.timeout
            ),
            Failure::Timeout => write!(f, "no answer within {:?}", self.timeout),
            Failure::Redis(e) if tls_problem(e).is_some() => match tls_problem(e) {
                Some(TlsProblem::Untrusted) => write!(
                    f,
                    "the server's TLS certificate is not trusted (is it signed by the CA given \
                     with `ca=`, or by a system root without one? does it name this host?): {e}"
                ),
                Some(TlsProblem::NotTls) => write!(
                    f,
                    "the server does not speak TLS (a plain-text port? use redis://): {e}"
                ),
                _ => write!(
                    f,
                    "the server refused the TLS handshake (does it demand a client certificate? \
                     give one with `cert=` and `key=`): {e}"
                ),
            },
            Failure::Redis(e)
                if checking && e.is_connection_dropped() && !e.is_connection_refusal() =>
            {
                let hint = if self.tls {
                    "is this a Redis port?"
                } else {
                    "is this a Redis port? a TLS-only port needs rediss://"
                };
                write!(f, "the server closed the connection on PING ({hint}): {e}")
            }
            Failure::Reply(what) => f.write_str(what),
            Failure::Discovery { message, .. } => f.write_str(message),
            Failure::Refused(what) => write!(
                f,
                "the server refused an operation on the lock's keys: {what}"
            ),
            Failure::Shared(_) => f.write_str("the request's group failed"),
            Failure::Redis(e) => {
                let auth = e.kind() == ErrorKind::AuthenticationFailed
                    || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"));
                if auth {
                    write!(
                        f,
                        "authentication refused (check the user name and password): {e}"
                    )
                } else if is_acl_refusal(e) {
                    write!(
                        f,
                        "the ACL user lacks a permission on the lock's keys, channel or commands \
                         (see the minimal ACL in lock-redis' README): {e}"
                    )
                } else if e.kind() == ErrorKind::Parse {
                    write!(
                        f,
                        "the server does not speak the Redis protocol (is this a Redis port?): {e}"
                    )
                } else if e.is_connection_refusal() {
                    write!(f, "connection refused (is Redis running there?): {e}")
                } else {
                    write!(f, "{e}")
                }
            }
        }
    }
}

/// Whether the server refused a command for the user's ACL: `NOPERM`, or the generic error
/// a script gets for a command its user may not run.
fn is_acl_refusal(e: &redis::RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || e.to_string()
            .contains("The user executing the script can't run this command")
}

impl std::error::Error for NodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self.failure.own() {
            Failure::Redis(e) => Some(e),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_are_classified() {
        assert!(Failure::Timeout.is_transient());
        assert!(!Failure::Reply("x".into()).is_transient());
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(Failure::Redis(io).is_transient());
        let auth = RedisError::from((ErrorKind::AuthenticationFailed, "bad"));
        assert!(!Failure::Redis(auth).is_transient());
        let no_node = RedisError::from((ErrorKind::ClusterConnectionNotFound, "none"));
        assert!(Failure::Redis(no_node).is_transient());
    }
}
