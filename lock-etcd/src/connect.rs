//! Connecting: [`EtcdBackend::builder`], [`EtcdBackend::connect`], and the start-up that
//! [`EtcdBuilder::build`] runs (server minimum lease, release watch, shared state).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{ConnectOptions, LeaseGrantOptions};
use lock_core::{Capabilities, LockUrl, ReleaseNotices, Result};

use crate::backend::EtcdBackend;
use crate::batch;
use crate::config::EtcdBuilder;
use crate::error::{failed, on_connect, timed_out, unexpected, NAME};
use crate::held::HeldTable;
use crate::leases::{new_lease_id, secs, Pool, HEADROOM_SECS};
use crate::members::Members;
use crate::shared::Shared;
use crate::version::ServerVersion;
use crate::watch;

/// Far beyond any sensible lease, and small enough that `Instant + ttl` never overflows.
const MAX_TTL: Duration = Duration::from_secs(365 * 24 * 3600);
/// HTTP/2 pings on the connections find dead ones; etcd refuses clients that ping more
/// often than every 5 s.
const CONNECTION_PING: Duration = Duration::from_secs(10);

impl EtcdBackend {
    /// A configuration for the cluster members at `endpoints` (`host:port`), to complete
    /// with the [`EtcdBuilder`] setters and [`build`](EtcdBuilder::build).
    pub fn builder<I, S>(endpoints: I) -> EtcdBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        EtcdBuilder::new(endpoints)
    }

    /// Connects to the cluster an `etcd://` URL names:
    /// `etcd://[user:password@]host[:port][,host[:port]…][?prefix=…&timeout=…]`.
    ///
    /// # Errors
    /// As [`EtcdBuilder::from_url`] and [`EtcdBuilder::build`].
    pub async fn connect(url: &LockUrl) -> Result<EtcdBackend> {
        EtcdBuilder::from_url(url)?.build().await
    }

    /// Connects to `cfg`'s members, asks the server for its shortest lease and starts the
    /// release watch: the body of [`EtcdBuilder::build`].
    pub(crate) async fn start(cfg: EtcdBuilder) -> Result<EtcdBackend> {
        let timeout = cfg.timeout;
        let doing = format!("connecting to etcd at {}", cfg.endpoints.join(","));
        let mut options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_keep_alive(CONNECTION_PING, timeout)
            .with_keep_alive_while_idle(false);
        if let Some(name) = &cfg.username {
            let password = cfg.password.clone().unwrap_or_default();
            options = options.with_user(name.clone(), password);
        }
        #[cfg(feature = "tls")]
        if cfg.tls {
            options = options.with_tls(tls_options(&cfg)?);
        }
        let members = Members::connect(&cfg.endpoints, options, timeout, &doing)
            .await
            .map_err(on_connect(cfg.tls))?;
        let client = members.client();
        let connect = async {
            // The shortest lease the server grants: it raises shorter TTLs to its minimum.
            let probe = new_lease_id();
            let granted = client
                .lease_client()
                .grant(1, Some(LeaseGrantOptions::new().with_id(probe)))
                .await
                .map_err(failed(doing.as_str()))?;
            if !granted.error().is_empty() || granted.ttl() < 1 {
                return Err(unexpected("a lease grant without a positive TTL"));
            }
            let _ = client.lease_client().revoke(probe).await;
            // etcd 3.4 grants leases to anyone: a read under the prefix is what tells early
            // that the credentials are missing or lack permissions.
            watch::current_revision(&client, &cfg.prefix)
                .await
                .map_err(failed(doing.as_str()))?;
            // Only for the warning below: a member that will not tell counts as unknown.
            let version = match client.maintenance_client().status().await {
                Ok(status) => ServerVersion::new(status.version()),
                Err(_) => ServerVersion::new("unknown"),
            };
            Ok((granted.ttl(), version))
        };
        let (min_secs, version) = tokio::time::timeout(timeout, connect)
            .await
            .unwrap_or_else(|_| Err(timed_out(&doing, timeout)))
            .map_err(on_connect(cfg.tls))?;
        if version.revokes_live_leases_after_a_leader_stall() {
            tracing::warn!(
                version = version.text(),
                "this etcd server may free a held lock early after its leader stalls for \
                 longer than the lock's TTL (etcd issue 15247, mitigated in 3.4.30 and \
                 3.5.12): fence the resource, or upgrade etcd"
            );
        }
        let members = Arc::new(members);
        let notices = Arc::new(ReleaseNotices::new());
        let announcer = Arc::new(watch::Announcer::new(notices.clone()));
        let demand = Arc::new(watch::Demand::new(notices.clone()));
        let watch = tokio::spawn(watch::run(
            members.clone(),
            cfg.prefix.clone(),
            announcer.clone(),
            timeout,
            demand.clone(),
            watch::Kind::Releases,
        ))
        .abort_handle();
        // Observers of elections: published values and announcements (`leaders.rs`).
        let leaders_demand = Arc::new(watch::Demand::new(notices.clone()));
        let leaders_watch = tokio::spawn(watch::run(
            members.clone(),
            crate::leaders::root(&cfg.prefix),
            announcer.clone(),
            timeout,
            leaders_demand.clone(),
            watch::Kind::Leaders,
        ))
        .abort_handle();
        let shared = Shared {
            batch: batch::batcher(members.clone(), timeout),
            members,
            endpoints: cfg.endpoints,
            prefix: cfg.prefix,
            timeout,
            caps: Capabilities::new(NAME)
                // A lock's lease is HEADROOM_SECS longer than the lock.
                .min_ttl(secs((min_secs - HEADROOM_SECS).max(1)))
                .ttl_granularity(Duration::from_secs(1))
                .max_ttl(MAX_TTL)
                .monotonic_fencing(true)
                .release_notices(true)
                .cross_process(true)
                .clock_drift(lock_core::ClockDrift::NONE)
                // Semaphores and reader-writer keys: a holder key per grant (`permits.rs`).
                .max_permits(lock_core::MAX_PERMITS),
            notices,
            announcer,
            demand,
            leaders_demand,
            held: Mutex::new(HeldTable::default()),
            running: Default::default(),
            pool: Mutex::new(Pool::default()),
            version,
        };
        Ok(EtcdBackend {
            shared: Arc::new(shared),
            watch,
            leaders_watch,
        })
    }
}

