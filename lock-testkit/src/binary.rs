//! Locating server binaries.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Directories searched after `PATH` (test runners sometimes have a
/// stripped-down `PATH` without the `sbin` directories).
const EXTRA_DIRS: [&str; 3] = ["/usr/bin", "/usr/sbin", "/usr/local/bin"];

/// Finds the executable `name` on `PATH`, then in `/usr/bin`, `/usr/sbin` and
/// `/usr/local/bin`, and returns its full path.
///
/// # Panics
///
/// Panics when the binary is not found, with a message that gives the exact
/// command installing it, e.g.
/// `redis-server not found: install it with: sudo apt-get install -y redis-server`.
/// Tests that need a server therefore fail loudly instead of being skipped.
pub fn find_binary(name: &str, apt_package: &str) -> PathBuf {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    dirs.extend(EXTRA_DIRS.iter().map(PathBuf::from));
    dirs.into_iter()
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
        .unwrap_or_else(|| {
            panic!("{name} not found: install it with: sudo apt-get install -y {apt_package}")
        })
}

fn is_executable(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}
