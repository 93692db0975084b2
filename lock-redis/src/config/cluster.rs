//! The Redis Cluster side of [`RedisBuilder`]: `redis+cluster://` URLs and seed nodes.

use lock_core::url::{Host, HostPort, UserInfo};
use lock_core::{Error, LockUrl, Result};

use super::{parse_addr, RedisBuilder, DEFAULT_PORT, DEFAULT_PREFIX, URL_PARAMS};

/// The scheme of a Redis Cluster URL.
pub(crate) const SCHEME: &str = "redis+cluster";

impl RedisBuilder {
    /// A configuration for the Redis Cluster reached through `seeds` (each `host`,
    /// `host:port` or `[v6]:port`, default port 6379): the client asks them for the slot
    /// map and then talks to every master directly, following `MOVED`/`ASK` redirections
    /// and failovers. One seed is enough to find the cluster; give several, so that the
    /// cluster is found, and release notices heard, while one of them is down. Database 0
    /// (a cluster has no other), no TLS, prefix and timeout as for [`new`](Self::new),
    /// and [`grouping`](Self::grouping) off: every request is its own call (measured
    /// faster on a cluster, see the design notes of [`RedisBackend`](crate::RedisBackend)).
    /// A malformed or missing seed is reported by `build` as [`Error::InvalidUrl`].
    pub fn cluster<S: Into<String>>(seeds: impl IntoIterator<Item = S>) -> Self {
        let mut parsed = Vec::new();
        let mut first_error = None;
        for seed in seeds {
            match parse_addr(seed.into()) {
                Ok(host) => parsed.push(host),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let addr = match (first_error, parsed.first()) {
            (Some(e), _) => Err(e),
            (None, Some(first)) => Ok(first.clone()),
            (None, None) => Err((
                String::new(),
                "a Redis Cluster needs at least one seed node".to_owned(),
            )),
        };
        RedisBuilder {
            addr,
            seeds: Some(parsed),
            grouping: false,
            ..RedisBuilder::new("")
        }
    }

    /// Whether this configuration names a Redis Cluster (`redis+cluster://`,
    /// [`cluster`](Self::cluster)).
    pub fn is_cluster(&self) -> bool {
        self.seeds.is_some()
    }

    /// The seed nodes of a cluster configuration; empty for one server.
    pub fn seed_nodes(&self) -> &[HostPort] {
        self.seeds.as_deref().unwrap_or_default()
    }

    /// `redis+cluster://[user[:password]@]host[:port],…[?prefix=…&timeout=…]`: one or more
    /// seed nodes, no database path.
    pub(super) fn from_cluster_url(url: &LockUrl) -> Result<Self> {
        if url.hosts.is_empty() {
            return Err(url.invalid(format!("{SCHEME}:// needs at least one seed node")));
        }
        let index = url.path.strip_prefix('/').unwrap_or(&url.path);
        if !index.is_empty() {
            return Err(url.invalid(format!(
                "a Redis Cluster has only database 0: remove the path `{}` from the URL",
                url.path
            )));
        }
        url.check_params(URL_PARAMS)?;
        let seeds: Vec<HostPort> = url
            .hosts
            .iter()
            .map(|h| h.with_default_port(DEFAULT_PORT))
            .collect();
        let mut builder = RedisBuilder {
            addr: Ok(seeds[0].clone()),
            username: url.username().map(str::to_owned),
            password: url.password().map(str::to_owned),
            prefix: url.param("prefix").unwrap_or(DEFAULT_PREFIX).to_owned(),
            seeds: Some(seeds),
            grouping: false,
            ..RedisBuilder::new("")
        };
        if let Some(timeout) = url.duration_param("timeout")? {
            builder.timeout = timeout;
        }
        builder.check()?;
        Ok(builder)
    }

    /// What a cluster configuration may not have: a database other than 0, TLS.
    pub(super) fn check_cluster(&self) -> Result<()> {
        if !self.is_cluster() {
            return Ok(());
        }
        if self.db != 0 {
            return Err(Error::invalid_url(
                &self.redacted(),
                format!(
                    "a Redis Cluster has only database 0, not {} (remove `db`)",
                    self.db
                ),
            ));
        }
        if self.tls {
            return Err(Error::invalid_url(
                &self.redacted(),
                "TLS to a Redis Cluster is not supported yet (use redis+cluster:// without tls)",
            ));
        }
        Ok(())
    }

    /// The `redis+cluster://` URL of a cluster configuration.
    pub(super) fn cluster_url(&self, seeds: &[HostPort], params: Vec<(String, String)>) -> LockUrl {
        LockUrl {
            scheme: SCHEME.to_owned(),
            userinfo: UserInfo::from_parts(
                self.username.as_deref().filter(|u| !u.is_empty()),
                self.password.as_deref(),
            ),
            hosts: seeds.iter().cloned().map(Host::from).collect(),
            path: String::new(),
            params,
        }
    }
}
