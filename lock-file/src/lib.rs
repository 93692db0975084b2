#![doc = include_str!("../README.md")]
#![deny(missing_docs)]
// docs.rs marks each item with the Cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod error;
mod names;
mod state;
mod sys;
mod watch;

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::sync::lock;
use lock_core::{
    Admin, Attempt, Backend, Baseline, Capabilities, Error, Holder, Immediate, Lease, Owner,
    Permits, ReleaseListener, ReleaseNotices, Result, Ttl,
};

pub use config::{user_dir, FileBuilder};

use error::{io_error, NAME};
use names::{file_name, LOCK_SUFFIX, RAW_SUFFIX};
use sys::Flock;

const CAPABILITIES: Capabilities = Capabilities::new(NAME)
    .min_ttl(Duration::from_millis(1))
    .ttl_granularity(Duration::from_millis(1))
    // Accepted and ignored (the grant lasts while the process holds the file open); the
    // memory backend's maximum, so a TTL valid there is valid here.
    .max_ttl(Duration::from_secs(365 * 24 * 3600))
    .monotonic_fencing(true)
    .release_notices(true)
    .cross_process(true)
    .session_bound(true);

/// File locks on one host: `flock(2)` on one lock file per key in a directory, with the
/// key's fencing counter kept in the file. Build it with [`FileBackend::open`],
/// [`FileBackend::builder`] or [`FileBackend::from_url`] (`file:///path/to/dir`).
///
/// A grant is the open file holding the lock: it lasts until released or until this
/// process exits or dies (the kernel drops the lock with the last descriptor), never
/// longer, never shorter; see [`Capabilities::session_bound`].
pub struct FileBackend {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    dir: PathBuf,
    /// Whether each new fence is synced to the disk before the grant is returned.
    sync: bool,
    /// The open lock files of this backend's grants, by owner token.
    held: Mutex<HashMap<Owner, Held>>,
    /// Waiters of this process, woken by this process's releases and by the watcher.
    notices: Arc<ReleaseNotices>,
    /// Other processes' releases, seen on the lock files.
    watcher: watch::Watcher,
}

/// One grant: the open file description that holds the lock, and the holder's descriptor
/// for writing the file, whose close after the unlock tells the watchers.
struct Held {
    key: Arc<str>,
    lock: File,
    write: File,
}

impl std::fmt::Debug for FileBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileBackend")
            .field("dir", &self.inner.dir)
            .field("sync", &self.inner.sync)
            .field("held", &lock(&self.inner.held).len())
            .finish()
    }
}

impl FileBackend {
    /// A backend keeping its lock files in `dir`, created (with its parents) when missing,
    /// fences synced to the disk; [`builder`](Self::builder) for the options.
    ///
    /// # Errors
    /// As [`FileBuilder::open`].
    pub fn open(dir: impl Into<PathBuf>) -> Result<FileBackend> {
        Self::builder(dir).open()
    }

    /// A builder for a backend keeping its lock files in `dir`.
    pub fn builder(dir: impl Into<PathBuf>) -> FileBuilder {
        FileBuilder::new(dir.into())
    }

    /// The backend a `file:///absolute/dir[?sync=false]` URL describes.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] for another scheme, a host, user info, a missing or relative
    /// path, or an unknown parameter; then as [`FileBuilder::open`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use lock_core::{LockUrl, Locker};
    /// use lock_file::FileBackend;
    ///
    /// let url = LockUrl::parse("file:///run/lock/myapp").unwrap();
    /// let locker = Locker::new(FileBackend::from_url(&url).unwrap());
    /// ```
    pub fn from_url(url: &lock_core::LockUrl) -> Result<FileBackend> {
        FileBuilder::from_url(url)?.open()
    }

    /// The `file://` URL of `dir` (percent-encoded), as [`from_url`](Self::from_url) reads
    /// it back.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`] when `dir` is not absolute or not UTF-8.
    pub fn url_of(dir: &Path) -> Result<String> {
        config::url_of(dir)
    }

    /// The directory of the lock files.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// The lock file of `key` (it exists once the key was first locked, and is never
    /// deleted by the backend).
    pub fn lock_path(&self, key: &str) -> PathBuf {
        self.inner.path(key, LOCK_SUFFIX)
    }

    /// Grants of this backend now held (open lock files).
    pub fn held_grants(&self) -> usize {
        lock(&self.inner.held).len()
    }

    fn start(builder: FileBuilder) -> FileBackend {
        let (dir, sync) = (builder.dir, builder.sync);
        let notices = Arc::new(ReleaseNotices::new());
        let wake = {
            let notices = notices.clone();
            Arc::new(move |key: &str| notices.notify(key)) as watch::Wake
        };
        FileBackend {
            inner: Arc::new(Inner {
                dir,
                sync,
                held: Mutex::new(HashMap::new()),
                notices,
                watcher: watch::Watcher::new(wake),
            }),
        }
    }
}

