//! The one error type of distlock.

use std::time::Duration;

/// A boxed error from a backend's client library, kept as the `source` of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Every error distlock returns; each variant is something a caller can act on.
///
/// The enum is `#[non_exhaustive]`: match the variants you act on and keep a wildcard arm.
/// [`Error::is_transient`] tells whether trying again later can succeed.
///
/// Rule: a cause is printed once. `Display` says what failed without the client library's
/// error, which is the [`source`](std::error::Error::source) (for
/// [`QuorumNotReached`](Error::QuorumNotReached), the first node's error); error
/// reporters that walk the chain print each cause once, and [`Error::report`] prints the
/// whole chain on one line for logs and messages.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key is empty or longer than [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes.
    #[error("invalid lock key {key:?}: {reason}")]
    InvalidKey {
        /// The offending key (cut to 64 bytes so an oversized key does not flood logs).
        key: String,
        /// Why it was refused.
        reason: &'static str,
    },

    /// The TTL is zero or too large for the backend's representation.
    #[error("invalid TTL {ttl:?} for backend {backend}: {reason}")]
    InvalidTtl {
        /// The TTL the caller asked for.
        ttl: Duration,
        /// The backend that refused it.
        backend: &'static str,
        /// Why it was refused.
        reason: String,
    },

    /// A claim of permits that cannot be granted: zero permits, more than the key's, a key
    /// of more than [`MAX_PERMITS`](crate::MAX_PERMITS), or a number of permits on the key
    /// other than its holders' (see [`Permits`](crate::Permits)).
    #[error("invalid claim of permits: {reason}")]
    InvalidPermits {
        /// Why it was refused.
        reason: String,
    },

    /// The connection URL could not be parsed or names options the backend does not know.
    #[error("invalid lock URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL with any password replaced by `***`.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The URL names a backend whose Cargo feature is not compiled in.
    #[error(
        "the {scheme}:// backend is not compiled in; enable the `{feature}` feature of distlock"
    )]
    FeatureDisabled {
        /// The URL scheme.
        scheme: String,
        /// The Cargo feature that provides it.
        feature: &'static str,
    },

    /// The lock is held by someone else and the wait strategy was [`WaitStrategy::Skip`](crate::WaitStrategy::Skip).
    #[error("lock {key:?} is held by another owner")]
    Locked {
        /// The key that was taken.
        key: String,
    },

    /// The wait strategy's timeout passed before the lock was granted.
    #[error("timed out after {waited:?} waiting for lock {key:?}")]
    Timeout {
        /// The key waited for.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The lease is no longer ours: it expired, was released, or another owner holds the key.
    #[error("lock {key:?} is not held by this owner (expired, released or taken over)")]
    NotHeld {
        /// The key of the lease.
        key: String,
    },

    /// Fewer nodes than a majority granted the request (Redlock).
    #[error("quorum not reached: {granted} of {needed} needed nodes granted")]
    QuorumNotReached {
        /// Nodes that granted.
        granted: usize,
        /// Nodes needed for a majority.
        needed: usize,
        /// The errors of the nodes that failed, for diagnosis (nodes that were merely taken
        /// by another owner are not listed). The first is the error's `source`.
        #[source]
        node_errors: NodeErrors,
    },

    /// The server could not be reached or did not answer in time.
    #[error("{backend} backend unavailable")]
    Unavailable {
        /// The backend's name.
        backend: &'static str,
        /// The client library's error.
        #[source]
        source: BoxError,
    },

    /// The server answered something the protocol does not allow (wrong password, not a
    /// lock server, unexpected reply). Retrying does not help.
    #[error("{backend} backend error")]
    Backend {
        /// The backend's name.
        backend: &'static str,
        /// The client library's error.
        #[source]
        source: BoxError,
    },

    /// The backend does not offer this operation.
    #[error("the {backend} backend does not support {operation}")]
    Unsupported {
        /// The backend's name.
        backend: &'static str,
        /// The operation asked for.
        operation: &'static str,
    },

    /// The [`Locker`](crate::Locker) was shut down; it grants no more locks.
    #[error("the locker has been shut down")]
    Shutdown,
}

