//! The rules of `memory://` URLs: [`MemoryBackend::from_url`].

use lock_core::{LockUrl, Result};

use crate::MemoryBackend;

impl MemoryBackend {
    /// The backend a `memory://` URL describes: `memory://` with no host, user info, path
    /// or parameter (there is nothing to configure).
    ///
    /// # Errors
    /// [`Error::InvalidUrl`](lock_core::Error::InvalidUrl) for another scheme, a host, a
    /// user name or password, a path or any parameter.
    ///
    /// # Examples
    ///
    /// ```
    /// use lock_core::{LockUrl, Locker};
    /// use lock_memory::MemoryBackend;
    ///
    /// let url = LockUrl::parse("memory://").unwrap();
    /// let locker = Locker::new(MemoryBackend::from_url(&url).unwrap());
    /// ```
    pub fn from_url(url: &LockUrl) -> Result<MemoryBackend> {
        if url.scheme != "memory" {
            return Err(url.invalid(format!(
                "the memory backend takes memory:// URLs, not {}://",
                url.scheme
            )));
        }
        if !url.hosts.is_empty() {
            return Err(url.invalid("memory:// takes no host"));
        }
        if url.userinfo.is_some() {
            return Err(url.invalid("memory:// takes no user name or password"));
        }
        if !url.path.is_empty() {
            return Err(url.invalid("memory:// takes no path"));
        }
        url.check_params(&[])?;
        Ok(MemoryBackend::new())
    }
}

#[cfg(test)]
mod tests {
    use lock_core::Error;

    use super::*;

    fn assert_refused(url: &str, needle: &str) {
        let parsed = LockUrl::parse(url).expect("the generic shape");
        match MemoryBackend::from_url(&parsed) {
            Err(Error::InvalidUrl { url: shown, reason }) => {
                assert!(
                    reason.contains(needle),
                    "{url}: {reason:?} should mention {needle:?}"
                );
                assert!(!shown.contains("hunter2"), "{url}: password in {shown}");
            }
            Err(other) => panic!("{url}: expected InvalidUrl, got {other:?}"),
            Ok(_) => panic!("{url}: expected InvalidUrl, got a backend"),
        }
    }

    #[test]
    fn takes_memory_urls_only() {
        let url = LockUrl::parse("MEMORY://?").unwrap();
        assert!(MemoryBackend::from_url(&url).is_ok());
        assert_refused("redis://h", "memory:// URLs, not redis://");
    }

    #[test]
    fn refuses_host_userinfo_path_and_parameters() {
        assert_refused("memory://localhost", "memory:// takes no host");
        assert_refused("memory://u:p@", "memory:// takes no user name or password");
        assert_refused("memory://@", "memory:// takes no user name or password");
        assert_refused(
            "memory://u:hunter2@",
            "memory:// takes no user name or password",
        );
        assert_refused("memory:///", "memory:// takes no path");
        assert_refused("memory:///x?a=b", "memory:// takes no path");
        assert_refused("memory://?a=b&c=", "unknown parameter `a` (known: none)");
    }
}
