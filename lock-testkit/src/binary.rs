//! Locating server binaries.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::mode::{launch_mode, LaunchMode};

/// Directories searched after `PATH` (test runners sometimes have a
/// stripped-down `PATH` without the `sbin` directories).
const EXTRA_DIRS: [&str; 3] = ["/usr/bin", "/usr/sbin", "/usr/local/bin"];

/// The full path of the executable `name`.
///
/// As processes (the default launch mode), it is searched on `PATH`, then in `/usr/bin`,
/// `/usr/sbin` and `/usr/local/bin`. In container mode (`DISTLOCK_TESTKIT=containers`) a
/// server binary some image holds (`redis-server`, `redis-sentinel`, `etcd`, `postgres`,
/// `initdb`) is the path inside that image, which [`crate::ManagedProcess`] then runs in a
/// container; any other binary (a host tool such as `redis-cli`) is searched on the host
/// as above.
///
/// # Panics
///
/// Panics when the binary is not found, with a message that gives the exact
/// command installing it, e.g.
/// `redis-server not found: install it with: sudo apt-get install -y redis-server`.
/// Tests that need a server therefore fail loudly instead of being skipped.
pub fn find_binary(name: &str, apt_package: &str) -> PathBuf {
    if launch_mode() == LaunchMode::Containers {
        if let Some(image) = crate::images::image_for(name) {
            return Path::new(image.bin_dir).join(name);
        }
    }
    find_host_binary(name, apt_package)
}

/// [`find_binary`] on the host, whatever the launch mode.
pub(crate) fn find_host_binary(name: &str, apt_package: &str) -> PathBuf {
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