impl FileBuilder {
    /// The backend. The directory is created with its parents when missing (mode 0777
    /// less the umask: directories shared between users are set up by the administrator);
    /// lock files are created in it as keys are first locked, and never deleted.
    ///
    /// # Errors
    /// [`Error::Unsupported`] for a directory on a file system where `flock` does not
    /// exclude the descriptors of one process from each other (NFS, SMB on Linux);
    /// [`Error::Backend`] when the directory cannot be created or is not a directory. A
    /// directory this process may not write is found at the first attempt on a key: a
    /// non-transient [`Error::Backend`] naming the lock file (`Permission denied`).
    pub fn open(self) -> Result<FileBackend> {
        config::check_dir(&self.dir)?;
        Ok(FileBackend::start(self))
    }
}

impl Inner {
    fn path(&self, key: &str, suffix: &str) -> PathBuf {
        self.dir.join(file_name(key, suffix))
    }

    /// Opens (creating when missing) the lock file at `path` read-only, re-creating the
    /// directory when it went away (a runtime directory emptied at logout).
    fn open(&self, path: &Path) -> Result<File> {
        match state::open(path, true, false) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                config::create_dir(&self.dir)?;
                state::open(path, true, false).map_err(|e| io_error("open the lock file", path, e))
            }
            other => other.map_err(|e| io_error("open the lock file", path, e)),
        }
    }

    /// One attempt: the exclusive lock on `key`'s file (opened read-only, so a refused
    /// attempt wakes no watcher), then, holding it, the next fence written (and synced)
    /// through a second descriptor opened for writing, kept until the release.
    fn try_acquire(&self, key: &str, owner: Owner) -> Result<Option<u64>> {
        // Grants are kept by owner: a second grant to an owner holding another key would
        // replace (and so unlock) the first while its lease still looks held.
        if lock(&self.held).contains_key(&owner) {
            return Err(Error::Unsupported {
                backend: NAME,
                operation: "one owner token holding two file locks at once (each grant takes a fresh owner)",
            });
        }
        let path = self.path(key, LOCK_SUFFIX);
        let file = self.open(&path)?;
        match sys::try_lock_exclusive(&file).map_err(|e| io_error("lock", &path, e))? {
            Flock::Busy => return Ok(None),
            Flock::Locked => {}
        }
        // From here a failure drops `file`, which closes it and so unlocks.
        let write = state::open(&path, false, true)
            .and_then(|write| state::same_file(&file, &write).map(|()| write))
            .map_err(|e| io_error("open for writing", &path, e))?;
        let fence = state::next_fence(&write, owner, self.sync)
            .map_err(|e| io_error("write the fence of", &path, e))?;
        lock(&self.held).insert(
            owner,
            Held {
                key: Arc::from(key),
                lock: file,
                write,
            },
        );
        Ok(Some(fence))
    }

    /// Takes `owner`'s grant on `key` out of the table, if it holds one.
    fn take(&self, key: &str, owner: Owner) -> Option<Held> {
        let mut held = lock(&self.held);
        match held.get(&owner) {
            Some(h) if *h.key == *key => held.remove(&owner),
            _ => None,
        }
    }

    /// Unlocks and closes a grant's file, then its writing descriptor (the watchers'
    /// signal, after the unlock), and wakes this process's waiters of its key.
    fn end(&self, held: Held) {
        if let Err(e) = sys::unlock(&held.lock) {
            // Closing the file (below) drops the lock all the same.
            tracing::debug!(key = &*held.key, error = %e, "flock(LOCK_UN) failed; closing");
        }
        drop(held.lock);
        drop(held.write);
        self.notices.notify(&held.key);
    }
}

