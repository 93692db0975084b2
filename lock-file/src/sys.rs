//! The few system calls the backend makes: `flock(2)` on an open file, and a look at the
//! file system a directory is on.

use std::fs::File;
use std::io;
use std::path::Path;

/// The outcome of a non-blocking lock attempt.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Flock {
    /// The open file now holds the lock.
    Locked,
    /// Another open file holds it (in this process or another).
    Busy,
}

/// `flock(fd, LOCK_EX | LOCK_NB)`: the exclusive lock, or `Busy` at once.
pub(crate) fn try_lock_exclusive(file: &File) -> io::Result<Flock> {
    imp::flock(file, imp::EXCLUSIVE | imp::NON_BLOCKING)
}

/// `flock(fd, LOCK_SH | LOCK_NB)`: a shared lock, or `Busy` at once while a holder has
/// the exclusive one.
pub(crate) fn try_lock_shared(file: &File) -> io::Result<Flock> {
    imp::flock(file, imp::SHARED | imp::NON_BLOCKING)
}

/// `flock(fd, LOCK_UN)`: drops the lock of this open file description, for every
/// descriptor that shares it (a forked child's too), before the file is closed.
pub(crate) fn unlock(file: &File) -> io::Result<()> {
    imp::flock(file, imp::UNLOCK).map(|_| ())
}

/// Why `dir` cannot hold locks that exclude the Lockers of one process from each other,
/// when that is known: on NFS, Linux emulates `flock` with POSIX record locks, which are
/// per process.
pub(crate) fn unsuitable_file_system(dir: &Path) -> Option<&'static str> {
    imp::unsuitable_file_system(dir)
}

#[cfg(unix)]
mod imp {
    use crate::sys::Flock;
    use std::fs::File;
    use std::io;
    use std::os::unix::io::AsRawFd;
    use std::path::Path;

    pub(super) const EXCLUSIVE: i32 = libc::LOCK_EX;
    pub(super) const SHARED: i32 = libc::LOCK_SH;
    pub(super) const UNLOCK: i32 = libc::LOCK_UN;
    pub(super) const NON_BLOCKING: i32 = libc::LOCK_NB;

    pub(super) fn flock(file: &File, op: i32) -> io::Result<Flock> {
        loop {
            // SAFETY: `flock` reads no memory of ours; the descriptor is open (borrowed).
            if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
                return Ok(Flock::Locked);
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EWOULDBLOCK) => return Ok(Flock::Busy),
                _ => return Err(err),
            }
        }
    }

    #[cfg(target_os = "linux")]
    pub(super) fn unsuitable_file_system(dir: &Path) -> Option<&'static str> {
        use std::os::unix::ffi::OsStrExt as _;
        const NFS_SUPER_MAGIC: i64 = 0x6969;
        const SMB_SUPER_MAGIC: i64 = 0x517b;
        const CIFS_MAGIC_NUMBER: i64 = 0xff53_4d42;
        const SMB2_MAGIC_NUMBER: i64 = 0xfe53_4d42;
        let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
        // SAFETY: `statfs` writes into the zeroed struct we own; `path` is NUL-terminated.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statfs(path.as_ptr(), &mut fs) } != 0 {
            return None;
        }
        #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
        match i64::from(fs.f_type) {
            NFS_SUPER_MAGIC => {
                Some("NFS, where Linux emulates flock with per-process record locks")
            }
            SMB_SUPER_MAGIC | CIFS_MAGIC_NUMBER | SMB2_MAGIC_NUMBER => {
                Some("SMB/CIFS, where flock is emulated with per-process record locks")
            }
            _ => None,
        }
    }

    #[cfg(not(target_os = "linux"))]
    pub(super) fn unsuitable_file_system(_dir: &Path) -> Option<&'static str> {
        None
    }
}

#[cfg(not(unix))]
mod imp {
    use crate::sys::Flock;
    use std::fs::File;
    use std::io;
    use std::path::Path;

    pub(super) const EXCLUSIVE: i32 = 1;
    pub(super) const SHARED: i32 = 2;
    pub(super) const UNLOCK: i32 = 4;
    pub(super) const NON_BLOCKING: i32 = 8;

    pub(super) fn flock(_file: &File, _op: i32) -> io::Result<Flock> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "file locks need flock(2) (Unix)",
        ))
    }

    pub(super) fn unsuitable_file_system(_dir: &Path) -> Option<&'static str> {
        Some("not a Unix file system: file locks need flock(2)")
    }
}
