//! [`MysqlBackend`]: the [`Backend`] over one lease table.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lock_core::group::leases::LeaseRequest;
use lock_core::{
    Admin, Attempt, Backend, Baseline, Capabilities, ClockDrift, HandOver, Holder, Lease, LockUrl,
    Owner, Permits, ReleaseListener, Result, Ttl,
};

use crate::batch::{self, Answer, Batcher};
use crate::config::MysqlBuilder;
use crate::connection::{column, Again, Connection};
use crate::error::{Failure, NAME};

/// What the MySQL/MariaDB backend promises: TTLs from 10 ms to 30 days in 1 ms steps
/// (expiries are kept in microseconds), fences from a persistent `AUTO_INCREMENT`
/// (strictly increasing across every grant of a key, across restarts and crashes), no
/// release notices (the server has no way to push them: waiters retry with backoff and
/// wake at the holder's expiry), no clock-drift allowance (one clock: the database's), and
/// locks only (one permit per key).
pub const CAPABILITIES: Capabilities = Capabilities::new(NAME)
    .min_ttl(Duration::from_millis(10))
    .ttl_granularity(Duration::from_millis(1))
    .max_ttl(Duration::from_secs(30 * 24 * 3600))
    .monotonic_fencing(true)
    .release_notices(false)
    .cross_process(true)
    .clock_drift(ClockDrift::NONE)
    .permits_refusal(
        "claims of several permits on a key (semaphores, reader-writer locks): the MySQL \
         backend keeps locks only",
    );

/// What one raw cycle sends ([`Baseline::description`]).
pub const BASELINE_CYCLE: &str = "INSERT IGNORE + DELETE";

/// Locks in one MySQL or MariaDB lease table (InnoDB): a [`Backend`] with hand-over, admin
/// and a raw baseline.
///
/// Build it with [`MysqlBackend::connect`] from a URL or [`MysqlBackend::builder`], then
/// hand it to a [`Locker`](lock_core::Locker). `Debug` hides the password.
///
#[doc = include_str!("design.md")]
pub struct MysqlBackend {
    /// The lock connections, behind the group commit of acquisitions and releases.
    batch: Arc<Batcher>,
}

impl std::fmt::Debug for MysqlBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MysqlBackend")
            .field("addr", &self.connection().addr)
            .field("table", &self.table())
            .finish()
    }
}

impl MysqlBackend {
    /// A builder for the server at `addr` (`host` or `host:port`); see [`MysqlBuilder`].
    pub fn builder(addr: impl Into<String>) -> MysqlBuilder {
        MysqlBuilder::new(addr)
    }

    /// Connects to the database a `mysql://` or `mariadb://` URL names and creates the
    /// lease tables if missing (this is what `distlock::connect` calls).
    ///
    /// # Errors
    /// As [`MysqlBuilder::from_url`] and [`MysqlBuilder::build`].
    pub async fn connect(url: &LockUrl) -> Result<MysqlBackend> {
        MysqlBuilder::from_url(url)?.build().await
    }

    fn connection(&self) -> &Connection {
        &self.batch.sender().connection
    }

    /// The quoted `` `database`.`table` `` of the lease table.
    pub fn table(&self) -> &str {
        self.connection().sql.table()
    }

    /// Sends an acquisition, a release or a hand-over through the group commit.
    async fn send(&self, request: LeaseRequest) -> Result<Answer> {
        self.batch
            .send_lease(request, self.connection().timeout)
            .await
            .map_err(|e| e.into_error())
    }

    /// Runs a script alone (not grouped), sent again only as `again` allows.
    async fn script(
        &self,
        op: &'static str,
        script: &str,
        again: Again,
    ) -> Result<Vec<mysql_async::Row>> {
        self.connection()
            .script(op, script, again)
            .await
            .map_err(|e| e.into_error())
    }

    fn bad_reply(&self, op: &'static str, failure: Failure) -> lock_core::Error {
        self.connection().error(op, failure).into_error()
    }

    fn other_answer(&self, op: &'static str) -> lock_core::Error {
        self.bad_reply(
            op,
            Failure::Reply("unexpected reply: another operation's answer".into()),
        )
    }
}

fn ttl_us(ttl: Ttl) -> i64 {
    i64::try_from(ttl.get().as_micros()).unwrap_or(i64::MAX)
}

/// Microseconds left as a duration, rounded up to the millisecond (a waiter that wakes at
/// the expiry never wakes before it).
fn left(us: i64) -> Duration {
    Duration::from_millis(u64::try_from(us.max(0)).unwrap_or(0).div_ceil(1000))
}

#[async_trait]
impl Backend for MysqlBackend {
    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    /// One script in one transaction: locks the key's row (inserting an expired
    /// placeholder for a new key), reads the database's time, and takes the row over with
    /// the next fence when it has expired; a live holder's row is left as it was and its
    /// time left answered.
    async fn try_acquire(
        &self,
        key: &str,
        owner: Owner,
        _permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        let sent = Instant::now();
        let request = LeaseRequest::Acquire {
            key: key.as_bytes().to_vec(),
            owner: owner.to_string(),
            ttl: ttl_us(ttl),
        };
        match self.send(request).await? {
            Answer::Acquired {
                granted: true,
                fence,
                ..
            } => Ok(Attempt::Granted {
                fence,
                valid_until: CAPABILITIES.validity(sent, ttl.get()),
            }),
            Answer::Acquired { left_us, .. } => Ok(Attempt::Taken {
                expires_in: Some(left(left_us)),
            }),
            _ => Err(self.other_answer("acquire")),
        }
    }

