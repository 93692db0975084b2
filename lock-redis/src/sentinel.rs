//! Redis Sentinel: the builder of a master named through its sentinels, and how the master
//! is found ([`Endpoint`]): the sentinels are asked in turn for the master's address, the
//! node there is checked to be a master (`ROLE`), and only then used. The shared
//! connection (`connection.rs`) and the release subscription (`watch.rs`) open every
//! connection through an [`Endpoint`], so both follow the master after a failover. The
//! configuration and URL rules are in `sentinel/url.rs`.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use lock_core::url::HostPort;
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo,
    RedisConnectionInfo, Value,
};
use tokio::time::Instant;

use crate::codec::text;
use crate::config::RedisBuilder;
use crate::error::Failure;

pub(crate) mod url;

pub(crate) use url::SentinelConfig;
pub use url::{DEFAULT_SENTINEL_PORT, SENTINEL_SCHEME, SENTINEL_URL_PARAMS};

impl RedisBuilder {
    /// A configuration for the master named `master` (the name in the sentinels'
    /// `sentinel monitor <name> …`) that the sentinels at `sentinels` (`host`,
    /// `host:port`, `[v6]:port`; default port 26379) monitor: what a
    /// `redis+sentinel://host:port,…/<master>` URL gives. Otherwise as
    /// [`new`](Self::new): database 0, prefix `distlock:`, a 1 s operation timeout.
    ///
    /// Before each new connection the sentinels are asked in turn (the one that answered
    /// last first), each within its share of what is left of the operation timeout, for
    /// the master's address (`SENTINEL get-master-addr-by-name`), and the node there is
    /// used only when `ROLE` says it is a master. A connection that breaks, or a node that
    /// answers `READONLY` (a demoted master), makes the next operation ask again.
    ///
    /// [`username`](Self::username) and [`password`](Self::password) are the master's
    /// (and its replicas') credentials; the sentinels get none unless
    /// [`sentinel_username`](Self::sentinel_username) /
    /// [`sentinel_password`](Self::sentinel_password) are set. A malformed address, no
    /// sentinel or an empty master name is reported by `build` as [`Error::InvalidUrl`](lock_core::Error::InvalidUrl).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo() -> lock_core::Result<()> {
    /// use lock_redis::RedisBuilder;
    ///
    /// let backend = RedisBuilder::sentinel(["10.0.0.1", "10.0.0.2:26380"], "locks")
    ///     .password("master-secret")
    ///     .sentinel_password("sentinel-secret")
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel(
        sentinels: impl IntoIterator<Item = impl Into<String>>,
        master: impl Into<String>,
    ) -> RedisBuilder {
        let config = SentinelConfig::new(sentinels, master);
        // The address is the first sentinel's (as a URL's); the sentinels decide.
        let first = config.first().unwrap_or_else(|| "sentinel".to_owned());
        RedisBuilder::new(first).with_sentinel(config)
    }

    /// The ACL user name the sentinels take (`AUTH` on each sentinel connection); only
    /// for a configuration made by [`sentinel`](Self::sentinel), ignored otherwise.
    pub fn sentinel_username(mut self, username: impl Into<String>) -> Self {
        if let Some(config) = self.sentinel_config_mut() {
            config.username = Some(username.into());
        }
        self
    }

    /// The password the sentinels take (their `requirepass`); only for a configuration
    /// made by [`sentinel`](Self::sentinel), ignored otherwise. Shown as `redacted` in
    /// messages and `Debug`.
    pub fn sentinel_password(mut self, password: impl Into<String>) -> Self {
        if let Some(config) = self.sentinel_config_mut() {
            config.password = Some(password.into());
        }
        self
    }

    /// The name of the master the sentinels are asked for, when configured through
    /// sentinels.
    pub fn sentinel_master(&self) -> Option<&str> {
        self.sentinel_config().map(|c| c.master.as_str())
    }
}

/// Where connections go: one fixed server, or the master the sentinels name.
#[derive(Clone)]
pub(crate) enum Endpoint {
    Direct(Arc<Client>),
    Sentinel(Arc<Sentinels>),
}

