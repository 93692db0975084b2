//! # distlock
//!
//! One lock abstraction over several lock servers. Application code asks a [`Locker`] for
//! a lock by name; which server stands behind it is chosen by a Cargo feature and a URL:
//!
//! | URL | feature | backend |
//! |---|---|---|
//! | `memory://` | `memory` (default) | in-process keyed async mutex |
//! | `file:///absolute/dir[?sync=false]` | `file` | `flock` on a lock file per key: the processes of one host |
//! | `redis://[user:pass@]host[:port][/db][?prefix=…&timeout=…]`, `rediss://…[?ca=…&cert=…&key=…]` | `redis` | one Redis |
//! | `redis+sentinel://[user:pass@]host[:port],…/<master>[/db][?prefix=…&timeout=…&sentinel_password=…]` | `redis` | the master a set of Redis Sentinels names, followed across failovers |
//! | `redis+cluster://[user:pass@]host:port,host:port,…[?prefix=…&timeout=…]` | `redis` | a Redis Cluster (seed nodes) |
//! | `redlock://host:port,host:port,…[?drift=…]` | `redlock` | Redlock quorum over N Redis nodes |
//! | `etcd://[user:pass@]host:port[,host:port…][?prefix=…&timeout=…&tls=true&ca=…&cert=…&key=…]` | `etcd` | etcd leases |
//! | `postgres://[user:pass@]host[:port][/db][?table=…&schema=…&timeout=…]`, `postgresql://…` | `postgres` | a PostgreSQL lease table |
//! | `mysql://[user:pass@]host[:port]/db[?table=…&timeout=…]`, `mariadb://…` | `mysql` | a MySQL or MariaDB lease table |
//! | `zookeeper://host:port,host:port,…[/root][?session_timeout=…&timeout=…]` | `zookeeper` | ephemeral sequential nodes on a ZooKeeper ensemble |
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
// docs.rs marks each item with the Cargo features it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use lock_core::*;

#[cfg(feature = "etcd")]
pub use lock_etcd as etcd;
#[cfg(feature = "file")]
pub use lock_file as file;
#[cfg(feature = "memory")]
pub use lock_memory::MemoryBackend;
#[cfg(feature = "mysql")]
pub use lock_mysql as mysql;
#[cfg(feature = "postgres")]
pub use lock_postgres as postgres;
#[cfg(feature = "redis")]
pub use lock_redis as redis;
#[cfg(feature = "redlock")]
pub use lock_redlock as redlock;
#[cfg(feature = "scheduler")]
pub use lock_scheduler as scheduler;
#[cfg(feature = "zookeeper")]
pub use lock_zookeeper as zookeeper;

/// The environment variable [`from_env`] reads.
pub const URL_ENV: &str = "DISTLOCK_URL";

/// The URL [`from_env`] uses when [`URL_ENV`] is not set.
pub const DEFAULT_URL: &str = "memory://";

/// Every scheme [`connect`] knows, with the Cargo feature of this crate that provides its
/// backend; the same whichever features are compiled.
pub const SCHEMES: &[(&str, &str)] = &[
    ("memory", "memory"),
    ("file", "file"),
    ("redis", "redis"),
    ("rediss", "redis"),
    ("redis+sentinel", "redis"),
    ("redis+cluster", "redis"),
    ("redlock", "redlock"),
    ("etcd", "etcd"),
    ("postgres", "postgres"),
    ("postgresql", "postgres"),
    ("mysql", "mysql"),
    ("mariadb", "mysql"),
    ("zookeeper", "zookeeper"),
];

/// Builds a ready [`Locker`] from a lock-server URL.
///
/// The scheme chooses the backend (see [`SCHEMES`]); the backend's builder reads the rest
/// of the URL by its own rules (`RedisBuilder::from_url`, …).
///
/// # Errors
/// [`Error::InvalidUrl`] for a malformed URL, an unknown scheme (the message lists the known
/// ones) or options the backend does not take, [`Error::FeatureDisabled`] when the scheme's
/// backend is not compiled in, and the backend's connection errors.
pub async fn connect(url: &str) -> Result<Locker> {
    let url = LockUrl::parse(url)?;
    match url.scheme.as_str() {
        #[cfg(feature = "memory")]
        "memory" => Ok(Locker::new(lock_memory::MemoryBackend::from_url(&url)?)),
        #[cfg(feature = "file")]
        "file" => Ok(Locker::new(lock_file::FileBackend::from_url(&url)?)),
        #[cfg(feature = "redis")]
        "redis" | "rediss" | "redis+sentinel" | "redis+cluster" => {
            Ok(Locker::new(lock_redis::RedisBackend::connect(&url).await?))
        }
        #[cfg(feature = "redlock")]
        "redlock" => Ok(Locker::new(
            lock_redlock::RedlockBackend::connect(&url).await?,
        )),
        #[cfg(feature = "etcd")]
        "etcd" => Ok(Locker::new(lock_etcd::EtcdBackend::connect(&url).await?)),
        #[cfg(feature = "postgres")]
        "postgres" | "postgresql" => Ok(Locker::new(
            lock_postgres::PostgresBackend::connect(&url).await?,
        )),
        #[cfg(feature = "mysql")]
        "mysql" | "mariadb" => Ok(Locker::new(lock_mysql::MysqlBackend::connect(&url).await?)),
        #[cfg(feature = "zookeeper")]
        "zookeeper" => Ok(Locker::new(
            lock_zookeeper::ZooKeeperBackend::connect(&url).await?,
        )),
        other => Err(not_compiled(&url, other)),
    }
}

