//! etcd-client errors as distlock errors.

use std::fmt;
use std::time::Duration;

use lock_core::Error;

/// The backend's name in errors and capabilities.
pub(crate) const NAME: &str = "etcd";

/// gRPC status codes (`tonic::Code` as numbers, so as not to depend on tonic's version).
mod code {
    pub const CANCELLED: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    pub const DEADLINE_EXCEEDED: i32 = 4;
    pub const NOT_FOUND: i32 = 5;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const ABORTED: i32 = 10;
    pub const UNAVAILABLE: i32 = 14;
    pub const UNAUTHENTICATED: i32 = 16;
}

/// A client error with what the backend was doing when it happened.
#[derive(Debug)]
pub(crate) struct Failure {
    doing: String,
    source: etcd_client::Error,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.doing, self.source)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Converts a client error met while `doing` something: connection trouble, timeouts,
/// leader elections and overload are transient ([`Error::Unavailable`]); refusals (bad
/// credentials, permissions, malformed requests) are not ([`Error::Backend`]).
pub(crate) fn failed(doing: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> Error {
    let doing = doing.into();
    move |source| {
        let transient = is_transient(&source);
        let failure = Failure { doing, source };
        if transient {
            Error::unavailable(NAME, failure)
        } else {
            Error::backend(NAME, failure)
        }
    }
}

pub(crate) fn is_transient(e: &etcd_client::Error) -> bool {
    match e {
        _ if is_expired_token(e) => true,
        etcd_client::Error::GRpcStatus(status) => matches!(
            status.code() as i32,
            code::CANCELLED
                | code::UNKNOWN
                | code::DEADLINE_EXCEEDED
                | code::RESOURCE_EXHAUSTED
                | code::ABORTED
                | code::UNAVAILABLE
        ),
        etcd_client::Error::TransportError(_)
        | etcd_client::Error::IoError(_)
        | etcd_client::Error::WatchError(_)
        | etcd_client::Error::LeaseKeepAliveError(_) => true,
        _ => false,
    }
}

/// Whether etcd refused a request because its authentication token expired (etcd-client
/// does not renew tokens): transient, since authenticating again fixes it.
fn is_expired_token(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(status)
        if status.code() as i32 == code::UNAUTHENTICATED
            && status.message().contains("invalid auth token"))
}

/// Whether `e` reports an expired authentication token.
pub(crate) fn token_expired(e: &Error) -> bool {
    match e {
        Error::Unavailable { source, .. } => source
            .downcast_ref::<Failure>()
            .is_some_and(|f| is_expired_token(&f.source)),
        _ => false,
    }
}

/// Whether etcd refused a request because the lease it names does not exist (expired or
/// revoked).
pub(crate) fn is_lease_not_found(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() as i32 == code::NOT_FOUND && status.message().contains("lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(msg) => msg.contains("not found"),
        _ => false,
    }
}

/// The error of an operation that did not finish within the timeout.
pub(crate) fn timed_out(doing: &str, timeout: Duration) -> Error {
    Error::unavailable(
        NAME,
        format!("{doing}: no answer from etcd within {timeout:?}"),
    )
}

/// An answer etcd's protocol does not allow.
pub(crate) fn unexpected(what: &'static str) -> Error {
    Error::backend(NAME, format!("unexpected answer from etcd: {what}"))
}

/// An acquire transaction's error: a lease that ran out before the transaction reached
/// etcd (a slow network) is transient like a timeout, not a refusal.
pub(crate) fn acquire_failed(e: etcd_client::Error) -> Error {
    if is_lease_not_found(&e) {
        Error::unavailable(NAME, LEASE_RAN_OUT)
    } else {
        failed("acquiring")(e)
    }
}

pub(crate) const LEASE_RAN_OUT: &str = "the lease ran out before the request reached etcd";