impl Endpoint {
    /// The endpoint `config` describes, with `settings` (database, credentials) for the
    /// data node, and its description for messages; `None` for a direct server.
    pub(crate) fn for_sentinels(
        config: &RedisBuilder,
        settings: &RedisConnectionInfo,
    ) -> Option<(Endpoint, String)> {
        let sentinel = config.sentinel_config()?;
        let endpoint = Endpoint::Sentinel(Arc::new(Sentinels {
            config: sentinel.clone(),
            settings: settings.clone(),
            first: AtomicUsize::new(0),
        }));
        Some((endpoint, sentinel.describe()))
    }

    /// A new multiplexed connection to the server (the current master), before
    /// `deadline`.
    pub(crate) async fn connect(
        &self,
        config: &AsyncConnectionConfig,
        deadline: Instant,
    ) -> std::result::Result<MultiplexedConnection, Failure> {
        let connect = async {
            match self {
                Endpoint::Direct(client) => client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
                    .map_err(Failure::Redis),
                Endpoint::Sentinel(sentinels) => Ok(sentinels.master(config, deadline).await?.1),
            }
        };
        tokio::time::timeout_at(deadline, connect)
            .await
            .unwrap_or(Err(Failure::Timeout))
    }

    /// A client of the server (the current master, checked), before `deadline`: for the
    /// release subscription.
    pub(crate) async fn client(&self, deadline: Instant) -> std::result::Result<Client, Failure> {
        match self {
            Endpoint::Direct(client) => Ok(Client::clone(client)),
            Endpoint::Sentinel(sentinels) => {
                let config = AsyncConnectionConfig::new()
                    .set_connection_timeout(None)
                    .set_response_timeout(None);
                tokio::time::timeout_at(deadline, sentinels.master(&config, deadline))
                    .await
                    .map_err(|_| Failure::Timeout)?
                    .map(|(client, _)| client)
            }
        }
    }
}

/// The sentinels of one master and the settings of the connections to it.
pub(crate) struct Sentinels {
    config: SentinelConfig,
    settings: RedisConnectionInfo,
    /// The sentinel that answered last, asked first next time.
    first: AtomicUsize,
}

/// Why one sentinel gave no usable master.
struct Miss {
    /// Whether asking again later may succeed (unreachable, failover in progress), as
    /// opposed to a configuration the sentinels refuse (unknown master, credentials).
    transient: bool,
    text: String,
}

impl Miss {
    fn transient(text: String) -> Miss {
        Miss {
            transient: true,
            text,
        }
    }

    fn redis(what: &str, e: redis::RedisError) -> Miss {
        let auth = e.kind() == redis::ErrorKind::AuthenticationFailed
            || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"));
        Miss {
            // Refused credentials and a peer that is not Redis stay so when asked again.
            transient: !auth && e.kind() != redis::ErrorKind::Parse,
            text: if auth {
                format!("{what}: authentication refused (check the credentials): {e}")
            } else if e.is_connection_refusal() {
                format!("{what}: connection refused: {e}")
            } else {
                format!("{what}: {e}")
            },
        }
    }
}