/// The TLS settings of `cfg`: its CA (or the system's roots) and client certificate, read
/// from their files.
///
/// # Errors
/// [`Error::InvalidUrl`](lock_core::Error::InvalidUrl) naming a file that cannot be read.
#[cfg(feature = "tls")]
fn tls_options(cfg: &EtcdBuilder) -> Result<etcd_client::TlsOptions> {
    use etcd_client::{Certificate, Identity, TlsOptions};
    let read = |what: &str, path: &std::path::Path| {
        std::fs::read(path).map_err(|e| {
            lock_core::Error::invalid_url(
                &cfg.redacted(),
                format!("cannot read the {what} file {}: {e}", path.display()),
            )
        })
    };
    let mut options = match cfg.get_ca_file() {
        Some(ca) => TlsOptions::new().ca_certificate(Certificate::from_pem(read("CA", ca)?)),
        None => TlsOptions::new().with_native_roots(),
    };
    if let Some((cert, key)) = cfg.get_client_cert() {
        options = options.identity(Identity::from_pem(
            read("client certificate", cert)?,
            read("client key", key)?,
        ));
    }
    Ok(options)
}

impl EtcdBuilder {
    /// Connects, measures the server's shortest lease, starts the release watch and returns
    /// the backend.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`](lock_core::Error::InvalidUrl) for a malformed configuration (no endpoint, an endpoint that is
    /// not `host:port`, an empty prefix, a zero timeout); [`Error::Unavailable`](lock_core::Error::Unavailable) when no
    /// member answers within the timeout; [`Error::Backend`](lock_core::Error::Backend) when etcd refuses the
    /// credentials or the requests.
    pub async fn build(self) -> Result<EtcdBackend> {
        self.check()?;
        EtcdBackend::start(self).await
    }
}
