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

/// A client error with what the backend was doing when it happened, and what it most
/// likely means when that can be told.
#[derive(Debug)]
pub(crate) struct Failure {
    doing: String,
    source: etcd_client::Error,
    hint: Option<&'static str>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.hint {
            Some(hint) => write!(f, "{}: {hint}: {}", self.doing, self.source),
            None => write!(f, "{}: {}", self.doing, self.source),
        }
    }
}

const UNTRUSTED: &str = "the member's TLS certificate is not trusted (is it signed by the CA \
    given with `ca=`, or by a system root without one? does it name this host?)";
const NOT_TLS: &str =
    "the member does not speak TLS (a plain-text member takes no `tls`, `ca`, `cert`, `key`)";
const HANDSHAKE_REFUSED: &str = "the member refused the TLS handshake (does it demand a client \
    certificate? give one with `cert=` and `key=`)";
const TLS_EOF: &str = "the member closed the connection during the TLS handshake (does it \
    serve TLS? a plain-text member takes no `tls`, `ca`, `cert`, `key`)";
const RESET_TLS: &str = "the member reset the connection over TLS (does it serve TLS? a \
    plain-text member takes no `tls`, `ca`, `cert`, `key`; does it demand a client \
    certificate? give one with `cert=` and `key=`)";
const CLOSED_TLS: &str = "the member closed the connection after the TLS handshake (does it \
    demand a client certificate? give one with `cert=` and `key=`)";
const CLOSED_PLAIN: &str = "the member closed the connection (does it serve TLS only? add \
    `tls=true`, or `ca=` for a private CA)";
const AUTH_REFUSED: &str = "authentication refused (check the user name and password)";
const NO_PERMISSION: &str = "the user's roles do not grant read and write on the key prefix \
    (see the roles in lock-etcd's README)";

/// What `e` most likely means, and whether retrying cannot help, as far as its causes tell
/// (a TLS refusal, refused credentials or permissions).
fn hint(e: &etcd_client::Error) -> Option<(&'static str, bool)> {
    // etcd-client's error does not expose its causes (`source`), and some layers between
    // rustls and it keep only the text: its debug form still names rustls' error.
    let text = format!("{e:?}");
    if text.contains("InvalidCertificate(") || text.contains("invalid peer certificate") {
        return Some((UNTRUSTED, true));
    }
    if text.contains("received fatal alert") {
        return Some((HANDSHAKE_REFUSED, true));
    }
    if text.contains("InvalidContentType") || text.contains("corrupt message") {
        return Some((NOT_TLS, true));
    }
    if text.contains("authentication failed") {
        return Some((AUTH_REFUSED, true));
    }
    if text.contains("permission denied") {
        return Some((NO_PERMISSION, true));
    }
    None
}

/// Adds to a transient error met while connecting what it most likely means given whether
/// TLS is on: a member closing the TLS handshake (plain text there?), or closing a
/// plain-text connection (TLS only there?).
pub(crate) fn on_connect(tls: bool) -> impl Fn(Error) -> Error {
    move |e| match e {
        Error::Unavailable { backend, source } => match source.downcast::<Failure>() {
            Ok(mut failure) => {
                let text = format!("{:?}", failure.source);
                let closed = text.contains("connection closed") || text.contains("broken pipe");
                let reset = text.contains("reset by peer");
                if failure.hint.is_none() {
                    failure.hint = if tls && text.contains("tls handshake eof") {
                        Some(TLS_EOF)
                    } else if tls && reset {
                        // A plain-text member may reset the connection on a ClientHello
                        // instead of closing it (seen once in 50 runs on a loaded machine).
                        Some(RESET_TLS)
                    } else if tls && closed {
                        // TLS 1.3: the member checks the client's certificate after the
                        // handshake, and its alert may be lost with the connection.
                        Some(CLOSED_TLS)
                    } else if !tls && (closed || reset) {
                        // A TLS-only member may reset rather than close the connection:
                        // it closes with the client's unread HTTP/2 preface in its
                        // buffer (CI saw it once).
                        Some(CLOSED_PLAIN)
                    } else {
                        None
                    };
                }
                Error::Unavailable {
                    backend,
                    source: failure,
                }
            }
            Err(source) => Error::Unavailable { backend, source },
        },
        other => other,
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Converts a client error met while `doing` something: connection trouble, timeouts,
/// leader elections and overload are transient ([`Error::Unavailable`]); refusals (bad
/// credentials, permissions, malformed requests, a TLS certificate or handshake refused)
/// are not ([`Error::Backend`]).
pub(crate) fn failed(doing: impl Into<String>) -> impl FnOnce(etcd_client::Error) -> Error {
    let doing = doing.into();
    move |source| {
        let hint = hint(&source);
        let transient = is_transient(&source) && !hint.is_some_and(|(_, permanent)| permanent);
        let failure = Failure {
            doing,
            source,
            hint: hint.map(|(hint, _)| hint),
        };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn connect_error(tls: bool, source: std::io::Error) -> String {
        let e = failed("connecting")(etcd_client::Error::IoError(source));
        on_connect(tls)(e).report().to_string()
    }

    /// A TLS-only member may reset a plain-text client's connection instead of closing
    /// it (it closes with the client's unread HTTP/2 preface in its buffer): the error
    /// says to add TLS, as for a closed connection.
    #[test]
    fn a_plain_connection_reset_names_tls() {
        let reset = std::io::Error::from_raw_os_error(104);
        assert!(connect_error(false, reset).contains("tls=true"));
        let closed = std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe");
        assert!(connect_error(false, closed).contains("tls=true"));
        let reset = std::io::Error::from_raw_os_error(104);
        assert!(!connect_error(true, reset).contains("tls=true"));
    }
}
