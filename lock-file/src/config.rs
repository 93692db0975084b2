//! Building a [`FileBackend`](crate::FileBackend): [`FileBuilder`], `file://` URLs, and
//! the per-user default directory ([`user_dir`]).

use std::io;
use std::path::{Path, PathBuf};

use lock_core::{Error, LockUrl, Result};

use crate::error::{io_error, NAME};
use crate::sys;

/// Options of a [`FileBackend`](crate::FileBackend): the directory of its lock files, and
/// whether fences are synced to the disk.
#[derive(Clone, Debug)]
pub struct FileBuilder {
    pub(crate) dir: PathBuf,
    pub(crate) sync: bool,
}

impl FileBuilder {
    pub(crate) fn new(dir: PathBuf) -> Self {
        FileBuilder { dir, sync: true }
    }

    /// Whether each grant's new fence is synced to the disk (`fdatasync`) before the
    /// grant is returned (default `true`): without it, a crash of the host (not of a
    /// process) can lose the last fences and hand them out again after the reboot. Off
    /// costs nothing on a tmpfs directory, which a reboot empties anyway.
    ///
    /// The sync runs on the thread that polls the attempt (an attempt answers within one
    /// poll, which is what makes it cancel-safe): on a slow disk it holds that runtime
    /// thread for the flush (about 0.2 ms on an SSD, more on spinning disks).
    pub fn sync(mut self, on: bool) -> Self {
        self.sync = on;
        self
    }

    /// The options a `file:///absolute/dir[?sync=false]` URL describes.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for another scheme, a host, user info, a missing or relative
    /// path, or an unknown parameter.
    pub fn from_url(url: &LockUrl) -> Result<FileBuilder> {
        if url.scheme != "file" {
            return Err(url.invalid(format!(
                "the file backend takes file:// URLs, not {}://",
                url.scheme
            )));
        }
        if !url.hosts.is_empty() {
            return Err(url.invalid(
                "file:// takes no host: write the directory as file:///absolute/path (three slashes)",
            ));
        }
        if url.userinfo.is_some() {
            return Err(url.invalid("file:// takes no user name or password"));
        }
        if url.path.is_empty() || url.path == "/" {
            return Err(
                url.invalid("file:// needs the directory of the lock files: file:///absolute/path")
            );
        }
        url.check_params(&["sync"])?;
        let sync = url.bool_param("sync")?.unwrap_or(true);
        Ok(FileBuilder::new(PathBuf::from(&url.path)).sync(sync))
    }
}

/// Creates `dir` when missing and checks that it can hold file locks.
pub(crate) fn check_dir(dir: &Path) -> Result<()> {
    create_dir(dir)?;
    let meta = std::fs::metadata(dir).map_err(|e| io_error("read the metadata of", dir, e))?;
    if !meta.is_dir() {
        return Err(io_error("use", dir, io::Error::other("not a directory")));
    }
    if let Some(why) = sys::unsuitable_file_system(dir) {
        tracing::warn!(dir = %dir.display(), why, "refusing a lock directory");
        return Err(Error::Unsupported {
            backend: NAME,
            operation: "lock directories on network file systems (flock is emulated there with per-process record locks)",
        });
    }
    Ok(())
}

/// Creates `dir` and its parents when missing.
pub(crate) fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| io_error("create the lock directory", dir, e))
}

/// The `file://` URL of `dir` (percent-encoded).
pub(crate) fn url_of(dir: &Path) -> Result<String> {
    let path = dir
        .to_str()
        .filter(|p| dir.is_absolute() && p.starts_with('/'))
        .ok_or_else(|| {
            Error::invalid_url(
                "file://",
                format!(
                    "the lock directory {} is not an absolute UTF-8 path",
                    dir.display()
                ),
            )
        })?;
    let url = LockUrl::parse("file:///x")?;
    Ok(LockUrl {
        path: path.to_owned(),
        ..url
    }
    .to_string())
}