/// The errors of the nodes of a [`QuorumNotReached`](Error::QuorumNotReached), in the
/// order they failed; as an error it stands for the first (its message and its causes),
/// so that the quorum error's chain of causes leads to a node's error.
#[derive(Debug, Default)]
pub struct NodeErrors(pub Vec<Error>);

impl std::ops::Deref for NodeErrors {
    type Target = Vec<Error>;

    fn deref(&self) -> &Vec<Error> {
        &self.0
    }
}

impl From<Vec<Error>> for NodeErrors {
    fn from(errors: Vec<Error>) -> Self {
        NodeErrors(errors)
    }
}

impl FromIterator<Error> for NodeErrors {
    fn from_iter<I: IntoIterator<Item = Error>>(errors: I) -> Self {
        NodeErrors(errors.into_iter().collect())
    }
}

impl IntoIterator for NodeErrors {
    type Item = Error;
    type IntoIter = std::vec::IntoIter<Error>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a NodeErrors {
    type Item = &'a Error;
    type IntoIter = std::slice::Iter<'a, Error>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl std::fmt::Display for NodeErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.first() {
            Some(first) if self.0.len() > 1 => {
                write!(f, "{first} (and {} more nodes)", self.0.len() - 1)
            }
            Some(first) => first.fmt(f),
            None => f.write_str("no node failed (the others were held by another owner)"),
        }
    }
}

impl std::error::Error for NodeErrors {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.first().and_then(std::error::Error::source)
    }
}

/// An error and its causes on one line, `what failed: cause: its cause`, each cause once
/// ([`Error::report`]).
pub struct Report<'a>(&'a (dyn std::error::Error + 'static));

impl std::fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            write!(f, ": {error}")?;
            cause = error.source();
        }
        Ok(())
    }
}

impl std::fmt::Debug for Report<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl Error {
    /// The error and its whole chain of causes on one line (`redis backend unavailable:
    /// connection refused`), for logs and messages; `Display` alone leaves the causes to
    /// [`source`](std::error::Error::source).
    pub fn report(&self) -> Report<'_> {
        Report(self)
    }

    /// Whether trying again later may succeed: the server was unreachable, a quorum was
    /// missed, or the lock was busy. The waiting policy retries these until its deadline.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::Unavailable { .. }
                | Error::QuorumNotReached { .. }
                | Error::Locked { .. }
                | Error::Timeout { .. }
        )
    }

    /// The variant's name in snake case, stable and without any data (no key, no URL):
    /// `invalid_key`, `invalid_ttl`, `invalid_permits`, `invalid_url`, `feature_disabled`, `locked`,
    /// `timeout`, `not_held`, `quorum_not_reached`, `unavailable`, `backend`,
    /// `unsupported`, `shutdown`. It is the `kind` label of
    /// [`ERRORS`](crate::metrics::names::ERRORS); one of [`Error::KINDS`].
    pub fn kind(&self) -> &'static str {
        match self {
            Error::InvalidKey { .. } => "invalid_key",
            Error::InvalidTtl { .. } => "invalid_ttl",
            Error::InvalidPermits { .. } => "invalid_permits",
            Error::InvalidUrl { .. } => "invalid_url",
            Error::FeatureDisabled { .. } => "feature_disabled",
            Error::Locked { .. } => "locked",
            Error::Timeout { .. } => "timeout",
            Error::NotHeld { .. } => "not_held",
            Error::QuorumNotReached { .. } => "quorum_not_reached",
            Error::Unavailable { .. } => "unavailable",
            Error::Backend { .. } => "backend",
            Error::Unsupported { .. } => "unsupported",
            Error::Shutdown => "shutdown",
        }
    }

    /// Every value [`kind`](Self::kind) returns.
    pub const KINDS: [&'static str; 13] = [
        "invalid_key",
        "invalid_ttl",
        "invalid_permits",
        "invalid_url",
        "feature_disabled",
        "locked",
        "timeout",
        "not_held",
        "quorum_not_reached",
        "unavailable",
        "backend",
        "unsupported",
        "shutdown",
    ];

    /// Wraps a client error as [`Error::Unavailable`] (transient) for `backend`.
    pub fn unavailable(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            backend,
            source: source.into(),
        }
    }

    /// Wraps a client error as [`Error::Backend`] (not transient) for `backend`.
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            backend,
            source: source.into(),
        }
    }

    /// Builds [`Error::InvalidUrl`] for `url`, hiding any password in it (see [`redact`]).
    pub fn invalid_url(url: &str, reason: impl Into<String>) -> Self {
        Error::InvalidUrl {
            url: redact(url),
            reason: reason.into(),
        }
    }
}

