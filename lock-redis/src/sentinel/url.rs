//! The sentinels of a master as configured ([`SentinelConfig`]): the rules of a
//! `redis+sentinel://` URL, its text form and what messages show of it. Knows nothing of
//! the builder it is part of (`config.rs`), nor of the discovery (`sentinel.rs`).

use lock_core::url::{Host, HostPort, UserInfo};
use lock_core::{Error, LockUrl, Result};

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
    pub(crate) sentinels: std::result::Result<Vec<HostPort>, (String, String)>,
    /// The name the sentinels monitor the master under.
    pub(crate) master: String,
    /// The sentinels' own credentials.
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
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
    pub(crate) fn describe(&self) -> String {
        let list: Vec<String> = match &self.sentinels {
            Ok(list) => list.iter().map(ToString::to_string).collect(),
            Err((addr, _)) => vec![addr.clone()],
        };
        format!("master `{}` via sentinels {}", self.master, list.join(","))
    }
}

impl SentinelConfig {
    /// The sentinels at `sentinels` (default port 26379) of the master named `master`,
    /// without credentials; malformed addresses are reported by [`check`](Self::check).
    pub(crate) fn new(
        sentinels: impl IntoIterator<Item = impl Into<String>>,
        master: impl Into<String>,
    ) -> SentinelConfig {
        SentinelConfig {
            sentinels: sentinels
                .into_iter()
                .map(|addr| {
                    let addr = addr.into();
                    HostPort::parse(&addr, DEFAULT_SENTINEL_PORT).map_err(|reason| (addr, reason))
                })
                .collect(),
            master: master.into(),
            username: None,
            password: None,
        }
    }

    /// The first sentinel's `host:port`, which the builder keeps as its address.
    pub(crate) fn first(&self) -> Option<String> {
        self.sentinels
            .as_ref()
            .ok()?
            .first()
            .map(ToString::to_string)
    }

    /// The sentinels a `redis+sentinel://` URL names, and `data` applied to the rest of
    /// it written as a `redis://` URL (the user info, `/db`, `prefix` and `timeout`, with
    /// the first sentinel as its host), so those follow the rules of one server. Every
    /// refusal is [`Error::InvalidUrl`] about the URL as given, passwords hidden.
    pub(crate) fn from_url<T>(
        url: &LockUrl,
        data: impl FnOnce(&LockUrl) -> Result<T>,
    ) -> Result<(SentinelConfig, T)> {
        // Its errors hide `sentinel_password` as they hide the user info's password.
        let shown = url;
        let first = match url.hosts.first() {
            Some(first) => first.with_default_port(DEFAULT_SENTINEL_PORT),
            None => {
                return Err(
                    shown.invalid(format!("{SENTINEL_SCHEME}:// needs at least one sentinel"))
                )
            }
        };
        let mut segments = url
            .path
            .strip_prefix('/')
            .unwrap_or(&url.path)
            .splitn(2, '/');
        let master = segments.next().unwrap_or_default().to_owned();
        if master.is_empty() {
            return Err(shown.invalid(format!(
                "{SENTINEL_SCHEME}:// needs the master name as its path: \
                 {SENTINEL_SCHEME}://host:port,host:port/<master-name>[/db]"
            )));
        }
        shown.check_params(SENTINEL_URL_PARAMS)?;
        let mut config = SentinelConfig::new(
            url.host_ports(DEFAULT_SENTINEL_PORT)
                .iter()
                .map(ToString::to_string),
            master,
        );
        config.username = url.param("sentinel_user").map(str::to_owned);
        config.password = url.param("sentinel_password").map(str::to_owned);
        let rest = LockUrl {
            scheme: "redis".to_owned(),
            userinfo: url.userinfo.clone(),
            hosts: vec![Host::from(first)],
            path: segments
                .next()
                .map(|db| format!("/{db}"))
                .unwrap_or_default(),
            params: url
                .params
                .iter()
                .filter(|(name, _)| !name.starts_with("sentinel_"))
                .cloned()
                .collect(),
        };
        let data = data(&rest).map_err(|e| match e {
            Error::InvalidUrl { reason, .. } => shown.invalid(reason),
            other => other,
        })?;
        Ok((config, data))
    }
}