    /// One `UPDATE` of the expiry, only while the row holds the lease's owner unexpired.
    async fn extend(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        const OP: &str = "extend";
        let sent = Instant::now();
        let script = self.connection().sql.extend(
            lease.key().as_bytes(),
            &lease.owner().to_string(),
            ttl_us(ttl),
        );
        let rows = self.script(OP, &script, Again::IfClosedUnseen).await?;
        let changed: i64 = match rows.first() {
            Some(row) => column(row, 0).map_err(|f| self.bad_reply(OP, f))?,
            None => 0,
        };
        if changed == 0 {
            Err(lease.not_held())
        } else {
            Ok(CAPABILITIES.validity(sent, ttl.get()))
        }
    }

    /// Deletes the row if it holds the lease's owner; a row of ours that already expired is
    /// deleted too, but reported as not held.
    async fn release(&self, lease: &Lease) -> Result<()> {
        let request = LeaseRequest::Release {
            key: lease.key().as_bytes().to_vec(),
            owner: lease.owner().to_string(),
        };
        match self.send(request).await? {
            Answer::Released { live: Some(true) } => Ok(()),
            Answer::Released { .. } => Err(lease.not_held()),
            _ => Err(self.other_answer("release")),
        }
    }

    /// `None`: MySQL and MariaDB cannot announce a release (see the crate documentation).
    fn listen(&self, _key: &str) -> Option<ReleaseListener> {
        None
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
}

#[async_trait]
impl HandOver for MysqlBackend {
    /// One script: the row passes from `from` to `to` with the next fence, only while it
    /// holds `from` unexpired; never free in between.
    async fn hand_over(&self, from: &Lease, to: Owner, ttl: Ttl) -> Result<Attempt> {
        let sent = Instant::now();
        let request = LeaseRequest::HandOver {
            key: from.key().as_bytes().to_vec(),
            owner: from.owner().to_string(),
            next: to.to_string(),
            ttl: ttl_us(ttl),
        };
        match self.send(request).await? {
            Answer::HandedOver { fence: None } => Ok(Attempt::Taken { expires_in: None }),
            Answer::HandedOver { fence: Some(fence) } => Ok(Attempt::Granted {
                fence,
                valid_until: CAPABILITIES.validity(sent, ttl.get()),
            }),
            _ => Err(self.other_answer("hand over")),
        }
    }
}

#[async_trait]
impl Admin for MysqlBackend {
    /// The unexpired holder of the key, with its owner, fence and time left.
    async fn inspect(&self, key: &str) -> Result<Vec<Holder>> {
        const OP: &str = "inspect";
        let script = self.connection().sql.inspect(key.as_bytes());
        let rows = self.script(OP, &script, Again::IfClosedUnseen).await?;
        rows.iter()
            .map(|row| {
                let owner: String = column(row, 0).map_err(|f| self.bad_reply(OP, f))?;
                let fence: u64 = column(row, 1).map_err(|f| self.bad_reply(OP, f))?;
                let left_us: i64 = column(row, 2).map_err(|f| self.bad_reply(OP, f))?;
                Ok(Holder::new(
                    Owner::parse(&owner),
                    Some(fence),
                    Some(left(left_us)),
                ))
            })
            .collect()
    }

    /// Deletes the key's row whoever holds it, in one transaction; true when it was live.
    async fn force_release(&self, key: &str) -> Result<bool> {
        const OP: &str = "force release";
        let script = self.connection().sql.force_release(key.as_bytes());
        let rows = self.script(OP, &script, Again::Never).await?;
        let live: i64 = match rows.first() {
            Some(row) => column(row, 0).map_err(|f| self.bad_reply(OP, f))?,
            None => 0,
        };
        Ok(live > 0)
    }
}

/// An insert into `<table>_raw` beside the lease table, then its deletion: the database's
/// own write and delete round trips, without the lease protocol (no row lock taken first,
/// no fence, no transaction of several statements). A cycle cut off leaves the raw row,
/// deleted by the next cycle on the key.
#[async_trait]
impl Baseline for MysqlBackend {
    fn description(&self) -> &'static str {
        BASELINE_CYCLE
    }

    async fn raw_cycle(&self, key: &str, ttl: Ttl) -> Result<()> {
        let sql = &self.connection().sql;
        let value = "0".repeat(32);
        self.script(
            "baseline insert",
            &sql.raw_set(key.as_bytes(), &value, ttl_us(ttl)),
            Again::Never,
        )
        .await?;
        self.script(
            "baseline delete",
            &sql.raw_del(key.as_bytes()),
            Again::Never,
        )
        .await?;
        Ok(())
    }
}

impl MysqlBuilder {
    /// Checks the configuration (the table's name before any SQL is built), connects,
    /// checks the server's version, creates the lease tables when missing, and returns the
    /// backend.
    ///
    /// # Errors
    /// [`Error::InvalidUrl`](lock_core::Error::InvalidUrl) for a malformed address, a zero
    /// timeout, no database, or a table or database name that is not a plain identifier;
    /// [`Error::Unavailable`](lock_core::Error::Unavailable) when the server cannot be
    /// reached within the timeout; [`Error::Backend`](lock_core::Error::Backend) when it
    /// refuses the credentials or the database, the user may not create or use the tables,
    /// the server is older than MariaDB 10.3 or MySQL 8.0, or the peer does not speak the
    /// MySQL protocol.
    pub async fn build(self) -> Result<MysqlBackend> {
        let names = self.check()?;
        let connection = Connection::new(&self, names);
        connection.check().await.map_err(|e| e.into_error())?;
        Ok(MysqlBackend {
            batch: batch::batcher(connection),
        })
    }
}