/// The per-user lock directory, created when missing: `$XDG_RUNTIME_DIR/distlock` when
/// that variable names an absolute directory (a tmpfs private to the user, emptied at
/// logout and reboot), else `distlock-<uid>` in the temporary directory (`$TMPDIR` or
/// `/tmp`), created with mode 0700 and refused unless it is a directory of this user that
/// nobody else can write (a directory planted in `/tmp` by another user must not hold our
/// locks). The `distlock run` command's default lock directory.
///
/// # Errors
/// [`Error::Backend`] when the directory cannot be created, or belongs to another user or
/// is writable by others.
pub fn user_dir() -> Result<PathBuf> {
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute() && p.is_dir())
    {
        let dir = runtime.join("distlock");
        private_dir(&dir)?;
        return Ok(dir);
    }
    let dir = std::env::temp_dir().join(format!("distlock-{}", uid()));
    private_dir(&dir)?;
    Ok(dir)
}

#[cfg(unix)]
fn uid() -> u32 {
    // SAFETY: `geteuid` cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

#[cfg(not(unix))]
fn uid() -> u32 {
    0
}

/// Creates `dir` with mode 0700 when missing, then checks that it is a directory (not a
/// link) of this user that nobody else can write.
fn private_dir(dir: &Path) -> Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt as _;
        builder.mode(0o700);
    }
    match builder.create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_error("create the lock directory", dir, e)),
    }
    let meta =
        std::fs::symlink_metadata(dir).map_err(|e| io_error("read the metadata of", dir, e))?;
    if !meta.is_dir() {
        return Err(io_error(
            "use",
            dir,
            io::Error::other("not a directory (a link or a file is there)"),
        ));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt as _;
        if meta.uid() != uid() || meta.mode() & 0o022 != 0 {
            return Err(io_error(
                "use",
                dir,
                io::Error::other(
                    "it belongs to another user or others can write it; remove it or set --url",
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FileBackend;

    fn refused(url: &str, needle: &str) {
        let parsed = LockUrl::parse(url).expect("the generic shape");
        match FileBackend::from_url(&parsed) {
            Err(Error::InvalidUrl { reason, .. }) => {
                assert!(
                    reason.contains(needle),
                    "{url}: {reason:?} should mention {needle:?}"
                )
            }
            other => panic!("{url}: expected InvalidUrl, got {other:?}"),
        }
    }

    #[test]
    fn urls_name_an_absolute_directory() {
        refused("memory://", "file:// URLs, not memory://");
        refused("file://", "needs the directory");
        refused("file:///", "needs the directory");
        refused("file://host/dir", "takes no host");
        refused("file://u:p@/dir", "no user name");
        refused(
            "file:///tmp/x?ttl=1s",
            "unknown parameter `ttl` (known: sync)",
        );
        refused("file:///tmp/x?sync=maybe", "sync");
    }

    #[test]
    fn urls_round_trip_and_open() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a dir%/locks");
        let url = FileBackend::url_of(&dir).unwrap();
        let backend = FileBackend::from_url(&LockUrl::parse(&url).unwrap()).unwrap();
        assert_eq!(backend.dir(), dir);
        assert!(dir.is_dir(), "created");
        let no_sync = format!("{url}?sync=false");
        let backend = FileBackend::from_url(&LockUrl::parse(&no_sync).unwrap()).unwrap();
        assert!(!backend.inner.sync);
        assert!(FileBackend::url_of(Path::new("relative")).is_err());
    }

    #[test]
    fn a_file_in_place_of_the_directory_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, b"").unwrap();
        assert!(matches!(
            FileBackend::open(&file),
            Err(Error::Backend { .. })
        ));
    }

    #[cfg(unix)]
    #[test]
    fn the_private_directory_is_checked() {
        use std::os::unix::fs::PermissionsExt as _;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("mine");
        private_dir(&dir).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(private_dir(&dir).is_err(), "writable by others");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&dir, &link).unwrap();
        assert!(private_dir(&link).is_err(), "a link");
    }
}
