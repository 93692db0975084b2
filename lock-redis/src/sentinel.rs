//! Redis Sentinel: the `redis+sentinel://` URL and builder, and how the master is found
//! ([`Endpoint`]): the sentinels are asked in turn for the master's address, the node there
//! is checked to be a master (`ROLE`), and only then used. The shared connection
//! (`connection.rs`) and the release subscription (`watch.rs`) open every connection
//! through an [`Endpoint`], so both follow the master after a failover.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use lock_core::url::{Host, HostPort, UserInfo};
use lock_core::{Error, LockUrl, Result};
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo,
    RedisConnectionInfo, Value,
};
use tokio::time::Instant;

use crate::codec::text;
use crate::config::{url_database, RedisBuilder, DEFAULT_PREFIX, DEFAULT_TIMEOUT};
use crate::error::Failure;

/// The scheme of a URL naming a master through its sentinels.
pub const SENTINEL_SCHEME: &str = "redis+sentinel";
/// The port of a sentinel when an address or URL names none.
pub const DEFAULT_SENTINEL_PORT: u16 = 26379;
/// The URL parameters a `redis+sentinel://` URL may carry.
pub const SENTINEL_URL_PARAMS: &[&str] =
    &["prefix", "timeout", "sentinel_user", "sentinel_password"];

/// The sentinels of one master, and the credentials the sentinels (not the master) take.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelConfig {
    /// The sentinels' addresses, or the text of the first malformed one and why.
    sentinels: std::result::Result<Vec<HostPort>, (String, String)>,
    master: String,
    username: Option<String>,
    password: Option<String>,
}

impl SentinelConfig {
    /// Refuses what `build` could not use: a malformed sentinel address, none at all, or
    /// an empty master name.
    pub(crate) fn check(&self, shown: &str, tls: bool) -> Result<()> {
        if tls {
            return Err(Error::invalid_url(
                shown,
                "TLS is not supported through sentinels yet (use redis+sentinel:// without TLS)",
            ));
        }
        match &self.sentinels {
            Err((addr, reason)) => Err(Error::invalid_url(
                shown,
                format!("sentinel address `{addr}`: {reason}"),
            )),
            Ok(list) if list.is_empty() => {
                Err(Error::invalid_url(shown, "name at least one sentinel"))
            }
            Ok(_) if self.master.is_empty() => Err(Error::invalid_url(
                shown,
                "the master name (the sentinels' `sentinel monitor <name>`) is empty",
            )),
            Ok(_) => Ok(()),
        }
    }

    /// The URL of a sentinel configuration: the sentinels as hosts, the master name and
    /// database as the path, the sentinels' credentials as parameters after `params`.
    pub(crate) fn lock_url(
        &self,
        userinfo: Option<UserInfo>,
        db: u32,
        mut params: Vec<(String, String)>,
    ) -> Option<LockUrl> {
        let hosts = self.sentinels.as_ref().ok()?;
        let mut path = format!("/{}", self.master);
        if db != 0 {
            path.push_str(&format!("/{db}"));
        }
        if let Some(user) = &self.username {
            params.push(("sentinel_user".to_owned(), user.clone()));
        }
        if let Some(password) = &self.password {
            params.push(("sentinel_password".to_owned(), password.clone()));
        }
        Some(LockUrl {
            scheme: SENTINEL_SCHEME.to_owned(),
            userinfo,
            hosts: hosts.iter().cloned().map(Host::from).collect(),
            path,
            params,
        })
    }

    /// The text standing for a configuration whose sentinel addresses are malformed.
    pub(crate) fn describe_invalid(&self) -> String {
        match &self.sentinels {
            Err((addr, _)) => format!("<invalid sentinel address {addr:?}>"),
            Ok(_) => self.describe(),
        }
    }

    /// `master `name` via sentinels a,b,c`: where errors say the requests went.
    fn describe(&self) -> String {
        let list: Vec<String> = match &self.sentinels {
            Ok(list) => list.iter().map(ToString::to_string).collect(),
            Err((addr, _)) => vec![addr.clone()],
        };
        format!("master `{}` via sentinels {}", self.master, list.join(","))
    }
}