/// The error for a scheme [`connect`] has no compiled backend for: the feature to enable,
/// or, for a scheme no feature provides, the list of known ones.
fn not_compiled(url: &LockUrl, scheme: &str) -> Error {
    match SCHEMES.iter().find(|(name, _)| *name == scheme) {
        Some(&(_, feature)) => Error::FeatureDisabled {
            scheme: scheme.to_owned(),
            feature,
        },
        None => {
            let known: Vec<&str> = SCHEMES.iter().map(|(name, _)| *name).collect();
            url.invalid(format!(
                "unknown scheme `{scheme}` (expected {})",
                known.join(", ")
            ))
        }
    }
}

/// The lock-server URL in the [`URL_ENV`] environment variable, `None` when it is not set.
///
/// # Errors
/// [`Error::InvalidUrl`] when the value is not UTF-8.
pub fn env_url() -> Result<Option<String>> {
    match std::env::var(URL_ENV) {
        Ok(url) => Ok(Some(url)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(Error::invalid_url(
            "",
            format!("{URL_ENV} is not valid UTF-8"),
        )),
    }
}

/// Builds a [`Locker`] from the URL in [`URL_ENV`] (`DISTLOCK_URL`), [`DEFAULT_URL`]
/// (`memory://`) when it is not set.
///
/// # Errors
/// As [`env_url`] and [`connect`].
pub async fn from_env() -> Result<Locker> {
    let url = env_url()?;
    connect(url.as_deref().unwrap_or(DEFAULT_URL)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connect_now(url: &str) -> Result<Locker> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(connect(url))
    }

    /// An unknown scheme is refused whatever is compiled, listing the known ones, with the
    /// password hidden.
    #[test]
    fn unknown_schemes_list_the_known_ones() {
        for url in ["http://localhost", "consul://u:hunter2@h:8500"] {
            match connect_now(url) {
                Err(Error::InvalidUrl { url: shown, reason }) => {
                    assert!(!shown.contains("hunter2"), "{shown}");
                    assert!(reason.starts_with("unknown scheme `"), "{reason}");
                    assert!(
                        reason.ends_with(
                            "(expected memory, file, redis, rediss, redis+sentinel, redis+cluster, redlock, etcd, postgres, postgresql, mysql, mariadb, zookeeper)"
                        ),
                        "{reason}"
                    );
                }
                other => panic!("{url}: expected InvalidUrl, got {:?}", other.err()),
            }
        }
    }

    /// Each scheme names its feature whether or not that feature is compiled.
    #[test]
    fn schemes_map_to_features() {
        let url = LockUrl::parse("redis://h").unwrap();
        for (scheme, feature) in [
            ("memory", "memory"),
            ("file", "file"),
            ("redis", "redis"),
            ("rediss", "redis"),
            ("redis+sentinel", "redis"),
            ("redis+cluster", "redis"),
            ("redlock", "redlock"),
            ("etcd", "etcd"),
            ("postgres", "postgres"),
            ("postgresql", "postgres"),
            ("mysql", "mysql"),
            ("mariadb", "mysql"),
            ("zookeeper", "zookeeper"),
        ] {
            match not_compiled(&url, scheme) {
                Error::FeatureDisabled {
                    scheme: named,
                    feature: needed,
                } => assert_eq!((named.as_str(), needed), (scheme, feature)),
                other => panic!("{scheme}: expected FeatureDisabled, got {other:?}"),
            }
        }
        let text = not_compiled(&url, "etcd").to_string();
        assert!(text.contains("enable the `etcd` feature"), "{text}");
    }

    /// A scheme whose backend is not compiled in is `FeatureDisabled`, before any I/O.
    #[test]
    fn disabled_backends_name_their_feature() {
        for (scheme, feature) in SCHEMES {
            let compiled = match *feature {
                "memory" => cfg!(feature = "memory"),
                "file" => cfg!(feature = "file"),
                "redis" => cfg!(feature = "redis"),
                "redlock" => cfg!(feature = "redlock"),
                "etcd" => cfg!(feature = "etcd"),
                "postgres" => cfg!(feature = "postgres"),
                "mysql" => cfg!(feature = "mysql"),
                "zookeeper" => cfg!(feature = "zookeeper"),
                other => panic!("unknown feature {other}"),
            };
            if compiled {
                continue;
            }
            let url = format!("{scheme}://h");
            match connect_now(&url) {
                Err(Error::FeatureDisabled {
                    feature: needed, ..
                }) => assert_eq!(needed, *feature),
                other => panic!("{url}: expected FeatureDisabled, got {:?}", other.err()),
            }
        }
    }

    #[cfg(feature = "memory")]
    #[test]
    fn memory_urls_follow_the_memory_rules() {
        assert!(connect_now("MEMORY://").is_ok());
        match connect_now("memory://localhost") {
            Err(Error::InvalidUrl { reason, .. }) => {
                assert!(reason.contains("memory:// takes no host"), "{reason}")
            }
            other => panic!("expected InvalidUrl, got {:?}", other.err()),
        }
    }
}
