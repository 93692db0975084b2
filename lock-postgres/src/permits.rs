//! Keys claimed with several permits (semaphores, reader-writer keys): `PostgresBackend`'s
//! operations on them. A lock (1 of 1) keeps the lease table's protocol (`backend.rs`);
//! the layout of the other claims and their functions are in `permits_sql.rs`
//! (`PermitsSql`).
//!
//! Each operation is one prepared call of a PL/pgSQL function, ONE transaction that first
//! takes the key's advisory lock (the one the lock's granting statements take), so every
//! grant, extension and release of a key's permits, and every grant of its lock, happen
//! one after the other. A key is never held as a lock and with permits at once: while
//! permits are held, a marker row in the lease table (owner `*<of>`, expiring with the
//! latest holder) keeps the lock's statements from granting it, and they answer
//! [`Error::InvalidPermits`]; the permits' function refuses a key a live lock holds the
//! same way.

use std::time::{Duration, Instant};

use lock_core::{Attempt, Error, Lease, Owner, Permits, Result, Ttl};

use crate::backend::{ttl_ms, PostgresBackend, CAPABILITIES};

impl PostgresBackend {
    /// One attempt to take `permits` (not [`Permits::LOCK`]) of `key` for `owner` for
    /// `ttl`: granted when the unexpired holders leave `permits.take()` of `permits.of()`
    /// free, with the next fence of the sequence the lock's grants use too (so fences
    /// strictly increase across every grant of the key); taken otherwise, with the time
    /// until the first holder expires. Asking again with an owner that holds (a request
    /// re-sent after a lost reply) grants again with the same fence and a fresh expiry.
    ///
    /// # Errors
    /// [`Error::InvalidPermits`] when a live lock holds the key or its holders claim
    /// another number of permits; otherwise as for a lock.
    pub(crate) async fn acquire_permits(
        &self,
        key: &str,
        owner: Owner,
        permits: Permits,
        ttl: Ttl,
    ) -> Result<Attempt> {
        const OP: &str = "acquire permits";
        let sent = Instant::now();
        // At most `MAX_PERMITS` (2^20): an `integer`.
        let (take, of) = (permits.take() as i32, permits.of() as i32);
        let rows = self
            .query(
                OP,
                |s| &s.acquire_permits,
                &[
                    &key.as_bytes(),
                    &owner.to_string(),
                    &take,
                    &of,
                    &ttl_ms(ttl),
                ],
            )
            .await?;
        let [row] = rows.as_slice() else {
            return Err(self.bad_reply(OP, format!("{} rows", rows.len())));
        };
        let verdict: &str = self.get(OP, row, 0)?;
        match verdict {
            "grant" | "again" => {
                let fence: i64 = self
                    .get::<Option<i64>>(OP, row, 1)?
                    .ok_or_else(|| self.bad_reply(OP, "a grant without a fence"))?;
                Ok(Attempt::Granted {
                    fence: self.fence(OP, fence)?,
                    valid_until: CAPABILITIES.validity(sent, ttl.get()),
                })
            }
            "full" => {
                let left: Option<i64> = self.get(OP, row, 3)?;
                Ok(Attempt::Taken {
                    expires_in: left.map(|ms| Duration::from_millis(ms.max(0) as u64)),
                })
            }
            "lock" => Err(Error::InvalidPermits {
                reason: format!(
                    "key {key:?} is held as a lock, not with {} permits",
                    permits.of()
                ),
            }),
            "of" => {
                let held: i32 = self.get::<Option<i32>>(OP, row, 2)?.unwrap_or_default();
                Err(Error::InvalidPermits {
                    reason: format!(
                        "key {key:?} is held with {held} permits, not {}",
                        permits.of()
                    ),
                })
            }
            other => Err(self.bad_reply(OP, format!("verdict {other:?}"))),
        }
    }

    /// Pushes the expiry of the lease's permits to `ttl` from now if it still holds them
    /// unexpired; the new `valid_until`, from before the request.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when it no longer holds them; otherwise as for a lock.
    pub(crate) async fn extend_permits(&self, lease: &Lease, ttl: Ttl) -> Result<Instant> {
        const OP: &str = "extend permits";
        let sent = Instant::now();
        let rows = self
            .query(
                OP,
                |s| &s.extend_permits,
                &[
                    &lease.key().as_bytes(),
                    &lease.owner().to_string(),
                    &ttl_ms(ttl),
                ],
            )
            .await?;
        let [row] = rows.as_slice() else {
            return Err(self.bad_reply(OP, format!("{} rows", rows.len())));
        };
        let (held, marked): (i64, i64) = (self.get(OP, row, 0)?, self.get(OP, row, 1)?);
        // A holder without its marker is not protected from a lock: never believed held
        // (the invariant makes it unreachable: the marker expires with the latest holder).
        if held == 1 && marked == 1 {
            Ok(CAPABILITIES.validity(sent, ttl.get()))
        } else {
            Err(lease.not_held())
        }
    }

    /// Gives back `owner`'s permits of `key` (an expired holder's row is deleted too),
    /// announcing the release when an attempt was refused since the last one: `None` when
    /// `owner` held none, else whether they were still live. Our own waiters are woken
    /// here, without the round trip through `NOTIFY`.
    pub(crate) async fn release_permits(&self, key: &str, owner: Owner) -> Result<Option<bool>> {
        const OP: &str = "release permits";
        let channel = &self.connection().names.channel;
        let rows = self
            .query(
                OP,
                |s| &s.release_permits,
                &[&key.as_bytes(), &owner.to_string(), channel],
            )
            .await?;
        let [row] = rows.as_slice() else {
            return Err(self.bad_reply(OP, format!("{} rows", rows.len())));
        };
        let live: Option<bool> = self.get(OP, row, 0)?;
        if live.is_some() {
            self.notices.notify(key);
        }
        Ok(live)
    }

    /// Deletes every grant of `key` (its lock, or all its holders of permits) in one
    /// transaction and announces it; whether a live grant was there.
    pub(crate) async fn force_release_all(&self, key: &str) -> Result<bool> {
        const OP: &str = "force release";
        let channel = &self.connection().names.channel;
        let rows = self
            .query(OP, |s| &s.force_release, &[&key.as_bytes(), channel])
            .await?;
        let [row] = rows.as_slice() else {
            return Err(self.bad_reply(OP, format!("{} rows", rows.len())));
        };
        let (live, removed): (bool, bool) = (self.get(OP, row, 0)?, self.get(OP, row, 1)?);
        if removed {
            self.notices.notify(key);
        }
        Ok(live)
    }
}