#[async_trait]
impl Backend for FileBackend {
    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    /// One non-blocking `flock(LOCK_EX | LOCK_NB)` on the key's lock file; when granted,
    /// the fence in the file is incremented and (with `sync`) synced before the answer.
    ///
    /// `ttl` is accepted and ignored: the grant lasts until released or until the process
    /// ends. A refused attempt's waiter is woken by the watch [`listen`](Self::listen)
    /// set up before it.
    ///
    /// # Cancel safety
    /// The attempt runs to completion inside one poll (no await point), so a dropped call
    /// either never ran or has answered: it leaves no grant behind.
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        self.attempt(key, owner, permits, ttl)
    }

    /// Checks that the lease still holds its file: a session-bound grant has nothing to
    /// extend. Returns the unbounded validity.
    ///
    /// # Cancel safety
    /// Nothing to cancel: it answers within one poll.
    async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        let sent = Instant::now();
        match lock(&self.inner.held).get(&lease.owner()) {
            Some(h) if *h.key == *lease.key() => Ok(CAPABILITIES.validity(sent, ttl.get())),
            _ => Err(lease.not_held()),
        }
    }

    /// Unlocks and closes the lease's file and wakes this process's waiters (waiters in
    /// other processes are woken by their watcher threads).
    ///
    /// # Cancel safety
    /// Nothing to cancel: it answers within one poll.
    async fn release(&self, lease: &Lease) -> Result<()> {
        self.end(lease)
    }

    /// This process's waiters are woken by its releases; for other processes' releases
    /// the key's lock file is watched (inotify, Linux) from before the attempt.
    fn listen(&self, key: &str) -> Option<ReleaseListener> {
        let listener = self.inner.notices.listen(key);
        self.inner
            .watcher
            .listen(key, &self.inner.path(key, LOCK_SUFFIX));
        Some(listener)
    }

    fn admin(&self) -> Option<&dyn Admin> {
        Some(self)
    }

    /// The attempt and the release are a few system calls: the Locker makes them in place,
    /// and a guard dropped outside a runtime still releases its lock at once (a
    /// session-bound grant has no TTL to end it otherwise).
    fn immediate(&self) -> Option<&dyn Immediate> {
        Some(self)
    }

    fn baseline(&self) -> Option<&dyn Baseline> {
        Some(self)
    }
}

impl FileBackend {
    fn attempt(&self, key: &str, owner: Owner, permits: Permits, ttl: Ttl) -> Result<Attempt> {
        if permits != Permits::LOCK {
            return Err(Error::InvalidPermits {
                reason: "the file backend keeps locks only".into(),
            });
        }
        let sent = Instant::now();
        match self.inner.try_acquire(key, owner)? {
            Some(fence) => Ok(Attempt::Granted {
                fence,
                valid_until: CAPABILITIES.validity(sent, ttl.get()),
            }),
            None => Ok(Attempt::Taken { expires_in: None }),
        }
    }

    fn end(&self, lease: &Lease) -> Result<()> {
        match self.inner.take(lease.key(), lease.owner()) {
            Some(held) => {
                self.inner.end(held);
                Ok(())
            }
            None => Err(lease.not_held()),
        }
    }
}

impl Immediate for FileBackend {
    fn try_acquire(
        &self,
        key: &Arc<str>,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        self.attempt(key, owner, permits, ttl)
    }

    fn release(&self, lease: &Lease) -> Result<()> {
        self.end(lease)
    }
}

#[async_trait]
impl Admin for FileBackend {
    /// The holder of `key`'s lock file, found with a non-blocking shared `flock` on a
    /// descriptor of its own: the fence and owner token the holder wrote, no time left
    /// (a file lock has none). While it looks (microseconds), an exclusive attempt on the
    /// key from elsewhere is refused.
    async fn inspect(&self, key: &str) -> Result<Vec<Holder>> {
        let path = self.inner.path(key, LOCK_SUFFIX);
        let file = match state::open(&path, false, false) {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error("open the lock file", &path, e)),
        };
        match sys::try_lock_shared(&file).map_err(|e| io_error("lock", &path, e))? {
            Flock::Locked => Ok(Vec::new()),
            Flock::Busy => {
                let (fence, owner) = state::read(&file).map_err(|e| io_error("read", &path, e))?;
                Ok(vec![Holder::new(owner, Some(fence), None)])
            }
        }
    }

    /// Unsupported: the kernel drops a file lock only when its holder closes the file or
    /// exits; end the holding process instead.
    async fn force_release(&self, _key: &str) -> Result<bool> {
        Err(Error::Unsupported {
            backend: NAME,
            operation: "taking a file lock from its holder (it ends when the holding process closes the file or exits)",
        })
    }
}

#[async_trait]
impl Baseline for FileBackend {
    fn description(&self) -> &'static str {
        "open + flock(LOCK_EX|LOCK_NB) + close"
    }

    /// What a hand-written `flock(1)`-style lock does, on the raw file of `key`
    /// (`<name>.raw` beside the lock files): open it, take the exclusive lock without
    /// waiting, close it; no fence. A raw file is never a lock's file.
    ///
    /// # Cancel safety
    /// Answers within one poll: nothing is left behind.
    async fn raw_cycle(&self, key: &str, _ttl: Ttl) -> Result<()> {
        let path = self.inner.path(key, RAW_SUFFIX);
        let file = self.inner.open(&path)?;
        sys::try_lock_exclusive(&file).map_err(|e| io_error("lock", &path, e))?;
        drop(file);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
