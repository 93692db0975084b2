//! [`PostgresBackend`]: the [`Backend`] over one lease table, with release notices from one
//! `LISTEN` connection.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::group::leases::LeaseRequest;
use lock_core::{
    Admin, Attempt, Backend, Baseline, Capabilities, ClockDrift, HandOver, Holder, Lease, LockUrl,
    Owner, Permits, ReleaseListener, ReleaseNotices, Result, Ttl,
};
use tokio_postgres::Row;

use crate::batch::{self, Answer, Batcher};
use crate::config::PostgresBuilder;
use crate::connection::Connection;
use crate::error::{Failure, NAME};
use crate::watch::ReleaseWatch;

/// What the PostgreSQL backend promises: TTLs from 10 ms to 30 days in 1 ms steps
/// (`timestamptz` keeps microseconds), fences from a sequence (strictly increasing across
/// every grant of a key, locks and permits alike), release notices by `NOTIFY`, no
/// clock-drift allowance (one clock: the database's), and claims of up to
/// [`MAX_PERMITS`](lock_core::MAX_PERMITS) permits (semaphores, reader-writer keys).
pub const CAPABILITIES: Capabilities = Capabilities::new(NAME)
    .min_ttl(Duration::from_millis(10))
    .ttl_granularity(Duration::from_millis(1))
    .max_ttl(Duration::from_secs(30 * 24 * 3600))
    .monotonic_fencing(true)
    .release_notices(true)
    .cross_process(true)
    .clock_drift(ClockDrift::NONE)
    // Semaphores and reader-writer keys: a row per holder in `<table>_perms` (`permits.rs`).
    .max_permits(lock_core::MAX_PERMITS);

/// What one raw cycle sends ([`Baseline::description`]).
pub const BASELINE_CYCLE: &str = "INSERT ON CONFLICT DO NOTHING + DELETE";

/// Locks in one PostgreSQL lease table, and permits (semaphores, reader-writer keys) in
/// the holders' table beside it: a [`Backend`] with hand-over (of locks), admin and a raw
/// baseline, and release notices from one `LISTEN` connection.
///
/// Build it with [`PostgresBackend::connect`] from a URL or [`PostgresBackend::builder`],
/// then hand it to a [`Locker`](lock_core::Locker). `Debug` hides the password.
///
#[doc = include_str!("design.md")]
pub struct PostgresBackend {
    /// The lock connection, behind the group commit of acquisitions and releases.
    batch: Arc<Batcher>,
    pub(crate) notices: Arc<ReleaseNotices>,
    /// The release subscription, started by the first `listen`.
    watch: OnceLock<ReleaseWatch>,
}

impl std::fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("addr", &self.connection().addr)
            .field("table", &self.connection().names.table)
            .field("listened_keys", &self.notices.listened_keys())
            .field("listening", &self.watch.get().is_some())
            .finish()
    }
}

impl PostgresBackend {
    /// A builder for the server at `addr` (`host` or `host:port`); see [`PostgresBuilder`].
    pub fn builder(addr: impl Into<String>) -> PostgresBuilder {
        PostgresBuilder::new(addr)
    }

    /// Connects to the database a `postgres://` or `postgresql://` URL names, creates the
    /// lease table if missing (this is what `distlock::connect` calls).
    ///
    /// # Errors
    /// As [`PostgresBuilder::from_url`] and [`PostgresBuilder::build`].
    pub async fn connect(url: &LockUrl) -> Result<PostgresBackend> {
        PostgresBuilder::from_url(url)?.build().await
    }

    pub(crate) fn connection(&self) -> &Connection {
        &self.batch.sender().connection
    }

    /// Sends an acquisition or a release through the group commit.
    async fn send(&self, request: LeaseRequest) -> Result<Answer> {
        self.batch
            .send_lease(request, self.connection().timeout)
            .await
            .map_err(|e| e.into_error())
    }

    /// The quoted `"schema"."table"` of the lease table.
    pub fn table(&self) -> &str {
        &self.connection().names.table
    }

