//! What a lock file holds: its key's last fence and the owner token of the grant that
//! wrote it, 24 bytes at offset 0 (the fence as a little-endian `u64`, then the owner as a
//! little-endian `u128`). A new file is empty (fence 0). Only a holder of the file's lock
//! writes it, so reads and writes under the lock see one writer at a time.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::Path;

use lock_core::Owner;

/// The size of the record.
const RECORD: usize = 24;

/// Opens `path` for reading, and for writing when `write`, never through a symbolic link
/// (a link planted in a shared directory must not make us write our fence into another
/// file), closed on `exec` (a command run under the lock does not inherit it); created
/// with mode 0666 less the umask when `create`.
///
/// Only a holder opens a lock file for writing: closing such a descriptor is the release
/// signal the watchers of other processes wait for (`IN_CLOSE_WRITE`).
pub(crate) fn open(path: &Path, create: bool, write: bool) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(write);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        // O_CREAT in the flags: std's `create` wants write access, the kernel does not
        // (a refused attempt opens read-only, like `flock(1)`).
        let create = if create { libc::O_CREAT } else { 0 };
        options.mode(0o666).custom_flags(libc::O_NOFOLLOW | create);
    }
    #[cfg(not(unix))]
    options.create(create && write);
    options.open(path)
}

/// Checks that two descriptors name one file (the lock file was not replaced between
/// two opens).
pub(crate) fn same_file(a: &File, b: &File) -> io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        let (a, b) = (a.metadata()?, b.metadata()?);
        if (a.dev(), a.ino()) != (b.dev(), b.ino()) {
            return Err(io::Error::other(
                "the lock file was replaced while it was being locked",
            ));
        }
    }
    Ok(())
}

/// The fence and owner token in the file (0 and `None` while it has none).
pub(crate) fn read(file: &File) -> io::Result<(u64, Option<Owner>)> {
    let mut buf = [0u8; RECORD];
    let n = read_at(file, &mut buf)?;
    if n < 8 {
        return Ok((0, None));
    }
    let fence = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
    let owner = (n == RECORD)
        .then(|| u128::from_le_bytes(buf[8..].try_into().expect("16 bytes")))
        .filter(|&o| o != 0)
        .map(Owner::from_u128);
    Ok((fence, owner))
}

/// Writes the fence after the one in the file, with `owner`, and returns it; synced to
/// the disk before returning when `sync` (the fence must survive a crash: a fence the
/// protected resource has seen must never be handed out again).
pub(crate) fn next_fence(file: &File, owner: Owner, sync: bool) -> io::Result<u64> {
    let (last, _) = read(file)?;
    let fence = last
        .checked_add(1)
        .ok_or_else(|| io::Error::other("the fence counter is exhausted"))?;
    let mut buf = [0u8; RECORD];
    buf[..8].copy_from_slice(&fence.to_le_bytes());
    buf[8..].copy_from_slice(&owner.as_u128().to_le_bytes());
    write_all_at(file, &buf)?;
    if sync {
        file.sync_data()?;
    }
    Ok(fence)
}

#[cfg(unix)]
fn read_at(file: &File, buf: &mut [u8]) -> io::Result<usize> {
    use std::os::unix::fs::FileExt as _;
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(unix)]
fn write_all_at(file: &File, buf: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt as _;
    file.write_all_at(buf, 0)
}

#[cfg(not(unix))]
fn read_at(_file: &File, _buf: &mut [u8]) -> io::Result<usize> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "file locks need Unix",
    ))
}

#[cfg(not(unix))]
fn write_all_at(_file: &File, _buf: &[u8]) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "file locks need Unix",
    ))
}
