//! The backend's name in errors, and file-system errors as lock-core's typed error.

use std::io;
use std::path::Path;

use lock_core::Error;

/// The backend's name in errors, logs and metrics.
pub(crate) const NAME: &str = "file";

/// A file-system error as the typed error: not transient (retrying does not make a
/// directory writable), with the path in the message.
pub(crate) fn io_error(what: &str, path: &Path, e: io::Error) -> Error {
    Error::backend(
        NAME,
        io::Error::new(e.kind(), format!("cannot {what} {}: {e}", path.display())),
    )
}