    /// The quoted `"schema"."<table>_runs"` of the run records' table.
    pub fn runs_table(&self) -> &str {
        &self.connection().names.runs
    }

    /// The quoted `"schema"."<table>_fires"` of the fire-time claims' table.
    pub fn fires_table(&self) -> &str {
        &self.connection().names.fires
    }

    /// The quoted `"schema"."<table>_perms"` of the holders of permits (semaphores,
    /// reader-writer keys): one row per holder, while the lease table keeps the key's
    /// marker row (owner `*<of>`, expiring with the latest holder) so that no lock is
    /// granted beside them.
    pub fn perms_table(&self) -> &str {
        &self.connection().names.perms
    }

    /// The quoted `"schema"."<table>_leads"` of the leaders' values of elections: one row
    /// per election, the value its last publishing leader published.
    pub fn leaders_table(&self) -> &str {
        &self.connection().names.leads
    }

    /// The channel releases are announced on (`LISTEN "…"`).
    pub fn channel(&self) -> &str {
        &self.connection().names.channel
    }

    pub(crate) async fn query(
        &self,
        op: &'static str,
        pick: fn(&crate::connection::Statements) -> &tokio_postgres::Statement,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>> {
        self.connection()
            .query(op, pick, params)
            .await
            .map_err(|e| e.into_error())
    }

    pub(crate) fn bad_reply(
        &self,
        op: &'static str,
        what: impl std::fmt::Display,
    ) -> lock_core::Error {
        self.connection()
            .error(op, Failure::Reply(format!("unexpected reply: {what}")))
            .into_error()
    }

    /// Reads column `i` of `row`, or says the reply was not what the statement returns.
    pub(crate) fn get<'a, T: tokio_postgres::types::FromSql<'a>>(
        &self,
        op: &'static str,
        row: &'a Row,
        i: usize,
    ) -> Result<T> {
        row.try_get(i).map_err(|e| self.bad_reply(op, e))
    }

    pub(crate) fn fence(&self, op: &'static str, value: i64) -> Result<u64> {
        u64::try_from(value).map_err(|_| self.bad_reply(op, format!("fence {value}")))
    }
}

pub(crate) fn ttl_ms(ttl: Ttl) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX)
}

#[async_trait]
impl Backend for PostgresBackend {
    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    /// A lock: one `INSERT … ON CONFLICT … DO UPDATE`: inserts the key, or takes over an
    /// expired row, with the next fence of the sequence; a live holder's row is left as it
    /// was and its time left answered; a key held with permits (its marker row) is refused
    /// with [`Error::InvalidPermits`](lock_core::Error::InvalidPermits). Other claims: one
    /// call of a PL/pgSQL function, one transaction under the key's advisory lock
    /// (`permits.rs`).
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        if permits != Permits::LOCK {
            return self.acquire_permits(key, owner, permits, ttl).await;
        }
        const OP: &str = "acquire";
        let sent = Instant::now();
        let request = LeaseRequest::Acquire {
            key: key.as_bytes().to_vec(),
            owner: owner.to_string(),
            ttl: ttl_ms(ttl),
        };
        match self.send(request).await? {
            Answer::Acquired {
                granted: true,
                fence,
                ..
            } => Ok(Attempt::Granted {
                fence: self.fence(OP, fence)?,
                valid_until: CAPABILITIES.validity(sent, ttl.get()),
            }),
            Answer::Acquired {
                permits_of: Some(of),
                ..
            } => Err(lock_core::Error::InvalidPermits {
                reason: format!(
                    "key {key:?} is held with several permits (a semaphore or a \
                     reader-writer key of {of}), not as a lock"
                ),
            }),
            Answer::Acquired { left, .. } => Ok(Attempt::Taken {
                expires_in: Some(Duration::from_millis(left.max(0) as u64)),
            }),
            _ => Err(self.bad_reply(OP, "another operation's answer")),
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        if lease.permits() != Permits::LOCK {
            return self.extend_permits(lease, ttl).await;
        }
        let sent = Instant::now();
        let rows = self
            .query(
                "extend",
                |s| &s.extend,
                &[
                    &lease.key().as_bytes(),
                    &lease.owner().to_string(),
                    &ttl_ms(ttl),
                ],
            )
            .await?;
        if rows.is_empty() {
            Err(lease.not_held())
        } else {
            Ok(CAPABILITIES.validity(sent, ttl.get()))
        }
    }

