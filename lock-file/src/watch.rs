//! Waiting for another process's release without polling: inotify on the lock files
//! (Linux).
//!
//! `flock(2)` has no release notification, and anything that *takes* the lock to learn of a
//! release (a thread blocked in `flock(LOCK_SH)`) holds it for a moment, in which a
//! `try_acquire` elsewhere is refused although nobody holds the key. So the backend watches
//! the file instead: a holder keeps a descriptor opened for writing beside its lock and
//! closes it right after unlocking (the kernel closes it too when the holder dies), which
//! is an `IN_CLOSE_WRITE` on the file. Attempts, `inspect` and watchers open the file
//! read-only (or not at all), so a refused attempt never wakes anybody.
//!
//! One inotify instance and one thread per backend: [`Watcher::listen`] (called before
//! each attempt a waiter makes) adds a watch for the key's file unless it has one; an
//! event removes the watch and wakes this process's waiters of the key, whose next
//! `listen` watches again, before their attempt, so no release between two watches is
//! missed. The kernel sends the close event just before it drops the locks of a dying
//! process's file, so every event is announced again 10 ms later. A watch whose key
//! nobody waits on any more goes at its next event. The thread ends within a second of its
//! backend. Where inotify is missing (or its limits are reached), waiters of other
//! processes' releases fall back on the Locker's backoff between attempts (at most 500 ms).

use std::path::Path;
use std::sync::Arc;

/// Wakes this process's waiters of a key.
pub(crate) type Wake = Arc<dyn Fn(&str) + Send + Sync>;

/// A backend's watcher of its lock files (a no-op where the platform has no inotify).
pub(crate) struct Watcher {
    /// Held here only: the thread's weak copy fails once the backend is gone.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    wake: Wake,
    #[cfg(target_os = "linux")]
    imp: std::sync::OnceLock<Option<Arc<linux::Inotify>>>,
}

impl Watcher {
    pub(crate) fn new(wake: Wake) -> Self {
        Watcher {
            wake,
            #[cfg(target_os = "linux")]
            imp: std::sync::OnceLock::new(),
        }
    }

    /// Watches `path` (the lock file of `key`) for its holder's release, unless watched.
    #[cfg(target_os = "linux")]
    pub(crate) fn listen(&self, key: &str, path: &Path) {
        let started = self
            .imp
            .get_or_init(|| linux::Inotify::start(Arc::downgrade(&self.wake)));
        if let Some(inotify) = started {
            inotify.watch(key, path);
        }
    }

    /// Nothing to watch with: waiters of other processes' releases poll.
    #[cfg(not(target_os = "linux"))]
    pub(crate) fn listen(&self, _key: &str, _path: &Path) {}
}

#[cfg(target_os = "linux")]
mod linux {
    use std::collections::HashMap;
    use std::ffi::CString;
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    use std::os::unix::ffi::OsStrExt as _;
    use std::path::Path;
    use std::sync::{Arc, Mutex, Weak};
    use std::time::{Duration, Instant};

    use lock_core::sync::lock;

    /// How long after a close event it is announced again (see the module's text).
    pub(super) const AGAIN: Duration = Duration::from_millis(10);

    pub(crate) struct Inotify {
        fd: OwnedFd,
        watches: Mutex<Watches>,
    }

    #[derive(Default)]
    struct Watches {
        by_wd: HashMap<i32, Vec<Arc<str>>>,
        by_key: HashMap<Arc<str>, i32>,
    }

