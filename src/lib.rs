//! # distlock
//!
//! One lock abstraction over several lock servers. Application code asks a [`Locker`] for
//! a lock by name; which server stands behind it is chosen by a Cargo feature and a URL:
//!
//! | URL | feature | backend |
//! |---|---|---|
//! | `memory://` | `memory` (default) | in-process keyed async mutex |
//! | `redis://[user:pass@]host:port[/db][?prefix=…&timeout=…]`, `rediss://…` | `redis` | one Redis |
//! | `redlock://host:port,host:port,…[?drift=…]` | `redlock` | Redlock quorum over N Redis nodes |
//! | `etcd://host:port[,host:port…][?prefix=…&timeout=…]` | `etcd` | etcd leases |
//!
//! A URL whose backend is not compiled in is [`Error::FeatureDisabled`], naming the feature.
//!
//! ```no_run
//! # async fn demo() -> distlock::Result<()> {
//! let locker = distlock::connect("memory://").await?;
//! let outcome = locker
//!     .run("jobs/report", &distlock::LockOptions::new().skip(), async { 42 })
//!     .await?;
//! assert_eq!(outcome, distlock::Outcome::Ran(42));
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub use lock_core::*;

#[cfg(feature = "etcd")]
pub use lock_etcd as etcd;
#[cfg(feature = "memory")]
pub use lock_memory::MemoryBackend;
#[cfg(feature = "redis")]
pub use lock_redis as redis;
#[cfg(feature = "redlock")]
pub use lock_redlock as redlock;

/// The environment variable [`from_env`] reads.
pub const URL_ENV: &str = "DISTLOCK_URL";

/// Builds a ready [`Locker`] from a lock-server URL.
///
/// # Errors
/// [`Error::InvalidUrl`] for a malformed URL or unknown options, [`Error::FeatureDisabled`]
/// when the scheme's backend is not compiled in, and the backend's connection errors.
pub async fn connect(url: &str) -> Result<Locker> {
    let parsed = LockUrl::parse(url)?;
    match parsed.scheme {
        #[cfg(feature = "memory")]
        Scheme::Memory => {
            parsed.check_params(&[])?;
            Ok(Locker::new(lock_memory::MemoryBackend::new()))
        }
        #[cfg(feature = "redis")]
        Scheme::Redis | Scheme::Rediss => Ok(Locker::new(
            lock_redis::RedisBackend::connect(&parsed).await?,
        )),
        #[cfg(feature = "redlock")]
        Scheme::Redlock => Ok(Locker::new(
            lock_redlock::RedlockBackend::connect(&parsed).await?,
        )),
        #[cfg(feature = "etcd")]
        Scheme::Etcd => Ok(Locker::new(lock_etcd::EtcdBackend::connect(&parsed).await?)),
        #[allow(unreachable_patterns)]
        scheme => Err(Error::FeatureDisabled {
            scheme: scheme.as_str().to_owned(),
            feature: scheme.feature(),
        }),
    }
}

/// Builds a [`Locker`] from the `DISTLOCK_URL` environment variable, `memory://` when unset.
///
/// # Errors
/// As [`connect`]; a value that is not UTF-8 is [`Error::InvalidUrl`].
pub async fn from_env() -> Result<Locker> {
    match std::env::var(URL_ENV) {
        Ok(url) => connect(&url).await,
        Err(std::env::VarError::NotPresent) => connect("memory://").await,
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::invalid_url(
            "",
            format!("{URL_ENV} is not valid UTF-8"),
        )),
    }
}
