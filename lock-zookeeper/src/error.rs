//! The errors a ZooKeeper request becomes: the transient [`Error::Unavailable`] or the
//! permanent [`Error::Backend`], naming the operation.

use std::time::Duration;

use lock_core::Error;
use zookeeper_client as zk;

/// The name errors, logs and capabilities carry.
pub const NAME: &str = "zookeeper";

/// The error a failed request `op` becomes: a lost connection, an expired or moved
/// session, throttling or a timeout may pass (the Locker tries again); anything else is the
/// server refusing what the protocol asked.
pub(crate) fn failed(op: &'static str, e: zk::Error) -> Error {
    let message = format!("{op}: {e}");
    if is_transient(&e) {
        Error::unavailable(NAME, message)
    } else {
        Error::backend(NAME, message)
    }
}

/// Whether trying again (on this session or a new one) may succeed.
pub(crate) fn is_transient(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::ConnectionLoss
            | zk::Error::Timeout
            | zk::Error::SessionExpired
            | zk::Error::SessionMoved
            | zk::Error::ClientClosed
            | zk::Error::Throttled
            | zk::Error::NoHosts
            // The client's own failures of a connection (I/O, no answer within its
            // timeout), which fail the requests it carried.
            | zk::Error::Custom(_)
    )
}

/// Whether the session the request went on is over: a new one must be made.
pub(crate) fn ends_session(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed
    )
}

/// No answer to `op` within `timeout`.
pub(crate) fn timed_out(op: &'static str, timeout: Duration) -> Error {
    Error::unavailable(NAME, format!("{op}: no answer within {timeout:?}"))
}