/// Returns `url` with the password of its user info, and the value of every query
/// parameter whose name ends in `password` (any case: `sentinel_password`), replaced by
/// `***`, for error messages and logs; never panics.
///
/// A secret parameter's value is everything after its `=` up to the next `&` or the end.
/// The user info's password is everything between the first `:` after `://` and the last
/// `@` left (so an unencoded `@`, `/` or `?` in a password is hidden too). Without a `://`
/// the text from the start is searched the same way. When there is no `@`, or no `:` before
/// it, the user info is left as it is. For a URL that `LockUrl::parse` accepts this hides
/// exactly the secrets and matches `LockUrl::redacted` of the parsed value.
///
/// It lives here, not with the URL parser, because every [`Error::InvalidUrl`] is built
/// through it: an error can never show a password, whoever builds it.
pub fn redact(url: &str) -> String {
    let url = redact_params(url);
    let start = url.find("://").map_or(0, |i| i + 3);
    let (head, rest) = url.split_at(start);
    let Some(at) = rest.rfind('@') else {
        return url;
    };
    let (userinfo, tail) = rest.split_at(at);
    match userinfo.split_once(':') {
        Some((user, _password)) => format!("{head}{user}:***{tail}"),
        None => url,
    }
}

/// Whether a URL query parameter named `name` carries a secret that messages never show:
/// a name ending in `password`, in any case.
pub fn is_secret_param(name: &str) -> bool {
    name.len() >= 8
        && name
            .get(name.len() - 8..)
            .is_some_and(|end| end.eq_ignore_ascii_case("password"))
}

/// `url` with the value of every secret parameter ([`is_secret_param`]) after a `?` or `&`
/// replaced by `***`.
fn redact_params(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(i) = rest.find(['?', '&']) {
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
        let end = rest.find(['&', '#']).unwrap_or(rest.len());
        match rest[..end].split_once('=') {
            Some((name, _)) if is_secret_param(name) => {
                out.push_str(name);
                out.push_str("=***");
                rest = &rest[end..];
            }
            _ => {}
        }
    }
    out.push_str(rest);
    out
}

/// The first error of type `T` in `error`'s chain of causes (`error` itself included), for
/// a backend to tell what its client library's error is made of (a TLS refusal inside an
/// I/O error, for instance).
///
/// Unlike walking [`source`](std::error::Error::source) alone, this also looks inside an
/// [`std::io::Error`] (whose `source` skips the error it carries) and inside an
/// `Arc<dyn Error + Send + Sync>` (as some client libraries keep their causes).
pub fn find_cause<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    type Shared = std::sync::Arc<dyn std::error::Error + Send + Sync>;
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(found) = error.downcast_ref::<T>() {
            return Some(found);
        }
        next = if let Some(shared) = error.downcast_ref::<Shared>() {
            Some(shared.as_ref() as _)
        } else if let Some(io) = error.downcast_ref::<std::io::Error>() {
            io.get_ref().map(|inner| inner as _)
        } else {
            error.source()
        };
    }
    None
}

/// `Result` with distlock's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::find_cause;

    #[derive(Debug, thiserror::Error)]
    #[error("inner")]
    struct Inner;

    /// A cause is found inside an I/O error and an `Arc`, and nothing where there is none.
    #[test]
    fn find_cause_looks_inside_io_errors_and_arcs() {
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, Inner);
        assert!(find_cause::<Inner>(&io).is_some());
        let shared: std::sync::Arc<dyn std::error::Error + Send + Sync> = std::sync::Arc::new(io);
        assert!(find_cause::<Inner>(&shared).is_some());
        let plain = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert!(find_cause::<Inner>(&plain).is_none());
    }
}