    /// Deletes the row if it holds the lease's owner (announcing it by `NOTIFY` when
    /// someone waits); a row of ours that already expired is deleted too, but reported as
    /// not held.
    async fn release(&self, lease: &Lease) -> Result<()> {
        let key = lease.key();
        if lease.permits() != Permits::LOCK {
            return match self.release_permits(key, lease.owner()).await? {
                Some(true) => Ok(()),
                _ => Err(lease.not_held()),
            };
        }
        let request = LeaseRequest::Release {
            key: key.as_bytes().to_vec(),
            owner: lease.owner().to_string(),
        };
        let live = match self.send(request).await? {
            Answer::Released { live } => live,
            _ => return Err(self.bad_reply("release", "another operation's answer")),
        };
        if live.is_some() {
            // Our own waiters learn it here, without the round trip through NOTIFY.
            self.notices.notify(key);
        }
        match live {
            Some(true) => Ok(()),
            _ => Err(lease.not_held()),
        }
    }

    /// Releases whatever `owner` may hold of `key`, a lock or permits (the claim of the
    /// attempt is not known here): the lock's release, then the permits' release. Requests
    /// on one connection run in order, and a connection given up after a timeout is ended
    /// first, so both run after the abandoned attempt.
    async fn abandon(&self, key: &str, owner: Owner) -> Result<()> {
        match self
            .release(&Lease::new(key, owner, 0, Instant::now()))
            .await
        {
            Ok(()) => return Ok(()),
            Err(lock_core::Error::NotHeld { .. }) => {}
            Err(e) => return Err(e),
        }
        self.release_permits(key, owner).await.map(|_| ())
    }

    fn listen(&self, key: &str) -> Option<ReleaseListener> {
        // Registered before the subscription starts: its first `notify_all` covers the gap.
        let listener = self.notices.listen(key);
        if self.watch.get().is_none() {
            let watch = ReleaseWatch::start(
                self.connection().client_config().clone(),
                self.connection().names.channel.clone(),
                self.connection().timeout,
                self.notices.clone(),
            );
            if let Some(watch) = watch {
                // A concurrent first `listen` may win the race; the loser's watch is dropped.
                let _ = self.watch.set(watch);
            }
        }
        Some(listener)
    }

    fn hand_over(&self) -> Option<&dyn HandOver> {
        Some(self)
    }

    fn admin(&self) -> Option<&dyn Admin> {
        Some(self)
    }

    fn baseline(&self) -> Option<&dyn Baseline> {
        Some(self)
    }

    /// The table `<table>_runs` beside the lease table (see `records.rs`).
    fn run_records(&self) -> Option<&dyn lock_core::records::RunRecords> {
        Some(self)
    }

    /// The table `<table>_fires` beside the lease table (see `claims.rs`).
    fn fire_claims(&self) -> Option<&dyn lock_core::claims::FireClaims> {
        Some(self)
    }

    /// The table `<table>_leads` beside the lease table, and notices on the release channel
    /// (see `leaders.rs`).
    fn leader_values(&self) -> Option<&dyn lock_core::election::LeaderValues> {
        Some(self)
    }
}