    impl Inotify {
        /// The instance and its thread; `None` (waiters fall back on backoff) when either
        /// cannot be made. `wake` gives the thread its way to the backend's waiters.
        pub(super) fn start(wake: Weak<dyn Fn(&str) + Send + Sync>) -> Option<Arc<Inotify>> {
            // SAFETY: no pointers; the result is checked.
            let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC | libc::IN_NONBLOCK) };
            if fd < 0 {
                tracing::debug!(error = %std::io::Error::last_os_error(), "no inotify; waiters of other processes poll");
                return None;
            }
            // SAFETY: a descriptor we just opened and own alone.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let inotify = Arc::new(Inotify {
                fd,
                watches: Mutex::new(Watches::default()),
            });
            let thread = inotify.clone();
            std::thread::Builder::new()
                .name("distlock-file-watch".into())
                .spawn(move || thread.run(wake))
                .map_err(|e| tracing::debug!(error = %e, "cannot start the watcher thread"))
                .ok()?;
            Some(inotify)
        }

        /// Watches `path` for `IN_CLOSE_WRITE` unless `key` is watched already.
        pub(super) fn watch(&self, key: &str, path: &Path) {
            let mut watches = lock(&self.watches);
            if watches.by_key.contains_key(key) {
                return;
            }
            let Ok(cpath) = CString::new(path.as_os_str().as_bytes()) else {
                return;
            };
            // SAFETY: a NUL-terminated path; the descriptor is ours.
            let wd = unsafe {
                libc::inotify_add_watch(self.fd.as_raw_fd(), cpath.as_ptr(), libc::IN_CLOSE_WRITE)
            };
            if wd < 0 {
                tracing::debug!(key, error = %std::io::Error::last_os_error(), "cannot watch a lock file; its waiters poll");
                return;
            }
            let key: Arc<str> = Arc::from(key);
            watches.by_key.insert(key.clone(), wd);
            watches.by_wd.entry(wd).or_default().push(key);
        }

        /// Takes the watch `wd` out (the next `listen` watches again); its keys.
        fn fired(&self, wd: i32) -> Vec<Arc<str>> {
            let mut watches = lock(&self.watches);
            let keys = watches.by_wd.remove(&wd).unwrap_or_default();
            for key in &keys {
                watches.by_key.remove(key);
            }
            if !keys.is_empty() {
                // SAFETY: the descriptor is ours; a watch already gone is an ignored error.
                unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), wd) };
            }
            keys
        }

        fn run(self: Arc<Self>, weak: Weak<dyn Fn(&str) + Send + Sync>) {
            let mut again: Vec<(Instant, Arc<str>)> = Vec::new();
            let mut buf = vec![0u8; 4096];
            loop {
                let now = Instant::now();
                let Some(wake) = weak.upgrade() else { return };
                again.retain(|(at, key)| {
                    if *at <= now {
                        wake(key);
                        false
                    } else {
                        true
                    }
                });
                drop(wake);
                let timeout = again
                    .iter()
                    .map(|(at, _)| at.saturating_duration_since(now))
                    .min()
                    .unwrap_or(Duration::from_secs(1));
                let mut pfd = libc::pollfd {
                    fd: self.fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                let ms = i32::try_from(timeout.as_millis().max(1)).unwrap_or(1000);
                // SAFETY: one pollfd we own.
                if unsafe { libc::poll(&mut pfd, 1, ms) } <= 0 {
                    continue;
                }
                // SAFETY: reads into our buffer, at most its length.
                let n =
                    unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                let Ok(n) = usize::try_from(n) else { continue };
                let Some(wake) = weak.upgrade() else { return };
                let mut at = 0;
                let header = std::mem::size_of::<libc::inotify_event>();
                while at + header <= n {
                    // SAFETY: the kernel wrote whole events; read unaligned from our buffer.
                    let event: libc::inotify_event =
                        unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                    at += header + event.len as usize;
                    if event.mask & libc::IN_Q_OVERFLOW != 0 {
                        let all: Vec<i32> = lock(&self.watches).by_wd.keys().copied().collect();
                        for wd in all {
                            for key in self.fired(wd) {
                                wake(&key);
                            }
                        }
                        continue;
                    }
                    for key in self.fired(event.wd) {
                        wake(&key);
                        again.push((Instant::now() + AGAIN, key));
                    }
                }
            }
        }
    }
}
