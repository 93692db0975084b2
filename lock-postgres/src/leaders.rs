//! Leaders' values ([`LeaderValues`]) in the table `<table>_leads` beside the lease table,
//! announced on the release channel.

use std::time::Duration;

use async_trait::async_trait;
use lock_core::election::{Leader, LeaderValues};
use lock_core::{Lease, Owner, Result};

use crate::backend::PostgresBackend;

/// Leaders' values in the table `"schema"."<table>_leads"` (created with the lease table):
/// one row `(key, owner, term, value)` per election, the value its last publishing leader
/// published. A publication is one prepared statement, its own transaction: it locks the
/// lease row `FOR SHARE` only while the row holds the lease's owner and fence unexpired by
/// the database's clock, upserts the value, and `pg_notify`s the key on the release channel
/// (delivered at commit to every process listening). `leader` is one `SELECT` joining the
/// unexpired lease row with the value of the same owner and term, so a value left by an
/// earlier holder is never answered; `announce` one `pg_notify`. Every statement runs on
/// the lock connection within the operation timeout. Rows are never deleted by the
/// backend (one small row per election).
#[async_trait]
impl LeaderValues for PostgresBackend {
    async fn publish(&self, lease: &Lease, value: &[u8]) -> Result<()> {
        const OP: &str = "publish a leader's value";
        let Ok(term) = i64::try_from(lease.fence()) else {
            // No fence of the sequence is this large: not a grant of this table.
            return Err(lease.not_held());
        };
        let rows = self
            .query(
                OP,
                |s| &s.publish,
                &[
                    &lease.key().as_bytes(),
                    &lease.owner().to_string(),
                    &term,
                    &value,
                    &self.connection().names.channel,
                ],
            )
            .await?;
        let [row] = rows.as_slice() else {
            return Err(self.bad_reply(OP, format!("{} rows", rows.len())));
        };
        let published: i64 = self.get(OP, row, 0)?;
        if published == 0 {
            return Err(lease.not_held());
        }
        // This process's listeners learn it here, without the round trip through NOTIFY.
        self.notices.notify(lease.key());
        Ok(())
    }

    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        const OP: &str = "read a leader";
        let rows = self.query(OP, |s| &s.leader, &[&key.as_bytes()]).await?;
        let row = match rows.as_slice() {
            [] => return Ok(None),
            [row] => row,
            more => return Err(self.bad_reply(OP, format!("{} rows", more.len()))),
        };
        let value: Vec<u8> = self.get(OP, row, 0)?;
        let term = self.fence(OP, self.get(OP, row, 1)?)?;
        let owner: String = self.get(OP, row, 2)?;
        let owner = Owner::parse(&owner)
            .ok_or_else(|| self.bad_reply(OP, format!("a leader's owner {owner:?}")))?;
        let left: i64 = self.get(OP, row, 3)?;
        Ok(Some(Leader::new(
            value,
            term,
            owner,
            Some(Duration::from_millis(left.max(0) as u64)),
        )))
    }

    async fn announce(&self, key: &str) -> Result<()> {
        self.notices.notify(key);
        self.query(
            "announce a leader's release",
            |s| &s.announce,
            &[&key.as_bytes(), &self.connection().names.channel],
        )
        .await?;
        Ok(())
    }
}