#[async_trait]
impl HandOver for PostgresBackend {
    /// One conditional `UPDATE`: the row passes from `from` to `to` with the next fence,
    /// only while it holds `from` unexpired; never free in between, so nothing is announced.
    /// Locks only: permits are refused with
    /// [`Error::Unsupported`](lock_core::Error::Unsupported) before any I/O, and the
    /// Locker releases them instead.
    async fn hand_over(&self, from: &Lease, to: Owner, ttl: Ttl) -> Result<Attempt> {
        const OP: &str = "hand over";
        if from.permits() != Permits::LOCK {
            return Err(lock_core::Error::Unsupported {
                backend: NAME,
                operation: "hand-over of permits",
            });
        }
        let sent = Instant::now();
        let request = LeaseRequest::HandOver {
            key: from.key().as_bytes().to_vec(),
            owner: from.owner().to_string(),
            next: to.to_string(),
            ttl: ttl_ms(ttl),
        };
        match self.send(request).await? {
            Answer::HandedOver { fence: None } => Ok(Attempt::Taken { expires_in: None }),
            Answer::HandedOver { fence: Some(fence) } => Ok(Attempt::Granted {
                fence: self.fence(OP, fence)?,
                valid_until: CAPABILITIES.validity(sent, ttl.get()),
            }),
            _ => Err(self.bad_reply(OP, "another operation's answer")),
        }
    }
}

#[async_trait]
impl Admin for PostgresBackend {
    /// Every unexpired grant of the key: the lock's holder, or each holder of its permits,
    /// with its owner, fence, time left and permits.
    async fn inspect(&self, key: &str) -> Result<Vec<Holder>> {
        const OP: &str = "inspect";
        let rows = self.query(OP, |s| &s.inspect, &[&key.as_bytes()]).await?;
        rows.iter()
            .map(|row| {
                let owner: String = self.get(OP, row, 0)?;
                let left: i64 = self.get(OP, row, 2)?;
                let (take, of): (i32, i32) = (self.get(OP, row, 3)?, self.get(OP, row, 4)?);
                let permits = u32::try_from(take)
                    .ok()
                    .zip(u32::try_from(of).ok())
                    .and_then(|(take, of)| Permits::new(take, of).ok())
                    .ok_or_else(|| self.bad_reply(OP, format!("{take} of {of} permits")))?;
                Ok(Holder::new(
                    Owner::parse(&owner),
                    Some(self.fence(OP, self.get(OP, row, 1)?)?),
                    Some(Duration::from_millis(left.max(0) as u64)),
                )
                .permits(permits))
            })
            .collect()
    }

    /// Deletes the key's lock row (or the marker of its permits) and every holder of its
    /// permits, in one transaction under the key's advisory lock, and announces it.
    async fn force_release(&self, key: &str) -> Result<bool> {
        self.force_release_all(key).await
    }
}

/// An insert into the unlogged `<table>_raw` beside the lease table, then its deletion: the
/// database's own write and delete round trips, without the lease protocol (no sequence,
/// no notice, WAL-free). A cycle cut off leaves the raw row, deleted by the next cycle on
/// the key.
#[async_trait]
impl Baseline for PostgresBackend {
    fn description(&self) -> &'static str {
        BASELINE_CYCLE
    }

    async fn raw_cycle(&self, key: &str, ttl: Ttl) -> Result<()> {
        let value = "0".repeat(32);
        self.query(
            "baseline insert",
            |s| &s.raw_set,
            &[&key.as_bytes(), &value, &ttl_ms(ttl)],
        )
        .await?;
        self.query("baseline delete", |s| &s.raw_del, &[&key.as_bytes()])
            .await?;
        Ok(())
    }
}

impl PostgresBuilder {
    /// Checks the configuration (the table's name before any SQL is built), connects,
    /// creates the schema, the lease table and its sequence when missing, and returns the
    /// backend.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`](lock_core::Error::InvalidUrl) for a malformed address, a zero
    /// timeout or a table or schema name that is not a plain identifier;
    /// [`Error::Unavailable`](lock_core::Error::Unavailable) when the server cannot be
    /// reached within the timeout; [`Error::Backend`](lock_core::Error::Backend) when it
    /// refuses the credentials or the database, the role may not create or use the table,
    /// or the peer does not speak the PostgreSQL protocol.
    pub async fn build(self) -> Result<PostgresBackend> {
        let names = self.check()?;
        let connection = Connection::new(&self, names);
        connection.check().await.map_err(|e| e.into_error())?;
        Ok(PostgresBackend {
            batch: batch::batcher(connection),
            notices: Arc::new(ReleaseNotices::new()),
            watch: OnceLock::new(),
        })
    }
}