/// Replaces the value of `sentinel_password` by `redacted`: for messages and `Debug`, where
/// [`LockUrl::redacted`] hides the user info's password only.
pub(crate) fn hide_password(url: &mut LockUrl) {
    for (name, value) in &mut url.params {
        if name == "sentinel_password" {
            *value = "redacted".to_owned();
        }
    }
}

/// The configuration a `redis+sentinel://` URL describes (see
/// [`RedisBuilder::from_url`]).
pub(crate) fn builder_from_url(url: &LockUrl) -> Result<RedisBuilder> {
    let mut shown = url.clone();
    hide_password(&mut shown);
    if url.hosts.is_empty() {
        return Err(shown.invalid(format!("{SENTINEL_SCHEME}:// needs at least one sentinel")));
    }
    let mut segments = url.path.strip_prefix('/').unwrap_or(&url.path).splitn(2, '/');
    let master = segments.next().unwrap_or_default().to_owned();
    if master.is_empty() {
        return Err(shown.invalid(format!(
            "{SENTINEL_SCHEME}:// needs the master name as its path: \
             {SENTINEL_SCHEME}://host:port,host:port/<master-name>[/db]"
        )));
    }
    let mut db_url = shown.clone();
    db_url.path = segments.next().map(|db| format!("/{db}")).unwrap_or_default();
    let db = url_database(&db_url)?;
    shown.check_params(SENTINEL_URL_PARAMS)?;
    let mut builder = RedisBuilder::sentinel(
        url.host_ports(DEFAULT_SENTINEL_PORT)
            .iter()
            .map(ToString::to_string),
        master,
    )
    .db(db)
    .prefix(url.param("prefix").unwrap_or(DEFAULT_PREFIX))
    .timeout(shown.duration_param("timeout")?.unwrap_or(DEFAULT_TIMEOUT));
    if let Some(user) = url.username() {
        builder = builder.username(user);
    }
    if let Some(password) = url.password() {
        builder = builder.password(password);
    }
    if let Some(user) = url.param("sentinel_user") {
        builder = builder.sentinel_username(user);
    }
    if let Some(password) = url.param("sentinel_password") {
        builder = builder.sentinel_password(password);
    }
    builder.check()?;
    Ok(builder)
}

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
    /// sentinel or an empty master name is reported by `build` as [`Error::InvalidUrl`].
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
        let sentinels: std::result::Result<Vec<HostPort>, (String, String)> = sentinels
            .into_iter()
            .map(|addr| {
                let addr = addr.into();
                HostPort::parse(&addr, DEFAULT_SENTINEL_PORT).map_err(|reason| (addr, reason))
            })
            .collect();
        let first = match &sentinels {
            Ok(list) => list.first().map(ToString::to_string),
            Err(_) => None,
        };
        // The address is the first sentinel's (for messages); the sentinels decide.
        RedisBuilder::new(first.unwrap_or_else(|| "sentinel".to_owned())).with_sentinel(
            SentinelConfig {
                sentinels,
                master: master.into(),
                username: None,
                password: None,
            },
        )
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

impl crate::RedisBackend {
    /// A builder for the master named `master` that the sentinels at `sentinels` monitor;
    /// see [`RedisBuilder::sentinel`].
    pub fn sentinel_builder(
        sentinels: impl IntoIterator<Item = impl Into<String>>,
        master: impl Into<String>,
    ) -> RedisBuilder {
        RedisBuilder::sentinel(sentinels, master)
    }
}

/// Where connections go: one fixed server, or the master the sentinels name.
#[derive(Clone)]
pub(crate) enum Endpoint {
    Direct(Client),
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
            Endpoint::Direct(client) => Ok(client.clone()),
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
                misses.push(Miss::transient(format!("{sentinel}: not asked, no time left")));
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
        let client = open(&sentinel.host, sentinel.port, settings)
            .map_err(|e| Miss::redis(&what, e))?;
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
