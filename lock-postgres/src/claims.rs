//! Fire-time claims ([`FireClaims`]) in the table `<table>_fires` beside the lease table.

use std::time::SystemTime;

use async_trait::async_trait;
use lock_core::claims::{fire_millis, from_fire_millis, ClaimAnswer, FireClaim, FireClaims};
use lock_core::{Error, Result};
use tokio_postgres::Row;

use crate::backend::PostgresBackend;

/// A claim's answer row: `(won, fire_ms, replica, claimed_at, server time)`.
struct Answered {
    won: bool,
    claim: FireClaim,
    server_time: SystemTime,
}

impl PostgresBackend {
    /// Reads a claim's answer row, or says the reply (or a value in the table) is not one.
    fn answered(&self, op: &'static str, row: &Row) -> Result<Answered> {
        let fire_ms: i64 = self.get(op, row, 1)?;
        let fire_ms = u64::try_from(fire_ms)
            .map_err(|_| self.bad_reply(op, format!("a claimed fire time of {fire_ms} ms")))?;
        let replica: &[u8] = self.get(op, row, 2)?;
        let replica = std::str::from_utf8(replica)
            .ok()
            .filter(|r| !r.is_empty())
            .ok_or_else(|| self.bad_reply(op, "a claim's replica that is no name"))?;
        Ok(Answered {
            won: self.get(op, row, 0)?,
            claim: FireClaim::new(
                from_fire_millis(fire_ms),
                replica,
                Some(self.get(op, row, 3)?),
            ),
            server_time: self.get(op, row, 4)?,
        })
    }

    /// Runs `current_claim`: the claim kept for `job`, if any, and the database's clock.
    async fn read_claim(&self, op: &'static str, job: &str) -> Result<Option<Answered>> {
        let rows = self
            .query(op, |s| &s.current_claim, &[&job.as_bytes()])
            .await?;
        match rows.as_slice() {
            [] => Ok(None),
            [row] => self.answered(op, row).map(Some),
            more => Err(self.bad_reply(op, format!("{} rows", more.len()))),
        }
    }
}

/// The scheduler's fire-time claims in the table `"schema"."<table>_fires"` (created with
/// the lease table): one row `(job, fire_ms, replica, claimed_at)` per job, the newest fire
/// time claimed, in milliseconds since the Unix epoch, and the database's clock when it was
/// claimed. A claim is one prepared statement (`INSERT … ON CONFLICT (job) DO UPDATE …
/// WHERE kept.fire_ms < EXCLUDED.fire_ms`), its own transaction, on the lock connection
/// within the operation timeout; the job and the replica are `bytea` parameters, never
/// spliced into SQL, and nothing touches the lease table, its sequence or its notices.
/// Rows are never deleted by the backend: a claim lives as long as the table (one small
/// row per job; delete a removed job's row by hand).
#[async_trait]
impl FireClaims for PostgresBackend {
    /// One statement: the claim, or the claim kept that refused it, with the database's
    /// `clock_timestamp()`. A refused claim that raced with the job's first claim (a row
    /// committed after the statement's snapshot) reads the kept claim right after, in a
    /// second statement.
    async fn claim(&self, job: &str, fire_time: SystemTime, replica: &str) -> Result<ClaimAnswer> {
        const OP: &str = "claim fire time";
        let fire_ms =
            i64::try_from(fire_millis(job, fire_time)?).map_err(|_| Error::InvalidKey {
                key: job.chars().take(64).collect(),
                reason: "a fire time must be before the year 292 million",
            })?;
        let rows = self
            .query(
                OP,
                |s| &s.claim,
                &[&job.as_bytes(), &fire_ms, &replica.as_bytes()],
            )
            .await?;
        let answered = match rows.as_slice() {
            [row] => self.answered(OP, row)?,
            [] => self
                .read_claim(OP, job)
                .await?
                .ok_or_else(|| self.bad_reply(OP, "a refused claim and no claim kept"))?,
            more => return Err(self.bad_reply(OP, format!("{} rows", more.len()))),
        };
        Ok(ClaimAnswer::new(
            answered.won,
            answered.claim,
            Some(answered.server_time),
        ))
    }

    /// One `SELECT` on the primary key.
    async fn current(&self, job: &str) -> Result<Option<FireClaim>> {
        Ok(self
            .read_claim("fire claim", job)
            .await?
            .map(|answered| answered.claim))
    }
}