impl Sentinels {
    /// The current master: a client and a connection to it, checked with `ROLE`. Each
    /// sentinel in turn, from the one that answered last, gets an equal share of the time
    /// left before `deadline` (so a silent one cannot use up the others' time, and one
    /// refusing at once passes its share on).
    async fn master(
        &self,
        config: &AsyncConnectionConfig,
        deadline: Instant,
    ) -> std::result::Result<(Client, MultiplexedConnection), Failure> {
        let sentinels = match &self.config.sentinels {
            Ok(list) if !list.is_empty() => list,
            _ => return Err(Failure::Reply("no sentinel configured".into())),
        };
        let n = sentinels.len();
        let start = self.first.load(Ordering::Relaxed) % n;
        let mut misses = Vec::with_capacity(n);
        for turn in 0..n {
            let index = (start + turn) % n;
            let sentinel = &sentinels[index];
            let now = Instant::now();
            if now >= deadline {
                misses.push(Miss::transient(format!(
                    "{sentinel}: not asked, no time left"
                )));
                continue;
            }
            let share = (deadline - now) / (n - turn) as u32;
            match tokio::time::timeout(share, self.ask(sentinel, config)).await {
                Ok(Ok(found)) => {
                    self.first.store(index, Ordering::Relaxed);
                    return Ok(found);
                }
                Ok(Err(miss)) => misses.push(miss),
                Err(_) => misses.push(Miss::transient(format!(
                    "{sentinel}: no answer within {share:?}"
                ))),
            }
        }
        let transient = misses.iter().any(|m| m.transient);
        let texts: Vec<String> = misses.into_iter().map(|m| m.text).collect();
        Err(Failure::Discovery {
            transient,
            message: format!(
                "no sentinel named a reachable master `{}`: {}",
                self.config.master,
                texts.join("; ")
            ),
        })
    }

    /// Asks `sentinel` for the master's address, connects there and checks `ROLE`.
    async fn ask(
        &self,
        sentinel: &HostPort,
        config: &AsyncConnectionConfig,
    ) -> std::result::Result<(Client, MultiplexedConnection), Miss> {
        let what = format!("sentinel {sentinel}");
        let mut settings = RedisConnectionInfo::default();
        if let Some(user) = &self.config.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = &self.config.password {
            settings = settings.set_password(password);
        }
        let client =
            open(&sentinel.host, sentinel.port, settings).map_err(|e| Miss::redis(&what, e))?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(config)
            .await
            .map_err(|e| Miss::redis(&what, e))?;
        let reply: Value = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.config.master)
            .query_async(&mut conn)
            .await
            .map_err(|e| Miss::redis(&what, e))?;
        let (host, port) = match master_addr(&reply) {
            Some(addr) => addr,
            None if matches!(reply, Value::Nil) => {
                return Err(Miss {
                    transient: false,
                    text: format!(
                        "{what}: monitors no master named `{}` (check the name in the URL's path)",
                        self.config.master
                    ),
                })
            }
            None => {
                return Err(Miss {
                    transient: false,
                    text: format!("{what}: unexpected reply {reply:?} (is this a sentinel?)"),
                })
            }
        };
        let at = format!("{what} names master {host}:{port}, which");
        let client = open(&host, port, self.settings.clone()).map_err(|e| Miss::redis(&at, e))?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(config)
            .await
            .map_err(|e| Miss::redis(&at, e))?;
        let role: Value = redis::cmd("ROLE")
            .query_async(&mut conn)
            .await
            .map_err(|e| Miss::redis(&at, e))?;
        match role_name(&role).as_deref() {
            Some("master") => Ok((client, conn)),
            // A demoted master, or a replica not yet promoted: a failover is under way.
            Some(other) => Err(Miss::transient(format!("{at} is a {other}, not a master"))),
            None => Err(Miss::transient(format!("{at} answered ROLE with {role:?}"))),
        }
    }
}

impl fmt::Debug for Sentinels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.config.describe())
    }
}

fn open(host: &str, port: u16, settings: RedisConnectionInfo) -> redis::RedisResult<Client> {
    let info: ConnectionInfo = ConnectionAddr::Tcp(host.to_owned(), port)
        .into_connection_info()?
        .set_redis_settings(settings);
    Client::open(info)
}

/// The `[host, port]` of a `SENTINEL get-master-addr-by-name` reply.
fn master_addr(reply: &Value) -> Option<(String, u16)> {
    match reply {
        Value::Array(items) => match items.as_slice() {
            [host, port] => Some((text(host)?, text(port)?.parse().ok()?)),
            _ => None,
        },
        _ => None,
    }
}

/// The first element of a `ROLE` reply: `master`, `slave` or `sentinel`.
fn role_name(reply: &Value) -> Option<String> {
    match reply {
        Value::Array(items) => text(items.first()?),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
